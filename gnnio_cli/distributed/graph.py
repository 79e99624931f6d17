"""DistributedGraph: one rank's part of a row-partitioned graph, which gnnio's layers take as their edges."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnio_cli.distributed.exchange import ExchangeLog, HaloPlan, PendingHalo, halo_rows, start_halo
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.nn.base import LayerRunner

if TYPE_CHECKING:  # (the partition module loads on first use: see gnnio_cli.distributed)
    from gnnio_cli.distributed.partition import Part, Partition


class RowSplit(NamedTuple):
    """A part's graph split into its interior rows (every source an own node) and its boundary rows.

    interior:       Graph [num_interior targets x num_own sources]: the first num_interior local rows,
                    sources in local ids.
    interior_edges: int64 [E_i], the split graph's eid of each interior edge (interior slot k).
    boundary:       Graph [num_own - num_interior targets x num_src sources]: the other rows, with sources
                    numbered as :meth:`DistributedGraph.rolled` lays them out, so that boundary row j's
                    own node is source j (self-loops stay (j, j)).
    boundary_edges: int64 [E_b], the split graph's eid of each boundary edge.
    """

    interior: Graph
    interior_edges: Tensor
    boundary: Graph
    boundary_edges: Tensor


class DistributedGraph(LayerRunner):
    """This rank's part of a graph whose target rows are split across the ranks of a process group.

    Pass it to any gnnio layer in place of edge_index, with x holding this rank's own rows
    ([num_own, F], in ``own_nodes`` order): ``conv(x, dgraph)`` returns this rank's rows of the output
    ([num_own, F_out]) and gradients equal to the single-process ones (parameter gradients are this
    rank's share: sum them over ranks, e.g. with DistributedDataParallel). Before each aggregation the
    layer fetches the halo rows of its source-side input (:meth:`source_rows`); every rank must run
    the same layers in the same order (the exchange is a collective).

    graph:     the part as a bipartite gnnio Graph: num_dst = num_own targets; num_src = num_own + num_halo
               sources, own nodes first (local id i is own_nodes[i]) then the halo. Its edges are
               this rank's edges (every in-edge of its targets) in CSR order; ``edge_ids`` maps them
               to the original graph's edge ids, so per-edge inputs (edge_attr, edge_weight) are
               ``global_tensor[dgraph.edge_ids]``, and returned attention weights follow the local edges
               (their edge_index in local ids).
    own_nodes: int64 [num_own], the original ids of this rank's nodes: x = features[own_nodes]. Its
               interior nodes (every in-neighbour an own node) come first, num_interior of them, then the
               boundary nodes: the layers compute the interior rows while the halo rows are in flight.
    plan:      the halo exchange's plan; log: what the exchanges moved (see ExchangeLog).
    """

    def run_layer(self, layer, *args, **kwargs):
        """layer(x, self, ...): fetch the halo rows the layer needs, then its ordinary call on this part."""
        from gnnio_cli.distributed.layers import distributed_call

        return distributed_call(layer, *args, **kwargs)

    def __init__(self, graph: Graph, plan: HaloPlan, own_nodes: Tensor, edge_ids: Tensor, rank: int,
                 world_size: int, num_interior: int, log: Optional[ExchangeLog] = None):
        self.graph = graph
        self.num_interior = num_interior
        self.plan = plan
        self.own_nodes = own_nodes
        self.edge_ids = edge_ids
        self.rank = rank
        self.world_size = world_size
        self.log = log if log is not None else ExchangeLog()

    # ------------------------------------------------------------ build
    @staticmethod
    def from_part(part: Part, own: np.ndarray, rank: int, world_size: int, *, group=None,
                  device=None) -> "DistributedGraph":
        """The DistributedGraph of one Part (gnnio_cli.distributed.partition), on `device` (default: CPU), its
        own nodes reordered interior first."""
        num_own = part.num_own
        new_to_old, num_interior = _interior_first(part.indptr, part.indices, num_own)
        old_to_new = np.empty_like(new_to_old)
        old_to_new[new_to_old] = np.arange(num_own)
        lengths = np.diff(part.indptr)[new_to_old]
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # each new row's slots, in their old order: old start + position within the row
        slots = np.repeat(part.indptr[:-1][new_to_old] - indptr[:-1], lengths) + np.arange(int(indptr[-1]))
        indices = part.indices[slots]
        own_source = indices < num_own
        indices[own_source] = old_to_new[indices[own_source]]
        graph = Graph.from_csr(torch.from_numpy(indptr), torch.from_numpy(indices), num_own + int(part.halo.size))
        plan = HaloPlan(torch.from_numpy(old_to_new[part.send_index]), tuple(int(c) for c in part.send_counts),
                        tuple(int(c) for c in part.recv_counts), num_own, group)
        own = np.asarray(own, dtype=np.int64)[new_to_old]
        dgraph = DistributedGraph(graph, plan, torch.from_numpy(own), torch.from_numpy(part.edge_ids[slots]), rank,
                                  world_size, num_interior)
        return dgraph.to(device) if device is not None else dgraph

    @staticmethod
    def from_partition(partition: Partition, *, group=None, device=None) -> "DistributedGraph":
        """This rank's part of `partition` (the process group's rank and size must match its parts)."""
        rank, world_size = _rank_and_size(group, partition.num_parts)
        return DistributedGraph.from_part(partition.parts[rank], partition.own_nodes(rank), rank, world_size,
                                          group=group, device=device)

    @staticmethod
    def from_graph(graph: Graph, *, order: str = "none", group=None, device=None,
                   row_starts: Optional[np.ndarray] = None) -> "DistributedGraph":
        """Partition `graph` (the same on every rank) into the group's size and keep this rank's part.
        Every rank computes the whole partition: for graphs that fit a host; stored ones use :meth:`load`."""
        from gnnio_cli.distributed.partition import partition_graph

        world_size = dist.get_world_size(group)
        partition = partition_graph(graph, world_size, order=order, row_starts=row_starts)
        return DistributedGraph.from_partition(partition, group=group, device=device)

    @staticmethod
    def load(path, *, group=None, device=None) -> "DistributedGraph":
        """This rank's part of the partition stored in `path` (gnnio partition PATH --parts <group size>),
        reading only that part."""
        from gnnio_cli.distributed.partition import own_nodes, read_part

        world_size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        part, row_starts, order = read_part(path, world_size, rank)
        own = own_nodes(row_starts, None, rank) if order is None else order
        return DistributedGraph.from_part(part, own, rank, world_size, group=group, device=device)

    def to(self, device) -> "DistributedGraph":
        """The same part with its graph and plan on `device` (the exchange log is shared)."""
        return DistributedGraph(self.graph.to(device), self.plan.to(device), self.own_nodes, self.edge_ids,
                                self.rank, self.world_size, self.num_interior, self.log)

    # ------------------------------------------------------------ use
    @property
    def num_own(self) -> int:
        return self.plan.num_own

    @property
    def num_halo(self) -> int:
        return self.plan.num_halo

    def halo(self, own: Tensor) -> Tensor:
        """The halo rows [num_halo, *] of a node-wise tensor [num_own, *] (a collective; see exchange.halo_rows)."""
        return halo_rows(own, self.plan, self.log)

    def start_halo(self, own: Tensor) -> PendingHalo:
        """Start fetching the halo rows of `own` [num_own, *]; ``.wait()`` returns them (see exchange.start_halo)."""
        return start_halo(own, self.plan, self.log)

    def source_rows(self, own: Tensor) -> Tensor:
        """[num_own + num_halo, *]: the rows of every source of this part, own rows first (a collective)."""
        return torch.cat([own, self.halo(own)])

    def rolled(self, own: Tensor, halo: Tensor) -> Tensor:
        """[num_own + num_halo, *]: the sources of the boundary rows as RowSplit.boundary numbers them: the own
        boundary rows, the halo, then the own interior rows."""
        return torch.cat([own[self.num_interior:], halo, own[: self.num_interior]])

    def split(self, graph: Graph) -> RowSplit:
        """`graph` (this part's graph or one derived from it with the same rows and sources, e.g. with
        self-loops) split into interior and boundary rows; cached on `graph`."""
        return graph.cached(("gnnio.distributed.split", self.num_interior), lambda: _split(graph, self.num_interior))

    def __repr__(self) -> str:
        return (f"DistributedGraph(rank={self.rank}/{self.world_size}, own={self.num_own}, halo={self.num_halo}, "
                f"edges={self.graph.num_edges})")


def _interior_first(indptr: np.ndarray, indices: np.ndarray, num_own: int) -> tuple[np.ndarray, int]:
    """(new_to_old [num_own], num_interior): the part's rows reordered so that those whose sources are all own
    nodes come first (each group in its old order)."""
    rows = np.repeat(np.arange(num_own), np.diff(indptr))
    reads_halo = np.zeros(num_own, dtype=bool)
    reads_halo[rows[indices >= num_own]] = True
    return np.argsort(reads_halo, kind="stable"), int(num_own - reads_halo.sum())


def _split(graph: Graph, num_interior: int) -> RowSplit:
    indptr, indices, eid = graph.csr_indptr, graph.csr_indices, graph.csr_eid
    num_src, cut = graph.num_src_nodes, int(indptr[num_interior])
    num_own = graph.num_dst_nodes
    interior = Graph.from_csr(indptr[: num_interior + 1], indices[:cut], num_own)
    outer = indices[cut:].long()
    # sources rolled by num_interior: the boundary rows' own nodes first, the interior ones last
    outer = torch.where(outer < num_interior, outer + (num_src - num_interior), outer - num_interior)
    boundary = Graph.from_csr(indptr[num_interior:] - cut, outer.to(indices.dtype), num_src)
    return RowSplit(interior, eid[:cut], boundary, eid[cut:])


def _rank_and_size(group, parts: int) -> tuple[int, int]:
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if world_size != parts:
        raise GnnioError(f"the partition has {parts} parts, the process group {world_size} ranks")
    return rank, world_size
