"""gnnio's layers on a DistributedGraph: one rank's rows, the same ops as on one device.

A layer called with a DistributedGraph (``ConvBase.__call__`` hands the call to
``DistributedGraph.run_layer``, which calls :func:`distributed_call`) fetches the halo rows of its source-side input and runs its ordinary
bipartite call on the rank's part:

- SAGEConv, GINConv, GATConv, GATv2Conv, TransformerConv: the pair
  (own + halo rows of x, own rows of x) on the part's Graph. Fetching x, not
  the projections, moves F_in values per halo row where the projected
  key/value (TransformerConv) or h and score (GATConv) would move at least H*C;
  the halo rows are then projected on each rank that reads them. Self-loops of
  GAT and GATv2 are added for the own nodes, whose local source and target ids
  agree, so they are exactly the loops of the whole graph.
- GCNConv: x is projected on the own rows, and the projection's halo rows
  fetched; the symmetric normalisation reads each source's degree over the
  whole graph: a node's in-edges all lie on its owner, which sums them (loops
  and edge weights by PyG's rules) and sends them with the halo exchange.
- AGNNConv: own + halo rows of x as sources, own rows as targets, with loops.

Softmax and every reduction are per target row, and a rank holds all of its
targets' in-edges, so no cross-rank merge is needed. Per-edge inputs are the
rank's edges' rows (``global[dgraph.edge_ids]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.adjacency import Adjacency, with_self_loops
from gnnio_cli.nn.gcn import GCN_REDUCTIONS, GCNConv
from gnnio_cli.nn.transformer import AGNNConv
from gnnio_cli.ops import attention
from gnnio_cli.ops.spmm import gcn_norm, spmm

if TYPE_CHECKING:  # (the graph calls into this module: DistributedGraph.run_layer)
    from gnnio_cli.distributed.graph import DistributedGraph

EDGE_ARGUMENT = "edge_index"


def distributed_call(layer: torch.nn.Module, *args, **kwargs):
    """layer(x, dgraph, *rest) on this rank's part; x: [num_own, F] (this rank's rows, a single tensor)."""
    args = list(args)
    x = args.pop(0) if args else kwargs.pop("x")
    dgraph = args.pop(0) if args else kwargs.pop(EDGE_ARGUMENT)
    name = type(layer).__name__
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise GnnioError(f"{name}: with a DistributedGraph, x must be this rank's rows [num_own, F], got {shape}")
    if x.shape[0] != dgraph.num_own:
        raise GnnioError(f"{name}: this rank owns {dgraph.num_own} nodes of the DistributedGraph, x has {x.shape[0]} rows")
    if layer.flow != "source_to_target":
        raise GnnioError(f"{name}: a DistributedGraph takes flow='source_to_target', got {layer.flow!r}")
    if isinstance(layer, GCNConv):
        return _gcn(layer, x, dgraph, *args, **kwargs)
    if isinstance(layer, AGNNConv):
        return _agnn(layer, x, dgraph)
    return torch.nn.Module.__call__(layer, (dgraph.source_rows(x), x), dgraph.graph, *args, **kwargs)


def _gcn(layer: GCNConv, x: Tensor, dgraph: DistributedGraph, edge_weight: Optional[Tensor] = None) -> Tensor:
    reduce = layer.reduction()
    if reduce not in GCN_REDUCTIONS:
        raise GnnioError(f"GCNConv: a DistributedGraph runs aggr 'add' or 'mean', got {layer.aggr!r}")
    layer._ran("gnnio")
    sources = dgraph.source_rows(layer.lin(x))
    graph, values = dgraph.graph, edge_weight
    if layer.normalize:
        graph, values = gcn_norm(graph, edge_weight, improved=layer.improved, add_self_loops=layer.add_self_loops,
                                 dtype=sources.dtype, source_degree=dgraph.source_rows)
    return layer._finish(spmm(graph, sources, values, reduce=reduce))


def _agnn(layer: AGNNConv, x: Tensor, dgraph: DistributedGraph) -> Tensor:
    layer._ran("gnnio")
    adjacency = Adjacency(dgraph.graph.to(x.device))
    if layer.add_self_loops:
        adjacency, _ = with_self_loops(adjacency, dgraph.num_own)
    return attention.agnn_attention(adjacency.graph, dgraph.source_rows(x), x, layer.beta, training=layer.training)
