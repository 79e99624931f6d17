"""gnnio's layers on a DistributedGraph: one rank's rows, the same ops as on one device.

A layer called with a DistributedGraph (``ConvBase.__call__`` hands the call to
``DistributedGraph.run_layer``, which calls :func:`distributed_call`) runs its
node-wise work on the rank's own rows, starts fetching the halo rows of its
source-side tensor, aggregates its interior rows (whose sources are all own
nodes) while they are in flight, then its boundary rows. What a rank fetches:

- GATConv: h and the source score term (H*C + H values per row), or x where
  that is narrower (the halo rows are then projected on arrival).
- GATv2Conv: the source projection (H*C values), or x where that is narrower.
- TransformerConv: key and value (2*H*C), or x where that is narrower.
- SAGEConv: with a mean or sum, x @ W_l^T where the output is narrower than x
  (the aggregation is linear: lin_l's weight applied before it, its bias
  after); with project=True, relu(lin(x)); else x.
- GCNConv: the projection x W; the symmetric normalisation reads each source's
  degree over the whole graph: a node's in-edges all lie on its owner, which
  sums them (loops and edge weights by PyG's rules) and sends them with the
  halo exchange.
- GINConv, AGNNConv: x.

Self-loops (GAT, GATv2, AGNN, GCN) are added for the own nodes, whose local
source and target ids agree, so they are exactly the loops of the whole graph.
Softmax and every reduction are per target row, and a rank holds all of its
targets' in-edges, so no cross-rank merge is needed. Per-edge inputs are the
rank's edges' rows (``global[dgraph.edge_ids]``).

Calls these paths do not cover (returned attention weights, an explicit size,
separate source and target widths for GAT, what runs PyG's code, tracing) run
the layer's ordinary bipartite call on (own + halo rows of x, own rows of x),
after a blocking exchange.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.adjacency import Adjacency, with_self_loops
from gnnio_cli.nn.base import aggregate_neighbours, registered_children, registered_parameters
from gnnio_cli.nn.gat import GATConv, GATv2Conv, project_with_scores
from gnnio_cli.nn.gcn import GCN_REDUCTIONS, GCNConv
from gnnio_cli.nn.graph_ops import tracing
from gnnio_cli.nn.linear import project_shared
from gnnio_cli.nn.sage import REDUCTIONS, GINConv, SAGEConv
from gnnio_cli.nn.transformer import AGNNConv, TransformerConv
from gnnio_cli.ops import attention
from gnnio_cli.ops.spmm import gcn_norm, spmm

if TYPE_CHECKING:  # (the graph calls into this module: DistributedGraph.run_layer)
    from gnnio_cli.distributed.graph import DistributedGraph

EDGE_ARGUMENT = "edge_index"


def distributed_call(layer: torch.nn.Module, *args, **kwargs):
    """layer(x, dgraph, *rest) on this rank's part; x: [num_own, F] (this rank's rows, a single tensor)."""
    call = _signature(type(layer)).bind(*args, **kwargs).arguments
    x, dgraph = call.get("x"), call.get(EDGE_ARGUMENT)
    name = type(layer).__name__
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise GnnioError(f"{name}: with a DistributedGraph, x must be this rank's rows [num_own, F], got {shape}")
    if x.shape[0] != dgraph.num_own:
        raise GnnioError(f"{name}: this rank owns {dgraph.num_own} nodes of the DistributedGraph, x has {x.shape[0]} rows")
    if layer.flow != "source_to_target":
        raise GnnioError(f"{name}: a DistributedGraph takes flow='source_to_target', got {layer.flow!r}")
    if isinstance(layer, GCNConv):
        return _gcn(layer, x, dgraph, call.get("edge_weight"))
    if isinstance(layer, AGNNConv) and not tracing():
        return _agnn(layer, x, dgraph)
    overlapped = _OVERLAPPED.get(type(layer))
    if overlapped is not None and _covered(layer, call, dgraph):
        return overlapped(layer, x, dgraph, call.get("edge_attr"))
    return torch.nn.Module.__call__(layer, **{**call, "x": (dgraph.source_rows(x), x), EDGE_ARGUMENT: dgraph.graph})


_SIGNATURES: dict = {}


def _signature(cls) -> inspect.Signature:
    """forward's signature without self (a layer's call binds to it: x, edge_index, then the layer's own)."""
    if cls not in _SIGNATURES:
        signature = inspect.signature(cls.forward)
        _SIGNATURES[cls] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return _SIGNATURES[cls]


