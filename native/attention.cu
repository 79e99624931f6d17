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
// partial sums added in tile order.
#include "attention.cuh"

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <string>
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
  // gradients both H * C + 2H (see attention_backward_source)
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
// fit 64 registers, so 4 blocks per SM.
template <int KIND, int VEC>
constexpr int backward_blocks_per_sm() {
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

template <int KIND, int VEC>
constexpr int target_edges_per_step() {
  return VEC == 4 && KIND == kDot ? 3 : 2;
}

template <int KIND, int VEC>
constexpr int source_edges_per_step() {
  return VEC == 4 && KIND == kGatV2 ? 3 : 2;
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
  if (residual.loaded) {
    add_to<VEC>(acc, residual.values);
  } else if (p.out_residual != nullptr) {
    load_row<VEC, scalar_t, true>(p.out_residual, row, geo, lane, values);
    add_to<VEC>(acc, values);
  }
}

// ------------------------------------- packed 16-bit forward scores (MMA)
// The 16-bit forward of GATv2's 32-channel heads and of Cosine's 128-channel
// ones (the 8-wide layout with every lane of a head inside it: 8 channels
// per lane, 4 or 16 lanes per head) sums each head's products on the tensor
// cores instead of a conversion and a fused multiply-add per element and a
// butterfly per head: one m16n8k16 MMA (fp32 accumulator) per 16 channels
// of two edges. Products of 16-bit values are exact in fp32, so the scores
// differ from the backward's recomputed ones only by the order of their
// fp32 sums. GATv2's hidden terms and activations are formed two at a time
// in the features' own type (one bf16x2 / half2 add, multiply and max or
// min per pair: the rounded values gatv2_hidden and gatv2_activation give);
// Cosine's dot products take the gathered rows as they are.
//
// Layout (packed_head_dots): A's row r is lane group r = lane / 4 (4 lanes,
// 32 channels of one head in one edge group, see Lane) for one edge and row
// r + 8 for the next, its columns this lane's channel pairs; B's column n
// holds lane group n's 32 channels of the other operand (x_dst, or att),
// which are the same for both edge groups. D[r][n] is row r's partial dot
// over lane group (r % 4)'s channels where n % 4 == r % 4: lane
// (lane & ~3) | (r % 4) / 2 holds it; a butterfly over the head's lane
// groups (Cosine) adds the partials.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
constexpr bool kHas16BitMma = true;
#else
constexpr bool kHas16BitMma = false;  // m16n8k16 with bf16 / fp16 inputs needs sm_80
#endif

// Lanes per head of the kinds whose 16-bit forward is built with packed
// scores (the host launches that build only when C == lanes * 8), or 0.
template <int KIND, int VEC, typename scalar_t>
constexpr int packed_head_lanes() {
  if constexpr (VEC != 8 || sizeof(scalar_t) != 2) return 0;
  return KIND == kGatV2 ? 4 : KIND == kCosine ? 16 : 0;
}

// Whether forward_kernel<KIND, VEC, scalar_t, .., HEAD_LANES> is the packed build.
template <int KIND, int VEC, typename scalar_t, int HEAD_LANES>
constexpr bool packed_build() {
  return HEAD_LANES > 0 && HEAD_LANES == packed_head_lanes<KIND, VEC, scalar_t>();
}

// Resident blocks the forward is compiled for (see the 4-wide layout's note
// before backward_blocks_per_sm): 3, or 4 (64 registers, no spill) for
// GATv2's packed build, which keeps its rows and activations as words and
// carries no dropout, edge-feature or score-output code. H100, rmat20 bf16
// 4 x 32 forward (its kernels): 1.65 ms at 3 blocks, 1.54 at 4 with those paths
// (88 bytes spilled), 1.39 at 4 without. Cosine's packed build ran no
// faster at 4 blocks than at 3 (1.65 ms either way). GAT's plain 16-bit
// build (PLAIN, without that code either) fits 64 registers too, so 4
// blocks: 1.28 ms against the general build's 1.47 (bf16; fp16 1.36 against
// 1.48; H100, rmat20 4 x 32, one process, bench.switches). Against its 4
// edges per group at 4 blocks, 3 edges ran 2.7% slower, 6 and 8 (40 and 108
// bytes spilled) 9% and 14%, and 5 blocks (48 registers, 80 bytes spilled) 8%.
template <int KIND, int VEC, typename scalar_t, int HEAD_LANES, bool PLAIN>
constexpr int forward_blocks_per_sm() {
  if constexpr (VEC == 1) return 1;
  return (KIND == kGatV2 && packed_build<KIND, VEC, scalar_t, HEAD_LANES>()) || PLAIN ? 4 : 3;
}

template <typename T>
struct PairOf;  // CUDA's type of two T in one 32-bit word
template <>
struct PairOf<c10::BFloat16> {
  using type = __nv_bfloat162;
};
template <>
struct PairOf<c10::Half> {
  using type = __half2;
};

template <typename T>
__device__ __forceinline__ typename PairOf<T>::type as_pair(uint32_t word) {
  typename PairOf<T>::type pair;
  memcpy(&pair, &word, sizeof(word));
  return pair;
}

template <typename Pair>
__device__ __forceinline__ uint32_t as_word(Pair pair) {
  uint32_t word;
  memcpy(&word, &pair, sizeof(word));
  return word;
}

// The four words (channel pairs) of a gathered 8-wide 16-bit chunk.
template <typename T>
__device__ __forceinline__ void words_of(const Vec<T, 8>& chunk, uint32_t (&words)[4]) {
  memcpy(words, chunk.v, sizeof(words));
}

// This lane's 8-wide chunk of row `node` as words.
template <typename T, bool ONCE = false>
__device__ __forceinline__ void gather_words(const T* __restrict__ base, int64_t node, const LaneGeometry& geo,
                                             const Lane<8>& lane, uint32_t (&words)[4]) {
  Gathered<8, T> chunk;
  gather_row<8, T, ONCE>(base, node, geo, lane, chunk);
  words_of<T>(chunk.chunk[0], words);
}

// d += A B for one m16n8k16 tile (A row-major, B column-major, fp32 d).
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, c10::BFloat16>::value) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// dots[u] = the head's <a[u], b> for a step's U edges (U even), from this
// lane's 8 channels of each as words; every lane of the head gets the same
// bits. Whole-warp (MMA and shuffles): call from warp-uniform code.
template <typename T, int HEAD_LANES, int U>
__device__ __forceinline__ void packed_head_dots(const uint32_t (&a)[U][4], const uint32_t (&b)[4], int lane,
                                                 float (&dots)[U]) {
  static_assert(U % 2 == 0, "edges go through the MMA two at a time (rows r and r + 8)");
  const bool odd_group = (lane >> 2) & 1;                 // (r % 4) & 1
  const int holder = (lane & ~3) | ((lane >> 3) & 1);  // lane 4r + (r % 4) / 2
#pragma unroll
  for (int u = 0; u < U; u += 2) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma_16x8x16<T>(d, a[u][0], a[u + 1][0], a[u][1], a[u + 1][1], b[0], b[1]);
    mma_16x8x16<T>(d, a[u][2], a[u + 1][2], a[u][3], a[u + 1][3], b[2], b[3]);
    dots[u] = __shfl_sync(kFullMask, odd_group ? d[1] : d[0], holder);
    dots[u + 1] = __shfl_sync(kFullMask, odd_group ? d[3] : d[2], holder);
  }
#pragma unroll
  for (int offset = 4; offset < HEAD_LANES; offset <<= 1)
#pragma unroll
    for (int u = 0; u < U; ++u) dots[u] += __shfl_xor_sync(kFullMask, dots[u], offset);
}

// GATv2's raw scores (before the score factor) of a step's U edges without
// edge features: their x_src rows as gathered, this lane's x_dst and att
// chunks as words. Whole-warp: call from warp-uniform code.
template <typename T, int U>
__device__ __forceinline__ void packed_gatv2_scores(float slope_f32, const Gathered<8, T> (&gathered)[U],
                                                    const Lane<8>& lane, const uint32_t (&target)[4],
                                                    const uint32_t (&att)[4], float (&score)[U]) {
  using Pair = typename PairOf<T>::type;
  const T slope_value(slope_f32);  // exact: the host rounded the slope to T
  const uint32_t slope_bits = slope_value.x;
  const Pair slope = as_pair<T>(slope_bits | (slope_bits << 16));
  uint32_t activation[U][4];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    uint32_t source[4];
    words_of<T>(gathered[u].chunk[0], source);
    Pair hidden[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) hidden[i] = __hadd2(as_pair<T>(source[i]), as_pair<T>(target[i]));
    // leaky_relu: max(h, slope * h) for slope <= 1, min(h, slope * h) above (each rounded as gatv2_activation)
    if (slope_f32 <= 1.f) {
#pragma unroll
      for (int i = 0; i < 4; ++i) activation[u][i] = as_word(__hmax2(hidden[i], __hmul2(hidden[i], slope)));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) activation[u][i] = as_word(__hmin2(hidden[i], __hmul2(hidden[i], slope)));
    }
  }
  packed_head_dots<T, 4, U>(activation, att, lane.lane, score);
}

// ------------------------------------------------------------------ forward
// A forward item's end: a light row's output (acc / sum, plus the output
// bias) and lse, or a tile's partial softmax state for merge_tiles_kernel.
template <int VEC, typename scalar_t, bool ONCE = false>
__device__ __forceinline__ void finish_forward_item(const Params<scalar_t>& p, const WorkItem& item,
                                                    const LaneGeometry& geo, const Lane<VEC>& lane, bool writer,
                                                    float run_max, float run_sum, Chunks<VEC>& acc,
                                                    const LoadedResidual<VEC>& residual = {}) {
  if (item.partial < 0) {
    const float inverse = run_sum > 0.f ? 1.f / run_sum : 0.f;
#pragma unroll
    for (int k = 0; k < Layout<VEC>::kChunks; ++k)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[k][v] *= inverse;
    add_out_extras<VEC>(p, item.row, geo, lane, acc, residual);
    store_row<VEC, scalar_t, ONCE>(p.out, item.row, geo, lane, acc);
    if (writer) p.lse[item.row * geo.heads + lane.head] = run_sum > 0.f ? run_max + logf(run_sum) : 0.f;
  } else {
    store_row<VEC>(p.part_acc, item.partial, geo, lane, acc);
    if (writer) {
      p.part_max[item.partial * geo.heads + lane.head] = run_max;
      p.part_sum[item.partial * geo.heads + lane.head] = run_sum;
    }
  }
}

// A row with no in-edges: the output bias and residual (or zeros) and lse 0.
template <int VEC, typename scalar_t, bool ONCE = false>
__device__ __forceinline__ void forward_empty_row(const Params<scalar_t>& p, int64_t row, const LaneGeometry& geo,
                                                  const Lane<VEC>& lane, bool writer) {
  Chunks<VEC> zero;
  set_zero<VEC>(zero);
  add_out_extras<VEC>(p, row, geo, lane, zero);
  store_row<VEC, scalar_t, ONCE>(p.out, row, geo, lane, zero);
  if (writer) p.lse[row * geo.heads + lane.head] = 0.f;
}

