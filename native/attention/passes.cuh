// Fused attention aggregation (GAT, GATv2, TransformerConv, AGNN): score,
// softmax over each target's in-edges and weighted sum in one pass, forward
// and backward, with no per-edge tensor in device memory (except the gradient
// of a per-edge input, which is itself per-edge).
//
// Forward walks the CSR (one row per target) with an online softmax and saves
// only lse[t, h] = log(sum exp(score)) besides the output. Backward:
//   - a CSR pass recomputes the scores of each target's in-edges and gives the
//     target-side gradients (query, x_dst, alpha_dst), the attention-vector
//     partials (one row per resident warp, summed in a second step) and
//     delta[t, h] = <grad_out[t, h], out[t, h]>, summed from the recomputed terms;
//   - a CSC pass (one row per source) recomputes them once more and gives the
//     source-side gradients (key, value, x_src, alpha_src) and the per-edge ones.
// GAT and Dot in fp32 run the other way round (the host picks): delta from the
// saved output (attention_row_dots), the CSC pass first, which also writes
// each edge's score gradient s_e in its own (CSC) slot order, then a CSR pass
// that only sums s_e (GAT's d alpha_dst) or s_e * key (Dot's d query): one
// gathered row per edge or none, against two for the recomputing CSR pass.
// With p = exp(score - lse), w = p * dropout and dp = dropout * <g_t, message>:
//   d score = p * (dp - delta),  d message = w * g_t.
// Every pass is a gather, never a scatter of sums (s_e is written once per
// edge): no atomics, deterministic results. Dot's three passes in the 4-wide
// layout without edge features or dropout have kernels of their own that
// gather ahead through shared memory with L2 hints (section "Dot's passes,
// rows gathered ahead").
//
// AGNN (kind Cosine), per head, with n_s = |x_s|, m_s = max(n_s, eps),
// a_s = [n_s >= eps], u_s = x_s / m_s (F.normalize, eps = 1e-12):
//   c_e = <x_t, x_s> / m_s / m_t (= <u_t, u_s>),  score_e = beta * c_e,  out_t = sum_e p_e x_s.
// The kernels read the rows x themselves (exact in every dtype: a unit row
// rounded to 16 bits costs the beta gradient of a 16-bit layer several
// times PyTorch's own error) and fp32 norms: per edge one gathered row and
// one scalar give both the score and the message. With dp_e = drop_e * <g_t, x_s>
// and d score_e = p_e * (dp_e - delta_t) as above:
//   d beta       = sum_e d score_e * c_e                  (target pass, per-warp partials)
//   A_t = d u_t  = beta * sum_{e into t} d score_e * u_s  (target pass)
//   B_s = d u_s  = beta * sum_{e out of s} d score_e * u_t (source pass, through the scores)
//   V_s          = sum_{e out of s} p_e * drop_e * g_t     (source pass, through the messages)
// The message is x_s itself, so its gradient V reaches x_src as is; the
// cosine reaches x through u = x / m, d x = (d u - a <d u, u> u) / m. So
//   d x_src = V + (G - a <G, u> u) / m  with G = B (+ A when x_dst is x_src),
//   d x_dst = (A - a <A, u_dst> u_dst) / m_dst  otherwise;
// The source pass applies the first at the end of each light row (A read
// back from the target pass); attention_unit_rows_backward (u = x / m
// computed there) does it for the heavy rows' summed tiles and gives d x_dst.
//
// 16-bit features: GATv2's hidden terms are rounded to the features' type
// as PyTorch's 16-bit layer rounds them (gatv2_hidden); the 16-bit forward
// of 32-channel GATv2 heads and 128-channel Cosine heads sums its scores on
// the tensor cores (packed_head_dots). Every product and sum is fp32.
//
// Rows longer than the schedule's tile are cut into tiles of one warp each
// (common.cuh's RowSchedule); forward tiles keep (max, sum, accumulator)
// partial softmax states merged by a second kernel, backward tiles keep
//
// This header: the pieces every pass shares (Params, the lane layout over a
// row's heads and channels, row loads and stores, edges per step, the walk
// over a pass's work items and steps, each kind's score arithmetic).
#pragma once

#include "device.cuh"

#include <cmath>
#include <type_traits>

namespace gnnio {
namespace attention {
namespace {

template <typename scalar_t>
struct Params {
  RowSchedule schedule;  // the rows walked: CSR for forward and the target-side pass, CSC for the source side
  IndexView indices;     // the neighbour of each slot
  const int64_t* eid;    // original edge id of each slot
  // Dot's passes that gather ahead: the neighbour ids with bit 31 set where the
  // neighbour's rows are rarely read (see hinted_indices in attention_native.py), or null
  const uint32_t* hinted;
  LaneGeometry geo;
  // Light rows (at most tile_edges slots), [L, 3] (row, first slot, end
  // slot): the non-empty ones by descending length, then the empty ones.
  // See for_each_item.
  const int64_t* row_bounds;
  int64_t num_busy_rows;
  int64_t num_empty_rows;

