"""Conformance with PyG 2.8, tested the way PyG tests its layers.

Every case builds PyG's class and gnnio's with the same seed (same initial
weights, same repr, same state_dict keys), runs both on the same inputs and
asserts equal outputs, returned attention structures, and gradients of every
input and parameter (1e-5); or, where PyG raises, that gnnio raises an
exception of PyG's type. Covered: each edge form (edge_index, int32, EdgeIndex,
torch sparse COO/CSR/CSC, torch_sparse SparseTensor where it imports) in both
flow directions, each node-feature form (bipartite pairs, missing targets with
and without size, static graphs, lazy widths), the layers' options, PyG
aggregations gnnio has no kernel for, message-passing hooks, explainer masks,
edge permutation invariance and node permutation equivariance, GCN's cache,
decomposed_layers, reset_parameters, state_dicts both ways, errors and
TorchScript. The main matrix also runs on CUDA where a GPU is visible.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.ops import dispatch
from testing import DEVICES, random_graph

pyg_nn = pytest.importorskip("torch_geometric.nn")
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.nn.conv import MessagePassing  # noqa: E402
from torch_geometric.typing import WITH_TORCH_SPARSE  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
NUM_NODES, NUM_DST, NUM_EDGES, F_IN, F_OUT, HEADS, EDGE_DIM, BATCH = 12, 8, 40, 6, 4, 2, 3, 3
LAYERS = list(gnnio_nn.LAYERS)
ATTENTION = {"GATConv", "GATv2Conv", "TransformerConv"}
SIZED = {"SAGEConv", "GINConv", "GATConv"}  # forward takes size=
devices = pytest.mark.parametrize("device", DEVICES)
layers = pytest.mark.parametrize("name", LAYERS)


# ------------------------------------------------------------------ inputs
def edges(seed: int, num_src: int = NUM_NODES, num_dst: int | None = None, device="cpu") -> torch.Tensor:
    """int64 [2, E]: shuffled, with duplicates, empty rows and self-loops, at most one loop per node
    (a node's several loop weights are where GCN's gradients differ on purpose, see gnnio_cli.nn)."""
    source, target = random_graph(num_src, NUM_EDGES, num_dst_nodes=num_dst, seed=seed).edge_index().tolist()
    seen, keep = set(), []
    for position in reversed(range(len(source))):
        loop = source[position] == target[position]
        keep.append(not (loop and source[position] in seen))
        if loop:
            seen.add(source[position])
    keep = torch.tensor(keep[::-1])
    return torch.tensor([source, target])[:, keep].to(device)


def randn(*shape: int, seed: int, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def adj_t(edge_index: torch.Tensor, layout: torch.layout, num_src: int, num_dst: int, seed: int) -> torch.Tensor:
    """PyG's adj_t [num_dst, num_src] of the edges in `layout`, positive random weights (duplicates summed)."""
    coo = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1], device=edge_index.device),
                                  (num_dst, num_src)).coalesce()
    values = randn(coo._nnz(), seed=seed, device=edge_index.device).abs() + 0.5
    coo = torch.sparse_coo_tensor(coo.indices(), values, coo.shape).coalesce()
    return {torch.sparse_coo: coo, torch.sparse_csr: coo.to_sparse_csr(), torch.sparse_csc: coo.to_sparse_csc()}[layout]


