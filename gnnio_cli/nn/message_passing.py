"""PyG's ``MessagePassing`` under gnnio's layers, and PyG's own code for what gnnio has no kernel for.

With torch_geometric importable, every gnnio layer *is* a
``torch_geometric.nn.conv.MessagePassing``: PyG's tools that look for
message-passing layers (``torch_geometric.explain``'s edge masks, ``to_hetero``)
find them, and they carry the whole surface PyG users touch: the hook
registries (``register_message_forward_pre_hook`` and friends), ``explain``,
``propagate``, ``edge_updater``, ``decomposed_layers``, ``aggr_module``.

A call runs on gnnio's ops (the CUDA kernels, or the reference on the CPU)
unless it needs something gnnio has no kernel for: a PyG aggregation other
than sum/mean/max/min (lstm, an ``Aggregation`` object, a list with
``aggr_kwargs``, std, softmax, ...), a registered message-passing hook or
``explain`` (both need PyG's per-edge messages), torch_sparse's
``SparseTensor``, or an input form a layer's docstring lists. Then the layer
runs PyG's own ``forward`` of that layer on itself (its parameters, its
hooks) and says so: ``layer.last_path`` becomes ``"pyg"`` (``"gnnio"``
otherwise) and ``gnnio_cli.ops.dispatch.ran()`` holds ``{LayerName: "pyg"}``.
PyG's ``forward`` is also what ``torch.jit.script`` compiles, so a scripted
gnnio layer is a scripted PyG layer sharing the module's parameters.

Without torch_geometric the layers are plain modules with the same
constructor options; anything that would need PyG's code fails with one
line that says so.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph

LAYERS = ("GCNConv", "SAGEConv", "GINConv", "GATConv", "GATv2Conv", "TransformerConv", "AGNNConv")
FLOWS = ("source_to_target", "target_to_source")
# PyG aggregation names gnnio reduces with its own ops -> gnnio's reduction names
NATIVE_REDUCTIONS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}
# MessagePassing's hook registries: a call with any hook registered runs PyG's message passing
HOOK_REGISTRIES = (
    "_propagate_forward_pre_hooks",
    "_propagate_forward_hooks",
    "_message_forward_pre_hooks",
    "_message_forward_hooks",
    "_aggregate_forward_pre_hooks",
    "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks",
    "_message_and_aggregate_forward_hooks",
    "_edge_update_forward_pre_hooks",
    "_edge_update_forward_hooks",
)
# What a gnnio layer takes from PyG's class of the same name, where that class defines it
BORROWED_METHODS = ("message", "message_and_aggregate", "edge_update", "aggregate", "update")


@dataclass(frozen=True)
class PygLibrary:
    """The parts of torch_geometric gnnio's layers use, captured when gnnio_cli.nn is imported
    (before :func:`~gnnio_cli.nn.patch_pyg` can swap the layer classes).

    layers:        PyG's own layer classes by name.
    aggregations:  PyG's Aggregation classes gnnio reduces itself -> gnnio's reduction name.
    multi_aggregation: PyG's MultiAggregation (a list of aggregations, whose output is wider).
    edge_index:    PyG's EdgeIndex class.
    sparse_tensor: torch_sparse's SparseTensor, or None when torch_sparse does not import.
    """

    message_passing: type
    layers: dict
    aggregations: dict
    multi_aggregation: type
    edge_index: type
    sparse_tensor: Optional[type]
    inspector: type


def _import_pyg() -> tuple[Optional[PygLibrary], str]:
    """(the library, "") when torch_geometric imports, else (None, why not)."""
    try:
        import torch_geometric.nn.conv as conv
        import torch_geometric.typing as pyg_typing
        from torch_geometric import EdgeIndex
        from torch_geometric.inspector import Inspector
        from torch_geometric.nn import aggr
    except (ImportError, OSError) as error:
        return None, str(error)
    return PygLibrary(
        message_passing=conv.MessagePassing,
        layers={name: getattr(conv, name) for name in LAYERS},
        aggregations={
            aggr.SumAggregation: "sum",
            aggr.MeanAggregation: "mean",
            aggr.MaxAggregation: "max",
            aggr.MinAggregation: "min",
        },
        multi_aggregation=aggr.MultiAggregation,
        edge_index=EdgeIndex,
        sparse_tensor=pyg_typing.SparseTensor if pyg_typing.WITH_TORCH_SPARSE else None,
        inspector=Inspector,
    ), ""


PYG, PYG_MISSING = _import_pyg()


def needs_pyg(layer: str, what: str) -> GnnioError:
    """The one-line error for `what` (an option or input) that only PyG's implementation runs."""
    return GnnioError(
        f"{layer}: {what} runs through torch_geometric's implementation, which does not import "
        f"({PYG_MISSING}); install it with 'pip install torch-geometric'"
    )


def _refusing(name: str) -> Callable:
    def method(self, *args, **kwargs):
        raise needs_pyg(type(self).__name__, f"{name}()")

    method.__name__ = name
    method.__doc__ = f"PyG's MessagePassing.{name}; needs torch_geometric."
    return method


