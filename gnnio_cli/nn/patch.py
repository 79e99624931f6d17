"""``patch_pyg()``: make existing PyG model code use gnnio's layers, unchanged.

    from gnnio_cli.nn import patch_pyg

    with patch_pyg():                 # PyG's classes are back on exit
        model = MyPygModel(...)       # its GATConv(...) etc. are now gnnio's

    handle = patch_pyg()              # or for the rest of the program
    ...
    handle.restore()

Every loaded ``torch_geometric`` module whose attribute ``GCNConv``,
``SAGEConv``, ... *is* PyG's class gets gnnio's class instead: the public
``torch_geometric.nn`` and ``torch_geometric.nn.conv`` namespaces, the
modules that define the classes, and PyG's own model zoo
(``torch_geometric.nn.models.GCN``/``GAT``/... build their layers from these
names at construction). Layers built before patching stay PyG's; build the
model inside the patch. gnnio's layers are ``MessagePassing`` modules, so PyG's
tools that look for one (``torch_geometric.explain``'s edge masks) work on them.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from types import ModuleType

from gnnio_cli.errors import GnnioError


@dataclass
class PygPatch:
    """The replacements made by :func:`patch_pyg`; :meth:`restore` undoes exactly them."""

    replaced: list[tuple[ModuleType, str, type]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return bool(self.replaced)

    def restore(self) -> None:
        """Put PyG's classes back where they were swapped (idempotent)."""
        for module, name, original in reversed(self.replaced):
            setattr(module, name, original)
        self.replaced.clear()

    def __enter__(self) -> "PygPatch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.restore()


def patch_pyg() -> PygPatch:
    """Swap torch_geometric's layer classes for gnnio's; returns a handle (also a context manager)."""
    try:
        importlib.import_module("torch_geometric.nn")  # loads the namespaces to patch
        import torch_geometric.nn.conv as pyg_conv
    except ImportError as err:
        raise GnnioError(f"patch_pyg: torch_geometric is not importable ({err}); install it with 'pip install torch-geometric'") from None
    # The layers' own modules, not the package gnnio_cli.nn, which imports this module.
    from gnnio_cli.nn import gat, gcn, sage, transformer
    from gnnio_cli.nn.message_passing import LAYERS

    ours = {name: layer for module in (gat, gcn, sage, transformer) for name, layer in vars(module).items() if name in LAYERS}
    swaps = {}
    for name in LAYERS:
        original = getattr(pyg_conv, name)
        if original is ours[name]:
            raise GnnioError("patch_pyg: PyG's layers are already patched; restore the earlier patch first")
        swaps[name] = (original, ours[name])
    handle = PygPatch()
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "torch_geometric" or module_name.startswith("torch_geometric.")):
            continue
        for name, (original, replacement) in swaps.items():
            if module.__dict__.get(name) is original:
                setattr(module, name, replacement)
                handle.replaced.append((module, name, original))
    return handle