def edge_form(form: str, edge_index: torch.Tensor, num_src: int, num_dst: int):
    if form == "edge_index":
        return edge_index
    if form == "int32":
        return edge_index.int()
    if form == "EdgeIndex":
        return EdgeIndex(edge_index, sparse_size=(num_src, num_dst))
    if form == "EdgeIndex-sorted":
        return EdgeIndex(edge_index, sparse_size=(num_src, num_dst)).sort_by("col")[0]
    if form == "SparseTensor":
        from torch_geometric.typing import SparseTensor

        return SparseTensor.from_torch_sparse_coo_tensor(adj_t(edge_index, torch.sparse_coo, num_src, num_dst, 7))
    layout = {"coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc}[form]
    return adj_t(edge_index, layout, num_src, num_dst, seed=7)


# ------------------------------------------------------------------ layers
def build(library, name: str, in_channels=F_IN, **kwargs):
    if name == "GINConv":
        width = in_channels if isinstance(in_channels, int) else in_channels[1]
        mlp = torch.nn.Sequential(torch.nn.Linear(width, F_OUT), torch.nn.ReLU(), torch.nn.Linear(F_OUT, F_OUT))
        return library.GINConv(mlp, **kwargs)
    if name == "AGNNConv":
        return library.AGNNConv(**kwargs)
    if name in ATTENTION:
        kwargs.setdefault("heads", HEADS)
    return getattr(library, name)(in_channels, F_OUT, **kwargs)


def twins(name: str, *, device="cpu", seed: int = 0, **kwargs):
    """PyG's layer and gnnio's, each built after torch.manual_seed(seed); checks they start alike."""
    torch.manual_seed(seed)
    theirs = build(pyg_nn, name, **kwargs)
    torch.manual_seed(seed)
    ours = build(gnnio_nn, name, **kwargs)
    assert isinstance(ours, MessagePassing)
    assert repr(ours) == repr(theirs)
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    lazy = any(isinstance(value, torch.nn.parameter.UninitializedParameter) for value in their_state.values())
    for key, value in their_state.items():
        if not lazy:  # (a lazy layer's bias is drawn with its weight, at the first call)
            assert torch.equal(our_state[key], value), f"initial {key} differs"
    return theirs.to(device), ours.to(device)


def outcome(layer, call, inputs: dict):
    """("raised", exception) or ("ran", result, input grads, parameter grads) of `call` on fresh leaves,
    backward of a fixed random projection of every floating-point output."""
    leaves = {key: t.detach().clone().requires_grad_(t.is_floating_point()) for key, t in inputs.items()}
    try:
        result = call(layer, leaves)
    except Exception as error:  # compared with PyG's below
        return ("raised", error)
    floats = [t for t in flatten(result) if t.is_floating_point() and t.requires_grad]
    loss = sum((dense(t) * randn(*t.shape, seed=90 + i, device=t.device)).sum() for i, t in enumerate(floats))
    layer.zero_grad()
    if floats:
        loss.backward()
    return ("ran", result, {key: leaf.grad for key, leaf in leaves.items()},
            {key: p.grad for key, p in layer.named_parameters()})


def flatten(result) -> list:
    if isinstance(result, (tuple, list)):
        return [t for part in result for t in flatten(part)]
    if isinstance(result, torch.Tensor):
        return [result]
    return [result.to_torch_sparse_coo_tensor()]  # a SparseTensor


def dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout != torch.strided else t


def assert_same_result(ours, theirs, where: str = "output") -> None:
    """Same structure, types, layouts and values (integer tensors exactly)."""
    if theirs is None:
        assert ours is None, where
        return
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), where
        for index, (mine, their) in enumerate(zip(ours, theirs)):
            assert_same_result(mine, their, f"{where}[{index}]")
        return
    assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} != {type(theirs).__name__}"
    if not isinstance(theirs, torch.Tensor):  # a SparseTensor
        ours, theirs = ours.to_dense(), theirs.to_dense()
    assert ours.layout == theirs.layout, where
    if theirs.is_floating_point():
        torch.testing.assert_close(dense(ours), dense(theirs), **TOLERANCE, msg=lambda m: f"{where}: {m}")
    else:
        assert torch.equal(dense(ours).cpu(), dense(theirs).cpu()), where


def assert_conforms(theirs, ours, call, inputs: dict, path: str | None = "gnnio") -> None:
    """gnnio's layer does what PyG's does: the same results and gradients, or an exception of PyG's type.
    path: the path gnnio's call must have taken (when it ran)."""
    their_outcome = outcome(theirs, call, inputs)
    our_outcome = outcome(ours, call, inputs)
    if their_outcome[0] == "raised":
        assert our_outcome[0] == "raised", f"PyG raised {their_outcome[1]!r}, gnnio ran"
        assert isinstance(our_outcome[1], type(their_outcome[1])), (our_outcome[1], their_outcome[1])
        return
    assert our_outcome[0] == "ran", f"gnnio raised {our_outcome[1]!r}, PyG ran"
    assert_same_result(our_outcome[1], their_outcome[1])
    for kind, mine, their in (("input", our_outcome[2], their_outcome[2]), ("parameter", our_outcome[3], their_outcome[3])):
        assert list(mine) == list(their)
        for key in their:
            assert (mine[key] is None) == (their[key] is None), f"{kind} {key}"
            if their[key] is not None:
                torch.testing.assert_close(mine[key], their[key], **TOLERANCE, msg=lambda m: f"grad of {key}: {m}")
    if path is not None:
        assert ours.last_path == path


def forward_call(name: str, edge_index, *, size=None, edge_attr: bool = False, attention: bool = True):
    """layer(x, edges, ...) with what the layer takes: GCN the edge weights, attention layers edge_attr
    and return_attention_weights, SAGE/GIN/GAT size."""

    def call(layer, t):
        x = t["x"] if "x_dst" not in t else (t["x"], t["x_dst"])
        kwargs = {}
        if name == "GCNConv" and "edge_weight" in t:
            kwargs["edge_weight"] = t["edge_weight"]
        if name in ATTENTION:
            if edge_attr:
                kwargs["edge_attr"] = t["edge_attr"]
            if attention:
                kwargs["return_attention_weights"] = True
        if name in SIZED and size is not None:
            kwargs["size"] = size
        return layer(x, edge_index, **kwargs)

    return call


