"""torch.compile and torch.jit.trace of gnnio's layers and models: zero graph breaks, eager's results.

Compiled code reaches the graph-level custom ops of gnnio_cli.nn.graph_ops with the edge_index itself; these
tests compile with fullgraph=True (a graph break fails), count breaks with torch._dynamo.explain, compare
outputs and gradients with eager gnnio on fresh graphs of new sizes (dynamic=True), and run on CUDA where
there is a GPU (the native kernels behind the same ops).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn import AGNNConv, GATConv, GATv2Conv, GCNConv, GINConv, SAGEConv, TransformerConv

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
IN = 12

LAYERS = {
    "gcn": lambda: GCNConv(IN, 8),
    "gcn-mean": lambda: GCNConv(IN, 8, aggr="mean"),
    "gcn-plain": lambda: GCNConv(IN, 8, normalize=False),
    "sage-sum": lambda: SAGEConv(IN, 8, aggr="sum"),
    "sage-mean": lambda: SAGEConv(IN, 8, aggr="mean"),
    "sage-max": lambda: SAGEConv(IN, 8, aggr="max"),
    "sage-min": lambda: SAGEConv(IN, 8, aggr="min"),
    "gin": lambda: GINConv(torch.nn.Sequential(torch.nn.Linear(IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))),
    "gat": lambda: GATConv(IN, 4, heads=2),
    "gatv2": lambda: GATv2Conv(IN, 4, heads=2),
    "transformer": lambda: TransformerConv(IN, 4, heads=2),
    "agnn": lambda: AGNNConv(),
}


class TwoLayer(torch.nn.Module):
    """conv(F -> 8 (x heads)) -> ELU -> conv(-> 8): the 2-layer models the issue names."""

    def __init__(self, kind: str):
        super().__init__()
        if kind == "gcn":
            self.conv1, self.conv2 = GCNConv(IN, 8), GCNConv(8, 8)
        elif kind == "sage":
            self.conv1, self.conv2 = SAGEConv(IN, 8), SAGEConv(8, 8, aggr="max")
        elif kind == "gat":
            self.conv1, self.conv2 = GATConv(IN, 4, heads=2), GATConv(8, 8, heads=1)
        elif kind == "gatv2":
            self.conv1, self.conv2 = GATv2Conv(IN, 4, heads=2), GATv2Conv(8, 8, heads=1)
        else:
            self.conv1, self.conv2 = TransformerConv(IN, 4, heads=2), TransformerConv(8, 8, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(torch.nn.functional.elu(self.conv1(x, edge_index)), edge_index)


MODELS = ["gcn", "sage", "gat", "gatv2", "transformer"]


def _graph(num_nodes: int, num_edges: int, device: str, seed: int):
    """Random features [N, IN] and edges with self-loops and duplicates among them, and an isolated node."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, IN, generator=generator)
    edge_index = torch.randint(0, num_nodes - 1, (2, num_edges), generator=generator)
    edge_index[:, :3] = torch.tensor([[0, 1, 1], [0, 2, 2]])  # a self-loop and a duplicate edge
    return x.to(device), edge_index.to(device)


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _step(module, x, edge_index, mode: str):
    """(outputs, gradients of x and of every parameter) of one call in `mode`: train, no_grad or inference."""
    if mode == "no_grad":
        with torch.no_grad():
            return _outputs(module(x, edge_index)), ()
    if mode == "inference":
        with torch.inference_mode():
            return tuple(t.clone() for t in _outputs(module(x, edge_index))), ()
    x = x.detach().requires_grad_()
    out = module(x, edge_index)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    grads = (x.grad, *(p.grad for p in module.parameters()))
    module.zero_grad()
    return (out.detach(),), grads


