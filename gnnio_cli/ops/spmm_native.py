"""The native path of the SpMM family (spmm, sum/mean aggregation, GCN propagation).

Each op here is ``out = A @ x`` for a sparse operator A over the graph's CSR
(row = target), with fp32 values per slot (edge weights, GCN normalisation,
1/in-degree for mean) or none at all (plain sum). The backward pass is
``grad_x = A^T @ grad_out``, run through the CSC (row = source) with the same
values permuted to CSC slot order: as cheap as the forward, no atomics, no
transpose flag.

Three kernels compute ``A @ x`` (native/spmm.cu):

- ``csr-vec``: gnnio's degree-aware CSR kernel (128-bit loads, a warp per
  light row, heavy rows in tiles merged in order), any dtype;
- ``csr-subwarp``: the same for fp16/bf16 rows of at most 128 features (a
  multiple of 8, 16-byte aligned), except that each light row gets a group of
  F / 8 lanes of its own, so a warp sums 32 / (F / 8) rows at once;
  ``csr-subwarp-sorted`` takes the light rows by descending degree instead of
  in row order, so the rows sharing a warp are about as long;
- ``cusparse``: cuSPARSE SpMM (fp32), its values and work buffer cached per
  (dtype, width).

16-bit features never take ``cusparse``: cuSPARSE's 16-bit SpMM, although
asked for fp32 compute, was measured 0.1-0.46 off (relative) on a row of
100k in-edges, where gnnio's kernels round once. The candidates are
``csr-vec`` and ``cusparse`` for fp32, ``csr-vec`` and ``csr-subwarp`` for
16-bit inputs that fit the subwarp kernels (all three), ``csr-vec`` alone
otherwise. Where there are several, all are timed on the first call per
(shape class of the operator side, dtype, width, device) and the fastest kept
for the process (:mod:`gnnio_cli.ops.tuning`), so a new graph of a known
shape (the next mini-batch) is never timed; on an H100 gnnio's kernel wins on
rmat20, uniform20 and grid1024 since its light rows come in batches, see
common.cuh; inside CUDA graph capture, where nothing can be timed, ``csr-vec``. An operator with a
diagonal (GCN's self-loops) has no ``cusparse`` candidate.
``GNNIO_SPMM_KERNEL`` (any of the names above) forces the choice among an
input's candidates; a forced kernel that cannot take the input gives
``csr-vec``. The choice is recorded with
:func:`dispatch.record`, so ``gnnio run`` and ``compare`` show it.

Operators without per-call edge weights are cached on the Graph; results are
deterministic for a given choice of kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from gnnio_cli import native
from gnnio_cli.graph import Graph
from gnnio_cli.graph.loops import without_self_loops
from gnnio_cli.ops import dispatch
from gnnio_cli.ops.gcn_norm import gcn_norm
from gnnio_cli.ops.segment import csc_slots
from gnnio_cli.ops.tuning import choose_kernel, fits_subwarp, shape_class
from gnnio_cli.graph.schedule import RowOrder, RowSchedule, row_order, row_schedule

NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNELS = ("csr-vec", "csr-subwarp", "csr-subwarp-sorted", "cusparse")
SUBWARP_KERNELS = ("csr-subwarp", "csr-subwarp-sorted")


def supports(x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None) -> bool:
    """Whether the native kernels take these inputs: CUDA, fp32/fp16/bf16, and no gradient wanted for edge_weight."""
    if not (x.is_cuda and x.dtype in NATIVE_DTYPES):
        return False
    return edge_weight is None or (edge_weight.is_cuda and not edge_weight.requires_grad)


def kernel_candidates(x: torch.Tensor) -> tuple[str, ...]:
    """The kernels that may compute A @ x for this x [num_cols, F] (contiguous), in the order they are timed."""
    if x.dtype == torch.float32:
        return ("csr-vec", "cusparse")
    return ("csr-vec", *SUBWARP_KERNELS) if fits_subwarp(x) else ("csr-vec",)


# ------------------------------------------------------------ operators
@dataclass
class _CusparseForm:
    """What cuSPARSE needs for one side in one dtype: one index dtype for indptr and indices, typed values."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    workspaces: dict = field(default_factory=dict)  # width -> uint8 buffer


