"""The native reduction family (native/reduce.cu max/min; sum/mean through the SpMM kernels)
against the fp64 reference.

max/min pick values without arithmetic, so the native forward must equal the
reference exactly on the same values (16-bit inputs upcast exactly), ties
included: the winner is the smallest source id. Gradients are sums, compared
with the fp64 oracle. Outputs land in NaN-poisoned memory. GPU only: skipped
unless CUDA is visible and the native extension builds.
"""

from __future__ import annotations


import pytest
import torch

from gnnio_cli.graph import Graph
from gnnio_cli.ops import aggregate, dispatch
from gnnio_cli.ops import reduce_native, spmm_native
from gnnio_cli.ops.reduce import extremum_winners
from gnnio_cli.ops.tuning import fits_subwarp
from testing import named_test_graph, DTYPES, poison_cuda_cache, randn, relative_error

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

WIDTHS = (1, 3, 32, 33, 128, 130, 256)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# The subwarp kernel's widths: multiples of 8 up to 128 (1 to 16 lanes per row), 120 leaving a lane idle.
SUBWARP_WIDTHS = (8, 16, 64, 120, 128)
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}



def graph_named(name: str) -> Graph:
    """One of the shared CUDA test graphs (see testing.named_test_graph), with this file's seeds."""
    return named_test_graph(name, seed_base=11).to("cuda")


def native_and_oracle(graph: Graph, x: torch.Tensor, reduce: str, seed: int):
    """(out, grad of x) from the native backend (outputs in poisoned memory), the fp64 reference's, and dispatch.ran()."""
    x_native = x.detach().clone().requires_grad_()
    with dispatch.use_backend("native"):
        warm_up = aggregate(graph, x_native, reduce)  # builds the cached positions and schedules
        grad_out = randn(*warm_up.shape, dtype=x.dtype, device="cuda", generator=torch.Generator().manual_seed(seed))
        warm_up.backward(grad_out)
        x_native.grad = None
        poison_cuda_cache(4 * warm_up.numel() * warm_up.element_size())
        del warm_up
        dispatch.reset()
        out = aggregate(graph, x_native, reduce)
    ran = dispatch.ran()
    poison_cuda_cache(2 * x.numel() * x.element_size())
    out.backward(grad_out)

    x_oracle = x.detach().double().requires_grad_()
    with dispatch.use_backend("reference"):
        oracle = aggregate(graph, x_oracle, reduce)
    oracle.backward(grad_out.double())
    return (out, x_native.grad), (oracle, x_oracle.grad), ran


@pytest.mark.parametrize("graph_name", ["small", "small-int64", "hub", "bipartite"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_extremum_matches_reference(graph_name, width, dtype, reduce):
    graph = graph_named(graph_name)
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(width))
    (out, grad), (oracle, oracle_grad), ran = native_and_oracle(graph, x, reduce, seed=width + 1)
    assert ran["aggregate"].startswith("degree-aware")
    assert out.dtype == dtype and not torch.isnan(out).any() and not torch.isnan(grad).any()
    assert torch.equal(out.double(), oracle.detach()), "max/min must pick exactly the reference's values"
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("width", (3, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_warps_looping_over_many_rows_match_reference(width, dtype, reduce):
    """Work items outnumber the resident warps, so every warp of the grid-stride loops takes several rows and tiles."""
    graph = graph_named("many-rows")
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(30 + width))
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=width + 3)
    assert not torch.isnan(out).any() and not torch.isnan(grad).any()
    assert torch.equal(out.double(), oracle.detach()), "max/min must pick exactly the reference's values"
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("graph_name", ["small", "hub", "many-rows"])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_go_to_the_smallest_source(graph_name, reduce):
    """Few distinct values: most (target, feature) pairs tie; gradients must follow the reference's winners exactly."""
    graph = graph_named(graph_name)
    gen = torch.Generator().manual_seed(21)
    x = torch.randint(-2, 3, (graph.num_src_nodes, 40), generator=gen).to(device="cuda", dtype=torch.float32)
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=22)
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[torch.float32]


