"""The native path of the reduction family: sum, mean, max and min aggregation.

sum and mean are SpMM operators (:mod:`gnnio_cli.ops.spmm_native`; mean folds
1/in-degree into the values). max and min run native/reduce.cu with the
graph's degree-aware schedule (light rows one warp each, heavy rows in tiles
merged by a second pass). The forward keeps, per (target, feature), the
winner's position within the target's CSR row (16 bits when no row has more
than 65,536 in-edges, else 32); the backward walks the CSC and gives each
source the gradients of the (target, feature) pairs its edge won. No atomics:
deterministic. Ties go to the smallest source id, as the reference; empty
rows give 0 and send no gradient.
"""

from __future__ import annotations

import torch

from gnnio_cli.graph import Graph
from gnnio_cli.ops import dispatch, spmm_native
from gnnio_cli.ops.attention_native import row_schedule
from gnnio_cli.ops.segment import slot_of_eid

supports = spmm_native.supports

# Positions fit 16 bits (read as unsigned) while no row is longer than this.
COMPACT_POSITION_MAX_DEGREE = 65536


def csc_positions(graph: Graph) -> torch.Tensor:
    """int32 [E]: for each CSC slot, the position of the same edge within its target's CSR row (cached)."""

    def build() -> torch.Tensor:
        csr_slot = slot_of_eid(graph).index_select(0, graph.csc_eid)
        row_start = graph.csr_indptr.index_select(0, graph.csc_indices.long())
        return (csr_slot - row_start).to(torch.int32)

    return graph.cached("csc_positions", build)


def _compact_positions(graph: Graph) -> bool:
    return graph.cached(
        "compact_positions",
        lambda: graph.num_edges == 0 or int(graph.in_degree.max()) <= COMPACT_POSITION_MAX_DEGREE,
    )


class _Extremum(torch.autograd.Function):
    """Per-feature max/min over in-edges; the gradient goes to the saved winner of each (target, feature)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, graph: Graph, is_min: bool) -> torch.Tensor:
        schedule = row_schedule(graph, "csr")
        out, position = torch.ops.gnnio.segment_extremum(
            graph.csr_indptr, graph.csr_indices, x, graph.num_dst_nodes, is_min, _compact_positions(graph),
            *schedule.args(),
        )
        ctx.save_for_backward(position)
        ctx.graph = graph
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (position,) = ctx.saved_tensors
        graph = ctx.graph
        schedule = row_schedule(graph, "csc")
        grad_x = torch.ops.gnnio.segment_extremum_backward(
            graph.csc_indptr, graph.csc_indices, csc_positions(graph), grad_out.contiguous(), position,
            graph.num_src_nodes, *schedule.args(),
        )
        return grad_x, None, None


def aggregate(graph: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """Native :func:`gnnio_cli.ops.reduce.aggregate` (inputs validated there, :func:`supports` true)."""
    op = "aggregate"
    if reduce in ("sum", "mean"):
        return spmm_native.spmm(graph, x, None, reduce, op)
    features = x.reshape(x.shape[0], -1).contiguous()
    dispatch.record(op, f"degree-aware {row_schedule(graph, 'csr').name}")
    out = _Extremum.apply(features, graph, reduce == "min")
    return out.reshape(graph.num_dst_nodes, *x.shape[1:])
