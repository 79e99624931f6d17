"""Drop-in replacements for PyTorch Geometric 2.8's layers, built only from gnnio's ops.

Each layer takes PyG's constructor and forward arguments, holds the same
parameters under the same ``state_dict`` keys (a PyG checkpoint loads with
``strict=True`` and back), initialises them identically for a given
``torch.manual_seed``, prints the same ``repr`` and computes the same outputs
and gradients. Edges come as an ``edge_index`` tensor, a torch sparse ``adj_t``
or a gnnio :class:`~gnnio_cli.graph.Graph`; the CSR/CSC structures are built
once per edge tensor and cached (see :mod:`gnnio_cli.nn.adjacency`).

:func:`patch_pyg` makes existing PyG model code use these layers unchanged.
"""

from gnnio_cli.nn.gat import GATConv, GATv2Conv
from gnnio_cli.nn.gcn import GCNConv
from gnnio_cli.nn.linear import Linear
from gnnio_cli.nn.patch import patch_pyg
from gnnio_cli.nn.sage import GINConv, SAGEConv
from gnnio_cli.nn.transformer import AGNNConv, TransformerConv

LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv", "TransformerConv", "AGNNConv")

__all__ = [*LAYERS, "Linear", "LAYERS", "patch_pyg"]
