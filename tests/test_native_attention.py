"""The fused CUDA attention kernels (native/attention/) against the fp64 reference ops.

Every case runs the public op twice: with the native backend on the inputs'
dtype, and with the reference backend on the same values upcast to fp64 (the
oracle). Forward outputs, returned attention weights and the gradients of
every input are compared. 16-bit results must stay within 2x the error of
plain PyTorch at the same precision. GPU only: skipped unless CUDA is visible
and the native extension builds.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from gnnio_cli.graph import Graph
from gnnio_cli.graph.schedule import row_schedule
from gnnio_cli.ops import attention as attention_ops
from gnnio_cli.ops import attention_native, dispatch
from testing import (
    assert_within_torch_error,
    poison_cuda_cache,
    random_graph,
    randn,
    real_graphs,
    relative_error,
    with_index_dtype,
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

KINDS = ("gat", "gatv2", "transformer", "agnn")
EDGE_KINDS = ("gat", "gatv2", "transformer")
FP32_TOLERANCE = 2e-4


# ----------------------------------------------------------------- helpers
def make_inputs(kind, graph, heads, channels, dtype, *, edges=False, seed=0):
    """Leaf tensors for the public op `kind`, on the GPU, fresh random values (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    ns, nd, ne = graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges

    def tensor(*shape):
        return randn(*shape, dtype=dtype, device="cuda", generator=gen).requires_grad_()

    if kind == "gat":
        inputs = dict(x_src=tensor(ns, heads, channels), alpha_src=tensor(ns, heads), alpha_dst=tensor(nd, heads))
        if edges:
            inputs["edge_alpha"] = tensor(ne, heads)
    elif kind == "gatv2":
        inputs = dict(x_src=tensor(ns, heads, channels), x_dst=tensor(nd, heads, channels), att=tensor(heads, channels))
        if edges:
            inputs["edge_feat"] = tensor(ne, heads, channels)
    elif kind == "transformer":
        inputs = dict(query=tensor(nd, heads, channels), key=tensor(ns, heads, channels), value=tensor(ns, heads, channels))
        if edges:
            inputs["edge_feat"] = tensor(ne, heads, channels)
    else:
        inputs = dict(x_src=tensor(ns, channels), x_dst=tensor(nd, channels), beta=tensor(1))
    return inputs


def run(kind, graph, inputs, backend, **options):
    """The public op under `backend`; returns (out, alpha or None)."""
    if kind in ("gat", "gatv2"):
        options.setdefault("negative_slope", 0.2)
    op = getattr(attention_ops, f"{kind}_attention")
    with dispatch.use_backend(backend):
        dispatch.reset()
        if backend == "native" and options.get("return_attention"):
            # The kernels' weights carry no gradient, so asking for them with autograd on runs the
            # reference: read the kernels' weights without autograd, the output from a second call.
            with torch.no_grad():
                _, alpha = op(graph, **inputs, **options)
            assert "fused" in dispatch.ran()[f"{kind}_attention"]
            result = (op(graph, **inputs, **{**options, "return_attention": False}), alpha)
        else:
            result = op(graph, **inputs, **options)
        ran = dispatch.ran()[f"{kind}_attention"]
    if backend == "native":
        assert "fused" in ran, ran  # "fused ..." or "edge-balanced scores + fused ..."
    return result if isinstance(result, tuple) else (result, None)


def forward_backward(kind, graph, inputs, backend, grad_seed=1, **options):
    """(out, alpha, {name: grad}) with a random upstream gradient."""
    out, alpha = run(kind, graph, inputs, backend, **options)
    gen = torch.Generator().manual_seed(grad_seed)
    grad_out = randn(*out.shape, generator=gen).to(device=out.device, dtype=out.dtype)
    names = list(inputs)
    grads = torch.autograd.grad(out, [inputs[n] for n in names], grad_out)
    return out, alpha, dict(zip(names, grads))


def scaled_error(actual, expected, floor=1e-3):
    """max |actual - expected| / max(max |expected|, floor): gradients that are zero in exact
    arithmetic (AGNN's x_dst with one channel: d(x/|x|)/dx = 0) are judged against the floor."""
    return relative_error(actual, expected) * max(expected.abs().max().item(), 1e-30) / max(
        expected.abs().max().item(), floor
    )


def upcast(inputs, dtype=torch.float64):
    return {name: t.detach().to(dtype).requires_grad_() for name, t in inputs.items()}


def check_16bit_against_oracle(kind, graph, inputs):
    """16-bit output and gradients against the fp64 oracle, within twice plain PyTorch's error at the inputs'
    precision (assert_within_torch_error); returns the output."""
    dtype = inputs[next(iter(inputs))].dtype
    out, _, grads = forward_backward(kind, graph, inputs, "native")
    torch_out, _, torch_grads = forward_backward(kind, graph, upcast(inputs, dtype), "reference")
    oracle_out, _, oracle_grads = forward_backward(kind, graph, upcast(inputs), "reference")
    assert_within_torch_error(out, oracle_out, torch_out)
    for name in grads:
        assert_within_torch_error(grads[name], oracle_grads[name], torch_grads[name])
    return out


def check_against_oracle(kind, graph, inputs, tolerance=FP32_TOLERANCE, **options):
    out, alpha, grads = forward_backward(kind, graph, inputs, "native", **options)
    ref_out, ref_alpha, ref_grads = forward_backward(kind, graph, upcast(inputs), "reference", **options)
    assert out.dtype == inputs[next(iter(inputs))].dtype
    error = relative_error(out, ref_out)
    assert error <= tolerance, f"out: relative error {error:.3g}"
    if alpha is not None:
        error = relative_error(alpha, ref_alpha)
        assert error <= tolerance, f"alpha: relative error {error:.3g}"
    for name in grads:
        assert grads[name].shape == inputs[name].shape
        error = scaled_error(grads[name], ref_grads[name])
        assert error <= 10 * tolerance, f"grad {name}: relative error {error:.3g}"


@functools.lru_cache(maxsize=None)
def small_graph() -> Graph:
    """300 nodes with every edge case and a hub of in-degree 1,500, which the schedule cuts into tiles."""
    return random_graph(300, 2500, hub_degree=1500, seed=3)


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("channels", [1, 7, 32, 33, 64, 130])
@pytest.mark.parametrize("heads", [1, 3, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_matches_fp64_reference(kind, heads, channels):
    if kind == "agnn" and heads != 1:
        pytest.skip("AGNN has one head")
    graph = small_graph().to("cuda")
    assert row_schedule(graph, "csr").heavy_rows.numel() > 0
    inputs = make_inputs(kind, graph, heads, channels, torch.float32, seed=heads * 1000 + channels)
    check_against_oracle(kind, graph, inputs, return_attention=True)


@pytest.mark.parametrize("channels", [7, 32])
@pytest.mark.parametrize("heads", [9, 12])
def test_gat_with_more_heads_than_one_lane_sums(heads, channels):
    """Past 8 heads GAT's d alpha_dst sums walk each row once per group of 8 heads (12: four heads per load)."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("gat", graph, heads, channels, torch.float32, seed=9000 + 100 * heads + channels)
    check_against_oracle("gat", graph, inputs)


@pytest.mark.parametrize("heads", [3, 4])
def test_gat_packed_gradients(heads):
    """pack_gradients: the same gradients of x_src, alpha_src and alpha_dst, as views of one [N, H*C + 2H]
    tensor's rows, written in place by the source pass (split rows too) and the target sums. With 3 heads
    the rows (102 elements) are not 16-byte aligned, so the source pass takes its scalar layout."""
    # small_graph's in-hub (split target rows: the target sums' tiles) plus an out-hub (the source pass's)
    base = small_graph()
    source, target = base.edge_index()
    hub_targets = np.random.default_rng(6).integers(0, base.num_nodes, 600)
    edges = np.concatenate([np.stack([source.numpy(), target.numpy()]), np.stack([np.full(600, 5), hub_targets])], 1)
    graph = Graph.from_edge_index(edges, num_nodes=base.num_nodes).to("cuda")
    assert row_schedule(graph, "csr").heavy_rows.numel() > 0
    assert row_schedule(graph, "csc").heavy_rows.numel() > 0
    inputs = make_inputs("gat", graph, heads, 32, torch.float32, edges=True, seed=40 + heads)
    leaves = tuple(inputs.values())
    grad_out = randn(graph.num_dst_nodes, heads, 32, device="cuda", generator=torch.Generator().manual_seed(heads))
    grads = {}
    for pack in (False, True):
        out = attention_ops.gat_attention(graph, *leaves, pack_gradients=pack)
        grads[pack] = torch.autograd.grad(out, leaves, grad_out)
    # 3 heads: the packed pass sums in the scalar layout's order, the plain one in the 4-wide one's
    for name, plain, packed in zip(inputs, grads[False], grads[True]):
        assert relative_error(packed, plain) <= 1e-5, name
    x_grad, src_grad, dst_grad = grads[True][:3]
    width = heads * 32 + 2 * heads
    assert x_grad.stride(0) == src_grad.stride(0) == dst_grad.stride(0) == width
    assert src_grad.data_ptr() == x_grad.data_ptr() + heads * 32 * 4
    assert dst_grad.data_ptr() == src_grad.data_ptr() + heads * 4


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kind", EDGE_KINDS)
def test_edge_features_and_index_dtypes(kind, index_dtype):
    graph = with_index_dtype(small_graph(), index_dtype).to("cuda")
    inputs = make_inputs(kind, graph, 4, 32, torch.float32, edges=True, seed=7)
    check_against_oracle(kind, graph, inputs, return_attention=True)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kind", KINDS)
def test_index_dtypes_without_edge_features(kind, index_dtype):
    """The passes without edge features or returned weights (Dot's and GAT's fp32 forward gather ahead)
    read int32 and int64 indices alike."""
    graph = with_index_dtype(small_graph(), index_dtype).to("cuda")
    inputs = make_inputs(kind, graph, 4, 32, torch.float32, seed=11)
    check_against_oracle(kind, graph, inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_hub_of_degree_150k_bipartite(kind):
    """A super node far above any tile, on a bipartite graph with empty rows, loops and duplicates."""
    graph = random_graph(3000, 30000, hub_degree=150_000, num_dst_nodes=2000, seed=5).to("cuda")
    schedule = row_schedule(graph, "csr")
    assert int(schedule.heavy_tile_ptr.diff().max()) > 100
    inputs = make_inputs(kind, graph, 4, 32, torch.float32, edges=kind in EDGE_KINDS, seed=9)
    check_against_oracle(kind, graph, inputs)


def test_out_hub_is_split_in_the_source_pass():
    """A source with 50k out-edges: its CSC row is tiled for the source-side gradients."""
    rng = np.random.default_rng(4)
    src = np.concatenate([np.zeros(50_000, dtype=np.int64), rng.integers(0, 500, 5000)])
    dst = np.concatenate([rng.integers(0, 60_000, 50_000), rng.integers(0, 60_000, 5000)])
    graph = Graph.from_edge_index(np.stack([src, dst]), num_nodes=60_000).to("cuda")
    assert row_schedule(graph, "csc").heavy_rows.numel() > 0
    for kind in KINDS:
        check_against_oracle(kind, graph, make_inputs(kind, graph, 2, 16, torch.float32, seed=11))


def test_graph_without_edges_gives_zeros():
    graph = Graph.from_edge_index(np.zeros((2, 0), dtype=np.int64), num_nodes=7).to("cuda")
    for kind in KINDS:
        inputs = make_inputs(kind, graph, 2, 8, torch.float32)
        out, _, grads = forward_backward(kind, graph, inputs, "native")
        assert torch.equal(out, torch.zeros_like(out))
        assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("edges", [True, False], ids=["edge-features", "no-edge-features"])
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 16), (8, 64), (2, 128), (1, 8), (2, 12), (3, 33)])
@pytest.mark.parametrize("kind", KINDS)
def test_16bit_within_twice_torch_error(kind, heads, channels, edges, dtype):
    """16-bit output and every gradient within twice torch's own 16-bit error of the fp64 oracle, on the hub
    graph (rows cut into tiles in both passes), empty rows and one-edge rows, results in NaN-poisoned memory.
    C % 8 == 0 takes the backward passes' 8-wide layout (a warp's halves sum every other edge of a row, their
    sums added at its end; 8 x 64 in several head groups, 2 x 128 the widest head it holds); 12 channels the
    4-wide layout, 33 the scalar one."""
    if kind == "agnn" and edges:
        pytest.skip("AGNN takes no edge features")
    heads = 1 if kind == "agnn" else heads
    graph = small_graph().to("cuda")
    inputs = make_inputs(kind, graph, heads, channels, dtype, edges=edges, seed=13 + heads * channels)
    forward_backward(kind, graph, inputs, "native")  # the graph's cached structures first, then poison
    poison_cuda_cache(16 * graph.num_edges * heads * channels)
    out = check_16bit_against_oracle(kind, graph, inputs)
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_16bit_rows_off_16_bytes_take_the_4_wide_backward(kind, dtype):
    """16-bit feature rows that start 8 bytes off a 16-byte boundary cannot take the 8-wide layout's 16-byte
    loads: the passes fall back to the 4-wide one, still within twice torch's own 16-bit error."""
    graph = small_graph().to("cuda")
    shifted = {}
    for name, t in make_inputs(kind, graph, 4, 32, dtype, edges=kind in EDGE_KINDS, seed=71).items():
        if t.dim() < 2:  # AGNN's beta is read one value at a time
            shifted[name] = t
            continue
        flat = torch.empty(t.numel() + 4, dtype=dtype, device="cuda")
        view = flat[4:].view(t.shape)  # contiguous, its start 8 bytes off 16
        view.copy_(t.detach())
        assert view.data_ptr() % 16 == 8
        shifted[name] = view.requires_grad_()
    check_16bit_against_oracle(kind, graph, shifted)


@pytest.mark.parametrize("channels", [32, 33])
def test_every_output_element_is_written(channels):
    """Outputs come from the caching allocator after NaN filled its blocks: a skipped element stays NaN."""
    graph = small_graph().to("cuda")
    for kind in KINDS:
        inputs = make_inputs(kind, graph, 3, channels, torch.float32, edges=kind in EDGE_KINDS, seed=17)
        poison = torch.full((1 << 24,), float("nan"), device="cuda")
        del poison
        out, alpha, grads = forward_backward(kind, graph, inputs, "native", return_attention=True)
        assert torch.isfinite(out).all() and torch.isfinite(alpha).all(), kind
        for name, grad in grads.items():
            assert torch.isfinite(grad).all(), (kind, name)


class _MaskedFunctional:
    """torch.nn.functional with dropout replaced by a fixed mask (eid order), for the reference op."""

    def __init__(self, module, keep):
        self._module, self._keep = module, keep

    def __getattr__(self, name):
        return getattr(self._module, name)

    def dropout(self, alpha, p, training):
        return alpha * self._keep.to(alpha.dtype) / (1.0 - p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", KINDS)
def test_dropout_mask_is_regenerated_in_backward(kind, dtype, monkeypatch):
    """The kernel's mask, read back through GAT's after-dropout weights, reproduces its forward and backward;
    16-bit (8 channels: the backward passes' 8-wide layout, whose halves take different edges) within twice
    torch's own 16-bit error of the fp64 oracle under the same mask."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else 3
    probability = 0.3
    torch.cuda.manual_seed(1234)
    gat_inputs = make_inputs("gat", graph, heads, 4, torch.float32, seed=19)
    _, dropped = run("gat", graph, gat_inputs, "native", dropout=probability, training=True, return_attention=True)
    keep = dropped != 0
    kept = keep.float().mean().item()
    assert abs(kept - (1 - probability)) < 0.03, kept

    inputs = make_inputs(kind, graph, heads, 8, dtype, edges=kind in EDGE_KINDS, seed=23)
    torch.cuda.manual_seed(1234)
    out, _, grads = forward_backward(kind, graph, inputs, "native", dropout=probability, training=True)
    # The reference draws its mask over eid-ordered weights (as PyG does), so the fixed mask is in eid order.
    keep_eid = keep if kind != "agnn" else keep.reshape(-1, 1)
    monkeypatch.setattr(attention_ops, "F", _MaskedFunctional(attention_ops.F, keep_eid))
    ref_out, _, ref_grads = forward_backward(kind, graph, upcast(inputs), "reference", dropout=probability, training=True)
    if dtype != torch.float32:
        torch_out, _, torch_grads = forward_backward(kind, graph, upcast(inputs, dtype), "reference",
                                                     dropout=probability, training=True)
        assert_within_torch_error(out, ref_out, torch_out)
        for name in grads:
            assert_within_torch_error(grads[name], ref_grads[name], torch_grads[name])
        return
    assert relative_error(out, ref_out) <= FP32_TOLERANCE
    for name in grads:
        assert relative_error(grads[name], ref_grads[name]) <= 10 * FP32_TOLERANCE, name


@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_with_autograd_take_the_reference(kind):
    """Weights asked for while autograd tracks the inputs carry PyG's gradient: that call runs the reference."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else 2
    inputs = make_inputs(kind, graph, heads, 8, torch.float32, seed=41)
    results = {}
    for backend in ("native", "reference"):
        with dispatch.use_backend(backend):
            dispatch.reset()
            out, alpha = getattr(attention_ops, f"{kind}_attention")(graph, **inputs, return_attention=True)
            assert dispatch.ran()[f"{kind}_attention"] == "reference"
        loss = out.sum() + (alpha * torch.arange(alpha.numel(), device="cuda").reshape(alpha.shape)).sum()
        results[backend] = torch.autograd.grad(loss, list(inputs.values()))
    # Both calls run the reference, whose CUDA scatter sums add in no fixed order: equal up to
    # fp32 rounding of sums whose terms reach alpha.numel() in size. The hub's row adds 1,500 such
    # terms; their rounding reached 1.05e-5 of the largest gradient in one GPU run.
    for native_grad, reference_grad in zip(results["native"], results["reference"]):
        torch.testing.assert_close(native_grad, reference_grad, rtol=1e-4, atol=1e-4 * reference_grad.abs().max().item())


def test_dropout_statistics_and_fresh_masks():
    graph = random_graph(2000, 40000, seed=29).to("cuda")
    inputs = make_inputs("gatv2", graph, 4, 8, torch.float32, seed=31)
    options = dict(dropout=0.4, training=True, return_attention=True)
    _, first = run("gatv2", graph, inputs, "native", **options)
    _, second = run("gatv2", graph, inputs, "native", **options)
    kept = (first != 0).float().mean().item()
    samples = first.numel()
    assert abs(kept - 0.6) < 5 * math.sqrt(0.24 / samples), kept
    assert not torch.equal(first != 0, second != 0)
    _, evaluation = run("gatv2", graph, inputs, "native", dropout=0.4, training=False, return_attention=True)
    assert (evaluation != 0).all()


@pytest.mark.parametrize("real", real_graphs(), ids=lambda g: g.name)
def test_real_graphs(real):
    from gnnio_cli.graph.io import read_edges

    edges = read_edges(str(real.path))
    graph = Graph.from_edge_index(np.stack([edges.src, edges.dst])).to("cuda")
    for kind in KINDS:
        inputs = make_inputs(kind, graph, 2, 16, torch.float32, edges=kind in EDGE_KINDS, seed=37)
        check_against_oracle(kind, graph, inputs)


def test_every_schedule_candidate_computes_the_same_function():
    """`compare --schedules` forces other tile lengths and the edge-balanced forward: each must give the
    chosen schedule's results, and the dispatcher must record the one that ran."""
    graph = small_graph().to("cuda")
    candidates = attention_native.schedule_candidates(graph)
    assert candidates[0] is None and candidates[-2] >= int(graph.in_degree.max())  # chosen ... no split
    assert candidates[-1] == attention_native.EDGE_BALANCED
    inputs = make_inputs("gatv2", graph, 2, 8, torch.float32, seed=43)
    chosen_out, _, chosen_grads = forward_backward("gatv2", graph, inputs, "native")
    for schedule in candidates[1:]:
        dispatch.reset()
        with attention_native.forced_schedule(schedule):
            out, _, grads = forward_backward("gatv2", graph, inputs, "native")
        ran = dispatch.ran()["gatv2_attention"]
        assert ran.startswith("edge-balanced scores + fused") == (schedule == attention_native.EDGE_BALANCED), ran
        assert relative_error(out, chosen_out) <= FP32_TOLERANCE, schedule
        for name in grads:
            assert relative_error(grads[name], chosen_grads[name]) <= 10 * FP32_TOLERANCE, (schedule, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schedule", [None, attention_native.EDGE_BALANCED], ids=["chosen", "edge-balanced"])
def test_results_are_bitwise_reproducible(kind, schedule, dtype):
    """No atomics anywhere: the same inputs give bitwise the same output and gradients, call after call,
    on the hub graph whose rows are cut into tiles (the kernels are always in deterministic mode; bf16's
    backward passes add their warp halves' sums in a fixed order)."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else 3
    inputs = make_inputs(kind, graph, heads, 32, dtype, edges=kind in EDGE_KINDS, seed=53)
    with attention_native.forced_schedule(schedule):
        first_out, _, first_grads = forward_backward(kind, graph, inputs, "native")
        for _ in range(3):
            out, _, grads = forward_backward(kind, graph, inputs, "native")
            assert torch.equal(out, first_out)
            for name in grads:
                assert torch.equal(grads[name], first_grads[name]), name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("heads,channels", [(1, 7), (3, 33), (2, 32), (8, 32)])
def test_edge_balanced_forward_matches_fp64_reference(kind, heads, channels):
    """The edge-balanced score phase plus the fused softmax on its scores, on the hub graph (tiles), with
    edge features where the kind has them, fp32 against fp64, forward and the backward that follows."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else heads
    inputs = make_inputs(kind, graph, heads, channels, torch.float32, edges=kind in EDGE_KINDS, seed=heads + channels)
    with attention_native.forced_schedule(attention_native.EDGE_BALANCED):
        check_against_oracle(kind, graph, inputs)
        check_against_oracle(kind, graph, inputs, return_attention=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_edge_balanced_forward_16bit_equals_the_fused_forward(kind, dtype):
    """Same scores, same softmax: the edge-balanced forward's 16-bit output is the fused forward's up to
    one rounding to the 16-bit dtype (the fused 16-bit forward takes two edges per warp at a time, so
    its fp32 sums add in another order)."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else 4
    inputs = make_inputs(kind, graph, heads, 32, dtype, edges=kind in EDGE_KINDS, seed=71)
    fused, _ = run(kind, graph, inputs, "native")
    with attention_native.forced_schedule(attention_native.EDGE_BALANCED):
        balanced, _ = run(kind, graph, inputs, "native")
    assert relative_error(balanced.float(), fused.float()) <= torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", [(1, 8), (3, 16), (8, 64), (2, 128), (3, 32), (8, 32)])
@pytest.mark.parametrize("kind", KINDS)
def test_16bit_forward_two_edges_per_warp(kind, heads, channels, dtype):
    """The 16-bit forward's layout for C % 8 == 0 (a warp's halves take every other edge, their softmax
    states merge at the row's end; several head groups for 8 x 64): output and weights within twice
    torch's own 16-bit error, on a graph with empty rows, one-edge rows and a hub cut into tiles; with
    dropout, the fp32 kernels' mask (same seed) and their output up to one 16-bit rounding (GATv2, whose
    16-bit hidden terms are rounded too: the same dropped weights)."""
    graph = small_graph().to("cuda")
    heads = 1 if kind == "agnn" else heads
    inputs = make_inputs(kind, graph, heads, channels, dtype, edges=kind in EDGE_KINDS, seed=heads * channels)
    out, alpha = run(kind, graph, inputs, "native", return_attention=True)
    torch_out, torch_alpha = run(kind, graph, upcast(inputs, dtype), "reference", return_attention=True)
    oracle_out, oracle_alpha = run(kind, graph, upcast(inputs), "reference", return_attention=True)
    assert out.dtype == dtype
    assert_within_torch_error(out, oracle_out, torch_out)
    assert_within_torch_error(alpha, oracle_alpha, torch_alpha)

    dropped, weights = {}, {}
    for precision in (dtype, torch.float32):
        torch.cuda.manual_seed(29)
        dropped[precision], weights[precision] = run(
            kind, graph, upcast(inputs, precision), "native", dropout=0.3, training=True, return_attention=kind == "gatv2"
        )
    if kind == "gatv2":
        dropped_16bit, dropped_fp32 = weights[dtype] == 0, weights[torch.float32] == 0
        assert dropped_fp32.any() and bool(dropped_16bit[dropped_fp32].all())
        # a 16-bit zero the fp32 run kept: a weight below the 16-bit type's normal range, rounded away
        underflow = weights[torch.float32][dropped_16bit & ~dropped_fp32]
        assert bool((underflow < torch.finfo(dtype).smallest_normal).all())
    else:
        assert relative_error(dropped[dtype].float(), dropped[torch.float32]) <= torch.finfo(dtype).eps


def rounded_gatv2_reference(graph, inputs, slope, dtype):
    """GATv2's output in fp64 with the 16-bit layer's roundings: each hidden sum (x_src + x_dst, then
    + edge) and the negative side's slope * hidden rounded to `dtype`, the slope itself taken in it."""
    x_src, x_dst, att = (inputs[name].detach().double() for name in ("x_src", "x_dst", "att"))
    src, dst = graph.edge_index()
    to_dtype = lambda t: t.to(dtype).double()  # noqa: E731
    hidden = to_dtype(x_src[src] + x_dst[dst])
    if "edge_feat" in inputs:
        hidden = to_dtype(hidden + inputs["edge_feat"].detach().double())
    slope_in_dtype = torch.tensor(slope, dtype=dtype).item()
    score = (torch.where(hidden > 0, hidden, to_dtype(hidden * slope_in_dtype)) * att).sum(-1)  # [E, H]
    heads = score.shape[1]
    index = dst.view(-1, 1).expand(-1, heads)
    row_max = torch.full((graph.num_dst_nodes, heads), -math.inf, dtype=torch.float64, device=score.device)
    row_max = row_max.scatter_reduce(0, index, score, reduce="amax")
    weight = torch.exp(score - row_max[dst])
    total = torch.zeros_like(row_max).index_add_(0, dst, weight)
    out = torch.zeros(graph.num_dst_nodes, *x_src.shape[1:], dtype=torch.float64, device=score.device)
    return out.index_add_(0, dst, (weight / total[dst]).unsqueeze(-1) * x_src[src])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("slope", [0.2, 1.5, -0.3])
@pytest.mark.parametrize("heads,edges", [(3, False), (4, True), (8, False)])
def test_gatv2_16bit_forward_with_packed_scores_matches_the_rounded_reference(heads, edges, slope, dtype):
    """GATv2's 16-bit forward of 32-channel heads (hidden terms in bf16x2 / half2, head sums on the tensor
    cores; with edge features the one-element-at-a-time build, same roundings): the fp64 output of the
    16-bit layer's roundings, up to the output's own rounding, for slopes below 0, in [0, 1] and above 1
    (max or min of h and slope * h), with a partly used head group (3 heads) and two head groups (8);
    its scores are the backward's, so the gradients stay within twice torch's own 16-bit error."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("gatv2", graph, heads, 32, dtype, edges=edges, seed=heads * 7 + int(edges))
    out, _, grads = forward_backward("gatv2", graph, inputs, "native", negative_slope=slope)
    expected = rounded_gatv2_reference(graph, inputs, slope, dtype)
    assert out.dtype == dtype
    assert relative_error(out, expected) <= torch.finfo(dtype).eps
    _, _, torch_grads = forward_backward("gatv2", graph, upcast(inputs, dtype), "reference", negative_slope=slope)
    _, _, oracle_grads = forward_backward("gatv2", graph, upcast(inputs), "reference", negative_slope=slope)
    for name in grads:
        assert_within_torch_error(grads[name], oracle_grads[name], torch_grads[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", [(1, 8), (3, 33), (1, 128), (2, 264)])
def test_row_norms_match_fp64(heads, channels, dtype):
    """attention_row_norms (AGNN's |x| and 1 / max(|x|, 1e-12) per row, fp32) for rows read in 16-byte
    chunks (one chunk per row, many rows per load; several lanes per row; rows wider than a warp's
    chunks) and one element at a time (33 channels); a zero row takes the floor."""
    x = randn(301, heads, channels, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(channels))
    x[7] = 0
    norm = torch.ops.gnnio.attention_row_norms(x)
    assert norm.dtype == torch.float32 and norm.shape == (301, heads, 2)
    expected = torch.linalg.vector_norm(x.double(), dim=-1)
    assert relative_error(norm[..., 0], expected) <= 1e-6
    assert relative_error(norm[..., 1], 1.0 / expected.clamp_min(1e-12)) <= 1e-6
    assert torch.all(norm[7, :, 1] == 1.0 / torch.tensor(1e-12, dtype=torch.float32))


def test_edge_balanced_forward_with_dropout_uses_the_fused_mask():
    """Dropout weights come from the edge ids in both forwards: the same seed gives the same output."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("transformer", graph, 3, 8, torch.float32, edges=True, seed=29)
    torch.cuda.manual_seed(99)
    fused, _ = run("transformer", graph, inputs, "native", dropout=0.4, training=True)
    torch.cuda.manual_seed(99)
    with attention_native.forced_schedule(attention_native.EDGE_BALANCED):
        balanced, _ = run("transformer", graph, inputs, "native", dropout=0.4, training=True)
    assert relative_error(balanced, fused) <= FP32_TOLERANCE


def op_arguments(kind="gatv2", seed=5):
    """(graph, call, tensors) for calling the GATv2 or Dot kind's native ops directly, 2 heads x 8, on
    small_graph; tensors: the ops' tensor arguments, (x_src, x_dst, att, edge) or (query, key, value, edge)."""
    graph = small_graph().to("cuda")
    inputs = {name: t.detach() for name, t in make_inputs(kind, graph, 2, 8, torch.float32, seed=seed).items()}
    gatv2 = kind == "gatv2"
    call = attention_native._make_call(
        attention_native.GATV2 if gatv2 else attention_native.DOT, graph, 2, torch.device("cuda"),
        negative_slope=0.2 if gatv2 else 0.0, scale=1.0, dropout=0.0, training=False, return_attention=False,
        weights_after_dropout=gatv2,
    )  # fmt: skip
    if gatv2:
        tensors = (inputs["x_src"], inputs["x_dst"], inputs["att"], None)
    else:
        tensors = (inputs["query"], inputs["key"], inputs["value"], None)
    return graph, call, tensors


def test_edge_balanced_op_checks_slot_rows():
    graph, call, tensors = op_arguments()
    with pytest.raises(RuntimeError,
                       match=r"gatv2_attention_forward_edge_balanced: slot_rows must be a contiguous int32"):
        torch.ops.gnnio.gatv2_attention_forward_edge_balanced(
            *call.plan.csr_args, *tensors, *call.score_args(), 0,
            torch.zeros(graph.num_edges, dtype=torch.int64, device="cuda"),
        )


# ------------------------------------------------------ AGNN (Cosine kind)
def agnn_rows(num_nodes, channels, dtype, *, seed, special=True):
    """[N, C] random rows on the GPU; with `special`: row 0 zero, 1 of norm 5e-13 (under
    F.normalize's floor of 1e-12), 2 of norm 3e-12 (just above it), 3 of norm 1e4. Their
    gradients reach 1e12, beyond fp16, so the 16-bit tests use ordinary rows only."""
    x = randn(num_nodes, channels, generator=torch.Generator().manual_seed(seed))
    if special:
        x[0] = 0.0
        for row, norm in ((1, 5e-13), (2, 3e-12), (3, 1e4)):
            x[row] = x[row] / torch.linalg.vector_norm(x[row]) * norm
    return x.to(device="cuda", dtype=dtype).requires_grad_()


def agnn_forward_backward(graph, x_src, x_dst, beta, backend, grad_out):
    """out and the gradients of the distinct leaves among (x_src, x_dst, beta)."""
    leaves = [x_src, beta] if x_dst is x_src else [x_src, x_dst, beta]
    with dispatch.use_backend(backend):
        dispatch.reset()
        out = attention_ops.agnn_attention(graph, x_src, x_dst, beta)
        ran = dispatch.ran()["agnn_attention"]
    assert ran.startswith("fused") == (backend == "native"), ran
    return out, torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


def agnn_case(graph, channels, dtype, *, shared, seed, special=True):
    """(x_src, x_dst, beta) leaves, x_dst the same tensor as x_src when `shared`."""
    x_src = agnn_rows(graph.num_src_nodes, channels, dtype, seed=seed, special=special)
    x_dst = x_src if shared else agnn_rows(graph.num_dst_nodes, channels, dtype, seed=seed + 1, special=special)
    beta = torch.tensor([-0.8 if seed % 2 else 1.3], device="cuda", requires_grad=True)
    return x_src, x_dst, beta


def upcast_case(x_src, x_dst, beta, dtype=torch.float64):
    new_src = x_src.detach().to(dtype).requires_grad_()
    new_dst = new_src if x_dst is x_src else x_dst.detach().to(dtype).requires_grad_()
    return new_src, new_dst, beta.detach().to(dtype).requires_grad_()


def assert_rows_within(actual, expected, tolerance, what, floor=None):
    """Row by row relative error, max |a - e| / max(max |e|, floor) of each row: rows under the
    norm floor have gradients of order 1e12, which would hide every other row's error behind one
    global scale. The floor (default: 1e-3 x the largest value of the ordinary rows, 4 on) judges
    rows that are 0 in exact arithmetic, as scaled_error does for a whole tensor."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if floor is None:
        floor = max(1e-3 * expected[4:].abs().max().item(), 1e-30) if expected.shape[0] > 4 else 1e-3
    difference = (actual - expected).abs().reshape(expected.shape[0], -1).amax(1)
    scale = expected.abs().reshape(expected.shape[0], -1).amax(1).clamp_min(floor)
    errors = difference / scale
    worst = int(errors.argmax()) if errors.numel() else 0
    assert errors.numel() == 0 or errors[worst] <= tolerance, f"{what} row {worst}: relative error {errors[worst]:.3g}"


@pytest.mark.parametrize("shared", [True, False], ids=["x_dst-is-x_src", "separate"])
@pytest.mark.parametrize("channels", [1, 7, 33, 128, 130])
def test_agnn_unit_rows_match_fp64_reference(channels, shared):
    """The Cosine kind (one unit row and one norm per edge) on zero, tiny and large rows, fp32 vs fp64."""
    graph = small_graph().to("cuda")
    x_src, x_dst, beta = agnn_case(graph, channels, torch.float32, shared=shared, seed=channels)
    grad_out = randn(graph.num_dst_nodes, channels, generator=torch.Generator().manual_seed(3)).cuda()
    out, grads = agnn_forward_backward(graph, x_src, x_dst, beta, "native", grad_out)
    ref_out, ref_grads = agnn_forward_backward(graph, *upcast_case(x_src, x_dst, beta), "reference", grad_out.double())
    assert_rows_within(out, ref_out, FP32_TOLERANCE, "out")
    for index, (grad, ref) in enumerate(zip(grads, ref_grads)):
        assert grad.shape == ref.shape and torch.isfinite(grad).all(), index
        if ref.dim() == 1:  # beta
            assert relative_error(grad, ref) <= 10 * FP32_TOLERANCE, f"grad beta {grad} vs {ref}"
        else:
            # With one channel, (g - <g, u> u) / |x| is 0 in exact arithmetic and fp32 rounding of
            # order 1e-7 |g| / |x| elsewhere: for row 2 (|x| = 3e-12) that noise outweighs the
            # true gradient, in fp32 PyTorch as much as in the kernel. Wider rows keep a tangential
            # part of the same size as the noise's scale, so every row is checked there.
            floor = None
            if channels == 1:
                grad, ref = torch.cat([grad[:2], grad[3:]]), torch.cat([ref[:2], ref[3:]])
                if index == 1:
                    # x_dst only feeds the cosine, whose unit row is +-1 for any one-channel x: its exact
                    # gradient is 0 and both results are rounding noise, judged on x_src's gradient scale.
                    floor = ref_grads[0].abs().max().item()
            assert_rows_within(grad, ref, 10 * FP32_TOLERANCE, f"grad {index}", floor=floor)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shared", [True, False], ids=["x_dst-is-x_src", "separate"])
@pytest.mark.parametrize("channels", [7, 33, 128])
def test_agnn_unit_rows_16bit_within_twice_torch_error(channels, shared, dtype):
    """16-bit unit rows and messages (norm * unit row, the norm kept in fp32) against PyTorch at 16 bits."""
    graph = small_graph().to("cuda")
    x_src, x_dst, beta = agnn_case(graph, channels, dtype, shared=shared, seed=channels + 50, special=False)
    grad_out = randn(graph.num_dst_nodes, channels, generator=torch.Generator().manual_seed(4)).cuda()
    out, grads = agnn_forward_backward(graph, x_src, x_dst, beta, "native", grad_out)
    torch_out, torch_grads = agnn_forward_backward(graph, *upcast_case(x_src, x_dst, beta, dtype), "reference", grad_out)
    oracle_out, oracle_grads = agnn_forward_backward(graph, *upcast_case(x_src, x_dst, beta), "reference", grad_out.double())
    assert out.dtype == dtype
    assert_within_torch_error(out, oracle_out, torch_out)
    for grad, oracle, plain in zip(grads, oracle_grads, torch_grads):
        assert_within_torch_error(grad, oracle, plain)


def test_agnn_hub_row_tiles():
    """A target of in-degree 150,000, cut into tiles: the tiles' d beta shares and the beta-scaled
    d u_dst are finished by finish_target_tiles_kernel; both sharing cases, fp32 vs fp64."""
    graph = random_graph(3000, 30000, hub_degree=150_000, num_dst_nodes=3000, seed=8).to("cuda")
    assert row_schedule(graph, "csr").heavy_rows.numel() > 0
    for shared in (True, False):
        x_src, x_dst, beta = agnn_case(graph, 32, torch.float32, shared=shared, seed=60 + shared)
        grad_out = randn(graph.num_dst_nodes, 32, generator=torch.Generator().manual_seed(6)).cuda()
        out, grads = agnn_forward_backward(graph, x_src, x_dst, beta, "native", grad_out)
        ref_out, ref_grads = agnn_forward_backward(graph, *upcast_case(x_src, x_dst, beta), "reference", grad_out.double())
        assert_rows_within(out, ref_out, FP32_TOLERANCE, "out")
        assert relative_error(grads[-1], ref_grads[-1]) <= 10 * FP32_TOLERANCE, "grad beta"
        for grad, ref in zip(grads[:-1], ref_grads[:-1]):
            assert_rows_within(grad, ref, 10 * FP32_TOLERANCE, "grad x")


def test_agnn_row_norms_and_unit_rows_backward_match_f_normalize():
    """attention_row_norms and the unit rows' backward alone, against F.normalize's autograd in fp64."""
    x = agnn_rows(200, 33, torch.float32, seed=70).detach().reshape(200, 1, 33)
    norm = torch.ops.gnnio.attention_row_norms(x)
    x64 = x.double().requires_grad_()
    expected = torch.nn.functional.normalize(x64, p=2.0, dim=-1)
    assert norm.dtype == torch.float32 and norm.shape == (200, 1, 2)
    assert relative_error(norm[..., 0], torch.linalg.vector_norm(x64, dim=-1)) <= 1e-6
    grad = randn(200, 1, 33, generator=torch.Generator().manual_seed(71)).cuda()
    grad_x = torch.ops.gnnio.attention_unit_rows_backward(x, norm, grad)
    expected_x = torch.autograd.grad(expected, x64, grad.double())[0]
    assert_rows_within(grad_x, expected_x, 1e-5, "grad x", floor=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", [(1, 1), (3, 33), (4, 32), (2, 130), (5, 8), (2, 264)])
def test_row_dots_match_fp64(heads, channels, dtype):
    """attention_row_dots (delta = <grad_out, out - bias> of GAT's and Dot's backward) against fp64 torch."""
    gen = torch.Generator().manual_seed(heads * 100 + channels)
    a = randn(77, heads, channels, dtype=dtype, device="cuda", generator=gen)
    b = randn(77, heads, channels, dtype=dtype, device="cuda", generator=gen)
    dots, no_sums = torch.ops.gnnio.attention_row_dots(a, b)
    assert dots.dtype == torch.float32 and dots.shape == (77, heads) and no_sums.numel() == 0
    assert relative_error(dots, (a.double() * b.double()).sum(-1)) <= 1e-6
    offset = randn(heads, channels, dtype=dtype, device="cuda", generator=gen)
    shifted, _ = torch.ops.gnnio.attention_row_dots(a, b, offset)
    assert relative_error(shifted, (a.double() * (b.double() - offset.double())).sum(-1)) <= 1e-6
    residual = randn(77, heads, channels, dtype=dtype, device="cuda", generator=gen)
    less_both, _ = torch.ops.gnnio.attention_row_dots(a, b, offset, None, False, residual)
    expected = (a.double() * (b.double() - offset.double() - residual.double())).sum(-1)
    assert relative_error(less_both, expected) <= 1e-6
    with pytest.raises(RuntimeError, match=r"attention_row_dots: residual must have shape"):
        torch.ops.gnnio.attention_row_dots(a, b, offset, None, False, residual[:-1])
    # with lse: the (lse, delta) pairs the source pass gathers, poisoned first so a missed write shows
    lse = randn(77, heads, dtype=torch.float32, device="cuda", generator=gen)
    poison = torch.full((77 * heads * 2,), float("nan"), device="cuda")
    del poison
    stats, _ = torch.ops.gnnio.attention_row_dots(a, b, offset, lse)
    assert stats.shape == (77, heads, 2) and torch.equal(stats[..., 0], lse)
    assert torch.equal(stats[..., 1], shifted)
    with pytest.raises(RuntimeError, match=r"attention_row_dots: lse must have shape"):
        torch.ops.gnnio.attention_row_dots(a, b, offset, lse[:-1])
    with pytest.raises(RuntimeError, match=r"attention_row_dots: b must have shape"):
        torch.ops.gnnio.attention_row_dots(a, b[:-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("aligned", [True, False], ids=["chunks", "elements"])
@pytest.mark.parametrize("heads,channels", [(1, 1), (3, 7), (2, 16), (3, 16), (4, 32), (5, 32), (9, 20)])
def test_row_dots_column_sums_match_fp64(heads, channels, aligned, dtype):
    """attention_row_dots' column sums (the output bias gradient) against fp64 torch, on enough rows that
    every resident warp loops over several groups, with head counts that do not divide the groups; rows
    read in 16-byte chunks where they allow it, one element per lane where they start off 16 bytes."""
    gen = torch.Generator().manual_seed(heads * 100 + channels + 1)
    rows, shift = 50_000, 0 if aligned else 1

    def features(*shape):
        flat = randn(math.prod(shape) + shift, dtype=dtype, device="cuda", generator=gen)
        return flat[shift:].view(shape)  # contiguous; its start is off 16 bytes unless aligned

    a, b = features(rows, heads, channels), features(rows, heads, channels)
    offset = features(heads, channels)
    lse = randn(rows, heads, device="cuda", generator=gen)
    poison_cuda_cache(1 << 24)
    stats, sums = torch.ops.gnnio.attention_row_dots(a, b, offset, lse, True)
    assert sums.shape == (heads, channels) and sums.dtype == torch.float32
    assert relative_error(sums, a.double().sum(0)) <= 1e-5
    assert torch.equal(stats[..., 0], lse)
    assert relative_error(stats[..., 1], (a.double() * (b.double() - offset.double())).sum(-1)) <= 1e-6
    residual = features(rows, heads, channels)
    stats, residual_sums = torch.ops.gnnio.attention_row_dots(a, b, offset, lse, True, residual)
    expected = (a.double() * (b.double() - offset.double() - residual.double())).sum(-1)
    assert relative_error(stats[..., 1], expected) <= 1e-6
    assert torch.equal(residual_sums, sums)
    again = torch.ops.gnnio.attention_row_dots(a, b, offset, lse, True)[1]
    assert torch.equal(again, sums), "the column sums are deterministic"
    with pytest.raises(RuntimeError, match=r"attention_row_dots: column sums take heads of at most 32 channels, got 33"):
        torch.ops.gnnio.attention_row_dots(a.new_ones(4, 2, 33), a.new_ones(4, 2, 33), None, None, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", [(3, 33), (4, 32), (2, 16)])
@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_output_bias_added_at_the_store(kind, heads, channels, dtype):
    """bias [H, C] added by the forward's store (light rows, split rows' merge, empty rows, every layout)
    equals out + bias; its gradient is grad_out's column sums and the other gradients are unchanged."""
    graph = small_graph().to("cuda")
    inputs = make_inputs(kind, graph, heads, channels, dtype, seed=heads * 10 + channels)
    bias = randn(heads, channels, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(7)).requires_grad_()
    grad_out = randn(graph.num_dst_nodes, heads, channels, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(8))
    biased, _ = run(kind, graph, inputs, "native", bias=bias)
    plain, _ = run(kind, graph, inputs, "native")
    assert relative_error(biased.float(), plain.float() + bias.float()) <= torch.finfo(dtype).eps
    names = list(inputs)
    with_bias = torch.autograd.grad(biased, [inputs[n] for n in names] + [bias], grad_out)
    without = torch.autograd.grad(plain, [inputs[n] for n in names], grad_out)
    for name, a, b in zip(names, with_bias, without):
        if kind == "gat" and dtype == torch.float32:
            # fp32 GAT's backward takes delta from the saved output less the bias: (out + bias) - bias
            # is out to fp32 rounding, not bit for bit
            assert relative_error(a, b) <= 1e-5, name
        else:
            assert torch.equal(a, b), name  # backward never reads the output
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the column sums rounded once to bf16
    assert relative_error(with_bias[-1].float(), grad_out.float().sum(0)) <= tolerance


# ------------------------------------------- Dot's passes gathered ahead, L2 hints
def hot_share_for(graph, hot_nodes, row_bytes):
    """The HOT_L2_SHARE that leaves about `hot_nodes` nodes unmarked in the forward's hints."""
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    return hot_nodes * 2 * row_bytes / l2_bytes


def general_forward(kind, graph, inputs, **options):
    """The forward's output from the general build (per-step gathers, every per-edge path compiled in):
    asking for the attention weights keeps a call off the plain and gather-ahead builds."""
    with dispatch.use_backend("native"), torch.no_grad():
        dispatch.reset()
        out, _ = getattr(attention_ops, f"{kind}_attention")(graph, **inputs, return_attention=True, **options)
        assert "fused" in dispatch.ran()[f"{kind}_attention"]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 16), (2, 64), (2, 12)])
def test_dot_passes_gathered_ahead_match_the_oracle(heads, channels, dtype, monkeypatch):
    """Dot's passes without edge features gather ahead through shared memory (4-wide; the 16-bit forward
    8-wide, two edge groups per warp; the 16-bit source pass only where C % 8 != 0, as for 12 channels,
    else it takes the 8-wide per-step layout), with L2 hints on most rows here: they must match the fp64 reference
    (16-bit: within twice torch's error) on the hub graph, split rows and empty rows included, and the
    forward's output the general build's to rounding."""
    graph = small_graph().to("cuda")
    element = torch.empty((), dtype=dtype).element_size()
    monkeypatch.setattr(attention_native, "HOT_L2_SHARE", hot_share_for(graph, 100, heads * channels * element))
    inputs = make_inputs("transformer", graph, heads, channels, dtype, seed=61 + heads)
    if dtype == torch.float32:
        check_against_oracle("transformer", graph, inputs)
    else:
        check_16bit_against_oracle("transformer", graph, inputs)
    ahead, _ = run("transformer", graph, inputs, "native")
    tolerance = FP32_TOLERANCE if dtype == torch.float32 else 1e-2  # the same sums, not in the same order
    assert relative_error(ahead.float(), general_forward("transformer", graph, inputs).float()) <= tolerance


@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 16), (2, 12), (8, 8), (1, 128)])
def test_gat_fp32_forward_gathered_ahead_matches_the_oracle_and_the_per_step_pass(heads, channels):
    """GAT's fp32 forward without edge features or dropout gathers x_src and alpha_src ahead through shared
    memory: output and gradients against the fp64 reference on the hub graph (split rows and empty rows
    included), and the output equal to the general per-step pass's, whose arithmetic it repeats in the
    same order."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("gat", graph, heads, channels, torch.float32, seed=83 + heads)
    check_against_oracle("gat", graph, inputs)
    ahead, _ = run("gat", graph, inputs, "native")
    per_step = general_forward("gat", graph, inputs, negative_slope=0.2)
    assert relative_error(ahead, per_step) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 32), (5, 32), (2, 24), (2, 64), (1, 128), (3, 16), (2, 8)])
def test_gat_16bit_forward_plain_build_matches_the_oracle_and_the_general_build(heads, channels, dtype):
    """GAT's 16-bit forward without dropout, edge features or returned scores runs a build without their
    code: output and gradients against the fp64 reference on the hub graph (split rows and empty rows
    included; a warp's heads all used, in part, or over several head groups), and the output equal to the
    general build's (a call that returns the weights), whose arithmetic it repeats in the same order."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("gat", graph, heads, channels, dtype, seed=89 + heads)
    out = check_16bit_against_oracle("gat", graph, inputs)
    assert torch.equal(out.detach(), general_forward("gat", graph, inputs, negative_slope=0.2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_l2_hints_change_no_result(dtype, monkeypatch):
    """The hints only choose L2's eviction policy: with a third of the nodes kept hot, the output and every
    gradient equal those without hints bit for bit (share 0, on a fresh copy of the graph: plans are
    cached per graph)."""
    graph = small_graph().to("cuda")
    heads, channels = 4, 32
    row_bytes = heads * channels * torch.empty((), dtype=dtype).element_size()
    inputs = make_inputs("transformer", graph, heads, channels, dtype, seed=67)
    monkeypatch.setattr(attention_native, "HOT_L2_SHARE", hot_share_for(graph, graph.num_nodes // 3, row_bytes))
    hinted = attention_native.hinted_indices(graph, "csr", 2 * row_bytes)
    rare = hinted < 0
    assert rare.any() and not rare.all()
    assert torch.equal(hinted & torch.iinfo(torch.int32).max, graph.csr_indices.to(torch.int32))
    out, _, grads = forward_backward("transformer", graph, inputs, "native")
    monkeypatch.setattr(attention_native, "HOT_L2_SHARE", 0.0)
    unhinted_graph = small_graph().to("cuda")
    assert attention_native.hinted_indices(unhinted_graph, "csr", 2 * row_bytes) is None
    plain_out, _, plain_grads = forward_backward("transformer", unhinted_graph, inputs, "native")
    assert torch.equal(out, plain_out)
    for name in grads:
        assert torch.equal(grads[name], plain_grads[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", [(3, 33), (4, 32), (2, 16)])
def test_residual_added_at_the_store(heads, channels, dtype):
    """A skip connection [Nd, H, C] added by the Transformer forward's store (light rows, split rows' merge,
    empty rows, every layout) equals out + residual; its gradient is grad_out and the others are unchanged
    (fp32 takes delta from the saved output less the residual: equal to fp32 rounding)."""
    graph = small_graph().to("cuda")
    inputs = make_inputs("transformer", graph, heads, channels, dtype, seed=heads * 10 + channels + 1)
    gen = torch.Generator().manual_seed(17)
    residual = randn(graph.num_dst_nodes, heads, channels, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    grad_out = randn(graph.num_dst_nodes, heads, channels, dtype=dtype, device="cuda", generator=gen)
    with_skip, _ = run("transformer", graph, inputs, "native", residual=residual)
    plain, _ = run("transformer", graph, inputs, "native")
    if dtype == torch.float32:
        assert torch.equal(with_skip, plain + residual)  # the same fp32 sum, rounded once
    else:
        assert relative_error(with_skip.float(), plain.float() + residual.float()) <= torch.finfo(dtype).eps
    names = list(inputs)
    grads = torch.autograd.grad(with_skip, [inputs[n] for n in names] + [residual], grad_out)
    plain_grads = torch.autograd.grad(plain, [inputs[n] for n in names], grad_out)
    assert torch.equal(grads[-1], grad_out)
    for name, a, b in zip(names, grads, plain_grads):
        if dtype == torch.float32:
            assert relative_error(a, b) <= 1e-5, name
        else:
            assert torch.equal(a, b), name  # 16-bit backward never reads the output


def test_forward_refuses_a_residual_of_the_wrong_shape():
    _, call, tensors = op_arguments("transformer", seed=71)
    short = tensors[0][:-1]  # a query row short
    with pytest.raises(RuntimeError, match=r"dot_attention_forward: residual must have shape"):
        call.forward(tensors, None, short)
