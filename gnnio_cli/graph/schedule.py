"""What the host knows of a graph's rows, and the degree-aware row schedules built from it.

Every native kernel walks one compressed side of a graph (the CSR: a row per
target; the CSC: a row per source) with the same schedule: rows with at most
``tile_edges`` slots are *light* and taken one warp (or lane group) each, in
order of descending degree; longer rows are *heavy* and cut into tiles of
``tile_edges`` slots whose partial results a second pass merges in order.

The schedule's tensors have sizes that depend on the degrees: how many rows are
heavy, how many tiles they make, how many light rows are not empty. Those
counts are :class:`RowFacts`, kept on the host, so that building a schedule
launches a handful of device ops and never waits for the device:

- a graph built on the CPU (or read from a file) counts them there, for free;
- a graph built on the GPU from an ``edge_index`` reads them back once, in the
  same small read that checks its node ids (:func:`measure`);
- a graph built by gnnio's loader gets them from the sampler, which knows them.

The tile length of a side follows one documented rule (:func:`tile_length`):
at least ``MIN_TILE_EDGES`` slots and ``TILE_AVERAGE_FACTOR`` times the average
degree, rounded up to a multiple of 32, and long enough that the longest row
has at most ``MAX_TILES_PER_ROW`` tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

import torch

from gnnio_cli import native
from gnnio_cli.graph.compress import on_native

if TYPE_CHECKING:
    from gnnio_cli.graph.graph import Graph

# A row longer than this many slots is split into tiles no matter the graph.
MIN_TILE_EDGES = 128
# Rows of about this many times the average degree stay whole.
TILE_AVERAGE_FACTOR = 4
# At most about this many tiles for the longest row, so merging its partial
# states stays cheap next to the first pass even for in-degrees in the millions.
# rmat20 with a target of in-degree 2,000,000 (H100, `compare --schedules`,
# GATv2 fwd / fwd+bwd): tiles of 512 (4096 per row) 4.95 / 18.1 ms, of 2048
# 3.95 / 15.3 ms; rows below 131,072 in-edges are not affected.
MAX_TILES_PER_ROW = 1024

# graph_facts' output layout (native/graph.cu; its fake kernel at the end gives the shape): per side (CSR, then
# CSC) SIDE_WIDTH counts, then the edge list's
SIDE_WIDTH = 6  # max degree, non-empty rows, heavy rows and tiles at t0, the same with every degree + 1 at t1
EDGE_FACTS = 5  # min source, max source, min target, max target, self-loops
FACTS_WIDTH = 2 * SIDE_WIDTH + EDGE_FACTS


def base_tile_length(num_rows: int, num_slots: int) -> int:
    """The tile length before the longest row is known: the first two terms of :func:`tile_length`."""
    average = num_slots / num_rows if num_rows > 0 else 0.0
    return int(math.ceil(max(MIN_TILE_EDGES, TILE_AVERAGE_FACTOR * average) / 32) * 32)


def tile_length(num_rows: int, num_slots: int, max_degree: int) -> int:
    """A side's tile length: ordinary rows stay whole, super nodes get at most MAX_TILES_PER_ROW tiles."""
    tile = max(base_tile_length(num_rows, num_slots), math.ceil(max_degree / MAX_TILES_PER_ROW))
    return int(math.ceil(tile / 32) * 32)


def choose_tile_edges(indptr: torch.Tensor) -> int:
    """The tile length of a side with this indptr (reads its degrees: for tests and CPU graphs)."""
    rows = indptr.numel() - 1
    longest = int(indptr.diff().max()) if rows > 0 else 0
    return tile_length(rows, int(indptr[-1]) if rows >= 0 else 0, longest)


@dataclass(frozen=True)
class RowFacts:
    """What the host knows of one side's rows.

    num_rows, num_slots: the side's size (indptr has num_rows + 1 entries, the last one num_slots).
    max_degree:    the longest row.
    nonempty_rows: rows with at least one slot.
    tile_edges:    the side's tile length (:func:`tile_length`).
    heavy_rows:    rows longer than tile_edges; tiles: the tiles they are cut into.
    """

    num_rows: int
    num_slots: int
    max_degree: int
    nonempty_rows: int
    tile_edges: int
    heavy_rows: int
    tiles: int


