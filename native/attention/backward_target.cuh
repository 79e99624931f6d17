// The target-side backward passes: the CSR pass that recomputes the scores
// (backward_target_kernel) and the heavy rows' finish, and the passes that
// sum the source pass's per-edge score gradients instead (GAT's
// gat_target_sums_kernel, Dot's dot_target_from_edges_kernel). See passes.cuh.
#pragma once

#include "passes.cuh"

namespace gnnio {
namespace attention {
namespace {

// ----------------------------------------------------- backward, target side
// delta = <g_t, out_t> is summed here from the recomputed terms instead of
// read from the saved output: a 16-bit output would carry its rounding into
// d score = p * (dp - delta), where dp and delta nearly cancel. Since
//   sum_e d score_e * x_e = sum_e r_e x_e - delta * sum_e p_e x_e,  r_e = p_e * drop_e * dp_e,
// the pass keeps both sums and combines them once delta is complete (at the
// row's end, or after its tiles for a heavy row). Per-edge gradients need
// delta first, so the source-side pass writes them.
//
// Each row's delta goes out beside what the source pass gathers with it per
// edge (Params::row_stats): (lse, delta), and for Cosine (lse, delta,
// 1 / max(|x_dst|, floor), 0). The source pass then takes them as they are,
// with no stacking first (at::stack took 57-74 us of a fwd+bwd on rmat20,
// H100, run 168). The values come from registers: the row's lse and inverse
// norm are live through its edges, and a load at the row's end would add
// its latency to every row (run 168: the pass took 20-68 us longer so).
// `at` = row * heads + head.
__device__ __forceinline__ void store_row_stats(float* stats, int64_t at, bool cosine, float lse, float delta,
                                                float inverse_norm) {
  if (cosine) {
    reinterpret_cast<float4*>(stats)[at] = make_float4(lse, delta, inverse_norm, 0.f);
  } else {
    reinterpret_cast<float2*>(stats)[at] = make_float2(lse, delta);
  }
}

template <int KIND, int VEC, typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, backward_blocks_per_sm<KIND, VEC>()) backward_target_kernel(const Params<scalar_t> p) {
  constexpr int U = target_edges_per_step<KIND, VEC>();
  constexpr int K = Layout<VEC>::kChunks;
  constexpr int G = Layout<VEC>::kGroups;
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Dropout dropout = p.dropout;
  const Lane<VEC> lane(geo);
  const bool need_eid = p.edge != nullptr || dropout.p > 0.f;
  // VEC 8: each group sums every other edge of the row; after the merge both hold the row's sums, and
  // group 0 stores them
  const bool row_lane = lane.group == 0;
  const bool writer = lane.head_ok && lane.in_head == 0 && row_lane;
  const float factor = score_factor<KIND>(p, lane.head, lane.head_ok);

  Chunks<VEC> att, att_grad;  // GATv2: the attention vector and this warp's share of its gradient
  set_zero<VEC>(att_grad);
  if constexpr (KIND == kGatV2) load_row<VEC>(p.att, 0, geo, lane, att);
  float beta_grad = 0.f;  // Cosine: this warp's share of d beta[head] = sum_e d score_e * score_e / beta

  for_each_item(p, lane.lane, [&](const WorkItem& item) {
    Chunks<VEC> grad, target;
    load_row<VEC>(p.grad_out, item.row, geo, lane, grad);
    const float row_lse = load_scalar(p.lse_in, item.row, geo, lane.head, lane.head_ok);
    float alpha_dst = 0.f, target_inverse_norm = 1.f;
    if constexpr (KIND != kGat) load_row<VEC>(p.dst_vec, item.row, geo, lane, target);
    if constexpr (KIND == kGat) alpha_dst = load_scalar(p.dst_scalar, item.row, geo, lane.head, lane.head_ok);
    if constexpr (KIND == kCosine) target_inverse_norm = inverse_norm_of<VEC>(p.dst_norm, item.row, geo, lane);

    // sums over the row's edges of r_e * term_e (weighted) and p_e * term_e (plain)
    Chunks<VEC> weighted, plain, att_weighted, att_plain;
    set_zero<VEC>(weighted);
    set_zero<VEC>(plain);
    set_zero<VEC>(att_weighted);
    set_zero<VEC>(att_plain);
    float scalar_weighted = 0.f, scalar_plain = 0.f, delta = 0.f;

    for_each_step<U, G>(item.begin, item.end, p.indices, p.eid, need_eid, lane.lane,
                        [&](const int64_t(&neighbour)[U], const bool(&valid)[U], const StepEdges& edge_id) {
      // gathers first, with no branch between them (see forward_kernel)
      Chunks<VEC> message[U], key[U];  // key: Dot's key + edge; GATv2's hidden
      float partial[U], message_dot[U], z[U], inverse_norm[U];
#pragma unroll
      for (int u = 0; u < U; ++u) load_row<VEC>(p.msg_src, neighbour[u], geo, lane, message[u]);
      step_partials<KIND, VEC, U>(p, neighbour, edge_id, geo, lane, target, alpha_dst, att, message, partial,
                                  inverse_norm, key, z);
#pragma unroll
      for (int u = 0; u < U; ++u) message_dot[u] = dot<VEC>(grad, message[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float score, cosine = 0.f;
        if constexpr (KIND == kGat) {
          score = leaky_relu(z[u], p.slope);
        } else if constexpr (KIND == kCosine) {
          // the same product as forward's score, so prob is exp of the same number
          const float unscaled = lane_sum<VEC>(partial[u], geo, lane) * inverse_norm[u] * target_inverse_norm;
          score = unscaled * factor;
          cosine = unscaled * p.scale;
        } else {
          score = lane_sum<VEC>(partial[u], geo, lane) * factor;
        }
        const float dp = lane_sum<VEC>(message_dot[u], geo, lane);
        // edge_id shuffles on the whole warp: before the branch on valid (the groups' edges differ)
        const float drop = dropout.p > 0.f ? dropout.weight(edge_id(u), lane.head) : 1.f;
        if (!valid[u]) continue;
        const float prob = softmax_exp(score - row_lse);
        const float r = prob * drop * dp;
        delta += r;
        if constexpr (KIND == kDot) {
          add_scaled<VEC>(weighted, r, key[u]);
          add_scaled<VEC>(plain, prob, key[u]);
        } else if constexpr (KIND == kCosine) {
          // d u_dst = beta * sum_e d score_e * u_src (u_src = x_src / max(|x_src|, floor));
          // d beta = sum_e d score_e * cosine_e
          add_scaled<VEC>(weighted, r * inverse_norm[u], message[u]);
          add_scaled<VEC>(plain, prob * inverse_norm[u], message[u]);
          scalar_weighted += r * cosine;
          scalar_plain += prob * cosine;
        } else if constexpr (KIND == kGatV2) {
#pragma unroll
          for (int k = 0; k < K; ++k)
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
              // the attention vector factors out of the x_dst sums: applied once per row
              const float slope_term = leaky_relu_grad(key[u][k][v], p.slope);
              const float activation = gatv2_activation<scalar_t>(key[u][k][v], p.slope);
              weighted[k][v] += r * slope_term;
              plain[k][v] += prob * slope_term;
              att_weighted[k][v] += r * activation;
              att_plain[k][v] += prob * activation;
            }
        } else {
          const float slope_term = leaky_relu_grad(z[u], p.slope);
          scalar_weighted += r * slope_term;
          scalar_plain += prob * slope_term;
        }
      }
    });
    if constexpr (G == 2) {  // only the sums the kind keeps: each element costs a shuffle per row
      if constexpr (KIND != kGat) {
        merge_group_sums<VEC>(weighted);
        merge_group_sums<VEC>(plain);
      }
      if constexpr (KIND == kGatV2) {
        merge_group_sums<VEC>(att_weighted);
        merge_group_sums<VEC>(att_plain);
      }
      if constexpr (KIND == kGat || KIND == kCosine) {
        scalar_weighted = merged_groups(scalar_weighted);
        scalar_plain = merged_groups(scalar_plain);
      }
      delta = merged_groups(delta);
    }

    if (item.partial < 0) {
      if (writer)
        store_row_stats(p.stats_out, item.row * geo.heads + lane.head, KIND == kCosine, row_lse, delta,
                        target_inverse_norm);
      if constexpr (KIND == kGat) {
        if (writer)
          p.grad_scalar[item.row * geo.heads + lane.head] = static_cast<scalar_t>(scalar_weighted - delta * scalar_plain);
      } else {
        Chunks<VEC> result;
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            const float scale = KIND == kGatV2 ? att[k][v] : factor;
            result[k][v] = scale * (weighted[k][v] - delta * plain[k][v]);
            att_grad[k][v] += att_weighted[k][v] - delta * att_plain[k][v];
          }
        if (row_lane) store_row<VEC>(p.grad_vec, item.row, geo, lane, result);
        if constexpr (KIND == kCosine) beta_grad += scalar_weighted - delta * scalar_plain;
      }
    } else {
      if (writer) p.part_delta[item.partial * geo.heads + lane.head] = delta;
      if constexpr (KIND == kGat || KIND == kCosine) {
        if (writer) {
          p.part_scalar[item.partial * geo.heads + lane.head] = scalar_weighted;
          p.part_scalar2[item.partial * geo.heads + lane.head] = scalar_plain;
        }
      }
      if constexpr (KIND != kGat) {
        if constexpr (KIND == kGatV2) {
#pragma unroll
          for (int k = 0; k < K; ++k)
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
              weighted[k][v] *= att[k][v];
              plain[k][v] *= att[k][v];
            }
          if (row_lane) {
            store_row<VEC>(p.part_att, item.partial, geo, lane, att_weighted);
            store_row<VEC>(p.part_att2, item.partial, geo, lane, att_plain);
          }
        }
        if (row_lane) {
          store_row<VEC>(p.part_vec, item.partial, geo, lane, weighted);
          store_row<VEC>(p.part_vec2, item.partial, geo, lane, plain);
        }
      }
    }
  }, [&](int64_t row) {
    // lse 0, as the forward wrote it; no edge reads an empty row's statistics, so no norm is loaded for them
    if (writer) store_row_stats(p.stats_out, row * geo.heads + lane.head, KIND == kCosine, 0.f, 0.f, 0.f);
    if constexpr (KIND == kGat) {
      if (writer) p.grad_scalar[row * geo.heads + lane.head] = static_cast<scalar_t>(0.f);
    } else if (row_lane) {
      Chunks<VEC> zero;
      set_zero<VEC>(zero);
      store_row<VEC>(p.grad_vec, row, geo, lane, zero);
    }
  });

