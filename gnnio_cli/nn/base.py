"""What every gnnio layer shares: PyG's message-passing options, node counts, the repr.

gnnio's layers do not subclass PyG's ``MessagePassing`` (PyG is optional), but
they take the same keyword arguments where gnnio can honour them (``aggr``,
``flow="source_to_target"``, ``node_dim``) and refuse the others with a
one-line error, and they print like PyG's.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.nn.adjacency import SPARSE_LAYOUTS, Adjacency, EdgesInput, as_adjacency, edge_messages_graph
from gnnio_cli.ops.reduce import aggregate
from gnnio_cli.ops.spmm import spmm

NodeFeatures = Union[Tensor, tuple[Tensor, Optional[Tensor]]]
Size = Optional[tuple[Optional[int], Optional[int]]]

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


# PyG aggregation names -> gnnio reduction names
REDUCTIONS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


class ConvBase(torch.nn.Module):
    """Base of gnnio's drop-in layers.

    aggr:      the neighbourhood reduction name, as PyG ("add", "sum", "mean", "max", "min").
    flow:      only "source_to_target" (edge_index[0] -> edge_index[1]) is supported.
    node_dim:  kept for compatibility; gnnio's layers take nodes along dim 0.
    """

    def __init__(
        self,
        aggr: Optional[str] = "sum",
        *,
        flow: str = "source_to_target",
        node_dim: int = -2,
        decomposed_layers: int = 1,
        **unsupported,
    ):
        super().__init__()
        name = type(self).__name__
        if unsupported:
            raise GnnioError(f"{name}: unsupported keyword argument(s) {', '.join(sorted(unsupported))}")
        if flow != "source_to_target":
            raise GnnioError(f"{name}: flow must be 'source_to_target', got {flow!r}; transpose edge_index instead")
        if aggr is not None and not isinstance(aggr, str):
            raise GnnioError(f"{name}: aggr must be a name such as 'mean', got {type(aggr).__name__}")
        self.aggr = aggr
        self.flow = flow
        self.node_dim = node_dim
        self.decomposed_layers = decomposed_layers

    def reset_parameters(self) -> None:
        """Re-initialise the layer's parameters (subclasses draw in PyG's order)."""

    def adjacency(self, edges: EdgesInput, x_src: Tensor, x_dst: Optional[Tensor], size: Size = None) -> Adjacency:
        """The cached Adjacency for this call: node counts from the edges, `size` or the features.

        A sparse adj_t or a Graph fixes (num_src, num_dst) itself; otherwise
        `size` does, then x_src / x_dst. When x_dst is None the target count
        must come from `size`.
        """
        if isinstance(edges, Graph):
            num_src, num_dst = edges.num_src_nodes, edges.num_dst_nodes
        elif isinstance(edges, Tensor) and edges.layout in SPARSE_LAYOUTS:
            num_src, num_dst = edges.shape[1], edges.shape[0]
        else:
            num_src = size[0] if size is not None and size[0] is not None else x_src.shape[0]
            if size is not None and size[1] is not None:
                num_dst = size[1]
            elif x_dst is not None:
                num_dst = x_dst.shape[0]
            else:
                raise GnnioError(f"{type(self).__name__}: pass size=(num_src, num_dst) when the target features are None")
        name = type(self).__name__
        if x_src.shape[0] != num_src:
            raise GnnioError(f"{name}: source features have {x_src.shape[0]} rows, the edges expect {num_src} sources")
        if x_dst is not None and x_dst.shape[0] != num_dst:
            raise GnnioError(f"{name}: target features have {x_dst.shape[0]} rows, the edges expect {num_dst} targets")
        return as_adjacency(edges, num_src, num_dst, x_src.device)

    def __repr__(self) -> str:
        if hasattr(self, "in_channels") and hasattr(self, "out_channels"):
            return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"
        if hasattr(self, "channels"):
            return f"{type(self).__name__}({self.channels})"
        return f"{type(self).__name__}()"


def split_pair(x: NodeFeatures) -> tuple[Tensor, Optional[Tensor]]:
    """(x_src, x_dst) from a tensor (both the same) or a pair (x_dst may be None)."""
    if isinstance(x, Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    raise GnnioError(f"node features must be a tensor or a pair (x_src, x_dst), got {type(x).__name__}")


def returned_edges(edges: EdgesInput, adjacency: Adjacency, changed: bool) -> Tensor:
    """The edges PyG hands back beside attention weights: the input itself unless self-loops changed it."""
    if isinstance(edges, Tensor) and not changed:
        return edges
    return adjacency.edge_index()


def aggregate_neighbours(adjacency: Adjacency, x_src: Tensor, reduce: str) -> Tensor:
    """Reduce source features [num_src, F] over each target's in-edges -> [num_dst, F].

    reduce: "sum", "mean", "max" or "min"; empty rows give 0. A sparse input's
    values weight the messages (value * x_src[s]), as PyG's sparse matmul does;
    edge_index and Graph inputs aggregate unweighted.
    """
    if adjacency.values is None:
        return aggregate(adjacency.graph, x_src, reduce)
    weights = adjacency.values
    if weights.dim() != 1:
        raise GnnioError(f"a sparse adjacency must hold one weight per edge here, got values of shape {tuple(weights.shape)}")
    if reduce in ("sum", "mean"):
        return spmm(adjacency.graph, x_src, weights.to(x_src.dtype), reduce=reduce)
    # Weighted max/min: each edge becomes its own source holding its weighted message.
    messages = x_src.index_select(0, adjacency.edge_index()[0]) * weights.to(x_src.dtype).unsqueeze(1)
    return aggregate(edge_messages_graph(adjacency.graph), messages, reduce)