  const scalar_t* msg_src;     // [Ns, H, C] x_src (GAT, GATv2, Cosine) or value (Dot)
  const scalar_t* key_src;     // [Ns, H, C] key (Dot)
  const scalar_t* dst_vec;     // [Nd, H, C] x_dst (GATv2, Cosine) or query (Dot)
  const float* src_norm;       // [Ns, H, 2] fp32 (|x_src|, 1 / max(|x_src|, floor)) (Cosine: row_norm_of)
  const scalar_t* unit_grad;   // [Ns, H, C] Cosine source pass: d u_dst from the target pass when x_dst is x_src
  const float* dst_norm;       // [Nd, H, 2] fp32 (|x_dst|, 1 / max(|x_dst|, floor)) (Cosine)
  const float* beta;           // [H] fp32 score factor (Cosine)
  const scalar_t* src_scalar;  // [Ns, H] alpha_src (GAT)
  const scalar_t* dst_scalar;  // [Nd, H] alpha_dst (GAT)
  const scalar_t* att;         // [H, C] (GATv2)
  const scalar_t* edge;        // [E, H, C] (GATv2, Dot) or [E, H] (GAT) in eid order, or null
  float slope;
  float scale;
  Dropout dropout;

  // forward outputs
  const scalar_t* out_bias;      // [H, C] added to every output row (a layer's output bias), or null
  const scalar_t* out_residual;  // [Nd, H, C] added row by row (a layer's skip connection), or null
  scalar_t* out;
  // 16-bit features with an fp32 output (GAT and Dot; see host.cuh's forward_impl): out is null and the
  // rows go here, the output bias (then fp32 too) comes from out_bias_f32; null otherwise
  float* out_f32;
  const float* out_bias_f32;
  float* lse;
  float* scores;              // [E, H] raw scores in eid order, or null
  bool scores_after_dropout;  // write -inf for dropped edges
  const float* scores_in;     // [E, H] raw scores in slot order (edge-balanced schedule), or null
  float* part_max;
  float* part_sum;
  float* part_acc;

  // backward inputs and outputs
  const scalar_t* grad_out;
  const float* lse_in;  // target pass
  // source pass: per (target, head) its softmax statistics, [Nd, H, row_stats_width(KIND)] fp32:
  // (lse, delta), and 1 / max(|x_dst|, floor) third for Cosine; one gathered sector per edge
  const float* row_stats;
  scalar_t* grad_vec;     // target pass: d query / d x_dst; source pass: d value / d x_src
  scalar_t* grad_vec2;    // source pass, Dot: d key
  scalar_t* grad_scalar;  // GAT: d alpha_dst (target pass) / d alpha_src (source pass)
  // elements between rows of grad_vec and grad_scalar: H * C and H, or for GAT's packed
  // gradients both H * C + 2H (see gat.cu: packed_grads)
  int64_t grad_vec_stride;
  int64_t grad_scalar_stride;
  scalar_t* grad_edge;
  // GAT and Dot: each edge's score gradient s_e, fp32 [E, H] in CSC slot order, written
  // by the source pass (edge_grads) and summed by gat_target_sums_kernel or
  // dot_target_from_edges_kernel (edge_grads_in, at edge_grad_slot[its CSR slot])
  float* edge_grads;
  const float* edge_grads_in;
  const int64_t* edge_grad_slot;
  float* stats_out;  // target pass: per (target, head) (lse, delta[, 1 / |x_dst|, 0]), the source pass's row_stats
  float* att_partial;  // [resident warps, H, C] (GATv2) or [resident warps, H] (Cosine: d beta)
  float* part_vec;
  float* part_vec2;
  float* part_scalar;   // GAT: alpha sums; Cosine target pass: the tile's d beta sums
  float* part_scalar2;
  float* part_delta;
  float* part_att;
  float* part_att2;
};

// Where this lane sits: its edge group (Layout), its head and, per chunk k,
// its first channel.
template <int VEC>
struct Lane {
  static constexpr int K = Layout<VEC>::kChunks;
  int lane;
  int group;    // which of the warp's edge groups (0 unless VEC == 8)
  int in_head;  // position among the head's lanes
  int head;
  bool head_ok;
  int col[K];
  int offset[K];  // head * C + col[k] inside a [H, C] row; 0 where masked
  bool ok[K];

  __device__ __forceinline__ explicit Lane(const LaneGeometry& geo) {
    constexpr int kGroupLanes = Layout<VEC>::kGroupLanes;
    lane = threadIdx.x & (kWarp - 1);
    group = lane / kGroupLanes;
    in_head = lane & (geo.lanes_per_head - 1);
    head = blockIdx.y * geo.heads_per_warp + (lane & (kGroupLanes - 1)) / geo.lanes_per_head;
    head_ok = head < geo.heads;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      col[k] = (k * geo.lanes_per_head + in_head) * VEC;
      ok[k] = head_ok && col[k] < geo.channels;
      offset[k] = ok[k] ? head * geo.channels + col[k] : 0;
    }
  }
};

// Row `index` of a [rows, H, C] tensor of T. Row indices (node, edge and tile
// ids) are below 2^32 (checked on the host), so the byte offset is one 32 x 32
// -> 64-bit multiply-add instead of two 64-bit multiplies per gathered row.
template <typename T>
__device__ __forceinline__ T* row_start(T* base, int64_t index, const LaneGeometry& geo) {
  const uint32_t row_bytes = static_cast<uint32_t>(geo.heads * geo.channels * sizeof(T));
  using Byte = typename std::conditional<std::is_const<T>::value, const char, char>::type;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) +
                              static_cast<uint64_t>(static_cast<uint32_t>(index)) * row_bytes);
}

