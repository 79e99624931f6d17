"""Node reordering: compute an order, apply it to a stored graph, and measure what it bought.

Methods (`reorder(graph, method, seed)`; each returns a `Permutation` whose
new_to_old[i] is the old id of new node i, timed in `seconds`):

- ``none``: the identity (the current order, as a baseline);
- ``random``: a seeded random relabelling, the control every table shows;
- ``degree``: hubs first, by in + out degree descending, ties by id;
- ``hub-sort``: nodes with degree above the mean first, sorted by degree
  descending; the rest keep their relative order (keeps the existing locality
  of the many light nodes while packing the hot rows together);
- ``hub-cluster``: the same split without sorting the hubs;
- ``rcm``: reverse Cuthill-McKee (scipy) on the symmetrised pattern: small
  bandwidth on mesh-like graphs;
- ``rabbit``: Rabbit order, community-based (see `gnnio_cli.graph.rabbit`).

`reorder_stored` applies an order to a `StoredGraph`: the graph is relabelled
(edge ids keep their meaning), node-level features (arrays whose first axis
has N entries) are permuted alongside, the order is added under
/perm/<method> (mapping the input file's ids to the output's), and
earlier /perm entries are kept as written (each maps the ids of the file it was
computed on). Blocked formats describe one order, so the input's are dropped
and rebuilt on request.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.blocked import BlockReport, blocked_arrays, block_report, tiles_kind
from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.locality import CacheModel, LocalityMetrics, locality, random_order
from gnnio_cli.graph.rabbit import rabbit_order, symmetric_adjacency
from gnnio_cli.graph.store import Permutation, StoredGraph


def _total_degree(graph: Graph) -> np.ndarray:
    return (graph.in_degree + graph.out_degree).numpy()


def identity_order(graph: Graph, seed: int) -> np.ndarray:
    return np.arange(graph.num_nodes, dtype=np.int64)


def seeded_random_order(graph: Graph, seed: int) -> np.ndarray:
    return random_order(graph.num_nodes, seed)


def degree_order(graph: Graph, seed: int) -> np.ndarray:
    return np.argsort(-_total_degree(graph), kind="stable").astype(np.int64)


def _hub_split(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    degree = _total_degree(graph)
    is_hub = degree > degree.mean()
    return degree, np.flatnonzero(is_hub), np.flatnonzero(~is_hub)


def hub_sort_order(graph: Graph, seed: int) -> np.ndarray:
    degree, hubs, rest = _hub_split(graph)
    hubs = hubs[np.argsort(-degree[hubs], kind="stable")]
    return np.concatenate([hubs, rest]).astype(np.int64)


def hub_cluster_order(graph: Graph, seed: int) -> np.ndarray:
    _, hubs, rest = _hub_split(graph)
    return np.concatenate([hubs, rest]).astype(np.int64)


def rcm_order(graph: Graph, seed: int) -> np.ndarray:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    indptr, neighbours, _ = symmetric_adjacency(graph)
    n = graph.num_nodes
    index_type = np.int32 if neighbours.size < 2**31 and n < 2**31 else np.int64
    pattern = csr_matrix(
        (np.ones(neighbours.size, dtype=np.int8), neighbours.astype(index_type), indptr.astype(index_type)), shape=(n, n)
    )
    return np.asarray(reverse_cuthill_mckee(pattern, symmetric_mode=True), dtype=np.int64)


def rabbit(graph: Graph, seed: int) -> np.ndarray:
    return rabbit_order(graph)


METHODS: dict[str, Callable[[Graph, int], np.ndarray]] = {
    "none": identity_order,
    "random": seeded_random_order,
    "degree": degree_order,
    "hub-sort": hub_sort_order,
    "hub-cluster": hub_cluster_order,
    "rcm": rcm_order,
    "rabbit": rabbit,
}


def reorder(graph: Graph, method: str, seed: int = 0) -> Permutation:
    """A node order of `graph` by `method` (see module docstring), timed; `seed` matters only for 'random'."""
    if method not in METHODS:
        raise GnnioError(f"--method: unknown reordering {method!r}; choose one of {', '.join(METHODS)}")
    if graph.is_bipartite:
        raise GnnioError("reorder: bipartite graphs cannot be relabelled with one permutation")
    graph = graph.to("cpu")
    start = time.perf_counter()
    new_to_old = METHODS[method](graph, seed) if graph.num_nodes else np.zeros(0, dtype=np.int64)
    return Permutation(method=method, new_to_old=new_to_old, seconds=time.perf_counter() - start)


def warm_up(method: str) -> None:
    """Run `method` once on a small ring so that its one-time costs (numba compilation, scipy imports) are paid
    here, untimed: a study's reorder times are then what a process that already ordered a graph pays."""
    ring = np.arange(64, dtype=np.int64)
    reorder(Graph.from_edge_index(np.stack([ring, np.roll(ring, 1)]), 64), method)


def permute_features(features: dict[str, np.ndarray], new_to_old: np.ndarray) -> dict[str, np.ndarray]:
    """Node-level arrays (first axis of length N) relabelled; any other array kept as is."""
    n = new_to_old.size
    return {name: value[new_to_old] if value.ndim and value.shape[0] == n else value for name, value in features.items()}


@dataclass
class ReorderReport:
    """What `reorder_stored` did: locality of the input order, the new order and the random control."""

    method: str
    seed: int
    cache: CacheModel
    reorder_seconds: float
    apply_seconds: float
    input_order: LocalityMetrics
    new_order: LocalityMetrics
    random_order: LocalityMetrics
    blocked: Optional[BlockReport] = None
    dropped_blocked: list[str] = field(default_factory=list)


def reorder_stored(
    stored: StoredGraph, method: str, seed: int = 0, cache: CacheModel = CacheModel(), block: Optional[int] = None
) -> tuple[StoredGraph, ReorderReport]:
    """Reorder `stored` by `method`; returns the new StoredGraph (not yet written) and a report.

    The permutation's metrics (stored in the file) hold the report's locality
    tables and cache model.
    """
    graph = stored.graph.to("cpu")
    input_order = locality(graph, cache=cache)
    random_control = locality(graph, random_order(graph.num_nodes, seed), cache=cache)
    perm = reorder(graph, method, seed)
    start = time.perf_counter()
    new_graph = graph.permute(perm.new_to_old)
    features = permute_features(stored.features, perm.new_to_old)
    blocked, tiles_report = {}, None
    if block is not None:
        blocked = blocked_arrays(new_graph, block, cache.features, cache.dtype)
        tiles_report = block_report(blocked[tiles_kind(block)])
    apply_seconds = time.perf_counter() - start
    new_order = locality(new_graph, cache=cache)
    report = ReorderReport(
        method=method,
        seed=seed,
        cache=cache,
        reorder_seconds=perm.seconds,
        apply_seconds=apply_seconds,
        input_order=input_order,
        new_order=new_order,
        random_order=random_control,
        blocked=tiles_report,
        dropped_blocked=sorted(set(stored.blocked) - set(blocked)),
    )
    perm.metrics = {
        "seed": seed,
        "cache": asdict(cache),
        "input_order": asdict(input_order),
        "new_order": asdict(new_order),
        "random_order": asdict(random_control),
    }
    output = replace(stored, graph=new_graph, perms={**stored.perms, method: perm}, features=features, blocked=blocked)
    return output, report