@pytest.mark.parametrize("width", (8, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_nan_wins_as_in_torch(width, dtype, reduce):
    """NaN beats every number (scalar, fp32 and packed 16-bit scans), also after a row's first NaN."""
    graph = graph_named("hub")
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(23))
    x[5, 3] = float("nan")
    x[7, 3] = float("nan")
    with dispatch.use_backend("native"):
        out = aggregate(graph, x, reduce)
    src, dst = graph.to("cpu").edge_index()
    targets = dst[(src == 5) | (src == 7)].unique()
    assert targets.numel() > 0 and torch.isnan(out[targets.cuda(), 3]).all()
    others = torch.ones(graph.num_dst_nodes, dtype=torch.bool)
    others[targets] = False
    assert not torch.isnan(out[others.cuda()]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_signed_zeros_tie(dtype, reduce):
    """-0 and +0 are equal values: the smallest source wins whichever sign it holds."""
    graph = graph_named("hub")
    gen = torch.Generator().manual_seed(37)
    signs = torch.randint(0, 2, (graph.num_src_nodes, 128), generator=gen).float() * 2 - 1
    x = (signs * 0.0).to(device="cuda", dtype=dtype)
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=38)
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_and_mean_run_the_spmm_kernels(reduce, dtype):
    graph = graph_named("hub")
    x = randn(graph.num_src_nodes, 64, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(24))
    (out, grad), (oracle, oracle_grad), ran = native_and_oracle(graph, x, reduce, seed=25)
    assert ran["aggregate"] in spmm_native.KERNELS
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    assert relative_error(out, oracle) <= tolerance and relative_error(grad, oracle_grad) <= tolerance


def test_backward_is_deterministic():
    graph = graph_named("hub")
    x = randn(graph.num_src_nodes, 128, device="cuda", generator=torch.Generator().manual_seed(26))
    grads = []
    for _ in range(3):
        leaf = x.clone().requires_grad_()
        with dispatch.use_backend("native"):
            aggregate(graph, leaf, "max").backward(torch.ones(graph.num_dst_nodes, 128, device="cuda"))
        grads.append(leaf.grad)
    assert all(torch.equal(grads[0], other) for other in grads[1:])


def test_empty_graph_gives_zeros_and_no_gradient():
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), num_nodes=4).to("cuda")
    x = randn(4, 8, device="cuda", generator=torch.Generator().manual_seed(27)).requires_grad_()
    with dispatch.use_backend("native"):
        out = aggregate(graph, x, "max")
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(x.grad, torch.zeros_like(x))


def test_opcheck_extremum_ops():
    from gnnio_cli.graph.schedule import row_schedule

    graph = graph_named("small")
    x = randn(graph.num_src_nodes, 16, device="cuda", generator=torch.Generator().manual_seed(28))
    rows = reduce_native.sorted_rows(graph)
    args = (graph.csr_indptr, rows.indices, x, graph.num_dst_nodes, False, *row_schedule(graph, "csr").args())
    for with_masks in (True, False):
        torch.library.opcheck(
            torch.ops.gnnio.segment_extremum_masked.default, (*args, with_masks),
            test_utils=("test_schema", "test_faketensor"),
        )
    _, masks = torch.ops.gnnio.segment_extremum_masked(*args)
    grad_out = randn(graph.num_dst_nodes, 16, device="cuda", generator=torch.Generator().manual_seed(29))
    torch.library.opcheck(
        torch.ops.gnnio.segment_extremum_masked_backward.default,
        (graph.csc_indptr, graph.csc_indices, rows.csc_mask_slot, grad_out, masks, graph.num_src_nodes,
         *row_schedule(graph, "csc").args()),
        test_utils=("test_schema", "test_faketensor"),
    )


def unpacked_masks(masks: torch.Tensor, width: int) -> torch.Tensor:
    """int32 [E, ceil(F / 32)] -> bool [E, F]: bit f % 32 of word f // 32."""
    bits = (masks.unsqueeze(2) >> torch.arange(32, device=masks.device, dtype=torch.int32)) & 1
    return bits.reshape(masks.shape[0], -1)[:, :width].bool()