def _compare(module, device: str, mode: str, dynamic: bool, backend: str, sizes=((30, 90), (41, 130), (23, 60))):
    """Compile a copy of `module` (fullgraph), run it first, then eager on every graph size; they must agree."""
    torch._dynamo.reset()
    eager = module.to(device)
    eager.train(mode == "train")
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True, dynamic=dynamic, backend=backend)
    for seed, (num_nodes, num_edges) in enumerate(sizes):
        x, edge_index = _graph(num_nodes, num_edges, device, seed)
        got_out, got_grads = _step(compiled, x, edge_index, mode)
        want_out, want_grads = _step(eager, x, edge_index, mode)
        for got, want in zip(got_out + got_grads, want_out + want_grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert len(got_grads) == len(want_grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_has_no_graph_breaks(name, device):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device)
    x, edge_index = _graph(30, 90, device, 0)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(x, edge_index)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_compiled_layer_trains_like_eager(name, device):
    """Inductor, dynamic shapes, a new graph every call, backward through the compiled layer, no eager call first."""
    torch.manual_seed(0)
    _compare(LAYERS[name](), device, "train", dynamic=True, backend="inductor")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("mode", "dynamic"), [("train", False), ("no_grad", True), ("inference", False)])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_compiled_layer_modes(name, dynamic, mode, device):
    """Static training, dynamic no_grad and static inference_mode through AOTAutograd (the fake kernels and the
    autograd registration; test_compiled_layer_trains_like_eager covers dynamic training)."""
    torch.manual_seed(0)
    _compare(LAYERS[name](), device, mode, dynamic=dynamic, backend="aot_eager", sizes=((30, 90), (41, 130)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", MODELS)
def test_two_layer_model_compiles(kind, device):
    torch.manual_seed(0)
    model = TwoLayer(kind).to(device)
    x, edge_index = _graph(30, 90, device, 0)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, edge_index)
    assert explained.graph_break_count == 0, explained.break_reasons
    _compare(TwoLayer(kind), device, "train", dynamic=True, backend="inductor")
    _compare(TwoLayer(kind), device, "no_grad", dynamic=False, backend="inductor")


@pytest.mark.parametrize("device", DEVICES)
def test_compile_after_an_eager_call(device):
    """An eager call first (its structures cached on the edge tensor) does not change what compiles."""
    torch.manual_seed(0)
    model = TwoLayer("gat").to(device)
    x, edge_index = _graph(30, 90, device, 0)
    want = model(x, edge_index)
    torch._dynamo.reset()
    got = torch.compile(model, fullgraph=True, dynamic=True)(x, edge_index)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_attention_dropout_trains(device):
    """With attention dropout in training the compiled step drops edges (outputs differ from eval) and its
    gradients are those of the output it returned: backward sees the forward's mask."""
    torch.manual_seed(0)
    layer = GATConv(IN, 4, heads=2, dropout=0.5).to(device)
    x, edge_index = _graph(30, 90, device, 0)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    leaf = x.detach().requires_grad_()
    out = compiled(leaf, edge_index)
    layer.eval()
    assert not torch.allclose(out, layer(x, edge_index))
    layer.train()
    # the gradient of sum(out * out) is 2 out: linear in out, so it checks the mask through x's gradient
    (grad_x,) = torch.autograd.grad((out * out).sum(), leaf)
    assert torch.isfinite(grad_x).all() and grad_x.abs().sum() > 0


def test_options_that_run_pyg_code_compile():
    """GAT with returned weights and self-loops runs PyG's code under compile; it still equals eager."""
    pytest.importorskip("torch_geometric")
    torch.manual_seed(0)
    layer = GATConv(IN, 4, heads=2)
    x, edge_index = _graph(30, 90, "cpu", 0)
    torch._dynamo.reset()
    out, (edges, alpha) = torch.compile(layer, backend="aot_eager")(x, edge_index, return_attention_weights=True)
    want_out, (want_edges, want_alpha) = layer(x, edge_index, return_attention_weights=True)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(edges, want_edges)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-5, atol=1e-5)


def test_graph_input_under_compile_is_refused():
    from gnnio_cli.graph import Graph

    layer = SAGEConv(IN, 8)
    x, edge_index = _graph(30, 90, "cpu", 0)
    graph = Graph.from_edge_index(edge_index, num_nodes=30)
    torch._dynamo.reset()
    with pytest.raises(GnnioError, match="pass the edges as an edge_index"):
        torch.compile(layer, backend="eager")(x, graph)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gcn", "sage-max", "gat", "transformer"])
def test_jit_trace_follows_a_new_edge_index(name, device):
    """torch.jit.trace records the graph-level op with the edge_index as an input: a new graph of the same
    sizes gives that graph's result, not the traced one's."""
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device).eval()
    x, edge_index = _graph(30, 90, device, 0)
    _, other = _graph(30, 90, device, 1)
    with torch.no_grad():
        traced = torch.jit.trace(layer, (x, edge_index), check_trace=False)
        torch.testing.assert_close(traced(x, other), layer(x, other), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(traced(x, edge_index), layer(x, edge_index), rtol=1e-5, atol=1e-5)
