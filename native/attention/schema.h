// What every attention edge op of every kind shares: the graph arguments of
// its schema, and what they mean. Each kind's file (gat.cu, gatv2.cu, dot.cu,
// cosine.cu) declares its own ops, named for the kind (gnnio::gat_attention_forward,
// ...), with tensor arguments named for what they are; their bodies are host.cuh's.
//
// The graph arguments are (indptr, indices, eid) of the CSR for the forward and
// target-side passes, of the CSC for the source-side pass, each with its row
// schedule (common.cuh) and row_order: int64 [L, 3], the light rows (at most
// tile_edges slots) each with its first and end slot, the num_busy_rows
// non-empty ones first by descending length, then the empty ones
// (gnnio_cli/ops/attention_native.py builds it once per graph). Per-edge
// tensors are in eid order. dropout, seed, offset: the counter-based dropout
// of the scores (seed and offset from gnnio::attention_dropout_seed).
//
// Every kind has (Nd targets, Ns sources, E edges, H heads, C channels):
//   <kind>_attention_forward -> (out [Nd, H, C], lse fp32 [Nd, H] (log of each
//     softmax denominator, 0 for empty rows), scores fp32 [E, H]: the raw
//     scores when return_scores is 1, or 2 for -inf on dropped edges; [0, H] otherwise)
//   <kind>_attention_forward_edge_balanced: the same, every edge's score first
//     with each warp taking as many edges (slot_rows int32 [E]: each CSR slot's row)
//   <kind>_attention_backward_target: along the CSR from lse, the target-side
//     gradients and row_stats fp32 [Nd, H, 2]: (lse, delta) per target and head,
//     delta = <grad_out, out> summed from the recomputed terms (an empty row's (0, 0))
//   <kind>_attention_backward_source: along the CSC from row_stats, the
//     source-side and per-edge gradients
// and GAT and Dot also <kind>_attention_backward_target_from_edges: the
// target-side gradients from the source pass's per-edge score gradients.
// hinted_indices (Dot's ops; optional): the pass's indices as int32 with bit
// 31 set where the neighbour's rows are rarely read; the passes that gather
// ahead give those rows L2's evict-first policy (attention_native.py's
// hinted_indices builds them). Results do not depend on them.
// Deterministic; no atomics.
#pragma once

#define GNNIO_ATTENTION_GRAPH_PARAMS                                                                         \
  const at::Tensor &indptr, const at::Tensor &indices, const at::Tensor &eid, const at::Tensor &tile_row,   \
      const at::Tensor &tile_start, const at::Tensor &heavy_rows, const at::Tensor &heavy_tile_ptr,         \
      int64_t tile_edges, const at::Tensor &row_order, int64_t num_busy_rows
#define GNNIO_ATTENTION_GRAPH_NAMES \
  indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order, num_busy_rows
#define GNNIO_ATTENTION_GRAPH_SCHEMA                                                                   \
  "Tensor indptr, Tensor indices, Tensor eid, Tensor tile_row, Tensor tile_start, Tensor heavy_rows, " \
  "Tensor heavy_tile_ptr, int tile_edges, Tensor row_order, int num_busy_rows, "
#define GNNIO_ATTENTION_DROPOUT_SCHEMA "float dropout, int seed, int offset"
