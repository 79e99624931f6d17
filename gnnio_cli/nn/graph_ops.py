"""Graph-level custom ops: what the layers run inside ``torch.compile`` and ``torch.jit.trace``.

Eager calls build (or find in the structure cache) a :class:`Graph` for their
edge_index and hand it to :mod:`gnnio_cli.ops`. Neither a Python object nor
the host work of building one can live in a compiled graph, so while tracing
(:func:`tracing`) the layers hold an :class:`EdgeRef` instead: the edge_index
tensor itself and the node counts (ints, symbolic under ``dynamic=True``). The
ops below take exactly that, plus the features, and do everything host-side
(cache lookup or build, self-loops, kernel and schedule choice) in their
implementation, where the tracer does not look. Their fake kernels state
output shapes only, which follow from the features and the node counts, so a
new graph size never makes a data-dependent shape.

The implementations are the eager ones: the native kernels on CUDA, the
reference on the CPU (or wherever the native kernels do not take the inputs).
Backward ops take what the forward saved (the max/min masks, the attention's
per-(target, head) log-sum-exp) and run the native backward kernels; the
reference path's backward (the CPU's) differentiates the reference forward
again, and so does any call whose edge weights want a gradient.

Attention dropout under tracing draws one seed per call in the traced code; the
forward and the backward seed the generator with it, so they drop the same
edges. A call that returns attention weights with self-loops added, or that
carries edge features through added self-loops, has outputs whose size
depends on the edges: such calls run PyG's code (see the layers).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Optional

import torch
from torch import Tensor

from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import replaced_self_loops
from gnnio_cli.nn.adjacency import NO_LOOPS, EdgeRef, as_adjacency
from gnnio_cli.ops import attention, attention_native, dispatch, reduce_native, spmm_native
from gnnio_cli.ops.reduce import extremum_winners
from gnnio_cli.ops.spmm import gcn_norm, gcn_propagate, spmm
from gnnio_cli.ops.segment import accumulation_dtype, eid_to_slot, mean_weights, sparse_matmul

GAT, GATV2, DOT, COSINE = attention_native.GAT, attention_native.GATV2, attention_native.DOT, attention_native.COSINE


def tracing() -> bool:
    """Whether the call is being traced by torch.compile (dynamo) or torch.jit.trace."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _graph(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int, device) -> Graph:
    """The cached Graph of these edges on `device` (see gnnio_cli.nn.adjacency), with PyG's loops if asked."""
    graph = as_adjacency(edge_index, num_src, num_dst, device, reverse=reverse).graph
    return graph if loops == NO_LOOPS else replaced_self_loops(graph, loops).graph


@contextmanager
def _seeded(seed: Optional[Tensor], device: torch.device):
    """The enclosed random draws made from a generator seeded with `seed` (None: untouched); the state of the
    CPU's and the device's generators is restored afterwards, so forward and backward draw alike."""
    if seed is None:
        yield
        return
    value = int(seed)
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        torch.random.default_generator.manual_seed(value)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(value)
        yield


def _empty(like: Tensor) -> Tensor:
    """A zero-element stand-in for an output the call does not have (custom ops return tensors only)."""
    return like.new_empty(0)


@contextmanager
def _autograd_inside_op():
    """Autograd recording inside a custom op's implementation, which the dispatcher runs with the autograd
    keys excluded (the op's own autograd kernel sits above it)."""
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradCPU)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _reference_grads(forward, inputs: list, needs: list, grads: list) -> list:
    """Gradients of forward(*inputs) (a tensor or a tuple) for the inputs in `needs`, given output grads
    (None entries skipped): the reference's own autograd over a second forward."""
    with _autograd_inside_op():
        leaves = [None if t is None else t.detach().requires_grad_(need) for t, need in zip(inputs, needs)]
        outputs = forward(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        wanted = [leaf for leaf, need in zip(leaves, needs) if leaf is not None and need]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                     if pairs and wanted else [None] * len(wanted))
    result = []
    for leaf, need in zip(leaves, needs):
        grad = next(found) if leaf is not None and need else None
        result.append(torch.zeros_like(leaf) if grad is None and leaf is not None and need else grad)
    return result


