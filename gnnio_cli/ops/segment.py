"""Helpers shared by the reference ops: input checks, CSR slot views, segment reductions.

The reference ops work in **CSR slot order**: slot ``k`` of row ``t`` is the
edge ``graph.csr_eid[k]`` from source ``graph.csr_indices[k]`` to target ``t``.
Per-edge inputs arrive in the graph's original edge order (eid order) and are
moved into slot order with :func:`eid_to_slot`; per-edge outputs go back with
:func:`slot_to_eid`.

Everything here is plain PyTorch on any device, differentiable where the values
are (index tensors never carry gradients).
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Optional, Sequence

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ checks
def check_tensor(
    op: str,
    name: str,
    tensor,
    graph: Graph,
    dims: str,
    sizes: Sequence[Optional[int]],
    *,
    floating: bool = True,
) -> torch.Tensor:
    """Check `tensor` has len(sizes) dims, matching every size that is not None.

    `dims` names the dimensions for the message, e.g. ``"[N, H, C]"``. Errors are
    one line: ``gatv2_attention: x_src has 3 dims [N, H, C], got shape (1000, 128)``.
    """
    if not isinstance(tensor, torch.Tensor):
        raise GnnioError(f"{op}: {name} must be a tensor {dims}, got {type(tensor).__name__}")
    shape = tensor.shape
    if len(shape) != len(sizes):
        raise GnnioError(f"{op}: {name} has {len(sizes)} dims {dims}, got shape {tuple(shape)}")
    # a plain loop: every op checks its inputs on every call, before its first launch
    for wanted, actual in zip(sizes, shape):
        if wanted is not None and wanted != actual:
            expected = tuple(actual if wanted is None else wanted for wanted, actual in zip(sizes, shape))
            raise GnnioError(f"{op}: {name} must have shape {dims} = {expected}, got shape {tuple(shape)}")
    if floating and tensor.dtype not in FLOAT_DTYPES:
        raise GnnioError(f"{op}: {name} must be float32, float64, float16 or bfloat16, got {tensor.dtype}")
    if tensor.device != graph.device:
        raise GnnioError(
            f"{op}: {name} is on {tensor.device} but the graph is on {graph.device}; move one with .to(device)"
        )
    return tensor


def check_node_features(op: str, name: str, tensor, graph: Graph, num_nodes: int) -> torch.Tensor:
    """Check a [num_nodes, *] feature tensor of at least 2 dims (trailing dims free)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise GnnioError(f"{op}: {name} must have at least 2 dims [N, F], got shape {shape}")
    return check_tensor(op, name, tensor, graph, "[N, *]", (num_nodes, *tensor.shape[1:]))