# ------------------------------------------------------------ edge forms
EDGE_FORMS = ["edge_index", "int32", "EdgeIndex", "EdgeIndex-sorted", "coo", "csr", "csc", "SparseTensor"]
FLOWS = ["source_to_target", "target_to_source", "target_to_source-attribute"]


@devices
@layers
@pytest.mark.parametrize("form", EDGE_FORMS)
@pytest.mark.parametrize("flow", FLOWS)
def test_edge_forms_match_pyg(device, name, form, flow):
    if form == "SparseTensor" and not WITH_TORCH_SPARSE:
        pytest.skip("torch_sparse does not import")
    kwargs = {"flow": flow} if flow == "target_to_source" else {}
    theirs, ours = twins(name, device=device, **kwargs)
    if flow.endswith("attribute"):
        theirs.flow = ours.flow = "target_to_source"
    edge_index = edges(1, device=device)
    inputs = {"x": randn(NUM_NODES, F_IN, seed=2, device=device)}
    if name == "GCNConv" and form in ("edge_index", "int32", "EdgeIndex", "EdgeIndex-sorted"):
        inputs["edge_weight"] = randn(edge_index.shape[1], seed=3, device=device).abs() + 0.1
    given = edge_form(form, edge_index, NUM_NODES, NUM_NODES)
    path = "pyg" if form == "SparseTensor" else "gnnio"
    call = forward_call(name, given)
    if form == "int32":  # PyG 2.8's gradients through int32 scatter indices are wrong: compare with int64's
        call = lambda layer, t: forward_call(name, given if layer is ours else edge_index)(layer, t)  # noqa: E731
    assert_conforms(theirs, ours, call, inputs, path=path)


# ---------------------------------------------------- node-feature forms
def pair_layers(name: str):
    if name in ("GCNConv", "AGNNConv"):
        pytest.skip(f"{name} has no bipartite form")


@devices
@layers
@pytest.mark.parametrize("form", ["edge_index", "csr", "EdgeIndex"])
@pytest.mark.parametrize("separate", [False, True], ids=["shared-width", "pair-widths"])
def test_bipartite_pairs_match_pyg(device, name, form, separate):
    pair_layers(name)
    in_channels = (F_IN, F_IN + 1) if separate and name != "GINConv" else F_IN
    theirs, ours = twins(name, device=device, in_channels=in_channels)
    width = in_channels if isinstance(in_channels, int) else in_channels[1]
    edge_index = edges(4, NUM_NODES, NUM_DST, device=device)
    inputs = {"x": randn(NUM_NODES, F_IN, seed=5, device=device), "x_dst": randn(NUM_DST, width, seed=6, device=device)}
    given = edge_form(form, edge_index, NUM_NODES, NUM_DST)
    assert_conforms(theirs, ours, forward_call(name, given), inputs)


@devices
@layers
@pytest.mark.parametrize("sized", [True, False], ids=["size", "no-size"])
def test_missing_target_features_match_pyg(device, name, sized):
    pair_layers(name)
    theirs, ours = twins(name, device=device)
    edge_index = edges(8, NUM_NODES, NUM_DST, device=device)
    size = (NUM_NODES, NUM_DST) if sized else None
    x = randn(NUM_NODES, F_IN, seed=9, device=device)

    def call(layer, t):
        kwargs = {"size": size} if name in SIZED else {}
        return layer((t["x"], None), edge_index, **kwargs)

    path = "gnnio" if name in SIZED else "pyg"  # PyG fails for GATv2Conv and TransformerConv; so does gnnio
    assert_conforms(theirs, ours, call, {"x": x}, path=path)