// PRECOMPUTED: the scores come from p.scores_in (slot order, written by the
// edge-balanced score phase) instead of from the source and target rows; the
// rest (online softmax, dropout, aggregation, tiles) is the same pass.
// HEAD_LANES: 0, or the lanes per head it was built for (fixed_head_lanes,
// or packed_head_lanes for the packed build).
// PLAIN: built for calls without dropout, edge features or returned scores
// (the packed builds are always so); launch_forward picks it.
template <int KIND, int VEC, typename scalar_t, bool PRECOMPUTED = false, int HEAD_LANES = 0, bool PLAIN = false>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, forward_blocks_per_sm<KIND, VEC, scalar_t, HEAD_LANES, PLAIN>()) forward_kernel(const Params<scalar_t> p) {
  constexpr int U = forward_edges_per_step<KIND, VEC>();
  constexpr int K = Layout<VEC>::kChunks;
  constexpr int G = Layout<VEC>::kGroups;
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  // 16-bit GATv2 and Cosine built for packed scores (packed_head_lanes): x_dst (and att) kept as words.
  // The host launches that build only without dropout, edge features or returned scores, so it
  // carries none of their per-step code (launch_forward).
  constexpr bool kPacked = !PRECOMPUTED && kHas16BitMma && packed_build<KIND, VEC, scalar_t, HEAD_LANES>();
  constexpr bool kPlain = kPacked || PLAIN;
  const Dropout dropout = kPlain ? Dropout{} : p.dropout;
  const Lane<VEC> lane(geo);
  const bool need_eid = !kPlain && (p.edge != nullptr || dropout.p > 0.f || p.scores != nullptr);
  // Per-edge outputs come from the edge's group; per-row ones from group 0 after the merge.
  const bool edge_writer = lane.head_ok && lane.in_head == 0;
  const bool row_lane = lane.group == 0;
  const bool writer = edge_writer && row_lane;
  const float factor = score_factor<KIND>(p, lane.head, lane.head_ok);
  // the plain build gathers x_src from this lane's base (gather_row_from_lane_base)
  const char* const msg_lane_base = reinterpret_cast<const char*>(p.msg_src + lane.offset[0]);
  const uint32_t row_bytes = static_cast<uint32_t>(geo.heads * geo.channels * sizeof(scalar_t));

  Chunks<VEC> att;  // GATv2's attention vector
  uint32_t att_words[4];
  if constexpr (kPacked && KIND == kGatV2) {
    gather_words<scalar_t>(p.att, 0, geo, lane, att_words);
  } else if constexpr (KIND == kGatV2) {
    load_row<VEC>(p.att, 0, geo, lane, att);
  }

  for_each_item(p, lane.lane, [&](const WorkItem& item) {
    Chunks<VEC> target;  // query / x_dst of the row
    uint32_t target_words[4];
    float alpha_dst = 0.f, target_inverse_norm = 1.f;
    if constexpr (kPacked) {
      gather_words<scalar_t, true>(p.dst_vec, item.row, geo, lane, target_words);
      if constexpr (KIND == kCosine) target_inverse_norm = inverse_norm_of<VEC>(p.dst_norm, item.row, geo, lane);
    } else if constexpr (!PRECOMPUTED) {
      if constexpr (KIND != kGat) load_row<VEC, scalar_t, true>(p.dst_vec, item.row, geo, lane, target);
      if constexpr (KIND == kGat) alpha_dst = load_scalar(p.dst_scalar, item.row, geo, lane.head, lane.head_ok);
      if constexpr (KIND == kCosine) target_inverse_norm = inverse_norm_of<VEC>(p.dst_norm, item.row, geo, lane);
    }

    Chunks<VEC> acc;
    set_zero<VEC>(acc);
    float run_max = -INFINITY, run_sum = 0.f;

    for_each_step<U, G>(item.begin, item.end, p.indices, p.eid, need_eid, lane.lane,
                        [&](const int64_t(&neighbour)[U], const bool(&valid)[U], const StepEdges& edge_id) {
      // All of the step's gathers first, with no branch between them, so
      // their latencies overlap; edge features (rare) come in a second round.
      Gathered<VEC, scalar_t> gathered[U];  // x_src, or Dot's value
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (PLAIN) gather_row_from_lane_base<VEC>(msg_lane_base, neighbour[u], row_bytes, gathered[u]);
        else gather_row<VEC>(p.msg_src, neighbour[u], geo, lane, gathered[u]);
      }
      float partial[U], inverse_norm[U];  // Cosine: 1 / max(|x_src|, floor)
      float score[U], drop[U];
      if constexpr (kPacked && KIND == kGatV2) {
        packed_gatv2_scores<scalar_t, U>(p.slope, gathered, lane, target_words, att_words, score);
#pragma unroll
        for (int u = 0; u < U; ++u) score[u] *= factor;  // as finish_score
      } else if constexpr (kPacked) {  // Cosine: <x_dst, x_src> over both norms, as finish_score
        uint32_t source[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          inverse_norm[u] = inverse_norm_of<VEC>(p.src_norm, neighbour[u], geo, lane);
          words_of<scalar_t>(gathered[u].chunk[0], source[u]);
        }
        packed_head_dots<scalar_t, HEAD_LANES, U>(source, target_words, lane.lane, score);
#pragma unroll
        for (int u = 0; u < U; ++u) score[u] = score[u] * inverse_norm[u] * target_inverse_norm * factor;
      } else if constexpr (!PRECOMPUTED) {
        Chunks<VEC> message[U], kept[U];  // the score's copy of the rows; kept: the backward's, unused here
        float z[U];
#pragma unroll
        for (int u = 0; u < U; ++u) unpack<VEC>(gathered[u], lane, message[u]);
        step_partials<KIND, VEC, U, scalar_t, kPlain>(p, neighbour, edge_id, geo, lane, target, alpha_dst, att,
                                                      message, partial, inverse_norm, kept, z);
      }
      float new_max = run_max;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (PRECOMPUTED) {
          // the edge-balanced score phase wrote the scores (edge_scores_kernel)
          score[u] = valid[u] && lane.head_ok ? p.scores_in[edge_id.slot(u) * geo.heads + lane.head] : 0.f;
        } else if constexpr (!kPacked) {
          score[u] = finish_score<KIND, VEC, HEAD_LANES>(partial[u], inverse_norm[u], target_inverse_norm, factor,
                                                         geo, lane);
        }
        drop[u] = dropout.p > 0.f ? dropout.weight(edge_id(u), lane.head) : 1.f;
        if (valid[u]) new_max = fmaxf(new_max, score[u]);
      }
      // Rescale only where the maximum grew, which after a row's first
      // edges is rare: no multiply per accumulator element in most steps.
      // A group that has seen no edge yet has run_max -inf and acc 0, so
      // its factor exp(-inf) = 0 changes nothing.
      if (new_max != run_max) {
        const float correction = softmax_exp(run_max - new_max);
        run_sum *= correction;
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[k][v] *= correction;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        Chunks<VEC> message;  // converted again from the gathered row (see Gathered)
        unpack<VEC>(gathered[u], lane, message);
        if constexpr (KIND == kDot && !kPlain) {
          // The message is value + edge features. The score phase loaded
          // the same features for the key; loading them again here (an L1
          // or L2 hit, and only for layers with edge_dim) keeps no extra
          // row per edge in registers across the softmax update.
          if (p.edge) {  // warp-uniform: edge_id shuffles on the whole warp
            Chunks<VEC> feature;
            load_row<VEC>(p.edge, edge_id(u), geo, lane, feature);
            add_to<VEC>(message, feature);
          }
        }
        if (valid[u]) {
          const float weight = softmax_exp(score[u] - new_max);
          run_sum += weight;
          add_scaled<VEC>(acc, weight * drop[u], message);
        }
        if (!kPlain && p.scores != nullptr) {
          const int64_t e = edge_id(u);  // a whole-warp shuffle: outside the branch on valid (groups differ)
          if (edge_writer && valid[u])
            p.scores[e * geo.heads + lane.head] = p.scores_after_dropout && drop[u] == 0.f ? -INFINITY : score[u];
        }
      }
      run_max = new_max;
    });
    if constexpr (G == 2) merge_groups<VEC>(run_max, run_sum, acc);

    if (row_lane) finish_forward_item<VEC>(p, item, geo, lane, writer, run_max, run_sum, acc);
  }, [&](int64_t row) {
    if (row_lane) forward_empty_row<VEC>(p, row, geo, lane, writer);
  });
}

// ------------------------------------------------- edge-balanced score phase
// For graphs whose in-degrees are very uneven: the raw score of every edge,
// each warp taking the same number of CSR slots (slots_per_warp) whatever
// rows they belong to, written in slot order for forward_kernel<.., true>
// (the fused softmax and aggregation). Same arithmetic as the fused forward
// (step_partials, finish_score), so the backward's recomputed scores are the same numbers.
// Consecutive slots mostly share their target, whose row is loaded again only
// when it changes.
template <int KIND, int VEC, typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp) edge_scores_kernel(const Params<scalar_t> p,
                                                                             const int32_t* __restrict__ slot_rows,
                                                                             int64_t num_slots, int64_t slots_per_warp,
                                                                             float* __restrict__ scores_out) {
  const LaneGeometry geo = p.geo;
  const Lane<VEC> lane(geo);
  const bool writer = lane.head_ok && lane.in_head == 0;
  const float factor = score_factor<KIND>(p, lane.head, lane.head_ok);
  Chunks<VEC> att;
  if constexpr (KIND == kGatV2) load_row<VEC>(p.att, 0, geo, lane, att);

  const int64_t begin = warp_index() * slots_per_warp;
  const int64_t end = min(begin + slots_per_warp, num_slots);
  int64_t current = -1;  // the target whose row `target` holds
  Chunks<VEC> target;
  set_zero<VEC>(target);
  float alpha_dst = 0.f, target_inverse_norm = 1.f;
  for_each_step<1>(begin, end, p.indices, p.eid, p.edge != nullptr, lane.lane,
                   [&](const int64_t(&neighbour)[1], const bool(&valid)[1], const StepEdges& edge_id) {
    const int64_t slot = edge_id.slot(0);
    const int64_t row = slot_rows[slot];
    if (row != current) {  // warp-uniform
      if constexpr (KIND != kGat) load_row<VEC>(p.dst_vec, row, geo, lane, target);
      if constexpr (KIND == kGat) alpha_dst = load_scalar(p.dst_scalar, row, geo, lane.head, lane.head_ok);
      if constexpr (KIND == kCosine) target_inverse_norm = inverse_norm_of<VEC>(p.dst_norm, row, geo, lane);
      current = row;
    }
    Chunks<VEC> message[1];
    if constexpr (KIND == kGatV2 || KIND == kCosine) {
      load_row<VEC>(p.msg_src, neighbour[0], geo, lane, message[0]);
    } else {
      set_zero<VEC>(message[0]);  // GAT's and Dot's scores read no message row
    }
    float partial[1], inverse_norm[1], z[1];
    Chunks<VEC> kept[1];  // the backward's; unused here
    step_partials<KIND, VEC, 1>(p, neighbour, edge_id, geo, lane, target, alpha_dst, att, message, partial,
                                inverse_norm, kept, z);
    const float score = finish_score<KIND, VEC>(partial[0], inverse_norm[0], target_inverse_norm, factor, geo, lane);
    if (writer && valid[0]) scores_out[slot * geo.heads + lane.head] = score;
  });
}