// a * b as one 32 x 32 -> 64-bit multiply (mul.wide.u32). Written in PTX
// because the compiler turns the C++ form, uint64_t(a) * b, into a 64-bit
// multiply here, which ptxas expands with adds of zero upper words; callers
// add the product to their base in C++, so the load stays a global one (LDG),
// not a generic one.
__device__ __forceinline__ uint64_t wide_product(uint32_t a, uint32_t b) {
  uint64_t product;
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(product) : "r"(a), "r"(b));
  return product;
}

// fp32 values of one row's chunks in this lane.
template <int VEC>
using Chunks = float[Layout<VEC>::kChunks][VEC];

// This lane's chunks of one row of a [rows, H, C] tensor as gathered, not
// yet converted to fp32. The forward keeps its step's rows this way: 16-bit
// rows take half the registers of fp32 ones, so the 8-wide layout keeps
// twice the edges' loads in flight (what bounds these latency-bound
// gathers), and converts each row where it is used (unpack), once for the
// score and once for the sum. For fp32 it is the row itself.
template <int VEC, typename T>
struct Gathered {
  Vec<T, VEC> chunk[Layout<VEC>::kChunks];
};

// Loads need no branch, so the compiler can issue all of a step's loads back
// to back. The padding slots of a step read a real row (for_each_step) whose
// values the caller ignores. ONCE: a row the kernel reads once (a target's own
// row, a residual), loaded evict-first (load_vec_once).
template <int VEC, typename T, bool ONCE = false>
__device__ __forceinline__ void gather_row(const T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                           const Lane<VEC>& lane, Gathered<VEC, T>& x) {
  const T* row = row_start(base, node, geo);
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
    x.chunk[k] = ONCE ? load_vec_once<T, VEC>(row + lane.offset[k]) : load_vec<T, VEC>(row + lane.offset[k]);
}

// gather_row for the one-chunk layouts from this lane's own base,
// lane_base = the tensor's start + lane.offset[0] elements (in bytes), so
// each gathered row costs one wide multiply-add and no per-row add of the
// lane's offset. GAT's plain 16-bit forward: its step loop went from 227 to
// 188 instructions (sm_90a). Only there: elsewhere the base's two extra
// registers made builds spill.
template <int VEC, typename T>
__device__ __forceinline__ void gather_row_from_lane_base(const char* lane_base, int64_t node, uint32_t row_bytes,
                                                          Gathered<VEC, T>& x) {
  static_assert(Layout<VEC>::kChunks == 1, "one chunk per lane");
  x.chunk[0] = load_vec<T, VEC>(
      reinterpret_cast<const T*>(lane_base + wide_product(static_cast<uint32_t>(node), row_bytes)));
}

// A gathered row as fp32. Chunks past the head's channels read the row's
// first elements instead (lane.offset): in the 8-chunk layout they are set
// to 0 here; in the 4- and 8-wide layouts (one chunk per lane) a lane is
// inside its head or wholly outside it, and an outside lane keeps what it
// read, since nothing of it reaches a result: head sums take only the lanes
// inside (lane_sum) and stores skip the others. That saves a select per
// gathered element.
template <int VEC, typename T>
__device__ __forceinline__ void unpack(const Gathered<VEC, T>& x, const Lane<VEC>& lane, Chunks<VEC>& out) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k) {
    to_f32<VEC>(x.chunk[k], out[k]);
    if constexpr (Layout<VEC>::kChunks > 1) {
      const bool use = lane.ok[k];
#pragma unroll
      for (int v = 0; v < VEC; ++v) out[k][v] = use ? out[k][v] : 0.f;
    }
  }
}

// This lane's chunks of row `node` as fp32 (gather_row, then unpack).
template <int VEC, typename T, bool ONCE = false>
__device__ __forceinline__ void load_row(const T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                         const Lane<VEC>& lane, Chunks<VEC>& x) {
  Gathered<VEC, T> gathered;
  gather_row<VEC, T, ONCE>(base, node, geo, lane, gathered);
  unpack<VEC>(gathered, lane, x);
}

// The sum of a head's shares over its lanes, counting only the lanes inside
// the head's channels (an outside lane's share is whatever its rows held,
// see load_row; selected away, so not even an inf or NaN of theirs leaks).
// HEAD_LANES: 0, or the lanes per head the kernel was built for (see
// fixed_head_lanes).
template <int VEC, int HEAD_LANES = 0>
__device__ __forceinline__ float lane_sum(float share, const LaneGeometry& geo, const Lane<VEC>& lane) {
  const float mine = lane.ok[0] ? share : 0.f;
  if constexpr (HEAD_LANES > 0) return head_sum<HEAD_LANES>(mine, HEAD_LANES);
  return head_sum<Layout<VEC>::kGroupLanes>(mine, geo.lanes_per_head);
}

