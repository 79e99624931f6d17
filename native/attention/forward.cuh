// The forward passes: the fused online-softmax pass (forward_kernel, with
// its packed 16-bit scores on the tensor cores), the edge-balanced score
// phase and the merge of split rows' tiles. See passes.cuh for the overview.
#pragma once

#include "passes.cuh"

namespace gnnio {
namespace attention {
namespace {

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
    store_out_row<VEC, scalar_t, ONCE>(p, item.row, geo, lane, acc);
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
  store_out_row<VEC, scalar_t, ONCE>(p, row, geo, lane, zero);
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
// out_t: the output's type and the bias's, scalar_t or fp32 (Params::out_f32).
template <typename scalar_t, typename out_t = scalar_t>
__global__ void __launch_bounds__(256, 4)
    merge_tiles_kernel(const RowSchedule s, int heads, int channels, const float* __restrict__ part_max,
                       const float* __restrict__ part_sum, const float* __restrict__ part_acc,
                       const out_t* __restrict__ bias, const scalar_t* __restrict__ residual,
                       out_t* __restrict__ out, float* __restrict__ lse) {
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
    out[row * width + f] = static_cast<out_t>(value);
    if (f % channels == 0) lse[row * heads + head] = sum > 0.f ? row_max + logf(sum) : 0.f;
  }
}


}  // namespace
}  // namespace attention
}  // namespace gnnio
