"""gnnio's Linear and output-bias add: their own backward (the bias gradient as ones @ grad)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gnnio_cli.nn.linear import Linear, _SharedInputAffine, add_bias, affine, bias_gradient, project_shared
from gnnio_cli.ops import dispatch
from testing import DEVICES


# These tests check gnnio's fused autograd functions: every input takes them, however small (the test of
# the small inputs' plain path below sets its own limit).
pytestmark = pytest.mark.usefixtures("fused_dense_path")


@pytest.mark.parametrize("shape", [(7, 5), (2, 4, 5), (0, 5)], ids=["2d", "3d", "empty"])
def test_affine_and_bias_add_pass_gradcheck(shape):
    """fp64 gradcheck and gradgradcheck of x @ W.T + b and x + b, with [*, F] inputs of 2 and 3 dims."""
    generator = torch.Generator().manual_seed(3)

    def leaf(*size):
        return torch.randn(*size, dtype=torch.float64, generator=generator).requires_grad_()

    x, weight, bias = leaf(*shape), leaf(3, 5), leaf(3)
    assert torch.autograd.gradcheck(affine, (x, weight, bias))
    assert torch.autograd.gradgradcheck(affine, (x, weight, bias))
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
    dispatch.reset()
    out = layer(x)
    ours = torch.autograd.grad(out, [x, layer.weight, layer.bias], grad)
    reference = F.linear(x, layer.weight, layer.bias)
    theirs = torch.autograd.grad(reference, [x, layer.weight, layer.bias], grad)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    # torch's own GEMM gives the same bits; the split-TF32 kernel (CUDA fp32) fp32's accuracy
    exact = tolerance if dispatch.ran().get("projection") == "split-tf32" else dict(rtol=0, atol=0)
    torch.testing.assert_close(out, reference, **exact)
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


def test_shared_input_projections_pass_gradcheck():
    """fp64 gradcheck of several projections of one x (x's gradient accumulated by addmm_), biases or not."""
    generator = torch.Generator().manual_seed(4)

    def leaf(*size):
        return torch.randn(*size, dtype=torch.float64, generator=generator).requires_grad_()

    x = leaf(2, 6, 5)
    params = (leaf(3, 5), leaf(3), leaf(4, 5), None, leaf(3, 5), leaf(3))
    assert torch.autograd.gradcheck(lambda *a: _SharedInputAffine.apply(*a), (x, *params))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [1, 2, 4])
def test_project_shared_equals_separate_linears(device, count):
    """Outputs and every gradient as calling each Linear on x (fresh random values, fp32)."""
    torch.manual_seed(6)
    linears = [Linear(16, 8, bias=i % 2 == 0).to(device) for i in range(count)]
    x = torch.randn(300, 16, device=device, requires_grad=True)
    grads = [torch.randn(300, 8, device=device) for _ in linears]
    params = [p for linear in linears for p in linear.parameters()]
    ours = project_shared(x, *linears)
    mine = torch.autograd.grad(ours, [x, *params], grads)
    theirs = [linear(x) for linear in linears]
    expected = torch.autograd.grad(theirs, [x, *params], grads)
    for out, reference in zip(ours, theirs):
        torch.testing.assert_close(out, reference, rtol=0, atol=0)  # the same product, shared or not
    for a, b in zip(mine, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_project_shared_materialises_lazy_weights():
    linears = [Linear(-1, 3), Linear(-1, 2)]
    outs = project_shared(torch.randn(5, 7), *linears)
    assert [tuple(o.shape) for o in outs] == [(5, 3), (5, 2)] and linears[1].in_channels == 7


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vectors", [1, 2])
def test_fused_gat_projection_equals_the_plain_one(device, vectors, monkeypatch):
    """GATConv's fused projection with score terms (_ProjectWithScores, taken above HOST_BOUND_ELEMENTS) and the
    plain one (F.linear, then (h * v).sum(-1), taken below) give the same h, scores and gradients; fp64 gradcheck
    of the fused function."""
    from gnnio_cli.nn import gat
    from gnnio_cli.nn import linear as linear_module

    generator = torch.Generator().manual_seed(11)

    def leaf(*size, dtype=torch.float32):
        return torch.randn(*size, dtype=dtype, generator=generator).to(device).requires_grad_()

    heads, channels = 2, 3
    x, weight = leaf(40, 5), leaf(heads * channels, 5)
    atts = [leaf(1, heads, channels) for _ in range(vectors)]
    linear = Linear(5, heads * channels, bias=False).to(device)
    with torch.no_grad():
        linear.weight.copy_(weight)
    results = {}
    grads = None
    for name, limit in (("plain", 1 << 30), ("fused", -1)):
        monkeypatch.setattr(linear_module, "HOST_BOUND_ELEMENTS", limit)
        outputs = gat.project_with_scores(x, linear, heads, *atts)
        if grads is None:
            grads = [torch.randn(o.shape, generator=generator).to(device) for o in outputs]
        results[name] = (outputs, torch.autograd.grad(outputs, [x, linear.weight, *atts], grads))
    for got, want in zip([*results["fused"][0], *results["fused"][1]], [*results["plain"][0], *results["plain"][1]]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if device == "cpu":
        x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
        atts64 = [att.detach().double().requires_grad_() for att in atts]
        assert torch.autograd.gradcheck(lambda *a: gat._ProjectWithScores.apply(*a), (x64, w64, *atts64))


def test_small_inputs_take_plain_torch(monkeypatch):
    """At most HOST_BOUND_ELEMENTS elements: torch's own F.linear and bias add (the host sets the pace); above,
    gnnio's functions."""
    from gnnio_cli.nn import linear as linear_module

    monkeypatch.setattr(linear_module, "HOST_BOUND_ELEMENTS", 40)
    layer = Linear(4, 3)
    small, large = torch.randn(10, 4, requires_grad=True), torch.randn(11, 4, requires_grad=True)
    assert layer(small).grad_fn.name() == "AddmmBackward0"
    assert add_bias(small, torch.zeros(4, requires_grad=True)).grad_fn.name() == "AddBackward0"
    assert layer(large).grad_fn.name() != "AddmmBackward0"
    assert add_bias(large, torch.zeros(4, requires_grad=True)).grad_fn.name() == "_BiasAddBackward"