// Second forward pass for heavy rows: merge the tiles' softmax states in
// tile order. One block per heavy row, threads over (head, channel). One
// pass with a running maximum (each tile's state rescaled as the maximum
// grows), not a pass for the maximum and then one for the sums: a long row
// (309 tiles on rmat20) waits for one round of kTileBatch tiles' loads after
// another, and one pass halves the rounds (H100, rmat20 4 x 32: 0.088 ->
// 0.064 ms). Capped at 64 registers (merge_threads: at most 256 threads per
// block) so as many blocks stay resident as before; uncapped it took 128,
// and 32 tiles per round took 254 registers and 0.32 ms.
template <typename scalar_t>
__global__ void __launch_bounds__(256, 4)
    merge_tiles_kernel(const RowSchedule s, int heads, int channels, const float* __restrict__ part_max,
                       const float* __restrict__ part_sum, const float* __restrict__ part_acc,
                       const scalar_t* __restrict__ bias, const scalar_t* __restrict__ residual,
                       scalar_t* __restrict__ out, float* __restrict__ lse) {
  const int64_t row = s.heavy_rows[blockIdx.x];
  const int64_t first = s.heavy_tile_ptr[blockIdx.x], last = s.heavy_tile_ptr[blockIdx.x + 1];
  const int64_t width = static_cast<int64_t>(heads) * channels;
  for (int64_t f = threadIdx.x; f < width; f += blockDim.x) {
    const int head = static_cast<int>(f / channels);
    struct TileState {
      float max, sum, acc;
    };
    float row_max = -INFINITY, sum = 0.f, acc = 0.f;
    in_tile_order<TileState>(
        first, last,
        [&](int64_t t) {
          return TileState{part_max[t * heads + head], part_sum[t * heads + head], part_acc[t * width + f]};
        },
        [&](const TileState& tile) {
          // a tile that counted no edge (max -inf) weighs 0: exp(-inf - -inf) would be NaN
          const bool counted = tile.max != -INFINITY;
          const float new_max = fmaxf(row_max, tile.max);
          const float kept = counted ? softmax_exp(row_max - new_max) : 1.f;  // 0 before the first tile
          const float factor = counted ? softmax_exp(tile.max - new_max) : 0.f;
          sum = sum * kept + tile.sum * factor;
          acc = acc * kept + tile.acc * factor;
          row_max = new_max;
        });
    float value = sum > 0.f ? acc / sum : 0.f;
    if (bias != nullptr) value += static_cast<float>(bias[f]);
    if (residual != nullptr) value += static_cast<float>(residual[row * width + f]);
    out[row * width + f] = static_cast<scalar_t>(value);
    if (f % channels == 0) lse[row * heads + head] = sum > 0.f ? row_max + logf(sum) : 0.f;
  }
}

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
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Dropout dropout = p.dropout;
  const Lane<VEC> lane(geo);
  const bool need_eid = p.edge != nullptr || dropout.p > 0.f;
  const bool writer = lane.head_ok && lane.in_head == 0;
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

    for_each_step<U>(item.begin, item.end, p.indices, p.eid, need_eid, lane.lane,
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
        if (!valid[u]) continue;
        const float prob = softmax_exp(score - row_lse);
        const float r = prob * (dropout.p > 0.f ? dropout.weight(edge_id(u), lane.head) : 1.f) * dp;
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
        store_row<VEC>(p.grad_vec, item.row, geo, lane, result);
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
          store_row<VEC>(p.part_att, item.partial, geo, lane, att_weighted);
          store_row<VEC>(p.part_att2, item.partial, geo, lane, att_plain);
        }
        store_row<VEC>(p.part_vec, item.partial, geo, lane, weighted);
        store_row<VEC>(p.part_vec2, item.partial, geo, lane, plain);
      }
    }
  }, [&](int64_t row) {
    // lse 0, as the forward wrote it; no edge reads an empty row's statistics, so no norm is loaded for them
    if (writer) store_row_stats(p.stats_out, row * geo.heads + lane.head, KIND == kCosine, 0.f, 0.f, 0.f);
    if constexpr (KIND == kGat) {
      if (writer) p.grad_scalar[row * geo.heads + lane.head] = static_cast<scalar_t>(0.f);
    } else {
      Chunks<VEC> zero;
      set_zero<VEC>(zero);
      store_row<VEC>(p.grad_vec, row, geo, lane, zero);
    }
  });

  // GATv2: each resident warp's share of the attention-vector gradient, one
  // row per warp (fixed item assignment: deterministic), summed on the host
  // side. No block barrier: warps of a block end at different times.
  // Cosine: the same for d beta, one value per (warp, head).
  if constexpr (KIND == kGatV2) store_row<VEC>(p.att_partial, warp_index(), geo, lane, att_grad);
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
  const LaneGeometry geo = p.geo;  // copies: taking the address of a kernel parameter puts it on the stack
  const Dropout dropout = p.dropout;
  const Lane<VEC> lane(geo);
  const bool need_eid = p.edge != nullptr || dropout.p > 0.f;
  const bool writer = lane.head_ok && lane.in_head == 0;
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

    for_each_step<U>(item.begin, item.end, p.indices, p.eid, need_eid, lane.lane,
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
        if (!valid[u]) continue;
        const float prob = softmax_exp(score - row_lse[u]);
        const float drop = dropout.p > 0.f ? dropout.weight(edge_id(u), lane.head) : 1.f;
        const float score_grad = prob * (drop * dp - row_delta[u]);
        add_scaled<VEC>(source_grad, prob * drop, grad[u]);
        if constexpr (KIND == kCosine) {
          // d u_src = beta * sum_e d score_e * u_dst, u_dst = x_dst / max(|x_dst|, floor)
          add_scaled<VEC>(key_grad, score_grad * factor * target_inverse_norm[u], target[u]);
        } else if constexpr (KIND == kDot) {
          add_scaled<VEC>(key_grad, score_grad * p.scale, target[u]);
          if (p.edge_grads && writer) p.edge_grads[edge_id.slot(u) * geo.heads + lane.head] = score_grad * p.scale;
          if (p.grad_edge) {
            Chunks<VEC> edge_grad;
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
              for (int v = 0; v < VEC; ++v)
                edge_grad[k][v] = score_grad * p.scale * target[u][k][v] + prob * drop * grad[u][k][v];
            store_row<VEC>(p.grad_edge, edge_id(u), geo, lane, edge_grad);
          }
        } else if constexpr (KIND == kGatV2) {
          Chunks<VEC> hidden_grad;
#pragma unroll
          for (int k = 0; k < K; ++k)
#pragma unroll
            for (int v = 0; v < VEC; ++v)
              hidden_grad[k][v] = score_grad * att[k][v] * leaky_relu_grad(hidden[u][k][v], p.slope);
          add_to<VEC>(source_grad, hidden_grad);
          if (p.grad_edge) store_row<VEC>(p.grad_edge, edge_id(u), geo, lane, hidden_grad);
        } else {
          const float z_grad = score_grad * leaky_relu_grad(z[u], p.slope);
          scalar_grad += z_grad;
          if (p.grad_edge) {
            const int64_t e = edge_id(u);
            if (writer) p.grad_edge[e * geo.heads + lane.head] = static_cast<scalar_t>(z_grad);
          }
          if (p.edge_grads && writer) p.edge_grads[edge_id.slot(u) * geo.heads + lane.head] = z_grad;
        }
      }
    });

    if (item.partial < 0) {
      // Cosine: d x_src whole (the heavy rows' tiles get it from a node pass over those rows)
      if constexpr (KIND == kCosine) cosine_source_row_grad<VEC>(p, item.row, geo, lane, message, norm, key_grad, source_grad);
      store_row_at<VEC>(p.grad_vec + item.row * p.grad_vec_stride, lane, source_grad);
      if constexpr (KIND == kDot) store_row<VEC>(p.grad_vec2, item.row, geo, lane, key_grad);
      if (KIND == kGat && writer) {
        p.grad_scalar[item.row * p.grad_scalar_stride + lane.head] = static_cast<scalar_t>(scalar_grad);
      }
    } else {
      store_row<VEC>(p.part_vec, item.partial, geo, lane, source_grad);
      if constexpr (KIND == kDot || KIND == kCosine) store_row<VEC>(p.part_vec2, item.partial, geo, lane, key_grad);
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
      store_row<VEC>(p.grad_vec, row, geo, lane, grad);
    } else {
      store_row_at<VEC>(p.grad_vec + row * p.grad_vec_stride, lane, zero);
    }
    if constexpr (KIND == kDot) store_row<VEC>(p.grad_vec2, row, geo, lane, zero);
    if (KIND == kGat && writer) p.grad_scalar[row * p.grad_scalar_stride + lane.head] = static_cast<scalar_t>(0.f);
  });
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

__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 3) gat_forward_ahead_kernel(const Params<float> p) {
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

// ------------------------------------------------- Cosine's node-level work
// AGNN's rows before and after the edge kernels, lanes striding over the
// channels of each (node, head) row (coalesced; any C). With
// n = |x|, m = max(n, floor), a = (n >= floor), u = x / m (in fp32):
//   forward:  n (fp32) in one read of x (row_dots_kernel's NORMS form);
//   backward: grad_x = direct + (g - a * <g, u> * u) / m, g = g1 (+ g2),
// which is d(x / max(|x|, floor))/dx applied to g (F.normalize's backward,
// clamp_min's mask included), plus the message path's gradient `direct`:
// the message is x itself, so its gradient reaches x as is.
// One pass each instead of torch's chain of N x C temporaries.

// dots[r] = <a[r], b[r] - offset[r % heads] - residual[r]> per (node, head)
// row in fp32: GAT's and Dot's delta = <g_t, out_t> from the saved output
// (less the output bias and the residual the forward added, when it did),
// before their source pass.
// With lse (fp32 [rows]) the rows' softmax statistics come out instead:
// dots[2r] = lse[r], dots[2r + 1] = the dot, the (lse, delta) pairs the
// source pass gathers per edge, without a separate pass stacking them.
// NORMS: (dots[2r], dots[2r + 1]) = (|a[r]|, 1 / max(|a[r]|, floor))
// instead (b and offset unused), Cosine's row norms and the inverses its
// edge passes multiply by.
//
// Each lane reads whole chunks of VEC elements (16 bytes where the rows are
// 16-byte aligned and C % VEC == 0, else VEC 1), `lanes` lanes per row
// (lanes_per_edge of its chunks), so one load round of the warp covers
// 32 / lanes rows; each warp issues kDotRowsPerWarp such rounds before its
// first sum: with one row per warp the loads in flight were too few (H100,
// rmat20 4 x 32: 0.63 ms for 1 GiB read), and one element per lane read only
// 64 bytes per warp and load in bf16 (the norms of a bf16 1 x 128 x on
// rmat20: 0.24 ms for 256 MiB, slower than fp32's 512 MiB at 0.19 ms; 0.12
// ms in 16-byte chunks).
constexpr int kDotRowsPerWarp = 8;
constexpr int kMaxBiasChannels = kWarp;

// The VEC-element chunks at `channel` of a lane's kDotRowsPerWarp rows (first, first + step, ...),
// zeros past the last row, all loaded before any is used. Why: with each row's loads behind the
// previous row's checks and sums, the compiler kept one row's loads in flight per warp. H100,
// rmat20 4 x 32 fp32 (run 183-184): the Transformer's delta (1.5 GiB read) 0.617 -> 0.584 ms with
// row_dots_kernel's loop, GATConv's delta and bias gradient (1 GiB) 0.507 -> 0.452 ms.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void load_row_chunks(const scalar_t* __restrict__ base, int64_t first, int step,
                                                int64_t rows, int channels, int channel,
                                                Vec<scalar_t, VEC> (&chunks)[kDotRowsPerWarp]) {
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    const int64_t row = first + static_cast<int64_t>(r) * step;
    chunks[r] = row < rows ? load_vec<scalar_t, VEC>(base + row * channels + channel) : Vec<scalar_t, VEC>{};
  }
}

// One group of a lane's rows (first, first + 32 / lanes, ...: kDotRowsPerWarp of them), see row_dots_kernel.
template <typename scalar_t, int VEC, bool NORMS>
__device__ __forceinline__ void row_dots_group(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                               const scalar_t* __restrict__ offset,
                                               const scalar_t* __restrict__ residual, const float* __restrict__ lse,
                                               int64_t rows, int heads, int channels, int lanes, int64_t first,
                                               float* __restrict__ dots) {
  const int in_row = threadIdx.x & (lanes - 1);
  const int rows_per_round = kWarp / lanes;
  float sums[kDotRowsPerWarp] = {};
  for (int c = in_row * VEC; c - in_row * VEC < channels; c += lanes * VEC) {  // one round unless C > 32 VEC
    if (c >= channels) continue;  // a lane past the row's last chunk (lanes is a power of two)
    Vec<scalar_t, VEC> a_chunks[kDotRowsPerWarp], b_chunks[kDotRowsPerWarp], skip_chunks[kDotRowsPerWarp];
    load_row_chunks<scalar_t, VEC>(a, first, rows_per_round, rows, channels, c, a_chunks);
    if constexpr (!NORMS) {
      load_row_chunks<scalar_t, VEC>(b, first, rows_per_round, rows, channels, c, b_chunks);
      if (residual != nullptr) load_row_chunks<scalar_t, VEC>(residual, first, rows_per_round, rows, channels, c, skip_chunks);
    }
#pragma unroll
    for (int r = 0; r < kDotRowsPerWarp; ++r) {
      float x[VEC];
      to_f32<VEC>(a_chunks[r], x);
      if constexpr (NORMS) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) sums[r] += x[v] * x[v];
      } else {
        const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
        float y[VEC], shift[VEC] = {}, skip[VEC] = {};
        to_f32<VEC>(b_chunks[r], y);
        if (offset != nullptr && row < rows)
          to_f32<VEC>(load_vec<scalar_t, VEC>(offset + (row % heads) * channels + c), shift);
        if (residual != nullptr) to_f32<VEC>(skip_chunks[r], skip);
#pragma unroll
        for (int v = 0; v < VEC; ++v) sums[r] += x[v] * (y[v] - shift[v] - skip[v]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    const float sum = head_sum<kWarp>(sums[r], lanes);
    const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
    if (in_row != 0 || row >= rows) continue;
    if constexpr (NORMS) {
      const float norm = sqrtf(sum);
      reinterpret_cast<float2*>(dots)[row] = make_float2(norm, 1.f / clamped_norm(norm));
    } else if (lse != nullptr) {
      reinterpret_cast<float2*>(dots)[row] = make_float2(lse[row], sum);
    } else {
      dots[row] = sum;
    }
  }
}

template <typename scalar_t, int VEC, bool NORMS = false>
__global__ void row_dots_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                const scalar_t* __restrict__ offset, const scalar_t* __restrict__ residual,
                                const float* __restrict__ lse, int64_t rows,
                                int heads, int channels, int lanes, int64_t warps, float* __restrict__ dots) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= warps) return;  // warp-uniform
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
  // The resident warps loop over the groups of rows: with a block per group, each block ended as
  // soon as its loads landed, and with this kernel's registers (one block per SM) the SM idled
  // until the next one started (H100, rmat20's Transformer delta: 0.665 ms, 0.584 looping).
  for (int64_t first = warp * group_rows + lane / lanes; first - lane / lanes < rows; first += warps * group_rows)
    row_dots_group<scalar_t, VEC, NORMS>(a, b, offset, residual, lse, rows, heads, channels, lanes, first, dots);
}

