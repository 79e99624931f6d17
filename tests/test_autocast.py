"""gnnio's layers under torch.autocast compute what PyG 2.8's compute: the same output dtype, and results no
further from the fp32 result than twice PyG's own 16-bit error (gnnio accumulates in fp32), eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import gnnio_cli.nn as gnnio_nn

pyg_nn = pytest.importorskip("torch_geometric.nn")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CASES = [("cpu", torch.bfloat16), pytest.param("cuda", torch.bfloat16, marks=CUDA),
         pytest.param("cuda", torch.float16, marks=CUDA)]
IN = 16
LAYERS = {
    "GCNConv": ("GCNConv", (IN, 8), {}),
    "SAGEConv": ("SAGEConv", (IN, 8), {}),
    "SAGEConv-max": ("SAGEConv", (IN, 8), {"aggr": "max"}),
    "GINConv": ("GINConv", (), {}),
    "GATConv": ("GATConv", (IN, 4), {"heads": 2}),
    # without a bias PyG's output is still fp32 under autocast (its score terms are)
    "GATConv-nobias": ("GATConv", (IN, 8), {"heads": 2, "bias": False}),
    "GATv2Conv": ("GATv2Conv", (IN, 4), {"heads": 2}),
    "TransformerConv": ("TransformerConv", (IN, 4), {"heads": 2}),
    # 8 channels per head: the attention kernels' 16-bit 8-wide layout, forward and backward (AGNN's 16 too)
    "GATConv-8": ("GATConv", (IN, 8), {"heads": 2}),
    "GATv2Conv-8": ("GATv2Conv", (IN, 8), {"heads": 2}),
    "TransformerConv-8": ("TransformerConv", (IN, 8), {"heads": 2}),
    "AGNNConv": ("AGNNConv", (), {}),
}


def _pair(name: str, device: str):
    """(gnnio's layer, PyG's layer) with the same weights."""
    cls, args, kwargs = LAYERS[name]
    if cls == "GINConv":
        args = (torch.nn.Linear(IN, 8),)
    gnnio_layer = getattr(gnnio_nn, cls)(*args, **kwargs).to(device)
    pyg_layer = getattr(pyg_nn, cls)(*args, **kwargs).to(device)
    pyg_layer.load_state_dict(gnnio_layer.state_dict())
    return gnnio_layer, pyg_layer


def _run(layer, x, edge_index, device, dtype):
    """(output, x's gradient) of one call under autocast (or in fp32 with dtype None)."""
    x = x.detach().requires_grad_()
    with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
        out = layer(x, edge_index)
    out.float().square().sum().backward()
    return out, x.grad


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_under_autocast_computes_as_pyg(name, device, dtype, compiled):
    torch.manual_seed(0)
    gnnio_layer, pyg_layer = _pair(name, device)
    x = torch.randn(80, IN, device=device)
    edge_index = torch.randint(0, 80, (2, 400), device=device)
    exact, exact_grad = _run(pyg_layer, x, edge_index, device, None)
    want, want_grad = _run(pyg_layer, x, edge_index, device, dtype)
    if compiled:
        torch._dynamo.reset()
        gnnio_layer = torch.compile(gnnio_layer, fullgraph=True, backend="aot_eager")
    got, got_grad = _run(gnnio_layer, x, edge_index, device, dtype)
    assert got.dtype == want.dtype
    for ours, theirs, truth in ((got, want, exact), (got_grad, want_grad, exact_grad)):
        ours, theirs, truth = ours.double(), theirs.double(), truth.double()
        pyg_error = (theirs - truth).abs().max().item()
        floor = 2.0 ** -8 * truth.abs().max().item()  # one 16-bit rounding of the largest value
        assert (ours - truth).abs().max().item() <= 2 * pyg_error + floor
