"""Rabbit order (Arai et al., IPDPS 2016): community-based node ordering, sequential, in numba.

The graph is read as undirected and weighted: the weight between u and v is the
number of edges u -> v plus v -> u; self-loops are dropped. Two phases:

1. **Community detection by incremental aggregation.** Every vertex starts as
   its own community. Vertices are visited once each, in increasing degree.
   Visiting u first aggregates its edges: u's own edges plus the aggregated
   edges of every community merged into u before this visit, each endpoint
   mapped to the community that now holds it (union-find), weights of equal
   endpoints summed, edges inside u dropped. Then u is merged into the
   neighbouring community v with the largest modularity gain

       dQ(u, v) = 2 * (w_uv / 2m - d_u * d_v / (2m)^2)

   (d = total weight of a community's members, 2m = total weight), provided the
   gain is positive; otherwise u stays a top-level community. A merged u hands
   its aggregated edge list to v, to be folded in when v is visited (or never,
   if v was already visited: its own decision is made).
2. **Ordering.** The merges form a dendrogram (u is a child of the community it
   merged into, children in merge order). A depth-first pre-order walk from each
   top-level community, in visit order, numbers the vertices, so every
   community and each of its sub-communities gets a contiguous id range.

Deterministic; O(E) aggregation work per level of the dendrogram in the worst
case, near-linear in practice.
"""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np

from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.profile import undirected_degree


@numba.njit(cache=True)
def _symmetric_adjacency(csr_indptr, csr_indices, csc_indptr, csc_indices, indptr, order, rank, relabel):
    """Fill the undirected simple adjacency whose row pointers `indptr` [N+1] are known.

    With `relabel`, row i is node order[i] and every neighbour v is written as
    rank[v] (rank = inverse of order); otherwise ids are kept and order/rank unread.
    Returns neighbours [S] (the index dtype of the input: int32 keeps the random
    accesses of the passes below in cache) and multiplicity int32 [S] (how many
    directed edges join the pair, in either direction).
    """
    n = indptr.shape[0] - 1
    neighbours = np.empty(indptr[n], dtype=csr_indices.dtype)
    weights = np.empty(indptr[n], dtype=np.int32)
    slot_of = np.full(n, -1, dtype=np.int64)
    for row in range(n):
        u = order[row] if relabel else row
        position = indptr[row]
        for side in range(2):
            indptr_side = csr_indptr if side == 0 else csc_indptr
            indices_side = csr_indices if side == 0 else csc_indices
            for k in range(indptr_side[u], indptr_side[u + 1]):
                v = indices_side[k]
                if v == u:
                    continue
                slot = slot_of[v]
                if slot >= indptr[row]:
                    weights[slot] += 1
                else:
                    slot_of[v] = position
                    neighbours[position] = rank[v] if relabel else v
                    weights[position] = 1
                    position += 1
    return neighbours, weights


def symmetric_adjacency(graph: Graph, order: Optional[np.ndarray] = None):
    """The undirected simple pattern of `graph` (in- and out-neighbours merged, self-loops dropped).

    Returns (indptr int64 [N+1], neighbours [S], multiplicity int32 [S]); rows
    list neighbours in first-seen order (in-neighbours, then out-neighbours).
    With `order` (int64 [N]), nodes are renumbered on the way: row i is node
    order[i] and neighbours are given by their position in `order`.
    """
    graph = graph.to("cpu")
    row_length = undirected_degree(graph)
    relabel = order is not None
    if relabel:
        row_length = row_length[order]
        rank = np.empty(order.size, dtype=graph.csr_indices.numpy().dtype)
        rank[order] = np.arange(order.size)
    else:
        order = rank = np.zeros(0, dtype=np.int64)
    indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(row_length, out=indptr[1:])
    neighbours, weights = _symmetric_adjacency(
        graph.csr_indptr.numpy(), graph.csr_indices.numpy(), graph.csc_indptr.numpy(), graph.csc_indices.numpy(),
        indptr, order, rank, relabel,
    )
    return indptr, neighbours, weights


