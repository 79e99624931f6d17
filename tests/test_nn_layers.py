"""gnnio's drop-in layers against PyG 2.8's, with identical weights and inputs.

Every layer and documented option combination: outputs, gradients (inputs
and every parameter) and returned attention weights agree to 1e-5 in fp32;
both libraries draw the same initial weights for a seed; state_dicts load
both ways with strict=True; the reprs match. Plus the input forms (edge_index,
torch sparse COO/CSR/CSC adj_t, a gnnio Graph, bipartite pairs with size),
edge-order invariance, empty graphs, dropout, lazy sizes and the Graph cache.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.errors import GnnioError
from gnnio_cli.nn import adjacency as adjacency_module
from testing import DEVICES, random_graph

pyg_nn = pytest.importorskip("torch_geometric.nn")


@pytest.fixture(autouse=True, params=["plain-dense", "fused-dense"])
def dense_path(request, monkeypatch):
    """Every test twice: the small inputs' plain torch projections and gnnio's fused ones (which larger inputs
    take; see nn.linear.HOST_BOUND_ELEMENTS)."""
    from gnnio_cli.nn import linear as linear_module

    if request.param == "fused-dense":
        monkeypatch.setattr(linear_module, "HOST_BOUND_ELEMENTS", -1)

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
NUM_NODES, NUM_EDGES, IN_CHANNELS, OUT_CHANNELS, EDGE_DIM = 14, 40, 6, 5, 3

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ----------------------------------------------------------------- helpers
def edge_index_for(seed: int, num_src: int = NUM_NODES, num_dst: int | None = None, device="cpu") -> torch.Tensor:
    """A random edge list with self-loops, duplicates, empty rows and an isolated node, shuffled."""
    graph = random_graph(num_src, NUM_EDGES, num_dst_nodes=num_dst, seed=seed)
    return graph.edge_index().to(device)


def features(*shape: int, seed: int, device="cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device)


def twins(name: str, *args, seed: int = 0, device="cpu", **kwargs):
    """PyG's layer and gnnio's, each built right after torch.manual_seed(seed); checks they start equal."""
    torch.manual_seed(seed)
    theirs = getattr(pyg_nn, name)(*args, **kwargs)
    torch.manual_seed(seed)
    ours = getattr(gnnio_nn, name)(*args, **kwargs)
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key in their_state:
        assert torch.equal(our_state[key], their_state[key]), f"initial {key} differs"
    assert repr(ours) == repr(theirs)
    return theirs.to(device), ours.to(device)


def run(layer, call, inputs: dict, attention: bool):
    """Forward with fresh leaf copies of `inputs`, backward of a fixed random projection of the results.

    Returns (out, attention edges or None, alpha or None, input grads, parameter grads).
    """
    leaves = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in inputs.items()}
    result = call(layer, leaves)
    out, (edges, alpha) = result if attention else (result, (None, None))
    loss = (out * features(*out.shape, seed=99, device=out.device)).sum()
    if alpha is not None:
        loss = loss + (alpha * features(*alpha.shape, seed=98, device=alpha.device)).sum()
    layer.zero_grad()
    loss.backward()
    parameter_grads = {name: p.grad for name, p in layer.named_parameters()}
    return out, edges, alpha, {name: leaf.grad for name, leaf in leaves.items()}, parameter_grads


def assert_same(theirs, ours, call, inputs: dict, attention: bool = False, compared: dict | None = None) -> None:
    """Outputs, attention and all gradients of the two layers agree to 1e-5.

    compared: optional input name -> bool mask of the gradient entries to compare
    (the others are known to differ, see the caller).
    """
    out_t, edges_t, alpha_t, input_grads_t, param_grads_t = run(theirs, call, inputs, attention)
    out_o, edges_o, alpha_o, input_grads_o, param_grads_o = run(ours, call, inputs, attention)
    torch.testing.assert_close(out_o, out_t, **TOLERANCE)
    if attention:
        torch.testing.assert_close(alpha_o, alpha_t, **TOLERANCE)
        if edges_t.layout == torch.strided:
            assert torch.equal(edges_o, edges_t)
        else:
            assert edges_o.layout == edges_t.layout
            torch.testing.assert_close(edges_o.to_dense(), edges_t.to_dense(), **TOLERANCE)
    for name in inputs:
        grad_t, grad_o = input_grads_t[name], input_grads_o[name]
        assert (grad_t is None) == (grad_o is None), name
        if grad_t is not None:
            mask = (compared or {}).get(name, torch.ones_like(grad_t, dtype=torch.bool))
            torch.testing.assert_close(grad_o[mask], grad_t[mask], **TOLERANCE, msg=lambda m: f"grad of {name}: {m}")
    assert list(param_grads_o) == list(param_grads_t)
    for name, grad_t in param_grads_t.items():
        grad_o = param_grads_o[name]
        assert (grad_t is None) == (grad_o is None), name
        if grad_t is not None:
            torch.testing.assert_close(grad_o, grad_t, **TOLERANCE, msg=lambda m: f"grad of {name}: {m}")


def flags(*names: str):
    """All True/False combinations of the named boolean options, as parametrize ids and dicts."""
    combos = [dict(zip(names, values)) for values in itertools.product([False, True], repeat=len(names))]
    return pytest.mark.parametrize("options", combos, ids=lambda o: "-".join(f"{k}={int(v)}" for k, v in o.items()))


devices = pytest.mark.parametrize("device", DEVICES)


# --------------------------------------------------------------------- GCN
@devices
@pytest.mark.parametrize("edge_weight", [False, True])
@pytest.mark.parametrize("normalization", [(None, True), (False, True), (None, False)], ids=["loops", "no-loops", "raw"])
@flags("improved", "bias")
def test_gcn_matches_pyg(device, edge_weight, normalization, options):
    add_self_loops, normalize = normalization
    theirs, ours = twins(
        "GCNConv", IN_CHANNELS, OUT_CHANNELS, add_self_loops=add_self_loops, normalize=normalize, device=device, **options
    )
    edge_index = edge_index_for(1, device=device)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=2, device=device)}
    compared = {}
    if edge_weight:
        if edge_index.is_cuda:
            # Which of a node's several loop weights PyG keeps is a race on CUDA (index_put with repeats).
            edge_index = edge_index[:, ~shadowed_self_loops(edge_index)]
        inputs["edge_weight"] = features(edge_index.shape[1], seed=3, device=device).abs() + 0.1
        compared["edge_weight"] = ~shadowed_self_loops(edge_index)
    call = lambda layer, t: layer(t["x"], edge_index, t.get("edge_weight"))
    assert_same(theirs, ours, call, inputs, compared=compared)


def shadowed_self_loops(edge_index: torch.Tensor) -> torch.Tensor:
    """bool [E]: self-loops followed by another loop on the same node.

    PyG keeps the last loop's weight, so the earlier ones do not affect the
    output and their true gradient is 0 (gnnio's); PyG's index_put gives them
    the kept loop's gradient instead.
    """
    source, target = edge_index.tolist()
    shadowed, seen = [False] * len(source), set()
    for position in reversed(range(len(source))):
        if source[position] == target[position]:
            shadowed[position] = source[position] in seen
            seen.add(source[position])
    return torch.tensor(shadowed, device=edge_index.device)


def test_gcn_shadowed_self_loop_weights_get_no_gradient():
    layer = gnnio_nn.GCNConv(IN_CHANNELS, OUT_CHANNELS)
    edge_index = edge_index_for(1)
    shadowed = shadowed_self_loops(edge_index)
    assert shadowed.any()
    weight = (features(edge_index.shape[1], seed=3).abs() + 0.1).requires_grad_()
    layer(features(NUM_NODES, IN_CHANNELS, seed=2), edge_index, weight).sum().backward()
    assert torch.all(weight.grad[shadowed] == 0) and torch.all(weight.grad[~shadowed] != 0)


def test_gcn_cached_reuses_the_first_normalisation():
    theirs, ours = twins("GCNConv", IN_CHANNELS, OUT_CHANNELS, cached=True)
    x = features(NUM_NODES, IN_CHANNELS, seed=2)
    first, second = edge_index_for(1), edge_index_for(2)
    for layer in (theirs, ours):
        layer(x, first)
    torch.testing.assert_close(ours(x, second), theirs(x, second), **TOLERANCE)
    torch.testing.assert_close(ours(x, second), ours(x, first), **TOLERANCE)
    assert torch.equal(ours._cached_edge_index[0], theirs._cached_edge_index[0])
    torch.testing.assert_close(ours._cached_edge_index[1], theirs._cached_edge_index[1], **TOLERANCE)
    ours.reset_parameters()
    assert ours._cached_edge_index is None and ours._cached_adj_t is None


def test_gcn_refuses_loops_without_normalisation_and_pairs():
    with pytest.raises(GnnioError, match="normalize"):
        gnnio_nn.GCNConv(4, 4, add_self_loops=True, normalize=False)
    layer = gnnio_nn.GCNConv(4, 4)
    x = features(NUM_NODES, 4, seed=1)
    with pytest.raises(GnnioError, match="pair"):
        layer((x, x), edge_index_for(1))


# -------------------------------------------------------------------- SAGE
@devices
@pytest.mark.parametrize("aggr", ["mean", "sum", "max", "min"])
@flags("normalize", "root_weight", "project")
def test_sage_matches_pyg(device, aggr, options):
    theirs, ours = twins("SAGEConv", IN_CHANNELS, OUT_CHANNELS, aggr=aggr, device=device, **options)
    edge_index = edge_index_for(4, device=device)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=5, device=device)}
    assert_same(theirs, ours, lambda layer, t: layer(t["x"], edge_index), inputs)


@pytest.mark.parametrize("aggr", ["mean", "max"])
@pytest.mark.parametrize("bias", [False, True])
def test_sage_bipartite_matches_pyg(aggr, bias):
    num_src, num_dst = NUM_NODES, 9
    theirs, ours = twins("SAGEConv", (IN_CHANNELS, 4), OUT_CHANNELS, aggr=aggr, bias=bias)
    edge_index = edge_index_for(6, num_src, num_dst)
    inputs = {"x_src": features(num_src, IN_CHANNELS, seed=7), "x_dst": features(num_dst, 4, seed=8)}
    call = lambda layer, t: layer((t["x_src"], t["x_dst"]), edge_index, size=(num_src, num_dst))
    assert_same(theirs, ours, call, inputs)
    no_root = lambda layer, t: layer((t["x_src"], None), edge_index, size=(num_src, num_dst))
    assert_same(theirs, ours, no_root, {"x_src": inputs["x_src"]})


# --------------------------------------------------------------------- GIN
@devices
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("train_eps", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
def test_gin_matches_pyg(device, eps, train_eps, bipartite):
    make_nn = lambda: torch.nn.Sequential(torch.nn.Linear(IN_CHANNELS, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    torch.manual_seed(0)
    theirs = pyg_nn.GINConv(make_nn(), eps=eps, train_eps=train_eps).to(device)
    torch.manual_seed(0)
    ours = gnnio_nn.GINConv(make_nn(), eps=eps, train_eps=train_eps).to(device)
    assert repr(ours) == repr(theirs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    num_dst = 9 if bipartite else None
    edge_index = edge_index_for(9, NUM_NODES, num_dst, device=device)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=10, device=device)}
    if bipartite:
        inputs["x_dst"] = features(num_dst, IN_CHANNELS, seed=11, device=device)
        call = lambda layer, t: layer((t["x"], t["x_dst"]), edge_index, size=(NUM_NODES, num_dst))
    else:
        call = lambda layer, t: layer(t["x"], edge_index)
    assert_same(theirs, ours, call, inputs)


# ------------------------------------------------------ attention layers
ATTENTION_FLAGS = {
    "GATConv": ("concat", "add_self_loops", "edge_dim", "residual"),
    "GATv2Conv": ("concat", "add_self_loops", "edge_dim", "share_weights"),
    "TransformerConv": ("concat", "beta", "root_weight", "edge_dim"),
}
ATTENTION_CASES = [
    (name, dict(zip(names, values)))
    for name, names in ATTENTION_FLAGS.items()
    for values in itertools.product([False, True], repeat=len(names))
]


@devices
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize(
    "name, options", ATTENTION_CASES, ids=[f"{n}-" + "-".join(f"{k}={int(v)}" for k, v in o.items()) for n, o in ATTENTION_CASES]
)
def test_attention_layer_matches_pyg(device, heads, name, options):
    """Every combination of the layer's boolean options, heads 1 and 3, with returned attention."""
    options = dict(options)
    edge_dim = EDGE_DIM if options.pop("edge_dim") else None
    theirs, ours = twins(name, IN_CHANNELS, OUT_CHANNELS, heads=heads, edge_dim=edge_dim, device=device, **options)
    edge_index = edge_index_for(12, device=device)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=13, device=device)}
    if edge_dim:
        inputs["edge_attr"] = features(edge_index.shape[1], EDGE_DIM, seed=14, device=device)
    call = lambda layer, t: layer(t["x"], edge_index, t.get("edge_attr"), return_attention_weights=True)
    assert_same(theirs, ours, call, inputs, attention=True)
    # Without the weights too: on CUDA this is the fused kernels' path (weights with autograd take the reference).
    assert_same(theirs, ours, lambda layer, t: layer(t["x"], edge_index, t.get("edge_attr")), inputs)


