"""The native path of the reduction family: sum, mean, max and min aggregation.

sum and mean are SpMM operators (:mod:`gnnio_cli.ops.spmm_native`; mean folds
1/in-degree into the values). max and min run native/reduce.cu with the
graph's degree-aware schedule (light rows one warp each, heavy rows in tiles
merged by a second pass) over a CSR whose rows list their sources in
ascending order: the graph's own when it already does, else a sorted copy
built once per graph. There "ties go to the smallest source id" is "ties go
to the earliest slot", which the kernel gets from a strict compare.

Forward kernels: ``warp`` (one warp per light row, its lane groups taking
further edges) for every input, and for fp16/bf16 rows of at most 128
features, a multiple of 8, ``subwarp`` (each light row a group of F / 8
lanes of its own, so a warp scans several rows at once; rows in row order)
and ``subwarp-sorted`` (the same, light rows by descending degree so the
rows sharing a warp are about as long). All give the same outputs and masks,
bit for bit. Where several can run they are timed on the first call per
(shape class, dtype, width) and the fastest kept (ops.tuning); ``GNNIO_EXTREMUM_KERNEL`` forces
one where the input allows it. The recorded implementation names the
schedule, with the subwarp kernel's name in it when one ran.

The forward saves, per edge, a bit mask of the features that edge won
(int32 [E, ceil(F / 32)], E * F / 8 bytes); the backward walks the CSC and
loads the output gradient only for those features. No atomics:
deterministic. Empty rows give 0 and send no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnnio_cli import native
from gnnio_cli.graph import Graph
from gnnio_cli.ops import dispatch, spmm_native
from gnnio_cli.graph.schedule import row_order, row_schedule
from gnnio_cli.ops.segment import slot_of_eid
from gnnio_cli.ops.tuning import choose_kernel, fits_subwarp, shape_class

supports = spmm_native.supports


@dataclass(frozen=True)
class SortedRows:
    """The graph's CSR with each row's sources ascending (ties keep slot order), as the max/min kernels read it.

    indices:       [E], the CSR indices' dtype; rows are the CSR's (same indptr).
    csc_mask_slot: int32 (int64 from 2**31 edges) [E]: for each CSC slot, the
                   slot of the same edge in `indices`, where its mask lives.
    """

    indices: torch.Tensor
    csc_mask_slot: torch.Tensor


def _rows_are_sorted(graph: Graph) -> bool:
    sources = graph.csr_indices
    if sources.numel() < 2:
        return True
    same_row = graph.csr_rows[1:] == graph.csr_rows[:-1]
    return not bool((same_row & (sources[1:] < sources[:-1])).any())


def sorted_rows(graph: Graph) -> SortedRows:
    """The cached :class:`SortedRows` of `graph` (no copy of the indices when its rows are already sorted)."""

    def build() -> SortedRows:
        num_edges = graph.num_edges
        if _rows_are_sorted(graph):
            indices, slot_of_edge = graph.csr_indices, slot_of_eid(graph)
        else:
            key = graph.csr_rows * max(graph.num_src_nodes, 1) + graph.csr_indices.long()
            order = torch.sort(key, stable=True).indices  # sorted slot -> CSR slot
            indices = graph.csr_indices.index_select(0, order)
            slot_of_edge = torch.empty_like(order)
            slot_of_edge[graph.csr_eid.index_select(0, order)] = torch.arange(num_edges, device=graph.device)
        slot_dtype = torch.int32 if num_edges < 2**31 else torch.int64
        return SortedRows(indices, slot_of_edge.index_select(0, graph.csc_eid).to(slot_dtype))

    return graph.cached("max_min_sorted_rows", build)


EXTREMUM_KERNELS = ("warp", "subwarp", "subwarp-sorted")
# The packed 16-bit scan of the subwarp kernel counts a light row's slots in 16 bits.
PACKED_POSITION_LIMIT = 0xFFFF


def extremum_candidates(graph: Graph, x: torch.Tensor) -> tuple[str, ...]:
    """The forward kernels that may run max/min of x [num_src, F] (contiguous) over `graph`, in timing order."""
    if fits_subwarp(x) and row_schedule(graph, "csr").tile_edges < PACKED_POSITION_LIMIT:
        return EXTREMUM_KERNELS
    return ("warp",)


def run_extremum(
    kernel: str, graph: Graph, x: torch.Tensor, is_min: bool, with_masks: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, masks); without `with_masks` (no gradient to route) the kernels skip the masks: [0, ceil(F / 32)]."""
    schedule = row_schedule(graph, "csr")
    args = (graph.csr_indptr, sorted_rows(graph).indices, x, graph.num_dst_nodes, is_min, *schedule.args())
    if kernel == "warp":
        return torch.ops.gnnio.segment_extremum_masked(*args, with_masks)
    rows = row_order(graph, "csr", schedule).with_bounds if kernel == "subwarp-sorted" else None
    return torch.ops.gnnio.segment_extremum_masked_subwarp(*args, rows, with_masks)


