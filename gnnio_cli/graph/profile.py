"""Degree profile of a graph: what the kernels' schedules and a node order have to work with.

`degree_profile(graph)` summarises in- and out-degrees, how many target rows
cross the thresholds at which the kernels change schedule, and the locality
of the current node order (see `gnnio_cli.graph.locality`).

Schedule thresholds (rows = targets, length = in-degree):

- `WARP_ROW_LIMIT` (32): rows up to this length are handled feature-parallel,
  one row per warp-sized group;
- `SPLIT_ROW_LIMIT` (1024): rows longer than this are split into neighbour tiles
  whose partial results are combined in a second step;
- `shared_memory_row_limit(features, dtype)`: the longest row whose gathered
  neighbour feature rows fit in one thread block's shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numba
import numpy as np

from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.locality import CacheModel, LocalityMetrics, dtype_bytes, locality

WARP_ROW_LIMIT = 32
SPLIT_ROW_LIMIT = 1024
# H100/H200: the most dynamic shared memory one thread block may opt in to (227 KiB).
MAX_SHARED_MEMORY_PER_BLOCK = 227 * 1024
TOP_SHARE_FRACTION = 0.01


def shared_memory_row_limit(features: int, dtype: str) -> int:
    """Longest row (neighbour count) whose feature rows fit in one block's shared memory.

    = floor(227 KiB / (features * bytes per element)); e.g. 454 at 128 x fp32,
    908 at 128 x bf16. Rows longer than this cannot stage all their neighbours'
    features in shared memory at once.
    """
    return MAX_SHARED_MEMORY_PER_BLOCK // (features * dtype_bytes(dtype))


def schedule_thresholds(features: int, dtype: str) -> list[int]:
    """The row lengths at which kernel schedules change, ascending and distinct."""
    return sorted({WARP_ROW_LIMIT, SPLIT_ROW_LIMIT, shared_memory_row_limit(features, dtype)})


@dataclass
class DegreeStats:
    """Summary of one degree array (percentiles with linear interpolation, as numpy's).

    top1pct_edge_share: the degrees of the floor(N / 100) nodes of largest
    degree (at least one node) over the sum of all degrees.
    """

    min: int
    median: float
    mean: float
    p90: float
    p99: float
    max: int
    top1pct_edge_share: float


@dataclass
class DegreeHistogram:
    """Log2-binned degree counts. Bin 0 holds degree 0; bin b >= 1 holds degrees [2^(b-1), 2^b - 1].

    lower/upper: int [B] inclusive degree bounds of each bin; in_count/out_count: int [B].
    """

    lower: list[int]
    upper: list[int]
    in_count: list[int]
    out_count: list[int]


@dataclass
class ScheduleCounts:
    """How many target rows (by in-degree) exceed each schedule threshold at a feature width and dtype."""

    features: int
    dtype: str
    shared_memory_row_limit: int
    rows_over_warp_limit: int
    rows_over_split_limit: int
    rows_over_shared_memory: int


@dataclass
class DegreeProfile:
    """undirected_degree: degrees of the symmetrised simple graph (each neighbour counted once
    whatever the direction, self-loops dropped); None for bipartite graphs."""

    num_nodes: int
    num_edges: int
    isolated_nodes: int
    in_degree: DegreeStats
    out_degree: DegreeStats
    undirected_degree: Optional[DegreeStats]
    histogram: DegreeHistogram
    schedule: ScheduleCounts
    locality: LocalityMetrics


@numba.njit(cache=True)
def _undirected_degree(csr_indptr, csr_indices, csc_indptr, csc_indices):
    n = csr_indptr.shape[0] - 1
    last_seen_by = np.full(n, -1, dtype=np.int64)
    degree = np.zeros(n, dtype=np.int64)
    for u in range(n):
        for side in range(2):
            indptr_side = csr_indptr if side == 0 else csc_indptr
            indices_side = csr_indices if side == 0 else csc_indices
            for k in range(indptr_side[u], indptr_side[u + 1]):
                v = indices_side[k]
                if v != u and last_seen_by[v] != u:
                    last_seen_by[v] = u
                    degree[u] += 1
    return degree


def undirected_degree(graph: Graph) -> np.ndarray:
    """int64 [N]: distinct neighbours of each node over in- and out-edges, self-loops not counted."""
    graph = graph.to("cpu")
    return _undirected_degree(
        graph.csr_indptr.numpy(), graph.csr_indices.numpy(), graph.csc_indptr.numpy(), graph.csc_indices.numpy()
    )


def degree_stats(degree: np.ndarray) -> DegreeStats:
    """Summary of an int degree array [N]; an empty array gives all zeros."""
    if degree.size == 0:
        return DegreeStats(0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
    median, p90, p99 = np.percentile(degree, [50, 90, 99])
    total = int(degree.sum())
    top = max(1, int(TOP_SHARE_FRACTION * degree.size))
    top_sum = int(np.partition(degree, degree.size - top)[degree.size - top :].sum())
    return DegreeStats(
        min=int(degree.min()),
        median=float(median),
        mean=float(total / degree.size),
        p90=float(p90),
        p99=float(p99),
        max=int(degree.max()),
        top1pct_edge_share=top_sum / total if total else 0.0,
    )


def log2_bin(degree: np.ndarray) -> np.ndarray:
    """Histogram bin of each degree: 0 for 0, else its bit length (floor(log2 d) + 1)."""
    return np.frexp(degree.astype(np.float64))[1].astype(np.int64)


def degree_histogram(in_degree: np.ndarray, out_degree: np.ndarray) -> DegreeHistogram:
    in_bins, out_bins = log2_bin(in_degree), log2_bin(out_degree)
    num_bins = int(max(in_bins.max(initial=0), out_bins.max(initial=0))) + 1
    bins = np.arange(num_bins)
    return DegreeHistogram(
        lower=[0] + [int(2 ** (b - 1)) for b in bins[1:]],
        upper=[0] + [int(2**b - 1) for b in bins[1:]],
        in_count=np.bincount(in_bins, minlength=num_bins).tolist(),
        out_count=np.bincount(out_bins, minlength=num_bins).tolist(),
    )


def schedule_counts(in_degree: np.ndarray, features: int, dtype: str) -> ScheduleCounts:
    limit = shared_memory_row_limit(features, dtype)
    return ScheduleCounts(
        features=features,
        dtype=dtype,
        shared_memory_row_limit=limit,
        rows_over_warp_limit=int(np.count_nonzero(in_degree > WARP_ROW_LIMIT)),
        rows_over_split_limit=int(np.count_nonzero(in_degree > SPLIT_ROW_LIMIT)),
        rows_over_shared_memory=int(np.count_nonzero(in_degree > limit)),
    )


def degree_profile(graph: Graph, cache: CacheModel = CacheModel()) -> DegreeProfile:
    """Profile `graph` (any device; computed on CPU). Feature width and dtype come from `cache`.

    Isolated nodes have neither in- nor out-edges (a self-loop counts as both).
    """
    graph = graph.to("cpu")
    in_degree = graph.in_degree.numpy()
    out_degree = graph.out_degree.numpy()
    n = graph.num_nodes
    padded_in = np.zeros(n, dtype=np.int64)
    padded_in[: in_degree.size] = in_degree
    padded_out = np.zeros(n, dtype=np.int64)
    padded_out[: out_degree.size] = out_degree
    return DegreeProfile(
        num_nodes=n,
        num_edges=graph.num_edges,
        isolated_nodes=int(np.count_nonzero((padded_in == 0) & (padded_out == 0))),
        in_degree=degree_stats(in_degree),
        out_degree=degree_stats(out_degree),
        undirected_degree=None if graph.is_bipartite else degree_stats(undirected_degree(graph)),
        histogram=degree_histogram(in_degree, out_degree),
        schedule=schedule_counts(in_degree, cache.features, cache.dtype),
        locality=locality(graph, cache=cache),
    )