@pytest.mark.parametrize("fill_value", ["mean", "add", "max", "min", 0.5, "tensor"])
@pytest.mark.parametrize("layer_name", ["GATConv", "GATv2Conv"])
def test_self_loop_edge_features_follow_fill_value(fill_value, layer_name):
    if fill_value == "tensor":
        fill_value = features(EDGE_DIM, seed=15)
    theirs, ours = twins(layer_name, IN_CHANNELS, OUT_CHANNELS, heads=2, edge_dim=EDGE_DIM, fill_value=fill_value)
    edge_index = edge_index_for(16)
    inputs = {
        "x": features(NUM_NODES, IN_CHANNELS, seed=17),
        "edge_attr": features(edge_index.shape[1], EDGE_DIM, seed=18),
    }
    call = lambda layer, t: layer(t["x"], edge_index, t["edge_attr"], return_attention_weights=True)
    assert_same(theirs, ours, call, inputs, attention=True)


@pytest.mark.parametrize("layer_name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("add_self_loops", [False, True])
def test_gat_bipartite_matches_pyg(layer_name, residual, add_self_loops):
    num_src, num_dst = NUM_NODES, 9
    theirs, ours = twins(
        layer_name, (IN_CHANNELS, 4), OUT_CHANNELS, heads=2, residual=residual, add_self_loops=add_self_loops
    )
    edge_index = edge_index_for(19, num_src, num_dst)
    inputs = {"x_src": features(num_src, IN_CHANNELS, seed=20), "x_dst": features(num_dst, 4, seed=21)}
    if layer_name == "GATConv":
        call = lambda layer, t: layer(
            (t["x_src"], t["x_dst"]), edge_index, size=(num_src, num_dst), return_attention_weights=True
        )
    else:
        call = lambda layer, t: layer((t["x_src"], t["x_dst"]), edge_index, return_attention_weights=True)
    assert_same(theirs, ours, call, inputs, attention=True)


def test_gat_with_missing_target_features_matches_pyg():
    num_src, num_dst = NUM_NODES, 9
    theirs, ours = twins("GATConv", (IN_CHANNELS, 4), OUT_CHANNELS, heads=2)
    edge_index = edge_index_for(22, num_src, num_dst)
    call = lambda layer, t: layer((t["x_src"], None), edge_index, size=(num_src, num_dst))
    assert_same(theirs, ours, call, {"x_src": features(num_src, IN_CHANNELS, seed=23)})


@pytest.mark.parametrize("bias", [False, True])
def test_gat_shared_projection_on_bipartite_pairs_matches_pyg(bias):
    """in_channels as an int with a (x_src, x_dst) pair: one projection for both sides."""
    theirs, ours = twins("GATConv", IN_CHANNELS, OUT_CHANNELS, heads=2, bias=bias)
    edge_index = edge_index_for(24, NUM_NODES, 9)
    inputs = {"x_src": features(NUM_NODES, IN_CHANNELS, seed=25), "x_dst": features(9, IN_CHANNELS, seed=26)}
    assert_same(theirs, ours, lambda layer, t: layer((t["x_src"], t["x_dst"]), edge_index), inputs)


@flags("residual", "bias", "share_weights")
def test_gatv2_residual_and_bias_match_pyg(options):
    theirs, ours = twins("GATv2Conv", IN_CHANNELS, OUT_CHANNELS, heads=2, **options)
    edge_index = edge_index_for(30)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=31)}
    assert_same(theirs, ours, lambda layer, t: layer(t["x"], edge_index), inputs)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [False, True])
