"""Rabbit order: the symmetrised pattern, community recovery on planted partitions, contiguous numbering."""

from collections import Counter

import numpy as np
import pytest

from perf.reorder_study_cpu import planted_partition
from gnnio_cli.graph import Graph
from gnnio_cli.graph.locality import CacheModel, locality, random_order
from gnnio_cli.graph.rabbit import rabbit_communities, rabbit_dendrogram, rabbit_order, symmetric_adjacency
from tests.testing import edge_list, random_graph


def modularity(graph: Graph, community: np.ndarray) -> float:
    """Newman modularity of a partition of the symmetrised multigraph (self-loops dropped), from the edge list."""
    edges = [(s, t) for s, t in edge_list(graph) if s != t]
    two_m = 2 * len(edges)
    inside = sum(2 for s, t in edges if community[s] == community[t])
    degree = Counter()
    for s, t in edges:
        degree[community[s]] += 1
        degree[community[t]] += 1
    return inside / two_m - sum(d * d for d in degree.values()) / two_m**2


def from_pairs(pairs, num_nodes):
    src, dst = np.array(pairs, dtype=np.int64).T
    return Graph.from_arrays(src, dst, num_nodes, num_nodes)


def test_symmetric_adjacency_matches_brute_force():
    graph = random_graph(60, 400, hub_degree=40, seed=21)  # loops and duplicates included
    indptr, neighbours, weights = symmetric_adjacency(graph)
    expected = Counter()
    for s, t in edge_list(graph):
        if s != t:
            expected[(s, t)] += 1
            expected[(t, s)] += 1
    got = {(u, int(v)): int(w) for u in range(60) for v, w in zip(neighbours[indptr[u]:indptr[u + 1]], weights[indptr[u]:indptr[u + 1]])}
    assert got == dict(expected)
    assert all(len(set(neighbours[indptr[u]:indptr[u + 1]].tolist())) == indptr[u + 1] - indptr[u] for u in range(60))


def test_two_cliques_and_a_star():
    # clique {0..4} and clique {5..9} joined by one edge; a star centred on 10 with leaves 11..15; 16 isolated
    pairs = [(a, b) for group in (range(5), range(5, 10)) for a in group for b in group if a < b]
    pairs += [(4, 5)] + [(leaf, 10) for leaf in range(11, 16)]
    graph = from_pairs(pairs, 17)
    community = rabbit_communities(graph)
    assert len(set(community[:5])) == len(set(community[5:10])) == len(set(community[10:16])) == 1
    assert len({community[0], community[5], community[10], community[16]}) == 4
    order = rabbit_order(graph)
    assert np.array_equal(np.sort(order), np.arange(17))
    labels = community[order]  # each community is one run of consecutive new ids
    runs = labels[np.r_[True, labels[1:] != labels[:-1]]]
    assert len(runs) == len(set(runs.tolist())) == 4


def test_recovers_planted_communities():
    graph, planted = planted_partition(100, 100, intra_degree=10.0, inter_degree=2.0, seed=3)
    planted_label = np.empty(graph.num_nodes, dtype=np.int64)
    planted_label[planted] = np.arange(graph.num_nodes) // 100
    found = rabbit_communities(graph)
    assert modularity(graph, found) >= 0.9 * modularity(graph, planted_label)
    # greedy merging may join a few planted communities into one, but does not split them
    kept_together = sum(Counter(found[planted_label == p].tolist()).most_common(1)[0][1] for p in range(100))
    assert kept_together / graph.num_nodes >= 0.9
    cache = CacheModel(features=32, dtype="fp32", l2_mb=1000 * 128 / 2**20)  # ten communities' rows
    rabbit_rate = locality(graph, rabbit_order(graph), cache).cache_hit_rate
    planted_rate = locality(graph, planted, cache).cache_hit_rate
    random_rate = locality(graph, random_order(graph.num_nodes, 0), cache).cache_hit_rate
    assert rabbit_rate >= 0.9 * planted_rate and rabbit_rate >= 3 * random_rate


def test_deterministic_and_edge_cases():
    graph = random_graph(300, 2000, hub_degree=250, seed=22)
    first = rabbit_order(graph)
    assert np.array_equal(first, rabbit_order(graph)) and np.array_equal(np.sort(first), np.arange(300))
    empty = Graph.from_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 4, 4)
    assert np.array_equal(rabbit_order(empty), np.arange(4))
    loops_only = from_pairs([(0, 0), (1, 1)], 3)
    assert np.array_equal(rabbit_order(loops_only), np.arange(3))


@pytest.mark.parametrize("seed", [0, 1])
def test_every_subtree_gets_a_contiguous_range(seed):
    graph, _ = planted_partition(20, 30, intra_degree=8.0, inter_degree=0.5, seed=seed)
    parent = rabbit_dendrogram(graph)
    new_id = np.argsort(rabbit_order(graph))
    subtree_ids = {v: [int(new_id[v])] for v in range(graph.num_nodes)}
    for v in range(graph.num_nodes):
        ancestor = parent[v]
        while ancestor != -1:
            subtree_ids[ancestor].append(int(new_id[v]))
            ancestor = parent[ancestor]
    assert (parent >= 0).sum() > graph.num_nodes // 2  # a real hierarchy, not singletons
    for v, ids in subtree_ids.items():  # the node itself first, then its descendants right after it
        assert min(ids) == new_id[v] and max(ids) - min(ids) + 1 == len(ids)
