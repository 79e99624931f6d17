// The passes that gather ahead through shared memory (Dot's three passes,
// GAT's fp32 forward). See passes.cuh.
#pragma once

#include "forward.cuh"

namespace gnnio {
namespace attention {
namespace {

// ------------------------------------------ Dot's passes, rows gathered ahead
// The passes above issue a step's gathers (U edges) and then wait for them
// all, so a warp has at most U edges' rows in flight, and none while it
// computes. ncu on TransformerConv's passes on rmat20 (H100, 4 x 32, fp32,
// run 113): DRAM at 77% (forward), 70% (source pass) and 62.5% (target
// pass) of its bandwidth, no warp eligible in 55-75% of cycles, the warps
// waiting on those gathers; at 80 registers (3 blocks per SM) a step holds
// no more edges. The kernels below copy each step's row chunks into the
// warp's ring in shared memory (copy_ahead) DEPTH steps before the step is
// computed: DEPTH x U edges stay in flight, through the arithmetic too, for
// the registers of one step. They take Dot (TransformerConv) in the 4-wide
// layout (the forward also in the 8-wide one, for 16-bit rows) without edge
// features or dropout, and a forward without returned scores (the layer's
// usual case); the other cases run the passes above. GAT's fp32 forward
// gathers ahead too (gat_forward_ahead_kernel), on the same conditions.
// (GATv2's 16-bit forward through an 8-wide ring of its x_src rows ran 9%
// slower than its per-step packed build: H200, rmat20 4 x 32, 1.662 against
// 1.529 ms, run 131; not kept.)

// One warp's ring in shared memory: DEPTH stages of U edges, each edge ROWS
// row chunks (this lane's VEC elements of each gathered row) and EXTRA bytes
// per lane (the edge's per-head values, or none). A row's 32 chunks lie side
// by side, so a warp's reads of them are conflict-free. In the 8-wide layout
// an edge's place holds one edge of each of the warp's two edge groups (the
// group's 16 lanes' chunks each).
template <typename T, int VEC, int U, int DEPTH, int ROWS, int EXTRA>
struct GatherRing {
  static constexpr int kChunkBytes = VEC * static_cast<int>(sizeof(T));
  static constexpr int kRowBytes = kWarp * kChunkBytes;
  static constexpr int kEdgeBytes = ROWS * kRowBytes + kWarp * EXTRA;
  static constexpr int kWarpBytes = DEPTH * U * kEdgeBytes;
  static constexpr int kBlockBytes = kWarpsPerBlock * kWarpBytes;
  static constexpr int kEdgesPerStep = U;
  static constexpr int kDepth = DEPTH;
  static_assert(kEdgeBytes % 16 == 0, "every edge's chunks stay 16-byte aligned");
  char* warp_ring;
  int lane;

  __device__ __forceinline__ GatherRing(char* block_ring, int lane_id)
      : warp_ring(block_ring + (threadIdx.x / kWarp) * kWarpBytes), lane(lane_id) {}