// row_dots_kernel's dots and, in the same read, a's column sums
// (channels <= 32), the gradient of the output bias the forward added to
// every row, instead of a second pass over a (GATConv on rmat20: a 0.19 ms
// matrix-vector product per step). Rows are read as row_dots_kernel reads
// them: chunks of VEC elements, `lanes` lanes per row, 32 / lanes rows per
// load round, kDotRowsPerWarp rounds per warp and group of rows (one element
// per lane read 1 GiB in 0.56 ms on rmat20's 4 x 32 rows, 16-byte chunks
// 0.48 ms; H100, runs 93 and 95). Each lane sums its channels per row position r of the group in
// registers and writes them once, as partial row
// warp * group_rows + (its row in the group); the host launches a multiple
// of heads / gcd(heads, group_rows) warps that loop over the groups, so all
// rows a lane sees at one position are of one head, and attention_row_dots
// adds the partial rows of each head in a fixed order (deterministic).
template <typename scalar_t, int VEC>
__global__ void row_dots_columns_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                        const scalar_t* __restrict__ offset, const scalar_t* __restrict__ residual,
                                        const float* __restrict__ lse, int64_t rows, int heads, int channels,
                                        int lanes, int64_t warps,
                                        float* __restrict__ dots, float* __restrict__ column_partials) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= warps) return;  // warp-uniform
  const int lane = threadIdx.x & (kWarp - 1);
  const int rows_per_round = kWarp / lanes;
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * rows_per_round;
  const int channel = (lane & (lanes - 1)) * VEC;  // this lane's first channel
  const bool has_channels = channel < channels;
  const int64_t my_row = warp * group_rows + lane / lanes;  // at position 0 of the warp's first group
  // each position's head, the same in every group the warp takes (the stride
  // warps * group_rows is a multiple of heads); found once: a 64-bit
  // remainder per element doubled the kernel's time (0.41 -> 0.91 ms)
  int head_of[kDotRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) head_of[r] = static_cast<int>((my_row + r * rows_per_round) % heads);
  float column[kDotRowsPerWarp][VEC] = {};
  for (int64_t first = my_row; first - lane / lanes < rows; first += warps * group_rows) {
    float sums[kDotRowsPerWarp] = {};
    if (has_channels) {
      Vec<scalar_t, VEC> a_chunks[kDotRowsPerWarp], b_chunks[kDotRowsPerWarp], skip_chunks[kDotRowsPerWarp];
      load_row_chunks<scalar_t, VEC>(a, first, rows_per_round, rows, channels, channel, a_chunks);
      load_row_chunks<scalar_t, VEC>(b, first, rows_per_round, rows, channels, channel, b_chunks);
      if (residual != nullptr) load_row_chunks<scalar_t, VEC>(residual, first, rows_per_round, rows, channels, channel, skip_chunks);
#pragma unroll
      for (int r = 0; r < kDotRowsPerWarp; ++r) {  // rows past the last one add zeros
        float value[VEC], other[VEC], shift[VEC] = {}, skip[VEC] = {};
        to_f32<VEC>(a_chunks[r], value);
        to_f32<VEC>(b_chunks[r], other);
        if (offset != nullptr) to_f32<VEC>(load_vec<scalar_t, VEC>(offset + head_of[r] * channels + channel), shift);
        if (residual != nullptr) to_f32<VEC>(skip_chunks[r], skip);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          sums[r] += value[v] * (other[v] - shift[v] - skip[v]);
          column[r][v] += value[v];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kDotRowsPerWarp; ++r) {
      const float sum = head_sum<kWarp>(sums[r], lanes);
      const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
      if ((lane & (lanes - 1)) != 0 || row >= rows) continue;
      if (lse != nullptr) {
        reinterpret_cast<float2*>(dots)[row] = make_float2(lse[row], sum);
      } else {
        dots[row] = sum;
      }
    }
  }
  if (!has_channels) return;
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    float* partial = column_partials + (my_row + static_cast<int64_t>(r) * rows_per_round) * channels + channel;
#pragma unroll
    for (int v = 0; v < VEC; ++v) partial[v] = column[r][v];
  }
}

// `nodes` (optional): only these nodes' rows (all heads), e.g. the heavy
// source rows whose d x the source pass leaves to this kernel; `direct` may
// then be `grad_x` itself (each element is read before the same thread
// writes it), so neither is __restrict__.
template <typename scalar_t>
__global__ void unit_rows_backward_kernel(const scalar_t* __restrict__ x, const float* __restrict__ norm,
                                          const scalar_t* __restrict__ grad1, const scalar_t* __restrict__ grad2,
                                          const scalar_t* direct, int64_t rows, const int64_t* __restrict__ nodes,
                                          int heads, int channels, scalar_t* grad_x) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (index >= rows) return;  // warp-uniform
  const int64_t row = nodes != nullptr ? nodes[index / heads] * heads + index % heads : index;
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t base = row * channels;
  auto grad_at = [&](int64_t i) {
    return static_cast<float>(grad1[i]) + (grad2 != nullptr ? static_cast<float>(grad2[i]) : 0.f);
  };
  const float row_norm = norm[2 * row];  // (|x|, inverse) pairs, attention_row_norms'
  const float divisor = clamped_norm(row_norm);
  const float inverse = 1.f / divisor;
  // a quotient, not x * inverse: for one channel x / sqrt(x * x) is exactly +-1, so the
  // gradient through the unit row is exactly 0 there, as F.normalize's is
  auto unit_at = [&](int64_t i) { return static_cast<float>(x[i]) / divisor; };
  float radial = 0.f;
  for (int c = lane; c < channels; c += kWarp) radial += grad_at(base + c) * unit_at(base + c);
  radial = warp_sum(radial);
  // clamp_min passes the norm's gradient only where norm >= floor (a NaN norm gets none)
  const float kept = row_norm >= kNormFloor ? radial : 0.f;
  // the second read of the row hits L1: no registers held across the reduction for any C
  for (int c = lane; c < channels; c += kWarp) {
    const int64_t i = base + c;
    float value = (grad_at(i) - kept * unit_at(i)) * inverse;
    if (direct != nullptr) value += static_cast<float>(direct[i]);
    grad_x[i] = static_cast<scalar_t>(value);
  }
}

// ---------------------------------------------------------------- host side
constexpr const char* kForward = "gnnio::attention_forward";
constexpr const char* kForwardEdgeBalanced = "gnnio::attention_forward_edge_balanced";
constexpr const char* kBackwardTarget = "gnnio::attention_backward_target";
constexpr const char* kBackwardSource = "gnnio::attention_backward_source";
constexpr const char* kBackwardTargetFromEdges = "gnnio::attention_backward_target_from_edges";

// Runtime (kind, vector width) become template parameters: 4 kinds x 2
// widths x 3 dtypes = 24 instantiations per kernel (the forward also has
// VEC 8 for the two 16-bit dtypes: launch_paired_forward).
#define GNNIO_ATTENTION_KIND_SWITCH(kind, ...) \
  [&] {                                        \
    switch (kind) {                            \
      case kGat: {                             \
        constexpr int KIND = kGat;             \
        return __VA_ARGS__();                  \
      }                                        \
      case kGatV2: {                           \
        constexpr int KIND = kGatV2;           \
        return __VA_ARGS__();                  \
      }                                        \
      case kDot: {                             \
        constexpr int KIND = kDot;             \
        return __VA_ARGS__();                  \
      }                                        \
      default: {                               \
        constexpr int KIND = kCosine;          \
        return __VA_ARGS__();                  \
      }                                        \
    }                                          \
  }()

#define GNNIO_ATTENTION_SWITCH(kind, vec, ...)                 \
  [&] {                                                        \
    if (vec == 4) {                                            \
      constexpr int VEC = 4;                                   \
      return GNNIO_ATTENTION_KIND_SWITCH(kind, __VA_ARGS__);   \
    }                                                          \
    constexpr int VEC = 1;                                     \
    return GNNIO_ATTENTION_KIND_SWITCH(kind, __VA_ARGS__);     \
  }()

// The widest head C that the two layouts hold: VEC 4 x 1 chunk x 32 lanes,
// VEC 1 x 8 chunks x 32 lanes.
constexpr int64_t kMaxVectorChannels = 128;
constexpr int64_t kMaxChannels = 256;

// The feature tensors of one call, checked once.
struct Features {
  int64_t kind;
  int64_t heads;
  int64_t channels;
  int64_t num_src;
  at::ScalarType dtype;
  at::Tensor msg_src;
  c10::optional<at::Tensor> key_src, dst_vec, src_scalar, dst_scalar, att, edge;
};

void check_tensor(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  std::initializer_list<int64_t> shape) {
  GNNIO_ENSURE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device());
  GNNIO_ENSURE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
  GNNIO_ENSURE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
  GNNIO_ENSURE(t.sizes().equals(shape), op, ": ", name, " must have shape ", at::IntArrayRef(shape), ", got ",
              t.sizes());
}

const at::Tensor& required(const char* op, const char* name, const c10::optional<at::Tensor>& t, int64_t kind) {
  GNNIO_ENSURE(t.has_value(), op, ": ", name, " is required for kind ", kind);
  return *t;
}

Features check_features(const char* op, int64_t kind, int64_t num_dst, int64_t num_edges, const at::Tensor& msg_src,
                        const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
                        const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
                        const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge) {
  GNNIO_ENSURE(kind == kGat || kind == kGatV2 || kind == kDot || kind == kCosine, op,
              ": kind must be 0 (GAT), 1 (GATv2), 2 (dot) or 3 (cosine), got ", kind);
  GNNIO_ENSURE(msg_src.dim() == 3, op, ": msg_src must have 3 dims [N, H, C], got shape ", msg_src.sizes());
  const int64_t ns = msg_src.size(0), h = msg_src.size(1), c = msg_src.size(2);
  // The kernels address rows with 32-bit ids (attention.cu: row_start).
  constexpr int64_t max_rows = int64_t{1} << 32;
  GNNIO_ENSURE(ns < max_rows && num_dst < max_rows && num_edges < max_rows, op,
              ": node and edge counts must be below 2^32, got ", ns, " sources, ", num_dst, " targets, ", num_edges,
              " edges");
  GNNIO_ENSURE(h > 0 && c > 0 && c <= kMaxChannels, op, ": heads must be >= 1 and channels in 1..", kMaxChannels,
              ", got shape ", msg_src.sizes());
  const at::ScalarType dtype = msg_src.scalar_type();
  check_tensor(op, "msg_src", msg_src, dtype, {ns, h, c});
  if (kind == kDot) check_tensor(op, "key_src", required(op, "key_src", key_src, kind), dtype, {ns, h, c});
  if (kind != kGat) check_tensor(op, "dst_vec", required(op, "dst_vec", dst_vec, kind), dtype, {num_dst, h, c});
  if (kind == kGat) {
    check_tensor(op, "src_scalar", required(op, "src_scalar", src_scalar, kind), dtype, {ns, h});
    check_tensor(op, "dst_scalar", required(op, "dst_scalar", dst_scalar, kind), dtype, {num_dst, h});
  }
  if (kind == kGatV2) check_tensor(op, "att", required(op, "att", att, kind), dtype, {h, c});
  if (kind == kCosine) {
    // fp32 whatever the features' dtype: the norms divide every cosine, beta scales every score;
    // the norms as attention_row_norms gives them, (|x|, 1 / max(|x|, floor)) per (row, head)
    check_tensor(op, "src_scalar", required(op, "src_scalar", src_scalar, kind), at::kFloat, {ns, h, 2});
    check_tensor(op, "dst_scalar", required(op, "dst_scalar", dst_scalar, kind), at::kFloat, {num_dst, h, 2});
    check_tensor(op, "att", required(op, "att", att, kind), at::kFloat, {h});
    GNNIO_ENSURE(!edge.has_value(), op, ": kind 3 (cosine) takes no edge features");
    // key_src's slot: the target pass's d u of the same rows (source pass, x_dst is x_src)
    if (key_src.has_value()) check_tensor(op, "key_src", *key_src, dtype, {ns, h, c});
  }
  if (edge.has_value()) {
    if (kind == kGat)
      check_tensor(op, "edge", *edge, dtype, {num_edges, h});
    else
      check_tensor(op, "edge", *edge, dtype, {num_edges, h, c});
  }
  return Features{kind, h, c, ns, dtype, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge};
}

// Whether every [.., H, C] tensor of the call (and `more`) starts on a
// multiple of `elements` elements.
bool all_aligned(const Features& f, std::initializer_list<const at::Tensor*> more, int elements) {
  const uintptr_t align = elements * at::elementSize(f.dtype);
  auto aligned = [&](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0; };
  bool ok = aligned(f.msg_src);
  for (const auto* t : {&f.key_src, &f.dst_vec}) ok = ok && (!t->has_value() || aligned(**t));
  if (f.kind == kGatV2) ok = ok && aligned(*f.att);  // Cosine's att is beta, read one float at a time
  if (f.kind != kGat && f.edge.has_value()) ok = ok && aligned(*f.edge);
  for (const at::Tensor* t : more) ok = ok && aligned(*t);
  return ok;
}

