"""The graphs a layer's self-loop rule makes of a graph, built where the graph lies and cached on it.

- :func:`replaced_self_loops`: every self-loop removed, then (i, i) appended for
  i < num_loops (PyG's ``remove_self_loops`` + ``add_self_loops`` of GAT,
  GATv2 and AGNN, and ``add_remaining_self_loops`` of GCN with num_loops = N);
- :func:`appended_self_loops`: (i, i) appended, existing loops kept (PyG's
  ``add_self_loops`` on a sparse adjacency, GCN);
- :func:`without_self_loops`: the loops removed;
- :func:`edge_messages_graph`: one source per edge (weighted max/min).

On a GPU these are device sorts of known size (graph.compress): the number of
loops a graph has is one of its facts (graph.schedule), so nothing is read back
where the graph's facts are known, and the derived graph's own facts come from
them where they follow (a loop-free graph with a loop appended to every node);
otherwise counting them is the one read. On the CPU the counting sorts of
graph.build run instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from gnnio_cli.graph.compress import Compressed, append_loops, compress, kept_positions
from gnnio_cli.graph.graph import Graph, index_dtype
from gnnio_cli.graph.schedule import GraphFacts, RowFacts, base_tile_length, measure


@dataclass(frozen=True)
class LoopedEdges:
    """A graph with its self-loops replaced by one loop per node i < num_loops, and how it maps back.

    graph:    edge ids: the kept (non-loop) edges in order, then the loops (i, i) for i = 0..num_loops-1,
              then (row_major) sorted by (target, source)
    kept_eid: int64 [E_kept]: original edge id of every kept edge, in order; None when every edge is kept
    order:    int64 [E_kept + num_loops] or None: the re-sort applied for row_major
    """

    graph: Graph
    kept_eid: Optional[Tensor]
    order: Optional[Tensor]

    def kept(self, per_edge: Tensor) -> Tensor:
        """The kept edges' rows of a per-edge tensor [E, ...] of the original graph, in order."""
        return _kept(per_edge, self.kept_eid)


def replaced_self_loops(graph: Graph, num_loops: int, row_major: bool = False) -> LoopedEdges:
    """`graph` with every self-loop removed and (i, i) appended for i < num_loops; cached on the graph."""
    return graph.cached(("gnnio.loops.replaced", num_loops, row_major),
                        lambda: _replaced(graph, num_loops, row_major))


def _replaced(graph: Graph, num_loops: int, row_major: bool) -> LoopedEdges:
    facts = graph.facts
    if facts.self_loops == 0 and not row_major and graph.device.type != "cpu":
        # nothing to remove: append the loops, and read no edge list (a batch graph builds it on demand)
        return LoopedEdges(_appended(graph, num_loops, num_loops), None, None)
    source, target = graph.edge_index()
    loops = facts.self_loops if facts.self_loops >= 0 else int((source == target).sum())
    kept = graph.num_edges - loops
    drop = source == target if loops else None
    kept_eid = kept_positions(drop, kept) if drop is not None else None
    if row_major:
        loops = torch.arange(num_loops, device=graph.device)
        new_source = torch.cat([_kept(source, kept_eid), loops])
        new_target = torch.cat([_kept(target, kept_eid), loops])
        order = torch.sort(new_target * max(graph.num_src_nodes, 1) + new_source, stable=True).indices
        looped = _derived(graph, new_source.index_select(0, order), new_target.index_select(0, order), None,
                          kept + num_loops, 0, None, num_loops)
        return LoopedEdges(looped, kept_eid, order)
    looped = _derived(graph, source, target, drop, kept, num_loops, None, num_loops)
    return LoopedEdges(looped, kept_eid, None)


def _kept(per_edge: Tensor, kept_eid: Optional[Tensor]) -> Tensor:
    """The kept edges' rows of a per-edge tensor (all of them where kept_eid is None)."""
    return per_edge if kept_eid is None else per_edge.index_select(0, kept_eid)


def appended_self_loops(graph: Graph, num_loops: int) -> Graph:
    """`graph` with (i, i) appended for i < num_loops, existing loops kept; edge ids: the original edges,
    then the new loops. Cached on the graph."""

    def build() -> Graph:
        loops = graph.facts.self_loops + num_loops if graph.facts.self_loops >= 0 else -1
        if graph.device.type != "cpu":
            return _appended(graph, num_loops, loops)
        source, target = graph.edge_index()
        return _derived(graph, source, target, None, graph.num_edges, num_loops, None, loops)

    return graph.cached(("gnnio.loops.appended", num_loops), build)