def test_transformer_bipartite_matches_pyg(bias, beta):
    theirs, ours = twins("TransformerConv", (IN_CHANNELS, 4), OUT_CHANNELS, heads=2, bias=bias, beta=beta)
    edge_index = edge_index_for(35, NUM_NODES, 9)
    inputs = {"x_src": features(NUM_NODES, IN_CHANNELS, seed=36), "x_dst": features(9, 4, seed=37)}
    assert_same(theirs, ours, lambda layer, t: layer((t["x_src"], t["x_dst"]), edge_index), inputs)


def test_transformer_returns_attention_for_false_too_as_pyg():
    theirs, ours = twins("TransformerConv", IN_CHANNELS, OUT_CHANNELS, heads=2)
    edge_index = edge_index_for(38)
    call = lambda layer, t: layer(t["x"], edge_index, return_attention_weights=False)
    assert_same(theirs, ours, call, {"x": features(NUM_NODES, IN_CHANNELS, seed=39)}, attention=True)


# -------------------------------------------------------------------- AGNN
@devices
@flags("requires_grad", "add_self_loops")
def test_agnn_matches_pyg(device, options):
    theirs, ours = twins("AGNNConv", device=device, **options)
    edge_index = edge_index_for(40, device=device)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=41, device=device)}
    assert_same(theirs, ours, lambda layer, t: layer(t["x"], edge_index), inputs)


