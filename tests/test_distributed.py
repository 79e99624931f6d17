"""Layers on a DistributedGraph across 2 and 3 gloo ranks equal the single-process layers (fp32, 1e-5).

Each rank builds the same random graph (a hub, isolated nodes, self-loops,
duplicates, rows without in-edges), runs every layer kind once on the whole
graph in its own process (the oracle) and once on its part, and compares its
own rows of the output and of x's gradient, and the parameter gradients
summed over ranks. With 3 ranks one part is empty and one owns no edges.
"""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np
import pytest
import torch
import torch.distributed as dist

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.distributed import DistributedGraph, partition_graph
from gnnio_cli.distributed.launch import spawn
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph, catalog
from rank_faults import dying_rank, failing_rank

NUM_NODES, FEATURES, HEADS, EDGE_DIM = 60, 8, 2, 3
# rows 50.. have no in-edges: with 3 ranks cut at [0, 50, 50, 60], rank 1 owns nothing and rank 2 no edges
EDGELESS_FROM = 50
TOLERANCE = dict(atol=1e-5, rtol=1e-5)

CASES = {
    "gcn": lambda: gnnio_nn.GCNConv(FEATURES, FEATURES),
    "gcn-weighted": lambda: gnnio_nn.GCNConv(FEATURES, FEATURES, improved=True),
    "sage-mean": lambda: gnnio_nn.SAGEConv(FEATURES, FEATURES),
    "sage-max": lambda: gnnio_nn.SAGEConv(FEATURES, FEATURES, aggr="max", project=True),
    "gin": lambda: gnnio_nn.GINConv(torch.nn.Linear(FEATURES, FEATURES), train_eps=True),
    "gat": lambda: gnnio_nn.GATConv(FEATURES, 4, heads=HEADS, edge_dim=EDGE_DIM, residual=True),
    "gatv2": lambda: gnnio_nn.GATv2Conv(FEATURES, 4, heads=HEADS),
    "transformer": lambda: gnnio_nn.TransformerConv(FEATURES, 4, heads=HEADS, edge_dim=EDGE_DIM, beta=True),
    "agnn": lambda: gnnio_nn.AGNNConv(),
    # halo rows narrower than x: projections fetched (GAT: h and the source score, 2*2 + 2; Transformer: key
    # and value, 2 * 2*1; SAGE with a sum: x @ W_l^T, 3); wider: x fetched and the halo rows projected on arrival
    "gat-narrow": lambda: gnnio_nn.GATConv(FEATURES, 2, heads=HEADS, edge_dim=EDGE_DIM),
    "transformer-narrow": lambda: gnnio_nn.TransformerConv(FEATURES, 1, heads=HEADS, edge_dim=EDGE_DIM),
    "sage-sum-narrow": lambda: gnnio_nn.SAGEConv(FEATURES, 3, aggr="sum"),
    "gatv2-wide": lambda: gnnio_nn.GATv2Conv(FEATURES, FEATURES, heads=HEADS, concat=False, residual=True),
}
# values per halo row each case's forward exchange moves
WIRE_WIDTHS = {"gat": FEATURES, "gat-narrow": 6, "gatv2": 8, "gatv2-wide": FEATURES, "transformer": FEATURES,
               "transformer-narrow": 4, "sage-mean": FEATURES, "sage-sum-narrow": 3, "sage-max": FEATURES,
               "gin": FEATURES, "agnn": FEATURES}