# ================================================================ propagate: spmm, mean, GCN
def _propagate_eager(graph: Graph, x: Tensor, edge_weight: Optional[Tensor], reduction: str, normalize: bool,
                     add_self_loops: bool, improved: bool) -> Tensor:
    """GCNConv's propagation (normalize) or a plain weighted sum/mean, by the eager ops."""
    if normalize and reduction == "sum":
        return gcn_propagate(graph, x, edge_weight, improved=improved, add_self_loops=add_self_loops)
    if normalize:
        graph, edge_weight = gcn_norm(graph, edge_weight, improved=improved, add_self_loops=add_self_loops,
                                           dtype=_norm_dtype(x.dtype, edge_weight, reduction))
    return spmm(graph, x, edge_weight, reduce=reduction)


def _norm_dtype(x_dtype: torch.dtype, edge_weight: Optional[Tensor], reduction: str) -> torch.dtype:
    """The dtype _propagate_eager's normalisation takes: the weights', else the accumulation dtype for GCN's
    own propagation (gcn_propagate) and the features' for a normalised mean (as GCNConv's _normalized)."""
    if edge_weight is not None:
        return edge_weight.dtype
    return accumulation_dtype(x_dtype) if reduction == "sum" else x_dtype


def _reference_transpose(graph: Graph, grad_rows: Tensor, edge_weight: Optional[Tensor], reduction: str,
                         normalize: bool, add_self_loops: bool, improved: bool) -> Tensor:
    """A^T @ grad_rows [num_dst, F] for the reference product A that _propagate_eager computed (ops.spmm's
    spmm_reference over gcn_norm's graph and values where normalised), in the accumulation dtype."""
    compute = accumulation_dtype(grad_rows.dtype)
    if normalize:
        graph, edge_weight = gcn_norm(graph, edge_weight, improved=improved, add_self_loops=add_self_loops,
                                           dtype=_norm_dtype(grad_rows.dtype, edge_weight, reduction))
    weights = None if edge_weight is None else eid_to_slot(graph, edge_weight).to(compute)
    if reduction == "mean":
        weights = mean_weights(graph, compute) if weights is None else weights * mean_weights(graph, compute)
    return sparse_matmul(graph, weights, grad_rows.to(compute), transpose=True)


@torch.library.custom_op("gnnio::graph_propagate", mutates_args=())
def graph_propagate(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int, x: Tensor,
                    edge_weight: Optional[Tensor], reduction: str, normalize: bool, add_self_loops: bool,
                    improved: bool) -> Tensor:
    """x [num_src, *] -> [num_dst, *]: sum or mean over in-edges (weighted by edge_weight [E]), or GCN's
    normalised propagation with normalize (see gnnio_cli.ops.spmm)."""
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, x.device)
    return _propagate_eager(graph, x, edge_weight, reduction, normalize, add_self_loops, improved).contiguous()


@graph_propagate.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, x, edge_weight, reduction, normalize, add_self_loops, improved):
    return x.new_empty((num_dst, *x.shape[1:]))


@torch.library.custom_op("gnnio::graph_propagate_backward", mutates_args=())
def graph_propagate_backward(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int,
                             grad_out: Tensor, x: Optional[Tensor], edge_weight: Optional[Tensor], reduction: str,
                             normalize: bool, add_self_loops: bool, improved: bool) -> tuple[Tensor, Tensor]:
    """(grad_x [num_src, *] in grad_out's dtype, grad_edge_weight [E]) of graph_propagate. x is given only when
    edge_weight wants a gradient (grad_edge_weight is [0] otherwise)."""
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, grad_out.device)
    options = (reduction, normalize, add_self_loops, improved)
    if x is not None:
        grad_x, grad_weight = _reference_grads(
            lambda xs, ws: _propagate_eager(graph, xs, ws, *options), [x, edge_weight], [True, True], [grad_out])
        return grad_x.contiguous(), grad_weight.contiguous()
    rows = grad_out.flatten(1).contiguous()
    if dispatch.pick("graph_propagate", rows, edge_weight) == "native" and spmm_native.supports(rows, edge_weight):
        operator = spmm_native.operator_of(graph, edge_weight, *options, dtype=rows.dtype)
        grad_x = operator.backward.apply(rows, "graph_propagate.backward")
    else:
        grad_x = _reference_transpose(graph, rows, edge_weight, *options)
    return grad_x.to(grad_out.dtype).reshape(num_src, *grad_out.shape[1:]), _empty(grad_out)