def extremum_kernel(graph: Graph, x: torch.Tensor, is_min: bool) -> str:
    """The forward kernel for this input: forced by GNNIO_EXTREMUM_KERNEL, else the faster candidate (timed once
    per shape class, dtype and width: ops.tuning; 'warp' inside CUDA graph capture, where nothing can be timed)."""
    candidates = extremum_candidates(graph, x)
    return choose_kernel(
        candidates, variable="GNNIO_EXTREMUM_KERNEL", names=EXTREMUM_KERNELS, fallback="warp",
        key=("extremum", *shape_class(graph.facts.csr), x.dtype, x.shape[1], x.device, candidates),
        run=lambda kernel: run_extremum(kernel, graph, x, is_min),
    )  # fmt: skip


class _Extremum(torch.autograd.Function):
    """Per-feature max/min over in-edges; the gradient goes to the edge whose mask bit says it won."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, graph: Graph, is_min: bool, kernel: str) -> torch.Tensor:
        # Inference (x needs no gradient, e.g. under torch.no_grad) writes no masks.
        out, masks = run_extremum(kernel, graph, x, is_min, with_masks=ctx.needs_input_grad[0])
        ctx.save_for_backward(masks)
        ctx.graph = graph
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (masks,) = ctx.saved_tensors
        return extremum_backward(ctx.graph, grad_out.contiguous(), masks), None, None, None


def extremum_backward(graph: Graph, grad_out: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """grad_x [num_src, F] of max/min from grad_out [num_dst, F] (contiguous) and the forward's winner masks."""
    return torch.ops.gnnio.segment_extremum_masked_backward(
        graph.csc_indptr, graph.csc_indices, sorted_rows(graph).csc_mask_slot, grad_out, masks,
        graph.num_src_nodes, *row_schedule(graph, "csc").args(),
    )


def aggregate(graph: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """Native :func:`gnnio_cli.ops.reduce.aggregate` (inputs validated there, :func:`supports` true)."""
    op = "aggregate"
    if reduce in ("sum", "mean"):
        return spmm_native.spmm(graph, x, None, reduce, op)
    features = x.flatten(1).contiguous()  # (reshape(N, -1) cannot size 0 rows)
    is_min = reduce == "min"
    kernel = extremum_kernel(graph, features, is_min)
    schedule = row_schedule(graph, "csr").name
    dispatch.record(op, f"degree-aware {schedule}" if kernel == "warp" else f"degree-aware {kernel} {schedule}")
    out = _Extremum.apply(features, graph, is_min, kernel)
    return out.reshape(graph.num_dst_nodes, *x.shape[1:])


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of native/reduce.cu's ops, so torch.compile and opcheck can trace them."""

    def extremum_outputs(indices, x, num_rows, with_masks):
        slots = indices.shape[0] if with_masks else 0
        return x.new_empty((num_rows, x.shape[1])), x.new_empty((slots, (x.shape[1] + 31) // 32), dtype=torch.int32)

    @torch.library.register_fake("gnnio::segment_extremum_masked")
    def _(indptr, indices, x, num_rows, is_min, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          with_masks=True):
        return extremum_outputs(indices, x, num_rows, with_masks)

    @torch.library.register_fake("gnnio::segment_extremum_masked_subwarp")
    def _(indptr, indices, x, num_rows, is_min, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          row_order, with_masks=True):
        return extremum_outputs(indices, x, num_rows, with_masks)

    @torch.library.register_fake("gnnio::segment_extremum_masked_backward")
    def _(csc_indptr, csc_indices, csc_mask_slot, grad_out, masks, num_src, tile_row, tile_start, heavy_rows,
          heavy_tile_ptr, tile_edges):
        return grad_out.new_empty((num_src, grad_out.shape[1]))
