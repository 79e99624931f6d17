"""What every gnnio layer shares: PyG's MessagePassing (see :mod:`gnnio_cli.nn.message_passing`), the choice
between gnnio's ops and PyG's code for a call, node counts from PyG's size rules, the node axis.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import edge_messages_graph
from gnnio_cli.nn.adjacency import (
    SPARSE_LAYOUTS,
    Adjacency,
    as_adjacency,
    check_edge_index,
    is_edge_index_class,
    plain_edges,
)
from gnnio_cli.nn.adjacency import EdgeRef
from gnnio_cli.nn.graph_ops import tracing
from gnnio_cli.nn import graph_ops
from gnnio_cli.nn.message_passing import (
    NATIVE_REDUCTIONS,
    PYG,
    AttentionOutput,
    Edges,
    MessagePassingBase,
    NodeFeatures,
    Size,
    borrow_pyg_code,
    hooked,
    needs_pyg,
)
from gnnio_cli.ops import dispatch
from gnnio_cli.ops.reduce import aggregate
from gnnio_cli.ops.spmm import spmm

PATHS = ("gnnio", "pyg")


# A parameter's or child module's attribute lookup (module.weight, self.lin) misses the instance dict and
# falls back to Module.__getattr__: about 1.5 us of host time each. A training step's GPU waits for the
# host until the step's first launch, so the layers read what they need before it from the registries.
def registered_parameters(module: torch.nn.Module, *names: str) -> list:
    """module.<name> for each parameter name (None where one is registered as None)."""
    return _registered(module, module._parameters, names)


def registered_children(module: torch.nn.Module, *names: str) -> list:
    """module.<name> for each child module name (None where one is registered as None)."""
    return _registered(module, module._modules, names)


def _registered(module: torch.nn.Module, registry: dict, names: tuple) -> list:
    try:
        return [registry[name] for name in names]
    except KeyError:  # e.g. a parametrized weight, a property of the module
        return [getattr(module, name) for name in names]


class LayerRunner:
    """Edges that run a layer's call themselves when passed in place of an edge_index (a rank's part of a
    row-split graph: gnnio_cli.distributed.DistributedGraph)."""

    def run_layer(self, layer: "ConvBase", *args, **kwargs):
        raise NotImplementedError


class ConvBase(MessagePassingBase):
    """Base of gnnio's drop-in layers: PyG's ``MessagePassing`` where torch_geometric imports.

    A subclass names PyG's class it mirrors (``class GCNConv(ConvBase, pyg_name="GCNConv")``) and gets
    that class's message functions and ``forward`` (as ``_pyg_forward``): the code a call runs when
    gnnio has no kernel for it, and what ``torch.jit.script`` compiles.

    last_path: "gnnio" when the last call ran on gnnio's ops, "pyg" when it ran PyG's code
               (None before the first call).
    """

    last_path: Optional[str] = None

    def __init_subclass__(cls, pyg_name: Optional[str] = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if pyg_name is not None:
            borrow_pyg_code(cls, pyg_name)

    def __prepare_scriptable__(self) -> "ConvBase":
        """torch.jit.script compiles PyG's forward on this module (see gnnio_cli.nn.message_passing)."""
        if PYG is None:
            raise needs_pyg(type(self).__name__, "torch.jit.script")
        return self

    def __call__(self, *args, **kwargs):
        # A DistributedGraph in place of the edges: this rank's rows of a row-partitioned graph, whose halo
        # rows the layer fetches before running its ordinary call on the rank's part (gnnio_cli.distributed).
        # The graph runs such a call itself (DistributedGraph.run_layer), so nn does not import distributed.
        edges = args[1] if len(args) > 1 else kwargs.get("edge_index")
        if isinstance(edges, LayerRunner):
            return edges.run_layer(self, *args, **kwargs)
        return super().__call__(*args, **kwargs)

    # ------------------------------------------------------------ paths
    def _ran(self, path: str) -> None:
        if tracing():  # a compiled or traced call mutates no Python state per call
            return
        if self.__dict__.get("last_path") != path:  # set only on a change: Module.__setattr__ costs host time
            self.last_path = path

    def _pyg_reason(self, native: tuple, edges) -> Optional[str]:
        """Why this call must run PyG's code, given the reductions this layer runs itself and the edges;
        None if gnnio's ops run it."""
        if hooked(self):
            return "a message-passing hook or explain"
        if self.reduction() not in native:
            return f"aggr={self.aggr!r}"
        if PYG is not None and PYG.sparse_tensor is not None and isinstance(edges, PYG.sparse_tensor):
            return "a torch_sparse SparseTensor"
        if tracing() and isinstance(edges, Tensor) and edges.layout in SPARSE_LAYOUTS:
            return "a sparse adjacency under torch.compile or torch.jit.trace"
        return None

    def _run_pyg(self, reason: str, *args, **kwargs):
        """PyG's forward of this layer on this module, for a call gnnio has no kernel for (`reason` says which)."""
        if PYG is None:
            raise needs_pyg(type(self).__name__, reason)
        if not tracing():
            self._ran("pyg")
            dispatch.record(type(self).__name__, "pyg")
        return self._pyg_forward(*args, **kwargs)

    def reduction(self) -> Optional[str]:
        """gnnio's name of the layer's aggregation ("sum", "mean", "max", "min"), None where only PyG has it."""
        if PYG is None:
            return NATIVE_REDUCTIONS.get(self.aggr)
        return PYG.aggregations.get(type(self._modules.get("aggr_module")))

    # ----------------------------------------------------------- edges
    def adjacency(
        self, edges, num_src: int, num_dst: Optional[int], device: torch.device, size: Size = None
    ) -> Adjacency:
        """The cached Adjacency of this call, its node counts by PyG's rules.

        num_src / num_dst: rows of the source / target features (num_dst None: no target features).
        The counts come from a Graph's or a sparse adj_t's shape, an EdgeIndex's sparse size or `size`,
        then from the features; every count given must agree (else a one-line error naming both).
        Without target features or a count for them, there are as many targets as sources (PyG's rule).
        With flow="target_to_source" the edges are read reversed (edge_index[1] -> edge_index[0]).
        While tracing (torch.compile, torch.jit.trace) the Adjacency's graph is an EdgeRef: the edge_index
        and the counts, for the graph-level ops (gnnio_cli.nn.graph_ops).
        """
        reverse = self.flow == "target_to_source"
        traced = tracing()
        if size is None and not reverse and not traced and type(edges) is Tensor and edges.layout == torch.strided:
            return as_adjacency(edges, num_src, num_src if num_dst is None else num_dst, device)  # the common call
        name = type(self).__name__
        if traced and isinstance(edges, Graph):
            raise GnnioError(f"{name}: under torch.compile or torch.jit.trace pass the edges as an edge_index, "
                             f"not a gnnio Graph")
        sparse = isinstance(edges, Tensor) and edges.layout in SPARSE_LAYOUTS
        if reverse and (sparse or isinstance(edges, Graph)):
            raise GnnioError(
                f"{name}: flow='target_to_source' takes an edge_index; for a sparse adjacency or a Graph "
                f"pass the transposed one (e.g. adj_t.t())"
            )
        if isinstance(edges, Graph):
            counts = [edges.num_src_nodes, edges.num_dst_nodes]
        elif sparse:
            counts = [edges.shape[1], edges.shape[0]]
        elif is_edge_index_class(edges):
            counts = list(edges.sparse_size())
        else:
            counts = list(size) if size is not None else [None, None]
        if reverse:
            counts.reverse()
        for side, rows in ((0, num_src), (1, num_dst)):
            if rows is None:
                continue
            if counts[side] is None:
                counts[side] = rows
            elif counts[side] != rows:
                role = "source" if side == 0 else "target"
                raise GnnioError(
                    f"{name}: {role} features have {rows} nodes along dim {self.node_dim}, "
                    f"the edges or size expect {counts[side]}"
                )
        if counts[1] is None:
            counts[1] = counts[0]
        if traced:
            edge_index = check_edge_index(plain_edges(edges))
            return Adjacency(EdgeRef(edge_index, counts[0], counts[1], reverse))
        return as_adjacency(plain_edges(edges), counts[0], counts[1], device, reverse=reverse)