// This lane's chunks of one [H, C] row starting at `row`. ONCE: with the
// evict-first cache policy (store_vec_once), for results a pass writes once
// and does not read back, so that they leave L2 before the rows it gathers
// (the passes that gather ahead).
template <int VEC, typename T, bool ONCE = false>
__device__ __forceinline__ void store_row_at(T* __restrict__ row, const Lane<VEC>& lane,
                                             const float (&x)[Layout<VEC>::kChunks][VEC]) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k) {
    if (lane.ok[k]) store_f32<VEC, T, ONCE>(row + lane.offset[k], x[k]);
  }
}

template <int VEC, typename T, bool ONCE = false>
__device__ __forceinline__ void store_row(T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                          const Lane<VEC>& lane, const float (&x)[Layout<VEC>::kChunks][VEC]) {
  store_row_at<VEC, T, ONCE>(row_start(base, node, geo), lane, x);
}

template <typename T>
__device__ __forceinline__ float load_scalar(const T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                             int head, bool valid) {
  return valid ? static_cast<float>(base[static_cast<uint64_t>(static_cast<uint32_t>(node)) * geo.heads + head]) : 0.f;
}

// load_scalar with the row's offset from wide_product (GAT's plain 16-bit
// forward, alpha_src per edge; elsewhere it made the step longer).
template <typename T>
__device__ __forceinline__ float load_scalar_wide(const T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                                  int head, bool valid) {
  const char* at = reinterpret_cast<const char*>(base + head) +
                   wide_product(static_cast<uint32_t>(node), static_cast<uint32_t>(geo.heads * sizeof(T)));
  return valid ? static_cast<float>(*reinterpret_cast<const T*>(at)) : 0.f;
}

template <int VEC>
__device__ __forceinline__ void set_zero(Chunks<VEC>& x) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) x[k][v] = 0.f;
}

template <int VEC>
__device__ __forceinline__ float dot(const Chunks<VEC>& a, const Chunks<VEC>& b) {
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) sum += a[k][v] * b[k][v];
  return sum;
}

// acc += weight * x
template <int VEC>
__device__ __forceinline__ void add_scaled(Chunks<VEC>& acc, float weight, const Chunks<VEC>& x) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[k][v] += weight * x[k][v];
}

template <int VEC>
__device__ __forceinline__ void add_to(Chunks<VEC>& acc, const Chunks<VEC>& x) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[k][v] += x[k][v];
}

// GATv2's score terms: hidden = x_src + x_dst (+ edge), summed in that
// order everywhere, and its activation leaky_relu(hidden), so every pass
// recomputes the same score. With 16-bit features each sum and the
// negative side's slope * hidden are rounded to the features' type (the
// slope itself taken in that type, on the host), as PyTorch's 16-bit layer
// rounds them and as the packed forward's bf16x2 / half2 arithmetic does
// (packed_gatv2_scores): the forward and both backward passes agree to the
// order of their fp32 sums.
template <int VEC, typename T>
__device__ __forceinline__ void gatv2_hidden(Chunks<VEC>& hidden, const Chunks<VEC>& a, const Chunks<VEC>& b) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) hidden[k][v] = rounded<T>(a[k][v] + b[k][v]);
}

template <typename T>
__device__ __forceinline__ float gatv2_activation(float hidden, float slope) {
  return hidden > 0.f ? hidden : rounded<T>(hidden * slope);
}

template <int VEC, typename T>
__device__ __forceinline__ float gatv2_partial(const Chunks<VEC>& att, const Chunks<VEC>& hidden, float slope) {
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) sum += att[k][v] * gatv2_activation<T>(hidden[k][v], slope);
  return sum;
}

// How the 4-wide layout (one chunk per lane: C % 4 == 0, C <= 128) trades
// warps for loads in flight. The kernels are latency-bound gathers: a warp
// spends most of a short row waiting on the row's bounds, then the neighbour
// ids, then the neighbour rows. Each step issues all of its edges' row loads before the
// first use (no branch between them, or the compiler serialises them: one
// full memory latency per edge), and other warps hide the rest. Each kernel
// is compiled for at least 3 resident 256-thread blocks per SM
// (__launch_bounds__'s second argument caps registers at 64K / (blocks * 256)
// = 80): forward with 3-4 edges' rows in flight per step (at 64 registers the
// batch spilled 140-356 bytes), backward with 2-3 (edges_per_step below),
// since each edge brings two rows there and the row state (gradient sums) is
// larger. The 8-chunk scalar layout, used only for odd or very wide heads,
// keeps 8x the state per lane and stays uncapped. (The forward's count is
// forward_blocks_per_sm, after the packed builds it depends on.)

// GAT's backward passes gather one row per edge and keep scalar scores: they
// fit 64 registers, so 4 blocks per SM. VEC 8 (16-bit, two edge groups)
// keeps 8 fp32 values per row sum and gathered row where VEC 4 keeps 4:
// 3 blocks for GAT, 2 for the others (registers: see target_edges_per_step).
template <int KIND, int VEC>
constexpr int backward_blocks_per_sm() {
  if constexpr (VEC == 8) return KIND == kGat ? 3 : 2;
  return VEC == 4 ? (KIND == kGat ? 4 : 3) : 1;
}

