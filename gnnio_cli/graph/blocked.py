"""Blocked formats cached beside a graph: block-sparse tiles and degree buckets.

**Tiles** (kind ``tiles<B>``): the adjacency (rows = targets, columns = sources)
cut into B x B tiles; only tiles holding at least one edge are kept, in
block-CSR order (by tile row, then tile column ascending). Arrays:

- ``tile_indptr`` int64 [ceil(N_dst / B) + 1]: tiles of tile row r are
  ``tile_indptr[r]:tile_indptr[r+1]``;
- ``tile_col`` int32 [T]: the tile column (source id // B) of each tile;
- ``tile_mask`` uint8 [T, B, ceil(B / 8)]: bit (c % 8) of byte c // 8 in row r
  set when target (tile row * B + r) has an edge from source (tile col * B + c);
- ``tile_edge_ptr`` int64 [T + 1] and ``tile_eid`` int64 [E]: the edges of tile
  t are ``tile_eid[tile_edge_ptr[t]:tile_edge_ptr[t+1]]`` (original edge ids,
  for edge values), ordered by row within the tile and by CSR slot within a row.
  Duplicate edges share one mask bit but each keeps its eid.

**Degree buckets** (kind ``degree_buckets``): target rows grouped by in-degree at
the kernels' schedule thresholds (see `gnnio_cli.graph.profile`):

- ``thresholds`` int64 [K]: ascending row lengths; bucket 0 holds rows of length
  <= thresholds[0], bucket k rows in (thresholds[k-1], thresholds[k]], bucket K
  the rest;
- ``bucket_ptr`` int64 [K + 2] and ``rows`` int64 [N_dst]: the rows of bucket k
  are ``rows[bucket_ptr[k]:bucket_ptr[k+1]]``, ascending.

Both are derived from the order they were built on: a reorder rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.build import compress
from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.profile import schedule_thresholds

DEGREE_BUCKETS = "degree_buckets"
MAX_BLOCK = 256


def tiles_kind(block: int) -> str:
    """The /blocked/<kind> name of B x B tiles."""
    return f"tiles{block}"


@numba.njit(cache=True)
def _count_tiles(indptr, indices, block, num_tile_cols):
    """Distinct tile columns per tile row (a stamp per tile column avoids sorting)."""
    num_rows = indptr.shape[0] - 1
    num_tile_rows = (num_rows + block - 1) // block
    last_seen = np.full(num_tile_cols, -1, dtype=np.int64)
    tile_indptr = np.zeros(num_tile_rows + 1, dtype=np.int64)
    for tile_row in range(num_tile_rows):
        count = 0
        for row in range(tile_row * block, min(num_rows, (tile_row + 1) * block)):
            for slot in range(indptr[row], indptr[row + 1]):
                tile_col = indices[slot] // block
                if last_seen[tile_col] != tile_row:
                    last_seen[tile_col] = tile_row
                    count += 1
        tile_indptr[tile_row + 1] = tile_indptr[tile_row] + count
    return tile_indptr


@numba.njit(cache=True)
def _fill_tiles(indptr, indices, eid, block, num_tile_cols, tile_indptr):
    num_rows = indptr.shape[0] - 1
    num_tile_rows = tile_indptr.shape[0] - 1
    num_tiles = tile_indptr[-1]
    mask_bytes = (block + 7) // 8
    tile_col = np.empty(num_tiles, dtype=np.int32)
    tile_mask = np.zeros((num_tiles, block, mask_bytes), dtype=np.uint8)
    tile_edge_count = np.zeros(num_tiles + 1, dtype=np.int64)
    tile_of_col = np.full(num_tile_cols, -1, dtype=np.int64)
    for tile_row in range(num_tile_rows):
        first_row = tile_row * block
        last_row = min(num_rows, first_row + block)
        start = tile_indptr[tile_row]
        filled = start
        for row in range(first_row, last_row):
            for slot in range(indptr[row], indptr[row + 1]):
                col = indices[slot] // block
                if tile_of_col[col] < start:
                    tile_of_col[col] = filled
                    tile_col[filled] = col
                    filled += 1
        tile_col[start:filled] = np.sort(tile_col[start:filled])
        for t in range(start, filled):
            tile_of_col[tile_col[t]] = t
        for row in range(first_row, last_row):
            for slot in range(indptr[row], indptr[row + 1]):
                source = indices[slot]
                t = tile_of_col[source // block]
                c = source % block
                tile_mask[t, row - first_row, c // 8] |= np.uint8(1 << (c % 8))
                tile_edge_count[t + 1] += 1
    tile_edge_ptr = np.cumsum(tile_edge_count)
    tile_eid = np.empty(indices.shape[0], dtype=np.int64)
    cursor = tile_edge_ptr[:-1].copy()
    for tile_row in range(num_tile_rows):
        start = tile_indptr[tile_row]
        for t in range(start, tile_indptr[tile_row + 1]):
            tile_of_col[tile_col[t]] = t
        for row in range(tile_row * block, min(num_rows, (tile_row + 1) * block)):
            for slot in range(indptr[row], indptr[row + 1]):
                t = tile_of_col[indices[slot] // block]
                tile_eid[cursor[t]] = eid[slot]
                cursor[t] += 1
    return tile_col, tile_mask, tile_edge_ptr, tile_eid


def block_tiles(graph: Graph, block: int = 16) -> dict[str, np.ndarray]:
    """Block-sparse B x B tiles of the adjacency (layout in the module docstring). O(E + N)."""
    if not 1 <= block <= MAX_BLOCK:
        raise GnnioError(f"--blocked: tile size must be in 1..{MAX_BLOCK}, got {block}")
    graph = graph.to("cpu")
    indptr = graph.csr_indptr.numpy()
    indices = graph.csr_indices.numpy()
    eid = graph.csr_eid.numpy()
    num_tile_cols = -(-graph.num_src_nodes // block)
    tile_indptr = _count_tiles(indptr, indices, block, num_tile_cols)
    tile_col, tile_mask, tile_edge_ptr, tile_eid = _fill_tiles(indptr, indices, eid, block, num_tile_cols, tile_indptr)
    return {
        "tile_indptr": tile_indptr,
        "tile_col": tile_col,
        "tile_mask": tile_mask,
        "tile_edge_ptr": tile_edge_ptr,
        "tile_eid": tile_eid,
    }


def degree_buckets(graph: Graph, features: int, dtype: str) -> dict[str, np.ndarray]:
    """Target rows grouped by in-degree at the schedule thresholds (layout in the module docstring)."""
    in_degree = graph.to("cpu").in_degree.numpy()
    thresholds = np.asarray(schedule_thresholds(features, dtype), dtype=np.int64)
    bucket = np.searchsorted(thresholds, in_degree, side="left")
    bucket_ptr, rows = compress(bucket, thresholds.size + 1)
    return {"thresholds": thresholds, "bucket_ptr": bucket_ptr, "rows": rows}


def blocked_arrays(graph: Graph, block: int = 16, features: int = 128, dtype: str = "fp32") -> dict[str, dict[str, np.ndarray]]:
    """Everything `StoredGraph.blocked` caches: {'tiles<B>': tiles, 'degree_buckets': buckets}."""
    return {tiles_kind(block): block_tiles(graph, block), DEGREE_BUCKETS: degree_buckets(graph, features, dtype)}


@dataclass
class BlockReport:
    """How dense the B x B tiles are.

    density: distinct (row, column) positions / (tiles * B^2); edges_in_dense_tiles:
    fraction of edges in tiles holding at least B positions (one per row on average).
    """

    block: int
    num_tiles: int
    nonempty_tile_rows: int
    density: float
    positions_per_tile_median: float
    positions_per_tile_p90: float
    positions_per_tile_max: int
    edges_in_dense_tiles: float


@numba.njit(cache=True)
def _tile_positions(mask):
    """Set bits per tile of a uint8 [T, bytes] mask, without unpacking it (tiles can number tens of millions)."""
    positions = np.zeros(mask.shape[0], dtype=np.int64)
    for t in range(mask.shape[0]):
        for byte in mask[t]:
            while byte:
                byte &= byte - np.uint8(1)
                positions[t] += 1
    return positions


def block_report(tiles: dict[str, np.ndarray]) -> BlockReport:
    """Summarise tiles made by `block_tiles`."""
    mask = tiles["tile_mask"]
    num_tiles, block = int(mask.shape[0]), int(mask.shape[1])
    if num_tiles == 0:
        return BlockReport(block, 0, 0, 0.0, 0.0, 0.0, 0, 0.0)
    positions = _tile_positions(mask.reshape(num_tiles, -1))
    edges = np.diff(tiles["tile_edge_ptr"])
    dense = positions >= block
    return BlockReport(
        block=block,
        num_tiles=num_tiles,
        nonempty_tile_rows=int(np.count_nonzero(np.diff(tiles["tile_indptr"]))),
        density=float(positions.sum() / (num_tiles * block * block)),
        positions_per_tile_median=float(np.median(positions)),
        positions_per_tile_p90=float(np.percentile(positions, 90)),
        positions_per_tile_max=int(positions.max()),
        edges_in_dense_tiles=float(edges[dense].sum() / edges.sum()),
    )
