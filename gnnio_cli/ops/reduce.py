"""Reduction family: sum, mean, max and min of source features at each target.

``aggregate(graph, x, reduce)`` is the neighbourhood aggregation of SAGEConv and
GINConv. Rows without in-edges give 0 for every reduction, as PyG.

max/min gradients go to the winning source only. Where several sources tie
(equal values in a feature column, duplicate edges included), the winner is
the **smallest source id**, and it receives the whole gradient once. (torch's
``scatter_reduce`` would split the gradient evenly among ties; the reference
defines the tie rule the native kernels follow.)
"""

from __future__ import annotations

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.ops import dispatch, reduce_native
from gnnio_cli.ops.segment import (
    accumulation_dtype,
    check_node_features,
    mean_weights,
    segment_extremum,
    slot_sources,
    slot_targets,
    sparse_matmul,
)

REDUCTIONS = ("sum", "mean", "max", "min")


def aggregate(graph: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """Reduce source features over each target's in-edges.

    x:      [num_src, F] (or [num_src, *trailing], flattened and restored).
    reduce: "sum", "mean" (sum / in-degree), "max" or "min" (per feature).
    Returns [num_dst, *trailing] in x's dtype; rows without in-edges are 0.
    Gradients flow to x; for max/min only to the winning source of each
    (target, feature), ties going to the smallest source id. Deterministic.
    """
    op = "aggregate"
    if reduce not in REDUCTIONS:
        raise GnnioError(f"{op}: reduce must be one of {', '.join(REDUCTIONS)}, got '{reduce}'")
    check_node_features(op, "x", x, graph, graph.num_src_nodes)

    backend = dispatch.pick(op, x)
    if backend == "native" and reduce_native.supports(x):
        return reduce_native.aggregate(graph, x, reduce)
    dispatch.record(op, "reference")
    return aggregate_reference(graph, x, reduce)


def aggregate_reference(graph: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """Pure-PyTorch :func:`aggregate` (inputs already validated)."""
    features = x.reshape(x.shape[0], x.shape[1:].numel()).to(accumulation_dtype(x.dtype))
    if reduce in ("max", "min"):
        out = _Extremum.apply(features, graph, reduce)
    else:
        out = sparse_matmul(graph, mean_weights(graph, features.dtype) if reduce == "mean" else None, features)
    return out.to(x.dtype).reshape(graph.num_dst_nodes, *x.shape[1:])


def extremum_winners(graph: Graph, features: torch.Tensor, reduce: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row max or min of source features and the source that attains it.

    features: [num_src, F]; reduce: "max" or "min".
    Returns (values [num_dst, F], 0 in empty rows;
             winners int64 [num_dst, F], the smallest source id attaining the
             value, num_src in empty rows).
    """
    sources = slot_sources(graph)
    messages = features.index_select(0, sources)
    values = segment_extremum(graph, messages, "amax" if reduce == "max" else "amin")
    rows = slot_targets(graph).unsqueeze(1).expand_as(messages)
    no_source = graph.num_src_nodes
    attains = messages == values.index_select(0, slot_targets(graph))
    candidates = torch.where(attains, sources.unsqueeze(1).expand_as(messages), no_source)
    winners = torch.full(values.shape, no_source, dtype=torch.int64, device=features.device)
    winners = winners.scatter_reduce(0, rows, candidates, "amin")
    return values, winners


class _Extremum(torch.autograd.Function):
    """max/min aggregation whose gradient goes to the winner chosen by :func:`extremum_winners`."""

    @staticmethod
    def forward(ctx, features: torch.Tensor, graph: Graph, reduce: str) -> torch.Tensor:
        values, winners = extremum_winners(graph, features, reduce)
        ctx.save_for_backward(winners)
        ctx.num_src = features.shape[0]
        return values

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (winners,) = ctx.saved_tensors
        # One extra row collects the (zero-meaning) gradients of empty rows, whose winner is num_src.
        grad = grad_out.new_zeros(ctx.num_src + 1, grad_out.shape[1]).scatter_add(0, winners, grad_out)
        return grad[: ctx.num_src], None, None
