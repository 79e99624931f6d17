"""GATConv and GATv2Conv: attention over each target's in-edges, as PyG 2.8."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.adjacency import Adjacency, FillValue, with_self_loops
from gnnio_cli.nn.base import (
    ConvBase,
    EdgeFeaturesForward,
    registered_children,
    registered_parameters,
    returned_edges,
    reversed_pair_reason,
    split_pair,
)
from gnnio_cli.nn.linear import (
    Linear,
    add_bias,
    glorot_,
    host_bound,
    plain_projection,
    plain_projection_by,
    project_shared,
    zeros_,
)
from gnnio_cli.nn.message_passing import AttentionOutput, Edges, NodeFeatures, Size
from gnnio_cli.nn import graph_ops
from gnnio_cli.nn.graph_ops import tracing
from gnnio_cli.ops import dense


def head_dots(h: Tensor, *vectors: Tensor) -> tuple[Tensor, ...]:
    """(h * v).sum(-1) for each attention vector v [1, H, C] of the rows h [N, H, C], as one GEMM.

    The same numbers as PyG's (h * att).sum(-1) up to summation order, but h is
    read once for all the vectors, and neither direction materialises an
    [N, H, C] product: h [N, H*C] @ B [H*C, J*H], with B holding vector j's head k
    in column j*H + k (rows k*C .. k*C + C), zero elsewhere.
    """
    num_rows, heads, channels = h.shape
    stacked = torch.stack([v.reshape(heads, channels) for v in vectors])  # [J, H, C]
    eye = torch.eye(heads, dtype=stacked.dtype, device=stacked.device)
    # blocks[j, k, c, g] = v_j[k, c] * (k == g), laid out as [(k, c), (j, g)]
    blocks = (stacked.unsqueeze(-1) * eye.unsqueeze(1)).permute(1, 2, 0, 3).reshape(heads * channels, -1)
    dots = (h.reshape(num_rows, heads * channels) @ blocks.to(h.dtype)).view(num_rows, len(vectors), heads)
    return tuple(dots[:, j] for j in range(len(vectors)))


def _score_weight(weight: Tensor, vectors: Tensor) -> Tensor:
    """S [J*H, F] with x @ S^T = the score terms (x @ W^T * v_j).sum(-1) for the attention vectors
    `vectors` [J, H, C] and the weight W [H*C, F] of a bias-free linear: S[j*H + k] = sum_c v_j[k, c] W[k*C + c]."""
    num_vectors, heads, channels = vectors.shape
    per_head = weight.view(heads, channels, -1)
    # a broadcast product and one sum over [J, H, C, F] (a few thousand numbers): two launches, where
    # torch.einsum's parsing and reshapes cost a mini-batch step's host more than the arithmetic
    return (vectors.to(weight.dtype).unsqueeze(-1) * per_head).sum(2).reshape(num_vectors * heads, -1)


class _ProjectWithScores(torch.autograd.Function):
    """(x [N, F], W [H*C, F], v_1, ..., v_J [1, H, C]) -> (h = x @ W^T [N, H*C], score_1, ..., score_J)
    with score_j = (h.view(N, H, C) * v_j).sum(-1) [N, H] contiguous (what the attention op reads):
    GATConv's projection and score terms in one function.

    The score terms come from x itself, as x @ S^T with S = _score_weight(W, v): the same numbers as PyG's
    up to summation order. Forward starts h's GEMM before anything else, so the GPU works on the big
    product while the host prepares S and the rest of the layer (the training step's first kernel waited
    on the host for the score weight's small ops before). Backward adds the scores' share of x's gradient
    inside x's GEMM (grad_x = g_dots @ S, then += g_h @ W, the narrow GEMM first: see _SharedInputAffine),
    or, where the attention op wrote g_h and the g_scores side by side in one tensor's rows (GAT's packed
    gradients), as one GEMM over those rows with [W; S] (H100, rmat20 1M x 128, 4 x 32: 1.04 ms against
    0.25 + 1.00 ms). W's and the vectors' gradients come from g_S = g_dots^T @ x [J*H, F] directly:
    d W[k*C + c] += sum_j v_j[k, c] g_S[j*H + k] and d v_j[k, c] = <g_S[j*H + k], W[k*C + c]>.
    Where ops.dense picks its split-TF32 kernel, h and the score terms are one product, and so are x's
    gradient and [g_h, g_dots]^T @ x over the packed rows (by default only where that fills the kernel's
    tiles: with H*C = 128 the 136 columns of h and scores do not; then h alone, which fills them, takes
    the kernel, and torch's GEMMs the score terms and the backward's products).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, *vectors: Tensor):
        heads = vectors[0].shape[-2]
        widths = [weight.shape[0], len(vectors) * heads]
        split_tf32 = dense.uses_split_tf32(x, widths, weight, product=dense.projection_product(x, widths))
        # h's product first, so the GPU starts while S is formed: ops.dense takes the split-TF32 kernel where h
        # alone fills its tiles (H*C = 128: the 136 columns of h and the scores would not), else torch's GEMM.
        # With split_tf32, h comes with the score terms below.
        h = None if split_tf32 else dense.project(x, [weight], [None])[0]
        stacked = torch.cat([v.reshape(1, *v.shape[-2:]) for v in vectors])  # [J, H, C]
        score_weight = _score_weight(weight, stacked)
        if split_tf32:
            h, dots = dense.project_split_tf32(x, [weight, score_weight], [None, None])  # one product: x read once
        else:
            dots = F.linear(x, score_weight)
        dots = dots.view(-1, len(vectors), heads)
        ctx.save_for_backward(x, weight, stacked, score_weight)
        ctx.vector_shapes = [v.shape for v in vectors]
        return (h, *(dots[:, j].contiguous() for j in range(len(vectors))))

    @staticmethod
    def backward(ctx, grad_h: Tensor, *grad_scores: Tensor):
        x, weight, stacked, score_weight = ctx.saved_tensors
        num_vectors, heads, channels = stacked.shape
        rows = x.reshape(-1, x.shape[-1])
        grad_h = grad_h.reshape(-1, heads * channels)
        packed = _packed_rows(grad_h, grad_scores)
        if packed is not None:
            grad_dots = packed[:, heads * channels:]
        else:
            # one [N, J*H] gradient for the one score GEMM: a single stack, where slicing one output tensor
            # would have autograd zero-fill and copy into it once per vector
            grad_dots = torch.stack(grad_scores, dim=1).view(-1, num_vectors * heads)
        grad_x = grad_weight = grad_h_weight = None
        needs_vectors = any(ctx.needs_input_grad[2:])
        if ctx.needs_input_grad[0] and packed is not None:
            grad_x = dense.project_input_gradient([packed], [torch.cat([weight, score_weight])]).view(x.shape)
        elif ctx.needs_input_grad[0]:
            grad_x = dense.project_input_gradient([grad_h, grad_dots], [weight, score_weight]).view(x.shape)
        # The split-TF32 kernel takes [g_h, g_dots]^T @ x over the packed rows as one product whose rows are
        # W's and S's gradients (torch's GEMMs are faster as two: 0.70 + 0.33 ms against 1.13 on rmat20).
        split_packed = packed is not None and dense.parameter_gradients_use_split_tf32([packed], rows)
        grad_score = None
        if split_packed and (ctx.needs_input_grad[1] or needs_vectors):
            both = dense.project_parameter_gradients([packed], rows, [True], [False])[0]
            grad_h_weight, grad_score = both[: heads * channels], both[heads * channels:]
        elif ctx.needs_input_grad[1] or needs_vectors:
            grad_score = grad_dots.t() @ rows  # [J*H, F]
        grad_score_heads = None if grad_score is None else grad_score.view(num_vectors, heads, -1)
        if ctx.needs_input_grad[1]:
            through_scores = (stacked.to(grad_score.dtype).unsqueeze(-1) * grad_score_heads.unsqueeze(2)).sum(0)
            if grad_h_weight is None:
                grad_h_weight = grad_h.t() @ rows
            grad_weight = grad_h_weight.add_(through_scores.reshape(heads * channels, -1))
        grad_vectors = [None] * num_vectors
        if needs_vectors:
            per_vector = (grad_score_heads.unsqueeze(2) * weight.view(heads, channels, -1)).sum(-1)
            grad_vectors = [per_vector[j].reshape(shape) if ctx.needs_input_grad[2 + j] else None
                            for j, shape in enumerate(ctx.vector_shapes)]
        return (grad_x, grad_weight, *grad_vectors)