  __device__ __forceinline__ char* chunk(int stage, int u, int r) const {
    return warp_ring + (stage * U + u) * kEdgeBytes + r * kRowBytes + lane * kChunkBytes;
  }
  __device__ __forceinline__ char* extra(int stage, int u) const {
    return warp_ring + (stage * U + u) * kEdgeBytes + ROWS * kRowBytes + lane * EXTRA;
  }
  // copies this lane's chunk of row `node` of a [N, H, C] tensor into the ring
  // (a rarely read row with the evict-first policy, see NodeWord)
  __device__ __forceinline__ void fetch(int stage, int u, int r, const T* base, const NodeWord& node,
                                        const LaneGeometry& geo, const Lane<VEC>& at, uint64_t evict_first) const {
    const T* from = row_start(base, node.id, geo) + at.offset[0];
    if (node.rare) {
      copy_ahead<kChunkBytes>(chunk(stage, u, r), from, evict_first);
    } else {
      copy_ahead<kChunkBytes>(chunk(stage, u, r), from);
    }
  }
  // an edge's two rows of one node: row 0 from `first`, row 1 from `second`
  __device__ __forceinline__ void fetch_pair(int stage, int u, const T* first, const T* second, const NodeWord& node,
                                             const LaneGeometry& geo, const Lane<VEC>& at, uint64_t evict_first) const {
    fetch(stage, u, 0, first, node, geo, at, evict_first);
    fetch(stage, u, 1, second, node, geo, at, evict_first);
  }
  __device__ __forceinline__ void read(int stage, int u, int r, Chunks<VEC>& x) const {
    to_f32<VEC>(*reinterpret_cast<const Vec<T, VEC>*>(chunk(stage, u, r)), x[0]);
  }
};

// Calls consume(stage, valid, first_slot) for the slots [begin, end) of a
// warp's item in steps of U edges per edge group (G groups: group g's u-th
// edge of step s is slot begin + s * U * G + u * G + g), each after
// fetch(stage, neighbour, mapped, valid) issued that step's copies DEPTH
// steps before, one commit group per step (an empty one past the end, so
// copy_ahead_wait<DEPTH - 1> always waits for exactly the step at hand).
// consume reads the ring before fetch refills its stage. Neighbour ids (and
// slot_map entries, when given) are read 32 at a time, one per lane, the
// next 32 as soon as the current ones come into use, and handed round by
// shuffles; a step's padding slots (valid false) fetch nothing.
template <int U, int DEPTH, int G = 1, typename Fetch, typename Consume>
__device__ __forceinline__ void for_each_step_ahead(int64_t begin, int64_t end, const IndexView& indices,
                                                    const uint32_t* __restrict__ hinted,
                                                    const int64_t* __restrict__ slot_map, int lane, Fetch&& fetch,
                                                    Consume&& consume) {
  constexpr int kStepSlots = U * G;
  static_assert(kWarp % kStepSlots == 0, "a step never straddles two batches of ids");
  const int group = lane / (kWarp / G);
  const int slots = static_cast<int>(end - begin);  // at most a tile or a light row: int
  const int steps = (slots + kStepSlots - 1) / kStepSlots;
  uint32_t ids, mapped, next_ids, next_mapped;  // the batch of 32 slots being fetched, and the one after it
  auto read_batch = [&](int first, uint32_t& id, uint32_t& map) {
    const int slot = first + lane;
    // ids and the slot map are read once: evict-first loads (__ldcs), as the rings' rare rows
    id = slot >= slots            ? 0u
         : hinted != nullptr ? __ldcs(hinted + begin + slot)
                             : static_cast<uint32_t>(indices[begin + slot]);
    map = slot_map != nullptr && slot < slots ? static_cast<uint32_t>(__ldcs(slot_map + begin + slot)) : 0;
  };
  read_batch(0, ids, mapped);
  read_batch(kWarp, next_ids, next_mapped);
  auto fetch_step = [&](int step, int stage) {
    if (step < steps) {
      const int first = step * kStepSlots;
      const int in_batch = first & (kWarp - 1);
      if (in_batch == 0 && first > 0) {
        ids = next_ids;
        mapped = next_mapped;
        read_batch(first + kWarp, next_ids, next_mapped);
      }
      uint32_t word[U], map[U];
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int slot = u * G + group;
        valid[u] = first + slot < slots;
        const int from = valid[u] ? in_batch + slot : in_batch;
        word[u] = __shfl_sync(kFullMask, ids, from);
        map[u] = slot_map != nullptr ? __shfl_sync(kFullMask, mapped, from) : 0;
      }
      NodeWord neighbour[U];
#pragma unroll
      for (int u = 0; u < U; ++u) neighbour[u] = NodeWord(word[u], hinted != nullptr);
      fetch(stage, neighbour, map, valid);
    }
    copy_ahead_commit();
  };
#pragma unroll
  for (int step = 0; step < DEPTH; ++step) fetch_step(step, step);
  int stage = 0;
  for (int step = 0; step < steps; ++step) {
    copy_ahead_wait<DEPTH - 1>();
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) valid[u] = step * kStepSlots + u * G + group < slots;
    consume(stage, valid, begin + step * kStepSlots);
    fetch_step(step + DEPTH, stage);
    stage = stage + 1 == DEPTH ? 0 : stage + 1;
  }
}

// The kernels' rings (edges per step, steps in flight, rows and extra
// bytes per edge): 6-8 KB per fp32 warp, so 3 blocks of 8 warps (their
// register bound) keep their rings in an SM's 227 KB of shared memory. The
// forward's 8-wide ring (16-bit rows, two edge groups) takes as many bytes
// as the fp32 one, so twice the edges.
template <typename T, int VEC>
using DotForwardRing = GatherRing<T, VEC, 2, 4, 2, 0>;  // key, value
template <typename T>
using DotSourceRing = GatherRing<T, 4, 2, 3, 2, sizeof(float2)>;  // grad_out, query; (lse, delta)
template <typename T>
using DotTargetRing = GatherRing<T, 4, 4, 3, 1, sizeof(float)>;  // key; s_e

// Dot's forward: for each target row, keys and values gathered ahead, the
// same arithmetic as forward_kernel's (online softmax, rescaling only where
// the maximum grows), so both give the same numbers. VEC 4, or 8 for 16-bit
// rows: the warp's two edge groups each take every other edge (as
// forward_kernel's 8-wide layout) and merge their softmax states at the end.
template <typename scalar_t, int VEC, int HEAD_LANES>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 3) dot_forward_ahead_kernel(const Params<scalar_t> p) {
  using Ring = DotForwardRing<scalar_t, VEC>;
  constexpr int U = Ring::kEdgesPerStep;
  constexpr int G = Layout<VEC>::kGroups;
  extern __shared__ __align__(16) char ring_memory[];
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Lane<VEC> lane(geo);
  const Ring ring(ring_memory, lane.lane);
  const uint64_t evict_first = l2_evict_first_policy();
  // per-row outputs come from group 0 after the groups' merge
  const bool row_lane = lane.group == 0;
  const bool writer = lane.head_ok && lane.in_head == 0 && row_lane;

  for_each_item<true>(p, lane.lane, [&](const WorkItem& item) {
    Chunks<VEC> query, acc;
    load_row<VEC, scalar_t, true>(p.dst_vec, item.row, geo, lane, query);
    // a light row's residual comes in the same round of loads as its query (see LoadedResidual)
    LoadedResidual<VEC> residual;
    residual.loaded = p.out_residual != nullptr && item.partial < 0;
    if (residual.loaded) load_row<VEC, scalar_t, true>(p.out_residual, item.row, geo, lane, residual.values);
    set_zero<VEC>(acc);
    float run_max = -INFINITY, run_sum = 0.f;
    for_each_step_ahead<U, Ring::kDepth, G>(
        item.begin, item.end, p.indices, p.hinted, nullptr, lane.lane,
        [&](int stage, const NodeWord(&source)[U], const uint32_t(&)[U], const bool(&valid)[U]) {
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (valid[u]) ring.fetch_pair(stage, u, p.key_src, p.msg_src, source[u], geo, lane, evict_first);
        },
        [&](int stage, const bool(&valid)[U], int64_t) {
          float score[U];
          float new_max = run_max;
#pragma unroll
          for (int u = 0; u < U; ++u) {
            Chunks<VEC> key;
            ring.read(stage, u, 0, key);
            score[u] = lane_sum<VEC, HEAD_LANES>(dot<VEC>(query, key), geo, lane) * p.scale;
            if (valid[u]) new_max = fmaxf(new_max, score[u]);
          }
          if (new_max != run_max) {  // see forward_kernel
            const float correction = softmax_exp(run_max - new_max);
            run_sum *= correction;
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[0][v] *= correction;
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            Chunks<VEC> value;
            ring.read(stage, u, 1, value);
            const float weight = softmax_exp(score[u] - new_max);
            run_sum += weight;
            add_scaled<VEC>(acc, weight, value);
          }
          run_max = new_max;
        });
    if constexpr (G == 2) merge_groups<VEC>(run_max, run_sum, acc);
    if (row_lane) finish_forward_item<VEC, scalar_t, true>(p, item, geo, lane, writer, run_max, run_sum, acc, residual);
  }, [&](int64_t row) {
    if (row_lane) forward_empty_row<VEC, scalar_t, true>(p, row, geo, lane, writer);
  });
}

