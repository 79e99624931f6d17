"""Drop-in replacements for PyTorch Geometric 2.8's layers, built only from gnnio's ops.

Each layer takes PyG's constructor and forward arguments, holds the same
parameters under the same ``state_dict`` keys (a PyG checkpoint loads with
``strict=True`` and back), initialises them identically for a given
``torch.manual_seed``, prints the same ``repr`` and computes the same outputs
and gradients. Edges come as an ``edge_index`` tensor, a torch sparse ``adj_t``
or a gnnio :class:`~gnnio_cli.graph.Graph`; the CSR/CSC structures are built
once per edge tensor and cached (see :mod:`gnnio_cli.nn.adjacency`).

:func:`patch_pyg` makes existing PyG model code use these layers unchanged.

Where gnnio differs from PyG 2.8, on purpose:

- The layers are plain ``torch.nn.Module`` subclasses, not ``MessagePassing``
  ones; ``aggr`` takes a name only (no lists, ``Aggregation`` objects or
  "lstm"), ``flow`` only "source_to_target", and a ``(x_src, None)`` pair
  needs ``size``.
- Attention dropout: on the CPU (the reference ops) the mask is drawn as PyG
  draws it, so a seed gives PyG's mask and training runs step for step like
  PyG's; the native CUDA kernels draw their own masks (same distribution).
- Edge weights of a node's self-loops that GCN's normalisation drops (all but
  the last when a node has several) get a zero gradient, their true
  derivative; PyG's ``index_put`` gives them the kept loop's gradient.
- A torch sparse CSC adjacency is accepted everywhere (PyG refuses it in
  ``gcn_norm`` and in GAT's self-loop step). Attention returned for a sparse
  input comes back as a sparse tensor of the input's layout with the weights
  as values; for CSC with added self-loops the separate weight vector is in
  row-major (target, source) order, not the CSC value order.
- TransformerConv and GATv2Conv refuse ``edge_attr`` when built without
  ``edge_dim`` (PyG fails or broadcasts the raw features).
"""

from gnnio_cli.nn.gat import GATConv, GATv2Conv
from gnnio_cli.nn.gcn import GCNConv
from gnnio_cli.nn.linear import Linear
from gnnio_cli.nn.patch import patch_pyg
from gnnio_cli.nn.sage import GINConv, SAGEConv
from gnnio_cli.nn.transformer import AGNNConv, TransformerConv

LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv", "TransformerConv", "AGNNConv")

__all__ = [*LAYERS, "Linear", "LAYERS", "patch_pyg"]
