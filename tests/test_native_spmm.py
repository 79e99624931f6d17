"""The native SpMM family (native/spmm.cu: gnnio's CSR kernel and cuSPARSE) against the fp64 reference.

Every case runs the public op with the native backend on the input's dtype
and with the reference backend on the same values in fp64 (the oracle), for
the output and the gradient of x. Both kernels are forced in turn through
GNNIO_SPMM_KERNEL (a kernel that cannot take an input runs csr-vec instead).
Outputs land in memory poisoned with NaN, so a slot the
kernel forgets shows. 16-bit results stay within 2x the error of PyTorch at
the same precision. GPU only: skipped unless CUDA is visible and the native
extension builds.
"""

from __future__ import annotations


import pytest
import torch

from gnnio_cli.graph import Graph
from gnnio_cli.ops import dispatch, gcn_propagate, spmm
from gnnio_cli.graph.schedule import row_order, row_schedule
from gnnio_cli.ops.spmm_native import kernel_candidates
from testing import (
    named_test_graph,
    DTYPES,
    assert_within_torch_error,
    poison_cuda_cache,
    randn,
    random_graph,
    relative_error,
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

WIDTHS = (1, 3, 32, 33, 128, 130, 256)
KERNELS = ("csr-vec", "csr-subwarp", "csr-subwarp-sorted", "cusparse")
SUBWARP_KERNELS = ("csr-subwarp", "csr-subwarp-sorted")
HALF_DTYPES = (torch.float16, torch.bfloat16)
# csr-subwarp's widths: multiples of 8 up to 128 (1 to 16 lanes per row), 120 leaving a lane idle.
SUBWARP_WIDTHS = (8, 16, 64, 120, 128)
# fp32 against fp64, relative to the largest magnitude: sums over a 100k-edge hub row.
FP32_TOLERANCE = 1e-4



def graph_named(name: str) -> Graph:
    """One of the shared CUDA test graphs (see testing.named_test_graph), with this file's seeds."""
    return named_test_graph(name, seed_base=1).to("cuda")


def check(native: torch.Tensor, oracle: torch.Tensor, torch_result: torch.Tensor) -> None:
    assert not torch.isnan(native).any(), "an output element was never written (poisoned NaN left)"
    if native.dtype == torch.float32:
        error = relative_error(native, oracle)
        assert error <= FP32_TOLERANCE, f"relative error {error:.3g}"
    else:
        assert_within_torch_error(native, oracle, torch_result)


def run_both(fn, x: torch.Tensor, grad_out_seed: int):
    """(native out, native grad), the fp64 oracle's, the reference's at x's dtype, and dispatch.ran() of the native call."""
    x_native = x.detach().clone().requires_grad_()
    with dispatch.use_backend("native"):
        # A first pass builds the graph's cached structures, so the poisoned
        # blocks go to the outputs of the second.
        warm_up = fn(x_native)
        grad_out = randn(
            *warm_up.shape, dtype=warm_up.dtype, device="cuda", generator=torch.Generator().manual_seed(grad_out_seed)
        )
        warm_up.backward(grad_out)
        x_native.grad = None
        poison_cuda_cache(2 * grad_out.numel() * grad_out.element_size())
        dispatch.reset()
        out = fn(x_native)
    ran = dispatch.ran()
    poison_cuda_cache(2 * x.numel() * x.element_size())
    out.backward(grad_out)

    x_oracle = x.detach().double().requires_grad_()
    with dispatch.use_backend("reference"):
        oracle = fn(x_oracle)
        oracle.backward(grad_out.double())
        x_torch = x.detach().clone().requires_grad_()
        torch_out = fn(x_torch)
        torch_out.backward(grad_out)
    return (out, x_native.grad), (oracle, x_oracle.grad), (torch_out, x_torch.grad), ran


# Forced; csr-vec where the kernel cannot take the input. The subwarp kernels have their own test below.
@pytest.mark.parametrize("kernel", ("csr-vec", "cusparse"))
@pytest.mark.parametrize("graph_name", ["small", "small-int64", "hub", "bipartite"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce, weighted", [("sum", False), ("mean", True)])
def test_spmm_matches_reference(monkeypatch, kernel, graph_name, width, dtype, reduce, weighted):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", kernel)
    ran, x = check_spmm(graph_named(graph_name), width, dtype, reduce, weighted, seed=width)
    assert ran["spmm"] == (kernel if kernel in kernel_candidates(x) else "csr-vec")  # 16-bit never goes to cuSPARSE


def check_spmm(graph, width, dtype, reduce, weighted, seed) -> tuple[dict, torch.Tensor]:
    """spmm on random features (and edge weights) against the fp64 oracle and torch; returns the kernels that ran
    and the features."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=gen)
    weight = randn(graph.num_edges, device="cuda", generator=gen) if weighted else None

    def fn(features):
        w = None if weight is None else weight.to(torch.float64 if features.dtype == torch.float64 else torch.float32)
        return spmm(graph, features, w, reduce)

    (out, grad), (oracle, oracle_grad), (torch_out, torch_grad), ran = run_both(fn, x, grad_out_seed=seed + 1)
    assert out.dtype == dtype and out.shape == (graph.num_dst_nodes, width)
    check(out, oracle, torch_out)
    check(grad, oracle_grad, torch_grad)
    return ran, x


@pytest.mark.parametrize("width", (32, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce, weighted", [("sum", False), ("mean", True)])
def test_warps_looping_over_many_rows_match_reference(monkeypatch, width, dtype, reduce, weighted):
    """Work items outnumber the resident warps, so every warp of the grid-stride loop takes several rows and tiles."""
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", "csr-vec")
    ran, _ = check_spmm(graph_named("many-rows"), width, dtype, reduce, weighted, seed=40 + width)
    assert ran["spmm"] == "csr-vec"


# mean without edge weights: the light rows' plain sums scaled once by 1 / in-degree (row_scale)
@pytest.mark.parametrize("kernel", SUBWARP_KERNELS)
@pytest.mark.parametrize("graph_name", ["ladder", "many-rows", "small-int64", "bipartite"])
@pytest.mark.parametrize("width", SUBWARP_WIDTHS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("reduce, weighted", [("sum", False), ("mean", True), ("mean", False)])
def test_subwarp_kernel_matches_reference(monkeypatch, kernel, graph_name, width, dtype, reduce, weighted):
    """The subwarp kernels on rows of every small degree, odd ones, both sides of the tile cut, a 100k hub in tiles."""
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", kernel)
    graph = graph_named(graph_name)
    gen = torch.Generator().manual_seed(60 + width)
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=gen)
    weight = randn(graph.num_edges, device="cuda", generator=gen) if weighted else None

    def fn(features):
        w = None if weight is None else weight.to(torch.float64 if features.dtype == torch.float64 else torch.float32)
        return spmm(graph, features, w, reduce)

    (out, grad), (oracle, oracle_grad), (torch_out, torch_grad), ran = run_both(fn, x, grad_out_seed=width + 3)
    assert ran["spmm"] == kernel
    check(out, oracle, torch_out)
    check(grad, oracle_grad, torch_grad)


@pytest.mark.parametrize("dtype, width", [(torch.float32, 128), (torch.bfloat16, 130), (torch.float16, 136)])
def test_subwarp_kernel_falls_back_where_it_cannot_run(monkeypatch, dtype, width):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", "csr-subwarp")
    graph = graph_named("small")
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(11))
    dispatch.reset()
    with dispatch.use_backend("native"):
        spmm(graph, x)
    assert dispatch.ran()["spmm"] == "csr-vec"


def test_subwarp_kernel_falls_back_on_rows_not_16_byte_aligned(monkeypatch):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", "csr-subwarp")
    graph = graph_named("small")
    flat = randn(graph.num_src_nodes * 64 + 1, dtype=torch.bfloat16, device="cuda",
                 generator=torch.Generator().manual_seed(12))
    x = flat[1:].view(graph.num_src_nodes, 64)  # contiguous, 2 bytes past an aligned start
    dispatch.reset()
    with dispatch.use_backend("native"):
        out = spmm(graph, x)
    assert dispatch.ran()["spmm"] == "csr-vec"
    with dispatch.use_backend("reference"):
        expected = spmm(graph, x.double())
    assert relative_error(out, expected) <= 1e-2


def test_16bit_kernel_choice_is_timed_recorded_and_kept():
    graph = graph_named("ladder")
    gen = torch.Generator().manual_seed(13)
    x = randn(graph.num_src_nodes, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
    dispatch.reset()
    with dispatch.use_backend("native"):
        first = spmm(graph, x)
        chosen = dispatch.ran()["spmm"]
        second = spmm(graph, x)
    assert chosen in kernel_candidates(x) and dispatch.ran()["spmm"] == chosen
    assert torch.equal(first, second)


@pytest.mark.parametrize("graph_name", ["small", "hub"])
@pytest.mark.parametrize("width", (1, 33, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted, improved", [(False, False), (True, False), (True, True)])
def test_gcn_propagate_matches_reference(graph_name, width, dtype, weighted, improved):
    ran = check_gcn(graph_named(graph_name), width, dtype, weighted, improved, seed=10 + width, grad_out_seed=width)
    assert ran["gcn_propagate"] in KERNELS


@pytest.mark.parametrize("dtype", DTYPES)
def test_gcn_on_a_loop_free_graph_takes_its_degrees(dtype):
    """A graph without self-loops (every mini-batch from a loop-free graph) gets gcn_norm's operator straight
    from its degrees: the same values as gcn_norm's, bit for bit, and results within the oracle's bounds."""
    from gnnio_cli.ops import spmm_native
    from gnnio_cli.ops.spmm import gcn_norm

    graph = random_graph(3000, 30000, hub_degree=5000, self_loops=False, seed=77).to("cuda")
    assert graph.facts.self_loops == 0
    check_gcn(graph, 64, dtype, weighted=False, improved=False, seed=78, grad_out_seed=79)
    fast = spmm_native._loop_free_gcn_operator(graph)
    _, values = gcn_norm(graph, None, dtype=torch.float32)
    kept = graph.num_edges
    general = spmm_native.build_operator(graph, values[:kept], None, diagonal=values[kept:])
    for side in ("forward", "backward"):
        assert torch.equal(getattr(fast, side).values, getattr(general, side).values), side
        assert torch.equal(getattr(fast, side).diagonal, getattr(general, side).diagonal), side


def check_gcn(graph, width, dtype, weighted, improved, seed, grad_out_seed) -> dict:
    """gcn_propagate on random features (and positive edge weights) against the fp64 oracle and torch; returns
    the kernels that ran."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=gen)
    weight = randn(graph.num_edges, device="cuda", generator=gen).abs() + 0.1 if weighted else None

    def fn(features):
        w = None if weight is None else weight.to(torch.float64 if features.dtype == torch.float64 else torch.float32)
        return gcn_propagate(graph, features, w, improved=improved)

    (out, grad), (oracle, oracle_grad), (torch_out, torch_grad), ran = run_both(fn, x, grad_out_seed=grad_out_seed)
    check(out, oracle, torch_out)
    check(grad, oracle_grad, torch_grad)
    return ran


# The self-loops as the operator's diagonal (x[i] read in row order, no slot): every kernel that takes it,
# on rows of every small degree, rows on both sides of the tile cut and a hub whose first tile adds it.
@pytest.mark.parametrize(
    "kernel, dtype",
    [("csr-vec", d) for d in DTYPES] + [(k, d) for k in SUBWARP_KERNELS for d in HALF_DTYPES] + [("cusparse", torch.float32)],
)
@pytest.mark.parametrize("graph_name", ["ladder", "hub", "many-rows"])
@pytest.mark.parametrize("width", (8, 33, 128))
@pytest.mark.parametrize("weighted", (False, True))
def test_gcn_diagonal_matches_reference_in_every_kernel(monkeypatch, kernel, dtype, graph_name, width, weighted):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", kernel)
    ran = check_gcn(graph_named(graph_name), width, dtype, weighted, improved=weighted, seed=70 + width,
                    grad_out_seed=width + 5)
    # cuSPARSE has no diagonal; a subwarp kernel that cannot take the width runs csr-vec
    takes = kernel in SUBWARP_KERNELS and width % 8 == 0 and width <= 128
    assert ran["gcn_propagate"] == (kernel if kernel == "csr-vec" or takes else "csr-vec")


def test_diagonal_checks_name_the_argument():
    graph = graph_named("bipartite")
    schedule = row_schedule(graph, "csr")
    x = torch.ones(graph.num_src_nodes, 8, device="cuda")
    rows = graph.num_dst_nodes
    with pytest.raises(RuntimeError, match=rf"a diagonal needs a square operator: x must have num_rows = {rows} rows"):
        torch.ops.gnnio.segment_sum(graph.csr_indptr, graph.csr_indices, None, x, rows, *schedule.args(),
                                    torch.ones(rows, device="cuda"))
    with pytest.raises(RuntimeError, match=r"diagonal must have \d+ entries"):
        torch.ops.gnnio.segment_sum(graph.csr_indptr, graph.csr_indices, None, x, rows, *schedule.args(),
                                    torch.ones(rows + 1, device="cuda"))
    square = graph_named("small")
    schedule = row_schedule(square, "csr")
    ones = torch.ones(square.num_dst_nodes, device="cuda")
    with pytest.raises(RuntimeError, match="row_scale and diagonal cannot be combined"):
        torch.ops.gnnio.segment_sum_subwarp(
            square.csr_indptr, square.csr_indices, None, torch.ones(square.num_src_nodes, 64, dtype=torch.bfloat16,
                                                                     device="cuda"),
            square.num_dst_nodes, *schedule.args(), None, ones, ones,
        )


def test_fp32_kernel_choice_is_recorded_and_kept():
    graph = graph_named("small")
    x = randn(graph.num_src_nodes, 64, device="cuda", generator=torch.Generator().manual_seed(5))
    dispatch.reset()
    with dispatch.use_backend("native"):
        first = spmm(graph, x)
        chosen = dispatch.ran()["spmm"]
        second = spmm(graph, x)
    assert chosen in KERNELS and dispatch.ran()["spmm"] == chosen
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    "kernel, dtype", [("csr-vec", d) for d in DTYPES] + [(k, d) for k in SUBWARP_KERNELS for d in HALF_DTYPES]
)
def test_csr_kernel_is_deterministic_on_a_hub(monkeypatch, kernel, dtype):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", kernel)
    graph = graph_named("hub")
    x = randn(graph.num_src_nodes, 128, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(6))
    dispatch.reset()
    with dispatch.use_backend("native"):
        results = [spmm(graph, x, reduce="mean") for _ in range(3)]
    assert dispatch.ran()["spmm"] == kernel
    assert all(torch.equal(results[0], other) for other in results[1:])


def test_hub_is_split_into_tiles():
    schedule = row_schedule(graph_named("hub"), "csr")
    assert schedule.heavy_rows.numel() >= 1 and schedule.tile_row.numel() > 1


def test_trailing_dims_and_non_contiguous_input():
    graph = graph_named("small")
    full = randn(graph.num_src_nodes, 4, 66, device="cuda", generator=torch.Generator().manual_seed(7))
    x = full[:, :, ::2]
    with dispatch.use_backend("native"):
        out = spmm(graph, x)
    with dispatch.use_backend("reference"):
        expected = spmm(graph, x.double())
    assert out.shape == (graph.num_dst_nodes, 4, 33)
    assert relative_error(out, expected) <= FP32_TOLERANCE


@pytest.mark.parametrize("kernel", KERNELS)
def test_graph_without_edges_gives_zeros(monkeypatch, kernel):
    monkeypatch.setenv("GNNIO_SPMM_KERNEL", kernel)
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), num_nodes=5).to("cuda")
    x = randn(5, 8, device="cuda", generator=torch.Generator().manual_seed(8)).requires_grad_()
    with dispatch.use_backend("native"):
        out = spmm(graph, x, reduce="mean")
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(x.grad, torch.zeros_like(x))