# ------------------------------------------------------------ input forms
LAYER_CALLS = {
    "GCNConv": (lambda: ("GCNConv", (IN_CHANNELS, OUT_CHANNELS), {}), lambda layer, x, e: layer(x, e)),
    "GCNConv-raw": (
        lambda: ("GCNConv", (IN_CHANNELS, OUT_CHANNELS), {"normalize": False}),
        lambda layer, x, e: layer(x, e),
    ),
    "SAGEConv-mean": (lambda: ("SAGEConv", (IN_CHANNELS, OUT_CHANNELS), {}), lambda layer, x, e: layer(x, e)),
    "SAGEConv-max": (
        lambda: ("SAGEConv", (IN_CHANNELS, OUT_CHANNELS), {"aggr": "max"}),
        lambda layer, x, e: layer(x, e),
    ),
    "GATConv": (
        lambda: ("GATConv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
        lambda layer, x, e: layer(x, e, return_attention_weights=True),
    ),
    "GATv2Conv": (
        lambda: ("GATv2Conv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
        lambda layer, x, e: layer(x, e, return_attention_weights=True),
    ),
    "TransformerConv": (
        lambda: ("TransformerConv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
        lambda layer, x, e: layer(x, e, return_attention_weights=True),
    ),
    "AGNNConv": (lambda: ("AGNNConv", (), {}), lambda layer, x, e: layer(x, e)),
}
ATTENTION_LAYERS = {"GATConv", "GATv2Conv", "TransformerConv"}


def sparse_adjacency(edge_index: torch.Tensor, layout: torch.layout, weights: torch.Tensor) -> torch.Tensor:
    """PyG's adj_t [num_dst, num_src] of an edge list, in `layout` (duplicates summed)."""
    coo = torch.sparse_coo_tensor(edge_index.flip(0), weights, (NUM_NODES, NUM_NODES)).coalesce()
    if layout == torch.sparse_csr:
        return coo.to_sparse_csr()
    if layout == torch.sparse_csc:
        return coo.to_sparse_csc()
    return coo


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("case", list(LAYER_CALLS))
def test_sparse_adjacency_matches_pyg(layout, weighted, case):
    build, call = LAYER_CALLS[case]
    name, args, kwargs = build()
    if weighted and case in ("SAGEConv-max",):
        pytest.skip("PyG's sparse max has no gradient for weighted inputs; covered by test_weighted_sparse_max")
    theirs, ours = twins(name, *args, **kwargs)
    edge_index = edge_index_for(42)
    num_edges = torch.sparse_coo_tensor(edge_index, torch.ones(edge_index.shape[1])).coalesce()._nnz()
    weights = features(num_edges, seed=43).abs() + 0.5 if weighted else torch.ones(num_edges)
    adj = sparse_adjacency(edge_index, layout, torch.ones(edge_index.shape[1]))
    adj = torch.sparse_coo_tensor(adj.to_sparse_coo().indices(), weights, adj.shape).coalesce()
    adj = adj if layout == torch.sparse_coo else adj.to_sparse_csr()
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=44)}
    assert_same(theirs, ours, lambda layer, t: call(layer, t["x"], adj), inputs, attention=name in ATTENTION_LAYERS)


def test_weighted_sparse_max_matches_pyg_forward():
    theirs, ours = twins("SAGEConv", IN_CHANNELS, OUT_CHANNELS, aggr="max")
    edge_index = edge_index_for(45)
    adj = sparse_adjacency(edge_index, torch.sparse_csr, features(edge_index.shape[1], seed=46).abs() + 0.5)
    x = features(NUM_NODES, IN_CHANNELS, seed=47)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, adj), theirs(x, adj), **TOLERANCE)


