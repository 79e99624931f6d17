"""GCNConv: symmetric-normalised graph convolution (Kipf and Welling), as PyG 2.8."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.nn.adjacency import EdgesInput, appended_self_loops
from gnnio_cli.nn.base import ConvBase
from gnnio_cli.nn.linear import Linear, add_bias, zeros_
from gnnio_cli.ops.spmm import gcn_norm, gcn_propagate, spmm

GCN_REDUCTIONS = {"add": "sum", "sum": "sum", "mean": "mean"}


class GCNConv(ConvBase):
    """out = D^-1/2 (A + I) D^-1/2 X W + b, with PyG 2.8's options and semantics.

    in_channels:    input width, or -1 to take it from the first input.
    improved:       loops weigh 2 instead of 1 (only where edge weights are given, as PyG).
    cached:         normalise the adjacency on the first call and reuse it on
                    every later call, whatever edges are passed (transductive use only).
    add_self_loops: default: the value of `normalize`; adding loops without
                    normalising is refused, as PyG.
    normalize:      compute the symmetric normalisation on the fly; without it
                    the edges (and weights) are summed as given.

    forward(x [N, F_in], edge_index, edge_weight [E] or None) -> [N, F_out].
    edge_index: int [2, E], a torch sparse adj_t [N, N] (its values are the
    weights; existing loops are kept and one more added per node, as PyG), or a Graph.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: Optional[bool] = None,
        normalize: bool = True,
        bias: bool = True,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        if self.aggr not in GCN_REDUCTIONS:
            raise GnnioError(f"GCNConv: aggr must be one of {', '.join(GCN_REDUCTIONS)}, got {self.aggr!r}")
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise GnnioError(
                "GCNConv: add_self_loops=True needs normalize=True (loops are only added with the normalisation)"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.improved = improved
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize
        self._cached_normalized: Optional[tuple[Graph, Tensor]] = None
        self._cached_graph: Optional[Graph] = None  # cached=True with plain edges and no weights
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the weight (glorot), zero the bias, and forget the cached normalisation."""
        self.lin.reset_parameters()
        zeros_(self.bias)
        self._cached_normalized = None
        self._cached_graph = None

    def forward(self, x: Tensor, edge_index: EdgesInput, edge_weight: Optional[Tensor] = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise GnnioError("GCNConv: takes one node feature tensor, not a (source, target) pair; use SAGEConv")
        reduce = GCN_REDUCTIONS[self.aggr]
        adjacency = self.adjacency(edge_index, x, x)
        x = self.lin(x)
        if not self.normalize:
            weights = adjacency.values if adjacency.is_sparse else edge_weight
            out = spmm(adjacency.graph, x, weights, reduce=reduce)
        elif self._cached_graph is not None:
            out = gcn_propagate(self._cached_graph, x, None, improved=self.improved, add_self_loops=self.add_self_loops)
        elif self._cached_normalized is not None:
            graph, values = self._cached_normalized
            out = spmm(graph, x, values, reduce=reduce)
        elif self.cached and not adjacency.is_sparse and edge_weight is None and reduce == "sum":
            # The op keeps this graph's normalisation and its kernels' operator: nothing is rebuilt per call.
            self._cached_graph = adjacency.graph
            out = gcn_propagate(adjacency.graph, x, None, improved=self.improved, add_self_loops=self.add_self_loops)
        elif adjacency.is_sparse or self.cached or reduce != "sum":
            graph, values = self._normalized(adjacency, edge_weight, x.dtype)
            if self.cached:
                self._cached_normalized = (graph, values)
            out = spmm(graph, x, values, reduce=reduce)
        else:
            out = gcn_propagate(
                adjacency.graph, x, edge_weight, improved=self.improved, add_self_loops=self.add_self_loops
            )
        if self.bias is not None:
            out = add_bias(out, self.bias)
        return out

    def _normalized(self, adjacency, edge_weight: Optional[Tensor], dtype: torch.dtype) -> tuple[Graph, Tensor]:
        """(graph, normalised weights in its edge order), by PyG's rules for this input kind."""
        if not adjacency.is_sparse:
            return gcn_norm(
                adjacency.graph, edge_weight, improved=self.improved, add_self_loops=self.add_self_loops, dtype=dtype
            )
        # PyG normalises a sparse adjacency with its own values and appends one loop per node (existing loops stay).
        graph, weights = adjacency.graph, adjacency.values
        if weights.dim() != 1:
            raise GnnioError(f"GCNConv: a sparse adjacency must hold one weight per edge, got values of shape {tuple(weights.shape)}")
        if self.add_self_loops:
            num_nodes = graph.num_nodes
            graph = appended_self_loops(graph, num_nodes)
            weights = torch.cat([weights, weights.new_full((num_nodes,), 2.0 if self.improved else 1.0)])
        return gcn_norm(graph, weights, add_self_loops=False)