// 4-wide loads need C % 4 == 0 and every [.., H, C] tensor aligned to 4 elements.
int vector_width(const Features& f, std::initializer_list<const at::Tensor*> more) {
  if (f.channels % 4 != 0 || f.channels > kMaxVectorChannels) return 1;
  return all_aligned(f, more, 4) ? 4 : 1;
}

// The fused forward also takes VEC 8 (two edges per warp at a time, see
// Layout) for 16-bit features with C % 8 == 0 and 8-element alignment.
int forward_vector_width(const Features& f, std::initializer_list<const at::Tensor*> more) {
  const int vec = vector_width(f, more);
  const bool paired = vec == 4 && at::elementSize(f.dtype) == 2 && f.channels % 8 == 0 && all_aligned(f, more, 8);
  return paired ? 8 : vec;
}

template <typename scalar_t>
const scalar_t* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<scalar_t>() : nullptr;
}

// The light rows of a pass in item order (for_each_item), [L, 3] (row,
// first slot, end slot): the first `busy` are the non-empty ones.
struct RowOrder {
  const int64_t* rows;
  int64_t busy;
  int64_t empty;
};

RowOrder row_order_view(const char* op, const RowSchedule& schedule, const at::Tensor& row_order,
                        int64_t num_busy_rows) {
  GNNIO_ENSURE(row_order.is_cuda() && row_order.scalar_type() == at::kLong && row_order.dim() == 2 &&
                  row_order.size(1) == 3 && row_order.is_contiguous(),
              op, ": row_order must be a contiguous int64 CUDA tensor of shape [L, 3] (row, first slot, end slot), got ",
              row_order.scalar_type(), " of shape ", row_order.sizes(), " on ", row_order.device());
  const int64_t light = row_order.size(0);
  GNNIO_ENSURE(light == schedule.num_rows - schedule.num_heavy, op, ": row_order must list the ",
              schedule.num_rows - schedule.num_heavy, " light rows, got ", light);
  GNNIO_ENSURE(num_busy_rows >= 0 && num_busy_rows <= light, op, ": num_busy_rows must be in 0..", light, ", got ",
              num_busy_rows);
  return RowOrder{row_order.data_ptr<int64_t>(), num_busy_rows, light - num_busy_rows};
}

template <typename scalar_t>
Params<scalar_t> make_params(const Features& f, const RowSchedule& schedule, const RowOrder& order,
                             const at::Tensor& indices, const at::Tensor& eid, int vec, double negative_slope,
                             double scale, double dropout, int64_t seed, int64_t offset) {
  Params<scalar_t> p{};
  p.schedule = schedule;
  p.indices = index_view(indices);
  p.eid = eid.data_ptr<int64_t>();
  p.geo = lane_geometry(static_cast<int>(f.heads), static_cast<int>(f.channels), vec, vec == 1 ? 8 : 1,
                        vec == 8 ? kWarp / 2 : kWarp);
  p.row_bounds = order.rows;
  p.num_busy_rows = order.busy;
  p.num_empty_rows = order.empty;
  p.msg_src = f.msg_src.data_ptr<scalar_t>();
  p.key_src = ptr_or_null<scalar_t>(f.key_src);
  p.dst_vec = ptr_or_null<scalar_t>(f.dst_vec);
  if (f.kind == kCosine) {
    p.src_norm = f.src_scalar->data_ptr<float>();
    p.dst_norm = f.dst_scalar->data_ptr<float>();
    p.unit_grad = ptr_or_null<scalar_t>(f.key_src);  // source pass only
    p.beta = f.att->data_ptr<float>();
  } else {
    p.src_scalar = ptr_or_null<scalar_t>(f.src_scalar);
    p.dst_scalar = ptr_or_null<scalar_t>(f.dst_scalar);
    p.att = ptr_or_null<scalar_t>(f.att);
  }
  p.edge = ptr_or_null<scalar_t>(f.edge);
  p.grad_vec_stride = f.heads * f.channels;
  p.grad_scalar_stride = f.heads;
  // GATv2's 16-bit scores take the slope in the features' type (see gatv2_hidden)
  p.slope = static_cast<float>(negative_slope);
  if (f.kind == kGatV2) p.slope = static_cast<float>(static_cast<scalar_t>(p.slope));
  p.scale = static_cast<float>(scale);
  p.dropout = Dropout{static_cast<float>(dropout), dropout < 1.0 ? static_cast<float>(1.0 / (1.0 - dropout)) : 0.f,
                      static_cast<uint64_t>(seed), static_cast<uint64_t>(offset)};
  return p;
}

void check_graph(const char* op, const at::Tensor& indices, const at::Tensor& eid, int64_t num_edges) {
  GNNIO_ENSURE(indices.is_cuda() && eid.is_cuda(), op, ": indices and eid must be CUDA tensors, got ", indices.device(),
              " and ", eid.device());
  GNNIO_ENSURE(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong, op,
              ": indices must be int32 or int64, got ", indices.scalar_type());
  GNNIO_ENSURE(eid.scalar_type() == at::kLong, op, ": eid must be int64, got ", eid.scalar_type());
  GNNIO_ENSURE(indices.is_contiguous() && eid.is_contiguous() && indices.numel() == num_edges &&
                  eid.numel() == num_edges,
              op, ": indices and eid must be contiguous with ", num_edges, " entries, got ", indices.numel(), " and ",
              eid.numel());
}

// Blocks of a pass whose warps loop over the work items (for_each_item): as
// many as stay resident on the GPU (this kernel's occupancy), never more than
// one item per warp. y: the head groups (heads wider than a warp's share).
template <typename Kernel, typename scalar_t>
dim3 resident_grid(Kernel kernel, const Params<scalar_t>& p, int shared_bytes = 0) {
  const int64_t items = p.schedule.num_tiles + p.num_busy_rows + (p.num_empty_rows + kWarp - 1) / kWarp;
  const int64_t needed = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarpsPerBlock * kWarp, shared_bytes);
  const int head_groups = (p.geo.heads + p.geo.heads_per_warp - 1) / p.geo.heads_per_warp;
  const int64_t resident =
      static_cast<int64_t>(std::max(per_sm, 1)) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::min(needed, std::max<int64_t>(1, resident / head_groups));
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(head_groups));
}

// Launches a pass whose warps loop over the work items on resident_grid,
// with shared_bytes of dynamic shared memory per block (the rings of the
// passes that gather ahead; resident_grid's blocks_per_sm lets the kernel
// have them).
template <typename Kernel, typename scalar_t>
void launch_resident(Kernel kernel, const Params<scalar_t>& p, cudaStream_t stream, int shared_bytes = 0) {
  const dim3 grid = resident_grid(kernel, p, shared_bytes);
  if (grid.x == 0) return;
  kernel<<<grid, kWarpsPerBlock * kWarp, shared_bytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Whether Dot's passes (dot_forward_ahead_kernel and the two backward ones)
// and GAT's fp32 forward (gat_forward_ahead_kernel) may gather ahead:
// copy_ahead needs compute capability 8.0 for its asynchronous copies
// (older GPUs would copy synchronously, no faster than the passes that
// gather per step). Each caller adds its own conditions: the layout, no edge
// features, and for the forwards and the source pass no dropout.
bool gathers_ahead() { return at::cuda::getCurrentDeviceProperties()->major >= 8; }

// Lanes per head of 32-channel heads (8 in the 4-wide layout, 4 in the
// 8-wide one). The forward of the kinds that sum a head's shares for every
// edge (GATv2, Dot) is also built for that width: 3 butterfly steps per
// head sum instead of 5, or 2 instead of 4, with no select.
template <int VEC>
constexpr int fixed_head_lanes() {
  return VEC == 1 ? 0 : kWarp / VEC;
}

// A pass that gathers ahead in the VEC-wide layout, built for 32-channel
// heads (HEAD_LANES fixed_head_lanes<VEC>()) where the head is that wide,
// else for any width.
template <typename Ring, int VEC, typename KernelForFixed, typename KernelForAny, typename scalar_t>
void launch_ahead(KernelForFixed for_fixed_lanes, KernelForAny for_any, const Params<scalar_t>& p,
                  cudaStream_t stream) {
  if (p.geo.lanes_per_head == fixed_head_lanes<VEC>()) {
    launch_resident(for_fixed_lanes, p, stream, Ring::kBlockBytes);
  } else {
    launch_resident(for_any, p, stream, Ring::kBlockBytes);
  }
}

// The fused forward (one pass, scores from the rows), built for the head
// width where that is one of fixed_head_lanes' widths.
template <int KIND, int VEC, typename scalar_t>
void launch_forward(const Params<scalar_t>& p, cudaStream_t stream) {
  // packed scores take 8 channels in every lane of a head, and no per-edge extras (see forward_kernel)
  constexpr int kPackedLanes = packed_head_lanes<KIND, VEC, scalar_t>();
  const bool plain = p.edge == nullptr && p.dropout.p <= 0.f && p.scores == nullptr;
  if constexpr (kPackedLanes > 0) {
    if (plain && p.geo.lanes_per_head == kPackedLanes && p.geo.channels == kPackedLanes * VEC) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, kPackedLanes>, p, stream);
      return;
    }
  }
  // GAT's 16-bit forward without those extras: the plain build (see forward_blocks_per_sm)
  if constexpr (KIND == kGat && VEC == 8) {
    if (plain) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, 0, true>, p, stream);
      return;
    }
  }
  constexpr int kFixed = fixed_head_lanes<VEC>();
  if constexpr ((KIND == kGatV2 || KIND == kDot) && kFixed > 0 && kFixed != kPackedLanes) {
    if (p.geo.lanes_per_head == kFixed) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, kFixed>, p, stream);
      return;
    }
  }
  launch_resident(forward_kernel<KIND, VEC, scalar_t>, p, stream);
}

// The fused forward in the VEC 8 layout (16-bit features only; the host
// picks it through forward_vector_width).
template <typename scalar_t>
void launch_paired_forward(int64_t kind, const Params<scalar_t>& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) == 2) {
    GNNIO_ATTENTION_KIND_SWITCH(kind, [&] { launch_forward<KIND, 8, scalar_t>(p, stream); });
  } else {
    TORCH_INTERNAL_ASSERT(false, "the VEC 8 attention forward takes 16-bit features only");
  }
}

// Dot's forward gathering ahead, in the 4-wide layout or (16-bit rows only)
// the 8-wide one.
template <typename scalar_t>
void launch_dot_forward_ahead(int vec, const Params<scalar_t>& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) == 2) {
    if (vec == 8) {
      launch_ahead<DotForwardRing<scalar_t, 8>, 8>(dot_forward_ahead_kernel<scalar_t, 8, fixed_head_lanes<8>()>,
                                                   dot_forward_ahead_kernel<scalar_t, 8, 0>, p, stream);
      return;
    }
  }
  TORCH_INTERNAL_ASSERT(vec == 4, "Dot's forward gathers ahead 4-wide, or 8-wide for 16-bit features");
  launch_ahead<DotForwardRing<scalar_t, 4>, 4>(dot_forward_ahead_kernel<scalar_t, 4, fixed_head_lanes<4>()>,
                                               dot_forward_ahead_kernel<scalar_t, 4, 0>, p, stream);
}

// CSR slots per warp of the edge-balanced score phase: enough warps to fill
// the GPU several times over, each with the same share of the edges.
constexpr int64_t kSlotsPerScoreWarp = 64;

// The hinted neighbour ids of a pass (Params::hinted), checked against its
// indices: int32 [E] on their device, or none.
const uint32_t* hinted_ids(const char* op, const c10::optional<at::Tensor>& hinted, const at::Tensor& indices) {
  if (!hinted.has_value()) return nullptr;
  const at::Tensor& h = *hinted;
  GNNIO_ENSURE(h.is_cuda() && h.device() == indices.device() && h.scalar_type() == at::kInt && h.dim() == 1 &&
                   h.is_contiguous() && h.numel() == indices.numel(),
               op, ": hinted_indices must be a contiguous int32 tensor of ", indices.numel(), " entries on ",
               indices.device(), ", got ", h.scalar_type(), " of shape ", h.sizes(), " on ", h.device());
  return reinterpret_cast<const uint32_t*>(h.data_ptr<int32_t>());
}