// Edges per step: all their loads are issued before any score is reduced.
// In the 4-wide layout, as many as fit in the 80 registers without spilling
// (ptxas, sm_90, fp32 and bf16): Dot's target pass and GATv2's source pass
// fit 3; Dot's forward keeps key and value rows, so 3 as well. GAT's backward
// passes stay at 2: at 64 registers they keep 4 blocks per SM resident, and
// 4 edges (72-80 registers) cost that block and 7% of GAT's fwd+bwd time
// on rmat20 (H100). Cosine gathers one row per edge in forward and in the
// target pass (x_src: message, and over its norm the cosine's other side): 4
// edges per forward step as GAT and GATv2, 2 in the target pass (3 spilled
// 88 B and measured 3.6% slower fwd+bwd on rmat20); its source pass gathers
// two rows (g_t, u_t) as Dot's does, so 2 as well. VEC 8 (16-bit forward,
// two edge groups, rows kept gathered: see Gathered): 4 edges per group for
// GAT and Cosine, 2 for GATv2 and Dot. Measured on rmat20 (H100, bf16
// forward, 4 x 32, one run) against 2 and 1: GAT 1.63 -> 1.47 (3 edges)
// -> 1.41 ms, Dot 2.60 -> 2.12, Cosine 2.34 -> 2.28 (3 edges) -> 2.15,
// GATv2 2.39 -> 2.29, although Cosine spills 40 B and GATv2 144 B at 80
// registers. Two blocks per SM (128 registers, 4-6 edges per group, no
// spill) was 9-35% slower: fewer warps hide less latency than more edges
// per warp do.
template <int KIND, int VEC>
constexpr int forward_edges_per_step() {
  return VEC == 8 ? (KIND == kGat || KIND == kCosine ? 4 : 2) : VEC != 4 ? 2 : KIND == kDot ? 3 : 4;
}

// VEC 8 (16-bit backward passes, two edge groups): 2 edges per group, 4 per
// warp step, against the 4-wide layout's 2-3 per warp: each instruction that
// is not per-element arithmetic serves two edges, as in the forward. At 2
// blocks per SM (3 for GAT, backward_blocks_per_sm) ptxas (sm_90a) keeps
// them in 70-128 registers; GAT's source pass spills 24-32 bytes, GATv2's
// target pass (four row sums besides its gathered rows) 32 (bf16) to 76 (fp16).
template <int KIND, int VEC>
constexpr int target_edges_per_step() {
  return VEC == 4 && KIND == kDot ? 3 : 2;
}

template <int KIND, int VEC>
constexpr int source_edges_per_step() {
  return VEC == 4 && KIND == kGatV2 ? 3 : 2;
}

// VEC 8 (two edge groups): the row sums of one group added to the other's,
// so both halves of the warp end a row with its whole sums (the forward's
// merge_groups for plain sums). One addition of two numbers is the same
// either way round, so both halves hold the same bits: deterministic.
__device__ __forceinline__ float merged_groups(float value) {
  return value + __shfl_xor_sync(kFullMask, value, kWarp / 2);
}

template <int VEC>
__device__ __forceinline__ void merge_group_sums(Chunks<VEC>& x) {
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) x[k][v] = merged_groups(x[k][v]);
}

// Cosine's norms are fp32 [N, H, 2]: per (row, head) |x| and 1 / max(|x|,
// floor), both from attention_row_norms. The edge passes take the inverse
// as it is: a division on each edge's chain cost AGNN's source pass 19% in
// bf16 (H100, rmat20, run 169). Lanes past the heads read 0.
// entry `column` (0: |x|, 1: the inverse) of this lane's head of row `node`
template <int VEC>
__device__ __forceinline__ float norm_entry(const float* norms, int64_t node, const LaneGeometry& geo,
                                            const Lane<VEC>& lane, int column) {
  return lane.head_ok
             ? norms[(static_cast<uint64_t>(static_cast<uint32_t>(node)) * geo.heads + lane.head) * 2 + column]
             : 0.f;
}

template <int VEC>
__device__ __forceinline__ float row_norm_of(const float* norms, int64_t node, const LaneGeometry& geo,
                                             const Lane<VEC>& lane) {
  return norm_entry<VEC>(norms, node, geo, lane, 0);
}

template <int VEC>
__device__ __forceinline__ float inverse_norm_of(const float* norms, int64_t node, const LaneGeometry& geo,
                                                 const Lane<VEC>& lane) {
  return norm_entry<VEC>(norms, node, geo, lane, 1);
}

// Cosine's per-edge terms over one step's gathered source rows x_src
// (forward and target pass): 1 / max(|x_src|, floor), which with the
// target's own factor turns the head's <x_dst, x_src> into the cosine, and
// this lane's share of that dot product; the source row itself is the message.
template <int VEC, int U, typename scalar_t>
__device__ __forceinline__ void cosine_terms(const Params<scalar_t>& p, const int64_t (&neighbour)[U],
                                             const LaneGeometry& geo, const Lane<VEC>& lane, const Chunks<VEC>& target,
                                             const Chunks<VEC> (&source)[U], float (&inverse_norm)[U],
                                             float (&partial)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    inverse_norm[u] = inverse_norm_of<VEC>(p.src_norm, neighbour[u], geo, lane);
#pragma unroll
  for (int u = 0; u < U; ++u) partial[u] = dot<VEC>(target, source[u]);
}