def test_op_checks_name_the_argument():
    graph = graph_named("small")
    schedule = row_schedule(graph, "csr")
    x = randn(graph.num_src_nodes, 8)
    with pytest.raises(RuntimeError, match="gnnio::segment_sum: x must be a CUDA tensor"):
        torch.ops.gnnio.segment_sum(
            graph.csr_indptr, graph.csr_indices, None, x, graph.num_dst_nodes, *schedule.args()
        )
    with pytest.raises(RuntimeError, match="gnnio::segment_sum: values must be float32"):
        torch.ops.gnnio.segment_sum(
            graph.csr_indptr, graph.csr_indices, torch.ones(graph.num_edges, dtype=torch.float16, device="cuda"),
            x.cuda(), graph.num_dst_nodes, *schedule.args(),
        )


def test_subwarp_op_checks_name_the_argument():
    graph = graph_named("small")
    schedule = row_schedule(graph, "csr")
    args = (graph.csr_indptr, graph.csr_indices, None)
    with pytest.raises(RuntimeError, match="gnnio::segment_sum_subwarp: x must be float16 or bfloat16"):
        torch.ops.gnnio.segment_sum_subwarp(
            *args, torch.ones(graph.num_src_nodes, 64, device="cuda"), graph.num_dst_nodes, *schedule.args(), None
        )
    with pytest.raises(RuntimeError, match="gnnio::segment_sum_subwarp: x must have a multiple of 8 features"):
        torch.ops.gnnio.segment_sum_subwarp(
            *args, torch.ones(graph.num_src_nodes, 136, dtype=torch.bfloat16, device="cuda"), graph.num_dst_nodes,
            *schedule.args(), None,
        )


