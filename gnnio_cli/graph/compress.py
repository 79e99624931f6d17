"""Compressed rows built with torch ops on the edges' own device (a GPU, in mini-batch training).

A graph that arrives as a CUDA ``edge_index`` every step is grouped where it
lies: a stable sort of the targets (CSR) and of the sources (CSC), and a
binary search of each row's first slot. Nothing here reads the device; the
sizes of everything are known from the edge count and the node counts.

Derived graphs (a layer's self-loop rule: drop the loops an edge list has,
append one per node) are grouped the same way with the dropped edges' key
past the last row, so they sort behind every row and no row reaches them; the
arrays are then cut to the kept length, which the base graph's facts give.

Edge ids are positions in the edge list, so within each row the slots keep
the input's edge order (the same result as the CPU's counting sort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from gnnio_cli import native

INT32_MAX = 2**31 - 1


INT16_MAX = 2**15 - 1


def key_dtype(num_rows: int) -> torch.dtype:
    """The narrowest sort key holding every row id and the drop key num_rows: a device radix sort makes
    one pass per byte of key (a mini-batch's 20,000 rows sort in 2 passes, not 8)."""
    if num_rows < INT16_MAX:
        return torch.int16
    return torch.int32 if num_rows < INT32_MAX else torch.int64


def group(keys: Tensor, num_rows: int, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stable grouping of positions by `keys` (ids in [0, num_rows], num_rows = dropped).

    Returns (indptr int64 [num_rows + 1], values in slot order, order int64: the position in each slot).
    Slots from indptr[num_rows] on hold the dropped positions.
    """
    sorted_keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(num_rows + 1, dtype=keys.dtype, device=keys.device)
    return torch.searchsorted(sorted_keys, bounds), values.index_select(0, order), order


@dataclass(frozen=True)
class Compressed:
    """Both sides of a graph grouped on the device: (indptr, indices, eid) of the CSR and of the CSC."""

    csr: tuple[Tensor, Tensor, Tensor]
    csc: tuple[Tensor, Tensor, Tensor]


def compress(src: Tensor, dst: Tensor, num_src: int, num_dst: int, index_dtype: torch.dtype,
             drop: Optional[Tensor] = None, kept: Optional[int] = None, loops: int = 0) -> Compressed:
    """The CSR (rows = targets) and CSC (rows = sources) of the edges src -> dst, on their device.

    src, dst: int [E]. drop: optional bool [E], edges to leave out (`kept` of them stay, a count the
    caller knows). loops: append the edges (i, i) for i < loops after the list. Edge ids number the kept
    edges in list order, then the loops; indices come in `index_dtype`.
    """
    keys = key_dtype(max(num_src, num_dst))
    src_key, dst_key = src.to(keys), dst.to(keys)
    if drop is not None:
        dst_key = torch.where(drop, num_dst, dst_key)
        src_key = torch.where(drop, num_src, src_key)
    if loops:
        nodes = torch.arange(loops, dtype=keys, device=src.device)
        src_key, dst_key = torch.cat([src_key, nodes]), torch.cat([dst_key, nodes])
    csr_indptr, csr_indices, csr_order = group(dst_key, num_dst, src_key.to(index_dtype))
    csc_indptr, csc_indices, csc_order = group(src_key, num_src, dst_key.to(index_dtype))
    if drop is None:
        return Compressed((csr_indptr, csr_indices, csr_order), (csc_indptr, csc_indices, csc_order))
    # keep the first kept + loops slots of each side, and number the kept edges consecutively
    size = kept + loops
    keep = ~drop if not loops else torch.cat([~drop, drop.new_ones(loops)])
    compact_id = torch.cumsum(keep, 0) - 1
    csr_eid = compact_id.index_select(0, csr_order[:size])
    csc_eid = compact_id.index_select(0, csc_order[:size])
    return Compressed((csr_indptr, csr_indices[:size], csr_eid), (csc_indptr, csc_indices[:size], csc_eid))


def on_native(tensor: Tensor) -> bool:
    """Whether a structure op on `tensor` runs as one native call (a CUDA tensor and the extension loaded):
    a mini-batch step waits on the host, and a chain of small torch ops costs it microseconds per op."""
    return tensor.is_cuda and native.is_available()


def append_loops(indptr: Tensor, indices: Tensor, eid: Tensor, num_loops: int) -> tuple[Tensor, Tensor, Tensor]:
    """One side's (indptr, indices, eid) with the loop (r, r) appended to each row r < num_loops, edge id
    num_edges + r: the same result as grouping the edges and the loops again, without a sort (a slot
    moves down by the number of rows before its own that gained a loop). One native call on a GPU."""
    if on_native(indptr):
        return torch.ops.gnnio.append_loops(indptr, indices, eid, num_loops)
    return append_loops_torch(indptr, indices, eid, num_loops)


def append_loops_torch(indptr: Tensor, indices: Tensor, eid: Tensor, num_loops: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`append_loops` with torch ops (any device)."""
    num_rows, num_edges = indptr.numel() - 1, indices.numel()
    device = indptr.device
    gained = torch.arange(num_rows + 1, device=device).clamp_(max=num_loops)  # loops in the rows before row r
    new_indptr = indptr + gained
    rows = torch.repeat_interleave(torch.arange(num_rows, device=device), indptr.diff(), output_size=num_edges)
    moved = torch.arange(num_edges, device=device) + gained.index_select(0, rows)
    loop_slots = new_indptr[1:num_loops + 1] - 1
    loops = torch.arange(num_loops, device=device)
    new_indices = indices.new_empty(num_edges + num_loops)
    new_indices.index_copy_(0, moved, indices).index_copy_(0, loop_slots, loops.to(indices.dtype))
    new_eid = eid.new_empty(num_edges + num_loops)
    new_eid.index_copy_(0, moved, eid).index_copy_(0, loop_slots, loops + num_edges)
    return new_indptr, new_indices, new_eid


def slot_map(to_eid: Tensor, from_eid: Tensor) -> Tensor:
    """int64 [E]: for each slot of `from_eid`, the slot of `to_eid` that holds the same edge (e.g. the CSC
    slot of each CSR slot). One native call on a GPU."""
    if on_native(to_eid):
        return torch.ops.gnnio.slot_map(to_eid, from_eid)
    slot_of_eid = torch.empty_like(to_eid)
    slot_of_eid[to_eid] = torch.arange(to_eid.numel(), device=to_eid.device)
    return slot_of_eid.index_select(0, from_eid)


def kept_positions(drop: Tensor, kept: int) -> Tensor:
    """int64 [kept]: the positions of the edges `drop` leaves, in order (a stable sort: no read)."""
    return torch.sort(drop.to(torch.uint8), stable=True).indices[:kept]


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of append_loops and slot_map (native/graph.cu), so torch.compile and opcheck
    can trace them."""

    @torch.library.register_fake("gnnio::append_loops")
    def _(indptr, indices, eid, num_loops):
        return torch.empty_like(indptr), indices.new_empty(indices.shape[0] + num_loops), eid.new_empty(eid.shape[0] + num_loops)

    @torch.library.register_fake("gnnio::slot_map")
    def _(to_eid, from_eid):
        return torch.empty_like(from_eid)