// Both forward ops: the fused pass alone (slot_rows null), or the
// edge-balanced score phase first and the fused pass reading its scores.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_impl(
    const char* op, int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const at::Tensor* slot_rows,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual,
    const c10::optional<at::Tensor>& hinted_indices = c10::nullopt) {
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f = check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar,
                                    dst_scalar, att, edge);
  GNNIO_ENSURE(return_scores >= 0 && return_scores <= 2, op,
              ": return_scores must be 0 (none), 1 (before dropout) or 2 (after dropout), got ", return_scores);
  if (bias.has_value()) check_tensor(op, "bias", *bias, f.dtype, {f.heads, f.channels});
  if (residual.has_value()) check_tensor(op, "residual", *residual, f.dtype, {num_dst, f.heads, f.channels});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);

  at::Tensor out = at::empty({num_dst, f.heads, f.channels}, msg_src.options());
  at::Tensor lse = at::empty({num_dst, f.heads}, float_options);
  at::Tensor scores = at::empty({return_scores ? num_edges : 0, f.heads}, float_options);
  // The tiles' softmax states (max, sum, accumulator) share one buffer: each
  // allocation costs the host microseconds before the first launch.
  const int64_t tiles = schedule.num_tiles;
  at::Tensor tile_states = at::empty({tiles * f.heads * (2 + f.channels)}, float_options);
  float* const part_acc = tile_states.data_ptr<float>();  // first: its rows take 16-byte stores
  float* const part_max = part_acc + tiles * f.heads * f.channels;
  float* const part_sum = part_max + tiles * f.heads;
  at::Tensor edge_scores;  // the edge-balanced schedule's score phase only
  if (slot_rows != nullptr) {
    GNNIO_ENSURE(slot_rows->is_cuda() && slot_rows->device() == msg_src.device() &&
                     slot_rows->scalar_type() == at::kInt && slot_rows->dim() == 1 && slot_rows->is_contiguous() &&
                     slot_rows->numel() == num_edges,
                 op, ": slot_rows must be a contiguous int32 tensor of ", num_edges, " entries on ", msg_src.device(),
                 ", got ", slot_rows->scalar_type(), " of shape ", slot_rows->sizes(), " on ", slot_rows->device());
    GNNIO_ENSURE(num_dst < (int64_t{1} << 31), op, ": slot_rows holds int32 rows; got ", num_dst, " targets");
    edge_scores = at::empty({num_edges, f.heads}, float_options);
  }
  // the edge-balanced schedule's fused pass keeps the one-edge-per-warp layouts
  const at::Tensor& bias_or_out = bias.has_value() ? *bias : out;  // alignment of each tensor read
  const at::Tensor& residual_or_out = residual.has_value() ? *residual : out;
  const int vec = slot_rows == nullptr ? forward_vector_width(f, {&out, &bias_or_out, &residual_or_out})
                                       : vector_width(f, {&out, &bias_or_out, &residual_or_out});
  // Dot's forward gathers ahead in the 4-wide layout and, for 16-bit rows, the 8-wide one (two edge
  // groups per warp). H100, rmat20, bf16 4 x 32: 1.97 ms per step (8-wide forward_kernel), 2.09
  // through the 4-wide ring (run 118), 1.69 through the 8-wide ring (run 128).
  const bool plain = slot_rows == nullptr && !edge.has_value() && dropout <= 0.0 && return_scores == 0;
  const bool dot_ahead = plain && kind == kDot && (vec == 4 || vec == 8) && gathers_ahead();
  const bool gat_ahead = plain && kind == kGat && vec == 4 && f.dtype == at::kFloat && gathers_ahead();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    p.out = out.data_ptr<scalar_t>();
    p.out_bias = ptr_or_null<scalar_t>(bias);
    p.out_residual = ptr_or_null<scalar_t>(residual);
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.lse = lse.data_ptr<float>();
    p.scores = return_scores ? scores.data_ptr<float>() : nullptr;
    p.scores_after_dropout = return_scores == 2;
    p.part_max = part_max;
    p.part_sum = part_sum;
    p.part_acc = part_acc;
    if (dot_ahead) {
      launch_dot_forward_ahead<scalar_t>(vec, p, stream);
    } else if (gat_ahead) {
      if constexpr (std::is_same<scalar_t, float>::value)  // gat_ahead: fp32 only
        launch_resident(gat_forward_ahead_kernel, p, stream, GatForwardRing::kBlockBytes);
    } else if (vec == 8) {
      launch_paired_forward<scalar_t>(kind, p, stream);
    } else GNNIO_ATTENTION_SWITCH(kind, vec, [&] {
      if (slot_rows == nullptr) {
        launch_forward<KIND, VEC, scalar_t>(p, stream);
        return;
      }
      if (num_edges > 0) {
        const int64_t warps = (num_edges + kSlotsPerScoreWarp - 1) / kSlotsPerScoreWarp;
        const int head_groups = (p.geo.heads + p.geo.heads_per_warp - 1) / p.geo.heads_per_warp;
        const dim3 score_grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock),
                              static_cast<unsigned>(head_groups));
        edge_scores_kernel<KIND, VEC, scalar_t><<<score_grid, kWarpsPerBlock * kWarp, 0, stream>>>(
            p, slot_rows->data_ptr<int32_t>(), num_edges, kSlotsPerScoreWarp, edge_scores.data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      p.scores_in = edge_scores.data_ptr<float>();
      launch_resident(forward_kernel<KIND, VEC, scalar_t, true>, p, stream);
    });
    if (schedule.num_heavy > 0) {
      const int threads = merge_threads(f.heads * f.channels);
      merge_tiles_kernel<scalar_t><<<static_cast<unsigned>(schedule.num_heavy), threads, 0, stream>>>(
          schedule, static_cast<int>(f.heads), static_cast<int>(f.channels), p.part_max, p.part_sum, p.part_acc,
          p.out_bias, p.out_residual, p.out, p.lse);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {out, lse, scores};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(
    int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& hinted_indices, const c10::optional<at::Tensor>& residual) {
  return forward_impl(kForward, kind, indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr,
                      tile_edges, row_order, num_busy_rows, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att,
                      edge, negative_slope, scale, dropout, seed, offset, return_scores, nullptr, bias, residual,
                      hinted_indices);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward_edge_balanced(
    int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const at::Tensor& slot_rows,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual) {
  return forward_impl(kForwardEdgeBalanced, kind, indptr, indices, eid, tile_row, tile_start, heavy_rows,
                      heavy_tile_ptr, tile_edges, row_order, num_busy_rows, msg_src, key_src, dst_vec, src_scalar,
                      dst_scalar, att, edge, negative_slope, scale, dropout, seed, offset, return_scores, &slot_rows,
                      bias, residual);
}

// Heavy rows of the backward source pass: the tiles' partial rows [T, width]
// added in tile order into their rows of out ([N, H, C] or [N, H]), and
// where given partial2's into out2's in the same pass (Dot's and Cosine's d key
// beside d value: one pass of one block per heavy row, not two).
void sum_tiles(const RowSchedule& s, int64_t width, const at::Tensor& partial, const at::Tensor& out,
               const at::Tensor* partial2 = nullptr, const at::Tensor* out2 = nullptr) {
  at::Tensor rows = out.view({out.size(0), width});
  at::Tensor rows2 = out2 != nullptr ? out2->view({out2->size(0), width}) : at::Tensor();
  merge_partial_sums(s, partial, rows, partial2, out2 != nullptr ? &rows2 : nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_target(
    int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& grad_out,
    const at::Tensor& lse, double negative_slope, double scale, double dropout, int64_t seed, int64_t offset) {
  const char* op = kBackwardTarget;
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  check_tensor(op, "grad_out", grad_out, f.dtype, {num_dst, f.heads, f.channels});
  check_tensor(op, "lse", lse, at::kFloat, {num_dst, f.heads});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t tiles = schedule.num_tiles;
  const int64_t per_head = kind == kGat ? 1 : f.channels;

  at::Tensor grad_dst = at::empty({num_dst, f.heads * per_head}, msg_src.options());
  // (lse, delta[, 1 / |x_dst|, 0]) per (target, head): the source pass's row_stats (store_row_stats)
  at::Tensor row_stats = at::empty({num_dst, f.heads, row_stats_width(kind)}, float_options);
  at::Tensor part_delta = at::empty({tiles, f.heads}, float_options);
  at::Tensor part_weighted = at::empty({tiles, f.heads * per_head}, float_options);
  at::Tensor part_plain = at::empty({tiles, f.heads * per_head}, float_options);
  const int64_t att_tiles = kind == kGatV2 ? tiles : 0;
  at::Tensor part_att_weighted = at::empty({att_tiles, f.heads * f.channels}, float_options);
  at::Tensor part_att_plain = at::empty({att_tiles, f.heads * f.channels}, float_options);
  at::Tensor att_rows = at::empty({kind == kGatV2 ? schedule.num_heavy : 0, f.heads * f.channels}, float_options);
  // Cosine: the tiles' and the heavy rows' shares of d beta
  const bool cosine = kind == kCosine;
  at::Tensor part_beta_weighted = at::empty({cosine ? tiles : 0, f.heads}, float_options);
  at::Tensor part_beta_plain = at::empty({cosine ? tiles : 0, f.heads}, float_options);
  at::Tensor beta_rows = at::empty({cosine ? schedule.num_heavy : 0, f.heads}, float_options);
  const int vec = vector_width(f, {&grad_out, &grad_dst});
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor grad_att = at::empty({0}, msg_src.options());

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    at::Tensor att_partial = at::empty({0, f.heads * f.channels}, float_options);
    p.grad_out = grad_out.data_ptr<scalar_t>();
    p.lse_in = lse.data_ptr<float>();
    p.grad_vec = kind == kGat ? nullptr : grad_dst.data_ptr<scalar_t>();
    p.grad_scalar = kind == kGat ? grad_dst.data_ptr<scalar_t>() : nullptr;
    p.stats_out = row_stats.data_ptr<float>();
    p.part_delta = part_delta.data_ptr<float>();
    p.part_vec = part_weighted.data_ptr<float>();
    p.part_vec2 = part_plain.data_ptr<float>();
    p.part_scalar = (cosine ? part_beta_weighted : part_weighted).data_ptr<float>();
    p.part_scalar2 = (cosine ? part_beta_plain : part_plain).data_ptr<float>();
    p.part_att = part_att_weighted.data_ptr<float>();
    p.part_att2 = part_att_plain.data_ptr<float>();
    GNNIO_ATTENTION_SWITCH(kind, vec, [&] {
      const auto kernel = backward_target_kernel<KIND, VEC, scalar_t>;
      const dim3 grid = resident_grid(kernel, p);
      // GATv2: one attention-vector partial row per resident warp; Cosine: one d beta row
      if (kind == kGatV2) att_partial = at::empty({grid.x * int64_t{kWarpsPerBlock}, f.heads * f.channels}, float_options);
      if (cosine) att_partial = at::zeros({grid.x * int64_t{kWarpsPerBlock}, f.heads}, float_options);
      p.att_partial = att_partial.data_ptr<float>();
      if (grid.x == 0) return;
      kernel<<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (schedule.num_heavy > 0) {
      const int threads = merge_threads(f.heads * per_head);
      finish_target_tiles_kernel<scalar_t><<<static_cast<unsigned>(schedule.num_heavy), threads, 0, stream>>>(
          schedule, static_cast<int>(f.heads), static_cast<int>(per_head), kind == kDot || cosine ? p.scale : 1.f,
          cosine ? p.beta : nullptr, p.part_delta, p.part_vec, p.part_vec2, p.part_att, p.part_att2, p.part_scalar,
          p.part_scalar2, grad_dst.data_ptr<scalar_t>(), p.lse_in, cosine ? p.dst_norm : nullptr, p.stats_out,
          kind == kGatV2 ? att_rows.data_ptr<float>() : nullptr, cosine ? beta_rows.data_ptr<float>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (kind == kGatV2) grad_att = (att_partial.sum(0) + att_rows.sum(0)).view({f.heads, f.channels}).to(f.dtype);
    // fp32 like beta itself
    if (cosine) grad_att = att_partial.sum(0) + beta_rows.sum(0);
  });
  if (kind != kGat) grad_dst = grad_dst.view({num_dst, f.heads, f.channels});
  return {grad_dst, grad_att, row_stats};
}

// Blocks of the node-level Cosine kernels: one warp per (node, head) row.
unsigned unit_row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Elements per read of the row-dots kernels: a 16-byte chunk where every [.., C] row of a (and of b,
// offset and residual, where given) allows it, else one.
template <typename scalar_t>
int row_chunk(const at::Tensor& a, const at::Tensor* b, const c10::optional<at::Tensor>& offset,
              const c10::optional<at::Tensor>& residual) {
  constexpr int kVec = vec_width<scalar_t>();
  const int64_t channels = a.size(2);
  const bool whole_chunks = rows_vectorisable(a, channels, kVec) &&
                            (b == nullptr || rows_vectorisable(*b, channels, kVec)) &&
                            (!offset.has_value() || rows_vectorisable(*offset, channels, kVec)) &&
                            (!residual.has_value() || rows_vectorisable(*residual, channels, kVec));
  return whole_chunks ? kVec : 1;
}

// Launches row_dots_kernel in 16-byte chunks where every row allows, else one element at a time.
template <bool NORMS, typename scalar_t>
void launch_row_dots(const at::Tensor& a, const at::Tensor* b, const c10::optional<at::Tensor>& offset,
                     const c10::optional<at::Tensor>& residual, const float* lse, float* dots, cudaStream_t stream) {
  const int64_t heads = a.size(1), channels = a.size(2), rows = a.size(0) * heads;
  const int vec = row_chunk<scalar_t>(a, b, offset, residual);
  const int lanes = lanes_per_edge(channels / vec);
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
  const int64_t groups = (rows + group_rows - 1) / group_rows;
  constexpr int kVec = vec_width<scalar_t>();
  const auto kernel = vec == kVec ? row_dots_kernel<scalar_t, kVec, NORMS> : row_dots_kernel<scalar_t, 1, NORMS>;
  const int64_t warps = std::min(groups, resident_blocks(kernel, (groups + kWarpsPerBlock - 1) / kWarpsPerBlock) *
                                             kWarpsPerBlock);
  kernel<<<unit_row_blocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
      a.data_ptr<scalar_t>(), b == nullptr ? nullptr : b->data_ptr<scalar_t>(), ptr_or_null<scalar_t>(offset),
      ptr_or_null<scalar_t>(residual), lse, rows, static_cast<int>(heads), static_cast<int>(channels), lanes, warps,
      dots);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// GAT's packed gradients (see the schemas): [N, H * C + 2H], rows of (d x_src,
// d alpha_src, d alpha_dst), for x_src and alpha_dst rows of the same nodes.
int64_t check_packed_grads(const char* op, const c10::optional<at::Tensor>& packed, const Features& f,
                           int64_t num_dst) {
  if (!packed.has_value()) return 0;
  GNNIO_ENSURE(f.kind == kGat, op, ": packed_grads are for kind 0 (GAT) only, got kind ", f.kind);
  GNNIO_ENSURE(f.num_src == num_dst, op, ": packed_grads need as many sources as targets, got ", f.num_src, " and ",
              num_dst);
  const int64_t width = f.heads * f.channels + 2 * f.heads;
  check_tensor(op, "packed_grads", *packed, f.dtype, {f.num_src, width});
  return width;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_source(
    int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& grad_out,
    const at::Tensor& row_stats, double negative_slope, double scale, double dropout,
    int64_t seed, int64_t offset, bool write_edge_grads, const c10::optional<at::Tensor>& packed_grads,
    const c10::optional<at::Tensor>& hinted_indices) {
  const char* op = kBackwardSource;
  const int64_t num_src = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_src, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  GNNIO_ENSURE(grad_out.dim() == 3, op, ": grad_out must have 3 dims [Nd, H, C], got shape ", grad_out.sizes());
  const int64_t num_dst = grad_out.size(0);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  GNNIO_ENSURE(f.num_src == num_src, op, ": msg_src has ", f.num_src, " rows but the CSC has ", num_src);
  check_tensor(op, "grad_out", grad_out, f.dtype, {num_dst, f.heads, f.channels});
  // (lse, delta[, 1 / |x_dst|, 0]) side by side, as attention_row_dots (given lse) or attention_backward_target
  // writes them: the pass gathers them for every edge
  check_tensor(op, "row_stats", row_stats, at::kFloat, {num_dst, f.heads, row_stats_width(kind)});
  GNNIO_ENSURE(!write_edge_grads || kind == kGat || kind == kDot, op,
              ": edge gradients are written for kinds 0 (GAT) and 2 (dot) only, got kind ", kind);
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t tiles = schedule.num_tiles;

  at::Tensor edge_grads = at::empty({write_edge_grads ? num_edges : 0, f.heads}, float_options);
  const int64_t packed_width = check_packed_grads(op, packed_grads, f, num_dst);
  const int64_t row_width = f.heads * f.channels;
  // packed: d x_src and d alpha_src are views of packed_grads' rows
  at::Tensor grad_msg = packed_width > 0 ? packed_grads->narrow(1, 0, row_width).view({num_src, f.heads, f.channels})
                                         : at::empty({num_src, f.heads, f.channels}, msg_src.options());
  // Cosine: d u_src through the scores, kept only for the heavy rows' node pass (the light rows' is folded in)
  const bool has_key = kind == kDot || kind == kCosine;
  const int64_t key_rows = kind == kDot || (kind == kCosine && schedule.num_heavy > 0) ? num_src : 0;
  at::Tensor grad_key = at::empty({key_rows, f.heads, f.channels}, msg_src.options());
  at::Tensor grad_scalar = packed_width > 0 ? packed_grads->narrow(1, row_width, f.heads)
                                            : at::empty({kind == kGat ? num_src : 0, f.heads}, msg_src.options());
  at::Tensor grad_edge = edge.has_value() ? at::empty_like(*edge) : at::empty({0}, msg_src.options());
  at::Tensor part_vec = at::empty({tiles, f.heads, f.channels}, float_options);
  at::Tensor part_vec2 = at::empty({has_key ? tiles : 0, f.heads, f.channels}, float_options);
  at::Tensor part_scalar = at::empty({kind == kGat ? tiles : 0, f.heads}, float_options);
  // 4-wide stores into packed rows need their width a multiple of 4 as well
  const int vec = packed_width % 4 == 0 ? vector_width(f, {&grad_out, &grad_msg, &grad_key, &grad_edge}) : 1;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    if (packed_width > 0) p.grad_vec_stride = p.grad_scalar_stride = packed_width;
    p.grad_out = grad_out.data_ptr<scalar_t>();
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.row_stats = row_stats.data_ptr<float>();
    p.grad_vec = grad_msg.data_ptr<scalar_t>();
    p.grad_vec2 = has_key ? grad_key.data_ptr<scalar_t>() : nullptr;
    p.grad_scalar = kind == kGat ? grad_scalar.data_ptr<scalar_t>() : nullptr;
    p.grad_edge = edge.has_value() ? grad_edge.data_ptr<scalar_t>() : nullptr;
    p.edge_grads = write_edge_grads ? edge_grads.data_ptr<float>() : nullptr;
    p.part_vec = part_vec.data_ptr<float>();
    p.part_vec2 = part_vec2.data_ptr<float>();
    p.part_scalar = part_scalar.data_ptr<float>();
    if (kind == kDot && vec == 4 && p.edge == nullptr && p.dropout.p <= 0.f && gathers_ahead()) {
      launch_ahead<DotSourceRing<scalar_t>, 4>(dot_source_ahead_kernel<scalar_t, 8>,
                                               dot_source_ahead_kernel<scalar_t, 0>, p, stream);
    } else {
      GNNIO_ATTENTION_SWITCH(kind, vec, [&] { launch_resident(backward_source_kernel<KIND, VEC, scalar_t>, p, stream); });
    }
    sum_tiles(schedule, f.heads * f.channels, part_vec, grad_msg, has_key ? &part_vec2 : nullptr,
              has_key ? &grad_key : nullptr);
    if (kind == kGat) sum_tiles(schedule, f.heads, part_scalar, grad_scalar);
    if (kind == kCosine && schedule.num_heavy > 0) {
      // the heavy rows' d x_src = V + F.normalize's backward of B (+ A), V already in grad_msg
      const int64_t rows = schedule.num_heavy * f.heads;
      unit_rows_backward_kernel<scalar_t><<<unit_row_blocks(rows), kWarpsPerBlock * kWarp, 0, stream>>>(
          p.msg_src, p.src_norm, grad_key.data_ptr<scalar_t>(), p.unit_grad, grad_msg.data_ptr<scalar_t>(), rows,
          schedule.heavy_rows, static_cast<int>(f.heads), static_cast<int>(f.channels),
          grad_msg.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  if (kind == kCosine) grad_key = at::empty({0}, msg_src.options());  // scratch, not an output
  return {grad_msg, grad_key, grad_scalar, grad_edge, edge_grads};
}

// GAT's and Dot's target-side gradients from the source pass's edge_grads
// (gat_target_sums_kernel, dot_target_from_edges_kernel): d alpha_dst [Nd, H] or d query [Nd, H, C].
at::Tensor attention_backward_target_from_edges(
    int64_t kind, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& edge_grads,
    const at::Tensor& edge_grad_slots, const c10::optional<at::Tensor>& packed_grads,
    const c10::optional<at::Tensor>& hinted_indices) {
  const char* op = kBackwardTargetFromEdges;
  GNNIO_ENSURE(kind == kGat || kind == kDot, op, ": kind must be 0 (GAT) or 2 (dot), got ", kind);
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  check_tensor(op, "edge_grads", edge_grads, at::kFloat, {num_edges, f.heads});
  check_tensor(op, "edge_grad_slots", edge_grad_slots, at::kLong, {num_edges});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t per_head = kind == kGat ? 1 : f.channels;
  const int64_t packed_width = check_packed_grads(op, packed_grads, f, num_dst);
  // packed: d alpha_dst is a view of packed_grads' last H columns
  at::Tensor grad_dst = packed_width > 0 ? packed_grads->narrow(1, packed_width - f.heads, f.heads)
                                         : at::empty({num_dst, f.heads * per_head}, msg_src.options());
  at::Tensor partial = at::empty({schedule.num_tiles, f.heads * per_head}, float_options);
  const int vec = vector_width(f, {&grad_dst});
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p = make_params<scalar_t>(f, schedule, order, indices, eid, vec, 0.0, 1.0, 0.0, 0, 0);
    p.edge_grads_in = edge_grads.data_ptr<float>();
    p.edge_grad_slot = edge_grad_slots.data_ptr<int64_t>();
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.grad_vec = kind == kDot ? grad_dst.data_ptr<scalar_t>() : nullptr;
    p.grad_scalar = kind == kGat ? grad_dst.data_ptr<scalar_t>() : nullptr;
    if (packed_width > 0) p.grad_scalar_stride = packed_width;
    p.part_vec = partial.data_ptr<float>();
    p.part_scalar = partial.data_ptr<float>();
    if (kind == kGat) {
      const int64_t items = schedule.num_tiles + order.busy + order.empty;
      const int64_t threads = kWarpsPerBlock * kWarp;
      const bool four_heads = f.heads % 4 == 0 && reinterpret_cast<uintptr_t>(p.edge_grads_in) % 16 == 0;
      const unsigned blocks = static_cast<unsigned>((items + threads - 1) / threads);
      if (items > 0 && four_heads) gat_target_sums_kernel<scalar_t, 4><<<blocks, threads, 0, stream>>>(p);
      if (items > 0 && !four_heads) gat_target_sums_kernel<scalar_t, 1><<<blocks, threads, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (kind == kDot && vec == 4 && p.edge == nullptr && gathers_ahead()) {
      launch_resident(dot_target_ahead_kernel<scalar_t>, p, stream, DotTargetRing<scalar_t>::kBlockBytes);
    } else if (kind == kDot && vec == 4) {
      launch_resident(dot_target_from_edges_kernel<4, scalar_t>, p, stream);
    }
    if (kind == kDot && vec == 1) launch_resident(dot_target_from_edges_kernel<1, scalar_t>, p, stream);
    sum_tiles(schedule, f.heads * per_head, partial, grad_dst);
  });
  if (kind == kDot) grad_dst = grad_dst.view({num_dst, f.heads, f.channels});
  return grad_dst;
}

constexpr const char* kRowNorms = "gnnio::attention_row_norms";
constexpr const char* kUnitRowsBackward = "gnnio::attention_unit_rows_backward";
constexpr const char* kRowDots = "gnnio::attention_row_dots";

void check_rows(const char* op, const char* name, const at::Tensor& t) {
  GNNIO_ENSURE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device());
  GNNIO_ENSURE(t.dim() == 3, op, ": ", name, " must have 3 dims [N, H, C], got shape ", t.sizes());
  GNNIO_ENSURE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
}

// x [N, H, C] -> (|x|, 1 / max(|x|, floor)) fp32 [N, H, 2].
at::Tensor attention_row_norms(const at::Tensor& x) {
  check_rows(kRowNorms, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0) * x.size(1);
  at::Tensor norm = at::empty({x.size(0), x.size(1), 2}, x.options().dtype(at::kFloat));
  if (rows == 0) return norm;
  if (x.size(2) == 0) {  // empty rows: norm 0, clamped to the floor
    norm.select(2, 0).zero_();
    norm.select(2, 1).fill_(1.f / kNormFloor);  // fp32, as the kernel divides
    return norm;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), kRowNorms, [&] {
    launch_row_dots<true, scalar_t>(x, nullptr, c10::nullopt, c10::nullopt, nullptr, norm.data_ptr<float>(), stream);
  });
  return norm;
}

// a, b [N, H, C] (offset [H, C]) -> (<a, b - offset> per (node, head) fp32 [N, H],
// or with lse [N, H] the pairs (lse, <a, b - offset>) fp32 [N, H, 2];
// with column_sums a's sums over the nodes fp32 [H, C], else empty).
std::tuple<at::Tensor, at::Tensor> attention_row_dots(const at::Tensor& a, const at::Tensor& b,
                                                      const c10::optional<at::Tensor>& offset,
                                                      const c10::optional<at::Tensor>& lse, bool column_sums,
                                                      const c10::optional<at::Tensor>& residual) {
  check_rows(kRowDots, "a", a);
  check_tensor(kRowDots, "b", b, a.scalar_type(), {a.size(0), a.size(1), a.size(2)});
  if (offset.has_value()) check_tensor(kRowDots, "offset", *offset, a.scalar_type(), {a.size(1), a.size(2)});
  if (residual.has_value()) check_tensor(kRowDots, "residual", *residual, a.scalar_type(), {a.size(0), a.size(1), a.size(2)});
  if (lse.has_value()) check_tensor(kRowDots, "lse", *lse, at::kFloat, {a.size(0), a.size(1)});
  const int64_t nodes = a.size(0), heads = a.size(1), channels = a.size(2);
  GNNIO_ENSURE(!column_sums || channels <= kMaxBiasChannels, kRowDots, ": column sums take heads of at most ",
              kMaxBiasChannels, " channels, got ", channels);
  const c10::cuda::CUDAGuard guard(a.device());
  const auto float_options = a.options().dtype(at::kFloat);
  const int64_t rows = nodes * heads;
  at::Tensor dots = lse.has_value() ? at::empty({nodes, heads, 2}, float_options)
                                    : at::empty({nodes, heads}, float_options);
  at::Tensor sums = at::empty({column_sums ? heads : 0, channels}, float_options);
  if (rows == 0 || channels == 0) {
    sums.zero_();
    if (lse.has_value()) return {at::stack({*lse, at::zeros_like(*lse)}, -1), sums};
    return {dots.zero_(), sums};
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(a.scalar_type(), kRowDots, [&] {
    const float* lse_data = lse.has_value() ? lse->data_ptr<float>() : nullptr;
    if (!column_sums) {
      launch_row_dots<false, scalar_t>(a, &b, offset, residual, lse_data, dots.data_ptr<float>(), stream);
      return;
    }
    constexpr int kVec = vec_width<scalar_t>();
    const int vec = row_chunk<scalar_t>(a, &b, offset, residual);
    const int lanes = lanes_per_edge(channels / vec);
    const auto kernel = vec == kVec ? row_dots_columns_kernel<scalar_t, kVec> : row_dots_columns_kernel<scalar_t, 1>;
    // the resident warps loop over the groups of rows, a multiple of `step` warps (see row_dots_columns_kernel)
    const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
    const int64_t groups = (rows + group_rows - 1) / group_rows;
    const int64_t step = heads / std::gcd(heads, group_rows);
    const int64_t resident = resident_blocks(kernel, (groups + kWarpsPerBlock - 1) / kWarpsPerBlock) * kWarpsPerBlock;
    const int64_t warps = std::max(step, std::min(resident, groups) / step * step);
    at::Tensor partials = at::empty({warps * group_rows, channels}, float_options);
    kernel<<<unit_row_blocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
        a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(offset), ptr_or_null<scalar_t>(residual),
        lse_data, rows,
        static_cast<int>(heads), static_cast<int>(channels), lanes, warps, dots.data_ptr<float>(),
        partials.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // partial row p belongs to head p % heads; summed in a fixed order (deterministic)
    at::sum_out(sums, partials.view({-1, heads, channels}), {0});
  });
  return {dots, sums};
}

// grad_x = (g - [|x| >= 1e-12] <g, u> u) / max(|x|, 1e-12), g = grad_unit, u = x / max(|x|, 1e-12).
// (The kernel's second gradient and direct term serve the source pass's heavy rows.)
at::Tensor attention_unit_rows_backward(const at::Tensor& x, const at::Tensor& norm, const at::Tensor& grad_unit) {
  const char* op = kUnitRowsBackward;
  check_rows(op, "x", x);
  check_tensor(op, "grad_unit", grad_unit, x.scalar_type(), {x.size(0), x.size(1), x.size(2)});
  check_tensor(op, "norm", norm, at::kFloat, {x.size(0), x.size(1), 2});
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0) * x.size(1);
  at::Tensor grad_x = at::empty_like(x);
  if (rows == 0 || x.size(2) == 0) return grad_x;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), op, [&] {
    unit_rows_backward_kernel<scalar_t><<<unit_row_blocks(rows), kWarpsPerBlock * kWarp, 0, stream>>>(
        x.data_ptr<scalar_t>(), norm.data_ptr<float>(), grad_unit.data_ptr<scalar_t>(), nullptr, nullptr, rows, nullptr,
        static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), grad_x.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_x;
}

// (seed, offset) for `increment` Philox draws per thread from the current
// device's default CUDA generator, advancing it as torch's own dropout does.
std::vector<int64_t> attention_dropout_seed(int64_t increment) {
  GNNIO_ENSURE(increment > 0, "gnnio::attention_dropout_seed: increment must be positive, got ", increment);
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(c10::nullopt,
                                                                  at::cuda::detail::getDefaultCUDAGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  const at::PhiloxCudaState state = gen->philox_cuda_state(static_cast<uint64_t>((increment + 3) / 4 * 4));
  GNNIO_ENSURE(!state.captured_, "gnnio::attention_dropout_seed: attention dropout cannot run under CUDA graph capture");
  return {static_cast<int64_t>(state.seed_.val), static_cast<int64_t>(state.offset_.val)};
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

// Schemas. kind: 0 GAT, 1 GATv2, 2 dot product (Transformer), 3 cosine (AGNN). The
// graph arguments are (indptr, indices, eid) of the CSR for the forward and
// target-side passes, of the CSC for the source-side pass, each with its row
// schedule (common.cuh) and row_order: int64 [L, 3], the light rows (at
// most tile_edges slots) each with its first and end slot, the
// num_busy_rows non-empty ones first by descending length, then the empty
// ones (gnnio_cli/ops/attention_native.py builds it once per graph).
// Per-edge tensors are in eid order. hinted_indices (forward, source pass,
// target pass from edges; optional): the pass's indices as int32 with bit 31
// set where the neighbour's rows are rarely read; Dot's passes that gather
// ahead then give those rows L2's evict-first policy (attention_native.py's
// hinted_indices builds them). Results do not depend on them.
//   msg_src [Ns, H, C]: x_src (GAT, GATv2, cosine) or value (dot)
//   key_src [Ns, H, C]: key (dot);  dst_vec [Nd, H, C]: x_dst (GATv2, cosine) or query (dot)
//   src_scalar [Ns, H], dst_scalar [Nd, H]: alpha_src, alpha_dst (GAT);
//     src_scalar fp32 [Ns, H, 2], dst_scalar fp32 [Nd, H, 2]: attention_row_norms of x_src, x_dst (cosine)
//   att [H, C] (GATv2) or beta fp32 [H] (cosine);  edge: [E, H] (GAT) or [E, H, C]
// attention_forward -> (out [Nd, H, C] (+ bias [H, C] and + residual
//   [Nd, H, C] when given: a layer's output bias and skip connection, added
//   at the store), lse fp32 [Nd, H] (0 for empty rows),
//   scores fp32 [E, H] raw scores when return_scores is 1, or 2 for -inf on
//   dropped edges; [0, H] otherwise).
// attention_backward_target (every kind; the host runs GAT and dot in fp32
//   through attention_backward_target_from_edges instead) -> (grad of dst_vec [Nd, H, C] or dst_scalar [Nd, H],
//   grad of att [H, C] (GATv2) or of beta fp32 [H] (cosine), else empty; row_stats for
//   the source pass: (lse, delta) fp32 [Nd, H, 2], or for cosine (lse, delta,
//   1 / max(|x_dst|, 1e-12), 0) fp32 [Nd, H, 4]; an empty row's (0, 0[, 0, 0])).
// attention_backward_source (row_stats: attention_backward_target's, or for GAT and
//   dot the pairs (lse, delta) fp32 [Nd, H, 2] that attention_row_dots gives with lse) ->
//   (grad of msg_src, grad of key_src (dot, else empty), grad of src_scalar
//   (GAT, else empty), grad of edge (else empty),
//   edge_grads fp32 [E, H] in CSC slot order when write_edge_grads, GAT and
//   dot only: each edge's s_e = d z_e (GAT) or scale * d score_e (dot); else empty).
//   packed_grads (GAT, as many sources as targets): [N, H*C + 2H] whose rows
//   take (d x_src, d alpha_src, d alpha_dst); the first two come back as views
//   of it, and attention_backward_target_from_edges given the same tensor
//   writes the third: a layer that projected all three from one x (GATConv)
//   then takes x's gradient in one GEMM over these rows.
// attention_backward_target_from_edges(kind 0 or 2, CSR graph, tensors,
//   edge_grads, edge_grad_slots int64 [E]: the CSC slot of each CSR slot) ->
//   grad of dst_scalar [Nd, H] (GAT; a view of packed_grads when given) or of dst_vec [Nd, H, C] (dot): sums
//   over each target's in-edges of s_e (x key_s + edge_e).
// attention_row_dots(a, b [N, H, C], offset [H, C] or None, lse [N, H] or None,
//   column_sums, residual [N, H, C] or None) -> (<a, b - offset - residual>
//   fp32 [N, H] (delta from the saved output, less the bias and residual the
//   forward added), or with lse the pairs (lse, delta) fp32
//   [N, H, 2], which attention_backward_source takes as its delta; a's sums
//   over the nodes fp32 [H, C] with column_sums (C <= 32: the gradient of
//   that bias), else empty).
//   Cosine: the first holds the whole d out / d x_src (messages, scores, and
//   F.normalize's backward; with key_src set to the target pass's d u_dst when
//   x_dst is x_src, that too), the others are empty.
// attention_row_norms(x [N, H, C]) -> (|x|, 1 / max(|x|, 1e-12)) fp32 [N, H, 2].
// attention_unit_rows_backward(x, norm (attention_row_norms'), grad_unit) -> the gradient of x through
//   x / max(|x|, 1e-12) (F.normalize) of grad_unit.
// Deterministic; no atomics.
#define GNNIO_ATTENTION_GRAPH_ARGS                                                                          \
  "Tensor indptr, Tensor indices, Tensor eid, Tensor tile_row, Tensor tile_start, Tensor heavy_rows, " \
  "Tensor heavy_tile_ptr, int tile_edges, Tensor row_order, int num_busy_rows, Tensor msg_src, "             \
  "Tensor? key_src, Tensor? dst_vec, Tensor? src_scalar, Tensor? dst_scalar, Tensor? att, Tensor? edge, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("attention_forward(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "float negative_slope, float scale, float dropout, int seed, int offset, int return_scores, "
        "Tensor? bias=None, Tensor? hinted_indices=None, Tensor? residual=None) -> (Tensor, Tensor, Tensor)");
  m.def("attention_forward_edge_balanced(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "float negative_slope, float scale, float dropout, int seed, int offset, int return_scores, "
        "Tensor slot_rows, Tensor? bias=None, Tensor? residual=None) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward_target(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor grad_out, Tensor lse, float negative_slope, float scale, float dropout, int seed, int offset) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("attention_backward_source(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor grad_out, Tensor row_stats, float negative_slope, float scale, float dropout, int seed, "
        "int offset, bool write_edge_grads, Tensor? packed_grads=None, Tensor? hinted_indices=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("attention_backward_target_from_edges(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor edge_grads, Tensor edge_grad_slots, Tensor? packed_grads=None, Tensor? hinted_indices=None) "
        "-> Tensor");
  m.def("attention_dropout_seed(int increment) -> int[]", &gnnio::attention::attention_dropout_seed);
  m.def("attention_row_norms(Tensor x) -> Tensor");
  m.def("attention_row_dots(Tensor a, Tensor b, Tensor? offset=None, Tensor? lse=None, bool column_sums=False, "
        "Tensor? residual=None) -> (Tensor, Tensor)");
  m.def("attention_unit_rows_backward(Tensor x, Tensor norm, Tensor grad_unit) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("attention_forward", &gnnio::attention::attention_forward);
  m.impl("attention_forward_edge_balanced", &gnnio::attention::attention_forward_edge_balanced);
  m.impl("attention_backward_target", &gnnio::attention::attention_backward_target);
  m.impl("attention_backward_source", &gnnio::attention::attention_backward_source);
  m.impl("attention_backward_target_from_edges", &gnnio::attention::attention_backward_target_from_edges);
  m.impl("attention_row_norms", &gnnio::attention::attention_row_norms);
  m.impl("attention_row_dots", &gnnio::attention::attention_row_dots);
  m.impl("attention_unit_rows_backward", &gnnio::attention::attention_unit_rows_backward);
}
