"""The dense linear map inside every layer, with PyG 2.8's initialisers and lazy sizes.

:class:`Linear` mirrors ``torch_geometric.nn.dense.Linear`` so that gnnio's layers
have the same parameters, the same ``state_dict`` keys (``weight``, ``bias``)
and, for a given ``torch.manual_seed``, the same initial values as PyG's: every
initialiser draws from the global generator in the same order and amount.
``in_channels=-1`` defers the weight's shape to the first forward call.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import Parameter, UninitializedParameter, is_lazy

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.base import registered_parameters
from gnnio_cli.nn.graph_ops import tracing
from gnnio_cli.ops import dense
from gnnio_cli.ops.dense import bias_gradient

WEIGHT_INITIALIZERS = ("glorot", "uniform", "kaiming_uniform", None)
BIAS_INITIALIZERS = ("zeros", None)


def glorot_(tensor: Optional[Tensor]) -> None:
    """Uniform in +-sqrt(6 / (fan_in + fan_out)) over the last two dims, in place; None is skipped."""
    if tensor is not None:
        bound = math.sqrt(6.0 / (tensor.size(-2) + tensor.size(-1)))
        tensor.data.uniform_(-bound, bound)


def zeros_(tensor: Optional[Tensor]) -> None:
    """Fill with 0 in place; None is skipped."""
    if tensor is not None:
        tensor.data.fill_(0.0)


def reset_module(module) -> None:
    """Reset a user-supplied module (e.g. GINConv's ``nn``) as PyG does.

    Calls its ``reset_parameters`` when it has one, else recurses into its
    children, so a ``torch.nn.Sequential`` of Linear layers is re-drawn.
    """
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    else:
        for child in module.children() if hasattr(module, "children") else []:
            reset_module(child)


class _BiasAdd(torch.autograd.Function):
    """x + bias (bias [F] broadcast over the rows of x [*, F]) whose bias gradient comes from bias_gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, bias: Tensor) -> Tensor:
        return x + bias

    @staticmethod
    def backward(ctx, grad: Tensor):
        # (autograd casts each gradient to its input's dtype where x and bias differ)
        grad_x = grad if ctx.needs_input_grad[0] else None
        grad_bias = bias_gradient(grad) if ctx.needs_input_grad[1] else None
        return grad_x, grad_bias


class _SharedInputAffine(torch.autograd.Function):
    """F.linear(x, w_i, b_i) for one or several projections (w_1, b_1, w_2, b_2, ...) of one x.

    The products are ops.dense's: on CUDA fp32, where they fill its tiles,
    one tensor-core product per pass for all projections at fp32's
    accuracy; elsewhere torch's GEMMs (x's gradient as one GEMM plus one
    addmm_ per further projection). Biases (any may be None) get the
    kernel's row sums, or ops.dense.bias_gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, *weights_and_biases: Optional[Tensor]):
        weights = weights_and_biases[0::2]
        ctx.save_for_backward(x, *weights)
        return dense.project(x, weights, weights_and_biases[1::2])

    @staticmethod
    def backward(ctx, *grads: Tensor):
        x, *weights = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1])
        grads = [g.reshape(-1, g.shape[-1]) for g in grads]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = dense.project_input_gradient(grads, weights).view(x.shape)
        param_grads = dense.project_parameter_gradients(
            grads, rows, ctx.needs_input_grad[1::2], ctx.needs_input_grad[2::2]
        )
        return (grad_x, *param_grads)


def affine(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """F.linear(x, weight, bias) whose bias gradient comes from bias_gradient."""
    return _SharedInputAffine.apply(x, weight, bias)[0]


def plain_projection(x: Tensor, *linears: "Linear") -> bool:
    """Whether to project x by calling the linears themselves: where plain_torch says so, or while a weight is
    still lazy (the call gives it its shape)."""
    return plain_projection_by(x, [linear.weight for linear in linears])


def plain_projection_by(x: Tensor, weights: list) -> bool:
    """plain_projection for linears of these weights."""
    return plain_torch(x) or any(is_lazy(weight) for weight in weights)


# Inputs of at most this many elements (rows x width; a mini-batch's 20,000 x 128) take plain torch functions.
# Such a training step waits on the host, not the GPU: a fused autograd function's Python backward and GEMM
# plan cost the host more than the memory traffic it saves (a 2-layer GAT step on 1024 seeds at 15,10 of
# rmat20, H200: 4.23 ms with the fused projection, 3.37 ms with PyG's F.linear and (h * att).sum(-1)).
HOST_BOUND_ELEMENTS = 1 << 22


def plain_torch(x: Tensor) -> bool:
    """Whether the layers' dense parts run plain torch functions rather than gnnio's fused autograd functions:
    under autocast (which casts inside F.linear), while tracing (torch.compile fuses them itself, and
    torch.jit.trace records them), and for inputs small enough that the host, not the GPU, sets the pace."""
    return tracing() or torch.is_autocast_enabled(x.device.type) or host_bound(x)


def host_bound(x: Tensor) -> bool:
    """Whether x is small enough (HOST_BOUND_ELEMENTS) that the host's time per op sets the pace."""
    return x.numel() <= HOST_BOUND_ELEMENTS


