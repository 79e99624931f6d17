"""Structures built with device sorts (graph.compress, graph.loops) equal the CPU's counting sorts exactly.

The device path is plain torch ops, so it runs on the CPU too: CI checks it
there against graph.build; on a GPU the same cases run on CUDA tensors, with
the native graph_facts pass.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph import loops as graph_loops
from gnnio_cli.graph.compress import append_loops_torch, compress, slot_map
from gnnio_cli.graph.schedule import build_row_plan, build_row_plan_torch, choose_tile_edges, measure, row_plan
from gnnio_cli.nn import adjacency as adjacency_module
from testing import DEVICES, INDEX_DTYPES, random_graph, with_index_dtype

ARRAYS = ("csr_indptr", "csr_indices", "csr_eid", "csc_indptr", "csc_indices", "csc_eid")


def _graphs():
    return {
        "small": random_graph(60, 400, seed=1),
        "loop-free": random_graph(60, 400, self_loops=False, seed=2),
        "hub": random_graph(300, 2000, hub_degree=3000, seed=3),
        "bipartite": random_graph(50, 300, num_dst_nodes=35, seed=4),
        "one-edge": Graph.from_arrays(np.array([3]), np.array([3]), 5, 5),
        "empty": Graph.from_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 7, 7),
    }


def assert_same_graph(actual: Graph, expected: Graph) -> None:
    assert (actual.num_src_nodes, actual.num_dst_nodes) == (expected.num_src_nodes, expected.num_dst_nodes)
    for name in ARRAYS:
        got, want = getattr(actual, name).cpu(), getattr(expected, name).cpu()
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", INDEX_DTYPES)
@pytest.mark.parametrize("name", list(_graphs()))
def test_device_grouping_equals_counting_sort(name, index, device):
    host = _graphs()[name]
    source, target = host.edge_index().to(device).to(index)
    parts = compress(source, target, host.num_src_nodes, host.num_dst_nodes, host.csr_indices.dtype)
    assert_same_graph(Graph._wrap(parts, host.num_src_nodes, host.num_dst_nodes), host)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_graphs()))
def test_device_edge_index_graph_and_its_facts(name, device):
    host = _graphs()[name]
    edge_index = host.edge_index().to(device)
    built = Graph._from_device_edge_index(edge_index, None, (host.num_src_nodes, host.num_dst_nodes), None, True)
    assert_same_graph(built, host)
    assert built.facts == host.facts  # measured in the build's one read == counted on the CPU
    if edge_index.numel():
        assert built.edge_index().data_ptr() != edge_index.data_ptr()  # a copy: a later write cannot reach it


def test_facts_count_what_the_schedule_needs():
    graph = random_graph(400, 3000, hub_degree=5000, seed=5)
    facts = graph.facts
    degree = graph.in_degree
    assert facts.csr.max_degree == int(degree.max())
    assert facts.csr.nonempty_rows == int((degree > 0).sum())
    assert facts.csr.tile_edges == choose_tile_edges(graph.csr_indptr)
    tile = facts.csr.tile_edges
    assert facts.csr.heavy_rows == int((degree > tile).sum())
    assert facts.csr.tiles == int(((degree + tile - 1) // tile)[degree > tile].sum())
    source, target = graph.edge_index()
    assert facts.self_loops == int((source == target).sum())
    # the facts of the graph with one loop appended to every node follow from the graph's own
    looped = graph_loops.appended_self_loops(graph, graph.num_nodes)
    counted = measure(looped.csr_indptr, looped.csc_indptr, looped.num_edges, looped.csr_indices, looped.csr_rows)
    assert facts.looped.csr == counted.facts.csr and facts.looped.csc == counted.facts.csc
    assert facts.looped.self_loops == counted.facts.self_loops


def test_super_node_lengthens_the_tile():
    degrees = np.array([300_000, 3, 0] + [1] * 100_000)
    dst = np.repeat(np.arange(degrees.size), degrees)
    graph = Graph.from_arrays(np.zeros(dst.size, np.int64), dst, degrees.size, degrees.size)
    facts = graph.facts.csr
    assert facts.tile_edges == choose_tile_edges(graph.csr_indptr) > 128
    assert (facts.heavy_rows, facts.tiles) == (1, -(-300_000 // facts.tile_edges))


@pytest.mark.parametrize("name", ["small", "hub", "bipartite", "empty"])
def test_row_plan_orders_rows_longest_first(name):
    graph = _graphs()[name]
    schedule, order = row_plan(graph, "csr")
    degree = graph.in_degree
    tile = schedule.tile_edges
    heavy = schedule.heavy_rows.tolist()
    assert heavy == sorted(heavy, key=lambda row: (-int(degree[row]), row))
    assert set(heavy) == set(torch.nonzero(degree > tile).flatten().tolist())
    rows = order.with_bounds[:, 0].tolist()
    assert rows == sorted(rows, key=lambda row: (-int(degree[row]), row))
    assert order.num_busy == int(((degree > 0) & (degree <= tile)).sum())
    assert torch.equal(order.with_bounds[:, 1], graph.csr_indptr[order.with_bounds[:, 0]])
    for tile_index, row in enumerate(schedule.tile_row.tolist()):
        start = int(schedule.tile_start[tile_index])
        assert graph.csr_indptr[row] <= start < graph.csr_indptr[row + 1]
    again = build_row_plan(graph.csr_indptr, tile, len(heavy), schedule.tile_row.numel(),
                           graph.facts.csr.nonempty_rows, 2**40)  # 64-bit sort keys: the same order
    assert torch.equal(again[1].with_bounds, order.with_bounds)


# ------------------------------------------------------------------ self-loop rules
def _host_and_device(graph: Graph, device: str, builder, monkeypatch):
    """`builder(graph)` with the CPU's counting sorts, and with device sorts on `device`."""
    on_host = builder(graph)
    moved = graph.to(device) if device != "cpu" else Graph._wrap(
        compress(*graph.edge_index(), graph.num_src_nodes, graph.num_dst_nodes, graph.csr_indices.dtype),
        graph.num_src_nodes, graph.num_dst_nodes)
    if device == "cpu":
        monkeypatch.setattr(graph_loops, "derived_on_host", graph_loops.derived_on_device)
    return on_host, builder(moved)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["small", "loop-free", "bipartite", "one-edge", "empty"])
