// The source-side backward pass (CSC, one row per source): the gradients of
// the source rows, of per-edge inputs, and GAT's and Dot's per-edge score
// gradients. See passes.cuh.
#pragma once

#include "passes.cuh"

namespace gnnio {
namespace attention {
namespace {

// Cosine's source rows end here rather than in a node pass: with
// u = x / m, m = max(|x|, floor), a = (|x| >= floor) and G = B (+ A, the
// target pass's d u of the same row when x_dst is x_src),
//   d x = V + (G - a <G, u> u) / m,
// F.normalize's backward as attention_unit_rows_backward applies it (u a
// quotient, so one channel gives exactly +-1). `source_grad` holds V on entry.
template <int VEC, typename scalar_t>
__device__ __forceinline__ void cosine_source_row_grad(const Params<scalar_t>& p, int64_t row, const LaneGeometry& geo,
                                                       const Lane<VEC>& lane, const Chunks<VEC>& x, float norm,
                                                       const Chunks<VEC>& unit_grad, Chunks<VEC>& source_grad) {
  constexpr int K = Layout<VEC>::kChunks;
  Chunks<VEC> grad;
  if (p.unit_grad != nullptr) {
    load_row<VEC>(p.unit_grad, row, geo, lane, grad);
  } else {
    set_zero<VEC>(grad);
  }
  add_to<VEC>(grad, unit_grad);
  const float divisor = clamped_norm(norm);
  const float inverse = 1.f / divisor;
  float radial = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) radial += grad[k][v] * (x[k][v] / divisor);
  radial = lane_sum<VEC>(radial, geo, lane);
  // clamp_min passes the norm's gradient only where norm >= floor (a NaN norm gets none)
  const float kept = norm >= kNormFloor ? radial : 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) source_grad[k][v] += (grad[k][v] - kept * (x[k][v] / divisor)) * inverse;
}

// ----------------------------------------------------- backward, source side
template <int KIND, int VEC, typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, backward_blocks_per_sm<KIND, VEC>()) backward_source_kernel(const Params<scalar_t> p) {
  constexpr int U = source_edges_per_step<KIND, VEC>();
  constexpr int K = Layout<VEC>::kChunks;
  constexpr int G = Layout<VEC>::kGroups;
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Dropout dropout = p.dropout;
  const Lane<VEC> lane(geo);
  const bool need_eid = p.edge != nullptr || dropout.p > 0.f;
  // Per-edge outputs come from the edge's group; per-row ones from group 0 after the merge (VEC 8).
  const bool edge_writer = lane.head_ok && lane.in_head == 0;
  const bool row_lane = lane.group == 0;
  const bool writer = edge_writer && row_lane;
  const float factor = score_factor<KIND>(p, lane.head, lane.head_ok);

  Chunks<VEC> att;
  if constexpr (KIND == kGatV2) load_row<VEC>(p.att, 0, geo, lane, att);

  for_each_item(p, lane.lane, [&](const WorkItem& item) {
    // the source row: x_src (GAT, GATv2, Cosine) or value and key (Dot)
    Chunks<VEC> message, key;
    load_row<VEC>(p.msg_src, item.row, geo, lane, message);
    if constexpr (KIND == kDot) load_row<VEC>(p.key_src, item.row, geo, lane, key);
    float alpha_src = 0.f, norm = 0.f, inverse_norm = 1.f;
    if constexpr (KIND == kGat) alpha_src = load_scalar(p.src_scalar, item.row, geo, lane.head, lane.head_ok);
    if constexpr (KIND == kCosine) {
      norm = row_norm_of<VEC>(p.src_norm, item.row, geo, lane);
      inverse_norm = inverse_norm_of<VEC>(p.src_norm, item.row, geo, lane);
    }

    Chunks<VEC> source_grad, key_grad;
    set_zero<VEC>(source_grad);
    set_zero<VEC>(key_grad);
    float scalar_grad = 0.f;

    for_each_step<U, G>(item.begin, item.end, p.indices, p.eid, need_eid, lane.lane,
                        [&](const int64_t(&neighbour)[U], const bool(&valid)[U], const StepEdges& edge_id) {
      // gathers first, with no branch between them (see forward_kernel)
      Chunks<VEC> grad[U], target[U], hidden[U];
      float partial[U], message_dot[U], row_lse[U], row_delta[U], z[U], target_inverse_norm[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        load_row<VEC>(p.grad_out, neighbour[u], geo, lane, grad[u]);
        if constexpr (KIND != kGat) load_row<VEC>(p.dst_vec, neighbour[u], geo, lane, target[u]);
        const float* stats =
            p.row_stats + (static_cast<uint64_t>(static_cast<uint32_t>(neighbour[u])) * geo.heads + lane.head) *
                              row_stats_width(KIND);
        const float2 lse_delta = lane.head_ok ? *reinterpret_cast<const float2*>(stats) : make_float2(0.f, 0.f);
        row_lse[u] = lse_delta.x;
        row_delta[u] = lse_delta.y;
        // stored inverted by the target pass: no division on each edge's chain (H100, rmat20, run 169:
        // AGNN's source pass 4.09 -> 3.30 ms in bf16, 4.51 -> 4.12 in fp32)
        if constexpr (KIND == kCosine) target_inverse_norm[u] = lane.head_ok ? stats[2] : 0.f;
        if constexpr (KIND == kGat) z[u] = alpha_src + load_scalar(p.dst_scalar, neighbour[u], geo, lane.head, lane.head_ok);
      }
      if constexpr (KIND == kDot) {
        if (p.edge) {  // warp-uniform; without edge features the row's own key and value serve every edge
          Chunks<VEC> key_edge[U], message_edge[U];
#pragma unroll
          for (int u = 0; u < U; ++u)
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
              for (int v = 0; v < VEC; ++v) {
                key_edge[u][k][v] = key[k][v];
                message_edge[u][k][v] = message[k][v];
              }
          add_edge_features<VEC, U>(p, edge_id, geo, lane, key_edge, &message_edge);
#pragma unroll
          for (int u = 0; u < U; ++u) {
            partial[u] = dot<VEC>(target[u], key_edge[u]);
            message_dot[u] = dot<VEC>(grad[u], message_edge[u]);
          }
        } else {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            partial[u] = dot<VEC>(target[u], key);
            message_dot[u] = dot<VEC>(grad[u], message);
          }
        }
      } else if constexpr (KIND == kCosine) {
        // the source row is the message; its dot with x_dst, over both norms, the cosine
#pragma unroll
        for (int u = 0; u < U; ++u) {
          partial[u] = dot<VEC>(target[u], message);
          message_dot[u] = dot<VEC>(grad[u], message);
        }
      } else if constexpr (KIND == kGatV2) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          gatv2_hidden<VEC, scalar_t>(hidden[u], message, target[u]);
          if (p.edge) {
            Chunks<VEC> feature;
            load_row<VEC>(p.edge, edge_id(u), geo, lane, feature);
            gatv2_hidden<VEC, scalar_t>(hidden[u], hidden[u], feature);
          }
          partial[u] = gatv2_partial<VEC, scalar_t>(att, hidden[u], p.slope);
          message_dot[u] = dot<VEC>(grad[u], message);
        }
      } else {
        if (p.edge) {
#pragma unroll
          for (int u = 0; u < U; ++u) z[u] += load_scalar(p.edge, edge_id(u), geo, lane.head, lane.head_ok);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) message_dot[u] = dot<VEC>(grad[u], message);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float score;
        if constexpr (KIND == kGat) {
          score = leaky_relu(z[u], p.slope);
        } else if constexpr (KIND == kCosine) {
          score = lane_sum<VEC>(partial[u], geo, lane) * inverse_norm * target_inverse_norm[u] * factor;  // as forward's
        } else {
          score = lane_sum<VEC>(partial[u], geo, lane) * factor;
        }
        const float dp = lane_sum<VEC>(message_dot[u], geo, lane);
        // edge_id shuffles on the whole warp: before the branch on valid (the groups' edges differ)
        const int64_t e = need_eid ? edge_id(u) : 0;
        if (!valid[u]) continue;
        const float prob = softmax_exp(score - row_lse[u]);
        const float drop = dropout.p > 0.f ? dropout.weight(e, lane.head) : 1.f;
        const float score_grad = prob * (drop * dp - row_delta[u]);
        add_scaled<VEC>(source_grad, prob * drop, grad[u]);
        if constexpr (KIND == kCosine) {
          // d u_src = beta * sum_e d score_e * u_dst, u_dst = x_dst / max(|x_dst|, floor)
          add_scaled<VEC>(key_grad, score_grad * factor * target_inverse_norm[u], target[u]);
        } else if constexpr (KIND == kDot) {
          add_scaled<VEC>(key_grad, score_grad * p.scale, target[u]);
          if (p.edge_grads && edge_writer) p.edge_grads[edge_id.slot(u) * geo.heads + lane.head] = score_grad * p.scale;
          if (p.grad_edge) {
            Chunks<VEC> edge_grad;
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
              for (int v = 0; v < VEC; ++v)
                edge_grad[k][v] = score_grad * p.scale * target[u][k][v] + prob * drop * grad[u][k][v];
            store_row<VEC>(p.grad_edge, e, geo, lane, edge_grad);
          }
        } else if constexpr (KIND == kGatV2) {
          Chunks<VEC> hidden_grad;
#pragma unroll
          for (int k = 0; k < K; ++k)
#pragma unroll
            for (int v = 0; v < VEC; ++v)
              hidden_grad[k][v] = score_grad * att[k][v] * leaky_relu_grad(hidden[u][k][v], p.slope);
          add_to<VEC>(source_grad, hidden_grad);
          if (p.grad_edge) store_row<VEC>(p.grad_edge, e, geo, lane, hidden_grad);
        } else {
          const float z_grad = score_grad * leaky_relu_grad(z[u], p.slope);
          scalar_grad += z_grad;
          if (p.grad_edge && edge_writer) p.grad_edge[e * geo.heads + lane.head] = static_cast<scalar_t>(z_grad);
          if (p.edge_grads && edge_writer) p.edge_grads[edge_id.slot(u) * geo.heads + lane.head] = z_grad;
        }
      }
    });
    if constexpr (G == 2) {
      merge_group_sums<VEC>(source_grad);
      if constexpr (KIND == kDot || KIND == kCosine) merge_group_sums<VEC>(key_grad);
      if constexpr (KIND == kGat) scalar_grad = merged_groups(scalar_grad);
    }

    if (item.partial < 0) {
      // Cosine: d x_src whole (the heavy rows' tiles get it from a node pass over those rows)
      if constexpr (KIND == kCosine) cosine_source_row_grad<VEC>(p, item.row, geo, lane, message, norm, key_grad, source_grad);
      if (row_lane) {
        store_row_at<VEC>(p.grad_vec + item.row * p.grad_vec_stride, lane, source_grad);
        if constexpr (KIND == kDot) store_row<VEC>(p.grad_vec2, item.row, geo, lane, key_grad);
      }
      if (KIND == kGat && writer) {
        p.grad_scalar[item.row * p.grad_scalar_stride + lane.head] = static_cast<scalar_t>(scalar_grad);
      }
    } else {
      if (row_lane) {
        store_row<VEC>(p.part_vec, item.partial, geo, lane, source_grad);
        if constexpr (KIND == kDot || KIND == kCosine) store_row<VEC>(p.part_vec2, item.partial, geo, lane, key_grad);
      }
      if (KIND == kGat && writer) p.part_scalar[item.partial * geo.heads + lane.head] = scalar_grad;
    }
  }, [&](int64_t row) {
    Chunks<VEC> zero;
    set_zero<VEC>(zero);
    if constexpr (KIND == kCosine) {
      // no out-edges: V = B = 0, but A (x_dst is x_src) may not be
      Chunks<VEC> x, grad;
      set_zero<VEC>(grad);
      load_row<VEC>(p.msg_src, row, geo, lane, x);
      const float norm = row_norm_of<VEC>(p.src_norm, row, geo, lane);
      cosine_source_row_grad<VEC>(p, row, geo, lane, x, norm, zero, grad);
      if (row_lane) store_row<VEC>(p.grad_vec, row, geo, lane, grad);
    } else if (row_lane) {
      store_row_at<VEC>(p.grad_vec + row * p.grad_vec_stride, lane, zero);
    }
    if constexpr (KIND == kDot) {
      if (row_lane) store_row<VEC>(p.grad_vec2, row, geo, lane, zero);
    }
    if (KIND == kGat && writer) p.grad_scalar[row * p.grad_scalar_stride + lane.head] = static_cast<scalar_t>(0.f);
  });
}


}  // namespace
}  // namespace attention
}  // namespace gnnio