def check_same_dtype(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """All given (non-None) tensors share one dtype."""
    dtypes = {t.dtype for t in tensors.values() if t is not None}
    if len(dtypes) > 1:
        listed = ", ".join(f"{name} {t.dtype}" for name, t in tensors.items() if t is not None)
        raise GnnioError(f"{op}: inputs must share one dtype, got {listed}")


# ------------------------------------------------------------------ dtypes
def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit inputs (accumulation is never done in 16 bits), else the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --------------------------------------------------------------- slot views
def slot_sources(graph: Graph) -> torch.Tensor:
    """int64 [E]: the source of each CSR slot (csr_indices widened for indexing)."""
    return graph.cached("csr_indices_int64", lambda: graph.csr_indices.long())


def slot_targets(graph: Graph) -> torch.Tensor:
    """int64 [E]: the target of each CSR slot."""
    return graph.csr_rows


def slot_of_eid(graph: Graph) -> torch.Tensor:
    """int64 [E]: the CSR slot holding each original edge id (inverse of csr_eid)."""

    def build():
        inverse = torch.empty_like(graph.csr_eid)
        inverse[graph.csr_eid] = torch.arange(graph.num_edges, device=graph.device)
        return inverse

    return graph.cached("csr_slot_of_eid", build)


def eid_to_slot(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    """Per-edge values [E, ...] in eid order -> CSR slot order."""
    return values.index_select(0, graph.csr_eid)


def slot_to_eid(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    """Per-edge values [E, ...] in CSR slot order -> eid order."""
    return values.index_select(0, slot_of_eid(graph))


# ------------------------------------------------------- segment reductions
def segment_sum(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    """[E, ...] in slot order -> [num_dst, ...]: sum over each target's slots (empty rows 0)."""
    out = values.new_zeros((graph.num_dst_nodes, *values.shape[1:]))
    return out.index_add(0, slot_targets(graph), values)


def segment_extremum(graph: Graph, values: torch.Tensor, reduce: str) -> torch.Tensor:
    """[E, ...] in slot order -> [num_dst, ...]: 'amax' or 'amin' per row, empty rows 0.

    Differentiable by torch's rule (ties share the gradient); callers that need
    a tie rule use it on detached values only.
    """
    extremum = torch.segment_reduce(values, "max" if reduce == "amax" else "min", offsets=graph.csr_indptr,
                                    axis=0, unsafe=True)
    empty = (graph.in_degree == 0).view(-1, *([1] * (values.dim() - 1)))
    return extremum.masked_fill(empty, 0)


def segment_exp(graph: Graph, scores: torch.Tensor) -> torch.Tensor:
    """exp(scores - the maximum of their row): [E, H] in slot order, each row's largest entry 1.

    A softmax's numerators: any shift of a row cancels in the softmax, this one keeps
    every exponent <= 0 (no overflow) and every row's sum >= 1. The maximum is
    taken from detached scores (it cancels mathematically).
    """
    if graph.num_edges == 0:
        return scores.exp()
    row_max = torch.segment_reduce(scores.detach(), "max", offsets=graph.csr_indptr, axis=0, unsafe=True)
    return (scores - row_max.index_select(0, slot_targets(graph))).exp()


def segment_softmax(graph: Graph, scores: torch.Tensor) -> torch.Tensor:
    """[E, H] scores in slot order -> softmax over each target's slots, per head (stable: see segment_exp)."""
    exps = segment_exp(graph, scores)
    return exps / segment_sum(graph, exps).index_select(0, slot_targets(graph))


# ---------------------------------------------------------- sparse products
# The reference ops aggregate with torch's sparse CSR products (MKL on the CPU, cuSPARSE on a GPU): a row of
# the output reads its slots' source rows once, where a gather-then-scatter writes and reads back one feature
# row per edge (on a 2M-edge graph with 64 features, 46 ms against 500 ms on two CPU cores).
_csr_constructed = False


def _sparse_csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    global _csr_constructed
    if _csr_constructed:
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)
    with warnings.catch_warnings():  # torch warns once per process that sparse CSR is in beta
        warnings.simplefilter("ignore", UserWarning)
        _csr_constructed = True
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def _pattern(graph: Graph, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(row pointers, column indices) of the CSR (one row per target) or, transposed, of the CSC, in the
    index type torch's sparse products take without a conversion per call (int32 where every offset fits)."""

    def build():
        crow, col = (graph.csc_indptr, graph.csc_indices) if transpose else (graph.csr_indptr, graph.csr_indices)
        dtype = _index_dtype(graph.num_edges, graph.num_nodes)
        return crow.to(dtype), col.to(dtype)

    return graph.cached(("sparse_pattern", transpose), build)


def _index_dtype(entries: int, columns: int) -> torch.dtype:
    return torch.int32 if max(entries, columns) < 2**31 else torch.int64


def csc_slots(graph: Graph) -> torch.Tensor:
    """int64 [E]: the CSR slot of each CSC slot (slot-ordered values [E, ...] -> CSC order)."""
    return graph.cached("csc_to_csr_slot", lambda: slot_of_eid(graph).index_select(0, graph.csc_eid))


def _ones(graph: Graph, dtype: torch.dtype, heads: int = 1) -> torch.Tensor:
    return graph.cached(("ones", dtype, heads, str(graph.device)),
                        lambda: torch.ones(heads * graph.num_edges, dtype=dtype, device=graph.device))


def sum_by_target(graph: Graph, block: slice, values: torch.Tensor, out: torch.Tensor) -> None:
    """out[t] += the sum of values over t's slots in `block` (values [n, ...]: those slots' rows, in order),
    as a sparse product over the rows the block touches (no atomics, unlike index_add)."""
    count = block.stop - block.start
    if count <= 0:
        return
    rows = slot_targets(graph)
    first, last = int(rows[block.start]), int(rows[block.stop - 1])
    _, col = _pattern(graph, False)
    crow = (graph.csr_indptr[first:last + 2].clamp(block.start, block.stop) - block.start).to(col.dtype)
    columns = _slot_columns(graph, col.dtype)[:count]
    matrix = _sparse_csr(crow, columns, _ones(graph, values.dtype)[:count], (last - first + 1, count))
    out[first:last + 1] += (matrix @ values.reshape(count, -1)).view(-1, *values.shape[1:])


def sum_by_source(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    """[E, ...] in slot order -> [num_src, ...]: the sum over each source's slots (a sparse product over the CSC)."""
    if graph.num_edges == 0:
        return values.new_zeros((graph.num_src_nodes, *values.shape[1:]))
    crow, col = _pattern(graph, True)
    columns = graph.cached(("csc_slot_columns", col.dtype), lambda: csc_slots(graph).to(col.dtype))
    matrix = _sparse_csr(crow, columns, _ones(graph, values.dtype), (graph.num_src_nodes, graph.num_edges))
    return (matrix @ values.reshape(graph.num_edges, -1)).view(-1, *values.shape[1:])


def _slot_columns(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    return graph.cached(("slot_columns", dtype), lambda: torch.arange(graph.num_edges, dtype=dtype, device=graph.device))


def mean_weights(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """[E] in slot order: 1 / in-degree of each slot's target, so that a sparse product with these weights is
    the mean over each row (cached per dtype)."""

    def build():
        inverse_degree = 1.0 / graph.in_degree.clamp(min=1).to(dtype)
        return inverse_degree.index_select(0, slot_targets(graph))

    return graph.cached(("mean_weights", dtype, str(graph.device)), build)


def _head_pattern(graph: Graph, heads: int, transpose: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pattern for every head: row r * heads + h holds row r's slots of the CSR (or CSC), with column
    c * heads + h, so a product reads x [N, H, C] as the matrix [N * H, C] it already is.

    Returns (row pointers, columns, order): entry i of the pattern holds the value
    values.reshape(-1)[order[i]] of slot-ordered values [E, H] (CSR slot order also for the CSC).
    """

    def build():
        crow, col = (pattern.long() for pattern in _pattern(graph, transpose))
        degree = crow.diff()
        rows = torch.repeat_interleave(torch.arange(degree.shape[0], device=crow.device), degree)
        offset = torch.arange(graph.num_edges, device=crow.device) - crow[:-1].index_select(0, rows)
        head = torch.arange(heads, device=crow.device)
        # position of (slot e, head h) in the pattern: heads * crow[row] + h * degree[row] + offset
        start = heads * crow[:-1].index_select(0, rows) + offset
        position = (start.unsqueeze(1) + head * degree.index_select(0, rows).unsqueeze(1)).reshape(-1)
        slot = csc_slots(graph) if transpose else torch.arange(graph.num_edges, device=crow.device)
        order = torch.empty_like(position)
        order[position] = (slot.unsqueeze(1) * heads + head).reshape(-1)
        head_col = torch.empty_like(position)
        head_col[position] = (col.unsqueeze(1) * heads + head).reshape(-1)
        head_crow = torch.cat([
            (heads * crow[:-1].unsqueeze(1) + head * degree.unsqueeze(1)).reshape(-1),
            crow.new_full((1,), heads * graph.num_edges),
        ])
        dtype = _index_dtype(heads * graph.num_edges, heads * graph.num_nodes)
        return head_crow.to(dtype), head_col.to(dtype), order

    return graph.cached(("head_pattern", heads, transpose), build)


def _slot_order(graph: Graph, heads: int) -> torch.Tensor:
    """The inverse of the CSR head pattern's order: pattern entries -> [E, H] slot order."""

    def build():
        order = _head_pattern(graph, heads, False)[2]
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0], device=order.device)
        return inverse

    return graph.cached(("head_pattern_inverse", heads), build)


def autocast_off(device_type: str):
    """A context without autocast where autocast is on: the reference's products run in the dtypes the ops
    chose (fp32 for 16-bit features, accumulating in fp32), which autocast would lower to 16 bits (and
    the CPU's sparse products do not take bf16)."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) else nullcontext()


def _matmul(graph: Graph, values: Optional[torch.Tensor], x: torch.Tensor, transpose: bool) -> torch.Tensor:
    with autocast_off(x.device.type):
        return _matmul_in_dtype(graph, values, x, transpose)


def _matmul_in_dtype(graph: Graph, values: Optional[torch.Tensor], x: torch.Tensor, transpose: bool) -> torch.Tensor:
    num_rows = graph.num_src_nodes if transpose else graph.num_dst_nodes
    if graph.num_edges == 0 or x.numel() == 0:
        return x.new_zeros((num_rows, *x.shape[1:]))
    if values is None or values.dim() == 1:
        if values is None:
            values = _ones(graph, x.dtype)
        elif transpose:
            values = values.index_select(0, csc_slots(graph))
        crow, col = _pattern(graph, transpose)
        flat = x.reshape(x.shape[0], -1)
        return (_sparse_csr(crow, col, values, (num_rows, x.shape[0])) @ flat).view(num_rows, *x.shape[1:])
    heads = values.shape[1]
    crow, col, order = _head_pattern(graph, heads, transpose)
    matrix = _sparse_csr(crow, col, values.reshape(-1).index_select(0, order), (num_rows * heads, x.shape[0] * heads))
    return (matrix @ x.reshape(-1, x.shape[2])).view(num_rows, heads, -1)


def _sddmm(graph: Graph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with autocast_off(a.device.type):
        return _sddmm_in_dtype(graph, a, b)


def _sddmm_in_dtype(graph: Graph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if graph.num_edges == 0:
        return a.new_zeros((0, *a.shape[1:-1]))
    if a.dim() == 2:
        crow, col = _pattern(graph, False)
        pattern = _sparse_csr(crow, col, _ones(graph, a.dtype), (graph.num_dst_nodes, graph.num_src_nodes))
        return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0).values()
    heads = a.shape[1]
    crow, col, _ = _head_pattern(graph, heads, False)
    size = (heads * graph.num_dst_nodes, heads * graph.num_src_nodes)
    pattern = _sparse_csr(crow, col, _ones(graph, a.dtype, heads), size)
    values = torch.sparse.sampled_addmm(pattern, a.reshape(-1, a.shape[2]), b.reshape(-1, b.shape[2]).t(), beta=0.0)
    return values.values().index_select(0, _slot_order(graph, heads)).view(-1, heads)


class _SparseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Optional[torch.Tensor], x: torch.Tensor, graph: Graph, transpose: bool) -> torch.Tensor:
        ctx.save_for_backward(values, x)
        ctx.graph, ctx.transpose = graph, transpose
        return _matmul(graph, values, x, transpose)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        values, x = ctx.saved_tensors
        graph, transpose = ctx.graph, ctx.transpose
        grad_values = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_x = sparse_matmul(graph, values, grad, transpose=not transpose)
        if ctx.needs_input_grad[0]:
            if values.dim() == 1:  # one weight per edge scales every feature of its message
                grad, x = grad.flatten(1), x.flatten(1)  # (reshape(N, -1) cannot size 0 rows)
            grad_values = sddmm(graph, x, grad) if transpose else sddmm(graph, grad, x)
        return grad_values, grad_x, None, None


class _Sddmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, graph: Graph) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.graph = graph
        return _sddmm(graph, a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        grad_a = sparse_matmul(ctx.graph, grad, b) if ctx.needs_input_grad[0] else None
        grad_b = sparse_matmul(ctx.graph, grad, a, transpose=True) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


def sparse_matmul(
    graph: Graph, values: Optional[torch.Tensor], x: torch.Tensor, *, transpose: bool = False
) -> torch.Tensor:
    """out[t] = sum over t's CSR slots e of values[e] * x[source(e)]: [num_src, *] -> [num_dst, *].

    values:    slot order; None (every weight 1), [E] (one weight per edge, scaling x's
               trailing dims), or [E, H] (one weight per edge and head, for x [N, H, C]).
    transpose: the transposed product over the CSC: out[s] = sum over s's out-edges e of
               values[e] * x[target(e)], [num_dst, *] -> [num_src, *].
    Empty rows give 0. Differentiable in values and x (twice: the backward is built from these products);
    no tensor per edge and feature is made in either direction.
    """
    if _differentiable(values, x):
        return _SparseMatmul.apply(values, x, graph, transpose)
    return _matmul(graph, values, x, transpose)


def sddmm(graph: Graph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """values[e] = <a[target(e)], b[source(e)]> for every CSR slot e, per head.

    a: [num_dst, F] or [num_dst, H, C]; b: [num_src, F] or [num_src, H, C].
    Returns [E] or [E, H] in slot order. Differentiable in a and b, without a tensor per edge and feature.
    """
    if _differentiable(a, b):
        return _Sddmm.apply(a, b, graph)
    return _sddmm(graph, a, b)


def _differentiable(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd must see the product (an autograd.Function's apply costs the host ~15 us)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