def _covered(layer, call: dict, dgraph: DistributedGraph) -> bool:
    """Whether the overlapped path below runs this call (else the layer's ordinary call on the pair does)."""
    if tracing() or call.get("size") is not None or call.get("return_attention_weights") is not None:
        return False
    native = REDUCTIONS if isinstance(layer, (SAGEConv, GINConv)) else ("sum",)
    if layer._pyg_reason(native, dgraph.graph) is not None:
        return False
    edge_attr = call.get("edge_attr")
    if isinstance(layer, GATConv):
        return layer.lin is not None
    if isinstance(layer, GATv2Conv):
        return edge_attr is None or layer.lin_edge is not None
    if isinstance(layer, TransformerConv):
        return (edge_attr is None) == (layer.lin_edge is None) and (edge_attr is None or edge_attr.dim() == 2)
    return True


def _overlap(dgraph: DistributedGraph, wire: Tensor, interior: Callable[[], Tensor],
             boundary: Callable[[Tensor], Tensor]) -> Tensor:
    """[num_own, *]: interior() (the interior rows, run while the halo rows of `wire` are in flight), then
    boundary(halo rows of wire) (the boundary rows)."""
    pending = dgraph.start_halo(wire)
    inner = interior()
    return torch.cat([inner, boundary(pending.wait())])