@graph_propagate_backward.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, grad_out, x, edge_weight, reduction, normalize, add_self_loops,
      improved):
    grad_x = grad_out.new_empty((num_src, *grad_out.shape[1:]))
    return grad_x, grad_out.new_empty(0) if x is None else edge_weight.new_empty(edge_weight.shape)


def _propagate_setup(ctx, inputs, output):
    ctx.graph_args = inputs[:5]
    ctx.options = inputs[7:]
    x, edge_weight = inputs[5], inputs[6]
    ctx.weight_grad = edge_weight is not None and edge_weight.requires_grad
    # the features only where the weights' gradient needs them: A^T @ grad_out does not
    ctx.save_for_backward(x if ctx.weight_grad else None, edge_weight)


def _propagate_backward(ctx, grad_out):
    x, edge_weight = ctx.saved_tensors
    grad_x, grad_weight = graph_propagate_backward(*ctx.graph_args, grad_out, x, edge_weight, *ctx.options)
    return (None,) * 5 + (grad_x, grad_weight if ctx.weight_grad else None) + (None,) * 4


graph_propagate.register_autograd(_propagate_backward, setup_context=_propagate_setup)


def propagate(edges: EdgeRef, x: Tensor, edge_weight: Optional[Tensor], reduction: str, *, normalize: bool = False,
              add_self_loops: bool = False, improved: bool = False) -> Tensor:
    """graph_propagate over `edges` (see :func:`gnnio_cli.ops.spmm.spmm` and ``gcn_propagate``)."""
    return graph_propagate(*edges.args(), x, edge_weight, reduction, normalize, add_self_loops, improved)


# ================================================================ extremum: max, min
def _extremum_native(x: Tensor) -> bool:
    """Whether the max/min of x runs the native kernels (forward and fake must agree on the state's form)."""
    return x.is_cuda and dispatch.pick("graph_extremum", x) == "native" and reduce_native.supports(x)


@torch.library.custom_op("gnnio::graph_extremum", mutates_args=())
def graph_extremum(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int, x: Tensor,
                   is_min: bool, with_state: bool) -> tuple[Tensor, Tensor]:
    """(per-feature max or min of x [num_src, *] over in-edges [num_dst, *], 0 in empty rows; the state its
    backward reads: the native kernels' winner masks int32 [E, ceil(F / 32)], the reference's winners int64
    [num_dst, F]; zero rows without with_state)."""
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, x.device)
    features = x.flatten(1).contiguous()
    if _extremum_native(x):
        kernel = reduce_native.extremum_kernel(graph, features, is_min)
        out, state = reduce_native.run_extremum(kernel, graph, features, is_min, with_state)
    else:
        out, state = extremum_winners(graph, features.to(accumulation_dtype(x.dtype)), "min" if is_min else "max")
        state = state if with_state else state[:0]
    return out.to(x.dtype).reshape(num_dst, *x.shape[1:]), state


@graph_extremum.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, x, is_min, with_state):
    width = x.shape[1:].numel()
    if _extremum_native(x):
        state = x.new_empty((edge_index.shape[1] if with_state else 0, (width + 31) // 32), dtype=torch.int32)
    else:
        state = x.new_empty((num_dst if with_state else 0, width), dtype=torch.int64)
    return x.new_empty((num_dst, *x.shape[1:])), state


@torch.library.custom_op("gnnio::graph_extremum_backward", mutates_args=())
def graph_extremum_backward(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int,
                            grad_out: Tensor, state: Tensor) -> Tensor:
    """grad_x [num_src, *] of graph_extremum: each (target, feature)'s gradient to its winning source."""
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, grad_out.device)
    rows = grad_out.flatten(1).contiguous()
    if state.dtype == torch.int32:  # the native kernels' masks
        grad = reduce_native.extremum_backward(graph, rows, state)
    else:
        grad = rows.new_zeros(num_src + 1, rows.shape[1]).scatter_add(0, state, rows)[:num_src]
    return grad.reshape(num_src, *grad_out.shape[1:])


@graph_extremum_backward.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, grad_out, state):
    return grad_out.new_empty((num_src, *grad_out.shape[1:]))


def _extremum_setup(ctx, inputs, output):
    ctx.graph_args = inputs[:5]
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _extremum_backward(ctx, grad_out, _grad_state):
    (state,) = ctx.saved_tensors
    return (None,) * 5 + (graph_extremum_backward(*ctx.graph_args, grad_out, state), None, None)


