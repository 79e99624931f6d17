"""GCNConv: symmetric-normalised graph convolution (Kipf and Welling), as PyG 2.8."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import appended_self_loops
from gnnio_cli.nn.adjacency import Adjacency
from gnnio_cli.nn import graph_ops
from gnnio_cli.nn.adjacency import EdgeRef
from gnnio_cli.nn.graph_ops import tracing
from gnnio_cli.nn.base import ConvBase, nodes_back, nodes_first, static_sparse_reason
from gnnio_cli.nn.linear import Linear, add_bias, zeros_
from gnnio_cli.nn.message_passing import Edges
from gnnio_cli.ops.spmm import gcn_norm, gcn_propagate, spmm

GCN_REDUCTIONS = ("sum", "mean")


class GCNConv(ConvBase, pyg_name="GCNConv"):
    """out = D^-1/2 (A + I) D^-1/2 X W + b, with PyG 2.8's options and semantics.

    in_channels:    input width, or -1 to take it from the first input.
    improved:       loops weigh 2 instead of 1 (only where edge weights are given, as PyG).
    cached:         normalise the adjacency on the first call and reuse it on
                    every later call, whatever edges are passed (transductive use
                    only). The normalised edges are kept, as PyG keeps them, in
                    ``_cached_edge_index`` (edge_index with loops, weights), or
                    (normalised sparse adj_t, None) for a sparse input; setting
                    it to None makes the next call normalise again.
    add_self_loops: default: the value of `normalize`; adding loops without
                    normalising is refused, as PyG.
    normalize:      compute the symmetric normalisation on the fly; without it
                    the edges (and weights) are summed as given.
    **kwargs:       MessagePassing's (aggr, flow, node_dim, decomposed_layers, ...).

    forward(x [N, F_in] or a static graph's [B, N, F_in], edge_index, edge_weight [E] or None)
    -> [N, F_out] (or [B, N, F_out]).
    edge_index: int [2, E] or an EdgeIndex, a torch sparse adj_t [N, N] (COO or CSR: its values are
    the weights; existing loops are kept and one more added per node, as PyG; a CSC one is refused
    with NotImplementedError where PyG's gcn_norm refuses it), or a Graph.
    Runs PyG's code (see gnnio_cli.nn.message_passing) for aggregations other than sum and mean.
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
        self._cached_edge_index = None
        self._cached_adj_t = None
        # (the _cached_edge_index it serves, its Graph with loops): the cached normalisation kept by the op
        self._cached_graph: Optional[tuple[tuple, Graph]] = None
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the weight (glorot), zero the bias, and forget the cached normalisation."""
        super().reset_parameters()
        self.lin.reset_parameters()
        zeros_(self.bias)
        self._cached_edge_index = None
        self._cached_adj_t = None
        self._cached_graph = None

    def forward(self, x: Tensor, edge_index: Edges, edge_weight: Optional[Tensor] = None) -> Tensor:
        if torch.jit.is_scripting():
            return self._pyg_forward(x, edge_index, edge_weight)
        else:
            return self._forward(x, edge_index, edge_weight)

    def _forward(self, x: Tensor, edge_index: Edges, edge_weight: Optional[Tensor]) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise GnnioError("GCNConv: takes one node feature tensor, not a (source, target) pair; use SAGEConv")
        reason = self._pyg_reason(GCN_REDUCTIONS, edge_index) or static_sparse_reason(x, self.node_dim, edge_index)
        if reason is None and self.cached and tracing():
            reason = "cached=True under torch.compile or torch.jit.trace"  # it keeps Python state between calls
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, edge_weight)
        self._ran("gnnio")
        reduce = self.reduction()
        num_nodes = x.shape[self.node_dim]
        cache = self._cached_edge_index if self.normalize else None
        served = self._cached_graph
        if cache is not None and served is not None and served[0] is cache:
            # the graph kept with this cache holds its normalisation: the edges passed are not read, as in PyG
            h = nodes_first(self.lin(x), self.node_dim)
            out = gcn_propagate(served[1], h, None, improved=self.improved, add_self_loops=self.add_self_loops)
            return self._finish(out)
        if cache is not None:
            edge_index, edge_weight = cache
        elif self.normalize and isinstance(edge_index, Tensor) and edge_index.layout == torch.sparse_csc:
            raise NotImplementedError("GCNConv: PyG 2.8's gcn_norm takes no sparse CSC adjacency; convert it with .to_sparse_csr()")
        adjacency = self.adjacency(edge_index, num_nodes, num_nodes, x.device)
        h = nodes_first(self.lin(x), self.node_dim)
        if isinstance(adjacency.graph, EdgeRef):
            out = graph_ops.propagate(adjacency.graph, h, edge_weight, reduce, normalize=self.normalize,
                                      add_self_loops=self.add_self_loops, improved=self.improved)
        elif not self.normalize or cache is not None:
            out = spmm(adjacency.graph, h, adjacency.values if adjacency.is_sparse else edge_weight, reduce=reduce)
        elif self.cached:
            out = self._cache_normalization(adjacency, h, edge_weight, reduce)
        elif adjacency.is_sparse or reduce != "sum":
            graph, values = self._normalized(adjacency, edge_weight, h.dtype)
            out = spmm(graph, h, values, reduce=reduce)
        else:
            out = gcn_propagate(adjacency.graph, h, edge_weight, improved=self.improved, add_self_loops=self.add_self_loops)
        return self._finish(out)

    def _finish(self, out: Tensor) -> Tensor:
        """The propagated features with the node axis back in place, plus the bias."""
        out = nodes_back(out, self.node_dim)
        if self.bias is not None:
            out = add_bias(out, self.bias)
        return out

    def _cache_normalization(self, adjacency: Adjacency, h: Tensor, edge_weight: Optional[Tensor], reduce: str) -> Tensor:
        """Normalise, keep the result in PyG's ``_cached_edge_index`` form, and propagate h over it."""
        graph, values = self._normalized(adjacency, edge_weight, h.dtype)
        looped = Adjacency(graph, layout=adjacency.layout, reversed=adjacency.reversed)
        if adjacency.is_sparse:
            self._cached_edge_index = (looped.to_sparse(values), None)
        else:
            self._cached_edge_index = (looped.given_edge_index(), values)
        if not adjacency.is_sparse and edge_weight is None and reduce == "sum":
            # The op keeps this graph's normalisation and its kernels' operator: nothing is rebuilt per call.
            self._cached_graph = (self._cached_edge_index, adjacency.graph)
            return gcn_propagate(adjacency.graph, h, None, improved=self.improved, add_self_loops=self.add_self_loops)
        return spmm(graph, h, values, reduce=reduce)

    def _normalized(self, adjacency: Adjacency, edge_weight: Optional[Tensor], dtype: torch.dtype) -> tuple[Graph, Tensor]:
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