@pytest.mark.parametrize("graph_name", ["small", "hub"])
@pytest.mark.parametrize("width", (3, 40, 130, 256))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_each_feature_of_a_row_has_one_winning_edge_holding_its_value(graph_name, width, dtype):
    """The saved masks, across mask words and lane passes (widths 3 to 256): one bit per (non-empty row,
    feature), set on a slot whose source holds the output, the smallest such source."""
    from gnnio_cli.graph.schedule import row_schedule

    graph = graph_named(graph_name)
    gen = torch.Generator().manual_seed(40 + width)
    # Few distinct values: most (row, feature) pairs tie.
    x = torch.randint(-3, 4, (graph.num_src_nodes, width), generator=gen).to(device="cuda", dtype=dtype)
    rows = reduce_native.sorted_rows(graph)
    out, masks = torch.ops.gnnio.segment_extremum_masked(
        graph.csr_indptr, rows.indices, x, graph.num_dst_nodes, False, *row_schedule(graph, "csr").args()
    )
    won = unpacked_masks(masks, width)
    slot_rows = graph.csr_rows
    wins_per_row = torch.zeros(graph.num_dst_nodes, width, dtype=torch.int64, device="cuda")
    wins_per_row.index_add_(0, slot_rows, won.long())
    assert torch.equal(wins_per_row, (graph.in_degree > 0).long().unsqueeze(1).expand(-1, width))
    slot, feature = won.nonzero(as_tuple=True)
    sources = rows.indices.long()[slot]
    assert torch.equal(x[sources, feature], out[slot_rows[slot], feature])
    _, winners = extremum_winners(graph, x.double(), "max")
    assert torch.equal(sources, winners[slot_rows[slot], feature])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_in_16_bit_and_wide_rows_match_reference(dtype, reduce):
    """Ties in every dtype, on a width of two lane passes (256) and rows longer than a mask window."""
    graph = graph_named("hub")
    gen = torch.Generator().manual_seed(31)
    x = torch.randint(-2, 3, (graph.num_src_nodes, 256), generator=gen).to(device="cuda", dtype=dtype)
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=32)
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_rows_already_sorted_use_the_graph_indices(reduce):
    """A graph whose rows list sources in order needs no sorted copy, and gives the reference's result."""
    unsorted = graph_named("small").to("cpu")
    src, dst = unsorted.edge_index()
    order = torch.argsort(dst * unsorted.num_src_nodes + src)
    graph = Graph.from_edge_index(torch.stack([src[order], dst[order]]), num_nodes=unsorted.num_src_nodes).to("cuda")
    assert reduce_native.sorted_rows(graph).indices is graph.csr_indices
    shuffled = graph_named("small")
    assert reduce_native.sorted_rows(shuffled).indices is not shuffled.csr_indices
    x = randn(graph.num_src_nodes, 33, device="cuda", generator=torch.Generator().manual_seed(33))
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=34)
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[torch.float32]


@pytest.mark.parametrize("width", (36, 128))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_rows_of_infinities_pick_their_smallest_source(width, dtype, reduce):
    """Every value -inf (max) or +inf (min): the strict compare keeps no slot, and the first one must win."""
    graph = graph_named("hub")
    fill = float("-inf") if reduce == "max" else float("inf")
    x = torch.full((graph.num_src_nodes, width), fill, device="cuda", dtype=dtype)
    some = range(0, graph.num_src_nodes, 7)
    x[::7] = randn(len(some), width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(35))
    (out, grad), (oracle, oracle_grad), _ = native_and_oracle(graph, x, reduce, seed=36)
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


SUBWARP_KERNELS = ("subwarp", "subwarp-sorted")


def extremum_ops(graph: Graph, x: torch.Tensor, is_min: bool, by_degree: bool, with_masks: bool = True):
    """(out, masks) of the warp kernel and, where x fits it, of the subwarp kernel (light rows in row order, or
    by descending degree, with their bounds) on the same sorted rows and schedule."""
    from gnnio_cli.graph.schedule import row_order, row_schedule

    schedule = row_schedule(graph, "csr")
    args = (graph.csr_indptr, reduce_native.sorted_rows(graph).indices, x, graph.num_dst_nodes, is_min,
            *schedule.args())
    order = row_order(graph, "csr", schedule)
    results = [torch.ops.gnnio.segment_extremum_masked(*args, with_masks)]
    if fits_subwarp(x):
        for rows in (order.with_bounds,) if by_degree else (None,):
            results.append(torch.ops.gnnio.segment_extremum_masked_subwarp(*args, rows, with_masks))
    return results