  // GATv2: each resident warp's share of the attention-vector gradient, one
  // row per warp (fixed item assignment: deterministic), summed on the host
  // side. No block barrier: warps of a block end at different times.
  // Cosine: the same for d beta, one value per (warp, head).
  if constexpr (KIND == kGatV2) {
    if (row_lane) store_row<VEC>(p.att_partial, warp_index(), geo, lane, att_grad);
  }
  if constexpr (KIND == kCosine) {
    if (writer) p.att_partial[warp_index() * geo.heads + lane.head] = beta_grad;
  }
}

// Heavy rows of the target-side pass: add the tiles' sums in tile order, then
// combine them with the row's complete delta (stored with the row's lse, and
// Cosine's inverse |x_dst| where `norms` is given: store_row_stats). `per_head` values per head
// (C, or 1 for GAT's alpha_dst); GATv2's attention-vector share of the row
// goes to att_rows[j] (summed with the block partials on the host). Cosine:
// the gradient is also scaled by beta[head] (head_scale), and the row's share
// of d beta (from the tiles' beta_weighted / beta_plain) goes to
// beta_rows[j, head]. Either kind's extra sums are added in the same round
// of loads as the others, not in a second pass over the tiles: the row's
// tiles then cost one chain of loads, not two, and the kernel 72 registers,
// not 168 (H100, rmat20, run 169: AGNN 141 -> 72 us, GATv2 136 -> 91).
template <typename scalar_t>
__global__ void finish_target_tiles_kernel(const RowSchedule s, int heads, int per_head, float scale,
                                           const float* __restrict__ head_scale,
                                           const float* __restrict__ part_delta, const float* __restrict__ weighted,
                                           const float* __restrict__ plain, const float* __restrict__ att_weighted,
                                           const float* __restrict__ att_plain, const float* __restrict__ beta_weighted,
                                           const float* __restrict__ beta_plain, scalar_t* __restrict__ grad,
                                           const float* __restrict__ lse, const float* __restrict__ norms,
                                           float* __restrict__ stats_out, float* __restrict__ att_rows,
                                           float* __restrict__ beta_rows) {
  const int64_t row = s.heavy_rows[blockIdx.x];
  const int64_t first = s.heavy_tile_ptr[blockIdx.x], last = s.heavy_tile_ptr[blockIdx.x + 1];
  const int64_t width = static_cast<int64_t>(heads) * per_head;
  for (int64_t f = threadIdx.x; f < width; f += blockDim.x) {
    const int head = static_cast<int>(f / per_head);
    // extra: GATv2's attention-vector sums (per value) or Cosine's d beta sums (per head), else 0
    float delta = 0.f, sum_weighted = 0.f, sum_plain = 0.f, sum_extra_weighted = 0.f, sum_extra_plain = 0.f;
    struct TileSums {
      float delta, weighted, plain, extra_weighted, extra_plain;
    };
    in_tile_order<TileSums>(
        first, last,
        [&](int64_t t) {
          TileSums tile{part_delta[t * heads + head], weighted[t * width + f], plain[t * width + f], 0.f, 0.f};
          if (att_rows != nullptr) {
            tile.extra_weighted = att_weighted[t * width + f];
            tile.extra_plain = att_plain[t * width + f];
          } else if (beta_rows != nullptr) {  // the same address for a head's threads: one load each
            tile.extra_weighted = beta_weighted[t * heads + head];
            tile.extra_plain = beta_plain[t * heads + head];
          }
          return tile;
        },
        [&](const TileSums& tile) {
          delta += tile.delta;
          sum_weighted += tile.weighted;
          sum_plain += tile.plain;
          sum_extra_weighted += tile.extra_weighted;
          sum_extra_plain += tile.extra_plain;
        });
    const float factor = head_scale != nullptr ? scale * head_scale[head] : scale;
    grad[row * width + f] = static_cast<scalar_t>(factor * (sum_weighted - delta * sum_plain));
    const float extra = sum_extra_weighted - delta * sum_extra_plain;
    if (att_rows != nullptr) att_rows[blockIdx.x * width + f] = extra;
    if (f % per_head == 0) {
      const int64_t at = row * heads + head;
      store_row_stats(stats_out, at, norms != nullptr, lse[at], delta,
                      norms != nullptr ? norms[2 * at + 1] : 0.f);
      if (beta_rows != nullptr) beta_rows[blockIdx.x * heads + head] = extra;
    }
  }
}