@devices
@layers
@pytest.mark.parametrize("form", ["edge_index", "csr"])
def test_static_graphs_match_pyg(device, name, form):
    if device == "cuda" and form != "edge_index":
        # Where PyG's own code refuses a static graph's sparse adjacency on the CPU (it indexes with the batch
        # size as the node count), on CUDA it fails a device-side assert, which leaves the process's CUDA
        # context unusable for every later test: such a case runs on the CPU only.
        theirs_cpu, _ = twins(name)
        cpu_given = edge_form(form, edges(10), NUM_NODES, NUM_NODES)
        cpu_inputs = {"x": randn(BATCH, NUM_NODES, F_IN, seed=11)}
        if outcome(theirs_cpu, forward_call(name, cpu_given, attention=False), cpu_inputs)[0] == "raised":
            pytest.skip(f"PyG's {name} refuses this input on the CPU (on CUDA it may fail a device-side assert); checked there")
    theirs, ours = twins(name, device=device)
    edge_index = edges(10, device=device)
    inputs = {"x": randn(BATCH, NUM_NODES, F_IN, seed=11, device=device)}
    given = edge_form(form, edge_index, NUM_NODES, NUM_NODES)
    path = "gnnio" if name in ("GCNConv", "SAGEConv", "GINConv") else "pyg"
    assert_conforms(theirs, ours, forward_call(name, given, attention=False), inputs, path=path)


@devices
@layers
@pytest.mark.parametrize("bipartite", [False, True])
def test_lazy_widths_match_pyg(device, name, bipartite):
    if name in ("GINConv", "AGNNConv") or (bipartite and name == "GCNConv"):
        pytest.skip(f"{name} has no {'bipartite ' if bipartite else ''}lazy width")
    in_channels = (-1, -1) if bipartite else -1
    theirs, ours = twins(name, device=device, in_channels=in_channels)
    edge_index = edges(12, NUM_NODES, NUM_DST if bipartite else None, device=device)
    inputs = {"x": randn(NUM_NODES, F_IN, seed=13, device=device)}
    if bipartite:
        inputs["x_dst"] = randn(NUM_DST, F_IN + 2, seed=14, device=device)
    # Lazy weights are drawn on the first call: draw them with the same seed on both sides.
    torch.manual_seed(15)
    forward_call(name, edge_index)(theirs, inputs)
    torch.manual_seed(15)
    forward_call(name, edge_index)(ours, inputs)
    assert_conforms(theirs, ours, forward_call(name, edge_index), inputs)


# ---------------------------------------------------------------- options
OPTIONS = {
    "GCNConv": [dict(improved=True), dict(add_self_loops=False), dict(normalize=False), dict(bias=False),
                dict(aggr="mean"), dict(cached=True), dict(improved=True, aggr="mean", normalize=True)],
    "SAGEConv": [dict(aggr="sum"), dict(aggr="max"), dict(aggr="min"), dict(normalize=True),
                 dict(root_weight=False), dict(project=True), dict(bias=False)],
    "GINConv": [dict(eps=0.5), dict(train_eps=True), dict(aggr="mean"), dict(aggr="max")],
    "GATConv": [dict(concat=False), dict(negative_slope=0.1), dict(add_self_loops=False), dict(bias=False),
                dict(residual=True), dict(edge_dim=EDGE_DIM), dict(edge_dim=EDGE_DIM, fill_value=0.5),
                dict(edge_dim=EDGE_DIM, fill_value="max"), dict(edge_dim=1), dict(edge_dim=EDGE_DIM, residual=True,
                                                                                 concat=False)],
    "GATv2Conv": [dict(concat=False), dict(share_weights=True), dict(add_self_loops=False), dict(bias=False),
                  dict(residual=True), dict(edge_dim=EDGE_DIM), dict(edge_dim=EDGE_DIM, fill_value="add"),
                  dict(edge_dim=1)],
    "TransformerConv": [dict(concat=False), dict(beta=True), dict(root_weight=False), dict(bias=False),
                        dict(edge_dim=EDGE_DIM), dict(edge_dim=EDGE_DIM, beta=True, concat=False)],
    "AGNNConv": [dict(requires_grad=False), dict(add_self_loops=False)],
}
OPTION_CASES = [(name, options) for name, cases in OPTIONS.items() for options in cases]


@devices
@pytest.mark.parametrize("name, options", OPTION_CASES,
                         ids=[f"{name}-" + "-".join(f"{k}={v}" for k, v in o.items()) for name, o in OPTION_CASES])
def test_options_match_pyg(device, name, options):
    theirs, ours = twins(name, device=device, **options)
    edge_index = edges(16, device=device)
    inputs = {"x": randn(NUM_NODES, F_IN, seed=17, device=device)}
    edge_dim = options.get("edge_dim")
    if edge_dim:
        shape = (edge_index.shape[1],) if edge_dim == 1 and name != "TransformerConv" else (edge_index.shape[1], edge_dim)
        inputs["edge_attr"] = randn(*shape, seed=18, device=device)
    if name == "GCNConv" and not options.get("cached"):  # (a cached normalisation cannot carry gradients twice)
        inputs["edge_weight"] = randn(edge_index.shape[1], seed=19, device=device).abs() + 0.1
    call = forward_call(name, edge_index, edge_attr=bool(edge_dim))
    assert_conforms(theirs, ours, call, inputs)
    if options.get("cached"):  # a second call with other edges reuses the first normalisation
        other = forward_call(name, edges(20, device=device))
        assert_conforms(theirs, ours, other, inputs)