def test_messages_with_numbers_raise_instead_of_crashing():
    """Every kind of value a message prints (numbers, shapes, devices, dtypes) reaches Python as a
    RuntimeError: formatting numbers once crashed the process from inside an error message."""
    graph = graph_named("small")
    schedule = row_schedule(graph, "csr")
    x = torch.ones(graph.num_src_nodes, 8, device="cuda")
    rows = graph.num_dst_nodes
    with pytest.raises(RuntimeError, match=rf"indptr must have num_rows \+ 1 = {rows + 2} entries, got {rows + 1}"):
        torch.ops.gnnio.segment_sum(graph.csr_indptr, graph.csr_indices, None, x, rows + 1, *schedule.args())
    with pytest.raises(RuntimeError, match=r"x must have 2 dims \[N, F\], got shape \[\d+, 8, 1\]"):
        torch.ops.gnnio.segment_sum(graph.csr_indptr, graph.csr_indices, None, x.unsqueeze(-1), rows,
                                    *schedule.args())
    with pytest.raises(RuntimeError, match="tile_edges must be positive, got -3"):
        torch.ops.gnnio.segment_sum(graph.csr_indptr, graph.csr_indices, None, x, rows, *schedule.args()[:4], -3)


def test_opcheck_segment_sum_and_cusparse():
    graph = graph_named("small")
    schedule = row_schedule(graph, "csr")
    x = randn(graph.num_src_nodes, 16, device="cuda", generator=torch.Generator().manual_seed(9))
    values = randn(graph.num_edges, device="cuda", generator=torch.Generator().manual_seed(10))
    torch.library.opcheck(
        torch.ops.gnnio.segment_sum.default,
        (graph.csr_indptr, graph.csr_indices, values, x, graph.num_dst_nodes, *schedule.args()),
        test_utils=("test_schema", "test_faketensor"),
    )
    row_scale = torch.rand(graph.num_dst_nodes, device="cuda", generator=torch.Generator("cuda").manual_seed(13))
    order = row_order(graph, "csr", schedule)
    for rows, scale in ((None, None), (order.with_bounds, None), (None, row_scale)):
        torch.library.opcheck(
            torch.ops.gnnio.segment_sum_subwarp.default,
            (graph.csr_indptr, graph.csr_indices, values, x.to(torch.bfloat16), graph.num_dst_nodes,
             *schedule.args(), rows, scale),
            test_utils=("test_schema", "test_faketensor"),
        )
    diagonal = row_scale  # any fp32 [R] of the square graph
    torch.library.opcheck(
        torch.ops.gnnio.segment_sum.default,
        (graph.csr_indptr, graph.csr_indices, values, x, graph.num_dst_nodes, *schedule.args(), diagonal),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.gnnio.segment_sum_subwarp.default,
        (graph.csr_indptr, graph.csr_indices, values, x.to(torch.bfloat16), graph.num_dst_nodes, *schedule.args(),
         None, None, diagonal),
        test_utils=("test_schema", "test_faketensor"),
    )
    indptr = graph.csr_indptr.to(torch.int32)
    size = torch.ops.gnnio.cusparse_spmm_buffer_size(indptr, graph.csr_indices, values, x, graph.num_dst_nodes)
    workspace = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
    torch.library.opcheck(
        torch.ops.gnnio.cusparse_spmm.default,
        (indptr, graph.csr_indices, values, x, graph.num_dst_nodes, workspace),
        test_utils=("test_faketensor",),
    )