graph_extremum.register_autograd(_extremum_backward, setup_context=_extremum_setup)


def aggregate(edges: EdgeRef, x: Tensor, reduction: str) -> Tensor:
    """:func:`gnnio_cli.ops.reduce.aggregate` over `edges`."""
    if reduction in ("sum", "mean"):
        return propagate(edges, x, None, reduction)
    with_state = torch.is_grad_enabled() and x.requires_grad  # inference writes no winners
    return graph_extremum(*edges.args(), x, reduction == "min", with_state)[0]


# ================================================================ attention
# One op for the four kinds; the tensors a, b, c, d and `extra` by kind (see gnnio_cli.ops.attention):
#   GAT:    x_src, alpha_src, alpha_dst, edge_alpha (or None); extra: bias [H, C] (or None)
#   GATV2:  x_src, x_dst, att, edge_feat (or None);            extra: bias [H, C] (or None)
#   DOT:    query, key, value, edge_feat (or None);            extra: residual [Nd, H, C] (or None)
#   COSINE: x_src, x_dst (None: x_src), beta, None;            extra: None
_OP_NAMES = {GAT: "gat_attention", GATV2: "gatv2_attention", DOT: "transformer_attention", COSINE: "agnn_attention"}


def _attention_reference(kind: int, graph: Graph, a, b, c, d, extra, negative_slope: float, dropout: float,
                         training: bool, return_attention: bool):
    """The public op of `kind` on the reference backend: out, or (out, alpha)."""
    options = dict(dropout=dropout, training=training, return_attention=return_attention)
    with dispatch.use_backend("reference"):
        if kind == GAT:
            return attention.gat_attention(graph, a, b, c, d, negative_slope=negative_slope, bias=extra, **options)
        if kind == GATV2:
            return attention.gatv2_attention(graph, a, b, c, d, negative_slope=negative_slope, bias=extra, **options)
        if kind == DOT:
            return attention.transformer_attention(graph, a, b, c, d, residual=extra, **options)
        return attention.agnn_attention(graph, a, a if b is None else b, c, **options)


def _attention_native(kind: int, a, b, c, d, extra, return_attention: bool, needs_grad: bool) -> bool:
    """Whether the call runs the fused kernels: as eager decides, the weights of a differentiated call going to
    the reference (whose weights carry gradients)."""
    tensors = [t for t in (a, b, c, d, extra) if t is not None]
    if not a.is_cuda or (return_attention and needs_grad):
        return False
    return dispatch.pick(_OP_NAMES[kind], *tensors) == "native" and attention_native.supports(*tensors)


def _fused_tensors(kind: int, a, b, c, d) -> tuple:
    """The fused kernels' (msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge) for `kind`."""
    if kind == GAT:
        return a, None, None, b, c, None, d
    if kind == GATV2:
        return a, None, b, None, None, c, d
    return c, b, a, None, None, None, d


def _fused_call(kind: int, graph: Graph, messages: Tensor, negative_slope, dropout, training, return_attention):
    """attention_native's call (plan, dropout seed) for these options and messages [Ns, H, C] (AGNN: [Ns, C]),
    as its public ops make it."""
    dot = kind == DOT
    return attention_native._make_call(
        kind, graph, 1 if kind == COSINE else messages.shape[1], messages.device, negative_slope=negative_slope,
        scale=1.0 / math.sqrt(messages.shape[2]) if dot else 1.0, dropout=dropout, training=training,
        return_attention=return_attention, weights_after_dropout=kind in (GAT, GATV2),
        row_bytes=messages.shape[1] * messages.shape[2] * messages.element_size() if dot else 0,
    )  # fmt: skip


def _messages(kind: int, a: Tensor, c: Tensor) -> Tensor:
    """The tensor whose rows are the messages: the value for DOT, the source features otherwise."""
    return c if kind == DOT else a


class _Context:
    """What attention_native's autograd functions read from and write to their ctx, outside autograd."""

    def __init__(self, saved: tuple = (), needs_input_grad: tuple = ()):
        self.saved_tensors = saved
        self.needs_input_grad = needs_input_grad

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


