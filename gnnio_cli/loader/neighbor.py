"""NeighborLoader: PyG's neighbour-sampling mini-batches, sampled where the graph lives.

A batch is drawn as PyTorch Geometric's ``NeighborLoader`` draws it (flow source -> target: a node's
sampled neighbours are its in-neighbours, the sources of edges into it) and comes with the gnnio
:class:`Graph` the layers need, built straight from the sampling (the sampled edges are already
grouped by target) with its facts counted, so a layer on ``batch.graph`` never waits for the device.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import torch
from torch import Tensor

from gnnio_cli import native
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.store import load
from gnnio_cli.loader.sample import CpuSampler, CudaSampler, Sampled, epoch_generator, hop_keys

NodeIds = Union[Tensor, Sequence[int], None]


@dataclass
class Batch:
    """One mini-batch, PyG-style: node-level tensors follow ``n_id``, edge-level ones the columns of
    ``edge_index``.

    edge_index:  int64 [2, E_b]  local ids: row 0 sources, row 1 targets; grouped by target in local-id
                                 order, each target's edges in the base graph's CSR slot order
    n_id:        int64 [N_b]     global ids: the batch_size seeds in seed order, then each hop's new
                                 nodes in order of first appearance
    e_id:        int64 [E_b]     the base graph's edge id of each column of edge_index
    input_id:    int64 [B]       each seed's position in the loader's input_nodes
    batch_size:  B, the seeds
    num_sampled_nodes: [B, nodes new at hop 0, ...]; num_sampled_edges: [edges of hop 0, ...] (as PyG)
    graph:       the batch's Graph (N_b nodes, edge ids = columns of edge_index), facts counted
    x, y:        features and labels of n_id, or None
    """

    edge_index: Tensor
    n_id: Tensor
    e_id: Tensor
    input_id: Tensor
    batch_size: int
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    graph: Graph
    x: Optional[Tensor] = None
    y: Optional[Tensor] = None

    @property
    def num_nodes(self) -> int:
        return self.n_id.numel()

    @property
    def num_edges(self) -> int:
        return self.e_id.numel()

    def to(self, device) -> "Batch":
        """The same batch with every tensor and the graph (its facts kept) on `device`."""
        moved = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name, value in moved.items():
            if isinstance(value, (Tensor, Graph)):
                moved[name] = value.to(device)
        return Batch(**moved)

    def __repr__(self) -> str:
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            parts.append(f"{field.name}={list(value.shape) if isinstance(value, Tensor) else value}")
        return f"Batch({', '.join(parts)})"


class NeighborLoader:
    """Mini-batches of seeds with their sampled multi-hop in-neighbourhoods (PyG's NeighborLoader).

    data:          a PyG ``Data`` (its edge_index, num_nodes, x and y), an ``(edge_index, num_nodes)``
                   pair, a path to a gnnio ``.h5`` (features "x" and "y" when stored) or a gnnio Graph.
    num_neighbors: per-hop fan-outs, each > 0 or -1 (all in-neighbours). Hop 0 expands the seeds, hop h
                   the nodes first reached at hop h - 1. Without replacement a node of in-degree d takes
                   min(k, d) distinct in-edges uniformly; with ``replace`` k draws (none when d = 0).
    batch_size:    seeds per batch; the last batch is smaller unless ``drop_last``.
    input_nodes:   the seeds: None (all nodes), node ids, or a bool mask over the nodes.
    shuffle:       a new seed order every epoch (an epoch is one iteration over the loader).
    seed:          makes every batch reproducible: the same seed gives the same batches, epoch after
                   epoch, bit for bit on the CPU and on a GPU. None draws one from torch's generator.
    device:        where to sample and put the batches (the base graph and x, y are moved there once);
                   default: where the edges are. On a GPU without the native extension the batches are
                   sampled on the CPU and moved.
    x, y:          node features [N, ...] and labels [N, ...], overriding data's.

    Batches are :class:`Batch` records. On a GPU a batch of H hops reads the device H + 2 times (a few
    numbers each: the sizes, and the batch graph's facts); nothing loops over nodes on the host. One
    loader samples one batch at a time (its node table is shared by its iterators).
    """

    def __init__(
        self,
        data,
        num_neighbors: Sequence[int],
        batch_size: int = 1,
        input_nodes: NodeIds = None,
        shuffle: bool = False,
        replace: bool = False,
        drop_last: bool = False,
        seed: Optional[int] = None,
        device=None,
        x: Optional[Tensor] = None,
        y: Optional[Tensor] = None,
    ):
        self.num_neighbors = _fanouts(num_neighbors)
        if not _is_integer(batch_size) or batch_size < 1:
            raise GnnioError(f"NeighborLoader: batch_size must be an integer >= 1, got {batch_size!r}")
        graph, data_x, data_y = _base_graph(data)
        if graph.is_bipartite:
            raise GnnioError(f"NeighborLoader: the graph must have one node set, got {graph!r}")
        self.graph = graph.to(graph.device if device is None else device)
        self.device = self.graph.device
        num_nodes = self.graph.num_nodes
        self.x = _node_tensor("x", data_x if x is None else x, num_nodes, self.device)
        self.y = _node_tensor("y", data_y if y is None else y, num_nodes, self.device)
        self.input_nodes = _seeds(input_nodes, num_nodes, self.device)
        self.batch_size = int(batch_size)
        self.shuffle, self.replace, self.drop_last = bool(shuffle), bool(replace), bool(drop_last)
        self.seed = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
        self.epoch = 0
        on_gpu = self.device.type == "cuda" and native.is_available()
        base = self.graph if on_gpu else self.graph.to("cpu")
        sampler = CudaSampler if on_gpu else CpuSampler
        self.sampler = sampler(base.csr_indptr, base.csr_indices, base.csr_eid)

    def __len__(self) -> int:
        seeds = self.input_nodes.numel()
        return seeds // self.batch_size if self.drop_last else -(-seeds // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        """One epoch: the batches in seed order (shuffled: a permutation drawn from the seed and epoch)."""
        epoch = self.epoch
        self.epoch += 1
        order = None
        if self.shuffle:
            order = torch.randperm(self.input_nodes.numel(), generator=epoch_generator(self.seed, epoch))
            order = order.to(self.device)
        return self._epoch(epoch, order)

    def _epoch(self, epoch: int, order: Optional[Tensor]) -> Iterator[Batch]:
        for index in range(len(self)):
            start = index * self.batch_size
            end = min(start + self.batch_size, self.input_nodes.numel())
            if order is None:
                input_id = torch.arange(start, end, device=self.device)
                seeds = self.input_nodes[start:end]
            else:
                input_id = order[start:end]
                seeds = self.input_nodes.index_select(0, input_id)
            yield self._batch(seeds, input_id, hop_keys(self.seed, epoch, index, len(self.num_neighbors)))

    def _batch(self, seeds: Tensor, input_id: Tensor, keys: list[int]) -> Batch:
        """The batch of `seeds` (int64 [B] on the loader's device) whose hops draw with `keys`."""
        sampled = self.sampler.sample(seeds.to(self.sampler.indptr.device), self.num_neighbors, self.replace, keys)
        batch = _structure(sampled, input_id.to(sampled.n_id.device)).to(self.device)
        batch.x = None if self.x is None else self.x.index_select(0, batch.n_id)
        batch.y = None if self.y is None else self.y.index_select(0, batch.n_id)
        return batch


def _structure(sampled: Sampled, input_id: Tensor) -> Batch:
    """The batch without features: its edge_index and its Graph, whose facts are counted here (on a GPU
    one read) so that the layers never wait for the device."""
    graph = Graph.from_csr(sampled.indptr, sampled.sources, sampled.n_id.numel())
    graph.facts
    return Batch(
        edge_index=torch.stack([sampled.sources, graph.csr_rows]), n_id=sampled.n_id, e_id=sampled.e_id,
        input_id=input_id, batch_size=sampled.num_sampled_nodes[0], num_sampled_nodes=sampled.num_sampled_nodes,
        num_sampled_edges=sampled.num_sampled_edges, graph=graph,
    )  # fmt: skip


# ------------------------------------------------------------------ inputs
def _fanouts(num_neighbors) -> list[int]:
    if isinstance(num_neighbors, (dict, str)) or not isinstance(num_neighbors, Sequence):
        raise GnnioError(f"NeighborLoader: num_neighbors must be a list of per-hop fan-outs, got {num_neighbors!r}")
    fanouts = list(num_neighbors)
    if not fanouts:
        raise GnnioError("NeighborLoader: num_neighbors must give at least one hop's fan-out, got []")
    for fanout in fanouts:
        if not _is_integer(fanout) or (fanout < 1 and fanout != -1):
            raise GnnioError(
                f"NeighborLoader: num_neighbors must hold fan-outs > 0 or -1 (all neighbours), got {fanouts}"
            )
    return [int(fanout) for fanout in fanouts]


def _is_integer(value) -> bool:
    """An int (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _base_graph(data) -> tuple[Graph, Optional[Tensor], Optional[Tensor]]:
    """(graph, x, y) of the loader's `data` argument."""
    if isinstance(data, Graph):
        return data, None, None
    if isinstance(data, (str, os.PathLike)):
        stored = load(data)
        features = {name: torch.from_numpy(stored.features[name]) for name in ("x", "y") if name in stored.features}
        return stored.graph, features.get("x"), features.get("y")
    if isinstance(data, (tuple, list)) and len(data) == 2:
        edge_index, num_nodes = data
        return Graph.from_edge_index(edge_index, num_nodes=int(num_nodes)), None, None
    if hasattr(data, "edge_index"):
        graph = Graph.from_edge_index(data.edge_index, num_nodes=int(data.num_nodes))
        return graph, getattr(data, "x", None), getattr(data, "y", None)
    raise GnnioError(
        "NeighborLoader: data must be a PyG Data, an (edge_index, num_nodes) pair, a path to a gnnio .h5 "
        f"or a gnnio Graph, got {type(data).__name__}"
    )


def _node_tensor(name: str, values, num_nodes: int, device: torch.device) -> Optional[Tensor]:
    """Per-node `values` on `device`, checked to have one row per node."""
    if values is None:
        return None
    values = torch.as_tensor(values)
    if values.dim() == 0 or values.shape[0] != num_nodes:
        raise GnnioError(f"NeighborLoader: {name} must have one row per node (num_nodes={num_nodes}), "
                         f"got shape {tuple(values.shape)}")
    return values.to(device)


def _seeds(input_nodes: NodeIds, num_nodes: int, device: torch.device) -> Tensor:
    """int64 [S] seed ids on `device` from input_nodes (None: every node; ids; a bool mask), checked."""
    if input_nodes is None:
        return torch.arange(num_nodes, device=device)
    nodes = torch.as_tensor(input_nodes).to(device)
    if nodes.dtype == torch.bool:
        if nodes.shape != (num_nodes,):
            raise GnnioError(
                f"NeighborLoader: an input_nodes mask must have one entry per node (num_nodes={num_nodes}), "
                f"got shape {tuple(nodes.shape)}"
            )
        return nodes.nonzero().view(-1)
    if nodes.dtype.is_floating_point or nodes.dtype.is_complex or nodes.dim() != 1:
        raise GnnioError(
            f"NeighborLoader: input_nodes must be a 1-d tensor of node ids or a bool mask, "
            f"got dtype {nodes.dtype} and shape {tuple(nodes.shape)}"
        )
    nodes = nodes.to(torch.int64)
    if nodes.numel():
        smallest, largest = torch.stack(list(torch.aminmax(nodes))).tolist()
        outside = smallest if smallest < 0 else largest if largest >= num_nodes else None
        if outside is not None:
            raise GnnioError(f"NeighborLoader: input_nodes holds node id {outside}, outside [0, {num_nodes})")
    return nodes
