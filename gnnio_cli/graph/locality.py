"""How well a node order keeps an aggregation's memory traffic local, measured without a GPU.

A GNN aggregation walks target rows (the CSR, rows = targets) and gathers one
feature row per in-neighbour (source). Two kinds of measure describe how a node
order serves that walk:

- **gaps** between the ids at both ends of each edge, |target - source|:
  bandwidth (the largest gap), mean and median gap, and the mean of
  log2(1 + gap), which weighs a gap of 10 against 1000 the way a cache does;
- **a cache simulation**: target rows processed in increasing id, their
  in-neighbours in CSR slot order, each gathered source row looked up in an LRU
  cache the size of the GPU's L2. The hit rate is the fraction of row loads
  served by the cache (cold misses included).

Cache entries: one entry holds one source feature row, ``features * dtype bytes``
rounded up to whole 128-byte lines (the granularity at which L2 is filled).
Rows narrower than a line share it with the rows beside them by id (a line
holds ``128 // row_bytes`` consecutive rows), so for narrow rows the labels,
not only the visiting order, decide hits. Only source gathers are counted:
the target row is written once per row whatever the order. The model ignores
that a GPU runs many rows at once; it ranks orders, it does not predict times.

Every measure can be taken on the graph relabelled by a permutation without
building the relabelled graph (`new_to_old`), which is how the random order and
candidate orders are compared cheaply. All passes are O(E + N) numba loops:
about a second for 16M edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numba
import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.graph import Graph

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CACHE_LINE_BYTES = 128
DEFAULT_L2_MB = 50.0


def dtype_bytes(dtype: str) -> int:
    """Bytes per feature element for a dtype name ('fp32', 'bf16', 'fp16')."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise GnnioError(f"--dtype: unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class CacheModel:
    """The simulated cache: an LRU of `l2_mb` MiB holding feature rows of `features` x `dtype`."""

    features: int = 128
    dtype: str = "fp32"
    l2_mb: float = DEFAULT_L2_MB

    def __post_init__(self):
        if self.features < 1:
            raise GnnioError(f"--features: must be at least 1, got {self.features}")
        if not self.l2_mb > 0:
            raise GnnioError(f"--l2-mb: must be positive, got {self.l2_mb}")
        dtype_bytes(self.dtype)

    @property
    def row_bytes(self) -> int:
        return self.features * dtype_bytes(self.dtype)

    @property
    def rows_per_entry(self) -> int:
        """Consecutive node ids sharing one cache entry (more than 1 only for rows narrower than a line)."""
        return max(1, CACHE_LINE_BYTES // self.row_bytes)

    @property
    def entry_bytes(self) -> int:
        raw = self.rows_per_entry * self.row_bytes
        return -(-raw // CACHE_LINE_BYTES) * CACHE_LINE_BYTES

    @property
    def capacity_entries(self) -> int:
        return max(1, int(self.l2_mb * 2**20) // self.entry_bytes)


@dataclass
class LocalityMetrics:
    """Locality of one node order over all E edges (gaps are |target id - source id|).

    cache_hit_rate is the LRU simulation's fraction of source-row loads that hit;
    NaN-free: an edgeless graph has all gaps 0 and hit rate 0.
    """

    bandwidth: int
    mean_gap: float
    median_gap: float
    mean_log2_gap: float
    cache_hit_rate: float


@numba.njit(cache=True)
def _gap_statistics(indptr, indices, new_to_old, old_to_new):
    """(bandwidth, sum gap, sum log2(1+gap), gap counts [N]) over edges in the relabelled order."""
    num_rows = indptr.shape[0] - 1
    gap_counts = np.zeros(max(old_to_new.shape[0], num_rows) + 1, dtype=np.int64)
    bandwidth = 0
    gap_sum = 0.0
    log_gap_sum = 0.0
    for target in range(num_rows):
        old_target = new_to_old[target]
        for slot in range(indptr[old_target], indptr[old_target + 1]):
            gap = abs(target - old_to_new[indices[slot]])
            gap_counts[gap] += 1
            if gap > bandwidth:
                bandwidth = gap
            gap_sum += gap
            log_gap_sum += np.log2(1.0 + gap)
    return bandwidth, gap_sum, log_gap_sum, gap_counts


def _median_from_counts(counts: np.ndarray, total: int) -> float:
    """Median of a multiset of integers given as counts per value (np.median's convention for even sizes)."""
    cumulative = np.cumsum(counts)
    low = int(np.searchsorted(cumulative, (total - 1) // 2, side="right"))
    high = int(np.searchsorted(cumulative, total // 2, side="right"))
    return (low + high) / 2.0


@numba.njit(cache=True)
def _lru_hits(indptr, indices, new_to_old, old_to_new, rows_per_entry, capacity):
    """Hits of an exact LRU over cache entries (doubly linked list in arrays, O(1) per access)."""
    num_rows = indptr.shape[0] - 1
    num_entries = (old_to_new.shape[0] + rows_per_entry - 1) // rows_per_entry
    newer = np.full(num_entries, -1, dtype=np.int64)  # towards the most recently used end
    older = np.full(num_entries, -1, dtype=np.int64)
    cached = np.zeros(num_entries, dtype=np.bool_)
    most_recent = -1
    least_recent = -1
    size = 0
    hits = 0
    for target in range(num_rows):
        old_target = new_to_old[target]
        for slot in range(indptr[old_target], indptr[old_target + 1]):
            entry = old_to_new[indices[slot]] // rows_per_entry
            if cached[entry]:
                hits += 1
                if entry == most_recent:
                    continue
                # unlink, then fall through to the push to the front
                if older[entry] != -1:
                    newer[older[entry]] = newer[entry]
                else:
                    least_recent = newer[entry]
                older[newer[entry]] = older[entry]
            else:
                cached[entry] = True
                size += 1
                if size > capacity:
                    evicted = least_recent
                    least_recent = newer[evicted]
                    if least_recent != -1:
                        older[least_recent] = -1
                    else:
                        most_recent = -1
                    cached[evicted] = False
                    size -= 1
            newer[entry] = -1
            older[entry] = most_recent
            if most_recent != -1:
                newer[most_recent] = entry
            most_recent = entry
            if least_recent == -1:
                least_recent = entry
    return hits


def _order_arrays(graph: Graph, new_to_old: Optional[np.ndarray]):
    n = graph.num_nodes
    if new_to_old is None:
        identity = np.arange(n, dtype=np.int64)
        return identity, identity
    new_to_old = np.ascontiguousarray(new_to_old, dtype=np.int64)
    if new_to_old.shape != (n,):
        raise GnnioError(f"locality: permutation has {new_to_old.size} entries, graph has {n} nodes")
    old_to_new = np.empty_like(new_to_old)
    old_to_new[new_to_old] = np.arange(n, dtype=np.int64)
    return new_to_old, old_to_new


def locality(graph: Graph, new_to_old: Optional[np.ndarray] = None, cache: CacheModel = CacheModel()) -> LocalityMetrics:
    """Locality metrics of `graph` as it stands, or relabelled so that new node i is old node new_to_old[i].

    Deterministic. The relabelled graph is never built: rows are visited in new
    id order and ids mapped on the fly. Bipartite graphs are measured as stored
    (source and target ids compared as numbers).
    """
    if graph.is_bipartite and new_to_old is not None:
        raise GnnioError("locality: bipartite graphs cannot be relabelled with one permutation")
    graph = graph.to("cpu")
    indptr = graph.csr_indptr.numpy()
    indices = graph.csr_indices.numpy()
    if graph.is_bipartite:
        new_to_old = np.arange(graph.num_dst_nodes, dtype=np.int64)
        old_to_new = np.arange(graph.num_src_nodes, dtype=np.int64)
    else:
        new_to_old, old_to_new = _order_arrays(graph, new_to_old)
    num_edges = graph.num_edges
    if num_edges == 0:
        return LocalityMetrics(0, 0.0, 0.0, 0.0, 0.0)
    bandwidth, gap_sum, log_gap_sum, gap_counts = _gap_statistics(indptr, indices, new_to_old, old_to_new)
    hits = _lru_hits(indptr, indices, new_to_old, old_to_new, cache.rows_per_entry, cache.capacity_entries)
    return LocalityMetrics(
        bandwidth=int(bandwidth),
        mean_gap=float(gap_sum / num_edges),
        median_gap=_median_from_counts(gap_counts, num_edges),
        mean_log2_gap=float(log_gap_sum / num_edges),
        cache_hit_rate=float(hits / num_edges),
    )


def random_order(num_nodes: int, seed: int) -> np.ndarray:
    """The seeded random relabelling used as every table's control: new_to_old int64 [N]."""
    return np.random.default_rng(seed).permutation(num_nodes).astype(np.int64)
