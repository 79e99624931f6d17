"""DistributedGraph: one rank's part of a row-partitioned graph, which gnnio's layers take as their edges."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnio_cli.distributed.exchange import ExchangeLog, HaloPlan, halo_rows
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.nn.base import LayerRunner

if TYPE_CHECKING:  # (the partition module loads on first use: see gnnio_cli.distributed)
    from gnnio_cli.distributed.partition import Part, Partition


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
    own_nodes: int64 [num_own], the original ids of this rank's nodes: x = features[own_nodes].
    plan:      the halo exchange's plan; log: what the exchanges moved (see ExchangeLog).
    """

    def run_layer(self, layer, *args, **kwargs):
        """layer(x, self, ...): fetch the halo rows the layer needs, then its ordinary call on this part."""
        from gnnio_cli.distributed.layers import distributed_call

        return distributed_call(layer, *args, **kwargs)

    def __init__(self, graph: Graph, plan: HaloPlan, own_nodes: Tensor, edge_ids: Tensor, rank: int,
                 world_size: int, log: Optional[ExchangeLog] = None):
        self.graph = graph
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
        """The DistributedGraph of one Part (gnnio_cli.distributed.partition), on `device` (default: CPU)."""
        num_own = part.num_own
        graph = Graph.from_csr(torch.from_numpy(part.indptr), torch.from_numpy(part.indices),
                               num_own + int(part.halo.size))
        plan = HaloPlan(torch.from_numpy(part.send_index), tuple(int(c) for c in part.send_counts),
                        tuple(int(c) for c in part.recv_counts), num_own, group)
        dgraph = DistributedGraph(graph, plan, torch.from_numpy(np.asarray(own, dtype=np.int64)),
                                  torch.from_numpy(part.edge_ids), rank, world_size)
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
                                self.rank, self.world_size, self.log)

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

    def source_rows(self, own: Tensor) -> Tensor:
        """[num_own + num_halo, *]: the rows of every source of this part, own rows first (a collective)."""
        return torch.cat([own, self.halo(own)])

    def __repr__(self) -> str:
        return (f"DistributedGraph(rank={self.rank}/{self.world_size}, own={self.num_own}, halo={self.num_halo}, "
                f"edges={self.graph.num_edges})")


def _rank_and_size(group, parts: int) -> tuple[int, int]:
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if world_size != parts:
        raise GnnioError(f"the partition has {parts} parts, the process group {world_size} ranks")
    return rank, world_size
