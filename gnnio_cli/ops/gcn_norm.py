"""GCN's normalisation, PyG 2.8's ``gcn_norm`` on a Graph: the values both paths of
:func:`gnnio_cli.ops.spmm.gcn_propagate` aggregate with (the native path caches them in its operator)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import last_loop_eid, replaced_self_loops
from gnnio_cli.ops.segment import accumulation_dtype, check_tensor


def gcn_norm(
    graph: Graph,
    edge_weight: Optional[torch.Tensor] = None,
    *,
    improved: bool = False,
    add_self_loops: bool = True,
    dtype: torch.dtype = torch.float32,
    source_degree: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> tuple[Graph, torch.Tensor]:
    """PyG 2.8 ``gcn_norm`` (flow source_to_target) on a Graph.

    With add_self_loops, every existing self-loop is removed and one loop per
    node appended (PyG's ``add_remaining_self_loops``): the result's edges are
    the non-loop edges in their original order, then (i, i) for i = 0..N-1. A
    node that had a self-loop keeps that loop's weight (the last one in edge
    order when it had several); the others get 2 if `improved` else 1.
    As in PyG, without `edge_weight` every edge, loops included, weighs 1, so
    `improved` has no effect then.

    deg[t] = sum of the weights of t's in-edges; the normalised value of edge
    (s, t) is deg[s]^-1/2 * w * deg[t]^-1/2, with 0 where a degree is 0.

    edge_weight: optional [E] in the graph's eid order; its dtype is kept.
    dtype:       dtype of the values when edge_weight is None.
    source_degree: for a bipartite graph whose targets are its first num_dst sources (one rank's part of a
                 row-split graph, gnnio_cli.distributed): maps the targets' degrees [num_dst] to every
                 source's degree [num_src] (the rank's own, then the halo's from their owners). Loops are
                 then added for the num_dst targets only.
    16-bit values are computed in fp32 and rounded once at the end.
    Returns (graph with the loops, values [E'] in that graph's eid order).
    Without edge_weight the result is cached on the graph per (options,
    device, dtype); with it, the values carry gradients to edge_weight.
    """
    op = "gcn_norm"
    if graph.is_bipartite and source_degree is None:
        raise GnnioError(
            f"{op}: needs as many sources as targets, got {graph.num_src_nodes} sources "
            f"and {graph.num_dst_nodes} targets"
        )
    if edge_weight is not None:
        check_tensor(op, "edge_weight", edge_weight, graph, "[E]", (graph.num_edges,))
        return _gcn_norm_reference(graph, edge_weight, improved, add_self_loops, edge_weight.dtype, source_degree)
    key = ("gcn_norm", improved, add_self_loops, str(graph.device), dtype, source_degree is not None)
    return graph.cached(key, lambda: _gcn_norm_reference(graph, None, improved, add_self_loops, dtype, source_degree))


def _gcn_norm_reference(
    graph: Graph,
    edge_weight: Optional[torch.Tensor],
    improved: bool,
    add_self_loops: bool,
    dtype: torch.dtype,
    source_degree: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> tuple[Graph, torch.Tensor]:
    """:func:`gcn_norm` computed in fp32 for 16-bit `dtype` (degrees are sums), returned in `dtype`."""
    compute = accumulation_dtype(dtype)
    if edge_weight is not None:
        edge_weight = edge_weight.to(compute)
    if add_self_loops:
        loops = replaced_self_loops(graph, graph.num_dst_nodes)
        out_graph = loops.graph
        if edge_weight is None:
            weights = torch.ones(out_graph.num_edges, dtype=compute, device=graph.device)
        else:
            existing = last_loop_eid(graph)[: graph.num_dst_nodes]
            fill = torch.full_like(existing, 2.0 if improved else 1.0, dtype=compute)
            # (a graph without edges has no loop to keep, and no weight to index)
            loop_weights = torch.where(existing >= 0, edge_weight[existing.clamp(min=0)], fill) if graph.num_edges else fill
            weights = torch.cat([loops.kept(edge_weight), loop_weights])
    else:
        out_graph = graph
        weights = edge_weight if edge_weight is not None else torch.ones(graph.num_edges, dtype=compute, device=graph.device)
    source, target = out_graph.edge_index()
    degree = weights.new_zeros(out_graph.num_dst_nodes).index_add(0, target, weights)
    inv_sqrt = _inverse_sqrt(degree)
    inv_sqrt_source = inv_sqrt if source_degree is None else _inverse_sqrt(source_degree(degree))
    return out_graph, (inv_sqrt_source[source] * weights * inv_sqrt[target]).to(dtype)


def _inverse_sqrt(degree: torch.Tensor) -> torch.Tensor:
    """degree^-1/2, 0 where the degree is 0."""
    inv_sqrt = degree.pow(-0.5)
    return inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)
