"""torch.library.opcheck of the attention ops (native/attention/): each kind's typed edge ops and rows.cu's node
ops. It checks each op's schema (what it mutates), its fake kernel (gnnio_cli/ops/attention_native.py: the shapes
torch.compile traces with) and its dispatch, on real inputs of every feature and index dtype, with and without edge
features, on a graph of light rows and on one whose hub row is cut into tiles.

The ops carry no autograd of their own (ops/attention_native.py wraps them in autograd functions), so their
inputs take no gradient here. GAT's packed_grads are written in place (the schema declares it) and the ops
return empty tensors in their place.
"""

from __future__ import annotations

import math

import pytest
import torch

from gnnio_cli import native
from gnnio_cli.ops import attention_native as an
from testing import DTYPES, named_test_graph, randn, with_index_dtype

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]

INDEX_DTYPES = (torch.int32, torch.int64)
HEADS, CHANNELS = 2, 16
DROPOUT, SEED, OFFSET = 0.25, 1234, 8  # counter-based: every run of the op draws the same mask


def _graph(index_dtype: torch.dtype, name: str):
    return with_index_dtype(named_test_graph(name, seed_base=43), index_dtype).to("cuda")


def _rows(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return randn(*shape, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)


def _check(op, *arguments):
    torch.library.opcheck(op.default, arguments)


def _plan(kind: int, graph, heads: int = HEADS) -> an._Plan:
    """The real path's graph arguments (the graph's schedules and row orders), with return_scores 1."""
    call = an._make_call(kind, graph, heads, torch.device("cuda"), negative_slope=0.2, scale=1.0, dropout=0.0,
                         training=False, return_attention=True, weights_after_dropout=False)
    return call.plan


def _fp32_out_checks(prefix: str, plan: an._Plan, graph, tensors: tuple, score: tuple, store, hints: tuple = ()):
    """opcheck the forward ops with fp32_out (the output, and GAT's bias `store`, in fp32 for any features), the
    fused one without and with dropout and scores, the edge-balanced one."""
    ops = torch.ops.gnnio
    forward = getattr(ops, f"{prefix}_attention_forward")
    for dropout, return_scores in ((0.0, 0), (DROPOUT, 2)):
        _check(forward, *plan.csr_args, *tensors, *score, dropout, SEED, OFFSET, return_scores, store, *hints, True)
    _check(getattr(ops, f"{prefix}_attention_forward_edge_balanced"), *plan.csr_args, *tensors, *score, DROPOUT,
           SEED, OFFSET, 1, an.slot_rows(graph), store, True)


def _edge_checks(prefix: str, plan: an._Plan, graph, tensors: tuple, score: tuple, dtype: torch.dtype,
                 backward_dropout: float, forward_options: tuple = (),
                 source_options: tuple = ((),)) -> tuple[torch.Tensor, torch.Tensor]:
    """opcheck the forward ops (without and with dropout and scores), the target-side and (for each of
    `source_options`, the arguments after the offset) the source-side backward of one kind, the backward with
    `backward_dropout` (0 lets Dot's passes gather ahead); returns (grad_out, the target pass's row_stats)."""
    ops = torch.ops.gnnio
    forward = getattr(ops, f"{prefix}_attention_forward")
    for dropout, return_scores in ((0.0, 0), (DROPOUT, 1), (DROPOUT, 2)):
        _check(forward, *plan.csr_args, *tensors, *score, dropout, SEED, OFFSET, return_scores, *forward_options)
    _check(getattr(ops, f"{prefix}_attention_forward_edge_balanced"), *plan.csr_args, *tensors, *score, DROPOUT,
           SEED, OFFSET, 1, an.slot_rows(graph))
    dropout = (backward_dropout, SEED, OFFSET)
    out, lse, _ = forward(*plan.csr_args, *tensors, *score, *dropout, 0)
    grad_out = _rows(*out.shape, dtype=dtype, seed=7)
    target = getattr(ops, f"{prefix}_attention_backward_target")
    _check(target, *plan.csr_args, *tensors, grad_out, lse, *score, *dropout)
    row_stats = target(*plan.csr_args, *tensors, grad_out, lse, *score, *dropout)[-1]
    source = getattr(ops, f"{prefix}_attention_backward_source")
    for options in source_options:
        _check(source, *plan.csc_args, *tensors, grad_out, row_stats, *score, *dropout, *options)
    return grad_out, row_stats


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edges", [False, True], ids=["plain", "edge-features"])
@pytest.mark.parametrize("name", ["small", "hub"])
def test_gat_ops(name, edges, dtype, index_dtype):
    graph = _graph(index_dtype, name)
    plan = _plan(an.GAT, graph)
    tensors = (_rows(graph.num_src_nodes, HEADS, CHANNELS, dtype=dtype, seed=1),
               _rows(graph.num_src_nodes, HEADS, dtype=dtype, seed=2),
               _rows(graph.num_dst_nodes, HEADS, dtype=dtype, seed=3),
               _rows(graph.num_edges, HEADS, dtype=dtype, seed=4) if edges else None)
    bias = _rows(HEADS, CHANNELS, dtype=dtype, seed=5)
    dropout = DROPOUT if edges else 0.0
    grad_out, row_stats = _edge_checks("gat", plan, graph, tensors, (0.2,), dtype, dropout, (bias,),
                                       ((False,), (True,)))
    _fp32_out_checks("gat", plan, graph, tensors, (0.2,), bias.float())
    _, _, _, edge_grads = torch.ops.gnnio.gat_attention_backward_source(
        *plan.csc_args, *tensors, grad_out, row_stats, 0.2, dropout, SEED, OFFSET, True)
    _check(torch.ops.gnnio.gat_attention_backward_target_from_edges, *plan.csr_args, *tensors, edge_grads,
           an.edge_grad_slots(graph))
    # packed_grads: rows of (d x_src, d alpha_src, d alpha_dst), written in place
    assert graph.num_src_nodes == graph.num_dst_nodes
    packed = torch.full((graph.num_src_nodes, HEADS * CHANNELS + 2 * HEADS), float("nan"), dtype=dtype, device="cuda")
    _check(torch.ops.gnnio.gat_attention_backward_source, *plan.csc_args, *tensors, grad_out, row_stats, 0.2,
           dropout, SEED, OFFSET, True, packed)
    _check(torch.ops.gnnio.gat_attention_backward_target_from_edges, *plan.csr_args, *tensors, edge_grads,
           an.edge_grad_slots(graph), packed)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edges", [False, True], ids=["plain", "edge-features"])
@pytest.mark.parametrize("name", ["small", "hub"])
def test_gatv2_ops(name, edges, dtype, index_dtype):
    graph = _graph(index_dtype, name)
    plan = _plan(an.GATV2, graph)
    tensors = (_rows(graph.num_src_nodes, HEADS, CHANNELS, dtype=dtype, seed=11),
               _rows(graph.num_dst_nodes, HEADS, CHANNELS, dtype=dtype, seed=12),
               _rows(HEADS, CHANNELS, dtype=dtype, seed=13),
               _rows(graph.num_edges, HEADS, CHANNELS, dtype=dtype, seed=14) if edges else None)
    bias = _rows(HEADS, CHANNELS, dtype=dtype, seed=15)
    _edge_checks("gatv2", plan, graph, tensors, (0.2,), dtype, DROPOUT if edges else 0.0, (bias,))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edges", [False, True], ids=["plain", "edge-features"])
@pytest.mark.parametrize("name", ["small", "hub"])
def test_dot_ops(name, edges, dtype, index_dtype):
    graph = _graph(index_dtype, name)
    plan = _plan(an.DOT, graph)
    tensors = (_rows(graph.num_dst_nodes, HEADS, CHANNELS, dtype=dtype, seed=21),
               _rows(graph.num_src_nodes, HEADS, CHANNELS, dtype=dtype, seed=22),
               _rows(graph.num_src_nodes, HEADS, CHANNELS, dtype=dtype, seed=23),
               _rows(graph.num_edges, HEADS, CHANNELS, dtype=dtype, seed=24) if edges else None)
    residual = _rows(graph.num_dst_nodes, HEADS, CHANNELS, dtype=dtype, seed=25)
    # a quarter of the nodes kept hot: the passes that gather ahead take the hints (results do not depend on them)
    hinted_csr = an.mark_rarely_read(graph.csr_indices, graph.num_src_nodes, graph.num_src_nodes // 4)
    hinted_csc = an.mark_rarely_read(graph.csc_indices, graph.num_dst_nodes, graph.num_dst_nodes // 4)
    scale = (1.0 / math.sqrt(CHANNELS),)
    dropout = DROPOUT if edges else 0.0
    grad_out, row_stats = _edge_checks("dot", plan, graph, tensors, scale, dtype, dropout, (residual, hinted_csr),
                                       ((False, hinted_csc), (True, None)))
    _fp32_out_checks("dot", plan, graph, tensors, scale, residual, (hinted_csr,))
    _, _, _, edge_grads = torch.ops.gnnio.dot_attention_backward_source(
        *plan.csc_args, *tensors, grad_out, row_stats, *scale, dropout, SEED, OFFSET, True)
    for hints in (None, hinted_csr):
        _check(torch.ops.gnnio.dot_attention_backward_target_from_edges, *plan.csr_args, *tensors, edge_grads,
               an.edge_grad_slots(graph), hints)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["small", "hub"])
def test_cosine_ops(name, dtype, index_dtype):
    graph = _graph(index_dtype, name)
    plan = _plan(an.COSINE, graph, heads=1)
    x_src = _rows(graph.num_src_nodes, 1, CHANNELS, dtype=dtype, seed=31)
    x_dst = _rows(graph.num_dst_nodes, 1, CHANNELS, dtype=dtype, seed=32)
    norms = torch.ops.gnnio.attention_row_norms
    beta = torch.tensor([0.7], device="cuda")
    tensors = an._cosine_tensors(x_src, norms(x_src), x_dst, norms(x_dst), beta)
    grad_out, row_stats = _edge_checks("cosine", plan, graph, tensors, (), dtype, DROPOUT, source_options=())
    # the source pass with and without the target pass's d u_dst (x_dst is x_src, or not)
    grad_unit_dst = _rows(graph.num_src_nodes, 1, CHANNELS, dtype=dtype, seed=33)
    for unit_grad in (grad_unit_dst, None):
        _check(torch.ops.gnnio.cosine_attention_backward_source, *plan.csc_args, *tensors, unit_grad, grad_out,
               row_stats, DROPOUT, SEED, OFFSET)


@pytest.mark.parametrize("dtype", DTYPES)
def test_node_row_ops(dtype):
    """The node-level ops the backward passes take their row statistics from (native/attention/rows.cu)."""
    a, b = _rows(301, HEADS, 24, dtype=dtype, seed=41), _rows(301, HEADS, 24, dtype=dtype, seed=42)
    offset, residual = _rows(HEADS, 24, dtype=dtype, seed=43), _rows(301, HEADS, 24, dtype=dtype, seed=44)
    lse = torch.rand(301, HEADS, device="cuda")
    ops = torch.ops.gnnio
    _check(ops.attention_row_dots, a, b)
    _check(ops.attention_row_dots, a, b, offset, lse, True, residual)
    norm = ops.attention_row_norms(a)
    _check(ops.attention_row_norms, a)
    _check(ops.attention_unit_rows_backward, a, norm, b)


def test_each_kind_registers_its_typed_ops():
    """Every kind has its own forward and backward ops; only GAT and Dot sum the target side from the source
    pass's edge gradients; no op takes a kind whose tensor slots change meaning."""
    names = set(native.op_names())
    for prefix in ("gat", "gatv2", "dot", "cosine"):
        for name in ("forward", "forward_edge_balanced", "backward_target", "backward_source"):
            assert f"{prefix}_attention_{name}" in names, (prefix, name)
    from_edges = {name for name in names if name.endswith("_attention_backward_target_from_edges")}
    assert from_edges == {"gat_attention_backward_target_from_edges", "dot_attention_backward_target_from_edges"}
    assert not [name for name in names if name.startswith(("attention_forward", "attention_backward"))]