@pytest.mark.parametrize("row_major", [False, True])
def test_replaced_self_loops_on_the_device(name, row_major, device, monkeypatch):
    graph = _graphs()[name]
    num_loops = min(graph.num_src_nodes, graph.num_dst_nodes) - (1 if name == "small" else 0)
    host, dev = _host_and_device(
        graph, device, lambda g: graph_loops.replaced_self_loops(g, num_loops, row_major), monkeypatch)
    assert_same_graph(dev.graph, host.graph)
    identity = torch.arange(graph.num_edges)
    assert torch.equal(dev.kept(identity.to(device)).cpu(), host.kept(identity))
    assert (dev.order is None) == (host.order is None)
    if host.order is not None:
        assert torch.equal(dev.order.cpu(), host.order)
    facts, expected = dev.graph.facts, host.graph.facts
    assert (facts.csr, facts.csc, facts.self_loops) == (expected.csr, expected.csc, expected.self_loops)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["small", "loop-free", "hub"])
def test_other_derived_graphs_on_the_device(name, device, monkeypatch):
    graph = _graphs()[name]
    for builder in (lambda g: graph_loops.appended_self_loops(g, g.num_nodes),
                    graph_loops.without_self_loops, graph_loops.edge_messages_graph):
        host, dev = _host_and_device(graph, device, builder, monkeypatch)
        assert_same_graph(dev, host)
        assert dev.facts.csr == host.facts.csr and dev.facts.csc == host.facts.csc
    host, dev = _host_and_device(graph, device, graph_loops.last_loop_eid, monkeypatch)
    assert torch.equal(dev.cpu(), host)