// GAT's forward with fp32 features, x_src rows gathered ahead with each
// edge's alpha_src: the rows are only summed (the score is alpha_src +
// alpha_dst, a scalar per head), so the pass is a gather bound by its loads
// in flight, and the ring keeps DEPTH steps of them in flight. Same
// arithmetic as forward_kernel's GAT (step_partials, finish_score), so both
// give the same numbers. H100, rmat20 4 x 32, forward (switches bench, four
// machines, runs 149-152): 2.15-2.31 ms per step, 1.89-2.04 through the ring.
// The 16-bit forward stays per step: its 8-wide build through such a ring
// ran 4% faster on one machine and 4-7% slower on two (1.33-1.60 against
// 1.39-1.50 ms): at 0.73 instructions issued per scheduler and cycle (ncu)
// it is bound by its instructions, not by its loads in flight. Without L2
// hints: they took nothing off (1.979 against 1.973 ms).
using GatForwardRing = GatherRing<float, 4, 4, 3, 1, sizeof(float)>;  // x_src; alpha_src

// A template (scalar_t is float) so that only gat.cu, whose forward launches it, compiles it.
template <typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 3) gat_forward_ahead_kernel(const Params<scalar_t> p) {
  static_assert(std::is_same<scalar_t, float>::value, "GAT's forward gathers ahead for fp32 features");
  using Ring = GatForwardRing;
  constexpr int U = Ring::kEdgesPerStep;
  extern __shared__ __align__(16) char ring_memory[];
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Lane<4> lane(geo);
  const Ring ring(ring_memory, lane.lane);
  const int scalar_head = lane.head_ok ? lane.head : 0;  // a lane past the heads copies a real alpha_src
  const bool writer = lane.head_ok && lane.in_head == 0;

  for_each_item<true>(p, lane.lane, [&](const WorkItem& item) {
    const float alpha_dst = load_scalar(p.dst_scalar, item.row, geo, lane.head, lane.head_ok);
    Chunks<4> acc;
    set_zero<4>(acc);
    float run_max = -INFINITY, run_sum = 0.f;
    for_each_step_ahead<U, Ring::kDepth>(
        item.begin, item.end, p.indices, nullptr, nullptr, lane.lane,
        [&](int stage, const NodeWord(&source)[U], const uint32_t(&)[U], const bool(&valid)[U]) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            ring.fetch(stage, u, 0, p.msg_src, source[u], geo, lane, 0);
            const uint64_t scalar = static_cast<uint64_t>(source[u].id) * geo.heads + scalar_head;
            copy_ahead<sizeof(float)>(ring.extra(stage, u), p.src_scalar + scalar);
          }
        },
        [&](int stage, const bool(&valid)[U], int64_t) {
          float score[U];
          float new_max = run_max;
#pragma unroll
          for (int u = 0; u < U; ++u) {
            score[u] = leaky_relu(*reinterpret_cast<const float*>(ring.extra(stage, u)) + alpha_dst, p.slope);
            if (valid[u]) new_max = fmaxf(new_max, score[u]);
          }
          if (new_max != run_max) {  // see forward_kernel
            const float correction = softmax_exp(run_max - new_max);
            run_sum *= correction;
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[0][v] *= correction;
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            Chunks<4> message;
            ring.read(stage, u, 0, message);
            const float weight = softmax_exp(score[u] - new_max);
            run_sum += weight;
            add_scaled<4>(acc, weight, message);
          }
          run_max = new_max;
        });
    finish_forward_item<4, float, true>(p, item, geo, lane, writer, run_max, run_sum, acc);
  }, [&](int64_t row) {
    forward_empty_row<4, float, true>(p, row, geo, lane, writer);
  });
}

