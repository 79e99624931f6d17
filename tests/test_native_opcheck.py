"""torch.library.opcheck of the native ops other than attention's: each op's schema (what it mutates), its fake
kernel (the shapes torch.compile traces with) and its dispatch, on real inputs of every index and feature dtype.

The graph-level ops (nn.graph_ops) and the sampling ops have their own opcheck tests (test_graph_ops.py,
test_loader.py). These ops carry no autograd of their own (ops/ wraps them in autograd functions), so their
inputs take no gradient here.
"""

from __future__ import annotations

import pytest
import torch

from gnnio_cli.graph.schedule import base_tile_length, row_plan
from gnnio_cli.ops.reduce_native import sorted_rows
from testing import DTYPES, named_test_graph, with_index_dtype

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

INDEX_DTYPES = (torch.int32, torch.int64)


def _graph(index_dtype: torch.dtype, name: str = "small"):
    return with_index_dtype(named_test_graph(name, seed_base=41), index_dtype).to("cuda")


def _features(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(rows + width)).to("cuda", dtype)


def _check(op, *arguments):
    torch.library.opcheck(op.default, arguments)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["small", "hub"])
def test_segment_sum_ops(name, dtype, index_dtype):
    graph = _graph(index_dtype, name)
    schedule, order = row_plan(graph, "csr")
    x = _features(graph.num_src_nodes, 64, dtype)
    values = torch.rand(graph.num_edges, device="cuda")
    diagonal = torch.rand(graph.num_dst_nodes, device="cuda")
    rows = graph.num_dst_nodes
    _check(torch.ops.gnnio.segment_sum, graph.csr_indptr, graph.csr_indices, values, x, rows, *schedule.args(), diagonal)
    _check(torch.ops.gnnio.segment_sum, graph.csr_indptr, graph.csr_indices, None, x, rows, *schedule.args(), None)
    if dtype != torch.float32:
        _check(torch.ops.gnnio.segment_sum_subwarp, graph.csr_indptr, graph.csr_indices, None, x, rows,
               *schedule.args(), order.with_bounds, diagonal.clone(), None)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_cusparse_spmm(index_dtype):
    graph = _graph(index_dtype)
    indptr = graph.csr_indptr.to(graph.csr_indices.dtype)
    x = _features(graph.num_src_nodes, 32, torch.float32)
    values = torch.rand(graph.num_edges, device="cuda")
    size = torch.ops.gnnio.cusparse_spmm_buffer_size(indptr, graph.csr_indices, values, x, graph.num_dst_nodes)
    workspace = torch.empty(max(int(size), 1), dtype=torch.uint8, device="cuda")
    _check(torch.ops.gnnio.cusparse_spmm, indptr, graph.csr_indices, values, x, graph.num_dst_nodes, workspace)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_masks", [True, False])
def test_extremum_ops(dtype, index_dtype, with_masks):
    graph = _graph(index_dtype, "hub")
    rows = sorted_rows(graph)
    schedule, order = row_plan(graph, "csr")
    x = _features(graph.num_src_nodes, 64, dtype)
    args = (graph.csr_indptr, rows.indices, x, graph.num_dst_nodes, False, *schedule.args())
    _check(torch.ops.gnnio.segment_extremum_masked, *args, with_masks)
    if dtype != torch.float32:
        _check(torch.ops.gnnio.segment_extremum_masked_subwarp, *args, order.with_bounds, with_masks)
    _, masks = torch.ops.gnnio.segment_extremum_masked(*args, True)
    csc_schedule, _ = row_plan(graph, "csc")
    grad_out = _features(graph.num_dst_nodes, 64, dtype)
    _check(torch.ops.gnnio.segment_extremum_masked_backward, graph.csc_indptr, graph.csc_indices, rows.csc_mask_slot,
           grad_out, masks, graph.num_src_nodes, *csc_schedule.args())


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_graph_structure_ops(index_dtype):
    graph = _graph(index_dtype, "hub")
    source, target = graph.edge_index()
    tiles = [base_tile_length(graph.num_dst_nodes, graph.num_edges)] * 4
    _check(torch.ops.gnnio.graph_facts, graph.csr_indptr, graph.csc_indptr, source.to(index_dtype),
           target.to(index_dtype), tiles)
    _check(torch.ops.gnnio.append_loops, graph.csr_indptr, graph.csr_indices, graph.csr_eid, graph.num_dst_nodes // 2)
    facts = graph.facts.csr
    _check(torch.ops.gnnio.row_plan, graph.csr_indptr, facts.tile_edges, facts.heavy_rows, facts.tiles,
           facts.max_degree)
    _check(torch.ops.gnnio.slot_map, graph.csc_eid, graph.csr_eid)


@pytest.mark.parametrize("row_sums", [False, True])
def test_dense_split_tf32_ops(row_sums):
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the split-TF32 products need compute capability 8.0+")
    x = _features(300, 128, torch.float32)
    weights = [_features(64, 128, torch.float32), _features(8, 128, torch.float32)]
    biases = [torch.rand(64, device="cuda"), None]
    _check(torch.ops.gnnio.project_split_tf32, x, weights, biases)
    grads = [_features(300, 64, torch.float32), _features(300, 8, torch.float32)]
    # weight gradients: op(A) = [g_1, g_2]^T [72, 300] times x [300, 128], cut into [64, 128] and [8, 128]
    _check(torch.ops.gnnio.matmul_split_tf32, grads, True, [x], False, None, [128], row_sums)