# ------------------------------------------------------------------ the cache on edge_index
def test_cache_serves_the_graph_until_the_ids_change():
    from gnnio_cli.nn.adjacency import as_adjacency

    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    first = as_adjacency(edge_index, 4, 4, torch.device("cpu"))
    assert as_adjacency(edge_index, 4, 4, torch.device("cpu")) is first
    edge_index.data[0, 0] = 2  # torch's version counter does not see this write
    second = as_adjacency(edge_index, 4, 4, torch.device("cpu"))
    assert second is not first and second.edge_index()[0].tolist() == [2, 1, 2, 3]
    edge_index.numpy()[1, 3] = 2  # nor this one
    third = as_adjacency(edge_index, 4, 4, torch.device("cpu"))
    assert third.edge_index()[1].tolist() == [1, 2, 3, 2]
    with torch.inference_mode():
        made_there = torch.tensor([[0, 1], [1, 0]])
        assert as_adjacency(made_there, 2, 2, torch.device("cpu")) is as_adjacency(made_there, 2, 2, torch.device("cpu"))


def test_cache_entries_go_with_their_batch():
    from gnnio_cli.nn import GATConv

    layer = GATConv(8, 4, heads=2)
    x = torch.randn(30, 8)
    generator = torch.Generator().manual_seed(0)
    graphs = []
    for step in range(1000):
        edge_index = torch.randint(0, 30, (2, 60), generator=generator)
        layer(x, edge_index).sum().backward()
        if step % 100 == 0:
            graphs.append(weakref.ref(adjacency_module._ADJACENCY_CACHE[edge_index][(30, 30, "cpu")][1].graph))
        del edge_index
    gc.collect()
    assert len(adjacency_module._ADJACENCY_CACHE) <= 1
    assert all(ref() is None for ref in graphs)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_ids_on_the_device_are_one_line_errors(device):
    for edge_index, size, match in [
        (torch.tensor([[0, 5], [1, 2]]), (4, 4), r"node id out of range for size \(4, 4\): max source 5, max target 2"),
        (torch.tensor([[0, 1], [-1, 2]]), (4, 4), "negative node ids"),
        (torch.tensor([[0, 1], [3, 2]]), (4, 3), r"out of range for size \(4, 3\)"),
    ]:
        with pytest.raises(GnnioError, match=match):
            Graph.from_edge_index(edge_index.to(device), size=size)
    assert issubclass(GnnioError, ValueError)


@pytest.mark.parametrize("device", DEVICES)
def test_layers_under_inference_mode_and_no_grad(device):
    from gnnio_cli import nn

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(40, 16, generator=generator).to(device)
    edge_index = torch.randint(0, 40, (2, 200), generator=generator).to(device)
    for layer in (nn.GCNConv(16, 8), nn.SAGEConv(16, 8), nn.SAGEConv(16, 8, aggr="max"), nn.GINConv(torch.nn.Linear(16, 8)),
                  nn.GATConv(16, 4, heads=2), nn.GATv2Conv(16, 4, heads=2), nn.TransformerConv(16, 4, heads=2),
                  nn.AGNNConv()):
        layer = layer.to(device).eval()
        expected = layer(x, edge_index)
        with torch.no_grad():
            assert torch.allclose(layer(x, edge_index), expected, atol=1e-6)
        with torch.inference_mode():
            x_inf, edge_inf = x.clone(), edge_index.clone()  # inference tensors: no version counter
            assert torch.allclose(layer(x_inf, edge_inf), expected, atol=1e-6)
        # a graph first built under inference mode serves training afterwards
        layer.train()
        out = layer(x, edge_inf)
        out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["small", "loop-free", "hub", "bipartite", "empty"])
def test_loops_appended_without_a_sort(name, device):
    """graph.loops' sort-free append (each slot moves down by the loops above it) equals grouping again."""
    graph = _graphs()[name]
    num_loops = min(graph.num_src_nodes, graph.num_dst_nodes)
    host = graph_loops.appended_self_loops(graph, num_loops)
    moved = graph.to(device) if device != "cpu" else graph
    if device == "cpu":  # the device branch, on CPU tensors
        dev = graph_loops._appended(moved, num_loops, host.facts.self_loops)
    else:
        dev = graph_loops.appended_self_loops(moved, num_loops)
    assert_same_graph(dev, host)
    facts, expected = dev.facts, host.facts
    assert (facts.csr, facts.csc, facts.self_loops) == (expected.csr, expected.csc, expected.self_loops)
    if not graph.is_bipartite and graph.facts.self_loops == 0:
        replaced = graph_loops.replaced_self_loops(moved, num_loops).graph
        assert_same_graph(replaced, host)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("index", INDEX_DTYPES)