// ------------------------------------ backward, target side from edge gradients
// GAT's and Dot's target-side gradients are linear in the per-edge score
// gradients s_e the source pass wrote (edge_grads, CSC slot order):
//   GAT: d alpha_dst[t] = sum_{e into t} s_e,  s_e = d z_e (z = alpha_src + alpha_dst + edge);
//   Dot: d query[t]     = sum_{e into t} s_e (key_s + edge_e),  s_e = scale * d score_e.
// So these passes gather no row at all for GAT (only each edge's H values of
// s_e, gat_target_sums_kernel) and only the key row for Dot
// (dot_target_from_edges_kernel), against backward_target_kernel's
// recomputation from two rows per edge (Dot: key and value; GAT: x_src for
// <g_t, x_src>). The price is delta (attention_row_dots of the saved output)
// before the source pass. The source pass writes s_e where it computes them,
// in its own slot order, and these passes gather them (edge_grad_slot): a
// gathered read costs one sector, a scattered partial-sector write costs the
// memory a read and a write of it. GATConv on rmat20 (H100, 4 x 32): source
// pass 4.19 -> 3.51 ms.
template <int VEC, typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, backward_blocks_per_sm<kDot, VEC>())
    dot_target_from_edges_kernel(const Params<scalar_t> p) {
  constexpr int U = 4;  // edges per step, all their loads issued first: a key row each, 4 fit in 80 registers
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Lane<VEC> lane(geo);

  for_each_item(p, lane.lane, [&](const WorkItem& item) {
    Chunks<VEC> sum;
    set_zero<VEC>(sum);
    for_each_step<U>(item.begin, item.end, p.indices, p.eid, p.edge != nullptr, lane.lane,
                     [&](const int64_t(&neighbour)[U], const bool(&valid)[U], const StepEdges& edge_id) {
      float grad[U];
      Chunks<VEC> key[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t slot = edge_id.mapped(u);  // a shuffle: every lane takes part, whatever it then reads
        grad[u] = valid[u] && lane.head_ok ? p.edge_grads_in[slot * geo.heads + lane.head] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) load_row<VEC>(p.key_src, neighbour[u], geo, lane, key[u]);
      add_edge_features<VEC, U>(p, edge_id, geo, lane, key);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) add_scaled<VEC>(sum, grad[u], key[u]);
    }, p.edge_grad_slot);
    if (item.partial < 0) {
      store_row<VEC>(p.grad_vec, item.row, geo, lane, sum);
    } else {
      store_row<VEC>(p.part_vec, item.partial, geo, lane, sum);
    }
  }, [&](int64_t row) {
    Chunks<VEC> zero;
    set_zero<VEC>(zero);
    store_row<VEC>(p.grad_vec, row, geo, lane, zero);
  });
}