def hard_16bit_values(graph: Graph, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Few distinct values (most (row, feature) pairs tie), with signed zeros, infinities and NaNs sprinkled in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (graph.num_src_nodes, width), generator=gen).to(dtype)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")], dtype=dtype)
    where = torch.rand(graph.num_src_nodes, width, generator=gen) < 0.05
    x[where] = specials[torch.randint(0, specials.numel(), (int(where.sum()),), generator=gen)]
    return x.to("cuda")


@pytest.mark.parametrize("by_degree", [False, True])
@pytest.mark.parametrize("graph_name", ["ladder", "hub", "many-rows", "bipartite"])
@pytest.mark.parametrize("width", SUBWARP_WIDTHS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("is_min", [False, True])
def test_subwarp_forward_equals_warp_forward_bit_for_bit(by_degree, graph_name, width, dtype, is_min):
    """The subwarp kernel's outputs and per-edge masks are the warp kernel's, ties, NaN, +-0 and +-inf included,
    on rows of every small degree, both sides of the tile cut and a 100k hub."""
    graph = graph_named(graph_name)
    x = hard_16bit_values(graph, width, dtype, seed=50 + width)
    (out, masks), *subwarp = extremum_ops(graph, x, is_min, by_degree)
    for sub_out, sub_masks in subwarp:
        assert torch.equal(torch.isnan(out), torch.isnan(sub_out))
        assert torch.equal(out.nan_to_num(0.0), sub_out.nan_to_num(0.0))
        assert torch.equal(masks, sub_masks), "the subwarp kernel must mark exactly the warp kernel's winners"


@pytest.mark.parametrize("graph_name", ["ladder", "hub", "many-rows"])
@pytest.mark.parametrize("width, dtype", [(3, torch.float32), (128, torch.float32), (256, torch.float32),
                                          (33, torch.bfloat16), (128, torch.bfloat16), (64, torch.float16)])
@pytest.mark.parametrize("is_min", [False, True])
def test_inference_forward_writes_no_masks_and_the_same_output(graph_name, width, dtype, is_min):
    """with_masks=False (no gradient to route): the same output bit for bit from every forward kernel, masks empty;
    and aggregate under torch.no_grad takes that path and still matches the reference."""
    graph = graph_named(graph_name)
    x = hard_16bit_values(graph, width, dtype, seed=90 + width) if dtype != torch.float32 else randn(
        graph.num_src_nodes, width, device="cuda", generator=torch.Generator().manual_seed(90 + width))
    for by_degree in (False, True):
        with_masks = extremum_ops(graph, x, is_min, by_degree)
        without = extremum_ops(graph, x, is_min, by_degree, with_masks=False)
        for (out, masks), (bare_out, bare_masks) in zip(with_masks, without):
            assert bare_masks.shape == (0, masks.shape[1])
            assert torch.equal(torch.isnan(out), torch.isnan(bare_out))
            assert torch.equal(out.nan_to_num(0.0), bare_out.nan_to_num(0.0))
    reduce = "min" if is_min else "max"
    with dispatch.use_backend("native"), torch.no_grad():
        out = aggregate(graph, x, reduce)
    with dispatch.use_backend("reference"), torch.no_grad():
        expected = aggregate(graph, x.double(), reduce)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert torch.equal(out.double().nan_to_num(0.0), expected.nan_to_num(0.0))


@pytest.mark.parametrize("kernel", SUBWARP_KERNELS)
@pytest.mark.parametrize("graph_name", ["ladder", "many-rows", "small-int64", "bipartite"])
@pytest.mark.parametrize("width", SUBWARP_WIDTHS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_subwarp_extremum_matches_reference(monkeypatch, kernel, graph_name, width, dtype, reduce):
    monkeypatch.setenv("GNNIO_EXTREMUM_KERNEL", kernel)
    graph = graph_named(graph_name)
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(width))
    (out, grad), (oracle, oracle_grad), ran = native_and_oracle(graph, x, reduce, seed=width + 5)
    assert ran["aggregate"].startswith(f"degree-aware {kernel} ")
    assert not torch.isnan(out).any() and not torch.isnan(grad).any()
    assert torch.equal(out.double(), oracle.detach()), "max/min must pick exactly the reference's values"
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("kernel", SUBWARP_KERNELS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_subwarp_ties_go_to_the_smallest_source(monkeypatch, kernel, dtype, reduce):
    monkeypatch.setenv("GNNIO_EXTREMUM_KERNEL", kernel)
    graph = graph_named("ladder")
    gen = torch.Generator().manual_seed(51)
    x = torch.randint(-2, 3, (graph.num_src_nodes, 128), generator=gen).to(device="cuda", dtype=dtype)
    (out, grad), (oracle, oracle_grad), ran = native_and_oracle(graph, x, reduce, seed=52)
    assert ran["aggregate"].startswith(f"degree-aware {kernel} ")
    assert torch.equal(out.double(), oracle.detach())
    assert relative_error(grad, oracle_grad) <= GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("dtype, width", [(torch.float32, 128), (torch.bfloat16, 130), (torch.float16, 136)])
def test_subwarp_extremum_falls_back_where_it_cannot_run(monkeypatch, dtype, width):
    monkeypatch.setenv("GNNIO_EXTREMUM_KERNEL", "subwarp")
    graph = graph_named("small")
    x = randn(graph.num_src_nodes, width, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(53))
    dispatch.reset()
    with dispatch.use_backend("native"):
        aggregate(graph, x, "max")
    assert "subwarp" not in dispatch.ran()["aggregate"]


def test_extremum_kernel_choice_is_timed_recorded_and_kept():
    graph = graph_named("ladder")
    gen = torch.Generator().manual_seed(54)
    x = randn(graph.num_src_nodes, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
    dispatch.reset()
    with dispatch.use_backend("native"):
        first = aggregate(graph, x, "max")
        chosen = dispatch.ran()["aggregate"]
        second = aggregate(graph, x, "max")
    assert chosen.startswith("degree-aware") and dispatch.ran()["aggregate"] == chosen
    assert torch.equal(first, second)


def test_subwarp_extremum_checks_name_the_argument():
    from gnnio_cli.graph.schedule import row_schedule

    graph = graph_named("small")
    rows = reduce_native.sorted_rows(graph)
    schedule = row_schedule(graph, "csr").args()
    with pytest.raises(RuntimeError, match="gnnio::segment_extremum_masked_subwarp: x must be float16 or bfloat16"):
        torch.ops.gnnio.segment_extremum_masked_subwarp(
            graph.csr_indptr, rows.indices, torch.ones(graph.num_src_nodes, 64, device="cuda"), graph.num_dst_nodes,
            False, *schedule, None,
        )
    with pytest.raises(RuntimeError, match="gnnio::segment_extremum_masked_subwarp: x must have a multiple of 8"):
        torch.ops.gnnio.segment_extremum_masked_subwarp(
            graph.csr_indptr, rows.indices, torch.ones(graph.num_src_nodes, 12, dtype=torch.float16, device="cuda"),
            graph.num_dst_nodes, False, *schedule, None,
        )


def test_opcheck_subwarp_extremum():
    from gnnio_cli.graph.schedule import row_order, row_schedule

    graph = graph_named("small")
    schedule = row_schedule(graph, "csr")
    x = randn(graph.num_src_nodes, 64, dtype=torch.bfloat16, device="cuda", generator=torch.Generator().manual_seed(55))
    args = (graph.csr_indptr, reduce_native.sorted_rows(graph).indices, x, graph.num_dst_nodes, True, *schedule.args())
    order = row_order(graph, "csr", schedule)
    for rows in (None, order.with_bounds):
        torch.library.opcheck(
            torch.ops.gnnio.segment_extremum_masked_subwarp.default, (*args, rows),
            test_utils=("test_schema", "test_faketensor"),
        )