def project_shared(x: Tensor, *linears: "Linear") -> tuple[Tensor, ...]:
    """(linear(x) for each of `linears`) with one input gradient (see _SharedInputAffine); plain calls
    where plain_projection says so."""
    weights_and_biases = []
    for linear in linears:
        weights_and_biases += registered_parameters(linear, "weight", "bias")
    if plain_projection_by(x, weights_and_biases[0::2]):
        return tuple(linear(x) for linear in linears)
    return _SharedInputAffine.apply(x, *weights_and_biases)


def add_bias(x: Tensor, bias: Tensor) -> Tensor:
    """x + bias, as every layer adds its output bias (see bias_gradient); plain torch where plain_torch says so."""
    if plain_torch(x):
        return x + bias
    return _BiasAdd.apply(x, bias)


class Linear(torch.nn.Module):
    """x @ weight.T + bias, for x: [*, in_channels] -> [*, out_channels].

    weight_initializer: "glorot", "uniform" (+-1/sqrt(in)), "kaiming_uniform" or
    None (torch.nn.Linear's default, which is kaiming_uniform with a = sqrt(5)).
    bias_initializer: "zeros" or None (uniform in +-1/sqrt(in), as torch.nn.Linear).
    in_channels = -1 (or 0) makes the weight lazy: its shape is taken from the
    first input and it is initialised then.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bias: bool = True,
        weight_initializer: Optional[str] = None,
        bias_initializer: Optional[str] = None,
    ):
        super().__init__()
        if weight_initializer not in WEIGHT_INITIALIZERS:
            raise GnnioError(f"Linear: weight_initializer must be one of {WEIGHT_INITIALIZERS}, got {weight_initializer!r}")
        if bias_initializer not in BIAS_INITIALIZERS:
            raise GnnioError(f"Linear: bias_initializer must be one of {BIAS_INITIALIZERS}, got {bias_initializer!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.weight_initializer = weight_initializer
        self.bias_initializer = bias_initializer
        if in_channels > 0:
            self.weight = Parameter(torch.empty(out_channels, in_channels))
        else:
            self.weight = UninitializedParameter()
            self._lazy_hook = self.register_forward_pre_hook(self._materialize_from_input)
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw weight and bias (nothing happens while the weight is lazy)."""
        if self.in_channels <= 0:
            return
        if self.weight_initializer == "glorot":
            glorot_(self.weight)
        elif self.weight_initializer == "uniform":
            bound = 1.0 / math.sqrt(self.in_channels)
            self.weight.data.uniform_(-bound, bound)
        else:
            # kaiming_uniform with a = sqrt(5), written as PyG writes it so the bound is bit-identical.
            slope = math.sqrt(5)
            bound = math.sqrt(6 / ((1 + slope**2) * self.in_channels))
            self.weight.data.uniform_(-bound, bound)
        if self.bias is not None:
            if self.bias_initializer == "zeros":
                zeros_(self.bias)
            else:
                bound = 1.0 / math.sqrt(self.in_channels)
                self.bias.data.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """x: [*, in_channels] -> [*, out_channels]."""
        if torch.jit.is_scripting() or not isinstance(x, Tensor):  # (F.linear's error for a non-tensor, as PyG's)
            return F.linear(x, self.weight, self.bias)
        if self.bias is None or plain_torch(x):
            return F.linear(x, self.weight, self.bias)
        return affine(x, self.weight, self.bias)

    @torch.no_grad()
    def _materialize_from_input(self, module, inputs) -> None:
        if is_lazy(self.weight):
            self.in_channels = inputs[0].size(-1)
            self.weight.materialize((self.out_channels, self.in_channels))
            self.reset_parameters()
        self._lazy_hook.remove()
        del self._lazy_hook

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # A lazy weight cannot be detached; it is saved as is so a lazy checkpoint stays lazy.
        for name in ("weight", "bias"):
            value = getattr(self, name)
            if value is None:
                continue
            destination[prefix + name] = value if keep_vars or is_lazy(value) else value.detach()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None and not is_lazy(weight) and is_lazy(self.weight):
            self.in_channels = weight.size(-1)
            self.weight.materialize((self.out_channels, self.in_channels))
            if hasattr(self, "_lazy_hook"):
                self._lazy_hook.remove()
                del self._lazy_hook
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, bias={self.bias is not None})"
