"""Every layer on a graph with no nodes returns what PyG 2.8's returns: an
empty [0, F_out] result, and gradients of the same (empty) shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.graph import Graph

pyg_nn = pytest.importorskip("torch_geometric.nn")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

IN_CHANNELS, OUT_CHANNELS = 6, 5

LAYERS = [
    ("GCNConv", (IN_CHANNELS, OUT_CHANNELS), {}),
    ("SAGEConv", (IN_CHANNELS, OUT_CHANNELS), {"aggr": "mean"}),
    ("SAGEConv", (IN_CHANNELS, OUT_CHANNELS), {"aggr": "max"}),
    ("SAGEConv", (IN_CHANNELS, OUT_CHANNELS), {"aggr": "sum"}),
    ("GINConv", (), {}),
    ("GATConv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
    ("GATv2Conv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
    ("TransformerConv", (IN_CHANNELS, OUT_CHANNELS), {"heads": 2}),
    ("AGNNConv", (), {}),
]


def build(library, name, args, kwargs):
    torch.manual_seed(0)
    if name == "GINConv":
        return library.GINConv(torch.nn.Linear(IN_CHANNELS, OUT_CHANNELS), **kwargs)
    return getattr(library, name)(*args, **kwargs)


@pytest.mark.parametrize("name,args,kwargs", LAYERS, ids=lambda value: str(value))
def test_zero_node_graph_matches_pyg(name, args, kwargs):
    empty_edges = torch.zeros(2, 0, dtype=torch.long)
    graph = Graph.from_edge_index(np.zeros((2, 0), dtype=np.int64), 0)
    theirs = build(pyg_nn, name, args, kwargs)(torch.randn(0, IN_CHANNELS), empty_edges)
    for edges in (empty_edges, graph):
        x = torch.randn(0, IN_CHANNELS, requires_grad=True)
        ours = build(gnnio_nn, name, args, kwargs)(x, edges)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        ours.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
