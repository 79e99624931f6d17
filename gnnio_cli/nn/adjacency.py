"""Turning what a PyG layer is handed into a cached :class:`Graph`.

PyG layers accept the edges in these forms, and so do gnnio's:

- an ``edge_index`` tensor ``[2, E]`` (row 0 sources, row 1 targets; reversed
  for ``flow="target_to_source"``), or PyG's ``EdgeIndex`` holding one;
- a torch sparse adjacency (COO, CSR or CSC) in PyG's ``adj_t`` convention:
  shape ``[num_dst, num_src]``, entry ``[t, s]`` is the edge s -> t, its value
  the edge weight (or the edge features, for values of shape ``[nnz, D]``);
- a gnnio :class:`Graph` (its edges in its own edge-id order).

Building the CSR/CSC structures costs a sort, so the Graph built for an
``edge_index`` or sparse tensor is cached *on that tensor object* (weakly:
the entry dies with the tensor, so a mini-batch's structures go with its
batch). The entry keeps a copy of the ids it was built from, and a call is
served the cached Graph only when the tensor still holds exactly those ids
(one comparison, a read on a GPU): a write through ``.data``, a numpy view
or DLPack, which torch's version counter does not see, rebuilds it, and
tensors made under ``torch.inference_mode`` (which have no version counter)
are cached like any other. A Graph passed directly is never checked: it is
immutable. Structures are built outside inference mode, so a Graph built
while predicting serves training later.

Edge order. A Graph's edge ids follow the order PyG itself uses, so per-edge
inputs and returned attention weights line up with PyG's: the columns of
``edge_index``; for sparse inputs, the order of ``to_edge_index`` (row-major
for COO, which is coalesced first, and CSR; column-major for CSC).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import replaced_self_loops
from gnnio_cli.nn.message_passing import PYG

SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
LOOP_FILL_REDUCTIONS = {"add": "sum", "sum": "sum", "mean": "mean", "min": "amin", "max": "amax"}

EdgesInput = Union[Tensor, Graph]
FillValue = Union[None, float, int, Tensor, str]

# edge_index or sparse tensor -> {(num_src, num_dst, device, ...): (snapshot of its ids, Adjacency)}
_ADJACENCY_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


# EdgeRef.loops when no self-loop rule applies
NO_LOOPS = -1


class EdgeRef(NamedTuple):
    """A layer call's edges while tracing: messages flow edge_index[0] -> edge_index[1] (reversed: row 1 -> row 0),
    num_src_nodes sources, num_dst_nodes targets; loops >= 0: every self-loop dropped and (i, i) added for
    i < loops (PyG's add_self_loops of GAT, GATv2 and AGNN)."""

    edge_index: Tensor
    num_src_nodes: int
    num_dst_nodes: int
    reverse: bool = False
    loops: int = NO_LOOPS

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def args(self) -> tuple:
        return self.edge_index, self.num_src_nodes, self.num_dst_nodes, self.reverse, self.loops


class EdgeIndexError(GnnioError, IndexError, RuntimeError):
    """A malformed edge_index or a node id outside the features. PyG raises a ValueError, an
    IndexError or a RuntimeError for these, depending on the layer and the fault; this is all three."""


def is_edge_index_class(edges) -> bool:
    """Whether `edges` is PyG's EdgeIndex."""
    return PYG is not None and isinstance(edges, PYG.edge_index)


def plain_edges(edges):
    """The plain tensor inside PyG's EdgeIndex; any other input unchanged."""
    return edges.as_tensor() if is_edge_index_class(edges) else edges


@dataclass(frozen=True)
class Adjacency:
    """The edges one layer call aggregates over.

    graph:  the Graph on the features' device; its edge ids are PyG's edge order.
    values: a sparse input's values in edge-id order, [E] (weights) or [E, D]
            (features); None for edge_index and Graph inputs. Read fresh on
            every call, so they may carry gradients.
    layout: the sparse input's layout (None for edge_index and Graph inputs),
            used to hand attention weights back as PyG does.
    """

    graph: Graph
    values: Optional[Tensor] = None
    layout: Optional[torch.layout] = None
    reversed: bool = False

    @property
    def is_sparse(self) -> bool:
        return self.layout is not None

    def edge_index(self) -> Tensor:
        """int64 [2, E] (sources, targets) on the graph's device, in edge-id order."""
        return self.graph.edge_index()

    def given_edge_index(self) -> Tensor:
        """int64 [2, E] in edge-id order, its rows as the input had them (flipped back when reversed)."""
        edge_index = self.graph.edge_index()
        return edge_index.flip(0) if self.reversed else edge_index

    def to_sparse(self, values: Tensor) -> Tensor:
        """A sparse ``adj_t`` [num_dst, num_src] of this adjacency's layout holding `values` [E, ...].

        For CSR and COO inputs (and CSC without added self-loops) the result's
        value order equals edge-id order, so ``result.values()`` lines up with `values`.
        """
        source, target = self.edge_index()
        size = (self.graph.num_dst_nodes, self.graph.num_src_nodes, *values.shape[1:])
        coo = torch.sparse_coo_tensor(torch.stack([target, source]), values, size).coalesce()
        if self.layout == torch.sparse_csr:
            return coo.to_sparse_csr()
        if self.layout == torch.sparse_csc:
            return coo.to_sparse_csc()
        return coo


def as_adjacency(edges: EdgesInput, num_src: int, num_dst: int, device: torch.device, *,
                 reverse: bool = False) -> Adjacency:
    """The cached Adjacency for `edges` with `num_src` sources and `num_dst` targets on `device`.

    edges:   int [2, E] edge_index, torch sparse adj_t [num_dst, num_src], or a Graph.
    reverse: read an edge_index's row 1 as the sources and row 0 as the targets
             (PyG's flow="target_to_source"); edge ids keep the columns' order.
    """
    if isinstance(edges, Graph):
        if (edges.num_src_nodes, edges.num_dst_nodes) != (num_src, num_dst):
            raise GnnioError(
                f"the graph has {edges.num_src_nodes} sources and {edges.num_dst_nodes} targets, "
                f"but the node features give {num_src} and {num_dst}"
            )
        return Adjacency(edges.to(device))
    if not isinstance(edges, Tensor):
        raise GnnioError(
            f"edge_index must be an integer tensor [2, E], a torch sparse adjacency or a gnnio Graph, "
            f"got {type(edges).__name__}"
        )
    if edges.layout in SPARSE_LAYOUTS:
        return _sparse_adjacency(edges, num_src, num_dst, device)
    check_edge_index(edges)
    key = (num_src, num_dst, str(device)) + (("target_to_source",) if reverse else ())

    def build() -> Adjacency:
        try:
            graph = Graph.from_edge_index(edges.flip(0) if reverse else edges, size=(num_src, num_dst))
        except GnnioError as error:  # the ids' range is the one thing left to fail
            raise EdgeIndexError(str(error)) from None
        return Adjacency(graph.to(device), reversed=reverse)

    return _cached(edges, key, (edges,), build)


def check_edge_index(edges: Tensor) -> Tensor:
    """`edges` if it is a strided integer [2, E] tensor, else an EdgeIndexError naming what is wrong."""
    if edges.layout != torch.strided:
        raise EdgeIndexError(f"edge_index: unsupported tensor layout {edges.layout}")
    if edges.dtype.is_floating_point or edges.dtype.is_complex or edges.dtype == torch.bool:
        raise EdgeIndexError(f"edge_index must hold integers, got dtype {edges.dtype}")
    if edges.dim() != 2 or edges.shape[0] != 2:
        raise EdgeIndexError(f"edge_index must have shape [2, E], got {tuple(edges.shape)}")
    return edges


def _cached(tensor: Tensor, key, parts: tuple, build) -> Adjacency:
    """The Adjacency cached on `tensor` under `key` while its index `parts` still hold the ids it was built
    from (compared in full), else a new one built by `build` (outside inference mode and autograd)."""
    entries = _ADJACENCY_CACHE.get(tensor)
    if entries is None:
        entries = _ADJACENCY_CACHE[tensor] = {}
    entry = entries.get(key)
    if entry is not None and _unchanged(entry[0], parts):
        return entry[1]
    with torch.inference_mode(False), torch.no_grad():
        snapshot = tuple(part.detach().clone() for part in parts)
        adjacency = build()
    entries[key] = (snapshot, adjacency)
    return adjacency


def _unchanged(snapshot: tuple, parts: tuple) -> bool:
    return all(
        old.shape == new.shape and old.dtype == new.dtype and old.device == new.device and torch.equal(old, new)
        for old, new in zip(snapshot, parts)
    )


def _sparse_edges(adj: Tensor) -> tuple[Tensor, Tensor]:
    """int64 (sources, targets) of a sparse adj_t in PyG's to_edge_index order."""
    if adj.layout == torch.sparse_coo:
        targets, sources = (adj.coalesce() if not adj.is_coalesced() else adj).indices()
        return sources, targets
    if adj.layout == torch.sparse_csr:
        rows = torch.repeat_interleave(torch.arange(adj.shape[0], device=adj.device), adj.crow_indices().diff())
        return adj.col_indices().long(), rows
    cols = torch.repeat_interleave(torch.arange(adj.shape[1], device=adj.device), adj.ccol_indices().diff())
    return cols, adj.row_indices().long()


def _sparse_adjacency(adj: Tensor, num_src: int, num_dst: int, device: torch.device) -> Adjacency:
    if adj.dim() < 2 or (adj.shape[0], adj.shape[1]) != (num_dst, num_src):
        raise GnnioError(
            f"sparse adjacency must have shape [num_dst, num_src] = [{num_dst}, {num_src}] (PyG's adj_t), "
            f"got {tuple(adj.shape)}"
        )
    if adj.layout == torch.sparse_coo:
        parts = (adj._indices(),)
    elif adj.layout == torch.sparse_csr:
        parts = (adj.crow_indices(), adj.col_indices())
    else:
        parts = (adj.ccol_indices(), adj.row_indices())
    key = (num_src, num_dst, str(device), adj.layout == torch.sparse_coo and adj.is_coalesced())

    def build() -> Adjacency:
        sources, targets = _sparse_edges(adj)
        edge_index = torch.stack([sources, targets]).detach()
        return Adjacency(Graph.from_edge_index(edge_index, size=(num_src, num_dst)).to(device), layout=adj.layout)

    structure = _cached(adj, key, parts, build)
    coalesced = adj.coalesce() if adj.layout == torch.sparse_coo and not adj.is_coalesced() else adj
    return Adjacency(structure.graph, coalesced.values().to(device), adj.layout)


# ----------------------------------------------------------- self-loops
def loop_fill(edge_attr: Tensor, target: Tensor, num_loops: int, fill_value: FillValue) -> Tensor:
    """Edge features [num_loops, *] for new self-loops, from the other edges' features (PyG's rules).

    edge_attr: [E, *] features of the non-loop edges; target: int64 [E] their targets.
    fill_value: None -> ones; a number -> that number; a tensor -> broadcast to
    every loop; "add"/"sum"/"mean"/"min"/"max" -> that reduction of each node's
    incoming edge features (0 for a node without in-edges).
    """
    size = (num_loops, *edge_attr.shape[1:])
    if fill_value is None:
        return edge_attr.new_ones(size)
    if isinstance(fill_value, (int, float)) and not isinstance(fill_value, bool):
        return edge_attr.new_full(size, float(fill_value))
    if isinstance(fill_value, Tensor):
        value = fill_value.to(edge_attr.device, edge_attr.dtype)
        if value.dim() != edge_attr.dim():
            value = value.unsqueeze(0)
        return value.expand(size).contiguous()
    if isinstance(fill_value, str) and fill_value in LOOP_FILL_REDUCTIONS:
        inside = target < num_loops
        index = target[inside].view(-1, *([1] * (edge_attr.dim() - 1))).expand(-1, *edge_attr.shape[1:])
        return edge_attr.new_zeros(size).scatter_reduce(
            0, index, edge_attr[inside], LOOP_FILL_REDUCTIONS[fill_value], include_self=False
        )
    raise GnnioError(
        f"fill_value must be None, a number, a tensor or one of {', '.join(LOOP_FILL_REDUCTIONS)}, got {fill_value!r}"
    )


def with_self_loops(
    adjacency: Adjacency, num_loops: int, edge_attr: Optional[Tensor] = None, fill_value: FillValue = None
) -> tuple[Adjacency, Optional[Tensor]]:
    """Remove every self-loop, then add (i, i) for i < num_loops (PyG's GAT/GATv2/AGNN rule).

    edge_attr: optional [E, *] in edge-id order; the loops get :func:`loop_fill`
    of the remaining edges' features. A sparse input's values are carried the
    same way (loop values from `fill_value`). For sparse inputs the edges are
    then sorted by (target, source), as PyG re-coalesces the adjacency.
    Returns the looped Adjacency and the looped edge_attr (None if not given).
    """
    if isinstance(adjacency.graph, EdgeRef):  # the graph-level ops add the loops (edge features: see the layers)
        return Adjacency(adjacency.graph._replace(loops=num_loops), reversed=adjacency.reversed), edge_attr
    looped = replaced_self_loops(adjacency.graph, num_loops, row_major=adjacency.is_sparse)

    def carry(per_edge: Optional[Tensor]) -> Optional[Tensor]:
        if per_edge is None:
            return None
        kept_target = looped.kept(adjacency.edge_index()[1])
        kept = looped.kept(per_edge)
        joined = torch.cat([kept, loop_fill(kept, kept_target, num_loops, fill_value)])
        return joined if looped.order is None else joined.index_select(0, looped.order)

    looped_adjacency = Adjacency(looped.graph, carry(adjacency.values), adjacency.layout, adjacency.reversed)
    return looped_adjacency, carry(edge_attr)