@pytest.mark.parametrize("name", ["small", "hub", "bipartite", "one-edge", "empty", "many-rows"])
def test_native_structure_ops_equal_their_torch_ops(name, index, native_extension):
    """gnnio::append_loops, gnnio::row_plan and gnnio::slot_map give exactly what the torch-op versions give,
    on every side, with loops for all rows or some, at the side's tile and at a short tile (more heavy rows).
    row_plan's counting sort takes every graph here but the hub's (a row of 3,000 slots: its radix sort);
    many-rows spans several of the counting sort's chunks of rows."""
    graphs = {**_graphs(), "many-rows": random_graph(5000, 40000, hub_degree=900, seed=5)}
    graph = with_index_dtype(graphs[name], index).to("cuda")
    for side in ("csr", "csc"):
        indptr, indices, eid = (getattr(graph, f"{side}_{part}") for part in ("indptr", "indices", "eid"))
        rows = indptr.numel() - 1
        for num_loops in sorted({0, rows // 2, rows}):
            got = torch.ops.gnnio.append_loops(indptr, indices, eid, num_loops)
            want = append_loops_torch(indptr, indices, eid, num_loops)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and torch.equal(a, b), (side, num_loops)
        degree = indptr.diff()
        longest = int(degree.max()) if rows else 0
        for tile in sorted({choose_tile_edges(indptr), 32}):
            heavy = degree > tile
            counts = (int(heavy.sum()), int(torch.where(heavy, (degree + tile - 1) // tile, 0).sum()),
                      int((degree > 0).sum()), longest)
            schedule, order = build_row_plan(indptr, tile, *counts)
            expected_schedule, expected_order = build_row_plan_torch(indptr, tile, *counts)
            for a, b in zip(schedule.args()[:4], expected_schedule.args()[:4]):
                assert torch.equal(a, b), (side, tile)
            assert torch.equal(order.with_bounds, expected_order.with_bounds) and order.num_busy == expected_order.num_busy
    shuffled = graph.csr_eid[torch.randperm(graph.num_edges, device="cuda")]
    expected = torch.empty_like(shuffled)
    expected[shuffled] = torch.arange(graph.num_edges, device="cuda")
    assert torch.equal(slot_map(shuffled, graph.csr_eid), expected[graph.csr_eid])


# ------------------------------------------------------------------ synchronisations on the GPU
def _layers(channels: int):
    from gnnio_cli import nn

    return [nn.GCNConv(channels, channels), nn.SAGEConv(channels, channels), nn.GINConv(torch.nn.Linear(channels, channels)),
            nn.GATConv(channels, channels // 2, heads=2), nn.GATv2Conv(channels, channels // 2, heads=2),
            nn.TransformerConv(channels, channels // 2, heads=2), nn.AGNNConv()]


def _synchronisations(call) -> list[str]:
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_new_graph_every_step_never_waits_for_the_gpu():
    """Layers on a new graph whose facts are known (what gnnio's loader hands them) run forward and backward
    without a single synchronisation, under torch.cuda.set_sync_debug_mode('error'); a new CUDA edge_index
    costs exactly one: the read that checks its ids and counts its facts."""
    generator = torch.Generator().manual_seed(7)
    channels, nodes = 32, 500

    def new_edges():  # without self-loops, as a batch from a loop-free graph (one that has them costs GAT a read)
        source, target = torch.randint(0, nodes, (2, 4000), generator=generator)
        return torch.stack([source, torch.where(source == target, (target + 1) % nodes, target)]).cuda()

    x = torch.randn(nodes, channels, generator=generator).cuda().requires_grad_()
    for layer in _layers(channels):
        layer = layer.cuda()
        layer(x, new_edges()).sum().backward()  # first calls: kernels load, choices of this graph shape are timed
        graph = Graph.from_edge_index(new_edges(), size=(nodes, nodes))  # a batch's graph with its facts
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            layer(x, graph).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        fresh = new_edges()
        assert len(_synchronisations(lambda: layer(x, fresh))) == 1, type(layer).__name__