// Dot's source pass: for each source row, the gradients of its value and
// key from its out-edges' targets (grad_out and query rows, and (lse,
// delta)), gathered ahead; each edge's s_e written as backward_source_kernel
// writes it, from the same arithmetic.
template <typename scalar_t, int HEAD_LANES>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 3) dot_source_ahead_kernel(const Params<scalar_t> p) {
  using Ring = DotSourceRing<scalar_t>;
  constexpr int U = Ring::kEdgesPerStep;
  extern __shared__ __align__(16) char ring_memory[];
  const LaneGeometry geo = p.geo;
  const Lane<4> lane(geo);
  const Ring ring(ring_memory, lane.lane);
  const uint64_t evict_first = l2_evict_first_policy();
  const bool writer = lane.head_ok && lane.in_head == 0;
  const int stats_head = lane.head_ok ? lane.head : 0;  // lanes past the heads read head 0's and ignore it

  for_each_item<true>(p, lane.lane, [&](const WorkItem& item) {
    Chunks<4> value, key, value_grad, key_grad;
    load_row<4, scalar_t, true>(p.msg_src, item.row, geo, lane, value);
    load_row<4, scalar_t, true>(p.key_src, item.row, geo, lane, key);
    set_zero<4>(value_grad);
    set_zero<4>(key_grad);
    for_each_step_ahead<U, Ring::kDepth>(
        item.begin, item.end, p.indices, p.hinted, nullptr, lane.lane,
        [&](int stage, const NodeWord(&target)[U], const uint32_t(&)[U], const bool(&valid)[U]) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            ring.fetch_pair(stage, u, p.grad_out, p.dst_vec, target[u], geo, lane, evict_first);
            const float* stats =
                p.row_stats + (static_cast<uint64_t>(target[u].id) * geo.heads + stats_head) * row_stats_width(kDot);
            copy_ahead<sizeof(float2)>(ring.extra(stage, u), stats);
          }
        },
        [&](int stage, const bool(&valid)[U], int64_t first_slot) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            Chunks<4> grad, query;
            ring.read(stage, u, 0, grad);
            ring.read(stage, u, 1, query);
            const float2 lse_delta = *reinterpret_cast<const float2*>(ring.extra(stage, u));
            const float score = lane_sum<4, HEAD_LANES>(dot<4>(query, key), geo, lane) * p.scale;
            const float dp = lane_sum<4, HEAD_LANES>(dot<4>(grad, value), geo, lane);
            if (!valid[u]) continue;
            const float prob = softmax_exp(score - lse_delta.x);
            const float score_grad = prob * (dp - lse_delta.y);
            add_scaled<4>(value_grad, prob, grad);
            add_scaled<4>(key_grad, score_grad * p.scale, query);
            if (p.edge_grads && writer) __stcs(p.edge_grads + (first_slot + u) * geo.heads + lane.head, score_grad * p.scale);
          }
        });
    if (item.partial < 0) {
      store_row_at<4, scalar_t, true>(p.grad_vec + item.row * p.grad_vec_stride, lane, value_grad);
      store_row<4, scalar_t, true>(p.grad_vec2, item.row, geo, lane, key_grad);
    } else {
      store_row<4>(p.part_vec, item.partial, geo, lane, value_grad);
      store_row<4>(p.part_vec2, item.partial, geo, lane, key_grad);
    }
  }, [&](int64_t row) {
    Chunks<4> zero;
    set_zero<4>(zero);
    store_row_at<4, scalar_t, true>(p.grad_vec + row * p.grad_vec_stride, lane, zero);
    store_row<4, scalar_t, true>(p.grad_vec2, row, geo, lane, zero);
  });
}