def _appended(graph: Graph, num_loops: int, self_loops: int) -> Graph:
    """`graph` with (i, i) appended for i < num_loops, on its device without a sort (compress.append_loops);
    its facts follow from the graph's own where every node gains a loop, else they are counted."""
    sides = [append_loops(graph.csr_indptr, graph.csr_indices, graph.csr_eid, min(num_loops, graph.num_dst_nodes)),
             append_loops(graph.csc_indptr, graph.csc_indices, graph.csc_eid, min(num_loops, graph.num_src_nodes))]
    whole = num_loops == graph.num_src_nodes == graph.num_dst_nodes
    facts = replace(graph.facts.looped, self_loops=self_loops) if whole and graph.facts.looped else None
    derived = Graph._wrap(Compressed(*sides), graph.num_src_nodes, graph.num_dst_nodes, facts=facts)
    if facts is None:
        counted = measure(derived.csr_indptr, derived.csc_indptr, derived.num_edges).facts
        derived._cache["facts"] = replace(counted, self_loops=self_loops)
    return derived


def without_self_loops(graph: Graph) -> Graph:
    """The graph's non-loop edges in their original order (the graph itself when it has none); cached.

    Its edge ids are those of :func:`replaced_self_loops`'s graph's first edges (the kept ones)."""
    if graph.facts.self_loops == 0:
        return graph

    def build() -> Graph:
        source, target = graph.edge_index()
        kept = graph.num_edges - graph.facts.self_loops
        return _derived(graph, source, target, source == target, kept, 0, None, 0)

    return graph.cached("gnnio.loops.without", build)


def last_loop_eid(graph: Graph) -> Tensor:
    """int64 [N]: the edge id of node i's last self-loop in edge order, or -1 (GCN keeps that loop's weight)."""

    def build() -> Tensor:
        source, target = graph.edge_index()
        positions = torch.arange(graph.num_edges, device=graph.device)
        is_loop = source == target
        into = torch.full((graph.num_nodes,), -1, dtype=torch.int64, device=graph.device)
        return into.scatter_reduce(0, torch.where(is_loop, source, 0), torch.where(is_loop, positions, -1), "amax")

    return graph.cached("gnnio.loops.last_loop_eid", build)


def edge_messages_graph(graph: Graph) -> Graph:
    """A graph with one source per edge of `graph`: edge e becomes (e -> target of e).

    Aggregating per-edge messages [E, F] over it reduces each target's in-edges,
    which is how weighted max/min (a sparse adjacency's values times the
    features) is computed with the plain aggregation op. Its rows are the
    graph's own, its sources each have one edge: its facts follow.
    """

    def build() -> Graph:
        _, target = graph.edge_index()
        edges = graph.num_edges
        one_each = RowFacts(edges, edges, 1 if edges else 0, edges, base_tile_length(edges, edges), 0, 0)
        facts = GraphFacts(graph.facts.csr, one_each, -1)
        edge_ids = torch.arange(edges, device=graph.device)
        return _derived(graph, edge_ids, target, None, edges, 0, facts, -1, num_src=edges)

    return graph.cached("gnnio.loops.edge_messages", build)


def _derived(graph: Graph, source: Tensor, target: Tensor, drop: Optional[Tensor], kept: int, num_loops: int,
             facts: Optional[GraphFacts], self_loops: int, num_src: Optional[int] = None) -> Graph:
    """The graph of the edges source -> target of `graph`'s device, less `drop` (`kept` stay), plus the
    loops (i, i) for i < num_loops, which has `self_loops` loops in all; with `facts` where they are known,
    else counted (one read on a GPU)."""
    num_src = graph.num_src_nodes if num_src is None else num_src
    build = derived_on_host if graph.device.type == "cpu" else derived_on_device
    derived = build(source, target, drop, kept, num_loops, num_src, graph.num_dst_nodes)
    if facts is not None:
        derived._cache["facts"] = facts
    elif derived.device.type != "cpu":
        counted = measure(derived.csr_indptr, derived.csc_indptr, kept + num_loops).facts
        derived._cache["facts"] = replace(counted, self_loops=self_loops)
    return derived


def derived_on_device(source: Tensor, target: Tensor, drop: Optional[Tensor], kept: int, num_loops: int,
                      num_src: int, num_dst: int) -> Graph:
    """:func:`_derived`'s graph grouped with device sorts (graph.compress), on the edges' device."""
    parts = compress(source, target, num_src, num_dst, index_dtype(max(num_src, num_dst)), drop, kept, num_loops)
    return Graph._wrap(parts, num_src, num_dst)


def derived_on_host(source: Tensor, target: Tensor, drop: Optional[Tensor], kept: int, num_loops: int,
                    num_src: int, num_dst: int) -> Graph:
    """:func:`_derived`'s graph grouped by graph.build's counting sorts (CPU tensors)."""
    keep = slice(None) if drop is None else ~drop
    loops = np.arange(num_loops, dtype=np.int64)
    return Graph.from_arrays(np.concatenate([source[keep].numpy(), loops]),
                             np.concatenate([target[keep].numpy(), loops]), num_src, num_dst)