// The factor of <q, k> in the score: scale (Dot) or beta[head] * scale (Cosine).
template <int KIND, typename scalar_t>
__device__ __forceinline__ float score_factor(const Params<scalar_t>& p, int head, bool head_ok) {
  if constexpr (KIND == kCosine) return head_ok ? p.beta[head] * p.scale : 0.f;
  return p.scale;
}

// A neighbour id as for_each_step_ahead hands it round: with hints (Params::
// hinted) bit 31 says the node's rows are rarely read, and the fetches give
// them L2's evict-first policy, so the rows of the nodes read most stay in
// L2 longer; without, the id is all 32 bits.
struct NodeWord {
  uint32_t id;
  bool rare;
  NodeWord() = default;
  __device__ __forceinline__ NodeWord(uint32_t word, bool hinted)
      : id(hinted ? word & 0x7fffffffu : word), rare(hinted && (word >> 31) != 0) {}
};

// The original edge ids of one step's slots, shuffled from the lane that read
// them only where a kernel needs one (edge features, dropout, per-edge
// outputs), so no register holds U edge ids across the step's loads. Call it
// from warp-uniform code only: it is a full-warp shuffle.
struct StepEdges {
  uint32_t mine;   // this lane's slot's edge id (0 when the kernel reads none)
  int first;       // lane holding this lane's group's first slot of the step
  int stride;      // edge groups of the warp: the group's u-th slot is first + u * stride
  int count;       // slots held by the lanes
  int64_t base;    // the slot the lanes' first one is
  uint32_t mapped_mine;  // this lane's slot's entry of for_each_step's slot_map (0 without one)

  __device__ __forceinline__ int64_t operator()(int u) const {
    const int index = first + u * stride;
    return static_cast<int64_t>(__shfl_sync(kFullMask, mine, index < count ? index : 0));
  }
  // slot_map's entry for the group's u-th edge of the step (a whole-warp shuffle, as operator())
  __device__ __forceinline__ int64_t mapped(int u) const {
    const int index = first + u * stride;
    return static_cast<int64_t>(__shfl_sync(kFullMask, mapped_mine, index < count ? index : 0));
  }
  // slot position (CSR order) of the group's u-th edge of the step
  __device__ __forceinline__ int64_t slot(int u) const { return base + first + u * stride; }
};

// Calls step(neighbour, valid, edges) for the slots [begin, end) of a warp's
// item in steps of U edges per edge group (G groups: group g takes the
// step's slots g, g + G, ...); neighbour ids and edge ids are read 32 at a
// time, one per lane, and handed round by shuffles. A step's padding slots
// (valid false) get lane 0's neighbour and edge id: real rows, so every load
// of the step is unconditional. slot_map (optional, one entry per slot) is
// read in the same round as the ids, for StepEdges::mapped.
template <int U, int G = 1, typename Step>
__device__ __forceinline__ void for_each_step(int64_t begin, int64_t end, const IndexView& indices,
                                              const int64_t* __restrict__ eid, bool need_eid, int lane, Step&& step,
                                              const int64_t* __restrict__ slot_map = nullptr) {
  const int group = lane / (kWarp / G);
  for (int64_t base = begin; base < end; base += kWarp) {
    const int count = end - base < kWarp ? static_cast<int>(end - base) : kWarp;
    // ids below 2^32 (checked on the host): one 32-bit shuffle per slot
    const uint32_t my_neighbour = lane < count ? static_cast<uint32_t>(indices[base + lane]) : 0;
    const uint32_t my_eid = need_eid && lane < count ? static_cast<uint32_t>(eid[base + lane]) : 0;
    const uint32_t my_mapped = slot_map != nullptr && lane < count ? static_cast<uint32_t>(slot_map[base + lane]) : 0;
    for (int first = 0; first < count; first += U * G) {
      const int group_first = first + group;
      int64_t neighbour[U];
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int index = group_first + u * G;
        valid[u] = index < count;
        neighbour[u] = static_cast<int64_t>(__shfl_sync(kFullMask, my_neighbour, valid[u] ? index : 0));
      }
      step(neighbour, valid, StepEdges{my_eid, group_first, G, count, base, my_mapped});
    }
  }
}

