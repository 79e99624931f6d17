"""gnnio's Linear and output-bias add: their own backward (the bias gradient as ones @ grad)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gnnio_cli.nn.linear import Linear, _Affine, add_bias, bias_gradient
from testing import DEVICES


@pytest.mark.parametrize("shape", [(7, 5), (2, 4, 5), (0, 5)], ids=["2d", "3d", "empty"])
def test_affine_and_bias_add_pass_gradcheck(shape):
    """fp64 gradcheck and gradgradcheck of x @ W.T + b and x + b, with [*, F] inputs of 2 and 3 dims."""
    generator = torch.Generator().manual_seed(3)

    def leaf(*size):
        return torch.randn(*size, dtype=torch.float64, generator=generator).requires_grad_()

    x, weight, bias = leaf(*shape), leaf(3, 5), leaf(3)
    assert torch.autograd.gradcheck(_Affine.apply, (x, weight, bias))
    assert torch.autograd.gradgradcheck(_Affine.apply, (x, weight, bias))
    y, row_bias = leaf(*shape[:-1], 3), leaf(3)
    assert torch.autograd.gradcheck(add_bias, (y, row_bias))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_gradients_equal_f_linear(device, dtype):
    """Same output and gradients as F.linear (fresh random values; bf16 within its rounding)."""
    torch.manual_seed(5)
    layer = Linear(16, 8).to(device=device, dtype=dtype)
    x = torch.randn(300, 16, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(300, 8, device=device, dtype=dtype)
    out = layer(x)
    ours = torch.autograd.grad(out, [x, layer.weight, layer.bias], grad)
    reference = F.linear(x, layer.weight, layer.bias)
    theirs = torch.autograd.grad(reference, [x, layer.weight, layer.bias], grad)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    for mine, torchs in zip(ours, theirs):
        assert mine.dtype == torchs.dtype
        torch.testing.assert_close(mine, torchs, **tolerance)


def test_bias_gradient_is_the_column_sum():
    grad = torch.randn(1000, 6, dtype=torch.float64)
    torch.testing.assert_close(bias_gradient(grad), grad.sum(0))
    torch.testing.assert_close(bias_gradient(grad.view(10, 100, 6)), grad.sum(0))


def test_autocast_takes_plain_torch():
    """Under autocast the layer and the bias add run torch's own ops (their dtypes follow autocast)."""
    layer = Linear(4, 3)
    x = torch.randn(5, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = add_bias(layer(x), layer.bias)
    assert out.grad_fn.name() != "_BiasAddBackward"
    out.float().sum().backward()
    assert x.grad is not None and layer.bias.grad is not None