@dataclass
class OperatorSide:
    """One direction of a sparse operator: rows, their slots and fp32 values (None = all ones)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: Optional[torch.Tensor]
    num_rows: int
    schedule: RowSchedule
    light_rows: Callable[[], RowOrder]  # the light rows by descending degree (cached on the graph)
    shape: tuple = ()  # the side's shape_class: the kernel choices it shares with same-shaped graphs
    cusparse_forms: dict = field(default_factory=dict)  # dtype -> _CusparseForm
    # fp32 [num_rows] when every slot of row r holds values == row_scale[r] (mean's forward): the
    # subwarp kernels' light rows then sum plainly and scale once, with no per-slot value to read
    row_scale: Optional[torch.Tensor] = None
    # fp32 [num_rows] of a square operator: row r also adds diagonal[r] * x[r], with no slot for it
    # (GCN's self-loops, read in row order instead of gathered; gnnio's kernels only)
    diagonal: Optional[torch.Tensor] = None

    def apply(self, x: torch.Tensor, op: str) -> torch.Tensor:
        """[num_cols, F] contiguous -> [num_rows, F]: the side's rows times x."""
        kernel = self._kernel(x)
        dispatch.record(op, kernel)
        return self._run(kernel, x)

    def _run(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        if kernel == "cusparse":
            form = self._cusparse_form(x.dtype)
            workspace = self._workspace(form, x)
            return torch.ops.gnnio.cusparse_spmm(form.indptr, form.indices, form.values, x, self.num_rows, workspace)
        args = (self.indptr, self.indices, self.values, x, self.num_rows, *self.schedule.args())
        if kernel in SUBWARP_KERNELS:
            rows = self.light_rows().with_bounds if kernel == "csr-subwarp-sorted" else None
            return torch.ops.gnnio.segment_sum_subwarp(*args, rows, self.row_scale, self.diagonal)
        return torch.ops.gnnio.segment_sum(*args, self.diagonal)

    def _kernel(self, x: torch.Tensor) -> str:
        candidates = kernel_candidates(x)
        if self.diagonal is not None:
            candidates = tuple(kernel for kernel in candidates if kernel != "cusparse")
        return choose_kernel(
            candidates, variable="GNNIO_SPMM_KERNEL", names=KERNELS, fallback="csr-vec",
            key=("spmm", *self.shape, x.dtype, x.shape[1], x.device, candidates), run=lambda kernel: self._run(kernel, x),
        )  # fmt: skip

    def _cusparse_form(self, dtype: torch.dtype) -> _CusparseForm:
        if dtype not in self.cusparse_forms:
            num_slots = self.indices.numel()
            if self.indices.dtype == torch.int32 and num_slots < 2**31:
                indptr, indices = self.indptr.to(torch.int32), self.indices
            else:
                indptr, indices = self.indptr, self.indices.to(torch.int64)
            values = (
                self.values.to(dtype)
                if self.values is not None
                else torch.ones(num_slots, dtype=dtype, device=self.indices.device)
            )
            self.cusparse_forms[dtype] = _CusparseForm(indptr, indices, values)
        return self.cusparse_forms[dtype]

    def _workspace(self, form: _CusparseForm, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[1]
        if width not in form.workspaces:
            size = torch.ops.gnnio.cusparse_spmm_buffer_size(form.indptr, form.indices, form.values, x, self.num_rows)
            form.workspaces[width] = torch.empty(max(int(size), 1), dtype=torch.uint8, device=x.device)
        return form.workspaces[width]


@dataclass
class SpmmOperator:
    """A sparse operator A over a graph: ``forward`` (CSR) computes A @ x, ``backward`` (CSC) A^T @ g."""

    forward: OperatorSide
    backward: OperatorSide


def build_operator(
    graph: Graph,
    edge_values: Optional[torch.Tensor],
    target_scale: Optional[torch.Tensor],
    diagonal: Optional[torch.Tensor] = None,
) -> SpmmOperator:
    """The operator whose slot value for edge e = (s, t) is edge_values[e] * target_scale[t], plus `diagonal`.

    edge_values:  fp32 [E] in the graph's eid order, or None for ones.
    target_scale: fp32 [num_dst], or None for ones.
    diagonal:     fp32 [N] for a graph with as many sources as targets, or None: entry (i, i) of the
                  operator adds diagonal[i] (both directions; the graph itself holds no slot for it).
    edge_values and target_scale both None gives value-free kernels (a plain sum reads no values).
    """
    csr_values = csc_values = None
    if edge_values is None and target_scale is not None:  # (mean's 1 / in-degree: no per-edge values to permute)
        target_scale = target_scale.to(torch.float32)
        csr_values = target_scale.index_select(0, graph.csr_rows)
        csc_values = target_scale.index_select(0, graph.csc_indices)
    elif edge_values is not None:
        by_eid = edge_values.to(torch.float32)
        csr_values = by_eid.index_select(0, graph.csr_eid)
        csc_values = by_eid.index_select(0, graph.csc_eid)
        if target_scale is not None:
            csr_values = csr_values * target_scale.index_select(0, graph.csr_rows)
            csc_values = csc_values * target_scale.index_select(0, graph.csc_indices.long())
    row_scale = target_scale if edge_values is None and diagonal is None else None
    return operator_from_slots(graph, csr_values, csc_values, row_scale, diagonal)


def operator_from_slots(graph: Graph, csr_values: Optional[torch.Tensor], csc_values: Optional[torch.Tensor],
                        row_scale: Optional[torch.Tensor] = None, diagonal: Optional[torch.Tensor] = None) -> SpmmOperator:
    """The operator with fp32 values given per slot of each side (None: ones), the forward's `row_scale` (see
    OperatorSide) and `diagonal` (see build_operator)."""
    # The faster kernel depends on the structure's shape, dtype and width, not on the values: every
    # operator over graphs of one shape class shares one choice per side, so per-call edge weights
    # and a new mini-batch graph every step never re-time.
    csr, csc = row_schedule(graph, "csr"), row_schedule(graph, "csc")
    forward = OperatorSide(
        graph.csr_indptr, graph.csr_indices, csr_values, graph.num_dst_nodes, csr,
        lambda: row_order(graph, "csr", csr), shape=shape_class(graph.facts.csr),
        row_scale=None if row_scale is None else row_scale.to(torch.float32),
        diagonal=diagonal,
    )
    backward = OperatorSide(
        graph.csc_indptr, graph.csc_indices, csc_values, graph.num_src_nodes, csc,
        lambda: row_order(graph, "csc", csc), shape=shape_class(graph.facts.csc),
        diagonal=diagonal,
    )
    return SpmmOperator(forward, backward)


def _inverse_in_degree(graph: Graph) -> torch.Tensor:
    """fp32 [num_dst]: 1 / in-degree, 1 for empty rows (whose sums are 0 anyway)."""
    return 1.0 / graph.in_degree.clamp(min=1).to(torch.float32)


def _operator(graph: Graph, edge_weight: Optional[torch.Tensor], reduce: str) -> SpmmOperator:
    def scale() -> Optional[torch.Tensor]:
        return _inverse_in_degree(graph) if reduce == "mean" else None

    if edge_weight is not None:
        return build_operator(graph, edge_weight.detach(), scale())
    return graph.cached(("spmm_operator", reduce), lambda: build_operator(graph, None, scale()))


# ------------------------------------------------------------ autograd
class _Spmm(torch.autograd.Function):
    """out = A @ x; grad_x = A^T @ grad_out through the CSC."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, operator: SpmmOperator, op: str) -> torch.Tensor:
        ctx.operator, ctx.op = operator, op
        return operator.forward.apply(x, op)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return ctx.operator.backward.apply(grad_out.contiguous(), ctx.op + ".backward"), None, None


def apply_operator(operator: SpmmOperator, x: torch.Tensor, op: str) -> torch.Tensor:
    """A @ x for x [num_src, *trailing] (trailing dims flattened and restored), differentiable in x."""
    features = x.flatten(1).contiguous()  # (reshape(N, -1) cannot size 0 rows)
    out = _Spmm.apply(features, operator, op)
    return out.reshape(operator.forward.num_rows, *x.shape[1:])


# ------------------------------------------------------------ public ops
def spmm(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor], reduce: str, op: str = "spmm") -> torch.Tensor:
    """Native :func:`gnnio_cli.ops.spmm.spmm` (inputs validated there, :func:`supports` true)."""
    return apply_operator(_operator(graph, edge_weight, reduce), x, op)


def gcn_propagate(
    graph: Graph,
    x: torch.Tensor,
    edge_weight: Optional[torch.Tensor],
    improved: bool,
    add_self_loops: bool,
    normalize: bool,
) -> torch.Tensor:
    """Native :func:`gnnio_cli.ops.spmm.gcn_propagate`: the reference gcn_norm values (computed once
    in fp32 and cached when there are no edge weights), then one SpMM (see :func:`gcn_operator`)."""
    op = "gcn_propagate"
    if not normalize:
        return spmm(graph, x, edge_weight, "sum", op)
    return apply_operator(gcn_operator(graph, edge_weight, improved, add_self_loops), x, op)


def gcn_operator(graph: Graph, edge_weight: Optional[torch.Tensor], improved: bool, add_self_loops: bool) -> SpmmOperator:
    """GCN's normalised operator (cached on the graph without edge weights).

    With self-loops the operator is the graph's non-loop edges plus a diagonal (one loop per node, as
    gcn_norm adds them): gnnio's kernels read x[i] for node i's loop in row order, where a loop slot
    would gather it (on rmat20 the loops, 6% more slots, cost cuSPARSE 20% more time)."""
    def build() -> SpmmOperator:
        if add_self_loops and edge_weight is None and graph.facts.self_loops == 0 and not graph.is_bipartite:
            return _loop_free_gcn_operator(graph)
        looped, values = gcn_norm(
            graph, edge_weight, improved=improved, add_self_loops=add_self_loops, dtype=torch.float32
        )
        values = values.detach()
        if not add_self_loops:
            return build_operator(looped, values, None)
        loop_free = without_self_loops(graph)
        kept = loop_free.num_edges  # the looped graph's edges: these first, then (i, i) for every node i
        return build_operator(loop_free, values[:kept], None, diagonal=values[kept:])

    if edge_weight is not None:
        return build()
    return graph.cached(("gcn_operator", improved, add_self_loops), build)


def operator_of(graph: Graph, edge_weight: Optional[torch.Tensor], reduce: str, normalize: bool,
                add_self_loops: bool, improved: bool, dtype: torch.dtype) -> SpmmOperator:
    """The operator that GCN's propagation (normalize, reduce "sum"), a normalised mean (gcn_norm's values in
    `dtype`, the features' own, then the mean) or a plain sum/mean applies: its backward side serves a
    graph-level op's backward (gnnio_cli.nn.graph_ops)."""
    if normalize and reduce == "sum":
        return gcn_operator(graph, edge_weight, improved, add_self_loops)
    if normalize:
        graph, edge_weight = gcn_norm(graph, edge_weight, improved=improved, add_self_loops=add_self_loops,
                                      dtype=dtype if edge_weight is None else edge_weight.dtype)
    return _operator(graph, edge_weight, reduce)


def _loop_free_gcn_operator(graph: Graph) -> SpmmOperator:
    """gcn_norm's operator for a graph without self-loops or edge weights (a mini-batch's, every step),
    straight from its degrees: every weight is 1, so deg[i] = in-degree + 1 (its new loop), the value of
    edge (s, t) is deg[s]^-1/2 * deg[t]^-1/2 and the loops' diagonal 1/deg; the same fp32 numbers as
    gcn_norm's (products of the same two factors), without building the looped graph."""
    inv_sqrt = (graph.in_degree + 1).to(torch.float32).pow_(-0.5)
    csr_values = inv_sqrt.index_select(0, graph.csr_indices) * inv_sqrt.index_select(0, graph.csr_rows)
    csc_values = csr_values.index_select(0, csc_slots(graph))
    return operator_from_slots(graph, csr_values, csc_values, None, inv_sqrt * inv_sqrt)


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of native/spmm.cu's ops, so torch.compile and opcheck can trace them."""

    @torch.library.register_fake("gnnio::segment_sum")
    def _(indptr, indices, values, x, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          diagonal=None):
        return x.new_empty((num_rows, x.shape[1]))

    @torch.library.register_fake("gnnio::segment_sum_subwarp")
    def _(indptr, indices, values, x, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          row_order, row_scale=None, diagonal=None):
        return x.new_empty((num_rows, x.shape[1]))

    @torch.library.register_fake("gnnio::cusparse_spmm")
    def _(indptr, indices, values, x, num_rows, workspace):
        return x.new_empty((num_rows, x.shape[1]))