def _graph(seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    num_edges = 240
    source = rng.integers(0, NUM_NODES, num_edges)
    target = rng.integers(0, EDGELESS_FROM - 10, num_edges)  # rows 40..49 have no in-edges either
    hub = np.full(70, 3)
    loops = np.array([5, 5, 7])
    source = np.concatenate([source, rng.integers(0, NUM_NODES, hub.size), loops, source[:20]])
    target = np.concatenate([target, hub, loops, target[:20]])
    keep = (source != 45) & (target != 45)  # node 45: isolated
    return Graph.from_edge_index(np.stack([source[keep], target[keep]]), size=(NUM_NODES, NUM_NODES))


def _call(layer, name: str, x, edges, edge_attr, edge_weight):
    if name == "gcn-weighted":
        return layer(x, edges, edge_weight)
    if name in ("gat", "gat-narrow", "transformer", "transformer-narrow"):
        return layer(x, edges, edge_attr)
    return layer(x, edges)


def check_layers(rank: int, world_size: int, order: str, row_starts, device: str = "cpu",
                 graph_spec: Optional[str] = None) -> dict:
    """Worker: {case: None or what differs} for every layer case on this rank (on its GPU with device="cuda"),
    on the test graph or on the standard graph `graph_spec` (e.g. "rmat20")."""
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    graph = _graph(seed=7) if graph_spec is None else catalog.resolve(graph_spec).graph
    generator = torch.Generator().manual_seed(11)
    x, weights, edge_attr, grad_out = (tensor.to(device) for tensor in (
        torch.randn(graph.num_nodes, FEATURES, generator=generator),
        torch.rand(graph.num_edges, generator=generator) + 0.5,
        torch.randn(graph.num_edges, EDGE_DIM, generator=generator),
        torch.randn(graph.num_nodes, 2 * FEATURES, generator=generator)))
    partition = partition_graph(graph, world_size, order=order,
                                row_starts=None if row_starts is None else np.asarray(row_starts))
    dgraph = DistributedGraph.from_partition(partition, device=device)
    own, edge_ids = dgraph.own_nodes.to(device), dgraph.edge_ids.to(device)
    graph = graph.to(device)
    failures, wire = {}, {}
    for name, make in CASES.items():
        torch.manual_seed(3)
        whole = make().to(device)
        part = copy.deepcopy(whole)
        x_whole = x.clone().requires_grad_()
        w_whole = weights.clone().requires_grad_()
        out_whole = _call(whole, name, x_whole, graph, edge_attr, w_whole)
        (out_whole * grad_out[:, : out_whole.shape[1]]).sum().backward()

        x_own = x[own].clone().requires_grad_()
        w_own = weights[edge_ids].clone().requires_grad_()
        received = dgraph.log.bytes_received
        out = _call(part, name, x_own, dgraph, edge_attr[edge_ids], w_own)
        if name in WIRE_WIDTHS and dgraph.num_halo:
            wire[name] = (dgraph.log.bytes_received - received) / (dgraph.num_halo * x.element_size())
        (out * grad_out[own, : out.shape[1]]).sum().backward()
        problems = []
        for label, actual, expected in (("output", out, out_whole[own]), ("x gradient", x_own.grad, x_whole.grad[own])):
            if not torch.allclose(actual, expected, **TOLERANCE):
                problems.append(f"{label} differs by {(actual - expected).abs().max().item():.3g}")
        if name == "gcn-weighted":
            gathered = torch.zeros_like(weights).index_add_(0, edge_ids, w_own.grad)
            dist.all_reduce(gathered)
            if not torch.allclose(gathered, w_whole.grad, **TOLERANCE):
                problems.append("edge weight gradient differs")
        for (param_name, expected), actual in zip(whole.named_parameters(), part.parameters()):
            summed = actual.grad.clone() if actual.grad is not None else torch.zeros_like(actual)
            dist.all_reduce(summed)
            # a sum over every node, added up per rank and then across ranks: a different order of the same
            # fp32 sums, so its error scales with the gradient's size (at least 1: some, like TransformerConv's
            # key bias, are 0 up to rounding), not with each entry's
            scale = max(expected.grad.abs().max().item(), 1.0)
            error = (summed - expected.grad).abs().max().item() / scale
            if error > TOLERANCE["rtol"]:
                problems.append(f"{param_name} gradient differs by {error:.3g} of its largest entry")
        failures[name] = "; ".join(problems) or None
    log = dgraph.log
    return {"failures": failures, "own": dgraph.num_own, "halo": dgraph.num_halo, "edges": dgraph.graph.num_edges,
            "interior": dgraph.num_interior, "wire": wire, "exchange_seconds": log.seconds,
            "exposed_seconds": log.exposed_seconds}


THREE_RANKS = (0, EDGELESS_FROM, EDGELESS_FROM, NUM_NODES)


@pytest.fixture(scope="module", params=[(2, "rcm", None, None), (3, "none", THREE_RANKS, None), (3, "rcm", None, "rmat12")],
                ids=["2-ranks-rcm", "3-ranks-empty-and-edgeless-parts", "3-ranks-rmat12-rcm"])
def rank_results(request):
    world_size, order, row_starts, graph_spec = request.param
    results = spawn(check_layers, world_size, (order, row_starts, "cpu", graph_spec), timeout=60, deadline=120)
    return request.param, results


@pytest.mark.parametrize("case", list(CASES))
def test_layer_equals_single_process(rank_results, case):
    (world_size, *_), results = rank_results
    for rank, result in enumerate(results):
        assert result["failures"][case] is None, f"rank {rank} of {world_size}: {result['failures'][case]}"


def test_ranks_with_edges_read_remote_rows(rank_results):
    _, results = rank_results
    assert all(result["halo"] > 0 for result in results if result["edges"])


def test_layers_fetch_the_narrower_rows(rank_results):
    _, results = rank_results
    assert any(result["wire"] for result in results)
    for rank, result in enumerate(results):
        assert result["wire"] == {case: WIRE_WIDTHS[case] for case in result["wire"]}, f"rank {rank}"


def test_interior_and_boundary_rows_both_run(rank_results):
    """Some part has rows that read only own nodes (computed while the halo is in flight) and rows that read
    the halo; the log's exposed share of the exchange time is a part of it."""
    _, results = rank_results
    assert any(0 < result["interior"] < result["own"] for result in results)
    for result in results:
        assert 0 <= result["exposed_seconds"] <= result["exchange_seconds"] + 1e-3


def test_three_ranks_cover_an_empty_part_and_an_edgeless_part(rank_results):
    (_, _, row_starts, _), results = rank_results
    if row_starts != THREE_RANKS:
        pytest.skip("only the partition cut by hand has them")
    assert results[1]["own"] == 0 and results[2]["own"] > 0 and results[2]["edges"] == 0


def test_a_failing_rank_stops_the_run_with_one_line():
    with pytest.raises(GnnioError, match=r"^rank 1 failed: features.h5: no such file$"):
        spawn(failing_rank, 2, timeout=20, deadline=60)


def test_a_rank_that_dies_stops_the_run_with_one_line():
    with pytest.raises(GnnioError, match=r"^rank 0 failed: its process exited with status 3 without a result$"):
        spawn(dying_rank, 2, timeout=20, deadline=60)


@pytest.mark.parametrize("world_size, row_starts, graph_spec, order", [
    (2, None, None, "none"),
    (4, (0, 20, EDGELESS_FROM, EDGELESS_FROM, NUM_NODES), None, "none"),
    (2, None, "rmat20", "none"),
    (4, None, "rmat20", "rcm"),
], ids=["2-gpus", "4-gpus-empty-and-edgeless-parts", "2-gpus-rmat20", "4-gpus-rmat20-rcm"])
def test_nccl_layers_equal_single_gpu(world_size, row_starts, graph_spec, order):
    """The same checks with NCCL, one GPU per rank (the native kernels on each rank's part), on the test graph
    and on rmat20 (every rank also runs the whole graph on its GPU for the oracle)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} CUDA GPUs")
    results = spawn(check_layers, world_size, (order, row_starts, "cuda", graph_spec), device="cuda", timeout=300,
                    deadline=900)
    for rank, result in enumerate(results):
        failed = {case: problem for case, problem in result["failures"].items() if problem}
        assert not failed, f"rank {rank} of {world_size}: {failed}"
