// Schemas of gnnio's native ops: declared once here, implemented for CUDA in
// one .cu per kernel family (spmm.cu, reduce.cu, ...), each registering its
// kernels with TORCH_LIBRARY_IMPL(gnnio, CUDA, m). Other families add their
// own schemas with TORCH_LIBRARY_FRAGMENT(gnnio, m) in their .cu file.
//
// Conventions shared by the ops below:
// - A compressed structure is (indptr int64 [R + 1], indices int32/int64 [E]);
//   for the forward passes it is the CSR (row = target, index = source), for
//   the backward passes the CSC (row = source, index = target).
// - Features are [rows, F], contiguous, fp32/fp16/bf16; accumulation is fp32.
// - The row schedule (tile_row, tile_start, heavy_rows, heavy_tile_ptr,
//   tile_edges) is the degree-aware split described in common.cuh, built once
//   per graph by gnnio_cli/ops/schedule.py.
// - Rows without slots produce 0.

#include <torch/library.h>

TORCH_LIBRARY(gnnio, m) {
  // out[r] = sum over slots k of row r of values[k] * x[indices[k]] (values
  // fp32 [E] in slot order, or None for all ones); [R, F] in x's dtype.
  // Deterministic: heavy rows are summed per tile, tiles merged in order.
  // diagonal: optional fp32 [R] of a square operator (x has R rows), adding
  // diagonal[r] * x[r] to row r without a slot for it (GCN's self-loops: x[r]
  // is read in row order instead of gathered).
  m.def(
      "segment_sum(Tensor indptr, Tensor indices, Tensor? values, Tensor x, int num_rows, "
      "Tensor tile_row, Tensor tile_start, Tensor heavy_rows, Tensor heavy_tile_ptr, int tile_edges, "
      "Tensor? diagonal=None) -> Tensor");

  // segment_sum for fp16/bf16 x of at most 128 features, a multiple of 8, 16-byte
  // aligned: the same result up to summation order (fp32, rounded once, also
  // deterministic), with each light row given a group of F / 8 lanes, so one
  // warp sums several rows at once. row_order: int64 [L, 3], every light row
  // (at most tile_edges slots) once with its indptr bounds (one load per row
  // instead of two in turn), in the order the warps take them (e.g. by
  // descending degree); None: row order. row_scale: optional fp32 [R] for
  // operators whose slots of row r all hold values[k] == row_scale[r] (mean):
  // the light rows then sum plainly and scale once; tiles still read values.
  // diagonal: as segment_sum's (not combined with row_scale).
  m.def(
      "segment_sum_subwarp(Tensor indptr, Tensor indices, Tensor? values, Tensor x, int num_rows, "
      "Tensor tile_row, Tensor tile_start, Tensor heavy_rows, Tensor heavy_tile_ptr, int tile_edges, "
      "Tensor? row_order, Tensor? row_scale=None, Tensor? diagonal=None) -> Tensor");

  // cuSPARSE SpMM (CSR, fp32 compute): out[r] = sum_k values[k] * x[indices[k]].
  // indptr and indices share one index dtype (int32 or int64); values has x's
  // dtype. workspace: a uint8 buffer of at least cusparse_spmm_buffer_size bytes.
  m.def(
      "cusparse_spmm(Tensor indptr, Tensor indices, Tensor values, Tensor x, int num_rows, "
      "Tensor(a!) workspace) -> Tensor");
  m.def("cusparse_spmm_buffer_size(Tensor indptr, Tensor indices, Tensor values, Tensor x, int num_rows) -> int");
}