@pytest.mark.parametrize("case", ["GCNConv-raw", "SAGEConv-mean", "SAGEConv-max"])
def test_sparse_csc_equals_csr(case):
    build, call = LAYER_CALLS[case]
    name, args, kwargs = build()
    _, ours = twins(name, *args, **kwargs)
    edge_index = edge_index_for(48)
    weights = torch.ones(edge_index.shape[1])
    x = features(NUM_NODES, IN_CHANNELS, seed=49)
    csr = call(ours, x, sparse_adjacency(edge_index, torch.sparse_csr, weights))
    csc = call(ours, x, sparse_adjacency(edge_index, torch.sparse_csc, weights))
    if name in ATTENTION_LAYERS:
        # The weights follow each layout's own edge order; the adjacency they come with must agree.
        (csr, (csr_adj, _)), (csc, (csc_adj, _)) = csr, csc
        torch.testing.assert_close(csc_adj.to_dense(), csr_adj.to_dense())
    torch.testing.assert_close(csc, csr, **TOLERANCE)


@pytest.mark.parametrize("case", list(LAYER_CALLS))
def test_graph_input_equals_edge_index(case):
    build, call = LAYER_CALLS[case]
    name, args, kwargs = build()
    _, ours = twins(name, *args, **kwargs)
    graph = random_graph(NUM_NODES, NUM_EDGES, seed=50)
    x = features(NUM_NODES, IN_CHANNELS, seed=51)
    from_graph, from_edges = call(ours, x, graph), call(ours, x, graph.edge_index().clone())
    if name in ATTENTION_LAYERS:
        (from_graph, (graph_edges, graph_alpha)), (from_edges, (edges, alpha)) = from_graph, from_edges
        assert torch.equal(graph_edges, edges)
        torch.testing.assert_close(graph_alpha, alpha)
    torch.testing.assert_close(from_graph, from_edges)


