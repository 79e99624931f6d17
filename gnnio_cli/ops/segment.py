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
def _expand_rows(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    rows = slot_targets(graph)
    return rows.view(-1, *([1] * (values.dim() - 1))).expand_as(values)


def segment_sum(graph: Graph, values: torch.Tensor) -> torch.Tensor:
    """[E, ...] in slot order -> [num_dst, ...]: sum over each target's slots (empty rows 0)."""
    out = values.new_zeros((graph.num_dst_nodes, *values.shape[1:]))
    return out.index_add(0, slot_targets(graph), values)


def segment_extremum(graph: Graph, values: torch.Tensor, reduce: str) -> torch.Tensor:
    """[E, ...] in slot order -> [num_dst, ...]: 'amax' or 'amin' per row, empty rows 0.

    Differentiable by torch's rule (ties share the gradient); callers that need
    a tie rule use it on detached values only.
    """
    out = values.new_zeros((graph.num_dst_nodes, *values.shape[1:]))
    return out.scatter_reduce(0, _expand_rows(graph, values), values, reduce, include_self=False)


def segment_softmax(graph: Graph, scores: torch.Tensor) -> torch.Tensor:
    """[E, H] scores in slot order -> softmax over each target's slots, per head.

    Stable: the row maximum (detached; it cancels mathematically) is subtracted
    before exponentiating, so large scores do not overflow.
    """
    rows = slot_targets(graph)
    row_max = segment_extremum(graph, scores.detach(), "amax")
    exps = (scores - row_max.index_select(0, rows)).exp()
    return exps / segment_sum(graph, exps).index_select(0, rows)
