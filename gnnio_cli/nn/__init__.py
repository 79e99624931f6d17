"""Drop-in replacements for PyTorch Geometric 2.8's layers, built from gnnio's ops.

Each layer takes PyG's constructor and forward arguments, holds the same
parameters under the same ``state_dict`` keys (a PyG checkpoint loads with
``strict=True`` and back), initialises them identically for a given
``torch.manual_seed``, prints the same ``repr``, raises the same exception
types and computes the same outputs and gradients. Edges come as an
``edge_index`` tensor or PyG ``EdgeIndex``, a torch sparse ``adj_t`` (COO, CSR,
and CSC where PyG takes it), a torch_sparse ``SparseTensor``, or a gnnio
:class:`~gnnio_cli.graph.Graph`; the CSR/CSC structures are built once per
edge tensor and cached (see :mod:`gnnio_cli.nn.adjacency`). Both ``flow``
directions, static graphs (``[B, N, F]`` features where PyG takes them),
bipartite pairs, lazy ``in_channels=-1`` and ``cached`` work as in PyG.

With torch_geometric installed the layers are PyG ``MessagePassing`` modules,
and a call gnnio has no kernel for (another aggregation, a message-passing
hook, explain masks, a ``SparseTensor``) runs PyG's own code on the same
module; ``layer.last_path`` says which ran. ``torch.jit.script`` compiles
PyG's forward on the module. See :mod:`gnnio_cli.nn.message_passing`.

:func:`patch_pyg` makes existing PyG model code use these layers unchanged.

Where gnnio differs from PyG 2.8, on purpose:

- Attention dropout: on the CPU (the reference ops) the mask is drawn as PyG
  draws it, so a seed gives PyG's mask and training runs step for step like
  PyG's; the native CUDA kernels draw their own masks (same distribution).
- Edge weights of a node's self-loops that GCN's normalisation drops (all but
  the last when a node has several) get a zero gradient, their true
  derivative; PyG's ``index_put`` gives them the kept loop's gradient.
- Attention returned for a sparse input comes back as a sparse tensor of the
  input's layout with the weights as values.
- ``decomposed_layers`` is accepted and gives the result of
  ``decomposed_layers=1`` on gnnio's ops (PyG's feature decomposition fails
  for SAGEConv, GINConv and the attention layers).
"""

from gnnio_cli.nn.gat import GATConv, GATv2Conv
from gnnio_cli.nn.gcn import GCNConv
from gnnio_cli.nn.linear import Linear
from gnnio_cli.nn.message_passing import LAYERS
from gnnio_cli.nn.patch import patch_pyg
from gnnio_cli.nn.sage import GINConv, SAGEConv
from gnnio_cli.nn.transformer import AGNNConv, TransformerConv

__all__ = ["GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv", "TransformerConv", "AGNNConv",  # LAYERS
           "Linear", "LAYERS", "patch_pyg"]
