"""The pure-PyTorch reference ops against independent oracles.

Oracles: dense fp64 matrices and per-target Python loops built from the edge
list (tests/testing.py), PyG 2.8's own layers and gcn_norm, and
torch.autograd.gradcheck in fp64 on tiny graphs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.ops import (
    aggregate,
    agnn_attention,
    attention_native,
    dispatch,
    gat_attention,
    gatv2_attention,
    gcn_norm,
    gcn_propagate,
    spmm,
    transformer_attention,
)
from testing import (
    INDEX_DTYPES,
    assert_close,
    dense_adjacency,
    edge_list,
    random_graph,
    randn,
    relative_error,
    with_index_dtype,
)

HEADS, CHANNELS = 3, 5


def graph_cases():
    """(name, graph): a square graph with every edge case and a hub, a bipartite one, an edgeless one."""
    return [
        ("square", random_graph(30, 80, hub_degree=40, seed=11)),
        ("bipartite", random_graph(25, 60, hub_degree=20, num_dst_nodes=17, seed=12)),
        ("no-edges", Graph.from_edge_index(np.zeros((2, 0), dtype=np.int64), num_nodes=6)),
    ]


GRAPHS = graph_cases()


@pytest.fixture(params=[(name, index) for name, _ in GRAPHS for index in INDEX_DTYPES], ids=lambda p: f"{p[0]}-{p[1]}")
def graph(request) -> Graph:
    name, index_dtype = request.param
    return with_index_dtype(dict(GRAPHS)[name], index_dtype)


def tiny_graph(seed: int, bipartite: bool = False) -> Graph:
    """For gradcheck: a handful of nodes with an empty row, loops, duplicates and a small hub."""
    return random_graph(7, 12, hub_degree=5, seed=seed, num_dst_nodes=5 if bipartite else None)


def in_edges(graph: Graph) -> list[list[tuple[int, int]]]:
    """For each target, its (eid, source) pairs, from the edge list by Python loops."""
    rows: list[list[tuple[int, int]]] = [[] for _ in range(graph.num_dst_nodes)]
    for eid, (source, target) in enumerate(edge_list(graph)):
        rows[target].append((eid, source))
    return rows


# ====================================================================== spmm
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_matches_dense(graph, reduce, weighted):
    x = randn(graph.num_src_nodes, 7, dtype=torch.float64)
    weight = randn(graph.num_edges, dtype=torch.float64) if weighted else None
    expected = dense_adjacency(graph, weight) @ x
    if reduce == "mean":
        counts = dense_adjacency(graph).sum(1, keepdim=True)
        expected = expected / counts.clamp(min=1)
    out = spmm(graph, x, weight, reduce)
    assert out.shape == (graph.num_dst_nodes, 7) and out.dtype == torch.float64
    assert_close(out, expected, atol=1e-12, rtol=1e-12)
    assert dispatch.ran()["spmm"] == "reference"


def test_spmm_keeps_trailing_dims_and_reads_non_contiguous_input():
    graph = GRAPHS[0][1]
    x = randn(HEADS, graph.num_src_nodes, CHANNELS, dtype=torch.float64).transpose(0, 1)
    assert not x.is_contiguous()
    out = spmm(graph, x)
    assert out.shape == (graph.num_dst_nodes, HEADS, CHANNELS)
    expected = (dense_adjacency(graph) @ x.reshape(graph.num_src_nodes, -1)).reshape(out.shape)
    assert_close(out, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_spmm_gradcheck(reduce, bipartite):
    graph = tiny_graph(21, bipartite)
    x = randn(graph.num_src_nodes, 3, dtype=torch.float64).requires_grad_()
    weight = randn(graph.num_edges, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: spmm(graph, x, w, reduce), (x, weight))


# =================================================================== gcn_norm
def pyg_gcn_norm(graph: Graph, weight, improved, add_self_loops, dtype=torch.float64):
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as reference

    return reference(graph.edge_index(), weight, graph.num_nodes, improved, add_self_loops, "source_to_target", dtype)


def loop_graph_with_repeated_loops() -> Graph:
    """Node 1 has two self-loops (PyG keeps the last one's weight), node 3 none, node 4 isolated."""
    edges = [(0, 1), (1, 1), (2, 1), (1, 1), (1, 0), (3, 2), (2, 2), (0, 1)]
    return Graph.from_edge_index(np.array(edges).T, num_nodes=5)


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("make_graph", [lambda: GRAPHS[0][1], loop_graph_with_repeated_loops], ids=["random", "loops"])
def test_gcn_norm_equals_pyg_in_order(make_graph, improved, add_self_loops, weighted):
    graph = make_graph()
    weight = randn(graph.num_edges, dtype=torch.float64).abs() + 0.1 if weighted else None
    looped, values = gcn_norm(graph, weight, improved=improved, add_self_loops=add_self_loops, dtype=torch.float64)
    expected_edges, expected_values = pyg_gcn_norm(graph, weight, improved, add_self_loops)
    # Same edges in the same order, hence also the same (src, dst, value) multiset.
    assert torch.equal(looped.edge_index(), expected_edges)
    assert_close(values, expected_values, atol=1e-12, rtol=1e-12)
    assert values.dtype == torch.float64


def test_gcn_norm_is_cached_without_weights():
    graph = GRAPHS[0][1]
    first = gcn_norm(graph)
    assert gcn_norm(graph) is first
    assert gcn_norm(graph, add_self_loops=False) is not first
    assert first[1].dtype == torch.float32


def test_gcn_norm_gradcheck_through_edge_weight():
    graph = tiny_graph(23)
    weight = (randn(graph.num_edges, dtype=torch.float64).abs() + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda w: gcn_norm(graph, w, improved=True)[1], (weight,))


def test_gcn_norm_rejects_bipartite_graphs():
    with pytest.raises(GnnioError, match=r"^gcn_norm: needs as many sources as targets, got 25 sources and 17"):
        gcn_norm(GRAPHS[1][1])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_propagate_equals_pyg_gcnconv(normalize, weighted):
    from torch_geometric.nn import GCNConv

    graph = GRAPHS[0][1]
    torch.manual_seed(3)
    conv = GCNConv(6, 4, bias=False, normalize=normalize).double()
    x = randn(graph.num_nodes, 6, dtype=torch.float64)
    weight = randn(graph.num_edges, dtype=torch.float64).abs() + 0.1 if weighted else None
    expected = conv(x, graph.edge_index(), weight)
    out = gcn_propagate(graph, conv.lin(x), weight, normalize=normalize)
    assert_close(out, expected, atol=1e-12, rtol=1e-10)
    assert dispatch.ran()["gcn_propagate"] == "reference"


def test_gcn_propagate_gradcheck():
    graph = tiny_graph(24)
    x = randn(graph.num_nodes, 3, dtype=torch.float64).requires_grad_()
    weight = (randn(graph.num_edges, dtype=torch.float64).abs() + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: gcn_propagate(graph, x, w, improved=True), (x, weight))


# =================================================================== aggregate
def loop_aggregate(graph: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """Per target and feature, reduce its in-neighbours' values with Python's builtins."""
    out = torch.zeros(graph.num_dst_nodes, x.shape[1], dtype=torch.float64)
    for target, row in enumerate(in_edges(graph)):
        if not row:
            continue
        for feature in range(x.shape[1]):
            values = [x[source, feature].item() for _, source in row]
            out[target, feature] = {
                "sum": sum(values),
                "mean": sum(values) / len(values),
                "max": max(values),
                "min": min(values),
            }[reduce]
    return out


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_aggregate_matches_loops(graph, reduce):
    x = randn(graph.num_src_nodes, 4, dtype=torch.float64)
    out = aggregate(graph, x, reduce)
    assert out.shape == (graph.num_dst_nodes, 4)
    assert_close(out, loop_aggregate(graph, x, reduce), atol=1e-12, rtol=1e-12)
    assert dispatch.ran()["aggregate"] == "reference"


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_aggregate_extremum_gradient_goes_to_smallest_tied_source(reduce):
    graph = GRAPHS[0][1]
    generator = torch.Generator().manual_seed(5)
    # Three distinct values only: most (target, feature) pairs have ties, duplicate edges included.
    x = torch.randint(-1, 2, (graph.num_src_nodes, 6), generator=generator).double().requires_grad_()
    grad_out = randn(graph.num_dst_nodes, 6, dtype=torch.float64, generator=generator)
    aggregate(graph, x, reduce).backward(grad_out)
    expected = torch.zeros_like(x)
    pick = max if reduce == "max" else min
    for target, row in enumerate(in_edges(graph)):
        for feature in range(x.shape[1]):
            if row:
                best = pick(x[source, feature].item() for _, source in row)
                winner = min(source for _, source in row if x[source, feature].item() == best)
                expected[winner, feature] += grad_out[target, feature]
    assert_close(x.grad, expected, atol=0, rtol=0)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_aggregate_gradcheck(reduce, bipartite):
    graph = tiny_graph(25, bipartite)
    x = randn(graph.num_src_nodes, 3, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: aggregate(graph, x, reduce), (x,))
    assert torch.autograd.gradgradcheck(lambda x: aggregate(graph, x, reduce), (x,))


# =================================================================== attention
def loop_attention(graph: Graph, score, message):
    """Per target: softmax over its in-edges of score(eid, s, t) [H], weighted sum of message(eid, s, t) [H, C].

    Returns (out [num_dst, H, C], alpha [E, H] in eid order), fp64.
    """
    rows = in_edges(graph)
    out, alpha = None, None
    for target, row in enumerate(rows):
        if not row:
            continue
        scores = torch.stack([score(eid, source, target) for eid, source in row])
        messages = torch.stack([message(eid, source, target) for eid, source in row])
        weights = torch.softmax(scores, dim=0)
        if out is None:
            out = messages.new_zeros(graph.num_dst_nodes, *messages.shape[1:])
            alpha = scores.new_zeros(graph.num_edges, *scores.shape[1:])
        out[target] = (weights.unsqueeze(-1) * messages).sum(0)
        alpha[[eid for eid, _ in row]] = weights
    return out, alpha


def attention_inputs(graph: Graph, seed: int, requires_grad: bool = False, dtype=torch.float64):
    """Random inputs for every attention op on `graph` (fp64 unless asked)."""
    generator = torch.Generator().manual_seed(seed)
    ns, nd, e = graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges

    def make(*shape):
        return randn(*shape, dtype=dtype, generator=generator).requires_grad_(requires_grad)

    return {
        "gat": dict(x_src=make(ns, HEADS, CHANNELS), alpha_src=make(ns, HEADS), alpha_dst=make(nd, HEADS), edge_alpha=make(e, HEADS)),
        "gatv2": dict(x_src=make(ns, HEADS, CHANNELS), x_dst=make(nd, HEADS, CHANNELS), att=make(HEADS, CHANNELS), edge_feat=make(e, HEADS, CHANNELS)),
        "transformer": dict(query=make(nd, HEADS, CHANNELS), key=make(ns, HEADS, CHANNELS), value=make(ns, HEADS, CHANNELS), edge_feat=make(e, HEADS, CHANNELS)),
        "agnn": dict(x_src=make(ns, CHANNELS), x_dst=make(nd, CHANNELS), beta=make(1)),
    }


ATTENTION_OPS = {
    "gat": gat_attention,
    "gatv2": gatv2_attention,
    "transformer": transformer_attention,
    "agnn": agnn_attention,
}


def loop_oracle(kind: str, graph: Graph, inputs: dict, with_edges: bool):
    """The attention op `kind` written per edge from its formula."""
    i = {name: t.detach() for name, t in inputs.items()}
    if kind == "gat":
        edge = (lambda e: i["edge_alpha"][e]) if with_edges else (lambda e: 0.0)
        return loop_attention(
            graph,
            lambda e, s, t: F.leaky_relu(i["alpha_src"][s] + i["alpha_dst"][t] + edge(e), 0.2),
            lambda e, s, t: i["x_src"][s],
        )
    if kind == "gatv2":
        edge = (lambda e: i["edge_feat"][e]) if with_edges else (lambda e: 0.0)
        return loop_attention(
            graph,
            lambda e, s, t: (i["att"] * F.leaky_relu(i["x_src"][s] + i["x_dst"][t] + edge(e), 0.2)).sum(-1),
            lambda e, s, t: i["x_src"][s],
        )
    if kind == "transformer":
        edge = (lambda e: i["edge_feat"][e]) if with_edges else (lambda e: 0.0)
        return loop_attention(
            graph,
            lambda e, s, t: (i["query"][t] * (i["key"][s] + edge(e))).sum(-1) / math.sqrt(CHANNELS),
            lambda e, s, t: i["value"][s] + edge(e),
        )
    out, alpha = loop_attention(
        graph,
        lambda e, s, t: i["beta"] * torch.dot(i["x_src"][s] / i["x_src"][s].norm(), i["x_dst"][t] / i["x_dst"][t].norm()).view(1),
        lambda e, s, t: i["x_src"][s].view(1, -1),
    )
    return (None, None) if out is None else (out.squeeze(1), alpha.squeeze(1))


def call_attention(kind: str, graph: Graph, inputs: dict, with_edges: bool, **options):
    args = dict(inputs)
    if not with_edges:
        args.pop("edge_alpha", None)
        args.pop("edge_feat", None)
    return ATTENTION_OPS[kind](graph, **args, **options)


@pytest.mark.parametrize("kind", list(ATTENTION_OPS))
@pytest.mark.parametrize("with_edges", [False, True], ids=["no-edge-feat", "edge-feat"])
def test_attention_matches_loops(graph, kind, with_edges):
    if kind == "agnn" and with_edges:
        pytest.skip("AGNN has no edge features")
    inputs = attention_inputs(graph, seed=31)[kind]
    out, alpha = call_attention(kind, graph, inputs, with_edges, return_attention=True)
    expected_out, expected_alpha = loop_oracle(kind, graph, inputs, with_edges)
    head_shape = () if kind == "agnn" else (HEADS,)
    assert alpha.shape == (graph.num_edges, *head_shape)
    assert out.dtype == alpha.dtype == torch.float64
    if expected_out is None:  # no edges at all
        assert not out.any() and out.shape[0] == graph.num_dst_nodes
        return
    assert_close(out, expected_out, atol=1e-12, rtol=1e-10)
    assert_close(alpha, expected_alpha, atol=1e-12, rtol=1e-10)
    assert not out[graph.in_degree == 0].any()
    assert dispatch.ran()[f"{kind}_attention"] == "reference"


@pytest.mark.parametrize("kind", list(ATTENTION_OPS))
@pytest.mark.parametrize("bipartite", [False, True])
def test_attention_gradcheck(kind, bipartite):
    graph = tiny_graph(41, bipartite)
    inputs = attention_inputs(graph, seed=42, requires_grad=True)[kind]
    names = list(inputs)

    def run(*tensors):
        return ATTENTION_OPS[kind](graph, **dict(zip(names, tensors)), return_attention=True)

    assert torch.autograd.gradcheck(run, tuple(inputs.values()))


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_attention_output_bias_is_added_to_every_row(graph, kind):
    """bias [H, C] joins every output row (empty rows get the bias alone); weights are unchanged."""
    inputs = attention_inputs(graph, seed=33)[kind]
    bias = randn(HEADS, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(34))
    out, alpha = ATTENTION_OPS[kind](graph, **inputs, return_attention=True)
    biased, biased_alpha = ATTENTION_OPS[kind](graph, **inputs, return_attention=True, bias=bias)
    assert_close(biased, out + bias, atol=0, rtol=0)
    assert_close(biased_alpha, alpha, atol=0, rtol=0)
    with pytest.raises(GnnioError, match=rf"{kind}_attention: bias must have shape \[H, C\] = \({HEADS}, {CHANNELS}\), got \({HEADS * CHANNELS},\)"):
        ATTENTION_OPS[kind](graph, **inputs, bias=bias.view(-1))


def test_transformer_residual_is_added_to_every_row(graph):
    """residual [Nd, H, C] joins its output row (empty rows get it alone), its gradient is grad_out and the
    weights are unchanged; a residual of another shape is refused naming it."""
    inputs = attention_inputs(graph, seed=35)["transformer"]
    residual = randn(graph.num_dst_nodes, HEADS, CHANNELS, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(36)).requires_grad_()
    out, alpha = transformer_attention(graph, **inputs, return_attention=True)
    with_skip, skip_alpha = transformer_attention(graph, **inputs, return_attention=True, residual=residual)
    assert_close(with_skip, out + residual, atol=0, rtol=0)
    assert_close(skip_alpha, alpha, atol=0, rtol=0)
    grad = randn(*with_skip.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(37))
    (residual_grad,) = torch.autograd.grad(with_skip, [residual], grad)
    assert torch.equal(residual_grad, grad)
    with pytest.raises(GnnioError, match=r"^transformer_attention: residual must have shape \[N, H, C\]"):
        transformer_attention(graph, **inputs, residual=residual[:-1])

def test_attention_softmax_is_stable_for_huge_scores():
    graph = GRAPHS[0][1]
    inputs = attention_inputs(graph, seed=51)["gat"]
    inputs["alpha_src"] = inputs["alpha_src"] * 1e4
    out, alpha = gat_attention(graph, **inputs, return_attention=True)
    assert torch.isfinite(out).all() and torch.isfinite(alpha).all()
    row_sums = torch.zeros(graph.num_dst_nodes, HEADS, dtype=alpha.dtype).index_add(0, graph.edge_index()[1], alpha)
    assert_close(row_sums[graph.in_degree > 0], torch.ones_like(row_sums[graph.in_degree > 0]), atol=1e-12)


def test_attention_dropout_applies_in_training_only_and_returns_pyg_weights():
    graph = GRAPHS[0][1]
    gat = attention_inputs(graph, seed=52)["gat"]
    plain_out, plain_alpha = gat_attention(graph, **gat, return_attention=True)
    eval_out = gat_attention(graph, **gat, dropout=0.5, training=False)
    assert_close(eval_out, plain_out, atol=0, rtol=0)

    torch.manual_seed(0)
    out, alpha = gat_attention(graph, **gat, dropout=0.5, training=True, return_attention=True)
    kept = alpha != 0
    assert 0.3 < kept.double().mean().item() < 0.7
    # GAT returns the weights after dropout, and those are the weights it used.
    assert_close(alpha[kept], plain_alpha[kept] * 2, atol=1e-12, rtol=1e-12)
    source, target = graph.edge_index()
    used = torch.zeros_like(out).index_add(0, target, alpha.unsqueeze(-1) * gat["x_src"][source])
    assert_close(out, used, atol=1e-12, rtol=1e-12)

    transformer = attention_inputs(graph, seed=53)["transformer"]
    plain_out, plain_alpha = transformer_attention(graph, **transformer, return_attention=True)
    out, alpha = transformer_attention(graph, **transformer, dropout=0.5, training=True, return_attention=True)
    # TransformerConv returns the weights before dropout.
    assert_close(alpha, plain_alpha, atol=1e-12, rtol=1e-12)
    assert relative_error(out, plain_out) > 1e-3


# ------------------------------------------------------------ against PyG's layers
def edge_attributes(graph: Graph, width: int) -> torch.Tensor:
    return randn(graph.num_edges, width, dtype=torch.float64, generator=torch.Generator().manual_seed(61))


def check_against_pyg(out, alpha, expected_out, expected_alpha, x, graph: Graph):
    """Outputs, returned attention in eid order, and the gradient reaching the input features."""
    assert_close(out, expected_out, atol=1e-10, rtol=1e-8)
    assert_close(alpha, expected_alpha, atol=1e-10, rtol=1e-8)
    grad_out = randn(*out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(62))
    ours = torch.autograd.grad(out, x, grad_out, retain_graph=True)[0]
    theirs = torch.autograd.grad(expected_out, x, grad_out)[0]
    assert_close(ours, theirs, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("edge_dim", [None, 4])
def test_gat_attention_equals_pyg_gatconv(edge_dim):
    from torch_geometric.nn import GATConv

    graph = GRAPHS[0][1]
    torch.manual_seed(7)
    conv = GATConv(6, CHANNELS, heads=HEADS, add_self_loops=False, edge_dim=edge_dim).double()
    x = randn(graph.num_nodes, 6, dtype=torch.float64).requires_grad_()
    edge_attr = edge_attributes(graph, edge_dim) if edge_dim else None
    expected_out, (pyg_edges, expected_alpha) = conv(x, graph.edge_index(), edge_attr, return_attention_weights=True)
    assert torch.equal(pyg_edges, graph.edge_index())

    x_src = conv.lin(x).view(-1, HEADS, CHANNELS)
    edge_alpha = None
    if edge_dim:
        edge_alpha = (conv.lin_edge(edge_attr).view(-1, HEADS, CHANNELS) * conv.att_edge).sum(-1)
    out, alpha = gat_attention(
        graph,
        x_src,
        (x_src * conv.att_src).sum(-1),
        (x_src * conv.att_dst).sum(-1),
        edge_alpha,
        return_attention=True,
    )
    check_against_pyg(out.reshape(-1, HEADS * CHANNELS) + conv.bias, alpha, expected_out, expected_alpha, x, graph)


@pytest.mark.parametrize("edge_dim", [None, 4])
def test_gatv2_attention_equals_pyg_gatv2conv(edge_dim):
    from torch_geometric.nn import GATv2Conv

    graph = GRAPHS[0][1]
    torch.manual_seed(8)
    conv = GATv2Conv(6, CHANNELS, heads=HEADS, add_self_loops=False, edge_dim=edge_dim, negative_slope=0.3).double()
    x = randn(graph.num_nodes, 6, dtype=torch.float64).requires_grad_()
    edge_attr = edge_attributes(graph, edge_dim) if edge_dim else None
    expected_out, (_, expected_alpha) = conv(x, graph.edge_index(), edge_attr, return_attention_weights=True)

    edge_feat = conv.lin_edge(edge_attr).view(-1, HEADS, CHANNELS) if edge_dim else None
    out, alpha = gatv2_attention(
        graph,
        conv.lin_l(x).view(-1, HEADS, CHANNELS),
        conv.lin_r(x).view(-1, HEADS, CHANNELS),
        conv.att.view(HEADS, CHANNELS),
        edge_feat,
        negative_slope=0.3,
        return_attention=True,
    )
    check_against_pyg(out.reshape(-1, HEADS * CHANNELS) + conv.bias, alpha, expected_out, expected_alpha, x, graph)


@pytest.mark.parametrize("edge_dim", [None, 4])
def test_transformer_attention_equals_pyg_transformerconv_on_bipartite_graph(edge_dim):
    from torch_geometric.nn import TransformerConv

    graph = GRAPHS[1][1]
    torch.manual_seed(9)
    conv = TransformerConv((6, 5), CHANNELS, heads=HEADS, edge_dim=edge_dim).double()
    x_src = randn(graph.num_src_nodes, 6, dtype=torch.float64).requires_grad_()
    x_dst = randn(graph.num_dst_nodes, 5, dtype=torch.float64)
    edge_attr = edge_attributes(graph, edge_dim) if edge_dim else None
    expected_out, (_, expected_alpha) = conv((x_src, x_dst), graph.edge_index(), edge_attr, return_attention_weights=True)

    edge_feat = conv.lin_edge(edge_attr).view(-1, HEADS, CHANNELS) if edge_dim else None
    out, alpha = transformer_attention(
        graph,
        conv.lin_query(x_dst).view(-1, HEADS, CHANNELS),
        conv.lin_key(x_src).view(-1, HEADS, CHANNELS),
        conv.lin_value(x_src).view(-1, HEADS, CHANNELS),
        edge_feat,
        return_attention=True,
    )
    out = out.reshape(-1, HEADS * CHANNELS) + conv.lin_skip(x_dst)
    check_against_pyg(out, alpha, expected_out, expected_alpha, x_src, graph)


def test_agnn_attention_equals_pyg_agnnconv():
    from torch_geometric.nn import AGNNConv

    graph = GRAPHS[0][1]
    conv = AGNNConv(requires_grad=True, add_self_loops=False).double()
    with torch.no_grad():
        conv.beta.fill_(1.7)
    x = randn(graph.num_nodes, 6, dtype=torch.float64).requires_grad_()
    expected = conv(x, graph.edge_index())
    out = agnn_attention(graph, x, x, conv.beta)
    assert_close(out, expected, atol=1e-10, rtol=1e-8)
    grad_out = randn(*out.shape, dtype=torch.float64)
    ours = torch.autograd.grad(out, (x, conv.beta), grad_out, retain_graph=True)
    theirs = torch.autograd.grad(expected, (x, conv.beta), grad_out)
    for mine, pyg in zip(ours, theirs):
        assert_close(mine, pyg, atol=1e-10, rtol=1e-8)


# =================================================================== 16-bit
SIXTEEN_BIT_TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2e-2}


def every_op_on(graph: Graph, seed: int, cast):
    """{name: callable running the op on seeded fp32 inputs passed through `cast`} for every op."""
    generator = torch.Generator().manual_seed(seed)
    x = cast(randn(graph.num_src_nodes, 8, generator=generator))
    weight = cast(randn(graph.num_edges, generator=generator).abs() + 0.1)
    attention = {
        kind: {name: cast(t) for name, t in inputs.items()}
        for kind, inputs in attention_inputs(graph, seed, dtype=torch.float32).items()
    }
    cases = {
        "spmm": lambda: spmm(graph, x, weight),
        "spmm-mean": lambda: spmm(graph, x, reduce="mean"),
        "gcn": lambda: gcn_propagate(graph, x),
    }
    for reduce in ("sum", "mean", "max", "min"):
        cases[f"aggregate-{reduce}"] = lambda reduce=reduce: aggregate(graph, x, reduce)
    for kind, inputs in attention.items():
        cases[kind] = lambda kind=kind, inputs=inputs: call_attention(kind, graph, inputs, with_edges=True)
    return cases


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
def test_sixteen_bit_inputs_give_sixteen_bit_outputs_close_to_fp32(dtype):
    graph = GRAPHS[0][1]
    sixteen = every_op_on(graph, 71, lambda t: t.to(dtype))
    # The fp32 oracle sees the same rounded inputs: only accumulation and output rounding differ.
    oracle = every_op_on(graph, 71, lambda t: t.to(dtype).float())
    for name, run in sixteen.items():
        out = run()
        assert out.dtype == dtype, name
        error = relative_error(out, oracle[name]())
        assert error <= SIXTEEN_BIT_TOLERANCE[dtype], f"{name}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
def test_gcn_norm_in_sixteen_bits_is_the_fp32_result_rounded_once(dtype):
    graph = GRAPHS[0][1]
    weight = randn(graph.num_edges).abs() + 0.1
    for edge_weight, expected_weight in ((None, None), (weight.to(dtype), weight.to(dtype).float())):
        _, values = gcn_norm(graph, edge_weight, dtype=dtype)
        _, expected = gcn_norm(graph, expected_weight)
        assert values.dtype == dtype
        assert torch.equal(values, expected.to(dtype))


# =================================================================== errors
def test_errors_name_the_op_the_argument_and_the_shape():
    graph = GRAPHS[0][1]
    n = graph.num_nodes
    inputs = attention_inputs(graph, seed=81)["gatv2"]
    with pytest.raises(GnnioError, match=r"^gatv2_attention: x_src has 3 dims \[N, H, C\], got shape \(30, 15\)$"):
        gatv2_attention(graph, inputs["x_src"].reshape(n, -1), inputs["x_dst"], inputs["att"])
    with pytest.raises(GnnioError, match=r"^gatv2_attention: att must have shape \[H, C\] = \(3, 5\), got shape \(3, 4\)$"):
        gatv2_attention(graph, inputs["x_src"], inputs["x_dst"], inputs["att"][:, :4])
    with pytest.raises(GnnioError, match=r"^gatv2_attention: inputs must share one dtype, got x_src torch.float64, x_dst torch.float32"):
        gatv2_attention(graph, inputs["x_src"], inputs["x_dst"].float(), inputs["att"])
    with pytest.raises(GnnioError, match=r"^spmm: x must have shape \[N, \*\] = \(30, 2\), got shape \(29, 2\)$"):
        spmm(graph, randn(n - 1, 2))
    with pytest.raises(GnnioError, match=r"^spmm: edge_weight must have shape \[E\]"):
        spmm(graph, randn(n, 2), randn(graph.num_edges + 1))
    with pytest.raises(GnnioError, match=r"^aggregate: reduce must be one of sum, mean, max, min, got 'prod'$"):
        aggregate(graph, randn(n, 2), "prod")
    with pytest.raises(GnnioError, match=r"^aggregate: x must be float32, float64, float16 or bfloat16, got torch.int64$"):
        aggregate(graph, torch.ones(n, 2, dtype=torch.int64), "sum")
    with pytest.raises(GnnioError, match=r"^agnn_attention: beta must be a tensor with one element, got shape \(2,\)$"):
        agnn_attention(graph, randn(n, 3), randn(n, 3), randn(2))
    with pytest.raises(GnnioError, match=r"^transformer_attention: dropout must be between 0 and 1, got 1.5$"):
        transformer_attention(graph, *list(attention_inputs(graph, 82)["transformer"].values())[:3], dropout=1.5)


def test_reference_backend_is_recorded_under_use_backend():
    graph = GRAPHS[0][1]
    dispatch.reset()
    with dispatch.use_backend("reference"):
        aggregate(graph, randn(graph.num_nodes, 2), "max")
    assert dispatch.ran() == {"aggregate": "reference"}


def test_spmm_kernel_candidates_follow_dtype_width_and_alignment():
    """Which kernels the native SpMM times: the rule is plain Python, so CPU tensors exercise it."""
    from gnnio_cli.ops.spmm_native import kernel_candidates

    assert kernel_candidates(torch.ones(4, 128)) == ("csr-vec", "cusparse")
    subwarp = ("csr-vec", "csr-subwarp", "csr-subwarp-sorted")
    for dtype in (torch.float16, torch.bfloat16):
        for width in (8, 64, 120, 128):
            assert kernel_candidates(torch.ones(4, width, dtype=dtype)) == subwarp
        for width in (1, 12, 130, 136, 256):
            assert kernel_candidates(torch.ones(4, width, dtype=dtype)) == ("csr-vec",)
    flat = torch.ones(4 * 64 + 8, dtype=torch.bfloat16)
    assert flat.data_ptr() % 16 == 0
    assert kernel_candidates(flat[1:257].view(4, 64)) == ("csr-vec",)
    assert kernel_candidates(flat[8:264].view(4, 64)) == subwarp


# ------------------------------------------------ attention schedule rules (CPU)
def test_schedule_candidates_and_forced_schedules():
    """Every graph's `compare --schedules` candidates end with no split and the edge-balanced forward; the
    edge-balanced score phase's row map is the CSR row of each slot; a forced schedule must be None, a tile
    length or that name; a super node's tiles stay at most MAX_TILES_PER_ROW per row."""
    from gnnio_cli.graph import schedule
    from gnnio_cli.ops import attention_native as native

    graph = Graph.from_arrays(np.arange(10), (np.arange(10) + 1) % 10, 10, 10)
    assert native.schedule_candidates(graph)[-1] == native.EDGE_BALANCED
    rows = native.slot_rows(graph)
    assert rows.dtype == torch.int32
    assert torch.equal(rows.long(), torch.repeat_interleave(torch.arange(10), graph.csr_indptr.diff()))
    for bad in (0, -5, "tiles", 2.5):
        with pytest.raises(GnnioError, match="schedule must be None, a positive tile length or 'edge-balanced'"):
            with native.forced_schedule(bad):
                pass
    indptr = torch.tensor([0, 2_000_000, 2_000_016])  # a super node and an ordinary row
    tile = schedule.choose_tile_edges(indptr)
    assert tile % 32 == 0 and math.ceil(2_000_000 / tile) <= schedule.MAX_TILES_PER_ROW


def test_kernel_choice_forced_single_and_cached(monkeypatch):
    """ops.tuning.choose_kernel, which both the SpMM family and max/min use: an environment variable forces
    a kernel (one the input cannot take gives the fallback; an unknown name is a one-line error), a single
    candidate needs no timing, and a timed choice is kept per key."""
    from gnnio_cli.ops.tuning import choose_kernel

    def never_run(kernel):
        raise AssertionError(f"{kernel} was timed")

    def choose(candidates, chosen=None):
        return choose_kernel(candidates, variable="GNNIO_TEST_KERNEL", names=("a", "b", "c"), fallback="a",
                             chosen={} if chosen is None else chosen, key="k", run=never_run)

    monkeypatch.setenv("GNNIO_TEST_KERNEL", "b")
    assert choose(("a", "b")) == "b" and choose(("a",)) == "a"
    monkeypatch.setenv("GNNIO_TEST_KERNEL", "z")
    with pytest.raises(GnnioError, match=r"^GNNIO_TEST_KERNEL must be one of a, b, c, got 'z'$"):
        choose(("a", "b"))
    monkeypatch.delenv("GNNIO_TEST_KERNEL")
    assert choose(("c",)) == "c"
    assert choose(("a", "b"), chosen={"k": "b"}) == "b"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_timed_choice_counts_the_hosts_time_to_issue_a_call():
    """ops.tuning.fastest: a call the GPU runs at once but the host takes 5 ms to issue loses to one the GPU
    takes about 1 ms over (a mini-batch's step waits on the host, not on the GPU)."""
    import time

    from gnnio_cli.ops.tuning import fastest

    def run(kernel):
        if kernel == "host-heavy":
            time.sleep(0.005)
            torch.cuda._sleep(1000)
        else:
            torch.cuda._sleep(1_500_000)

    assert fastest(("host-heavy", "gpu-heavy"), run) == "gpu-heavy"
    assert fastest(("gpu-heavy", "host-heavy"), run) == "gpu-heavy"


# ------------------------------------- the attention passes' L2 hints (attention_native.mark_rarely_read)
@pytest.mark.parametrize("hot", [0, 1, 3, 50])
def test_mark_rarely_read_keeps_the_most_read_nodes(hot):
    # node 4 is named by 5 slots, node 1 by 3, node 2 by 2, the rest by one or none
    indices = torch.tensor([4, 1, 4, 2, 4, 1, 0, 4, 2, 1, 4, 5], dtype=torch.int64)
    marked = attention_native.mark_rarely_read(indices, 7, hot)
    assert marked.dtype == torch.int32 and marked.shape == indices.shape
    rare = marked < 0  # bit 31
    assert torch.equal(marked & 0x7FFFFFFF, indices.to(torch.int32))  # the ids themselves are kept
    most_read = [4, 1, 2][: min(hot, 3)]
    for slot, node in enumerate(indices.tolist()):
        if node in most_read or hot >= 7:
            assert not rare[slot], (hot, slot, node)
        elif hot <= 3:
            assert rare[slot], (hot, slot, node)
    assert int((~rare).sum()) >= sum(int((indices == n).sum()) for n in most_read)