@numba.njit(cache=True)
def _self_loops(indptr, indices):
    """int64 [N]: self-loops of each node (CSR rows)."""
    loops = np.zeros(indptr.shape[0] - 1, dtype=np.int64)
    for u in range(loops.shape[0]):
        for k in range(indptr[u], indptr[u + 1]):
            if indices[k] == u:
                loops[u] += 1
    return loops


@numba.njit(cache=True)
def _find(community, v):
    """Root of v's community, compressing the path on the way."""
    root = v
    while community[root] != root:
        root = community[root]
    while community[v] != root:
        following = community[v]
        community[v] = root
        v = following
    return root


@numba.njit(cache=True)
def _aggregate(u, targets, weights, start, stop, community, link_weight, linked, num_linked):
    """Add edges targets/weights[start:stop] of u to link_weight by the community now holding each target.

    Edges inside u are dropped; communities seen for the first time are appended
    to `linked`. Returns the new length of `linked`.
    """
    for k in range(start, stop):
        r = _find(community, targets[k])
        if r != u:
            if link_weight[r] == 0:
                linked[num_linked] = r
                num_linked += 1
            link_weight[r] += weights[k]
    return num_linked


@numba.njit(cache=True)
def _visit_order(degree):
    """Vertices by increasing degree, ties by id (a counting sort)."""
    counts = np.zeros((degree.max() if degree.shape[0] else 0) + 2, dtype=np.int64)
    for d in degree:
        counts[d + 1] += 1
    for i in range(counts.shape[0] - 1):
        counts[i + 1] += counts[i]
    order = np.empty(degree.shape[0], dtype=np.int64)
    for v in range(degree.shape[0]):
        order[counts[degree[v]]] = v
        counts[degree[v]] += 1
    return order