// GAT's d alpha_dst with one work item per lane: a row's sum is a walk over
// its slots, each a read of where its s_e lies (edge_grad_slot) and then of
// its H values, so a warp per row would keep only one row's few loads in
// flight behind three dependent latencies (bounds, slot map, s_e): 1.05 ms
// on rmat20 against 0.71 ms this way. 32 rows per warp keep 32 times as
// many; the items come longest first (for_each_item's order), so a warp's
// lanes walk rows of about the same length. The sums stay in registers, so
// a row is walked once per group of kLaneHeads heads (once for H <= 8);
// HEAD_VEC 4 (H % 4 == 0, s_e 16-byte aligned) reads four heads' s_e in one
// load. The slot order is the sums' order, so results are deterministic.
constexpr int kLaneHeads = 8;

template <typename scalar_t, int HEAD_VEC>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp) gat_target_sums_kernel(const Params<scalar_t> p) {
  static_assert(kLaneHeads % HEAD_VEC == 0, "a head group is whole loads");
  constexpr int U = 8;  // slots whose loads are issued together
  const RowSchedule& s = p.schedule;
  const int heads = p.geo.heads;
  const int64_t busy_end = s.num_tiles + p.num_busy_rows;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= busy_end + p.num_empty_rows) return;
  WorkItem item;
  if (index < s.num_tiles) {
    tile_item(s, index, item);
  } else {
    // a light row (busy or empty: an empty one's bounds are equal)
    const int64_t* bounds = p.row_bounds + 3 * (index - s.num_tiles);
    item.row = bounds[0];
    item.begin = bounds[1];
    item.end = bounds[2];
    item.partial = -1;
  }
  for (int first_head = 0; first_head < heads; first_head += kLaneHeads) {
    const int group_heads = heads - first_head < kLaneHeads ? heads - first_head : kLaneHeads;
    const float* group_grads = p.edge_grads_in + first_head;
    float sum[kLaneHeads] = {};
    for (int64_t first = item.begin; first < item.end; first += U) {
      int64_t at[U];
#pragma unroll
      for (int u = 0; u < U; ++u) at[u] = first + u < item.end ? p.edge_grad_slot[first + u] * heads : -1;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (at[u] < 0) continue;
#pragma unroll
        for (int h = 0; h < kLaneHeads; h += HEAD_VEC) {
          if (h >= group_heads) break;
          if constexpr (HEAD_VEC == 4) {
            const float4 four = *reinterpret_cast<const float4*>(group_grads + at[u] + h);
            sum[h] += four.x;
            sum[h + 1] += four.y;
            sum[h + 2] += four.z;
            sum[h + 3] += four.w;
          } else {
            sum[h] += group_grads[at[u] + h];
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kLaneHeads; ++h) {
      if (h >= group_heads) break;
      if (item.partial < 0) {
        p.grad_scalar[item.row * p.grad_scalar_stride + first_head + h] = static_cast<scalar_t>(sum[h]);
      } else {
        p.part_scalar[item.partial * heads + first_head + h] = sum[h];
      }
    }
  }
}


}  // namespace
}  // namespace attention
}  // namespace gnnio
