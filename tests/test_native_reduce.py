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
from gnnio_cli.ops import reduce_native
from testing import named_test_graph, DTYPES, poison_cuda_cache, randn, relative_error

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

WIDTHS = (1, 3, 32, 33, 128, 130, 256)
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


def test_nan_wins_as_in_torch():
    graph = graph_named("small")
    x = randn(graph.num_src_nodes, 8, device="cuda", generator=torch.Generator().manual_seed(23))
    x[5, 3] = float("nan")
    with dispatch.use_backend("native"):
        out = aggregate(graph, x, "max")
    targets = graph.to("cpu").edge_index()[1][graph.to("cpu").edge_index()[0] == 5].unique()
    assert targets.numel() > 0 and torch.isnan(out[targets.cuda(), 3]).all()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_and_mean_run_the_spmm_kernels(reduce, dtype):
    graph = graph_named("hub")
    x = randn(graph.num_src_nodes, 64, dtype=dtype, device="cuda", generator=torch.Generator().manual_seed(24))
    (out, grad), (oracle, oracle_grad), ran = native_and_oracle(graph, x, reduce, seed=25)
    assert ran["aggregate"] in ("csr-vec", "cusparse")
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    assert relative_error(out, oracle) <= tolerance and relative_error(grad, oracle_grad) <= tolerance


def test_positions_are_compact_unless_a_row_exceeds_16_bits():
    assert reduce_native._compact_positions(graph_named("small"))
    assert not reduce_native._compact_positions(graph_named("hub"))  # in-degree > 100,000


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
    from gnnio_cli.ops.attention_native import row_schedule

    graph = graph_named("small")
    x = randn(graph.num_src_nodes, 16, device="cuda", generator=torch.Generator().manual_seed(28))
    csr = row_schedule(graph, "csr")
    args = (graph.csr_indptr, graph.csr_indices, x, graph.num_dst_nodes, False, True, *csr.args())
    torch.library.opcheck(torch.ops.gnnio.segment_extremum.default, args, test_utils=("test_schema", "test_faketensor"))
    _, position = torch.ops.gnnio.segment_extremum(*args)
    csc = row_schedule(graph, "csc")
    grad_out = randn(graph.num_dst_nodes, 16, device="cuda", generator=torch.Generator().manual_seed(29))
    torch.library.opcheck(
        torch.ops.gnnio.segment_extremum_backward.default,
        (graph.csc_indptr, graph.csc_indices, reduce_native.csc_positions(graph), grad_out, position,
         graph.num_src_nodes, *csc.args()),
        test_utils=("test_schema", "test_faketensor"),
    )