@numba.njit(cache=True)
def _rabbit_dendrogram(indptr, neighbours, weights):
    """Phase 1: returns (parent [N], first_child [N], next_sibling [N]); parent -1 marks a top-level community.

    Sums of weights between communities are held in `weights`' dtype: the caller
    widens it when the total weight could overflow it.
    """
    n = indptr.shape[0] - 1
    degree = np.zeros(n, dtype=np.int64)
    for u in range(n):
        for k in range(indptr[u], indptr[u + 1]):
            degree[u] += weights[k]
    total_weight = float(degree.sum())
    community = np.empty(n, dtype=neighbours.dtype)
    for v in range(n):
        community[v] = v
    parent = np.full(n, -1, dtype=np.int64)
    first_child = np.full(n, -1, dtype=np.int64)
    last_child = np.full(n, -1, dtype=np.int64)
    next_sibling = np.full(n, -1, dtype=np.int64)
    visited = np.zeros(n, dtype=np.bool_)
    community_degree = degree.copy()
    # aggregated edge lists handed up by merged vertices, read when their parent is visited
    handed_start = np.full(n, -1, dtype=np.int64)
    handed_length = np.zeros(n, dtype=np.int64)
    pool_neighbours = np.empty(max(16, neighbours.shape[0] // 2), dtype=neighbours.dtype)
    pool_weights = np.empty(pool_neighbours.shape[0], dtype=weights.dtype)
    pool_size = 0
    link_weight = np.zeros(n, dtype=weights.dtype)
    linked = np.empty(n, dtype=np.int64)
    if total_weight == 0.0:
        return parent, first_child, next_sibling
    for u in _visit_order(degree):
        visited[u] = True
        num_linked = _aggregate(u, neighbours, weights, indptr[u], indptr[u + 1], community, link_weight, linked, 0)
        child = first_child[u]
        while child != -1:
            start = handed_start[child]
            if start >= 0:
                num_linked = _aggregate(u, pool_neighbours, pool_weights, start, start + handed_length[child],
                                        community, link_weight, linked, num_linked)
            child = next_sibling[child]
        best = -1
        best_gain = 0.0
        scaled_degree = community_degree[u] / total_weight
        for i in range(num_linked):
            r = linked[i]
            gain = link_weight[r] - scaled_degree * community_degree[r]
            if gain > best_gain:
                best_gain = gain
                best = r
        if best >= 0:
            community[u] = best
            parent[u] = best
            community_degree[best] += community_degree[u]
            if first_child[best] == -1:
                first_child[best] = u
            else:
                next_sibling[last_child[best]] = u
            last_child[best] = u
            if not visited[best]:
                if pool_size + num_linked > pool_neighbours.shape[0]:
                    grown = max(2 * pool_neighbours.shape[0], pool_size + num_linked)
                    more_neighbours = np.empty(grown, dtype=neighbours.dtype)
                    more_neighbours[:pool_size] = pool_neighbours[:pool_size]
                    pool_neighbours = more_neighbours
                    more_weights = np.empty(grown, dtype=weights.dtype)
                    more_weights[:pool_size] = pool_weights[:pool_size]
                    pool_weights = more_weights
                handed_start[u] = pool_size
                handed_length[u] = num_linked
                for i in range(num_linked):
                    pool_neighbours[pool_size + i] = linked[i]
                    pool_weights[pool_size + i] = link_weight[linked[i]]
                pool_size += num_linked
        for i in range(num_linked):
            link_weight[linked[i]] = 0
    return parent, first_child, next_sibling


@numba.njit(cache=True)
def _preorder_numbering(parent, first_child, next_sibling):
    """Phase 2: new_to_old [N] by a pre-order walk of each top-level community's subtree."""
    n = parent.shape[0]
    new_to_old = np.empty(n, dtype=np.int64)
    position = 0
    for root in range(n):
        if parent[root] != -1:
            continue
        node = root
        while True:
            new_to_old[position] = node
            position += 1
            if first_child[node] != -1:
                node = first_child[node]
                continue
            while node != root and next_sibling[node] == -1:
                node = parent[node]
            if node == root:
                break
            node = next_sibling[node]
    return new_to_old


def _dendrogram(graph: Graph):
    """Phase 1 on `graph` renumbered into visit order, so the hubs that most edges lead to
    sit together at the end of every per-node array and stay in CPU caches.

    Returns (order, parent, first_child, next_sibling): the tree arrays are in
    visit-rank space; order[rank] is the node id.
    """
    graph = graph.to("cpu")
    weighted_degree = (graph.in_degree + graph.out_degree).numpy() - 2 * _self_loops(
        graph.csr_indptr.numpy(), graph.csr_indices.numpy()
    )
    order = _visit_order(weighted_degree)
    indptr, neighbours, weights = symmetric_adjacency(graph, order)
    if int(weights.sum(dtype=np.int64)) >= 2**31:
        weights = weights.astype(np.int64)
    return (order, *_rabbit_dendrogram(indptr, neighbours, weights))


def rabbit_order(graph: Graph) -> np.ndarray:
    """Rabbit order of `graph`'s nodes: new_to_old int64 [N] (new node i is old node new_to_old[i])."""
    order, parent, first_child, next_sibling = _dendrogram(graph)
    return order[_preorder_numbering(parent, first_child, next_sibling)]


def rabbit_dendrogram(graph: Graph) -> np.ndarray:
    """The merge dendrogram: parent int64 [N], the node each node was merged into, -1 for top-level communities."""
    order, parent_by_rank, _, _ = _dendrogram(graph)
    parent = np.full(order.size, -1, dtype=np.int64)
    merged = parent_by_rank >= 0
    parent[order[merged]] = order[parent_by_rank[merged]]
    return parent


def rabbit_communities(graph: Graph) -> np.ndarray:
    """Top-level community of each node (the root of its dendrogram tree): int64 [N]."""
    parent = rabbit_dendrogram(graph)
    community = np.arange(parent.size)
    while True:
        lifted = np.where(parent[community] >= 0, parent[community], community)
        if np.array_equal(lifted, community):
            return community
        community = lifted