def test_edge_attr_forms_pyg_does_not_take_run_pyg_code():
    # PyG broadcasts (or fails on) raw edge features without edge_dim; gnnio runs PyG's code for them.
    for name, width in (("TransformerConv", F_OUT), ("GATv2Conv", EDGE_DIM), ("TransformerConv", 1)):
        options = {"edge_dim": 1} if width == 1 else {}
        theirs, ours = twins(name, **options)
        edge_index = edges(21)
        shape = (edge_index.shape[1],) if width == 1 else (edge_index.shape[1], width)
        inputs = {"x": randn(NUM_NODES, F_IN, seed=22), "edge_attr": randn(*shape, seed=23)}
        assert_conforms(theirs, ours, forward_call(name, edge_index, edge_attr=True), inputs, path=None)
        assert ours.last_path == "pyg"


# ------------------------------------------------ aggregations PyG has
def aggregation_cases():
    from torch_geometric.nn import aggr

    return {
        "lstm": dict(aggr="lstm"),
        "list": dict(aggr=["mean", "max", "std"]),
        "list-proj": dict(aggr=["mean", "sum"], aggr_kwargs=dict(mode="proj", mode_kwargs=dict(in_channels=F_IN,
                                                                                               out_channels=F_IN))),
        "std": dict(aggr="std"),
        "var": dict(aggr="var"),
        "softmax": dict(aggr="softmax", aggr_kwargs=dict(learn=True)),
        "powermean": dict(aggr="powermean", aggr_kwargs=dict(learn=True)),
        "mul": dict(aggr="mul"),
        "object": dict(aggr=aggr.MedianAggregation()),
        "mlp": dict(aggr=aggr.MLPAggregation(F_IN, F_IN, 9, num_layers=1)),
    }


@pytest.mark.parametrize("name", ["SAGEConv", "GINConv"])
@pytest.mark.parametrize("case", list(aggregation_cases()))
def test_aggregations_without_kernel_run_pyg_code(name, case):
    options = aggregation_cases()[case]
    if name == "GINConv" and case in ("lstm", "mlp", "list", "list-proj"):
        pytest.skip("GINConv's nn takes the aggregation's width: PyG sizes it only for SAGEConv")
    theirs, ours = twins(name, **options)
    edge_index = edges(24)
    edge_index = edge_index[:, edge_index[1].argsort(stable=True)]  # lstm and mlp need edges sorted by target
    dispatch.reset()
    assert_conforms(theirs, ours, forward_call(name, edge_index), {"x": randn(NUM_NODES, F_IN, seed=25)}, path="pyg")
    assert dispatch.ran()[name] == "pyg"
    unsorted = edges(24)  # PyG refuses unsorted edges for lstm: so does gnnio
    assert_conforms(theirs, ours, forward_call(name, unsorted), {"x": randn(NUM_NODES, F_IN, seed=25)}, path=None)


@pytest.mark.parametrize("name, aggr", [("GCNConv", "max"), ("GCNConv", "min"), ("GATConv", "mean"),
                                        ("GATv2Conv", "max"), ("TransformerConv", "mean"), ("AGNNConv", "mean")])
def test_other_layers_take_any_aggregation(name, aggr):
    theirs, ours = twins(name, aggr=aggr)
    assert_conforms(theirs, ours, forward_call(name, edges(26)), {"x": randn(NUM_NODES, F_IN, seed=27)}, path="pyg")


# -------------------------------------------------- message-passing hooks
HOOKS = ["propagate_forward_pre", "propagate_forward", "message_forward_pre", "message_forward",
         "aggregate_forward_pre", "aggregate_forward", "edge_update_forward_pre", "edge_update_forward"]


@layers
@pytest.mark.parametrize("hook", HOOKS)
def test_hooks_see_and_change_what_pyg_hooks_do(name, hook):
    theirs, ours = twins(name)
    edge_index = edges(28)
    seen = {"theirs": [], "ours": []}

    def recorder(side):
        def record(module, inputs, output=None):
            seen[side].append([t.detach().clone() for t in flatten_hook(inputs)])
            if output is not None and isinstance(output, torch.Tensor):
                return output * 1.5  # a forward hook may change the output
        return record

    handles = [getattr(layer, f"register_{hook}_hook")(recorder(side))
               for layer, side in ((theirs, "theirs"), (ours, "ours"))]
    assert_conforms(theirs, ours, forward_call(name, edge_index), {"x": randn(NUM_NODES, F_IN, seed=29)}, path="pyg")
    assert len(seen["ours"]) == len(seen["theirs"])
    for mine, their in zip(seen["ours"], seen["theirs"]):
        assert len(mine) == len(their)
        for a, b in zip(mine, their):
            torch.testing.assert_close(dense(a).double(), dense(b).double(), **TOLERANCE)
    for handle in handles:
        handle.remove()
    assert_conforms(theirs, ours, forward_call(name, edge_index), {"x": randn(NUM_NODES, F_IN, seed=29)})