@pytest.mark.parametrize("case", list(LAYER_CALLS))
def test_permuting_edges_changes_nothing(case):
    build, call = LAYER_CALLS[case]
    name, args, kwargs = build()
    _, ours = twins(name, *args, **kwargs)
    edge_index = edge_index_for(52)
    permutation = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(53))
    x = features(NUM_NODES, IN_CHANNELS, seed=54)
    original, permuted = call(ours, x, edge_index), call(ours, x, edge_index[:, permutation])
    if name in ATTENTION_LAYERS:
        (original, (edges, alpha)), (permuted, (permuted_edges, permuted_alpha)) = original, permuted
        # The same (source, target) pairs carry the same weights; duplicates may swap, with equal weights.
        weight_of = lambda e, a: sorted(zip(map(tuple, e.t().tolist()), (round(v, 5) for v in a.sum(-1).tolist())))
        assert weight_of(edges, alpha) == weight_of(permuted_edges, permuted_alpha)
    torch.testing.assert_close(permuted, original, **TOLERANCE)


@pytest.mark.parametrize("case", list(LAYER_CALLS))
def test_empty_graph_matches_pyg(case):
    build, call = LAYER_CALLS[case]
    name, args, kwargs = build()
    theirs, ours = twins(name, *args, **kwargs)
    empty = torch.empty(2, 0, dtype=torch.long)
    inputs = {"x": features(NUM_NODES, IN_CHANNELS, seed=55)}
    assert_same(theirs, ours, lambda layer, t: call(layer, t["x"], empty), inputs, attention=name in ATTENTION_LAYERS)


