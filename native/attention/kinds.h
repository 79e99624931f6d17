// The attention ops of one kind (device.cuh's Kind: GAT, GATv2, Dot, Cosine),
// declared here and instantiated, one kind per file, in gat.cu, gatv2.cu,
// dot.cu and cosine.cu (their bodies: host.cuh); ops.cu's schemas dispatch
// on the kind to them. Every kind's file compiles on its own, in parallel.
#pragma once

#include "device.cuh"

#include <tuple>

// The graph and feature arguments every pass takes (see ops.cu's schemas).
#define GNNIO_ATTENTION_GRAPH_PARAMS                                                                                \
  const at::Tensor &indptr, const at::Tensor &indices, const at::Tensor &eid, const at::Tensor &tile_row,          \
      const at::Tensor &tile_start, const at::Tensor &heavy_rows, const at::Tensor &heavy_tile_ptr,                \
      int64_t tile_edges, const at::Tensor &row_order, int64_t num_busy_rows, const at::Tensor &msg_src,           \
      const c10::optional<at::Tensor> &key_src, const c10::optional<at::Tensor> &dst_vec,                          \
      const c10::optional<at::Tensor> &src_scalar, const c10::optional<at::Tensor> &dst_scalar,                    \
      const c10::optional<at::Tensor> &att, const c10::optional<at::Tensor> &edge
#define GNNIO_ATTENTION_GRAPH_NAMES                                                                          \
  indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order, num_busy_rows, \
      msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge

namespace gnnio {
namespace attention {

template <int KIND>
struct KindOps {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
      GNNIO_ATTENTION_GRAPH_PARAMS, double negative_slope, double scale, double dropout, int64_t seed,
      int64_t offset, int64_t return_scores, const c10::optional<at::Tensor>& bias,
      const c10::optional<at::Tensor>& hinted_indices, const c10::optional<at::Tensor>& residual);
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_edge_balanced(
      GNNIO_ATTENTION_GRAPH_PARAMS, double negative_slope, double scale, double dropout, int64_t seed,
      int64_t offset, int64_t return_scores, const at::Tensor& slot_rows, const c10::optional<at::Tensor>& bias,
      const c10::optional<at::Tensor>& residual);
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_target(
      GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& grad_out, const at::Tensor& lse, double negative_slope,
      double scale, double dropout, int64_t seed, int64_t offset);
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_source(
      GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& grad_out, const at::Tensor& row_stats, double negative_slope,
      double scale, double dropout, int64_t seed, int64_t offset, bool write_edge_grads,
      const c10::optional<at::Tensor>& packed_grads, const c10::optional<at::Tensor>& hinted_indices);
};

// GAT and Dot only: the target side from the source pass's per-edge score gradients.
template <int KIND>
struct FromEdgesOps {
  static at::Tensor backward_target(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& edge_grads,
                                    const at::Tensor& edge_grad_slots, const c10::optional<at::Tensor>& packed_grads,
                                    const c10::optional<at::Tensor>& hinted_indices);
};

extern template struct KindOps<kGat>;
extern template struct KindOps<kGatV2>;
extern template struct KindOps<kDot>;
extern template struct KindOps<kCosine>;
extern template struct FromEdgesOps<kGat>;
extern template struct FromEdgesOps<kDot>;

}  // namespace attention
}  // namespace gnnio