def flatten_hook(inputs) -> list:
    if isinstance(inputs, dict):
        return [t for key in sorted(inputs) for t in flatten_hook(inputs[key])]
    if isinstance(inputs, (tuple, list)):
        return [t for part in inputs for t in flatten_hook(part)]
    return [inputs] if isinstance(inputs, torch.Tensor) else []


# ------------------------------------------------------------- explain
class TwoLayers(torch.nn.Module):
    def __init__(self, library, name: str):
        super().__init__()
        self.first = build(library, name)
        width = F_IN if name == "AGNNConv" else F_OUT * (HEADS if name in ATTENTION else 1)
        self.second = build(library, name, in_channels=width)

    def forward(self, x, edge_index):
        first = self.first(x, edge_index).relu()
        return self.second(first, edge_index)


@layers
def test_explainer_edge_masks_match_pyg(name):
    from torch_geometric.explain import Explainer, GNNExplainer

    explanations = []
    for library in (pyg_nn, gnnio_nn):
        torch.manual_seed(30)
        model = TwoLayers(library, name)
        explainer = Explainer(model=model, algorithm=GNNExplainer(epochs=3), explanation_type="model",
                              node_mask_type="attributes", edge_mask_type="object",
                              model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
        torch.manual_seed(31)
        explanations.append(explainer(randn(NUM_NODES, F_IN, seed=32), edges(33), index=3))
        assert model.first.explain is None and model.first._edge_mask is None  # cleared afterwards
    theirs, ours = explanations
    torch.testing.assert_close(ours.edge_mask, theirs.edge_mask, **TOLERANCE)
    torch.testing.assert_close(ours.node_mask, theirs.node_mask, **TOLERANCE)


# --------------------------------------------------------- permutations
def permuted_outputs(name: str, device, seed: int, permute):
    """(PyG's output on a random graph, gnnio's on the inputs permute(edge_index, x) returns)."""
    theirs, ours = twins(name, device=device)
    edge_index, x = edges(seed, device=device), randn(NUM_NODES, F_IN, seed=seed + 1, device=device)
    with torch.no_grad():
        expected = forward_call(name, edge_index, attention=False)(theirs, {"x": x})
        permuted_edges, permuted_x = permute(edge_index, x)
        return expected, forward_call(name, permuted_edges, attention=False)(ours, {"x": permuted_x})


@devices
@layers
def test_edge_permutation_changes_nothing_as_in_pyg(device, name):
    def permute(edge_index, x):
        order = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(36)).to(device)
        return edge_index[:, order], x

    expected, permuted = permuted_outputs(name, device, 34, permute)
    torch.testing.assert_close(permuted, expected, **TOLERANCE)


@devices
@layers
def test_node_permutation_permutes_the_output_as_in_pyg(device, name):
    permutation = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(39)).to(device)
    new_id = torch.empty_like(permutation)
    new_id[permutation] = torch.arange(NUM_NODES, device=device)
    expected, permuted = permuted_outputs(name, device, 37, lambda edge_index, x: (new_id[edge_index], x[permutation]))
    torch.testing.assert_close(permuted, expected[permutation], **TOLERANCE)


# --------------------------------------------------------- module state
def test_gcn_cache_is_pygs():
    for form in ("edge_index", "csr", "coo"):
        theirs, ours = twins("GCNConv", cached=True)
        x = randn(NUM_NODES, F_IN, seed=40)
        first = edge_form(form, edges(41), NUM_NODES, NUM_NODES)
        assert_conforms(theirs, ours, forward_call("GCNConv", first), {"x": x})
        assert_same_result(ours._cached_edge_index, theirs._cached_edge_index, "_cached_edge_index")
        assert ours._cached_adj_t is None and theirs._cached_adj_t is None
        theirs._cached_edge_index = ours._cached_edge_index = None  # what users do to normalise anew
        second = edge_form(form, edges(42), NUM_NODES, NUM_NODES)
        assert_conforms(theirs, ours, forward_call("GCNConv", second), {"x": x})
        assert_same_result(ours._cached_edge_index, theirs._cached_edge_index, "_cached_edge_index")
        ours.reset_parameters()
        assert ours._cached_edge_index is None