def _edge_rows(split, per_edge: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The interior and boundary edges' rows of a per-edge tensor in the split graph's eid order."""
    if per_edge is None:
        return None, None
    return per_edge.index_select(0, split.interior_edges), per_edge.index_select(0, split.boundary_edges)


def _looped(layer, dgraph: DistributedGraph, edge_attr: Optional[Tensor]):
    """(the part's Adjacency with GAT's or GATv2's self-loops for the own nodes, its edge_attr)."""
    return layer._edges_with_loops(Adjacency(dgraph.graph), dgraph.num_own, edge_attr)


def _gat(layer: GATConv, x: Tensor, dgraph: DistributedGraph, edge_attr: Optional[Tensor]) -> Tensor:
    layer._ran("gnnio")
    heads, width = layer.heads, layer.heads * layer.out_channels
    att_src, att_dst = registered_parameters(layer, "att_src", "att_dst")
    h, alpha_src, alpha_dst = project_with_scores(x, layer.lin, heads, att_src, att_dst)
    residual = layer.res(x) if layer.res is not None else None
    adjacency, edge_attr = _looped(layer, dgraph, edge_attr)
    split = dgraph.split(adjacency.graph)
    edge_features = layer._projected_edges(edge_attr)
    edge_alpha = None if edge_features is None else (edge_features * layer.att_edge).sum(dim=-1)
    alpha_inner, alpha_outer = _edge_rows(split, edge_alpha)
    bias = layer._attention_bias(h, residual)
    fetch_projected = width + heads <= x.shape[1]
    cut = dgraph.num_interior

    def attend(graph, h_src, a_src, a_dst, a_edge):
        return attention.gat_attention(graph, h_src, a_src, a_dst, a_edge, negative_slope=layer.negative_slope,
                                       dropout=layer.dropout, training=layer.training, bias=bias)

    def boundary(halo: Tensor) -> Tensor:
        if fetch_projected:
            halo_h, halo_alpha = halo[:, :width].view(-1, heads, layer.out_channels), halo[:, width:]
        else:
            halo_h, halo_alpha = project_with_scores(halo, layer.lin, heads, att_src)
        return attend(split.boundary, dgraph.rolled(h, halo_h), dgraph.rolled(alpha_src, halo_alpha),
                      alpha_dst[cut:], alpha_outer)

    wire = torch.cat([h.reshape(-1, width), alpha_src], dim=1) if fetch_projected else x
    out = _overlap(dgraph, wire, lambda: attend(split.interior, h, alpha_src, alpha_dst[:cut], alpha_inner), boundary)
    return layer._finish(out, residual, None, None, adjacency, False, bias is not None)


def _gatv2(layer: GATv2Conv, x: Tensor, dgraph: DistributedGraph, edge_attr: Optional[Tensor]) -> Tensor:
    layer._ran("gnnio")
    heads, channels = layer.heads, layer.out_channels
    lin_l, lin_r = registered_children(layer, "lin_l", "lin_r")
    if layer.share_weights:
        h_src = h_dst = lin_l(x).view(-1, heads, channels)
    else:
        h_src, h_dst = (h.view(-1, heads, channels) for h in project_shared(x, lin_l, lin_r))
    residual = layer.res(x) if layer.res is not None else None
    adjacency, edge_attr = _looped(layer, dgraph, edge_attr)
    split = dgraph.split(adjacency.graph)
    features_inner, features_outer = _edge_rows(split, layer._projected_edges(edge_attr))
    bias = layer._attention_bias(h_src, residual)
    att = layer.att.view(heads, channels)
    fetch_projected = heads * channels <= x.shape[1]
    cut = dgraph.num_interior

    def attend(graph, sources, targets, edge_features):
        return attention.gatv2_attention(graph, sources, targets, att.to(sources.dtype), edge_features,
                                         negative_slope=layer.negative_slope, dropout=layer.dropout,
                                         training=layer.training, bias=bias)

    def boundary(halo: Tensor) -> Tensor:
        halo_h = (halo if fetch_projected else lin_l(halo)).view(-1, heads, channels)
        return attend(split.boundary, dgraph.rolled(h_src, halo_h), h_dst[cut:], features_outer)

    wire = h_src.reshape(-1, heads * channels) if fetch_projected else x
    out = _overlap(dgraph, wire, lambda: attend(split.interior, h_src, h_dst[:cut], features_inner), boundary)
    if out.dtype != att.dtype:  # under autocast, as GATv2Conv: PyG's scores and messages come out in fp32
        out = out.to(torch.promote_types(out.dtype, att.dtype))
    return layer._finish(out, residual, None, None, adjacency, False, bias is not None)


def _transformer(layer: TransformerConv, x: Tensor, dgraph: DistributedGraph, edge_attr: Optional[Tensor]) -> Tensor:
    layer._ran("gnnio")
    heads, channels = layer.heads, layer.out_channels
    width = heads * channels
    names = ("lin_query", "lin_key", "lin_value") + (("lin_skip",) if layer.root_weight else ())
    query, key, value, *rest = project_shared(x, *registered_children(layer, *names))
    skip = rest[0] if rest else None
    query, key, value = (t.view(-1, heads, channels) for t in (query, key, value))
    split = dgraph.split(dgraph.graph)
    edge_features = None if layer.lin_edge is None else layer.lin_edge(edge_attr).view(-1, heads, channels)
    features_inner, features_outer = _edge_rows(split, edge_features)
    fused_skip = skip is not None and layer.lin_beta is None and layer.concat
    residual = skip.view(-1, heads, channels) if fused_skip else None
    fetch_projected = 2 * width <= x.shape[1]
    cut = dgraph.num_interior

    def attend(graph, rows: slice, keys, values, edge_rows):
        return attention.transformer_attention(graph, query[rows], keys, values, edge_rows, dropout=layer.dropout,
                                               training=layer.training,
                                               residual=None if residual is None else residual[rows])

    def boundary(halo: Tensor) -> Tensor:
        if fetch_projected:
            halo_key, halo_value = halo[:, :width], halo[:, width:]
        else:
            halo_key, halo_value = layer.lin_key(halo), layer.lin_value(halo)
        halo_key, halo_value = (t.view(-1, heads, channels) for t in (halo_key, halo_value))
        return attend(split.boundary, slice(cut, None), dgraph.rolled(key, halo_key), dgraph.rolled(value, halo_value),
                      features_outer)

    wire = torch.cat([key.reshape(-1, width), value.reshape(-1, width)], dim=1) if fetch_projected else x
    out = _overlap(dgraph, wire, lambda: attend(split.interior, slice(0, cut), key, value, features_inner), boundary)
    return layer._finish(out, skip, fused_skip)


def _sage(layer: SAGEConv, x: Tensor, dgraph: DistributedGraph, edge_attr: None) -> Tensor:
    layer._ran("gnnio")
    reduce = layer.reduction()
    lin_l = layer.lin_l
    sources = layer.lin(x).relu() if layer.project else x
    # mean and sum are linear: lin_l's weight applied before them makes the halo rows as narrow as the output
    project_first = (not layer.project and reduce in ("sum", "mean") and not _lazy(lin_l.weight)
                     and lin_l.weight.shape[0] < x.shape[1])
    if project_first:
        sources = F.linear(x, lin_l.weight)
    out = _aggregated(dgraph, sources, reduce)
    out = (out if lin_l.bias is None else out + lin_l.bias) if project_first else lin_l(out)
    if layer.root_weight:
        out = out + layer.lin_r(x)
    return F.normalize(out, p=2.0, dim=-1) if layer.normalize else out


def _gin(layer: GINConv, x: Tensor, dgraph: DistributedGraph, edge_attr: None) -> Tensor:
    layer._ran("gnnio")
    return layer.nn(_aggregated(dgraph, x, layer.reduction()) + (1 + layer.eps) * x)


def _aggregated(dgraph: DistributedGraph, sources: Tensor, reduce: str) -> Tensor:
    """The reduction of `sources` (own rows) and their halo rows over each own row's in-edges."""
    split = dgraph.split(dgraph.graph)
    return _overlap(dgraph, sources, lambda: aggregate_neighbours(Adjacency(split.interior), sources, reduce),
                    lambda halo: aggregate_neighbours(Adjacency(split.boundary), dgraph.rolled(sources, halo), reduce))


def _lazy(weight: Tensor) -> bool:
    return isinstance(weight, torch.nn.parameter.UninitializedParameter)


def _gcn(layer: GCNConv, x: Tensor, dgraph: DistributedGraph, edge_weight: Optional[Tensor] = None) -> Tensor:
    reduce = layer.reduction()
    if reduce not in GCN_REDUCTIONS:
        raise GnnioError(f"GCNConv: a DistributedGraph runs aggr 'add' or 'mean', got {layer.aggr!r}")
    layer._ran("gnnio")
    sources = layer.lin(x)
    graph, values = dgraph.graph, edge_weight
    if layer.normalize:
        graph, values = gcn_norm(graph, edge_weight, improved=layer.improved, add_self_loops=layer.add_self_loops,
                                 dtype=sources.dtype, source_degree=dgraph.source_rows)
    split = dgraph.split(graph)
    inner, outer = _edge_rows(split, values)
    out = _overlap(dgraph, sources, lambda: spmm(split.interior, sources, inner, reduce=reduce),
                   lambda halo: spmm(split.boundary, dgraph.rolled(sources, halo), outer, reduce=reduce))
    return layer._finish(out)


def _agnn(layer: AGNNConv, x: Tensor, dgraph: DistributedGraph) -> Tensor:
    layer._ran("gnnio")
    adjacency = Adjacency(dgraph.graph)
    if layer.add_self_loops:
        adjacency, _ = with_self_loops(adjacency, dgraph.num_own)
    split = dgraph.split(adjacency.graph)
    cut = dgraph.num_interior

    def attend(graph, sources, targets):
        return attention.agnn_attention(graph, sources, targets, layer.beta, training=layer.training)

    return _overlap(dgraph, x, lambda: attend(split.interior, x, x[:cut]),
                    lambda halo: attend(split.boundary, dgraph.rolled(x, halo), x[cut:]))


_OVERLAPPED = {GATConv: _gat, GATv2Conv: _gatv2, TransformerConv: _transformer, SAGEConv: _sage, GINConv: _gin}