@torch.library.custom_op("gnnio::graph_attention", mutates_args=())
def graph_attention(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int, kind: int, a: Tensor,
                    b: Optional[Tensor], c: Tensor, d: Optional[Tensor], extra: Optional[Tensor],
                    negative_slope: float, dropout: float, training: bool, return_attention: bool, needs_grad: bool,
                    seed: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(out, alpha [E, H] in eid order or [0], lse fp32 [Nd, H] for the fused kernels' backward or [0]) of the
    attention op of `kind` (tensors by kind above). needs_grad: whether autograd will ask for gradients."""
    device = a.device
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, device)
    with _seeded(seed, device):
        if not _attention_native(kind, a, b, c, d, extra, return_attention, needs_grad):
            result = _attention_reference(kind, graph, a, b, c, d, extra, negative_slope, dropout, training,
                                          return_attention)
            out, alpha = result if return_attention else (result, None)
            return out.contiguous(), _empty(out) if alpha is None else alpha.contiguous(), _empty(out).float()
        call = _fused_call(kind, graph, _messages(kind, a, c), negative_slope, dropout, training, return_attention)
        if kind == COSINE:
            x_dst = None if b is None else b.contiguous().unsqueeze(1)
            out, lse, scores = attention_native._CosineAttention.forward(
                _Context(), call, a.contiguous().unsqueeze(1), x_dst, c)
            out = out.squeeze(1)
        else:
            tensors = tuple(None if t is None else t.contiguous() for t in _fused_tensors(kind, a, b, c, d))
            bias, residual = (None, extra) if kind == DOT else (extra, None)
            out, lse, scores = attention_native._FusedAttention.forward(
                _Context(), call, *tensors, None if bias is None else bias.contiguous(),
                None if residual is None else residual.contiguous())
        alpha = _empty(out)
        if return_attention:
            dropped = call.dropout if call.plan.return_scores == 2 else 0.0
            alpha = attention_native._attention_weights(graph, scores, lse, dropped, out.dtype)
            alpha = alpha.squeeze(1) if kind == COSINE else alpha
        return out.contiguous(), alpha.contiguous(), lse


@graph_attention.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, kind, a, b, c, d, extra, negative_slope, dropout, training,
      return_attention, needs_grad, seed):
    heads = 1 if kind == COSINE else a.shape[1]
    out_shape = (num_dst, a.shape[1]) if kind == COSINE else (num_dst, *c.shape[1:]) if kind == DOT else \
        (num_dst, *a.shape[1:])
    out = a.new_empty(out_shape)
    if return_attention:
        edges = edge_index.shape[1]
        alpha = a.new_empty((edges,) if kind == COSINE else (edges, heads))
    else:
        alpha = a.new_empty(0)
    native = _attention_native(kind, a, b, c, d, extra, return_attention, needs_grad)
    lse = a.new_empty((num_dst, heads) if native else (0,), dtype=torch.float32)
    return out, alpha, lse


@torch.library.custom_op("gnnio::graph_attention_backward", mutates_args=())
def graph_attention_backward(edge_index: Tensor, num_src: int, num_dst: int, reverse: bool, loops: int, kind: int,
                             a: Tensor, b: Optional[Tensor], c: Tensor, d: Optional[Tensor], extra: Optional[Tensor],
                             out: Tensor, lse: Tensor, grad_out: Tensor, grad_alpha: Optional[Tensor],
                             negative_slope: float, dropout: float, training: bool, return_attention: bool,
                             needs: list[bool], seed: Optional[Tensor]) -> list[Tensor]:
    """Gradients of graph_attention's inputs a, b, c, d, extra (a [0] tensor for each not in `needs`). out: the
    forward's output where the fused backward reads it (GAT and DOT in fp32, see attention_native), else [0]."""
    device = a.device
    graph = _graph(edge_index, num_src, num_dst, reverse, loops, device)
    inputs = [a, b, c, d, extra]
    with _seeded(seed, device):
        if not _attention_native(kind, a, b, c, d, extra, return_attention, True):
            def forward(*tensors):
                return _attention_reference(kind, graph, *tensors, negative_slope, dropout, training, return_attention)

            grads = _reference_grads(forward, inputs, needs, [grad_out, grad_alpha])
        else:
            grads = _fused_backward(kind, graph, inputs, out, lse, grad_out, negative_slope, dropout, training,
                                    return_attention, needs)
    return [_empty(a) if g is None else g.contiguous() for g in grads]


def _fused_backward(kind, graph, inputs, out, lse, grad_out, negative_slope, dropout, training, return_attention,
                    needs) -> list:
    """attention_native's backward for the saved lse (and out), through its autograd functions' backward."""
    a, b, c, d, extra = inputs
    call = _fused_call(kind, graph, _messages(kind, a, c), negative_slope, dropout, training, return_attention)
    if kind == COSINE:
        x_src = a.contiguous().unsqueeze(1)
        x_dst = x_src if b is None else b.contiguous().unsqueeze(1)
        norm_src = torch.ops.gnnio.attention_row_norms(x_src)
        norm_dst = norm_src if b is None else torch.ops.gnnio.attention_row_norms(x_dst)
        ctx = _Context((x_src, norm_src, x_dst, norm_dst, c.detach().to(torch.float32).reshape(1), lse))
        ctx.call, ctx.shared, ctx.beta_shape, ctx.beta_dtype = call, b is None, c.shape, c.dtype
        _, grad_src, grad_dst, grad_beta = attention_native._CosineAttention.backward(
            ctx, grad_out.unsqueeze(1), None, None)
        return [grad_src.squeeze(1), None if grad_dst is None else grad_dst.squeeze(1), grad_beta, None, None]
    tensors = tuple(None if t is None else t.contiguous() for t in _fused_tensors(kind, a, b, c, d))
    bias, residual = (None, extra) if kind == DOT else (extra, None)
    source_first = attention_native._source_first(kind, tensors[0].dtype)
    kept = (out, bias, residual) if source_first else (None, None, None)
    ctx = _Context((*tensors, lse, *kept), (False,) * 8 + (bias is not None and needs[4], False))
    ctx.call = call
    _, msg, key, dst_vec, src_scalar, dst_scalar, att, edge, grad_bias, _ = attention_native._FusedAttention.backward(
        ctx, grad_out, None, None)
    if kind == GAT:
        grads = [msg, src_scalar, dst_scalar, edge, grad_bias]
    elif kind == GATV2:
        grads = [msg, dst_vec, att, edge, grad_bias]
    else:
        grads = [dst_vec, key, msg, edge, None]
    return [g if need else None for g, need in zip(grads, needs)]


@graph_attention_backward.register_fake
def _(edge_index, num_src, num_dst, reverse, loops, kind, a, b, c, d, extra, out, lse, grad_out, grad_alpha,
      negative_slope, dropout, training, return_attention, needs, seed):
    return [t.new_empty(t.shape) if t is not None and need else a.new_empty(0)
            for t, need in zip((a, b, c, d, extra), needs)]


def _attention_setup(ctx, inputs, output):
    ctx.graph_args = inputs[:6]
    ctx.options = inputs[11:15]
    ctx.seed = inputs[16]
    kind, (a, b, c, d, extra) = inputs[5], inputs[6:11]
    # the output only where the fused backward reads it (as attention_native keeps it); lse is [Nd, H] where the
    # fused kernels ran, [0] otherwise
    keeps_out = output[2].dim() == 2 and attention_native._source_first(kind, _messages(kind, a, c).dtype)
    ctx.save_for_backward(a, b, c, d, extra, output[0] if keeps_out else None, output[2])


def _attention_backward(ctx, grad_out, grad_alpha, _grad_lse):
    a, b, c, d, extra, out, lse = ctx.saved_tensors
    out = lse.new_empty(0) if out is None else out
    needs = [ctx.needs_input_grad[6 + i] and t is not None for i, t in enumerate((a, b, c, d, extra))]
    if extra is not None and ctx.graph_args[5] == DOT:
        needs[4] = False  # a residual's gradient is grad_out itself, taken below
    grads = graph_attention_backward(*ctx.graph_args, a, b, c, d, extra, out, lse, grad_out, grad_alpha,
                                     *ctx.options, needs, ctx.seed)
    grads = [g if need else None for g, need in zip(grads, needs)]
    if extra is not None and ctx.graph_args[5] == DOT and ctx.needs_input_grad[10]:
        grads[4] = grad_out
    return (None,) * 6 + tuple(grads) + (None,) * 6


graph_attention.register_autograd(_attention_backward, setup_context=_attention_setup)


def attend(kind: int, edges: EdgeRef, a: Tensor, b: Optional[Tensor], c: Tensor, d: Optional[Tensor],
           extra: Optional[Tensor], *, negative_slope: float = 0.0, dropout: float = 0.0, training: bool = False,
           return_attention: bool = False):
    """graph_attention over `edges`: out, or (out, alpha in eid order) with return_attention."""
    dropout = float(dropout) if training else 0.0
    seed = None
    if dropout > 0.0:  # drawn by the traced code, so each call drops its own edges (see _seeded)
        seed = torch.randint(0, 2**62, (), dtype=torch.int64)
    present = [t for t in (a, b, c, d, extra) if t is not None]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in present)
    out, alpha, _ = graph_attention(*edges.args(), kind, a, b, c, d, extra, float(negative_slope), dropout,
                                    training, return_attention, needs_grad, seed)
    return (out, alpha) if return_attention else out


def gat_attention(graph, x_src, alpha_src, alpha_dst, edge_alpha=None, *, negative_slope=0.2, dropout=0.0,
                  training=False, return_attention=False, bias=None, pack_gradients=False, out_dtype=None):
    """:func:`gnnio_cli.ops.attention.gat_attention`, through graph_attention for an EdgeRef."""
    if not isinstance(graph, EdgeRef):
        return attention.gat_attention(graph, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope=negative_slope,
                                       dropout=dropout, training=training, return_attention=return_attention,
                                       bias=bias, pack_gradients=pack_gradients, out_dtype=out_dtype)
    widened = _widened(x_src, out_dtype)
    result = attend(GAT, graph, x_src, alpha_src, alpha_dst, edge_alpha, None if widened else bias,
                    negative_slope=negative_slope, dropout=dropout, training=training,
                    return_attention=return_attention)
    return _widen(result, out_dtype, bias) if widened else result


def gatv2_attention(graph, x_src, x_dst, att, edge_feat=None, *, negative_slope=0.2, dropout=0.0, training=False,
                    return_attention=False, bias=None):
    """:func:`gnnio_cli.ops.attention.gatv2_attention`, through graph_attention for an EdgeRef."""
    if not isinstance(graph, EdgeRef):
        return attention.gatv2_attention(graph, x_src, x_dst, att, edge_feat, negative_slope=negative_slope,
                                         dropout=dropout, training=training, return_attention=return_attention,
                                         bias=bias)
    return attend(GATV2, graph, x_src, x_dst, att, edge_feat, bias, negative_slope=negative_slope, dropout=dropout,
                  training=training, return_attention=return_attention)


def transformer_attention(graph, query, key, value, edge_feat=None, *, dropout=0.0, training=False,
                          return_attention=False, residual=None, out_dtype=None):
    """:func:`gnnio_cli.ops.attention.transformer_attention`, through graph_attention for an EdgeRef."""
    if not isinstance(graph, EdgeRef):
        return attention.transformer_attention(graph, query, key, value, edge_feat, dropout=dropout,
                                               training=training, return_attention=return_attention,
                                               residual=residual, out_dtype=out_dtype)
    widened = _widened(query, out_dtype)
    result = attend(DOT, graph, query, key, value, edge_feat, None if widened else residual, dropout=dropout,
                    training=training, return_attention=return_attention)
    return _widen(result, out_dtype, residual) if widened else result


def _widened(rows: Tensor, out_dtype: Optional[torch.dtype]) -> bool:
    """Whether an EdgeRef call asks for an output wider than its rows: graph_attention returns the rows'
    dtype (its backward then takes the target pass first), widened afterwards by _widen."""
    return out_dtype is not None and out_dtype != rows.dtype


def _widen(result, out_dtype: torch.dtype, extra: Optional[Tensor]):
    """graph_attention's out (and alpha) in out_dtype, plus the bias or residual `extra` where given."""
    out, alpha = result if isinstance(result, tuple) else (result, None)
    out = out.to(out_dtype)
    if extra is not None:
        out = out + extra
    return out if alpha is None else (out, alpha.to(out_dtype))


def agnn_attention(graph, x_src, x_dst, beta, *, dropout=0.0, training=False, return_attention=False):
    """:func:`gnnio_cli.ops.attention.agnn_attention`, through graph_attention for an EdgeRef."""
    if not isinstance(graph, EdgeRef):
        return attention.agnn_attention(graph, x_src, x_dst, beta, dropout=dropout, training=training,
                                        return_attention=return_attention)
    return attend(COSINE, graph, x_src, None if x_dst is x_src else x_dst, beta, None, None, dropout=dropout,
                  training=training, return_attention=return_attention)

