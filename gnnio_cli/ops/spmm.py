"""SpMM family: weighted sum/mean over each target's in-edges, and GCN propagation.

``spmm`` computes ``out[t] = sum over CSR row t of w_e * x[src_e]`` (or the mean
over the row's edges), and ``gcn_propagate`` is that sum over the values of
``gcn_norm`` (ops.gcn_norm: PyG 2.8's normalisation on a Graph, which the native
path reuses).

Each public function validates its inputs, asks :func:`dispatch.pick` for a
backend, and runs either the native kernels or the pure-PyTorch reference
below (any device, autograd, fp32 accumulation for 16-bit inputs).
"""

from __future__ import annotations

from typing import Optional

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.ops import dispatch, spmm_native
from gnnio_cli.ops.gcn_norm import gcn_norm
from gnnio_cli.ops.segment import (
    accumulation_dtype,
    check_node_features,
    check_tensor,
    eid_to_slot,
    mean_weights,
    sparse_matmul,
)

SPMM_REDUCTIONS = ("sum", "mean")


def spmm(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None, reduce: str = "sum") -> torch.Tensor:
    """Aggregate source features at each target, optionally weighted per edge.

    graph:       the edges; messages flow source -> target (CSR row = target).
    x:           [num_src, F] or [num_src, *trailing] (trailing dims are flattened
                 and restored).
    edge_weight: optional [E] scalar weight per edge, in the graph's original edge
                 order (eid order), not CSR slot order.
    reduce:      "sum": out[t] = sum_e w_e * x[src_e] over t's in-edges;
                 "mean": that sum divided by t's in-degree (edge count).
    Returns [num_dst, *trailing] in x's dtype; rows without in-edges are 0.
    Gradients flow to x and edge_weight. Deterministic on CPU.
    """
    op = "spmm"
    if reduce not in SPMM_REDUCTIONS:
        raise GnnioError(f"{op}: reduce must be one of {', '.join(SPMM_REDUCTIONS)}, got '{reduce}'")
    check_node_features(op, "x", x, graph, graph.num_src_nodes)
    if edge_weight is not None:
        check_tensor(op, "edge_weight", edge_weight, graph, "[E]", (graph.num_edges,))

    backend = dispatch.pick(op, x, edge_weight)
    if backend == "native" and spmm_native.supports(x, edge_weight):
        return spmm_native.spmm(graph, x, edge_weight, reduce)
    dispatch.record(op, "reference")
    return spmm_reference(graph, x, edge_weight, reduce)


def spmm_reference(
    graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor], reduce: str
) -> torch.Tensor:
    """Pure-PyTorch :func:`spmm` (inputs already validated): one sparse CSR product (see ops.segment)."""
    compute = accumulation_dtype(x.dtype)
    features = x.reshape(x.shape[0], x.shape[1:].numel()).to(compute)
    weights = None if edge_weight is None else eid_to_slot(graph, edge_weight).to(compute)
    if reduce == "mean":  # the mean's 1 / in-degree folded into the product's weights
        weights = mean_weights(graph, compute) if weights is None else weights * mean_weights(graph, compute)
    out = sparse_matmul(graph, weights, features)
    return out.to(x.dtype).reshape(graph.num_dst_nodes, *x.shape[1:])


# ----------------------------------------------------------------- GCN
def gcn_propagate(
    graph: Graph,
    x: torch.Tensor,
    edge_weight: Optional[torch.Tensor] = None,
    *,
    improved: bool = False,
    add_self_loops: bool = True,
    normalize: bool = True,
) -> torch.Tensor:
    """GCNConv's propagation without the linear map and bias: [N, F] -> [N, F].

    With `normalize`, aggregates with :func:`gcn_norm`'s values over the
    self-looped graph (PyG semantics); without, a plain weighted sum over the
    graph's own edges (no loops added, as PyG). Returns x's dtype; 16-bit inputs
    are accumulated (and normalised) in fp32.
    """
    op = "gcn_propagate"
    check_node_features(op, "x", x, graph, graph.num_src_nodes)
    if edge_weight is not None:
        check_tensor(op, "edge_weight", edge_weight, graph, "[E]", (graph.num_edges,))

    backend = dispatch.pick(op, x, edge_weight)
    if backend == "native" and spmm_native.supports(x, edge_weight):
        return spmm_native.gcn_propagate(graph, x, edge_weight, improved, add_self_loops, normalize)
    dispatch.record(op, "reference")
    if not normalize:
        return spmm_reference(graph, x, edge_weight, "sum")
    norm_dtype = edge_weight.dtype if edge_weight is not None else accumulation_dtype(x.dtype)
    looped, values = gcn_norm(
        graph, edge_weight, improved=improved, add_self_loops=add_self_loops, dtype=norm_dtype
    )
    return spmm_reference(looped, x, values, "sum")