@dataclass(frozen=True)
class GraphFacts:
    """RowFacts of both sides and the number of self-loops (-1: not counted), and, for a graph with as many
    sources as targets, the facts of the same graph with one self-loop appended to every node (``looped``;
    what GAT's and GCN's self-loop rules make of a loop-free graph), so that graph needs no read either."""

    csr: RowFacts
    csc: RowFacts
    self_loops: int
    looped: Optional["GraphFacts"] = None


# ------------------------------------------------------------------ counting
def _side_counts(indptr: torch.Tensor, tile0: int, tile1: int) -> torch.Tensor:
    """int64 [SIDE_WIDTH] of graph_facts for one side, with torch ops (any device)."""
    degree = indptr.diff()
    zero = degree.new_zeros(())
    counts = [degree.max() if degree.numel() else zero, (degree > 0).sum()]
    for offset, tile in ((0, tile0), (1, tile1)):
        counts += _heavy_counts(degree + offset, tile)
    return torch.stack(counts)


def _heavy_counts(degree: torch.Tensor, tile_edges: int) -> list[torch.Tensor]:
    """[rows longer than tile_edges, the tiles they are cut into] as 0-d tensors on the degrees' device."""
    heavy = degree > tile_edges
    return [heavy.sum(), torch.where(heavy, (degree + tile_edges - 1) // tile_edges, 0).sum()]


def _edge_counts(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """int64 [EDGE_FACTS] of graph_facts for an edge list, with torch ops (any device)."""
    if src.numel() == 0:
        return src.new_zeros(EDGE_FACTS, dtype=torch.int64)
    src_range, dst_range = torch.aminmax(src), torch.aminmax(dst)
    return torch.stack([*src_range, *dst_range, (src == dst).sum()]).to(torch.int64)


def facts_vector(csr_indptr: torch.Tensor, csc_indptr: torch.Tensor, src: Optional[torch.Tensor],
                 dst: Optional[torch.Tensor], tiles: list[int]) -> torch.Tensor:
    """int64 [FACTS_WIDTH] on the indptrs' device: per side (CSR, CSC) the max degree, the non-empty rows,
    the heavy rows and tiles at tiles[2 * side] and, with every degree + 1, at tiles[2 * side + 1]; then the
    min and max source and target ids and the self-loops of the edge list src -> dst (zeros without one).
    One native kernel on CUDA where the extension is loaded, torch ops otherwise."""
    if on_native(csr_indptr):
        return torch.ops.gnnio.graph_facts(csr_indptr, csc_indptr, src, dst, tiles)
    edges = _edge_counts(src, dst) if src is not None else csr_indptr.new_zeros(EDGE_FACTS)
    return torch.cat([_side_counts(csr_indptr, *tiles[:2]), _side_counts(csc_indptr, *tiles[2:]), edges])


@dataclass(frozen=True)
class Measured:
    """:func:`measure`'s result: the facts, and the edge list's id ranges (None without one)."""

    facts: GraphFacts
    id_ranges: Optional[tuple[int, int, int, int]]  # min source, max source, min target, max target


def measure(csr_indptr: torch.Tensor, csc_indptr: torch.Tensor, num_slots: int, src: Optional[torch.Tensor] = None,
            dst: Optional[torch.Tensor] = None) -> Measured:
    """The GraphFacts of a graph's two sides of `num_slots` slots each (and, given its edge list src -> dst,
    the list's id ranges and self-loops), in one read.

    On a GPU this is the one place a graph's construction waits for the device: a single read of
    FACTS_WIDTH numbers. A side whose longest row needs a longer tile than its average suggests (a super
    node of more than MAX_TILES_PER_ROW * tile in-edges) is counted again at that tile, a second read.
    Without an edge list the self-loops are unknown (-1) and no `looped` facts are given.
    """
    num_dst, num_src = csr_indptr.numel() - 1, csc_indptr.numel() - 1
    tiles = [base_tile_length(num_dst, num_slots), base_tile_length(num_dst, num_slots + num_dst),
             base_tile_length(num_src, num_slots), base_tile_length(num_src, num_slots + num_src)]
    values = facts_vector(csr_indptr, csc_indptr, src, dst, tiles).tolist()
    csr = _side_facts(csr_indptr, values[:SIDE_WIDTH], num_dst, num_slots, tiles[0], tiles[1])
    csc = _side_facts(csc_indptr, values[SIDE_WIDTH:2 * SIDE_WIDTH], num_src, num_slots, tiles[2], tiles[3])
    edges = values[2 * SIDE_WIDTH:]
    if src is None:
        return Measured(GraphFacts(csr[0], csc[0], -1), None)
    loops = edges[4]
    looped = GraphFacts(csr[1], csc[1], loops + num_dst) if num_src == num_dst else None
    return Measured(GraphFacts(csr[0], csc[0], loops, looped), tuple(edges[:4]) if num_slots else None)


def _side_facts(indptr: torch.Tensor, counts: list[int], rows: int, slots: int, tile0: int, tile1: int):
    """(RowFacts of the side, RowFacts of the side with every degree + 1) from graph_facts' counts."""
    longest, nonempty, heavy0, tiles0, heavy1, tiles1 = counts
    plain = _settled(indptr, RowFacts(rows, slots, longest, nonempty, tile0, heavy0, tiles0), 0)
    plus_one = RowFacts(rows, slots + rows, longest + 1 if rows else 0, rows, tile1, heavy1, tiles1)
    return plain, _settled(indptr, plus_one, 1)


def _settled(indptr: torch.Tensor, facts: RowFacts, offset: int) -> RowFacts:
    """`facts` at the side's final tile length (a second count where a super node lengthens it)."""
    tile = tile_length(facts.num_rows, facts.num_slots, facts.max_degree)
    if tile == facts.tile_edges:
        return facts
    heavy, tiles = count_heavy(indptr, tile, offset)
    return replace(facts, tile_edges=tile, heavy_rows=heavy, tiles=tiles)


def count_heavy(indptr: torch.Tensor, tile_edges: int, offset: int = 0) -> tuple[int, int]:
    """(heavy rows, tiles) of a side at another tile length (a read on the GPU)."""
    heavy_rows, tile_count = torch.stack(_heavy_counts(indptr.diff() + offset, tile_edges)).tolist()
    return heavy_rows, tile_count


# ------------------------------------------------------------------ schedules
@dataclass(frozen=True)
class RowSchedule:
    """Which rows of one compressed side (CSR or CSC) are split, and where (common.cuh's RowSchedule).

    tile_row       int64 [T]      the heavy row of each tile
    tile_start     int64 [T]      the tile's first slot
    heavy_rows     int64 [R]      rows with more than tile_edges slots, longest first (ties by row)
    heavy_tile_ptr int64 [R + 1]  tiles of heavy_rows[i] are heavy_tile_ptr[i] .. heavy_tile_ptr[i + 1]

    The heavy rows come longest first: the passes that finish them take one block per heavy row in this
    order, so the longest, whose loads wait on each other round after round, start at once and the short
    ones fill in beside them; the first passes take the tiles in this order too.
    """

    tile_edges: int
    tile_row: torch.Tensor
    tile_start: torch.Tensor
    heavy_rows: torch.Tensor
    heavy_tile_ptr: torch.Tensor

    @property
    def name(self) -> str:
        heavy = self.heavy_rows.numel()
        return "node-parallel" if heavy == 0 else f"node-parallel+split({heavy} rows > {self.tile_edges})"

    def args(self) -> tuple:
        return self.tile_row, self.tile_start, self.heavy_rows, self.heavy_tile_ptr, self.tile_edges


@dataclass(frozen=True)
class RowOrder:
    """The light rows of one side (at most tile_edges slots) in the order the kernels take them.

    with_bounds int64 [L, 3]  (row, first slot, end slot): the non-empty light rows by descending degree
                              (ties by row), then the empty rows; a row's bounds come in one round of
                              loads with its id, not after it
    num_busy    int           how many of them are non-empty
    """

    with_bounds: torch.Tensor
    num_busy: int

    def args(self) -> tuple:
        return self.with_bounds, self.num_busy


def _degree_key(max_degree: int) -> torch.dtype:
    """The narrowest sort key for degrees up to max_degree (a device radix sort makes a pass per byte)."""
    if max_degree < 2**15:
        return torch.int16
    return torch.int32 if max_degree < 2**31 else torch.int64


def build_row_plan(indptr: torch.Tensor, tile_edges: int, heavy_rows: int, tiles: int,
                   nonempty_rows: int, max_degree: int) -> tuple[RowSchedule, RowOrder]:
    """The schedule and light-row order of a side whose counts at `tile_edges` are known.

    One stable sort of the rows by descending degree gives both: its first `heavy_rows` entries are the
    heavy rows longest first, the rest the light rows longest first with the empty ones last. Nothing
    here reads the device; on a GPU it is one native call.
    """
    if on_native(indptr):
        tile_row, tile_start, heavy, heavy_tile_ptr, with_bounds = torch.ops.gnnio.row_plan(
            indptr, tile_edges, heavy_rows, tiles, max_degree)
        return (RowSchedule(tile_edges, tile_row, tile_start, heavy, heavy_tile_ptr),
                RowOrder(with_bounds, nonempty_rows - heavy_rows))
    return build_row_plan_torch(indptr, tile_edges, heavy_rows, tiles, nonempty_rows, max_degree)


def build_row_plan_torch(indptr: torch.Tensor, tile_edges: int, heavy_rows: int, tiles: int,
                         nonempty_rows: int, max_degree: int) -> tuple[RowSchedule, RowOrder]:
    """:func:`build_row_plan` with torch ops (any device)."""
    degree = indptr.diff()
    by_degree = torch.sort(degree.to(_degree_key(max_degree)), descending=True, stable=True).indices
    heavy = by_degree[:heavy_rows]
    light = by_degree[heavy_rows:]
    with_bounds = torch.stack([light, indptr.index_select(0, light), indptr.index_select(0, light + 1)], dim=1)
    order = RowOrder(with_bounds, nonempty_rows - heavy_rows)
    if heavy_rows == 0:
        empty = indptr.new_empty(0)
        return RowSchedule(tile_edges, empty, empty, empty, indptr.new_zeros(1)), order
    tiles_per_row = (degree.index_select(0, heavy) + tile_edges - 1) // tile_edges
    heavy_tile_ptr = torch.zeros(heavy_rows + 1, dtype=torch.int64, device=indptr.device)
    torch.cumsum(tiles_per_row, 0, out=heavy_tile_ptr[1:])
    tile_row = torch.repeat_interleave(heavy, tiles_per_row, output_size=tiles)
    first_tile = torch.repeat_interleave(heavy_tile_ptr[:-1], tiles_per_row, output_size=tiles)
    position = torch.arange(tiles, device=indptr.device) - first_tile
    tile_start = indptr.index_select(0, tile_row) + position * tile_edges
    return RowSchedule(tile_edges, tile_row, tile_start, heavy, heavy_tile_ptr), order


def row_plan(graph: "Graph", side: str, tile_edges: Optional[int] = None) -> tuple[RowSchedule, RowOrder]:
    """The cached schedule and light-row order of the graph's 'csr' (target rows) or 'csc' (source rows).

    tile_edges None: the side's own tile length (its facts' counts, no read); another length (`gnnio compare
    --schedules` tries several) counts the heavy rows at it first, one read on a GPU.
    """
    facts = graph.facts.csr if side == "csr" else graph.facts.csc
    indptr = graph.csr_indptr if side == "csr" else graph.csc_indptr
    tile = facts.tile_edges if tile_edges is None else int(tile_edges)

    def build() -> tuple[RowSchedule, RowOrder]:
        heavy, tiles = (facts.heavy_rows, facts.tiles) if tile == facts.tile_edges else count_heavy(indptr, tile)
        return build_row_plan(indptr, tile, heavy, tiles, facts.nonempty_rows, facts.max_degree)

    return graph.cached(("row_plan", side, tile), build)


def row_schedule(graph: "Graph", side: str, tile_edges: Optional[int] = None) -> RowSchedule:
    """The row schedule of :func:`row_plan`."""
    return row_plan(graph, side, tile_edges)[0]


def row_order(graph: "Graph", side: str, schedule: RowSchedule) -> RowOrder:
    """The light-row order that goes with `schedule` (:func:`row_plan`)."""
    return row_plan(graph, side, schedule.tile_edges)[1]


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of graph_facts and row_plan (native/graph.cu), so torch.compile and opcheck can
    trace them."""

    @torch.library.register_fake("gnnio::graph_facts")
    def _(csr_indptr, csc_indptr, src, dst, tiles):
        return csr_indptr.new_empty(FACTS_WIDTH)

    @torch.library.register_fake("gnnio::row_plan")
    def _(indptr, tile_edges, heavy_rows, tiles, max_degree):
        tile_count = tiles if heavy_rows else 0
        rows = indptr.shape[0] - 1
        return (indptr.new_empty(tile_count), indptr.new_empty(tile_count), indptr.new_empty(heavy_rows),
                indptr.new_empty(heavy_rows + 1), indptr.new_empty((rows - heavy_rows, 3)))