@pytest.mark.parametrize("add_self_loops", [False, True])
def test_empty_graph_without_loops_gives_bias_only(add_self_loops):
    theirs, ours = twins("GATConv", IN_CHANNELS, OUT_CHANNELS, heads=2, add_self_loops=add_self_loops)
    x = features(NUM_NODES, IN_CHANNELS, seed=56)
    empty = torch.empty(2, 0, dtype=torch.long)
    torch.testing.assert_close(ours(x, empty), theirs(x, empty), **TOLERANCE)


# ------------------------------------------------------ state and repr
@pytest.mark.parametrize(
    "name, args, kwargs",
    [
        ("GCNConv", (IN_CHANNELS, OUT_CHANNELS), {"bias": False}),
        ("SAGEConv", ((IN_CHANNELS, 4), OUT_CHANNELS), {"aggr": "max", "project": True}),
        ("GATConv", ((IN_CHANNELS, 4), OUT_CHANNELS), {"heads": 3, "edge_dim": 2, "residual": True}),
        ("GATv2Conv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 3, "share_weights": True, "edge_dim": 2}),
        ("TransformerConv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 3, "beta": True, "edge_dim": 2, "concat": False}),
        ("AGNNConv", (), {"requires_grad": False}),
    ],
)
def test_state_dict_round_trips_both_ways(name, args, kwargs):
    torch.manual_seed(1)
    theirs = getattr(pyg_nn, name)(*args, **kwargs)
    torch.manual_seed(2)
    ours = getattr(gnnio_nn, name)(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value)
    torch.manual_seed(3)
    theirs.reset_parameters()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    for key, value in ours.state_dict().items():
        assert torch.equal(theirs.state_dict()[key], value)


@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv"])
def test_lazy_in_channels_match_pyg(name):
    kwargs = {"heads": 2} if name in ATTENTION_LAYERS else {}
    torch.manual_seed(3)
    theirs = getattr(pyg_nn, name)(-1, OUT_CHANNELS, **kwargs)
    torch.manual_seed(3)
    ours = getattr(gnnio_nn, name)(-1, OUT_CHANNELS, **kwargs)
    assert repr(ours) == repr(theirs)
    x, edge_index = features(NUM_NODES, IN_CHANNELS, seed=57), edge_index_for(58)
    torch.manual_seed(4)
    expected = theirs(x, edge_index)
    torch.manual_seed(4)
    actual = ours(x, edge_index)
    expected = expected[0] if isinstance(expected, tuple) else expected
    actual = actual[0] if isinstance(actual, tuple) else actual
    torch.testing.assert_close(actual, expected, **TOLERANCE)
    assert repr(ours) == repr(theirs)


def test_lazy_layer_loads_a_materialised_checkpoint():
    torch.manual_seed(5)
    theirs = pyg_nn.GCNConv(IN_CHANNELS, OUT_CHANNELS)
    ours = gnnio_nn.GCNConv(-1, OUT_CHANNELS)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x, edge_index = features(NUM_NODES, IN_CHANNELS, seed=59), edge_index_for(60)
    torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index), **TOLERANCE)


