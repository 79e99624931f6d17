"""ops.dense: fp32 projections on the tensor cores (native/dense.cu, split TF32) against fp64.

The kernel's error against an fp64 oracle is held to SPLIT_TF32_FACTOR times
the error of torch's own fp32 GEMM on the same GPU (cuBLAS without TF32,
torch's default), plus a floor far below fp32's accuracy. GPU only, except
the cuBLAS-path checks at the end, which run everywhere.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gnnio_cli.nn.linear import Linear, project_shared
from gnnio_cli.ops import dense, dispatch
from testing import DEVICES, assert_within_torch_error, poison_cuda_cache, randn, relative_error

# The projections under test are gnnio's fused ones, which small inputs would otherwise skip.
pytestmark = pytest.mark.usefixtures("fused_dense_path")


def on_gpu(test):
    """Runs `test` only where CUDA is visible and the native extension builds."""
    test = pytest.mark.usefixtures("native_extension")(test)
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test)


SPLIT_TF32_FACTOR = 4.0
FLOOR = 1e-7


def check_fp32_accuracy(actual: torch.Tensor, oracle: torch.Tensor, torch_fp32: torch.Tensor) -> None:
    assert not torch.isnan(actual).any(), "an output element was never written (poisoned NaN left)"
    assert_within_torch_error(actual, oracle, torch_fp32, factor=SPLIT_TF32_FACTOR, floor=FLOOR)


def column_blocks(matrix: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    """`matrix` cut into contiguous column blocks of `widths` (the op's segmented operands)."""
    return [block.contiguous() for block in matrix.split(widths, dim=1)]


# (M, K, N, segment widths of the stored A's columns, of the output's columns)
SHAPES = [
    pytest.param(1037, 36, 20, [12, 24], [20], id="odd-rows"),
    pytest.param(300, 128, 512, [128], [128, 128, 128, 128], id="four-outputs"),
    pytest.param(131, 4, 8, [4], [4, 4], id="k4"),
    pytest.param(2000, 260, 132, [128, 4, 128], [132], id="partial-tiles"),
    # B at most 1/16 of A: on H100/H200 B is split before the product (presplit)
    pytest.param(5000, 260, 132, [128, 4, 128], [132], id="presplit-partial-tiles"),
    pytest.param(64, 100_000, 132, [100_000], [132], id="split-k"),
]


@pytest.mark.parametrize("a_transposed", [False, True], ids=["a", "a^T"])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["b", "b^T"])
@pytest.mark.parametrize("m, k, n, a_widths, out_widths", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@on_gpu
def test_matmul_split_tf32_matches_fp64(a_transposed, b_transposed, m, k, n, a_widths, out_widths, with_bias):
    """C = op(A) @ op(B) (+ bias) and op(A)'s row sums, every operand orientation, against fp64."""
    if a_transposed:  # A is stored [K, M], cut along M: M must be a multiple of 4 too
        m -= m % 4
        a_widths = [m] if m <= 64 else [m // 8 * 4, m - m // 8 * 4]
    generator = torch.Generator().manual_seed(m + k + n + 2 * a_transposed + b_transposed)
    a64 = torch.randn(m, k, dtype=torch.float64, generator=generator)
    b64 = torch.randn(k, n, dtype=torch.float64, generator=generator)
    bias64 = torch.randn(n, dtype=torch.float64, generator=generator) if with_bias else None
    a_stored = (a64.t() if a_transposed else a64).float().contiguous().cuda()
    b_stored = (b64.t() if b_transposed else b64).float().contiguous().cuda()
    bias = bias64.float().cuda() if with_bias else None
    poison_cuda_cache(4 * m * n * 8)
    outputs = torch.ops.gnnio.matmul_split_tf32(
        column_blocks(a_stored, a_widths), a_transposed, [b_stored], b_transposed, bias, out_widths, a_transposed
    )
    product = torch.cat(outputs[: len(out_widths)], dim=1)
    oracle = a64 @ b64 + (bias64 if with_bias else 0)
    a32, b32 = a64.float().cuda(), b64.float().cuda()
    torch_fp32 = a32 @ b32 + (bias if with_bias else 0)
    check_fp32_accuracy(product, oracle, torch_fp32)
    if a_transposed:
        check_fp32_accuracy(outputs[-1], a64.sum(1), a32.sum(1))


@pytest.mark.parametrize("b_transposed", [False, True], ids=["b", "b^T"])
# K up to 128 with presplit B: B's n-tile stays in shared memory (gemm_resident_b_kernel)
@pytest.mark.parametrize("k, a_widths", [(100, [68, 32]), (164, [132, 32])], ids=["k100", "k164"])
@on_gpu
def test_small_b_split_before_the_product_agrees_with_fp64(b_transposed, k, a_widths):
    """A small B (at most 1/16 of A: split into its TF32 halves once, before the product, where the
    kernel runs the warpgroup MMAs) gives fp32-accurate products."""
    generator = torch.Generator().manual_seed(29 + b_transposed + k)
    a64 = torch.randn(5003, k, dtype=torch.float64, generator=generator)
    b64 = torch.randn(k, 260, dtype=torch.float64, generator=generator)
    b_stored = (b64.t() if b_transposed else b64).float().contiguous().cuda()
    bias64 = torch.randn(260, dtype=torch.float64, generator=generator)
    poison_cuda_cache(4 * 5003 * 260 * 8)
    out = torch.ops.gnnio.matmul_split_tf32(
        column_blocks(a64.float().cuda(), a_widths), False, [b_stored], b_transposed, bias64.float().cuda(), [128, 132]
    )
    torch_fp32 = a64.float().cuda() @ b64.float().cuda() + bias64.float().cuda()
    check_fp32_accuracy(torch.cat(out, dim=1), a64 @ b64 + bias64, torch_fp32)


# (M, K, weights' widths): M >= 16 N splits the weights where they lie (H100/H200), K <= 128 keeps them
# resident in shared memory; fewer rows take the general product on the weights concatenated
PROJECTIONS = [
    pytest.param(5000, 68, [36, 132, 4, 128], id="resident"),
    pytest.param(9000, 260, [132, 60, 128, 8], id="presplit-k260"),
    pytest.param(300, 68, [36, 132, 4, 128], id="few-rows"),
    pytest.param(2048, 128, [128], id="one-weight"),
]


@pytest.mark.parametrize("m, k, widths", PROJECTIONS)
@pytest.mark.parametrize(
    "biased", [(True, False, True, False), (False,) * 4, (True,) * 4], ids=["mixed", "none", "all"]
)
@on_gpu
def test_project_split_tf32_matches_fp64(m, k, widths, biased):
    """x @ W_i^T + b_i for a layer's weights read where they lie (biases None or not), against fp64."""
    generator = torch.Generator().manual_seed(m + k + sum(biased))
    x64 = torch.randn(m, k, dtype=torch.float64, generator=generator)
    weights64 = [torch.randn(w, k, dtype=torch.float64, generator=generator) for w in widths]
    biases64 = [torch.randn(w, dtype=torch.float64, generator=generator) if b else None for w, b in zip(widths, biased)]
    cuda = lambda t: None if t is None else t.float().cuda()
    poison_cuda_cache(4 * m * sum(widths) * 8)
    outputs = torch.ops.gnnio.project_split_tf32(cuda(x64), [cuda(w) for w in weights64], [cuda(b) for b in biases64])
    assert [tuple(out.shape) for out in outputs] == [(m, w) for w in widths]
    for out, w64, b64 in zip(outputs, weights64, biases64):
        oracle = F.linear(x64, w64, b64)
        check_fp32_accuracy(out, oracle, F.linear(cuda(x64), cuda(w64), cuda(b64)))


@on_gpu
@pytest.mark.parametrize(
    "weights, biases, message",
    [
        pytest.param([(8, 16)], [None, None], "one per weight", id="bias-count"),
        pytest.param([(8, 16)], [(4,)], r"biases\[0\] must be a contiguous float32 \[8\]", id="bias-shape"),
        pytest.param([(6, 16)], [None], "width a multiple of 4", id="width-6"),
        pytest.param([(8, 12)], [None], r"weights\[0\] must be a contiguous float32 \[width, 16\]", id="k-mismatch"),
        pytest.param([(8, 16)] * 5, [None] * 5, "weights takes 1 to 4", id="five-weights"),
    ],
)
def test_project_split_tf32_refuses_bad_shapes(weights, biases, message):
    x = torch.randn(64, 16, device="cuda")
    weights = [torch.randn(*shape, device="cuda") for shape in weights]
    biases = [None if shape is None else torch.randn(*shape, device="cuda") for shape in biases]
    with pytest.raises(RuntimeError, match=message):
        torch.ops.gnnio.project_split_tf32(x, weights, biases)


@on_gpu
def test_split_k_is_deterministic():
    generator = torch.Generator().manual_seed(11)
    grad = torch.randn(200_003, 128, generator=generator).cuda()
    rows = torch.randn(200_003, 36, generator=generator).cuda()
    first = torch.ops.gnnio.matmul_split_tf32([grad], True, [rows], False, None, [36], True)
    second = torch.ops.gnnio.matmul_split_tf32([grad], True, [rows], False, None, [36], True)
    assert all(torch.equal(x, y) for x, y in zip(first, second))


@on_gpu
@pytest.mark.parametrize(
    "a, b, out_widths, message",
    [
        pytest.param((10, 6), (6, 8), [8], "multiple of 4", id="width-6"),
        pytest.param((10, 8), (12, 8), [8], "K = 8 but b gives K = 12", id="k-mismatch"),
        pytest.param((10, 8), (8, 8), [4], "add up to N = 8", id="out-widths"),
        pytest.param((10, 8), (8, 8), [2, 6], "multiples of 4", id="out-width-2"),
    ],
)
def test_matmul_split_tf32_refuses_bad_shapes(a, b, out_widths, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.gnnio.matmul_split_tf32(
            [torch.randn(*a, device="cuda")], False, [torch.randn(*b, device="cuda")], False, None, out_widths
        )
    with pytest.raises(RuntimeError, match="must be float32"):
        torch.ops.gnnio.matmul_split_tf32(
            [torch.randn(8, 8, device="cuda", dtype=torch.float64)], False, [torch.randn(8, 8, device="cuda")], False,
            None, [8],
        )


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("rows_shape", [(3001,), (7, 129)], ids=["2d", "3d"])
@on_gpu
def test_layer_projections_take_split_tf32_and_match_fp64(count, rows_shape, monkeypatch):
    """project_shared / Linear on CUDA fp32 asked for split-tf32: outputs and every gradient against fp64."""
    monkeypatch.setenv(dense.MATMUL_ENV, "split-tf32")
    torch.manual_seed(6 + count)
    linears = [Linear(68, 36, bias=i != 1).cuda() for i in range(count)]
    x = randn(*rows_shape, 68, device="cuda").requires_grad_()
    grads = [randn(*rows_shape, 36, device="cuda") for _ in linears]
    params = [p for linear in linears for p in linear.parameters()]
    dispatch.reset()
    outs = project_shared(x, *linears) if count > 1 else (linears[0](x),)
    assert dispatch.ran()["projection"] == "split-tf32"
    mine = torch.autograd.grad(outs, [x, *params], grads)

    x64 = x.detach().double().cpu().requires_grad_()
    params64 = [p.detach().double().cpu().requires_grad_() for p in params]
    weights64 = iter(params64)
    outs64 = []
    for linear in linears:
        weight = next(weights64)
        bias = next(weights64) if linear.bias is not None else None
        outs64.append(F.linear(x64, weight, bias))
    expected = torch.autograd.grad(outs64, [x64, *params64], [g.double().cpu() for g in grads])
    with dispatch.use_backend("reference"):
        outs32 = [linear(x) for linear in linears]
    torch32 = torch.autograd.grad(outs32, [x, *params], grads)
    for out, out64, out32 in zip(outs, outs64, outs32):
        check_fp32_accuracy(out, out64, out32)
    for a, b, c in zip(mine, expected, torch32):
        check_fp32_accuracy(a, b, c)


@on_gpu
def test_double_backward_takes_differentiable_gemms(monkeypatch):
    """create_graph=True: the backward's products are torch's, so second derivatives flow (fp64 oracle)."""
    monkeypatch.setenv(dense.MATMUL_ENV, "split-tf32")
    torch.manual_seed(9)
    layer = Linear(16, 8).cuda()
    x = randn(200, 16, device="cuda").requires_grad_()
    (grad_x,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    grad_x.square().sum().backward()

    layer64 = Linear(16, 8).double()
    layer64.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    x64 = x.detach().double().cpu().requires_grad_()
    loss64 = F.linear(x64, layer64.weight, layer64.bias).square().sum()
    (grad_x64,) = torch.autograd.grad(loss64, x64, create_graph=True)
    grad_x64.square().sum().backward()
    assert relative_error(layer.weight.grad, layer64.weight.grad) < 1e-5
    assert relative_error(x.grad, x64.grad) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("choice", [None, "cublas", "split-tf32"], ids=["default", "cublas", "split-tf32"])
def test_cublas_path_gives_torch_gemms_exactly(device, choice, monkeypatch):
    """GNNIO_FP32_MATMUL=cublas, split-tf32 on the CPU, and the default (auto) on the CPU or for a product far
    too small for the kernel's tiles take F.linear itself: the same bits."""
    if choice is None:
        monkeypatch.delenv(dense.MATMUL_ENV, raising=False)
    else:
        monkeypatch.setenv(dense.MATMUL_ENV, choice)
    if choice == "split-tf32" and device == "cuda":
        pytest.skip("split-tf32 on CUDA is the kernel (test_layer_projections_take_split_tf32_and_match_fp64)")
    torch.manual_seed(2)
    layer = Linear(16, 8).to(device)
    x = torch.randn(300, 16, device=device)
    dispatch.reset()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert "projection" not in dispatch.ran()  # only the kernel is recorded


def test_unknown_matmul_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(dense.MATMUL_ENV, "tf32")
    with pytest.raises(Exception, match="GNNIO_FP32_MATMUL='tf32': choose one of auto, split-tf32, cublas"):
        dense.matmul_choice()


def test_tile_fill_counts_the_used_share_of_whole_tiles():
    assert dense.tile_fill(1024, 512, 128) == 1.0
    assert dense.tile_fill(1024, 136, 128) == pytest.approx(136 / 256)
    assert dense.tile_fill(100, 128, 136) == pytest.approx(100 / 128 * 136 / 160)
    assert dense.tile_fill(0, 128, 128) == 0.0


@on_gpu
@pytest.mark.parametrize("features, width, takes_kernel", [(128, 256, True), (128, 136, False), (64, 36, False)])
def test_auto_takes_the_kernel_where_the_product_fills_its_tiles(features, width, takes_kernel, monkeypatch):
    """The default: the forward [1000, width] product takes the kernel only where it uses 90% of its tiles'
    work (and the backward's products likewise); every output and gradient as accurate as torch's."""
    monkeypatch.delenv(dense.MATMUL_ENV, raising=False)
    torch.manual_seed(4)
    layer = Linear(features, width).cuda()
    x = randn(1000, features, device="cuda").requires_grad_()
    dispatch.reset()
    out = layer(x)
    assert (dispatch.ran().get("projection") == "split-tf32") == takes_kernel
    grad = randn(1000, width, device="cuda")
    mine = torch.autograd.grad(out, [x, layer.weight, layer.bias], grad)
    reference = F.linear(x, layer.weight, layer.bias)
    theirs = torch.autograd.grad(reference, [x, layer.weight, layer.bias], grad)
    params64 = [t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias)]
    out64 = F.linear(*params64)
    oracle = torch.autograd.grad(out64, params64, grad.double())
    for actual, expected, torch_fp32 in zip((out, *mine), (out64, *oracle), (reference, *theirs)):
        check_fp32_accuracy(actual, expected, torch_fp32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_projection_bench_says_it_needs_a_gpu(capsys):
    from perf import projections

    assert projections.main(["--rows", "8"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def check_layer_takes_split_tf32(layer, graph, x, grad_out, choice, monkeypatch):
    """The layer's output and every gradient on CUDA fp32 under GNNIO_FP32_MATMUL=`choice`: its projections
    took the split-TF32 kernel, and the results are as close to fp64 as with torch's GEMMs throughout."""

    def step(device, dtype, matmul):
        monkeypatch.setenv(dense.MATMUL_ENV, matmul)
        module = layer.to(device=device, dtype=dtype)
        inputs = x.to(device=device, dtype=dtype).requires_grad_()
        dispatch.reset()
        out = module(inputs, graph.to(device))
        grads = torch.autograd.grad(out, [inputs, *module.parameters()], grad_out.to(device=device, dtype=dtype))
        return [out.detach(), *grads], dispatch.ran().get("projection")

    oracle, _ = step("cpu", torch.float64, "cublas")
    chosen, ran = step("cuda", torch.float32, choice)
    cublas, _ = step("cuda", torch.float32, "cublas")
    assert ran == "split-tf32"
    for actual, expected, baseline in zip(chosen, oracle, cublas):
        check_fp32_accuracy(actual, expected, baseline)


@on_gpu
@pytest.mark.parametrize("layer_name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_layers_with_split_tf32_projections_match_fp64(layer_name, monkeypatch):
    """A whole layer, forward and every gradient, with its projections on the kernel: as close to fp64 as with
    torch's GEMMs (GATConv's h and score terms, and its packed gradients, take the kernel as one product)."""
    import gnnio_cli.nn as gnnio_nn
    from testing import random_graph

    graph = random_graph(300, 3000, hub_degree=500, seed=21)
    torch.manual_seed(21)
    layer = getattr(gnnio_nn, layer_name)(64, 16, heads=4)
    x = randn(300, 64, generator=torch.Generator().manual_seed(22))
    grad_out = randn(300, 64, generator=torch.Generator().manual_seed(23))
    check_layer_takes_split_tf32(layer, graph, x, grad_out, "split-tf32", monkeypatch)


@on_gpu
def test_gat_h_alone_takes_split_tf32_where_only_it_fills_the_tiles(monkeypatch):
    """GATConv with H*C = 128 under auto: h and its 8 score columns together fill too little of the kernel's
    tiles, h alone fills them, so h takes the kernel and the score terms torch's GEMM; the layer's output and
    every gradient stay as close to fp64 as with torch's GEMMs throughout."""
    import gnnio_cli.nn as gnnio_nn
    from testing import random_graph

    nodes = 1024  # whole 128-row tiles
    graph = random_graph(nodes, 8000, hub_degree=600, seed=31)
    torch.manual_seed(31)
    layer = gnnio_nn.GATConv(128, 32, heads=4)
    x = randn(nodes, 128, generator=torch.Generator().manual_seed(32))
    grad_out = randn(nodes, 128, generator=torch.Generator().manual_seed(33))
    check_layer_takes_split_tf32(layer, graph, x, grad_out, "auto", monkeypatch)