// Dot's target pass from the source pass's s_e: d query[t] = sum_e s_e key_s,
// key rows and s_e gathered ahead (dot_target_from_edges_kernel's sums, in
// the same order).
template <typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 3) dot_target_ahead_kernel(const Params<scalar_t> p) {
  using Ring = DotTargetRing<scalar_t>;
  constexpr int U = Ring::kEdgesPerStep;
  extern __shared__ __align__(16) char ring_memory[];
  const LaneGeometry geo = p.geo;
  const Lane<4> lane(geo);
  const Ring ring(ring_memory, lane.lane);
  const uint64_t evict_first = l2_evict_first_policy();
  const int grad_head = lane.head_ok ? lane.head : 0;

  for_each_item<true>(p, lane.lane, [&](const WorkItem& item) {
    Chunks<4> sum;
    set_zero<4>(sum);
    for_each_step_ahead<U, Ring::kDepth>(
        item.begin, item.end, p.indices, p.hinted, p.edge_grad_slot, lane.lane,
        [&](int stage, const NodeWord(&source)[U], const uint32_t(&slot)[U], const bool(&valid)[U]) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            ring.fetch(stage, u, 0, p.key_src, source[u], geo, lane, evict_first);
            // each s_e is read once: evict-first always
            copy_ahead<sizeof(float)>(ring.extra(stage, u),
                                      p.edge_grads_in + static_cast<uint64_t>(slot[u]) * geo.heads + grad_head,
                                      evict_first);
          }
        },
        [&](int stage, const bool(&valid)[U], int64_t) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!valid[u]) continue;
            Chunks<4> key;
            ring.read(stage, u, 0, key);
            add_scaled<4>(sum, *reinterpret_cast<const float*>(ring.extra(stage, u)), key);
          }
        });
    if (item.partial < 0) {
      store_row<4, scalar_t, true>(p.grad_vec, item.row, geo, lane, sum);
    } else {
      store_row<4>(p.part_vec, item.partial, geo, lane, sum);
    }
  }, [&](int64_t row) {
    Chunks<4> zero;
    set_zero<4>(zero);
    store_row<4, scalar_t, true>(p.grad_vec, row, geo, lane, zero);
  });
}


}  // namespace
}  // namespace attention
}  // namespace gnnio