def _packed_rows(grad_h: Tensor, grad_scores: tuple[Tensor, ...]) -> Optional[Tensor]:
    """[N, H*C + J*H]: the rows that hold grad_h [N, H*C] and then each grad_scores[j] [N, H], when they are
    views of one such tensor (gat_attention's pack_gradients); else None."""
    rows, width = grad_h.shape
    stride = width + sum(g.shape[-1] for g in grad_scores)
    if grad_h.stride() != (stride, 1):
        return None
    column = width
    for grad in grad_scores:
        if (grad.dim() != 2 or grad.stride() != (stride, 1) or grad.storage_offset() != grad_h.storage_offset() + column
                or grad.untyped_storage().data_ptr() != grad_h.untyped_storage().data_ptr()):
            return None
        column += grad.shape[1]
    return grad_h.as_strided((rows, stride), (stride, 1))


def project_with_scores(x: Tensor, linear: Linear, heads: int, *vectors: Tensor) -> tuple[Tensor, ...]:
    """h = linear(x) as [N, H, C] and GAT's score terms (h * v).sum(-1) for each attention vector v
    (_ProjectWithScores; where nn.linear.plain_torch says so or the weight is lazy, as PyG: linear(x), then the
    dots of h)."""
    (weight,) = registered_parameters(linear, "weight")
    if plain_projection_by(x, [weight]):
        h = linear(x)
        h = h.view(*h.shape[:-1], heads, h.shape[-1] // heads)
        if host_bound(x) and not torch.is_autocast_enabled(x.device.type):  # two small ops per vector, as PyG
            return (h, *((h * vector).sum(-1) for vector in vectors))
        return (h, *head_dots(h, *vectors))
    h, *scores = _ProjectWithScores.apply(x, weight, *vectors)
    return (h.view(-1, heads, linear.out_channels // heads), *scores)


def score_terms(x: Tensor, linear: Linear, heads: int, vector: Tensor) -> Tensor:
    """(linear(x) * vector).sum(-1) [N, H] without linear(x) itself: x @ S^T (see _ProjectWithScores)."""
    if plain_projection(x, linear):
        return project_with_scores(x, linear, heads, vector)[1]
    return F.linear(x, _score_weight(linear.weight, vector.reshape(1, heads, -1)))


class _AttentionConv(ConvBase):
    """What GATConv and GATv2Conv share: options, self-loops, edge features, heads, residual, bias, returns."""

    def _store_options(self, in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops,
                       edge_dim, fill_value, residual) -> None:
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = negative_slope
        self.dropout = dropout
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual

    def _add_residual_and_bias(self, target_width: int, bias: bool) -> None:
        """res (glorot, no bias) when `residual`, and the output bias; created in PyG's order."""
        total_out_channels = self.out_channels * (self.heads if self.concat else 1)
        if self.residual:
            self.res = Linear(target_width, total_out_channels, bias=False, weight_initializer="glorot")
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter("bias", None)

    def _reason(self, x: NodeFeatures, edge_index: Edges) -> Optional[str]:
        """Why this call runs PyG's code (None: gnnio's ops run it), for what both layers share."""
        reason = self._pyg_reason(("sum",), edge_index)
        if reason is not None:
            return reason
        x_src = x if isinstance(x, Tensor) else x[0]
        if x_src.dim() != 2:  # PyG asserts on these
            return f"node features of shape {tuple(x_src.shape)}"
        if isinstance(edge_index, Tensor) and edge_index.layout == torch.sparse_csc:
            raise GnnioError(
                f"{type(self).__name__}: PyG 2.8 takes no sparse CSC adjacency here; convert it with .to_sparse_csr()"
            )
        return reversed_pair_reason(self, x)

    def _traced_reason(self, edge_attr: Optional[Tensor], return_attention_weights: Optional[bool]) -> Optional[str]:
        """Why a traced call (torch.compile, torch.jit.trace) runs PyG's code: with self-loops added, the edge
        features carried through them and the returned edges have as many rows as the edges have non-loops."""
        if tracing() and self.add_self_loops and (edge_attr is not None or return_attention_weights):
            return "edge features or returned attention weights with self-loops under torch.compile or torch.jit.trace"
        return None

    def _edges_with_loops(
        self, adjacency: Adjacency, num_loops: int, edge_attr: Optional[Tensor]
    ) -> tuple[Adjacency, Optional[Tensor]]:
        """PyG's self-loop step: drop existing loops, add one per node (with fill_value edge features).

        A sparse input's values of shape [E, D] stand in for edge_attr when
        none is given, as PyG reads them.
        """
        if self.add_self_loops:
            adjacency, edge_attr = with_self_loops(adjacency, num_loops, edge_attr, self.fill_value)
        if edge_attr is None and adjacency.values is not None and adjacency.values.dim() == 2:
            edge_attr = adjacency.values
        return adjacency, edge_attr

    def _projected_edges(self, edge_attr: Optional[Tensor]) -> Optional[Tensor]:
        """lin_edge(edge_attr) as [E, H, C], or None when there is nothing to project."""
        if edge_attr is None or self.lin_edge is None:
            return None
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        return self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)

    def _attention_bias(self, messages: Tensor, residual: Optional[Tensor],
                        out_dtype: Optional[torch.dtype] = None) -> Optional[Tensor]:
        """The output bias as [H, C] for the attention op to add as it stores each row, where that is
        the same sum as PyG's (heads concatenated, no residual added before it, the output's dtype: out_dtype,
        or the messages'); else None and _finish adds it."""
        bias = self.bias
        if bias is None or not self.concat or residual is not None or bias.dtype != (out_dtype or messages.dtype):
            return None
        return bias.view(self.heads, self.out_channels)

    def _finish(
        self,
        out: Tensor,
        residual: Optional[Tensor],
        alpha: Optional[Tensor],
        edge_index: Edges,
        adjacency: Adjacency,
        return_attention_weights: Optional[bool],
        bias_added: bool,
    ) -> AttentionOutput:
        """Heads concat/mean, residual, bias (unless the attention op added it), and PyG's return structure."""
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if residual is not None:
            out = out + residual
        if self.bias is not None and not bias_added:
            out = add_bias(out, self.bias)
        if not return_attention_weights:
            return out
        if adjacency.is_sparse:
            return out, (adjacency.to_sparse(alpha), alpha)
        return out, (returned_edges(edge_index, adjacency, changed=self.add_self_loops), alpha)


class GATConv(_AttentionConv, pyg_name="GATConv"):
    """Graph attention (Velickovic et al.), as PyG 2.8's GATConv.

    in_channels:    int (one shared projection `lin`), or (source, target) widths
                    (projections `lin_src`, `lin_dst`); -1 is lazy.
    out_channels:   width per head C; heads H.
    concat:         concatenate heads ([N, H*C]) or average them ([N, C]).
    negative_slope: of the LeakyReLU on scores. dropout: on attention weights, training only.
    add_self_loops: drop existing loops and add one per node (loop edge features from fill_value:
                    a number, a tensor or a reduction name, default "mean").
    edge_dim:       width of edge features; enables lin_edge and att_edge.
    residual:       add res(x_dst) (no bias) to the output.
    **kwargs:       MessagePassing's; an aggr other than "add"/"sum" runs PyG's code.

    forward(x or (x_src, x_dst), edge_index, edge_attr=None, size=None, return_attention_weights=None)
    returns out, or with return_attention_weights=True (out, (edge_index, alpha [E', H])) where
    edge_index includes the added loops; for a sparse adj_t input, (out, (adj_t with alpha values, alpha)).
    Runs PyG's code (see gnnio_cli.nn.message_passing) for node features that are not [N, F]
    (PyG refuses them) and for flow="target_to_source" with a pair of features.
    """

    def __init__(
        self,
        in_channels: Union[int, tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: FillValue = "mean",
        bias: bool = True,
        residual: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        self._store_options(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops,
                            edge_dim, fill_value, residual)
        width = heads * out_channels
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, width, bias=False, weight_initializer="glorot")
        else:
            self.lin_src = Linear(in_channels[0], width, False, weight_initializer="glorot")
            self.lin_dst = Linear(in_channels[1], width, False, weight_initializer="glorot")
        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, width, bias=False, weight_initializer="glorot")
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        self._add_residual_and_bias(in_channels if isinstance(in_channels, int) else in_channels[1], bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for linear in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if linear is not None:
                linear.reset_parameters()
        glorot_(self.att_src)
        glorot_(self.att_dst)
        glorot_(self.att_edge)
        zeros_(self.bias)

    def forward(
        self,
        x: NodeFeatures,
        edge_index: Edges,
        edge_attr: Optional[Tensor] = None,
        size: Size = None,
        return_attention_weights: Optional[bool] = None,
    ) -> AttentionOutput:
        if torch.jit.is_scripting():
            return self._pyg_forward(x, edge_index, edge_attr, size, return_attention_weights)
        else:
            return self._forward(x, edge_index, edge_attr, size, return_attention_weights)

    def _forward(self, x, edge_index, edge_attr, size, return_attention_weights) -> AttentionOutput:
        reason = self._reason(x, edge_index) or self._traced_reason(edge_attr, return_attention_weights)
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, edge_attr, size, return_attention_weights)
        self._ran("gnnio")
        heads = self.heads
        x_src, x_dst = split_pair(x)
        res, lin = self.res, self.lin
        residual = res(x_dst) if res is not None and x_dst is not None else None
        att_src, att_dst = registered_parameters(self, "att_src", "att_dst")
        # one x projected to h and both score terms: their gradients can come back packed (gat_attention).
        # The projection comes first: until its launch the GPU waits for the host.
        shared = isinstance(x, Tensor) and lin is not None
        if shared:
            h_src, alpha_src, alpha_dst = project_with_scores(x_src, lin, heads, att_src, att_dst)
        adjacency = self.adjacency(edge_index, x_src.shape[0], None if x_dst is None else x_dst.shape[0],
                                   x_src.device, size)
        graph = adjacency.graph
        if not shared:
            h_src, alpha_src = project_with_scores(x_src, lin if lin is not None else self.lin_src, heads, att_src)
            if x_dst is not None:  # the targets' projection serves only their score term
                alpha_dst = score_terms(x_dst, lin if lin is not None else self.lin_dst, heads, att_dst)
            else:
                alpha_dst = alpha_src.new_zeros(graph.num_dst_nodes, heads)
        # PyG's loop count: min(size) if given, else the smaller side; never beyond the graph's sides.
        given_size = [side for side in (size or ()) if side is not None]
        if given_size:
            num_loops = min(given_size)
        else:
            num_loops = x_src.shape[0] if x_dst is None else min(x_src.shape[0], x_dst.shape[0])
        num_loops = min(num_loops, graph.num_src_nodes, graph.num_dst_nodes)
        adjacency, edge_attr = self._edges_with_loops(adjacency, num_loops, edge_attr)
        edge_features = self._projected_edges(edge_attr)
        edge_alpha = None if edge_features is None else (edge_features * self.att_edge).sum(dim=-1)
        # PyG's score terms (h * att).sum(-1) take the wider of h's and att's dtypes (fp32 under autocast, where h
        # is 16-bit and att fp32), and with them its messages and output
        out_dtype = torch.promote_types(h_src.dtype, att_src.dtype)
        out_dtype = None if out_dtype == h_src.dtype else out_dtype
        bias = self._attention_bias(h_src, residual, out_dtype)
        result = graph_ops.gat_attention(
            adjacency.graph,
            h_src,
            alpha_src,
            alpha_dst,
            edge_alpha,
            negative_slope=self.negative_slope,
            dropout=self.dropout,
            training=self.training,
            return_attention=bool(return_attention_weights),
            bias=bias,
            pack_gradients=shared,
            out_dtype=out_dtype,
        )
        out, alpha = result if return_attention_weights else (result, None)
        return self._finish(out, residual, alpha, edge_index, adjacency, return_attention_weights, bias is not None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


class GATv2Conv(EdgeFeaturesForward, _AttentionConv, pyg_name="GATv2Conv"):
    """GATv2 (Brody et al.: LeakyReLU inside the score), as PyG 2.8's GATv2Conv.

    Options as GATConv, plus:
    share_weights: one projection for sources and targets (lin_r is lin_l).
    The projections lin_l (sources) and lin_r (targets) carry a bias when `bias`.

    forward(x or (x_src, x_dst), edge_index, edge_attr=None, return_attention_weights=None),
    returning as GATConv. Runs PyG's code for what PyG asserts against (x_dst None, features not
    [N, F], edge_attr without edge_dim) and for flow="target_to_source" with a pair of features.
    """

    def __init__(
        self,
        in_channels: Union[int, tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: FillValue = "mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        **kwargs,
    ):
        super().__init__(node_dim=0, **kwargs)
        self._store_options(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops,
                            edge_dim, fill_value, residual)
        self.share_weights = share_weights
        width = heads * out_channels
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        self.lin_l = Linear(widths[0], width, bias=bias, weight_initializer="glorot")
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = Linear(widths[1], width, bias=bias, weight_initializer="glorot")
        self.att = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, width, bias=False, weight_initializer="glorot")
        else:
            self.lin_edge = None
        self._add_residual_and_bias(widths[1], bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()
        if self.lin_edge is not None:
            self.lin_edge.reset_parameters()
        if self.res is not None:
            self.res.reset_parameters()
        glorot_(self.att)
        zeros_(self.bias)

    def _forward(self, x, edge_index, edge_attr, return_attention_weights) -> AttentionOutput:
        reason = self._reason(x, edge_index)
        if reason is None:
            if not isinstance(x, Tensor) and x[1] is None:
                reason = "target features None"
            elif edge_attr is not None and self.lin_edge is None:
                reason = "edge_attr without edge_dim"
            else:
                reason = self._traced_reason(edge_attr, return_attention_weights)
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, edge_attr, return_attention_weights)
        self._ran("gnnio")
        heads, channels = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        res = self.res
        residual = res(x_dst) if res is not None else None
        lin_l, lin_r = registered_children(self, "lin_l", "lin_r")
        if isinstance(x, Tensor) and self.share_weights:
            h_src = h_dst = lin_l(x_src).view(-1, heads, channels)
        elif x_src is x_dst:
            h_src, h_dst = (h.view(-1, heads, channels) for h in project_shared(x_src, lin_l, lin_r))
        else:
            h_src = lin_l(x_src).view(-1, heads, channels)
            h_dst = lin_r(x_dst).view(-1, heads, channels)
        adjacency = self.adjacency(edge_index, x_src.shape[0], x_dst.shape[0], x_src.device)
        num_loops = min(x_src.shape[0], x_dst.shape[0])
        adjacency, edge_attr = self._edges_with_loops(adjacency, num_loops, edge_attr)
        bias = self._attention_bias(h_src, residual)
        att = self.att.view(heads, channels)
        result = graph_ops.gatv2_attention(
            adjacency.graph,
            h_src,
            h_dst,
            att.to(h_src.dtype),
            self._projected_edges(edge_attr),
            negative_slope=self.negative_slope,
            dropout=self.dropout,
            training=self.training,
            return_attention=bool(return_attention_weights),
            bias=bias,
        )
        out, alpha = result if return_attention_weights else (result, None)
        if out.dtype != att.dtype:
            # Under autocast the projections are 16-bit and att fp32: PyG's scores (x * att).sum(-1), and with
            # them the weighted messages, come out in fp32. The op takes one dtype (it accumulates in fp32).
            out = out.to(torch.promote_types(out.dtype, att.dtype))
            alpha = None if alpha is None else alpha.to(out.dtype)
        return self._finish(out, residual, alpha, edge_index, adjacency, return_attention_weights, bias is not None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
