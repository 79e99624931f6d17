"""The native path of the attention ops: fused CUDA kernels (native/attention/) behind autograd.

Each function here takes the same arguments as its public op in
:mod:`gnnio_cli.ops.attention` (already validated there) and returns the same
result. Score, softmax and weighted sum run fused in one pass per target row;
only the inputs and ``lse[t, h]`` (log of the softmax denominator) are kept for
backward, which recomputes the scores: once along the CSR for the target-side
gradients and ``delta[t, h] = <grad_out[t, h], out[t, h]>`` (summed in fp32 from
the recomputed terms, never from a rounded 16-bit output), once along the CSC
for the source-side and per-edge ones. GAT and the dot product with an fp32
output (fp32 features, or 16-bit ones under autocast: ``fp32_out``) keep the
output too and go the other way round (see :func:`_source_first`). Results
are deterministic (no atomics). A layer's output bias can be added by the
forward as it stores each row (``bias``), one pass over the output fewer.

Schedule, chosen per graph from its degree profile and cached on the Graph:
rows with at most ``tile_edges`` in-edges are handled by one warp each;
longer rows are cut into tiles of ``tile_edges``, one warp per tile, whose
partial softmax states a second kernel merges. The resident warps take the
work longest first (tiles, then the light rows by descending degree, then
the empty rows in chunks), round robin, so all of them stay busy to the end.
A second forward schedule, ``edge-balanced`` (:data:`EDGE_BALANCED`), first
computes every edge's score with each warp taking the same number of edges
whatever rows they belong to, then runs the fused softmax and aggregation on
those scores; backward is the same. It is a candidate that `compare
--schedules` times, not the graph's choice (measured slower, see there).

Limits: fp32, fp16 and bf16 features (fp64 and head widths above
:data:`MAX_CHANNELS` run the reference, see :func:`supports`); the returned
attention weights carry no gradient.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch

from gnnio_cli import native
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.compress import slot_map
from gnnio_cli.graph.schedule import MIN_TILE_EDGES, row_order, row_schedule
from gnnio_cli.ops import dispatch
from gnnio_cli.ops.dense import bias_gradient

GAT, GATV2, DOT, COSINE = 0, 1, 2, 3

# Each kind's ops are torch.ops.gnnio.<prefix>_attention_<pass> (native/attention/<prefix>.cu).
_OP_PREFIX = {GAT: "gat", GATV2: "gatv2", DOT: "dot", COSINE: "cosine"}

# The widest head the kernels' lane layout holds (native/attention/passes.cuh: 32 lanes x 8 chunks).
MAX_CHANNELS = 256
NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The widest head whose output bias gradient attention_row_dots sums as it reads grad_out (one
# channel per lane); wider heads take ops.dense.bias_gradient's pass of their own.
MAX_ROW_DOTS_BIAS = 32

# The edge-balanced forward's name: a `compare --schedules` candidate besides
# the tile lengths, and forced_schedule's, but never the graph's choice. The
# fused pass's tiles already give every warp an equal share of a long row's
# score work, and the separate score phase reads the source rows twice; it
# measured slower on every graph tried (H100, forward: rmat20 GATv2 4.71 vs
# 3.10 ms, AGNN 4.92 vs 3.90; rmat20 with a 2,000,000 in-degree target GATv2
# 6.86 vs 4.95, Transformer 7.16 vs 6.26).
EDGE_BALANCED = "edge-balanced"

# The share of L2 that the rows of a pass's most-read neighbours may fill
# (hinted_indices: the Transformer's passes give every other row L2's
# evict-first policy); the rest is left to the rows and streams in flight.
HOT_L2_SHARE = 0.6


def supports(*tensors: Optional[torch.Tensor], channels: Optional[int] = None, return_attention: bool = False) -> bool:
    """Whether the fused kernels take these inputs: CUDA, fp32/fp16/bf16, head width <= MAX_CHANNELS.

    The kernels return attention weights without a gradient, so a call that asks
    for the weights while autograd tracks its inputs goes to the reference, whose
    weights carry one (as PyG's do): never a silently missing gradient.
    """
    present = [t for t in tensors if t is not None]
    if channels is None:
        channels = present[0].shape[-1]
    if return_attention and torch.is_grad_enabled() and any(t.requires_grad for t in present):
        return False
    return channels <= MAX_CHANNELS and all(t.is_cuda and t.dtype in NATIVE_DTYPES for t in present)


# --------------------------------------------------------------- schedule
_forced = threading.local()

Schedule = Union[None, int, str]  # None: the graph's choice; a tile length (fused); EDGE_BALANCED


@contextmanager
def forced_schedule(schedule: Schedule) -> Iterator[None]:
    """Run the enclosed attention calls under `schedule`: None (the graph's choice), a tile length for the
    fused pass's target rows, or EDGE_BALANCED (with the graph's tile length for its fused pass).

    For `gnnio compare --schedules`, which times each candidate to check the choice.
    """
    if schedule is not None and schedule != EDGE_BALANCED and not (isinstance(schedule, int) and schedule > 0):
        raise GnnioError(f"schedule must be None, a positive tile length or '{EDGE_BALANCED}', got {schedule!r}")
    previous = getattr(_forced, "schedule", None)
    _forced.schedule = schedule
    try:
        yield
    finally:
        _forced.schedule = previous


def schedule_candidates(graph: Graph) -> list[Schedule]:
    """Schedules worth timing on `graph`: the chosen one (None), fixed tile lengths, no split, edge-balanced."""
    longest = graph.facts.csr.max_degree
    fixed = [size for size in (128, 512, 2048) if size < longest]
    return [None, *fixed, max(longest, MIN_TILE_EDGES), EDGE_BALANCED]


def slot_rows(graph: Graph) -> torch.Tensor:
    """int32 [E]: the CSR row (target) of each slot, cached on the graph (the edge-balanced score phase's map)."""

    def build() -> torch.Tensor:
        indptr = graph.csr_indptr
        rows = torch.arange(indptr.numel() - 1, device=indptr.device, dtype=torch.int32)
        return torch.repeat_interleave(rows, indptr.diff(), output_size=graph.num_edges)

    return graph.cached(("attention_slot_rows",), build)


def edge_grad_slots(graph: Graph) -> torch.Tensor:
    """int64 [E]: the CSC slot of each CSR slot, cached on the graph. GAT's and DOT's source pass
    writes each edge's score gradient in its own (CSC) slot order; the target pass finds a row's there."""
    return graph.cached(("attention_edge_grad_slots",), lambda: slot_map(graph.csc_eid, graph.csr_eid))


def hinted_indices(graph: Graph, side: str, row_bytes: int) -> Optional[torch.Tensor]:
    """int32 [E]: the 'csr' or 'csc' neighbour ids with bit 31 set where the neighbour is rarely read, or None.

    A pass reads a neighbour's rows once per slot that names it. The nodes read most, as many as have rows
    (`row_bytes` each, every row the pass gathers per edge) to fill HOT_L2_SHARE of the device's L2,
    keep bit 31 clear; the kernels that gather ahead copy every other node's rows with L2's evict-first
    policy, so the rows read most stay in L2. None where ids need all 32 bits, off the GPU, or with the
    share 0. Cached on the graph per side and hot-node count.
    """
    indices = graph.csr_indices if side == "csr" else graph.csc_indices
    nodes = graph.num_src_nodes if side == "csr" else graph.num_dst_nodes
    share = HOT_L2_SHARE
    if share <= 0.0 or nodes >= 2**31 or indices.numel() == 0 or not indices.is_cuda:
        return None
    l2_bytes = dispatch.cuda_properties(indices.device).L2_cache_size
    hot = int(share * l2_bytes) // max(row_bytes, 1)
    if hot >= nodes:  # every node's rows fit: none is read rarely enough to mark
        return None

    return graph.cached(("attention_hinted_indices", side, hot), lambda: mark_rarely_read(indices, nodes, hot))


def mark_rarely_read(indices: torch.Tensor, nodes: int, hot: int) -> torch.Tensor:
    """int32 copy of `indices` (ids below 2^31) with bit 31 set on every slot whose node is not among the
    `hot` nodes that the most slots name (ties broken by torch.topk)."""
    reads = torch.zeros(nodes, dtype=torch.int32, device=indices.device).index_add_(
        0, indices, torch.ones_like(indices, dtype=torch.int32))
    rare = torch.ones(nodes, dtype=torch.bool, device=indices.device)
    if hot > 0:
        rare[torch.topk(reads, min(hot, nodes), sorted=False).indices] = False
    ids = indices.to(torch.int32)
    return torch.where(rare[indices], ids | torch.iinfo(torch.int32).min, ids)


# ----------------------------------------------------------------- autograd
def _op(kind: int, name: str):
    """The typed op of `kind` for pass `name` (forward, forward_edge_balanced, backward_target, backward_source,
    backward_target_from_edges), looked up when called: the extension registers its ops when it loads."""
    return getattr(torch.ops.gnnio, f"{_OP_PREFIX[kind]}_attention_{name}")


def _kind_tensors(kind: int, tensors: tuple) -> tuple:
    """The tensor arguments of `kind`'s ops from _FusedAttention's (msg_src, key_src, dst_vec, src_scalar,
    dst_scalar, att, edge): GAT (x_src, alpha_src, alpha_dst, edge_alpha), GATv2 (x_src, x_dst, att, edge),
    DOT (query, key, value, edge)."""
    msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge = tensors
    if kind == GAT:
        return msg_src, src_scalar, dst_scalar, edge
    if kind == GATV2:
        return msg_src, dst_vec, att, edge
    return dst_vec, key_src, msg_src, edge


@dataclass(frozen=True)
class _Plan:
    """What every fused call of one kind, with one set of options, passes on one graph; built once per
    graph and options (_make_call caches it on the graph), so a call does not build it again before its
    first launch. It holds the graph's tensors but not the graph (that would be a reference cycle).
    """

    kind: int
    # the graph arguments of the passes along the CSR and the CSC (see native/attention/schema.h):
    # (indptr, indices, eid, *schedule.args(), *order.args())
    csr_args: tuple
    csc_args: tuple
    # the score's constants that the kind's ops take: (negative_slope,) for GAT and GATv2, (scale,) for DOT,
    # none for COSINE
    score: tuple
    return_scores: int  # 0 none, 1 raw scores, 2 raw scores with -inf where dropped
    schedule_name: str  # what `gnnio run` shows
    slot_rows: Optional[torch.Tensor] = None  # set: the edge-balanced forward (its score phase's row map)
    # GAT: return the gradients of x_src, alpha_src and alpha_dst as views of one [N, H*C + 2H]
    # tensor (see _FusedAttention.backward); needs as many sources as targets
    pack_gradients: bool = False
    # DOT: the indices with the rarely read neighbours marked (hinted_indices) for the forward (CSR), the
    # source pass (CSC) and the target pass (CSR, rows of one tensor)
    hinted_csr: Optional[torch.Tensor] = None
    hinted_csc: Optional[torch.Tensor] = None
    hinted_target: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class _Call:
    """The non-tensor arguments of one fused attention call: its graph's cached plan, and the dropout."""

    plan: _Plan
    graph: Graph
    dropout: float
    seed: int
    offset: int
    fp32_out: bool = False  # GAT and DOT: the output (and GAT's bias) in fp32 whatever the features' dtype

    def forward(self, tensors: tuple, bias: Optional[torch.Tensor] = None,
                residual: Optional[torch.Tensor] = None) -> tuple:
        """(out, lse, scores) of the kind's forward op that this call's schedule names, over the op's tensor
        arguments (_kind_tensors; COSINE: _cosine_tensors); out + bias [H, C] (GAT, GATv2) or + residual
        [Nd, H, C] (DOT) where given."""
        plan = self.plan
        if bias is not None and plan.kind not in (GAT, GATV2):
            raise GnnioError(f"bias: only GAT's and GATv2's attention add an output bias, not kind {plan.kind}")
        if residual is not None and plan.kind != DOT:
            raise GnnioError(f"residual: only the Transformer's attention adds a skip connection, not kind {plan.kind}")
        store = {GAT: (bias,), GATV2: (bias,), DOT: (residual,), COSINE: ()}[plan.kind]
        out_type = (self.fp32_out,) if plan.kind in (GAT, DOT) else ()
        if plan.slot_rows is None:
            hints = (plan.hinted_csr,) if plan.kind == DOT else ()
            return _op(plan.kind, "forward")(*plan.csr_args, *tensors, *self.score_args(), plan.return_scores,
                                             *store, *hints, *out_type)
        return _op(plan.kind, "forward_edge_balanced")(*plan.csr_args, *tensors, *self.score_args(),
                                                       plan.return_scores, plan.slot_rows, *store, *out_type)

    def score_args(self) -> tuple:
        """The score and dropout arguments of the kind's ops: (*plan.score, dropout, seed, offset)."""
        return *self.plan.score, self.dropout, self.seed, self.offset


def _source_first(kind: int, out_dtype: torch.dtype) -> bool:
    """Whether the backward runs the source pass first (GAT and DOT with an fp32 output) or the target pass
    first.

    GAT's and DOT's target-side gradients are linear in the per-edge score
    gradients, which the source pass then writes ([E, H] fp32, in CSC slot order), so
    the target pass gathers one row per edge (DOT's key) or none (GAT) instead of
    recomputing every score from two. The source pass needs delta = <grad_out, out>
    first: it comes from the saved output (one more [Nd, H, C] tensor kept for
    backward, 512 MiB on rmat20). H100, rmat20, fp32 fwd+bwd: GAT 7.46
    against 7.62 ms, Transformer 11.87 against 12.43; TransformerConv's training
    step peaks at 3,921 MiB. A 16-bit output is rounded, and that rounding would
    reach d score = p * (dp - delta), where dp and delta nearly cancel: a 16-bit
    output keeps the target pass first, which sums delta from the recomputed
    terms. 16-bit features with an fp32 output (fp32_out, what the layers take
    under autocast, where PyG's output is fp32 too) take the source pass first:
    delta from the exact output, grad_out rounded to the features' dtype for
    the passes and for delta (so that dp and delta cancel as in exact
    arithmetic). GATv2's and AGNN's target passes gather one row per edge
    either way.
    """
    return kind in (GAT, DOT) and out_dtype == torch.float32


class _FusedAttention(torch.autograd.Function):
    """Tensors (msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge), bias, residual -> (out, lse, scores).

    Roles per kind: GAT (msg_src=x_src, src_scalar=alpha_src, dst_scalar=alpha_dst,
    edge=edge_alpha), GATv2 (msg_src=x_src, dst_vec=x_dst, att, edge=edge_feat),
    DOT (msg_src=value, key_src=key, dst_vec=query, edge=edge_feat). bias: None,
    or a layer's output bias [H, C]; residual: None, or a layer's skip connection
    [Nd, H, C]; the forward adds both at its store (a backward that reads out, see
    _source_first, takes them off in attention_row_dots). lse and scores carry no
    gradient.
    """

    @staticmethod
    def forward(ctx, call: _Call, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge, bias, residual):
        tensors = (msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge)
        out, lse, scores = call.forward(_kind_tensors(call.plan.kind, tensors), bias, residual)
        ctx.call = call
        # GAT and DOT take delta = <grad_out, out - bias - residual> from the output itself (see _source_first)
        source_first = _source_first(call.plan.kind, out.dtype)
        kept = (out, bias, residual) if source_first else (None, None, None)
        ctx.save_for_backward(*tensors, lse, *kept)
        ctx.mark_non_differentiable(lse, scores)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for lse and scores, which have none
        return out, lse, scores

    @staticmethod
    def backward(ctx, grad_out, _grad_lse, _grad_scores):
        if grad_out is None:
            return (None,) * 10
        call: _Call = ctx.call
        plan = call.plan
        *tensors, lse, out, bias, residual = ctx.saved_tensors
        # grad_out in the features' dtype for every pass. Under fp32_out it arrives in fp32 and is rounded: the
        # row dots take the rounded values too (widened), so that delta and the source pass's dp come from one
        # grad_out and cancel as they do in exact arithmetic; the bias gradient outside the row dots takes it exact
        grad_exact = grad_out.contiguous()
        grad_out = grad_exact.to(tensors[0].dtype)
        # the bias gradient (grad_out's column sums) from the row dots' read of grad_out where they run
        bias_in_row_dots = out is not None and ctx.needs_input_grad[8] and grad_out.shape[2] <= MAX_ROW_DOTS_BIAS
        kind, typed, csr, csc = plan.kind, _kind_tensors(plan.kind, tensors), plan.csr_args, plan.csc_args
        grad_key = grad_src_scalar = grad_att = None
        if out is not None:
            # (lse, delta) side by side, as the source pass gathers them; the row dots take one dtype, the
            # output's (a 16-bit residual under fp32_out is widened for them)
            row_stats, bias_sums = torch.ops.gnnio.attention_row_dots(
                grad_out.to(out.dtype), out, bias, lse, bias_in_row_dots,
                None if residual is None else residual.to(out.dtype),
            )
            if kind == GAT:
                packed = None
                if plan.pack_gradients:
                    # rows of (d x_src, d alpha_src, d alpha_dst), which the kernels write in place: a layer that
                    # projected all three from one x takes x's gradient in one GEMM over them (GATConv)
                    rows, heads, channels = tensors[0].shape
                    packed = grad_out.new_empty(rows, heads * channels + 2 * heads)
                grad_msg, grad_src_scalar, grad_edge, edge_grads = torch.ops.gnnio.gat_attention_backward_source(
                    *csc, *typed, grad_out, row_stats, *call.score_args(), True, packed)
                grad_dst = torch.ops.gnnio.gat_attention_backward_target_from_edges(
                    *csr, *typed, edge_grads, edge_grad_slots(call.graph), packed)
                if packed is not None:  # the ops wrote the three into packed's rows
                    width = heads * channels
                    grad_msg = packed[:, :width].view(rows, heads, channels)
                    grad_src_scalar, grad_dst = packed[:, width:width + heads], packed[:, width + heads:]
            else:
                grad_msg, grad_key, grad_edge, edge_grads = torch.ops.gnnio.dot_attention_backward_source(
                    *csc, *typed, grad_out, row_stats, *call.score_args(), True, plan.hinted_csc)
                grad_dst = torch.ops.gnnio.dot_attention_backward_target_from_edges(
                    *csr, *typed, edge_grads, edge_grad_slots(call.graph), plan.hinted_target)
        else:
            # row_stats: (lse, delta) per (target, head), as the source pass gathers them
            grad_dst, *grad_att, row_stats = _op(kind, "backward_target")(*csr, *typed, grad_out, lse,
                                                                           *call.score_args())
            grad_att = grad_att[0] if grad_att else None  # GATv2's alone
            source = _op(kind, "backward_source")
            if kind == GAT:
                grad_msg, grad_src_scalar, grad_edge, _ = source(*csc, *typed, grad_out, row_stats,
                                                                 *call.score_args(), False)
            elif kind == GATV2:
                grad_msg, grad_edge = source(*csc, *typed, grad_out, row_stats, *call.score_args())
            else:
                grad_msg, grad_key, grad_edge, _ = source(*csc, *typed, grad_out, row_stats, *call.score_args(),
                                                          False, plan.hinted_csc)
        has_edge = tensors[6] is not None
        if kind == GAT:
            grads = (grad_msg, None, None, grad_src_scalar, grad_dst, None, grad_edge if has_edge else None)
        elif kind == GATV2:
            grads = (grad_msg, None, grad_dst, None, None, grad_att, grad_edge if has_edge else None)
        else:
            grads = (grad_msg, grad_key, grad_dst, None, None, None, grad_edge if has_edge else None)
        grad_bias = None
        if bias_in_row_dots:
            grad_bias = bias_sums.to(bias.dtype)
        elif ctx.needs_input_grad[8]:
            grad_bias = bias_gradient(grad_exact.view(grad_exact.shape[0], -1)).view(grad_exact.shape[1:])
        grad_residual = grad_out if ctx.needs_input_grad[9] else None
        return (None, *grads, grad_bias, grad_residual)


def _make_call(
    kind: int,
    graph: Graph,
    heads: int,
    device: torch.device,
    *,
    negative_slope: float,
    scale: float,
    dropout: float,
    training: bool,
    return_attention: bool,
    weights_after_dropout: bool,
    pack_gradients: bool = False,
    row_bytes: int = 0,
    fp32_out: bool = False,
) -> _Call:
    """The plan (cached on the graph), dropout and seed of one fused call (dropout 0 outside training;
    pack_gradients only for GAT with as many sources as targets; DOT's hinted indices for rows of `row_bytes`;
    fp32_out only for GAT and DOT)."""
    forced = getattr(_forced, "schedule", None)
    negative_slope, scale = float(negative_slope), float(scale)
    return_scores = (2 if weights_after_dropout else 1) if return_attention else 0
    pack_gradients = pack_gradients and kind == GAT and graph.num_src_nodes == graph.num_dst_nodes
    key = ("attention_plan", kind, forced, negative_slope, scale, return_scores, pack_gradients,
           row_bytes if kind == DOT else 0)
    plan = graph.cached(key, lambda: _build_plan(kind, graph, forced, negative_slope, scale, return_scores,
                                                 pack_gradients, row_bytes))
    dropout = float(dropout) if training else 0.0
    seed = offset = 0
    if dropout > 0.0:
        with torch.cuda.device(device):
            seed, offset = torch.ops.gnnio.attention_dropout_seed((heads + 3) // 4)
    return _Call(plan, graph, dropout, seed, offset, fp32_out and kind in (GAT, DOT))


def _build_plan(kind: int, graph: Graph, forced: Schedule, negative_slope: float, scale: float, return_scores: int,
                pack_gradients: bool, row_bytes: int) -> _Plan:
    """_make_call's plan under the forced schedule (forced_schedule) or the graph's choice."""
    csr, csc = row_schedule(graph, "csr", forced if isinstance(forced, int) else None), row_schedule(graph, "csc")
    csr_order, csc_order = row_order(graph, "csr", csr), row_order(graph, "csc", csc)
    slot_map = slot_rows(graph) if forced == EDGE_BALANCED else None
    name = f"{EDGE_BALANCED} scores + fused {csr.name}" if slot_map is not None else f"fused {csr.name}"
    # DOT's passes gather two rows per edge (forward: key and value; source pass: grad_out and query), its
    # target pass one (key)
    dot = kind == DOT
    score = {GAT: (negative_slope,), GATV2: (negative_slope,), DOT: (scale,), COSINE: ()}[kind]
    return _Plan(kind,
                 (graph.csr_indptr, graph.csr_indices, graph.csr_eid, *csr.args(), *csr_order.args()),
                 (graph.csc_indptr, graph.csc_indices, graph.csc_eid, *csc.args(), *csc_order.args()),
                 score, return_scores, name, slot_map, pack_gradients,
                 hinted_indices(graph, "csr", 2 * row_bytes) if dot else None,
                 hinted_indices(graph, "csc", 2 * row_bytes) if dot else None,
                 hinted_indices(graph, "csr", row_bytes) if dot else None)


def _finish(op: str, call: _Call, out: torch.Tensor, lse: torch.Tensor, scores: torch.Tensor, return_attention: bool):
    """Record the schedule that ran; out, or (out, alpha [E, H] in eid order)."""
    dispatch.record(op, call.plan.schedule_name)
    if not return_attention:
        return out
    dropout = call.dropout if call.plan.return_scores == 2 else 0.0
    return out, _attention_weights(call.graph, scores, lse, dropout, out.dtype)


def _run(op: str, kind: int, graph: Graph, tensors: tuple, bias: Optional[torch.Tensor] = None,
         residual: Optional[torch.Tensor] = None, **call_options):
    """Run the fused op with :func:`_make_call`'s keyword options; returns out (+ bias [H, C] + residual
    [Nd, H, C] where given) or (out, alpha [E, H] in eid order)."""
    tensors = tuple(None if t is None else t.contiguous() for t in tensors)
    bias = None if bias is None else bias.contiguous()
    residual = None if residual is None else residual.contiguous()
    rows = tensors[0]  # msg_src [N, H, C]
    row_bytes = rows.shape[1] * rows.shape[2] * rows.element_size()
    call = _make_call(kind, graph, rows.shape[1], rows.device, row_bytes=row_bytes, **call_options)
    out, lse, scores = _FusedAttention.apply(call, *tensors, bias, residual)
    return _finish(op, call, out, lse, scores, call_options["return_attention"])


def _attention_weights(graph: Graph, scores: torch.Tensor, lse: torch.Tensor, dropout: float, dtype) -> torch.Tensor:
    """alpha[e, h] = exp(score - lse[target]) (x 1/(1-p) after dropout; dropped edges hold -inf scores)."""
    targets = graph.edge_index()[1]
    alpha = torch.exp(scores - lse.index_select(0, targets))
    if dropout > 0.0:
        alpha = alpha * (1.0 / (1.0 - dropout)) if dropout < 1.0 else torch.zeros_like(alpha)
    return alpha.to(dtype)


# ------------------------------------------------------------- public ops
def gat_attention(graph, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout, training, return_attention,
                  bias=None, pack_gradients=False, fp32_out=False):
    """Fused :func:`gnnio_cli.ops.attention.gat_attention` (same arguments and result; fp32_out: out_dtype fp32)."""
    return _run(
        "gat_attention", GAT, graph, (x_src, None, None, alpha_src, alpha_dst, None, edge_alpha), bias,
        negative_slope=negative_slope, scale=1.0, dropout=dropout, training=training,
        return_attention=return_attention, weights_after_dropout=True, pack_gradients=pack_gradients,
        fp32_out=fp32_out,
    )  # fmt: skip


def gatv2_attention(graph, x_src, x_dst, att, edge_feat, negative_slope, dropout, training, return_attention,
                    bias=None):
    """Fused :func:`gnnio_cli.ops.attention.gatv2_attention` (same arguments and result)."""
    return _run(
        "gatv2_attention", GATV2, graph, (x_src, None, x_dst, None, None, att, edge_feat), bias,
        negative_slope=negative_slope, scale=1.0, dropout=dropout, training=training,
        return_attention=return_attention, weights_after_dropout=True,
    )  # fmt: skip


def transformer_attention(graph, query, key, value, edge_feat, dropout, training, return_attention, residual=None,
                          fp32_out=False):
    """Fused :func:`gnnio_cli.ops.attention.transformer_attention` (same arguments and result; fp32_out:
    out_dtype fp32)."""
    return _run(
        "transformer_attention", DOT, graph, (value, key, query, None, None, None, edge_feat), residual=residual,
        negative_slope=0.0, scale=1.0 / math.sqrt(query.shape[2]), dropout=dropout, training=training,
        return_attention=return_attention, weights_after_dropout=False, fp32_out=fp32_out,
    )  # fmt: skip


class _CosineAttention(torch.autograd.Function):
    """(x_src [Ns, 1, C], x_dst [Nd, 1, C] or None when it is x_src, beta) -> (out [Nd, 1, C], lse, scores).

    AGNN through the kernels' Cosine kind (native/attention/passes.cuh's header has the
    derivation): forward takes the fp32 norm of each row and its inverse
    1 / max(norm, 1e-12) in one pass; the kernels read the rows themselves
    (exact in every dtype) with them,
    cosine = <x_dst, x_src> / max(|x_src|, 1e-12) / max(|x_dst|, 1e-12), the
    message x_src. Backward: the target pass gives d u_dst and d beta (u =
    F.normalize(x)); the source pass gives d x_src whole: through the messages
    and, by F.normalize's backward at the end of each row, through the scores
    (and d u_dst when x_dst is x_src); a node pass gives d x_dst otherwise.
    lse and scores carry no gradient.
    """

    @staticmethod
    def forward(ctx, call: _Call, x_src, x_dst, beta):
        shared = x_dst is None
        norm_src = torch.ops.gnnio.attention_row_norms(x_src)
        norm_dst = norm_src if shared else torch.ops.gnnio.attention_row_norms(x_dst)
        x_dst = x_src if shared else x_dst
        beta_f32 = beta.detach().to(torch.float32).reshape(1)
        out, lse, scores = call.forward(_cosine_tensors(x_src, norm_src, x_dst, norm_dst, beta_f32))
        ctx.call, ctx.shared = call, shared
        ctx.beta_shape, ctx.beta_dtype = beta.shape, beta.dtype
        ctx.save_for_backward(x_src, norm_src, x_dst, norm_dst, beta_f32, lse)
        ctx.mark_non_differentiable(lse, scores)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for lse and scores, which have none
        return out, lse, scores

    @staticmethod
    def backward(ctx, grad_out, _grad_lse, _grad_scores):
        if grad_out is None:
            return None, None, None, None
        call: _Call = ctx.call
        x_src, norm_src, x_dst, norm_dst, beta_f32, lse = ctx.saved_tensors
        tensors = _cosine_tensors(x_src, norm_src, x_dst, norm_dst, beta_f32)
        grad_out = grad_out.contiguous()
        # row_stats: (lse, delta, 1 / max(|x_dst|, 1e-12), 0) per target, as the source pass gathers them
        grad_unit_dst, grad_beta, row_stats = torch.ops.gnnio.cosine_attention_backward_target(
            *call.plan.csr_args, *tensors, grad_out, lse, *call.score_args()
        )
        # The source pass returns d x_src whole; when x_dst is x_src it also takes d u_dst.
        grad_src = torch.ops.gnnio.cosine_attention_backward_source(
            *call.plan.csc_args, *tensors, grad_unit_dst if ctx.shared else None, grad_out, row_stats,
            *call.score_args()
        )
        grad_dst = None
        if not ctx.shared:
            grad_dst = torch.ops.gnnio.attention_unit_rows_backward(x_dst, norm_dst, grad_unit_dst)
        return None, grad_src, grad_dst, grad_beta.reshape(ctx.beta_shape).to(ctx.beta_dtype)


def _cosine_tensors(x_src, norm_src, x_dst, norm_dst, beta_f32) -> tuple:
    """The tensor arguments of the cosine ops (native/attention/cosine.cu): (x_src, x_dst, norm_src, norm_dst,
    beta)."""
    return x_src, x_dst, norm_src, norm_dst, beta_f32


def agnn_attention(graph, x_src, x_dst, beta, dropout, training, return_attention):
    """Fused :func:`gnnio_cli.ops.attention.agnn_attention`: a one-head cosine attention.

    When x_dst is x_src (AGNNConv's case) its norms are computed once and its
    gradient comes from one pass.
    """
    shared = x_dst is x_src
    x_src = x_src.contiguous().unsqueeze(1)
    x_dst = None if shared else x_dst.contiguous().unsqueeze(1)
    call = _make_call(
        COSINE, graph, 1, x_src.device, negative_slope=0.0, scale=1.0, dropout=dropout, training=training,
        return_attention=return_attention, weights_after_dropout=False,
    )  # fmt: skip
    out, lse, scores = _CosineAttention.apply(call, x_src, x_dst, beta)
    result = _finish("agnn_attention", call, out.squeeze(1), lse, scores, return_attention)
    if return_attention:
        out, alpha = result
        return out, alpha.squeeze(1)
    return result


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """The typed attention edge ops of native/attention/<kind>.cu. Each takes the graph arguments of
    native/attention/schema.h (10: indptr, indices, eid, the row schedule and the row order) first; Nd or Ns is
    the rows of that indptr, E the entries of indices."""

    def forward(indptr, indices, rows, return_scores, fp32_out=False):
        """(out [Nd, H, C] like `rows` (fp32 with fp32_out), lse fp32 [Nd, H], scores fp32 [E or 0, H])."""
        num_dst, heads = indptr.shape[0] - 1, rows.shape[1]
        scores = rows.new_empty((indices.shape[0] if return_scores else 0, heads), dtype=torch.float32)
        out = rows.new_empty((num_dst, *rows.shape[1:]), dtype=torch.float32 if fp32_out else rows.dtype)
        return out, rows.new_empty((num_dst, heads), dtype=torch.float32), scores

    def stats(indptr, rows, width=2):
        """row_stats fp32 [Nd, H, width]."""
        return rows.new_empty((indptr.shape[0] - 1, rows.shape[1], width), dtype=torch.float32)

    def node_rows(indptr, rows, per_head=True):
        """[N, H, C] (or [N, H] without per_head) like `rows`, N the rows of indptr."""
        return rows.new_empty((indptr.shape[0] - 1, *(rows.shape[1:] if per_head else rows.shape[1:2])))

    def edge_outputs(indices, rows, edge, write_edge_grads):
        """(grad of edge (or [0]), edge_grads fp32 [E or 0, H])."""
        grad_edge = torch.empty_like(edge) if edge is not None else rows.new_empty(0)
        count = indices.shape[0] if write_edge_grads else 0
        return grad_edge, rows.new_empty((count, rows.shape[1]), dtype=torch.float32)

    # the node-level ops (native/attention/rows.cu)
    @torch.library.register_fake("gnnio::attention_row_norms")
    def _(x):
        return x.new_empty((*x.shape[:2], 2), dtype=torch.float32)

    @torch.library.register_fake("gnnio::attention_row_dots")
    def _(a, b, offset=None, lse=None, column_sums=False, residual=None):
        nodes, heads, channels = a.shape
        dots = a.new_empty((nodes, heads, 2) if lse is not None else (nodes, heads), dtype=torch.float32)
        return dots, a.new_empty((heads if column_sums else 0, channels), dtype=torch.float32)

    @torch.library.register_fake("gnnio::attention_unit_rows_backward")
    def _(x, norm, grad_unit):
        return torch.empty_like(x)

    # GAT: x_src, alpha_src, alpha_dst, edge_alpha
    @torch.library.register_fake("gnnio::gat_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout, seed, offset,
          return_scores, bias=None, fp32_out=False):
        return forward(indptr, indices, x_src, return_scores, fp32_out)

    @torch.library.register_fake("gnnio::gat_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout, seed, offset,
          return_scores, slot_rows, bias=None, fp32_out=False):
        return forward(indptr, indices, x_src, return_scores, fp32_out)

    @torch.library.register_fake("gnnio::gat_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, grad_out, lse, negative_slope, dropout, seed,
          offset):
        return node_rows(indptr, x_src, per_head=False), stats(indptr, x_src)

    @torch.library.register_fake("gnnio::gat_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, grad_out, row_stats, negative_slope, dropout, seed,
          offset, write_edge_grads, packed_grads=None):
        if packed_grads is not None:  # written in place (see the schema)
            heads, channels = x_src.shape[1:]
            return (x_src.new_empty(0, heads, channels), x_src.new_empty(0, heads),
                    *edge_outputs(indices, x_src, edge_alpha, write_edge_grads))
        return (node_rows(indptr, x_src), node_rows(indptr, x_src, per_head=False),
                *edge_outputs(indices, x_src, edge_alpha, write_edge_grads))

    @torch.library.register_fake("gnnio::gat_attention_backward_target_from_edges")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, edge_grads, edge_grad_slots, packed_grads=None):
        if packed_grads is not None:  # written in place (see the schema)
            return x_src.new_empty(0, x_src.shape[1])
        return node_rows(indptr, x_src, per_head=False)

    # GATv2: x_src, x_dst, att, edge
    @torch.library.register_fake("gnnio::gatv2_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, negative_slope, dropout, seed, offset, return_scores, bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gatv2_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, negative_slope, dropout, seed, offset, return_scores, slot_rows,
          bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gatv2_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, grad_out, lse, negative_slope, dropout, seed, offset):
        return node_rows(indptr, x_src), torch.empty_like(att), stats(indptr, x_src)

    @torch.library.register_fake("gnnio::gatv2_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, grad_out, row_stats, negative_slope, dropout, seed, offset):
        return node_rows(indptr, x_src), edge_outputs(indices, x_src, edge, False)[0]

    # Dot: query, key, value, edge
    @torch.library.register_fake("gnnio::dot_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, scale, dropout, seed, offset, return_scores, residual=None,
          hinted_indices=None, fp32_out=False):
        return forward(indptr, indices, value, return_scores, fp32_out)

    @torch.library.register_fake("gnnio::dot_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, scale, dropout, seed, offset, return_scores, slot_rows,
          residual=None, fp32_out=False):
        return forward(indptr, indices, value, return_scores, fp32_out)

    @torch.library.register_fake("gnnio::dot_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, grad_out, lse, scale, dropout, seed, offset):
        return node_rows(indptr, value), stats(indptr, value)

    @torch.library.register_fake("gnnio::dot_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, grad_out, row_stats, scale, dropout, seed, offset,
          write_edge_grads, hinted_indices=None):
        return (node_rows(indptr, value), node_rows(indptr, value),
                *edge_outputs(indices, value, edge, write_edge_grads))

    @torch.library.register_fake("gnnio::dot_attention_backward_target_from_edges")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, edge_grads, edge_grad_slots, hinted_indices=None):
        return node_rows(indptr, value)

    # Cosine: x_src, x_dst, norm_src, norm_dst, beta
    @torch.library.register_fake("gnnio::cosine_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, dropout, seed, offset, return_scores):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::cosine_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, dropout, seed, offset, return_scores, slot_rows):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::cosine_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, grad_out, lse, dropout, seed, offset):
        return node_rows(indptr, x_src), torch.empty_like(beta), stats(indptr, x_src, 4)

    @torch.library.register_fake("gnnio::cosine_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, grad_unit_dst, grad_out, row_stats, dropout, seed,
          offset):
        return node_rows(indptr, x_src)