class EdgeFeaturesForward:
    """forward(x, edge_index, edge_attr=None, return_attention_weights=None): the signature GATv2Conv and
    TransformerConv share with PyG's; TorchScript compiles PyG's forward, eager calls run the layer's _forward."""

    def forward(
        self,
        x: NodeFeatures,
        edge_index: Edges,
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> AttentionOutput:
        if torch.jit.is_scripting():
            return self._pyg_forward(x, edge_index, edge_attr, return_attention_weights)
        else:
            return self._forward(x, edge_index, edge_attr, return_attention_weights)


def reversed_pair_reason(layer: ConvBase, x: NodeFeatures) -> Optional[str]:
    """PyG's flow="target_to_source" with a (source, target) pair mixes the pair's sides and sizes in
    ways gnnio does not reproduce: such a call runs PyG's code."""
    if layer.flow == "target_to_source" and not isinstance(x, Tensor):
        return "flow='target_to_source' with a pair of features"
    return None


def static_sparse_reason(x: Tensor, node_dim: int, edges) -> Optional[str]:
    """PyG's sparse matmul fails on a static graph's [B, N, F] features: such a call runs PyG's code."""
    if x.dim() > 2 and isinstance(edges, Tensor) and edges.layout in SPARSE_LAYOUTS:
        return "a static graph's features with a sparse adjacency"
    return None


def split_pair(x: NodeFeatures) -> tuple[Tensor, Optional[Tensor]]:
    """(x_src, x_dst) from a tensor (both the same) or a pair (x_dst may be None)."""
    if isinstance(x, Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    raise GnnioError(f"node features must be a tensor or a pair (x_src, x_dst), got {type(x).__name__}")


def nodes_first(x: Tensor, node_dim: int) -> Tensor:
    """x with its node axis `node_dim` first, as the ops take features: a static graph's [B, N, F] becomes
    a contiguous [N, B, F]; [N, F] is returned as it is."""
    return x if node_dim % x.dim() == 0 else x.movedim(node_dim, 0).contiguous()


def nodes_back(out: Tensor, node_dim: int) -> Tensor:
    """Undo :func:`nodes_first` on an op's output (which has the input's rank)."""
    return out if node_dim % out.dim() == 0 else out.movedim(0, node_dim)


def returned_edges(edges, adjacency: Adjacency, changed: bool):
    """The edges PyG hands back beside attention weights: the input itself unless self-loops changed it
    (then the edges in the input's orientation, an EdgeIndex for an EdgeIndex input)."""
    if isinstance(edges, Tensor) and not changed:
        return edges
    edge_index = adjacency.given_edge_index()
    if is_edge_index_class(edges):
        return PYG.edge_index(edge_index, sparse_size=edges.sparse_size())
    return edge_index


def aggregate_neighbours(adjacency: Adjacency, x_src: Tensor, reduce: str) -> Tensor:
    """Reduce source features [num_src, *] over each target's in-edges -> [num_dst, *].

    reduce: "sum", "mean", "max" or "min"; empty rows give 0. A sparse input's
    values weight the messages (value * x_src[s]), as PyG's sparse matmul does;
    edge_index and Graph inputs aggregate unweighted.
    """
    if isinstance(adjacency.graph, EdgeRef):
        return graph_ops.aggregate(adjacency.graph, x_src, reduce)
    if adjacency.values is None:
        return aggregate(adjacency.graph, x_src, reduce)
    weights = adjacency.values
    if weights.dim() != 1:
        raise GnnioError(f"a sparse adjacency must hold one weight per edge here, got values of shape {tuple(weights.shape)}")
    if reduce in ("sum", "mean"):
        return spmm(adjacency.graph, x_src, weights.to(x_src.dtype), reduce=reduce)
    # Weighted max/min: each edge becomes its own source holding its weighted message.
    messages = x_src.index_select(0, adjacency.edge_index()[0])
    messages = messages * weights.to(x_src.dtype).view(-1, *([1] * (messages.dim() - 1)))
    return aggregate(edge_messages_graph(adjacency.graph), messages, reduce)
