"""patch_pyg: PyG model code runs on gnnio's layers, and PyG's classes come back."""

from __future__ import annotations

import builtins
import sys

import pytest
import torch

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.errors import GnnioError
from gnnio_cli.nn import patch_pyg

torch_geometric = pytest.importorskip("torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402
import torch_geometric.nn.conv as pyg_conv  # noqa: E402
import torch_geometric.nn.models.basic_gnn as pyg_basic_gnn  # noqa: E402

PYG_CLASSES = {name: getattr(pyg_conv, name) for name in gnnio_nn.LAYERS}


class UserModel(torch.nn.Module):
    """Model code as users write it: classes looked up through torch_geometric.nn at construction."""

    def __init__(self):
        super().__init__()
        self.conv1 = pyg_nn.GATv2Conv(6, 4, heads=2)
        self.conv2 = pyg_nn.conv.GCNConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def graph_inputs():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(10, 6, generator=generator)
    edge_index = torch.randint(0, 10, (2, 30), generator=generator)
    return x, edge_index


def assert_pyg_classes_restored():
    for name, original in PYG_CLASSES.items():
        assert getattr(pyg_nn, name) is original
        assert getattr(pyg_conv, name) is original
    assert pyg_basic_gnn.GCNConv is PYG_CLASSES["GCNConv"]


def test_context_manager_swaps_and_restores():
    x, edge_index = graph_inputs()
    torch.manual_seed(1)
    reference = UserModel()
    with patch_pyg() as handle:
        assert handle.active
        for name in gnnio_nn.LAYERS:
            assert getattr(pyg_nn, name) is getattr(gnnio_nn, name)
            assert getattr(pyg_conv, name) is getattr(gnnio_nn, name)
        torch.manual_seed(1)
        patched = UserModel()
    assert isinstance(patched.conv1, gnnio_nn.GATv2Conv) and isinstance(patched.conv2, gnnio_nn.GCNConv)
    assert not handle.active
    assert_pyg_classes_restored()
    # Same seed, same weights: the patched model computes what PyG's does.
    torch.testing.assert_close(patched(x, edge_index), reference(x, edge_index), atol=1e-5, rtol=1e-5)
    patched.load_state_dict(reference.state_dict(), strict=True)


def test_plain_call_returns_a_handle_that_restores_once():
    handle = patch_pyg()
    try:
        assert pyg_nn.SAGEConv is gnnio_nn.SAGEConv
        with pytest.raises(GnnioError, match="already patched"):
            patch_pyg()
    finally:
        handle.restore()
    handle.restore()
    assert_pyg_classes_restored()


def test_pyg_model_zoo_builds_gnnio_layers():
    x, edge_index = graph_inputs()
    torch.manual_seed(2)
    reference = pyg_nn.GAT(6, 8, num_layers=2, out_channels=3, heads=2)
    with patch_pyg():
        torch.manual_seed(2)
        patched = pyg_nn.GAT(6, 8, num_layers=2, out_channels=3, heads=2)
    assert all(isinstance(conv, gnnio_nn.GATConv) for conv in patched.convs)
    reference.eval()
    patched.eval()
    patched.load_state_dict(reference.state_dict(), strict=True)
    torch.testing.assert_close(patched(x, edge_index), reference(x, edge_index), atol=1e-5, rtol=1e-5)


def test_restores_even_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with patch_pyg():
            raise RuntimeError("boom")
    assert_pyg_classes_restored()


def test_clear_error_without_torch_geometric(monkeypatch):
    real_import = builtins.__import__

    def refuse_pyg(name, *args, **kwargs):
        if name.startswith("torch_geometric"):
            raise ImportError("No module named 'torch_geometric'")
        return real_import(name, *args, **kwargs)

    for module_name in [name for name in sys.modules if name.startswith("torch_geometric")]:
        monkeypatch.delitem(sys.modules, module_name)
    monkeypatch.setattr(builtins, "__import__", refuse_pyg)
    with pytest.raises(GnnioError, match="torch_geometric is not importable") as error:
        patch_pyg()
    assert "\n" not in str(error.value)