@layers
def test_transformer_alpha_and_message_passing_attributes_are_pygs(name):
    theirs, ours = twins(name)
    for attribute in ("aggr", "flow", "node_dim", "decomposed_layers", "explain", "_edge_mask", "_loop_mask",
                      "_apply_sigmoid", "fuse", "_user_args", "_fused_user_args", "_edge_user_args"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert type(ours.aggr_module) is type(theirs.aggr_module)
    assert sorted(ours.propagate_type) == sorted(theirs.inspector.get_params_from_method_call(
        "propagate", exclude=[0, "edge_index", "size"]))
    call = forward_call(name, edges(43))
    assert_conforms(theirs, ours, call, {"x": randn(NUM_NODES, F_IN, seed=44)})
    if name == "TransformerConv":
        assert ours._alpha is None and theirs._alpha is None


@layers
@pytest.mark.parametrize("decomposed_layers", [2, 3])
def test_decomposed_layers_give_the_undecomposed_result(name, decomposed_layers):
    # PyG's decomposition fails for several layers; gnnio's result is PyG's undecomposed one.
    theirs, ours = twins(name, decomposed_layers=1)
    ours.decomposed_layers = decomposed_layers
    assert_conforms(theirs, ours, forward_call(name, edges(45)), {"x": randn(NUM_NODES, F_IN, seed=46)})


LAYER_CONFIGS = [(name, {}) for name in LAYERS] + [
    ("SAGEConv", dict(aggr="lstm")), ("SAGEConv", dict(aggr=["mean", "max"], aggr_kwargs=dict(mode="attn", mode_kwargs=dict(
        in_channels=F_IN, out_channels=F_IN, num_heads=2)))), ("GATConv", dict(edge_dim=EDGE_DIM, residual=True)),
    ("GATv2Conv", dict(share_weights=True)), ("TransformerConv", dict(beta=True, edge_dim=EDGE_DIM)),
    ("GINConv", dict(train_eps=True)), ("AGNNConv", dict(requires_grad=False))]


@pytest.mark.parametrize("name, options", LAYER_CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(LAYER_CONFIGS)])
def test_reset_parameters_and_state_dict_both_ways(name, options):
    theirs, ours = twins(name, **options)
    for layer in (theirs, ours):
        torch.manual_seed(47)
        layer.reset_parameters()
    assert_same_result(tuple(ours.state_dict().values()), tuple(theirs.state_dict().values()), "after reset")
    torch.manual_seed(48)
    donor = build(pyg_nn, name, **options)
    ours.load_state_dict(donor.state_dict(), strict=True)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert_same_result(tuple(theirs.state_dict().values()), tuple(donor.state_dict().values()), "loaded")