// The work items of a pass, longest first: the tiles of the heavy rows, the
// non-empty light rows by descending length, then chunks of kWarp empty rows.
// Resident warps take them round robin (item = warp, warp + warps, ...), so
// the k-th items of all warps are about equally long and every warp ends at
// about the same time; a warp never waits for its block's slowest warp.
// Calls row(item) for tiles and rows, empty(row) for each empty row.
// BOUNDS_AHEAD: a light row's id and bounds are loaded while the warp works
// on the item before it, so the row's own first loads (its ids, its query)
// go out at once; most of rmat20's rows have one or two in-edges, and each
// waits for a chain of dependent loads (the passes that gather ahead).
template <bool BOUNDS_AHEAD = false, typename scalar_t, typename Row, typename Empty>
__device__ __forceinline__ void for_each_item(const Params<scalar_t>& p, int lane, Row&& row, Empty&& empty) {
  const RowSchedule& s = p.schedule;
  const int64_t rows_end = s.num_tiles + p.num_busy_rows;
  const int64_t items = rows_end + (p.num_empty_rows + kWarp - 1) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // the row's id and bounds in one round of loads, not its id and then indptr
  auto load_bounds = [&](int64_t index, int64_t (&bounds)[3]) {
    if (index < s.num_tiles || index >= rows_end) return;
    const int64_t* from = p.row_bounds + 3 * (index - s.num_tiles);
#pragma unroll
    for (int i = 0; i < 3; ++i) bounds[i] = from[i];
  };
  int64_t next_bounds[3] = {0, 0, 0};
  if constexpr (BOUNDS_AHEAD) load_bounds(warp_index(), next_bounds);
  for (int64_t index = warp_index(); index < items; index += warps) {
    int64_t bounds[3] = {0, 0, 0};
    if constexpr (BOUNDS_AHEAD) {
#pragma unroll
      for (int i = 0; i < 3; ++i) bounds[i] = next_bounds[i];
      load_bounds(index + warps, next_bounds);
    }
    WorkItem item;
    if (index < s.num_tiles) {
      tile_item(s, index, item);
      row(item);
    } else if (index < rows_end) {
      if constexpr (!BOUNDS_AHEAD) load_bounds(index, bounds);
      item.row = bounds[0];
      item.row_begin = item.begin = bounds[1];
      item.end = bounds[2];
      item.partial = -1;
      row(item);
    } else {
      const int64_t first = (index - rows_end) * kWarp;
      const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), p.num_empty_rows - first));
      const uint32_t mine =
          lane < count ? static_cast<uint32_t>(p.row_bounds[3 * (p.num_busy_rows + first + lane)]) : 0;
      for (int j = 0; j < count; ++j) empty(static_cast<int64_t>(__shfl_sync(kFullMask, mine, j)));
    }
  }
}

// Adds each of a step's U edges' feature rows to rows[u] and, when given, to
// also[u]: Dot's edge features join both its key and its message.
template <int VEC, int U, typename scalar_t>
__device__ __forceinline__ void add_edge_features(const Params<scalar_t>& p, const StepEdges& edge_id,
                                                  const LaneGeometry& geo, const Lane<VEC>& lane,
                                                  Chunks<VEC> (&rows)[U], Chunks<VEC> (*also)[U] = nullptr) {
  if (!p.edge) return;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    Chunks<VEC> feature;
    load_row<VEC>(p.edge, edge_id(u), geo, lane, feature);
    add_to<VEC>(rows[u], feature);
    if (also != nullptr) add_to<VEC>((*also)[u], feature);
  }
}

// The score arithmetic of the forward, the edge-balanced score phase and the
// backward target pass, so all give the same numbers. step_partials: this
// lane's share of each of a step's U edges' scores into one target, from the
// gathered source rows `message` (x_src, or value for Dot, to which it adds
// the edge features as the message needs); finish_score turns one share into
// the raw score. What the backward target pass also needs comes out in
// `kept` (Dot's key plus edge features, GATv2's hidden x_src + x_dst + edge)
// and `z` (GAT's score before its LeakyReLU); the forward leaves them unused.
// NO_EDGES: built for calls without edge features (p.edge never read).
template <int KIND, int VEC, int U, typename scalar_t, bool NO_EDGES = false>
__device__ __forceinline__ void step_partials(const Params<scalar_t>& p, const int64_t (&neighbour)[U],
                                              const StepEdges& edge_id, const LaneGeometry& geo, const Lane<VEC>& lane,
                                              const Chunks<VEC>& target, float alpha_dst, const Chunks<VEC>& att,
                                              Chunks<VEC> (&message)[U], float (&partial)[U],
                                              float (&inverse_norm)[U], Chunks<VEC> (&kept)[U], float (&z)[U]) {
  const bool edges = !NO_EDGES && p.edge != nullptr;
  if constexpr (KIND == kCosine) {
    cosine_terms<VEC, U>(p, neighbour, geo, lane, target, message, inverse_norm, partial);
  } else if constexpr (KIND == kDot) {
#pragma unroll
    for (int u = 0; u < U; ++u) load_row<VEC>(p.key_src, neighbour[u], geo, lane, kept[u]);
    if (edges) add_edge_features<VEC, U>(p, edge_id, geo, lane, kept, &message);
#pragma unroll
    for (int u = 0; u < U; ++u) partial[u] = dot<VEC>(target, kept[u]);
  } else if constexpr (KIND == kGatV2) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      gatv2_hidden<VEC, scalar_t>(kept[u], message[u], target);
      if (edges) {
        Chunks<VEC> feature;
        load_row<VEC>(p.edge, edge_id(u), geo, lane, feature);
        gatv2_hidden<VEC, scalar_t>(kept[u], kept[u], feature);
      }
      partial[u] = gatv2_partial<VEC, scalar_t>(att, kept[u], p.slope);
    }
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // NO_EDGES with GAT: the plain forward build alone (see load_scalar_wide)
      z[u] = (NO_EDGES ? load_scalar_wide(p.src_scalar, neighbour[u], geo, lane.head, lane.head_ok)
                       : load_scalar(p.src_scalar, neighbour[u], geo, lane.head, lane.head_ok)) + alpha_dst;
    }
    if (edges) {
#pragma unroll
      for (int u = 0; u < U; ++u) z[u] += load_scalar(p.edge, edge_id(u), geo, lane.head, lane.head_ok);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) partial[u] = leaky_relu(z[u], p.slope);
  }
}