# ---------------------------------------------------------------- dropout
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_dropout_only_in_training(name):
    theirs, ours = twins(name, IN_CHANNELS, OUT_CHANNELS, heads=2, dropout=0.5)
    x, edge_index = features(NUM_NODES, IN_CHANNELS, seed=61), edge_index_for(62)
    theirs.eval()
    ours.eval()
    torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index), **TOLERANCE)
    # In eval mode the layer is the dropout-free layer with the same weights, whatever the random state.
    undropped = getattr(gnnio_nn, name)(IN_CHANNELS, OUT_CHANNELS, heads=2, dropout=0.0).eval()
    undropped.load_state_dict(ours.state_dict(), strict=True)
    torch.manual_seed(8)
    torch.testing.assert_close(ours(x, edge_index), undropped(x, edge_index), rtol=0, atol=0)
    ours.train()
    theirs.train()
    # The reference ops draw the mask over edges in PyG's order: the same seed gives PyG's mask.
    torch.manual_seed(7)
    expected = theirs(x, edge_index)
    torch.manual_seed(7)
    torch.testing.assert_close(ours(x, edge_index), expected, **TOLERANCE)
    torch.manual_seed(6)
    trained = [ours(x, edge_index, return_attention_weights=True) for _ in range(2)]
    (first, (_, alpha)), (second, _) = trained
    assert not torch.allclose(first, second), "dropout should draw a new mask each call"
    if name != "TransformerConv":  # GAT/GATv2 return the weights after dropout, as PyG
        dropped = (alpha == 0).float().mean().item()
        assert 0.3 < dropped < 0.7


# ------------------------------------------------------------------ cache
def test_graph_cache_is_keyed_by_tensor_and_version():
    layer = gnnio_nn.SAGEConv(IN_CHANNELS, OUT_CHANNELS, aggr="sum")
    x = features(NUM_NODES, IN_CHANNELS, seed=63)
    edge_index = edge_index_for(64)
    adjacency = adjacency_module.as_adjacency(edge_index, NUM_NODES, NUM_NODES, x.device)
    assert adjacency_module.as_adjacency(edge_index, NUM_NODES, NUM_NODES, x.device) is adjacency
    before = layer(x, edge_index)
    reversed_edges = edge_index.flip(0)
    edge_index.copy_(reversed_edges)  # in place: a new version of the same tensor
    assert adjacency_module.as_adjacency(edge_index, NUM_NODES, NUM_NODES, x.device) is not adjacency
    torch.testing.assert_close(layer(x, edge_index), layer(x, reversed_edges.clone()))
    assert not torch.allclose(layer(x, edge_index), before)


def test_graph_cache_entry_dies_with_its_tensor():
    edge_index = edge_index_for(65)
    adjacency_module.as_adjacency(edge_index, NUM_NODES, NUM_NODES, torch.device("cpu"))
    assert edge_index in adjacency_module._ADJACENCY_CACHE
    size_before = len(adjacency_module._ADJACENCY_CACHE)
    del edge_index
    assert len(adjacency_module._ADJACENCY_CACHE) == size_before - 1


def test_bad_inputs_give_one_line_errors():
    layer = gnnio_nn.GATConv(IN_CHANNELS, OUT_CHANNELS)
    x = features(NUM_NODES, IN_CHANNELS, seed=66)
    with pytest.raises(GnnioError, match=r"shape \[2, E\]"):
        layer(x, torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(GnnioError, match="integers"):
        layer(x, torch.zeros(2, 4))
    with pytest.raises(GnnioError, match="out of range"):
        layer(x, torch.tensor([[0, NUM_NODES + 3], [1, 2]]))
    with pytest.raises(ValueError, match="flow"):
        gnnio_nn.SAGEConv(4, 4, flow="sideways")
