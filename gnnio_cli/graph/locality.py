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
def _walk(indptr, indices, num_sources, new_to_old, old_to_new, relabel, rows_per_entry, capacity):
    """One pass over the access trace: (gap counts int64 [max gap + 1], LRU hits).

    The trace visits targets in new id order and their CSR slots in order; with
    `relabel` False the permutation arrays are not read. The LRU is exact: a
    doubly linked list over cache entries in arrays (O(1) per access), its links
    in the index dtype so the lists stay small enough to live in CPU caches.
    """
    num_rows = indptr.shape[0] - 1
    gap_counts = np.zeros(max(num_sources, num_rows) + 1, dtype=np.int64)
    num_entries = (num_sources + rows_per_entry - 1) // rows_per_entry
    newer = np.full(num_entries, -1, dtype=indices.dtype)  # towards the most recently used end
    older = np.full(num_entries, -1, dtype=indices.dtype)
    cached = np.zeros(num_entries, dtype=np.bool_)
    most_recent = -1
    least_recent = -1
    size = 0
    hits = 0
    for target in range(num_rows):
        old_target = new_to_old[target] if relabel else target
        for slot in range(indptr[old_target], indptr[old_target + 1]):
            source = old_to_new[indices[slot]] if relabel else indices[slot]
            gap_counts[abs(target - source)] += 1
            entry = source // rows_per_entry
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
    return gap_counts, hits


def _median_from_counts(counts: np.ndarray, total: int) -> float:
    """Median of a multiset of integers given as counts per value (np.median's convention for even sizes)."""
    cumulative = np.cumsum(counts)
    low = int(np.searchsorted(cumulative, (total - 1) // 2, side="right"))
    high = int(np.searchsorted(cumulative, total // 2, side="right"))
    return (low + high) / 2.0


def _order_arrays(graph: Graph, new_to_old: Optional[np.ndarray]):
    n = graph.num_nodes
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
    num_edges = graph.num_edges
    if num_edges == 0:
        return LocalityMetrics(0, 0.0, 0.0, 0.0, 0.0)
    relabel = new_to_old is not None
    if relabel:
        new_to_old, old_to_new = _order_arrays(graph, new_to_old)
    else:
        new_to_old = old_to_new = np.zeros(0, dtype=np.int64)
    gap_counts, hits = _walk(
        graph.csr_indptr.numpy(), graph.csr_indices.numpy(), graph.num_src_nodes, new_to_old, old_to_new, relabel,
        cache.rows_per_entry, cache.capacity_entries,
    )
    gaps = np.flatnonzero(gap_counts)
    counts = gap_counts[gaps]
    return LocalityMetrics(
        bandwidth=int(gaps[-1]),
        mean_gap=float(counts @ gaps.astype(np.float64) / num_edges),
        median_gap=_median_from_counts(gap_counts, num_edges),
        mean_log2_gap=float(counts @ np.log2(1.0 + gaps) / num_edges),
        cache_hit_rate=float(hits / num_edges),
    )


def random_order(num_nodes: int, seed: int) -> np.ndarray:
    """The seeded random relabelling used as every table's control: new_to_old int64 [N]."""
    return np.random.default_rng(seed).permutation(num_nodes).astype(np.int64)
