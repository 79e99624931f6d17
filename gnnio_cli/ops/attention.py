"""Attention family: edge scores, softmax over each target's in-edges, weighted aggregation.

One op per PyG layer's propagation (GATConv, GATv2Conv, TransformerConv,
AGNNConv). Each computes a score per (edge, head), turns the scores of each
target's in-edges into a softmax, optionally applies dropout to those
weights (training only, like PyG), and sums the weighted messages at the
target:

    out[t, h] = sum over t's in-edges e = (s, t) of alpha[e, h] * message[e, h]

Shared conventions:

- Rows without in-edges give 0.
- Per-edge inputs (edge_alpha, edge_feat) and the returned attention weights
  are in the graph's **original edge order** (eid order), not CSR slot order.
- ``return_attention=True`` returns ``(out, alpha)``. As in PyG, GAT and GATv2
  return the weights after dropout, TransformerConv and AGNN before it.
- Outputs have the inputs' dtype; 16-bit inputs are computed in fp32. GAT and the
  Transformer can return fp32 for 16-bit inputs (``out_dtype``), as PyG's layers
  do under CUDA autocast.
- Projections, head concat/mean, bias and self-loop insertion are the layer's
  job, not the op's.
- Gradients flow to every floating-point input.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.ops import attention_native, dispatch
from gnnio_cli.ops.segment import (
    accumulation_dtype,
    autocast_off,
    check_same_dtype,
    check_tensor,
    eid_to_slot,
    sddmm,
    segment_exp,
    segment_sum,
    slot_sources,
    slot_targets,
    slot_to_eid,
    sparse_matmul,
    sum_by_source,
    sum_by_target,
)

AttentionResult = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def gat_attention(
    graph: Graph,
    x_src: torch.Tensor,
    alpha_src: torch.Tensor,
    alpha_dst: torch.Tensor,
    edge_alpha: Optional[torch.Tensor] = None,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    training: bool = False,
    return_attention: bool = False,
    bias: Optional[torch.Tensor] = None,
    pack_gradients: bool = False,
    out_dtype: Optional[torch.dtype] = None,
) -> AttentionResult:
    """GATConv's attention aggregation (additive score).

    x_src:      [num_src, H, C] projected source features (the messages).
    alpha_src:  [num_src, H] per-source score term (<x_src, att_src> in PyG).
    alpha_dst:  [num_dst, H] per-target score term.
    edge_alpha: optional [E, H] per-edge score term, eid order.
    score[e, h] = leaky_relu(alpha_src[s, h] + alpha_dst[t, h] + edge_alpha[e, h], negative_slope)
    bias:       optional [H, C] added to every output row (a layer's output bias; the kernels add it as
                they store the row, saving a pass over the output).
    pack_gradients: a hint for a caller that projected x_src, alpha_src and alpha_dst from one x (as many
                sources as targets): the fused fp32 backward then returns their gradients as views of
                one [N, H*C + 2H] tensor, whose rows the projection's backward multiplies in one GEMM.
                The values are the same either way.
    out_dtype:  None (x_src's dtype) or torch.float32: the output (and alpha) in fp32 for 16-bit inputs, summed
                as before; bias is then fp32 too. The fused backward takes delta from that exact output.
    Returns out [num_dst, H, C], and with return_attention alpha [E, H] (after dropout).
    """
    op = "gat_attention"
    _check_dropout(op, dropout)
    heads = _check_heads(op, "x_src", x_src, graph, graph.num_src_nodes)
    check_tensor(op, "alpha_src", alpha_src, graph, "[N, H]", (graph.num_src_nodes, heads))
    check_tensor(op, "alpha_dst", alpha_dst, graph, "[N, H]", (graph.num_dst_nodes, heads))
    if edge_alpha is not None:
        check_tensor(op, "edge_alpha", edge_alpha, graph, "[E, H]", (graph.num_edges, heads))
    _check_bias(op, bias, x_src)
    out_dtype = _out_dtype(op, out_dtype, x_src)
    check_same_dtype(op, x_src=x_src, alpha_src=alpha_src, alpha_dst=alpha_dst, edge_alpha=edge_alpha)
    if bias is not None and bias.dtype != out_dtype:
        raise GnnioError(f"{op}: bias must have the output's dtype {out_dtype}, got {bias.dtype}")

    backend = dispatch.pick(op, x_src, alpha_src, alpha_dst, edge_alpha, bias)
    if backend == "native" and attention_native.supports(x_src, alpha_src, alpha_dst, edge_alpha, bias, return_attention=return_attention):
        return attention_native.gat_attention(graph, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout,
                                              training, return_attention, bias, pack_gradients,
                                              fp32_out=out_dtype != x_src.dtype)
    dispatch.record(op, "reference")
    compute = accumulation_dtype(x_src.dtype)
    sources, targets = slot_sources(graph), slot_targets(graph)
    scores = alpha_src.to(compute).index_select(0, sources) + alpha_dst.to(compute).index_select(0, targets)
    if edge_alpha is not None:
        scores = scores + eid_to_slot(graph, edge_alpha).to(compute)
    scores = F.leaky_relu(scores, negative_slope)
    result = _softmax_aggregate(
        graph, scores, x_src.to(compute), None, dropout, training, return_attention, out_dtype, return_dropped=True
    )
    return _with_bias(result, bias)


def gatv2_attention(
    graph: Graph,
    x_src: torch.Tensor,
    x_dst: torch.Tensor,
    att: torch.Tensor,
    edge_feat: Optional[torch.Tensor] = None,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    training: bool = False,
    return_attention: bool = False,
    bias: Optional[torch.Tensor] = None,
) -> AttentionResult:
    """GATv2Conv's attention aggregation (LeakyReLU inside the score).

    x_src:     [num_src, H, C] source projection (x_l in PyG; also the message).
    x_dst:     [num_dst, H, C] target projection (x_r in PyG).
    att:       [H, C] attention vector.
    edge_feat: optional [E, H, C] projected edge features, eid order.
    score[e, h] = sum_c att[h, c] * leaky_relu(x_src[s, h, c] + x_dst[t, h, c] + edge_feat[e, h, c])
    With 16-bit features the hidden terms are rounded to their dtype as PyG's 16-bit layer rounds
    them: each sum, and leaky_relu's negative side (slope * hidden, the slope taken in that dtype);
    the products with att and all sums accumulate in fp32.
    bias:      optional [H, C] added to every output row (as gat_attention's).
    Returns out [num_dst, H, C], and with return_attention alpha [E, H] (after dropout).
    """
    op = "gatv2_attention"
    _check_dropout(op, dropout)
    heads = _check_heads(op, "x_src", x_src, graph, graph.num_src_nodes)
    channels = x_src.shape[2]
    check_tensor(op, "x_dst", x_dst, graph, "[N, H, C]", (graph.num_dst_nodes, heads, channels))
    check_tensor(op, "att", att, graph, "[H, C]", (heads, channels))
    if edge_feat is not None:
        check_tensor(op, "edge_feat", edge_feat, graph, "[E, H, C]", (graph.num_edges, heads, channels))
    _check_bias(op, bias, x_src)
    check_same_dtype(op, x_src=x_src, x_dst=x_dst, att=att, edge_feat=edge_feat, bias=bias)

    backend = dispatch.pick(op, x_src, x_dst, att, edge_feat, bias)
    if backend == "native" and attention_native.supports(x_src, x_dst, att, edge_feat, bias, return_attention=return_attention):
        return attention_native.gatv2_attention(graph, x_src, x_dst, att, edge_feat, negative_slope, dropout, training, return_attention, bias)
    dispatch.record(op, "reference")
    compute = accumulation_dtype(x_src.dtype)
    edge_slot = None if edge_feat is None else eid_to_slot(graph, edge_feat).to(compute)
    with autocast_off(x_src.device.type):  # the scores' products in the compute dtype
        scores = _GatV2Scores.apply(x_src.to(compute), x_dst.to(compute), att.to(compute), edge_slot, graph,
                                    negative_slope, x_src.dtype)
    result = _softmax_aggregate(
        graph, scores, x_src.to(compute), None, dropout, training, return_attention, x_src.dtype, return_dropped=True
    )
    return _with_bias(result, bias)


def transformer_attention(
    graph: Graph,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    edge_feat: Optional[torch.Tensor] = None,
    *,
    dropout: float = 0.0,
    training: bool = False,
    return_attention: bool = False,
    residual: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> AttentionResult:
    """TransformerConv's attention aggregation (scaled dot product).

    query:     [num_dst, H, C] from the target.
    key:       [num_src, H, C] from the source.
    value:     [num_src, H, C] from the source.
    edge_feat: optional [E, H, C] projected edge features, eid order, added to
               both the key and the value of its edge (as PyG).
    score[e, h] = <query[t, h], key[s, h] + edge_feat[e, h]> / sqrt(C)
    message[e, h] = value[s, h] + edge_feat[e, h]
    residual:  optional [num_dst, H, C] added to the output (a layer's skip connection; the kernels add it
               as they store each row, saving a pass over the output). Its gradient is grad_out. In the
               inputs' dtype, whatever out_dtype.
    out_dtype: None (query's dtype) or torch.float32: the output (and alpha) in fp32 for 16-bit inputs, as
               gat_attention's.
    Returns out [num_dst, H, C], and with return_attention alpha [E, H] (before dropout).
    """
    op = "transformer_attention"
    _check_dropout(op, dropout)
    heads = _check_heads(op, "query", query, graph, graph.num_dst_nodes)
    channels = query.shape[2]
    check_tensor(op, "key", key, graph, "[N, H, C]", (graph.num_src_nodes, heads, channels))
    check_tensor(op, "value", value, graph, "[N, H, C]", (graph.num_src_nodes, heads, channels))
    if edge_feat is not None:
        check_tensor(op, "edge_feat", edge_feat, graph, "[E, H, C]", (graph.num_edges, heads, channels))
    if residual is not None:
        check_tensor(op, "residual", residual, graph, "[N, H, C]", (graph.num_dst_nodes, heads, channels))
    check_same_dtype(op, query=query, key=key, value=value, edge_feat=edge_feat, residual=residual)
    out_dtype = _out_dtype(op, out_dtype, query)

    backend = dispatch.pick(op, query, key, value, edge_feat, residual)
    if backend == "native" and attention_native.supports(query, key, value, edge_feat, residual, return_attention=return_attention):
        return attention_native.transformer_attention(
            graph, query, key, value, edge_feat, dropout, training, return_attention, residual,
            fp32_out=out_dtype != query.dtype,
        )
    dispatch.record(op, "reference")
    compute = accumulation_dtype(query.dtype)
    queries = query.to(compute)
    scores = sddmm(graph, queries, key.to(compute))
    edge_slot = None
    if edge_feat is not None:
        edge_slot = eid_to_slot(graph, edge_feat).to(compute)
        scores = scores + (queries.index_select(0, slot_targets(graph)) * edge_slot).sum(-1)
    scores = scores / math.sqrt(channels)
    result = _softmax_aggregate(
        graph, scores, value.to(compute), edge_slot, dropout, training, return_attention, out_dtype,
        return_dropped=False,
    )
    return _with_bias(result, residual)


def agnn_attention(
    graph: Graph,
    x_src: torch.Tensor,
    x_dst: torch.Tensor,
    beta: torch.Tensor,
    *,
    dropout: float = 0.0,
    training: bool = False,
    return_attention: bool = False,
) -> AttentionResult:
    """AGNNConv's attention aggregation (scaled cosine similarity, one head).

    x_src: [num_src, C] source features (the messages, not normalised).
    x_dst: [num_dst, C] target features (the same tensor as x_src in AGNNConv).
    beta:  a tensor with one element (AGNNConv's temperature).
    score[e] = beta * <x_src[s] / |x_src[s]|, x_dst[t] / |x_dst[t]|>  (F.normalize, eps 1e-12)
    Returns out [num_dst, C], and with return_attention alpha [E] (before dropout;
    PyG's AGNNConv has no dropout, the option is here for uniformity).
    """
    op = "agnn_attention"
    _check_dropout(op, dropout)
    check_tensor(op, "x_src", x_src, graph, "[N, C]", (graph.num_src_nodes, None))
    check_tensor(op, "x_dst", x_dst, graph, "[N, C]", (graph.num_dst_nodes, x_src.shape[1]))
    if not isinstance(beta, torch.Tensor) or beta.numel() != 1:
        shape = tuple(beta.shape) if isinstance(beta, torch.Tensor) else type(beta).__name__
        raise GnnioError(f"agnn_attention: beta must be a tensor with one element, got shape {shape}")
    check_tensor(op, "beta", beta.reshape(()), graph, "[]", ())
    check_same_dtype(op, x_src=x_src, x_dst=x_dst)

    backend = dispatch.pick(op, x_src, x_dst, beta)
    if backend == "native" and attention_native.supports(x_src, x_dst, beta, return_attention=return_attention):
        return attention_native.agnn_attention(graph, x_src, x_dst, beta, dropout, training, return_attention)
    dispatch.record(op, "reference")
    compute = accumulation_dtype(x_src.dtype)
    src_unit = F.normalize(x_src.to(compute), p=2.0, dim=-1)
    dst_unit = F.normalize(x_dst.to(compute), p=2.0, dim=-1)
    scores = beta.to(compute).reshape(()) * sddmm(graph, dst_unit, src_unit).unsqueeze(1)
    result = _softmax_aggregate(
        graph, scores, x_src.to(compute).unsqueeze(1), None, dropout, training, return_attention, x_src.dtype,
        return_dropped=False,
    )
    if return_attention:
        out, alpha = result
        return out.squeeze(1), alpha.squeeze(1)
    return result.squeeze(1)


class _GatV2Scores(torch.autograd.Function):
    """GATv2's scores [E, H] in slot order (see gatv2_attention), formed and differentiated a block of slots
    at a time: the hidden terms [E, H, C] never exist whole; with more than one block they are recomputed
    in backward rather than kept (one block, a graph of a few thousand edges, keeps them).

    forward(x_src [Ns, H, C], x_dst [Nd, H, C], att [H, C], edge_slot [E, H, C] or None (slot order), graph,
    negative_slope, dtype): inputs in the compute dtype; `dtype` is the features' own, whose rounding of the
    hidden terms is reproduced (the rounding's derivative taken as 1, as autograd takes a cast's).
    Backward sums the hidden terms' gradients per target with sparse products over the block's rows, and
    per source likewise over the CSC when one block covers every slot (else with index_add).
    """

    @staticmethod
    def forward(ctx, x_src, x_dst, att, edge_slot, graph, negative_slope, dtype):
        ctx.save_for_backward(x_src, x_dst, att, edge_slot)
        ctx.graph, ctx.negative_slope, ctx.dtype = graph, negative_slope, dtype
        heads, channels = att.shape
        weight = _head_dot_weight(att)
        scores = x_src.new_empty(graph.num_edges, heads)
        blocks = _slot_blocks(graph.num_edges, heads * channels)
        ctx.kept = None
        for block in blocks:
            hidden = _gatv2_hidden(graph, block, x_src, x_dst, edge_slot, dtype)
            activated = _gatv2_activation(hidden, negative_slope, dtype)
            torch.mm(activated.view(hidden.shape[0], -1), weight, out=scores[block])
            if len(blocks) == 1:
                ctx.kept = (hidden, activated)
        return scores

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x_src, x_dst, att, edge_slot = ctx.saved_tensors
        graph, negative_slope, dtype = ctx.graph, ctx.negative_slope, ctx.dtype
        heads, channels = att.shape
        weight = _head_dot_weight(att)
        slope = _rounded_slope(negative_slope, dtype)
        grad_src, grad_dst = torch.zeros_like(x_src), torch.zeros_like(x_dst)
        grad_weight = att.new_zeros(heads * channels, heads)
        grad_edge = None if edge_slot is None or not ctx.needs_input_grad[3] else torch.empty_like(edge_slot)
        blocks = _slot_blocks(graph.num_edges, heads * channels)
        for block in blocks:
            if ctx.kept is not None:
                hidden, activated = ctx.kept
            else:
                hidden = _gatv2_hidden(graph, block, x_src, x_dst, edge_slot, dtype)
                activated = _gatv2_activation(hidden, negative_slope, dtype)
            grad_block = grad[block]
            grad_weight.addmm_(activated.view(hidden.shape[0], -1).t(), grad_block)
            grad_hidden = torch.mm(grad_block, weight.t()).view_as(hidden)
            # LeakyReLU's own backward: one pass (torch.where of a mask costs ten on the CPU)
            grad_hidden = torch.ops.aten.leaky_relu_backward(grad_hidden, hidden, slope, False)
            sum_by_target(graph, block, grad_hidden, grad_dst)
            if len(blocks) == 1:
                grad_src += sum_by_source(graph, grad_hidden)
            else:
                grad_src.index_add_(0, slot_sources(graph)[block], grad_hidden)
            if grad_edge is not None:
                grad_edge[block] = grad_hidden
        ctx.kept = None
        grad_att = grad_weight.view(heads, channels, heads).diagonal(dim1=0, dim2=2).t()
        return grad_src, grad_dst, grad_att, grad_edge, None, None, None


def _head_dot_weight(att: torch.Tensor) -> torch.Tensor:
    """B [H * C, H] with B[h * C + c, h] = att[h, c]: hidden [n, H * C] @ B = the per-head dots with att."""
    heads = att.shape[0]
    eye = torch.eye(heads, dtype=att.dtype, device=att.device)
    return (att.unsqueeze(-1) * eye.unsqueeze(1)).reshape(-1, heads)


def _slot_blocks(num_edges: int, width: int) -> list:
    """Slices of slots whose hidden terms take about 2^21 numbers (8 MiB in fp32): they stay in cache."""
    size = max(1, (1 << 21) // max(width, 1))
    return [slice(start, min(start + size, num_edges)) for start in range(0, num_edges, size)]


def _rounded_slope(negative_slope: float, dtype: torch.dtype) -> float:
    """The LeakyReLU slope as PyG's layer sees it in `dtype`."""
    return torch.tensor(negative_slope, dtype=dtype).item()


def _gatv2_hidden(graph, block: slice, x_src, x_dst, edge_slot, dtype) -> torch.Tensor:
    """x_src[s] + x_dst[t] (+ edge_slot[e]) for the slots in `block`, each sum rounded to `dtype` (16-bit)."""
    rounding = dtype != x_src.dtype
    hidden = x_src.index_select(0, slot_sources(graph)[block])
    hidden += x_dst.index_select(0, slot_targets(graph)[block])
    if rounding:
        hidden = hidden.to(dtype).to(x_src.dtype)
    if edge_slot is not None:
        hidden += edge_slot[block]
        if rounding:
            hidden = hidden.to(dtype).to(x_src.dtype)
    return hidden


def _gatv2_activation(hidden: torch.Tensor, negative_slope: float, dtype) -> torch.Tensor:
    """LeakyReLU of the hidden terms; in 16 bits the negative side slope * hidden is rounded to `dtype`."""
    if dtype == hidden.dtype:
        return F.leaky_relu(hidden, negative_slope)
    negative = (hidden * _rounded_slope(negative_slope, dtype)).to(dtype).to(hidden.dtype)
    return torch.where(hidden > 0, hidden, negative)


# ----------------------------------------------------------------- shared
def _check_heads(op: str, name: str, tensor: torch.Tensor, graph: Graph, num_nodes: int) -> int:
    """Check a [N, H, C] tensor; return H."""
    check_tensor(op, name, tensor, graph, "[N, H, C]", (num_nodes, None, None))
    return tensor.shape[1]


def _check_bias(op: str, bias: Optional[torch.Tensor], x: torch.Tensor) -> None:
    """An output bias is [H, C] like one row of the [N, H, C] output, on its device."""
    if bias is None:
        return
    heads, channels = x.shape[1], x.shape[2]
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (heads, channels):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise GnnioError(f"{op}: bias must have shape [H, C] = ({heads}, {channels}), got {got}")
    if bias.device != x.device:
        raise GnnioError(f"{op}: bias is on {bias.device} but the features are on {x.device}")


def _with_bias(result: AttentionResult, bias: Optional[torch.Tensor]) -> AttentionResult:
    """The reference path's output bias (or residual): out + bias, the weights (if returned) untouched."""
    if bias is None:
        return result
    if isinstance(result, tuple):
        return result[0] + bias, result[1]
    return result + bias


def _out_dtype(op: str, out_dtype: Optional[torch.dtype], features: torch.Tensor) -> torch.dtype:
    """The output's dtype: the features' (None), or torch.float32."""
    if out_dtype is None:
        return features.dtype
    if out_dtype not in (features.dtype, torch.float32):
        raise GnnioError(f"{op}: out_dtype must be None, the features' dtype or torch.float32, got {out_dtype}")
    return out_dtype


def _check_dropout(op: str, dropout: float) -> None:
    if not 0.0 <= dropout <= 1.0:
        raise GnnioError(f"{op}: dropout must be between 0 and 1, got {dropout}")


def _softmax_aggregate(
    graph: Graph,
    scores: torch.Tensor,
    x_src: torch.Tensor,
    edge_messages: Optional[torch.Tensor],
    dropout: float,
    training: bool,
    return_attention: bool,
    out_dtype: torch.dtype,
    *,
    return_dropped: bool,
) -> AttentionResult:
    """Softmax of slot-order scores [E, H] per target, dropout, and the sum of alpha * message, the message of
    slot e being x_src[source(e)] [N, H, C] plus edge_messages[e] ([E, H, C] slot order, or None).

    The weighted sum is a sparse product over the softmax's numerators, divided by
    their row sums afterwards (which one more column of ones in the same product
    gives, without dropout): no tensor per edge and feature is made, nor, unless the
    weights are returned, the normalised weights.
    return_dropped: whether the returned weights are taken after dropout (GAT,
    GATv2) or before it (TransformerConv, AGNN).
    """
    exps = segment_exp(graph, scores)
    mask = None
    if training and dropout > 0:
        # The mask is drawn over eid-ordered weights, as PyG draws it, so a seed gives PyG's mask.
        mask = eid_to_slot(graph, F.dropout(exps.new_ones(exps.shape), p=dropout, training=True))
    if mask is None:
        numerators = exps
        augmented = torch.cat([x_src, x_src.new_ones((*x_src.shape[:2], 1))], dim=-1)
        summed = sparse_matmul(graph, exps, augmented)
        out, sums = summed[..., :-1], summed[..., -1]
    else:
        numerators = exps * mask
        out = sparse_matmul(graph, numerators, x_src)
        sums = segment_sum(graph, exps)
    if edge_messages is not None:
        out = out + segment_sum(graph, edge_messages * numerators.unsqueeze(-1))
    sums = sums.clamp(min=1.0)  # exact: a row's largest numerator is 1, only empty rows sum to 0
    out = (out / sums.unsqueeze(-1)).to(out_dtype)
    if not return_attention:
        return out
    alpha = (numerators if return_dropped else exps) / sums.index_select(0, slot_targets(graph))
    return out, slot_to_eid(graph, alpha).to(out_dtype)
