"""The reference ops' sparse products (gnnio_cli.ops.segment) and GATv2's block-wise scores, against oracles.

Oracles: dense fp64 matrices built from the edge list with Python loops, the
per-edge loop formulas of tests/test_ops_reference.py, and torch.autograd's
gradcheck / gradgradcheck in fp64.
"""

from __future__ import annotations

import pytest
import torch

from gnnio_cli.ops import attention, gatv2_attention
from gnnio_cli.ops.segment import (
    sddmm,
    slot_sources,
    slot_targets,
    sparse_matmul,
    sum_by_source,
    sum_by_target,
)
from test_ops_reference import attention_inputs, loop_oracle, tiny_graph
from testing import DEVICES, dense_adjacency, random_graph, randn

HEADS, CHANNELS = 3, 4
devices = pytest.mark.parametrize("device", DEVICES)


def graphs():
    return {
        "square": random_graph(20, 70, hub_degree=15, seed=1),
        "bipartite": random_graph(16, 50, num_dst_nodes=11, seed=2),
    }


def dense_by_head(graph, values: torch.Tensor) -> torch.Tensor:
    """fp64 [H, num_dst, num_src]: entry [h, t, s] sums values[slot, h] over the slots of edges s -> t."""
    slot_values = values.detach().double().cpu()
    out = torch.zeros(slot_values.shape[1], graph.num_dst_nodes, graph.num_src_nodes, dtype=torch.float64)
    for slot, (source, target) in enumerate(zip(slot_sources(graph).tolist(), slot_targets(graph).tolist())):
        out[:, target, source] += slot_values[slot]
    return out


@devices
@pytest.mark.parametrize("name", list(graphs()))
@pytest.mark.parametrize("transpose", [False, True])
def test_sparse_matmul_equals_dense_products(device, name, transpose):
    graph = graphs()[name].to(device)
    generator = torch.Generator().manual_seed(3)
    weights = randn(graph.num_edges, HEADS, dtype=torch.float64, generator=generator, device=device)
    rows = graph.num_dst_nodes if transpose else graph.num_src_nodes
    x = randn(rows, HEADS, CHANNELS, dtype=torch.float64, generator=generator, device=device)
    dense = dense_by_head(graph, weights)
    dense = dense.transpose(1, 2) if transpose else dense
    expected = torch.einsum("hts,shc->thc", dense, x.cpu())
    torch.testing.assert_close(sparse_matmul(graph, weights, x, transpose=transpose).cpu(), expected)
    # one weight per edge, or none at all, scale every feature of the message
    flat = x.reshape(rows, -1)
    unweighted = dense_adjacency(graph.to("cpu"))
    expected = (unweighted.t() if transpose else unweighted) @ flat.cpu()
    torch.testing.assert_close(sparse_matmul(graph, None, flat, transpose=transpose).cpu(), expected)


@devices
@pytest.mark.parametrize("name", list(graphs()))
def test_sddmm_equals_per_edge_dots(device, name):
    graph = graphs()[name].to(device)
    generator = torch.Generator().manual_seed(4)
    a = randn(graph.num_dst_nodes, HEADS, CHANNELS, dtype=torch.float64, generator=generator, device=device)
    b = randn(graph.num_src_nodes, HEADS, CHANNELS, dtype=torch.float64, generator=generator, device=device)
    expected = torch.stack([(a[t] * b[s]).sum(-1) for s, t in zip(slot_sources(graph).tolist(), slot_targets(graph).tolist())])
    torch.testing.assert_close(sddmm(graph, a, b), expected)
    torch.testing.assert_close(sddmm(graph, a[:, 0], b[:, 0]), expected[:, 0])


@pytest.mark.parametrize("heads", [None, HEADS])
def test_products_have_first_and_second_derivatives(heads):
    graph = tiny_graph(5, bipartite=True)
    generator = torch.Generator().manual_seed(5)
    shape = (graph.num_edges,) if heads is None else (graph.num_edges, heads)
    node_shape = (2, CHANNELS) if heads is None else (heads, CHANNELS)
    weights = randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()
    x = randn(graph.num_src_nodes, *node_shape, dtype=torch.float64, generator=generator).requires_grad_()
    g = randn(graph.num_dst_nodes, *node_shape, dtype=torch.float64, generator=generator).requires_grad_()
    assert torch.autograd.gradcheck(lambda w, x: sparse_matmul(graph, w, x), (weights, x))
    assert torch.autograd.gradgradcheck(lambda w, x: sparse_matmul(graph, w, x), (weights, x))
    assert torch.autograd.gradcheck(lambda w, g: sparse_matmul(graph, w, g, transpose=True), (weights, g))
    if heads is not None:
        assert torch.autograd.gradcheck(lambda g, x: sddmm(graph, g, x), (g, x))
        assert torch.autograd.gradgradcheck(lambda g, x: sddmm(graph, g, x), (g, x))


@devices
def test_sums_by_target_and_source_equal_loops(device):
    graph = graphs()["bipartite"].to(device)
    values = randn(graph.num_edges, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6), device=device)
    by_target = torch.zeros(graph.num_dst_nodes, 2, 3, dtype=torch.float64, device=device)
    for start in range(0, graph.num_edges, 7):  # blocks that cut rows apart
        block = slice(start, min(start + 7, graph.num_edges))
        sum_by_target(graph, block, values[block], by_target)
    expected_target = torch.zeros_like(by_target).index_add_(0, slot_targets(graph), values)
    expected_source = torch.zeros(graph.num_src_nodes, 2, 3, dtype=torch.float64, device=device)
    expected_source.index_add_(0, slot_sources(graph), values)
    torch.testing.assert_close(by_target, expected_target)
    torch.testing.assert_close(sum_by_source(graph, values), expected_source)


def slot_blocks_of(size: int):
    return lambda num_edges, width: [slice(start, min(start + size, num_edges)) for start in range(0, num_edges, size)]


@pytest.mark.parametrize("block", [1, 7, 10**6], ids=["slot", "seven-slots", "whole"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_gatv2_scores_in_blocks_match_the_loop_formula(monkeypatch, block, bipartite):
    monkeypatch.setattr(attention, "_slot_blocks", slot_blocks_of(block))
    graph = tiny_graph(7, bipartite)
    inputs = attention_inputs(graph, seed=8, requires_grad=True)["gatv2"]
    out, alpha = gatv2_attention(graph, **inputs, return_attention=True)
    expected_out, expected_alpha = loop_oracle("gatv2", graph, inputs, with_edges=True)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(alpha, expected_alpha)
    names = list(inputs)
    run = lambda *tensors: gatv2_attention(graph, **dict(zip(names, tensors)), return_attention=True)  # noqa: E731
    assert torch.autograd.gradcheck(run, tuple(inputs.values()))