template <int KIND, int VEC, int HEAD_LANES = 0>
__device__ __forceinline__ float finish_score(float partial, float inverse_norm, float target_inverse_norm,
                                              float factor, const LaneGeometry& geo, const Lane<VEC>& lane) {
  if constexpr (KIND == kGat) {
    return partial;
  } else if constexpr (KIND == kCosine) {
    // the same product as the backward passes', so they recompute the same score
    return lane_sum<VEC, HEAD_LANES>(partial, geo, lane) * inverse_norm * target_inverse_norm * factor;
  } else {
    return lane_sum<VEC, HEAD_LANES>(partial, geo, lane) * factor;
  }
}

// VEC 8: the softmax states (max, sum, accumulator) of the warp's two edge
// groups merged, so both halves end with the row's. A group that saw no
// edge (max -inf, sums 0) weighs 0.
template <int VEC>
__device__ __forceinline__ void merge_groups(float& run_max, float& run_sum, Chunks<VEC>& acc) {
  constexpr int kHalf = kWarp / 2;
  const float other_max = __shfl_xor_sync(kFullMask, run_max, kHalf);
  const float other_sum = __shfl_xor_sync(kFullMask, run_sum, kHalf);
  const float row_max = fmaxf(run_max, other_max);
  const float mine = run_max == -INFINITY ? 0.f : softmax_exp(run_max - row_max);
  const float theirs = other_max == -INFINITY ? 0.f : softmax_exp(other_max - row_max);
  run_sum = run_sum * mine + other_sum * theirs;
#pragma unroll
  for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[k][v] = acc[k][v] * mine + __shfl_xor_sync(kFullMask, acc[k][v], kHalf) * theirs;
  run_max = row_max;
}

// A row's residual loaded before its store: dot_forward_ahead_kernel loads it
// with the row's query, in the same round of loads. (H100, rmat20 4 x 32: the
// forward took 3.10 ms, against 3.12 loading it at the store and 2.87 without
// a residual: what the residual costs is its 512 MiB read, not its latency.)
template <int VEC>
struct LoadedResidual {
  Chunks<VEC> values;
  bool loaded = false;
};

// out += bias (the layer's output bias, [H, C]) and the row's residual (a
// layer's skip connection, [Nd, H, C]) before a row's store, where given:
// one fewer pass over the output than adding them afterwards (TransformerConv
// on rmat20: `out + skip` read 1 GiB and wrote 512 MiB per step, 0.52 ms).
// The bias is read at each store (an L1 hit), not held in registers for the
// whole pass; the residual, read once, evict-first.
template <int VEC, typename scalar_t>
__device__ __forceinline__ void add_out_extras(const Params<scalar_t>& p, int64_t row, const LaneGeometry& geo,
                                               const Lane<VEC>& lane, Chunks<VEC>& acc,
                                               const LoadedResidual<VEC>& residual = {}) {
  Chunks<VEC> values;
  if (p.out_bias != nullptr) {
    load_row<VEC>(p.out_bias, 0, geo, lane, values);
    add_to<VEC>(acc, values);
  }
  if constexpr (sizeof(scalar_t) == 2) {
    if (p.out_bias_f32 != nullptr) {
      load_row<VEC>(p.out_bias_f32, 0, geo, lane, values);
      add_to<VEC>(acc, values);
    }
  }
  if (residual.loaded) {
    add_to<VEC>(acc, residual.values);
  } else if (p.out_residual != nullptr) {
    load_row<VEC, scalar_t, true>(p.out_residual, row, geo, lane, values);
    add_to<VEC>(acc, values);
  }
}

// A forward row's store: in the features' type, or in fp32 where the call asked
// for it (p.out_f32). The choice is a warp-uniform branch at each row's end,
// not a template parameter: it would double every 16-bit forward build for a
// store per row.
template <int VEC, typename scalar_t, bool ONCE = false>
__device__ __forceinline__ void store_out_row(const Params<scalar_t>& p, int64_t row, const LaneGeometry& geo,
                                              const Lane<VEC>& lane, const Chunks<VEC>& acc) {
  if constexpr (sizeof(scalar_t) == 2) {
    if (p.out_f32 != nullptr) {
      store_row<VEC, float, ONCE>(p.out_f32, row, geo, lane, acc);
      return;
    }
  }
  store_row<VEC, scalar_t, ONCE>(p.out, row, geo, lane, acc);
}

}  // namespace
}  // namespace attention
}  // namespace gnnio