# ------------------------------------------------------------- errors
ERROR_CASES = {
    "gcn-loops-without-normalize": lambda lib: build(lib, "GCNConv", normalize=False, add_self_loops=True),
    "sage-lazy-project": lambda lib: build(lib, "SAGEConv", in_channels=-1, project=True),
    "unknown-flow": lambda lib: build(lib, "SAGEConv", flow="sideways"),
    "unknown-aggr": lambda lib: build(lib, "SAGEConv", aggr="nonsense"),
    "gat-lstm": lambda lib: build(lib, "GATConv", aggr="lstm"),
    "unknown-option": lambda lib: build(lib, "GATConv", nonsense=1),
    "gcn-pair": lambda lib: build(lib, "GCNConv")((randn(4, F_IN, seed=1), randn(4, F_IN, seed=1)), edges(1, 4)),
    "gcn-csc": lambda lib: build(lib, "GCNConv")(randn(NUM_NODES, F_IN, seed=1),
                                                  edge_form("csc", edges(1), NUM_NODES, NUM_NODES)),
    "gat-csc": lambda lib: build(lib, "GATConv")(randn(NUM_NODES, F_IN, seed=1),
                                                  edge_form("csc", edges(1), NUM_NODES, NUM_NODES)),
    "transformer-csc": lambda lib: build(lib, "TransformerConv")(randn(NUM_NODES, F_IN, seed=1),
                                                                  edge_form("csc", edges(1), NUM_NODES, NUM_NODES)),
    "sparse-reversed": lambda lib: build(lib, "SAGEConv", flow="target_to_source")(
        randn(NUM_NODES, F_IN, seed=1), edge_form("csr", edges(1), NUM_NODES, NUM_NODES)),
    "sage-id-out-of-range": lambda lib: build(lib, "SAGEConv")(randn(4, F_IN, seed=1), torch.tensor([[0, 9], [1, 2]])),
    "gat-id-out-of-range": lambda lib: build(lib, "GATConv")(randn(4, F_IN, seed=1), torch.tensor([[0, 9], [1, 2]])),
    "gcn-id-out-of-range": lambda lib: build(lib, "GCNConv")(randn(4, F_IN, seed=1), torch.tensor([[0, 9], [1, 2]])),
    "negative-id": lambda lib: build(lib, "SAGEConv")(randn(4, F_IN, seed=1), torch.tensor([[0, -1], [1, 2]])),
    "float-edges": lambda lib: build(lib, "SAGEConv")(randn(4, F_IN, seed=1), torch.zeros(2, 3)),
    "gcn-float-edges": lambda lib: build(lib, "GCNConv")(randn(4, F_IN, seed=1), torch.zeros(2, 3)),
    "edges-not-2-rows": lambda lib: build(lib, "SAGEConv")(randn(4, F_IN, seed=1), torch.zeros(3, 3, dtype=torch.long)),
    "gcn-edges-not-2-rows": lambda lib: build(lib, "GCNConv")(randn(4, F_IN, seed=1), torch.zeros(1, 3, dtype=torch.long)),
    "size-disagrees": lambda lib: build(lib, "SAGEConv")((randn(6, F_IN, seed=1), randn(3, F_IN, seed=1)),
                                                          edges(1, 6, 4), size=(6, 4)),
    "gat-static": lambda lib: build(lib, "GATConv")(randn(2, 6, F_IN, seed=1), edges(1, 6)),
    "gatv2-target-none": lambda lib: build(lib, "GATv2Conv")((randn(6, F_IN, seed=1), None), edges(1, 6)),
    "transformer-edge-dim-without-edge-attr": lambda lib: build(lib, "TransformerConv", edge_dim=2)(
        randn(6, F_IN, seed=1), edges(1, 6)),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_are_pygs(case):
    with pytest.raises(Exception) as theirs:
        ERROR_CASES[case](pyg_nn)
    with pytest.raises(type(theirs.value)) as ours:
        ERROR_CASES[case](gnnio_nn)
    if type(theirs.value) is ValueError:  # gnnio's own: one line naming the layer or argument
        assert "\n" not in str(ours.value)


# -------------------------------------------------------------- jit
@devices
@layers
def test_torchscript_works_where_pygs_does(device, name):
    theirs, ours = twins(name, device=device)
    edge_index = edges(50, device=device)
    x = randn(NUM_NODES, F_IN, seed=51, device=device)
    try:
        expected = torch.jit.script(theirs)(x, edge_index)
    except Exception:
        pytest.skip(f"PyG 2.8's {name} does not script and run here")
    scripted = torch.jit.script(ours)
    torch.testing.assert_close(scripted(x, edge_index), expected, **TOLERANCE)
    with torch.no_grad():  # the scripted module shares the module's parameters
        for parameter in ours.parameters():
            parameter.mul_(1.5)
    torch.testing.assert_close(scripted(x, edge_index), ours(x, edge_index), **TOLERANCE)


# ------------------------------------------------------- without PyG
def test_without_torch_geometric_the_layers_run_and_refuse_in_one_line():
    program = textwrap.dedent("""
        import sys
        sys.modules["torch_geometric"] = None  # as if not installed
        import torch
        import gnnio_cli.nn as nn
        from gnnio_cli.errors import GnnioError
        x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2, 4], [1, 2, 3, 0]])
        for layer in (nn.GCNConv(4, 3, flow="target_to_source"), nn.SAGEConv(4, 3, aggr="max"),
                      nn.GATConv(4, 3, heads=2), nn.AGNNConv(), nn.TransformerConv(4, 3)):
            assert layer(x, edge_index).shape[0] == 5 and layer.last_path == "gnnio"
        assert nn.GCNConv(4, 3)(torch.randn(2, 5, 4), edge_index).shape == (2, 5, 3)
        refusals = [lambda: nn.SAGEConv(4, 3, aggr="lstm"),
                    lambda: nn.GATConv(4, 3).register_message_forward_hook(print),
                    lambda: torch.jit.script(nn.GCNConv(4, 3)),
                    lambda: nn.GATConv(4, 3)(torch.randn(2, 5, 4), edge_index),
                    lambda: nn.SAGEConv(4, 3, flow="sideways")]
        for refusal in refusals:
            try:
                refusal()
            except GnnioError as error:
                assert "\\n" not in str(error), str(error)
                print(error)
            else:
                raise AssertionError("no error")
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 5 and all("torch_geometric" in line or "flow" in line for line in lines), lines