class StandaloneMessagePassing(torch.nn.Module):
    """MessagePassing's constructor options and plain attributes, for when torch_geometric does not import.

    aggr:              a name gnnio reduces itself ("add", "sum", "mean", "max", "min");
                       anything else needs PyG's Aggregation modules.
    aggr_kwargs:       must be empty (they configure PyG's Aggregation modules).
    flow:              "source_to_target" or "target_to_source".
    node_dim:          the node axis of the features.
    decomposed_layers: accepted and kept; gnnio's result does not depend on it.

    The hook registration methods, ``propagate`` and ``edge_updater`` need PyG's
    message passing and fail with one line; ``explain`` stays None.
    """

    def __init__(
        self,
        aggr: Any = "sum",
        *,
        aggr_kwargs: Optional[dict] = None,
        flow: str = "source_to_target",
        node_dim: int = -2,
        decomposed_layers: int = 1,
    ):
        super().__init__()
        name = type(self).__name__
        if flow not in FLOWS:
            raise GnnioError(f"{name}: flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
        if not (isinstance(aggr, str) and aggr in NATIVE_REDUCTIONS):
            raise needs_pyg(name, f"aggr={aggr!r}")
        if aggr_kwargs:
            raise needs_pyg(name, "aggr_kwargs")
        self.aggr = aggr
        self.flow = flow
        self.node_dim = node_dim
        self.decomposed_layers = decomposed_layers
        self.explain: Optional[bool] = None
        for registry in HOOK_REGISTRIES:
            setattr(self, registry, OrderedDict())

    def reset_parameters(self) -> None:
        """Nothing to reset here (PyG resets its aggregation module)."""

    def __repr__(self) -> str:
        if hasattr(self, "in_channels") and hasattr(self, "out_channels"):
            return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"
        if hasattr(self, "channels"):
            return f"{type(self).__name__}({self.channels})"
        return f"{type(self).__name__}()"


for _name in ("propagate", "edge_updater", "explain_message") + tuple(
    "register_" + registry[1:-1] for registry in HOOK_REGISTRIES
):
    setattr(StandaloneMessagePassing, _name, _refusing(_name))

MessagePassingBase: type = PYG.message_passing if PYG is not None else StandaloneMessagePassing

# The forward annotations: PyG's types where torch_geometric imports (TorchScript compiles PyG's forward
# under them); a gnnio Graph is accepted as edges too, where gnnio's ops run the call.
if PYG is not None:
    from torch_geometric.typing import Adj as Edges
    from torch_geometric.typing import OptPairTensor, SparseTensor
else:
    Edges = Union[Tensor, Graph]
    OptPairTensor = Tuple[Tensor, Optional[Tensor]]
    SparseTensor = Tensor
NodeFeatures = Union[Tensor, OptPairTensor]
Size = Optional[Tuple[int, int]]
AttentionOutput = Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]


def hooked(layer: torch.nn.Module) -> bool:
    """Whether a call must run PyG's message passing: a message-passing hook is registered or explain is on."""
    state = layer.__dict__
    for registry in HOOK_REGISTRIES:
        if state[registry]:
            return True
    return bool(state.get("_explain"))


def borrow_pyg_code(cls: type, pyg_name: str) -> None:
    """Give `cls` what it needs to run as PyG's layer `pyg_name` on its own parameters.

    - PyG's message/edge_update/... methods of that class, so ``propagate``
      and ``edge_updater`` compute what PyG's do;
    - ``propagate_type`` and ``edge_updater_type``, read by PyG's inspector
      from PyG's class, so MessagePassing builds the same (scriptable) propagate;
    - ``_pyg_forward``: PyG's ``forward`` of that class under its own name
      (TorchScript names a compiled method after its function);
    - PyG's attribute annotations (TorchScript types of e.g. GCNConv's caches).

    Without torch_geometric, ``_pyg_forward`` fails with one line instead.
    """
    if PYG is None:
        def unavailable(self, *args, **kwargs):
            raise needs_pyg(type(self).__name__, "this call")

        cls._pyg_forward = unavailable
        return
    pyg_class = PYG.layers[pyg_name]
    for name in BORROWED_METHODS:
        if name in pyg_class.__dict__ and name not in cls.__dict__:
            setattr(cls, name, pyg_class.__dict__[name])
    inspector = PYG.inspector(pyg_class)
    for method in ("propagate", "edge_updater"):
        params = inspector.get_params_from_method_call(method, exclude=[0, "edge_index", "size"])
        if params:
            setattr(cls, f"{method}_type", {name: param.type for name, param in params.items()})
    cls._pyg_forward = _renamed(pyg_class.forward, "_pyg_forward", cls)
    annotations = {**pyg_class.__dict__.get("__annotations__", {}), **cls.__dict__.get("__annotations__", {})}
    cls.__annotations__ = annotations


def _renamed(function: types.FunctionType, name: str, owner: type) -> types.FunctionType:
    """A copy of `function` called `name` (same code, globals, defaults and annotations)."""
    copy = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__annotations__ = dict(function.__annotations__)
    copy.__qualname__ = f"{owner.__qualname__}.{name}"
    copy.__doc__ = function.__doc__
    return copy
