// Reduction family: per-feature max and min over each target's sources, and
// their gradient.
//
// Forward: the degree-aware schedule of common.cuh over a CSR whose rows list
// their sources in ascending order (gnnio_cli/ops/reduce_native.py sorts a
// copy once per graph when the graph's own rows are not). A light row is one
// warp with 128-bit feature loads; a heavy row is cut into tiles whose
// winners (value and position) a second pass merges. In a source-sorted row
// "ties go to the smallest source" is "ties go to the earliest slot", so the
// scan keeps a value only when it is strictly larger (or the first NaN, which
// beats every number): no source reads, no tie branch. 16-bit features are
// compared two at a time in packed registers (scan_slots_packed).
//
// Instead of a winner per (target, feature), the forward records per edge
// which features it won: a bit mask [E, ceil(F / 32)] in CSR slot order,
// built per light row in shared memory (no global atomics), written zero by
// heavy rows' tiles and filled in by their merge pass. Inference (no
// gradient wanted) skips the masks altogether.
//
// Backward: no atomics. Each source row of the CSC takes its out-edges 32 at a
// time: one load of their masks (staged in shared memory), then gradient
// loads for the edges that won anything, skipping the rest: about one read
// per (target, feature) in all, instead of one winner read per edge and
// feature. Sums run in fp32 in slot order (heavy sources per tile, merged in
// tile order), so the gradient is deterministic.
//
// Both passes keep their warps resident and loop over the work items (grid
// stride): on skewed degrees a block is not held by one long row.

#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gnnio {
namespace {

// Edges whose loads a lane group issues before using any.
constexpr int kForwardUnroll = 4;
// In the backward, 16-bit rows of 128 features put two edges' groups in a
// warp already; 2 keeps its registers under the budget below without spills
// in the loop.
template <typename scalar_t>
constexpr int backward_unroll() {
  return sizeof(scalar_t) == 4 ? 4 : 2;
}
// Blocks per SM the register budget is set for: 3 x 8 warps, at most 80
// registers a thread, no spills (left alone, the compiler took 94-120: 16
// warps per SM). 4 blocks (64 registers) spill and measured slower on H100:
// forward 3.05 vs 2.84 ms on rmat20, 1.73 vs 1.28 ms on grid1024.
constexpr int kMinBlocksPerSm = 3;
constexpr int32_t kNoWinner = -1;
// Shared words per warp for building a light row's masks: 128 slots of 4
// words (fp32 x 128 features), 16 KB per block. Longer rows or wider passes
// go through it in windows.
constexpr int kMaskWindowWords = 512;

// The full order of candidates (value, position within the row): NaN beats
// every number (as torch's amax), then the larger value, then the earlier
// slot (= the smaller source in a sorted row). A missing winner (kNoWinner)
// loses to any slot. Total, so the winner does not depend on the order in
// which lanes and tiles meet.
__device__ __forceinline__ bool beats(float value, int32_t position, float best, int32_t best_position) {
  if (position == kNoWinner) return false;
  if (best_position == kNoWinner) return true;
  const bool value_nan = isnan(value);
  const bool best_nan = isnan(best);
  if (value_nan != best_nan) return value_nan;
  if (!value_nan && value != best) return value > best;
  return position < best_position;
}

// One output row's VEC features from their winners; an empty row has no winner: 0, as PyG.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void store_winners(scalar_t* out, const float (&best)[VEC], const int32_t (&best_position)[VEC],
                                              float sign) {
  Vec<scalar_t, VEC> result;
#pragma unroll
  for (int v = 0; v < VEC; ++v) result.v[v] = static_cast<scalar_t>(best_position[v] == kNoWinner ? 0.f : sign * best[v]);
  store_vec<scalar_t, VEC>(out, result);
}

// This lane's source id in the 32-slot batch at `base` of the item: the first
// batch's came with the item (prefetched, see for_each_batched_work_item).
__device__ __forceinline__ uint32_t batch_source(IndexView indices, uint32_t first_source, const WorkItem& item,
                                                 int64_t base, int count) {
  const int lane = threadIdx.x % kWarp;
  if (base == item.begin) return first_source;
  return lane < count ? static_cast<uint32_t>(indices[base + lane]) : 0u;
}

// The lane's source id of slot begin + lane, if the item has that slot.
__device__ __forceinline__ uint32_t lane_source(IndexView indices, int64_t begin, int64_t end) {
  const int lane = threadIdx.x % kWarp;
  return lane < end - begin ? static_cast<uint32_t>(indices[begin + lane]) : 0u;
}

// The sources of the lane group's slots in one step of a 32-slot batch whose
// indices the lanes hold one each (my_source): slot step + u * groups + group
// for each u, kNoSource past the batch or for an inactive lane. Ids are 32
// bits (common.cuh): one shuffle each, and fewer registers.
__device__ __forceinline__ void step_sources(uint32_t my_source, int step, int count, int groups, int group,
                                             bool active, uint32_t (&source)[kForwardUnroll]) {
#pragma unroll
  for (int u = 0; u < kForwardUnroll; ++u) {
    const int slot = step + u * groups + group;
    source[u] = __shfl_sync(kFullMask, my_source, slot % kWarp);
    if (slot >= count || !active) source[u] = kNoSource;
  }
}

// One lane group's winners over its share of the item's slots (slots group,
// group + groups, ... of each step, in ascending order). A slot replaces the
// winner when strictly larger, or when it is NaN and the winner is not: in a
// source-sorted row this is the full order of beats() for a lane's slots,
// which come in ascending order.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void scan_slots(const WorkItem& item, IndexView indices, uint32_t first_source,
                                           const scalar_t* __restrict__ x, int64_t width, int64_t column, bool active,
                                           float sign, int group, int groups, float (&best)[VEC],
                                           int32_t (&best_position)[VEC]) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    best[v] = -INFINITY;
    best_position[v] = kNoWinner;
  }
  for (int64_t base = item.begin; base < item.end; base += kWarp) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
    const uint32_t my_source = batch_source(indices, first_source, item, base, count);
    const int32_t base_position = static_cast<int32_t>(base - item.row_begin);
    for (int step = 0; step < count; step += groups * kForwardUnroll) {
      uint32_t source[kForwardUnroll];
      step_sources(my_source, step, count, groups, group, active, source);
      Vec<scalar_t, VEC> row[kForwardUnroll];
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        if (is_source(source[u])) row[u] = load_vec<scalar_t, VEC>(x + row_offset(source[u], width) + column);
      }
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        if (!is_source(source[u])) continue;
        const int32_t position = base_position + step + u * groups + group;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          const float value = sign * static_cast<float>(row[u].v[v]);
          // Bitwise, not short-circuit: predicates, no branch per feature.
          const bool take = (value > best[v]) | (isnan(value) & !isnan(best[v]));
          best[v] = take ? value : best[v];
          best_position[v] = take ? position : best_position[v];
        }
      }
    }
  }
  // Only -inf (or nothing) met: no slot was kept; the group's first slot is
  // the earliest of its equal values.
  const int64_t first = item.begin + group;
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    if (best_position[v] == kNoWinner && first < item.end) {
      best_position[v] = static_cast<int32_t>(first - item.row_begin);
    }
  }
}

// The 16-bit scan of 8 features per lane on pairs of features: the running
// maxima stay packed (4 registers, not 8 fp32) and each pair takes one
// NaN-propagating max, one compare of the result with the old maximum (a
// change means a strictly larger value or the first NaN, as scan_slots) and
// one select of packed 16-bit positions, counted from the item's first slot.
// -0 is made +0 first, so it ties with +0 as in the float order. Needs every
// item shorter than 65,535 slots (0xffff marks "no winner").
constexpr int kPackedPositionLimit = 0xffff;

// The packed pair type of each 16-bit feature dtype, and -inf in both halves.
template <typename scalar_t>
struct PackedPair;

template <>
struct PackedPair<at::Half> {
  using type = __half2;
  static constexpr uint32_t kMinusInfinity = 0xfc00fc00u;
};

template <>
struct PackedPair<at::BFloat16> {
  using type = __nv_bfloat162;
  static constexpr uint32_t kMinusInfinity = 0xff80ff80u;
};

// Pair arithmetic on the raw 32 bits of two 16-bit features.
template <typename scalar_t>
struct PairMath {
  using Pair = typename PackedPair<scalar_t>::type;
  static constexpr uint32_t kMinusInfinityPair = PackedPair<scalar_t>::kMinusInfinity;

  __device__ __forceinline__ static uint32_t max_nan(uint32_t a, uint32_t b) {
    return bits(__hmax2_nan(pair(a), pair(b)));
  }
  __device__ __forceinline__ static uint32_t plus_zero(uint32_t a) { return bits(__hadd2(pair(a), pair(0u))); }
  __device__ __forceinline__ static float low(uint32_t a) { return __low2float(pair(a)); }
  __device__ __forceinline__ static float high(uint32_t a) { return __high2float(pair(a)); }

 private:
  __device__ __forceinline__ static Pair pair(uint32_t a) { return *reinterpret_cast<const Pair*>(&a); }
  __device__ __forceinline__ static uint32_t bits(Pair a) { return *reinterpret_cast<const uint32_t*>(&a); }
};

// One slot (at 16-bit `position` from the scan's first slot) met by the
// packed running maxima: 8 features as 4 pairs.
template <typename scalar_t>
__device__ __forceinline__ void packed_take(const Vec<uint32_t, 4>& row, uint32_t position, uint32_t flip,
                                            uint32_t (&best_pair)[4], uint32_t (&position_pair)[4]) {
  using Math = PairMath<scalar_t>;
  const uint32_t positions = position * 0x00010001u;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t value = Math::plus_zero(row.v[p] ^ flip);
    const uint32_t merged = Math::max_nan(best_pair[p], value);
    const uint32_t changed = __vcmpne2(merged, best_pair[p]);
    position_pair[p] = (positions & changed) | (position_pair[p] & ~changed);
    best_pair[p] = merged;
  }
}

// One step's slots met by the packed maxima: source[u] (kNoSource: none) at
// scan position first_position + u * position_stride. All loads are issued
// before any is used.
template <typename scalar_t>
__device__ __forceinline__ void packed_step(const uint32_t (&source)[kForwardUnroll], uint32_t first_position,
                                            int position_stride, const scalar_t* __restrict__ x, int64_t width,
                                            int64_t column, uint32_t flip, uint32_t (&best_pair)[4],
                                            uint32_t (&position_pair)[4]) {
  Vec<uint32_t, 4> row[kForwardUnroll];
#pragma unroll
  for (int u = 0; u < kForwardUnroll; ++u) {
    if (is_source(source[u])) {
      row[u] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(x + row_offset(source[u], width) + column));
    }
  }
#pragma unroll
  for (int u = 0; u < kForwardUnroll; ++u) {
    if (!is_source(source[u])) continue;
    packed_take<scalar_t>(row[u], first_position + u * position_stride, flip, best_pair, position_pair);
  }
}

// The packed maxima as fp32 winners with row positions: scan positions plus
// `scan_offset`; where only -inf (or nothing) was met, `first_position` (the
// scanner's first slot, the earliest of its equal values) if `has_first`.
template <typename scalar_t>
__device__ __forceinline__ void unpack_winners(const uint32_t (&best_pair)[4], const uint32_t (&position_pair)[4],
                                               int64_t scan_offset, int64_t first_position, bool has_first,
                                               float (&best)[8], int32_t (&best_position)[8]) {
  using Math = PairMath<scalar_t>;
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const uint32_t packed = best_pair[v / 2];
    best[v] = v % 2 == 0 ? Math::low(packed) : Math::high(packed);
    const uint32_t position = (position_pair[v / 2] >> (16 * (v % 2))) & 0xffffu;
    best_position[v] = position != 0xffffu ? static_cast<int32_t>(scan_offset + position)
                       : has_first         ? static_cast<int32_t>(first_position)
                                           : kNoWinner;
  }
}

// A packed scan's start: running maxima -inf in both halves, no winner yet
// (0xffff positions). Returns the bits that negate both halves of a pair for
// min (their sign bits), 0 for max.
template <typename scalar_t>
__device__ __forceinline__ uint32_t start_packed_scan(float sign, uint32_t (&best_pair)[4],
                                                      uint32_t (&position_pair)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    best_pair[p] = PairMath<scalar_t>::kMinusInfinityPair;
    position_pair[p] = 0xffffffffu;
  }
  return sign < 0.f ? 0x80008000u : 0u;
}

template <typename scalar_t>
__device__ __forceinline__ void scan_slots_packed(const WorkItem& item, IndexView indices, uint32_t first_source,
                                                  const scalar_t* __restrict__ x, int64_t width, int64_t column,
                                                  bool active, float sign, int group, int groups, float (&best)[8],
                                                  int32_t (&best_position)[8]) {
  uint32_t best_pair[4];
  uint32_t position_pair[4];
  const uint32_t flip = start_packed_scan<scalar_t>(sign, best_pair, position_pair);
  for (int64_t base = item.begin; base < item.end; base += kWarp) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
    const uint32_t my_source = batch_source(indices, first_source, item, base, count);
    const uint32_t base_position = static_cast<uint32_t>(base - item.begin);
    for (int step = 0; step < count; step += groups * kForwardUnroll) {
      uint32_t source[kForwardUnroll];
      step_sources(my_source, step, count, groups, group, active, source);
      packed_step<scalar_t>(source, base_position + step + group, groups, x, width, column, flip, best_pair,
                            position_pair);
    }
  }
  unpack_winners<scalar_t>(best_pair, position_pair, item.begin - item.row_begin, item.begin + group - item.row_begin,
                           item.begin + group < item.end, best, best_position);
}

// A pass's mask words per slot rounded up to a power of two (1, 2, 4, 8):
// the log2 of that stride, so a (slot, word) index splits by shifts, not by
// a division by pass_words.
__device__ __forceinline__ int word_stride_shift(int pass_words) { return ceil_log2(pass_words); }

// The masks of one pass (features [pass_column, pass_column + 32 * pass_words))
// of a light row: each owner lane sets its features' bits at its winners'
// slots in a shared window (`window_capacity` words, slot-major with a word
// stride of word_stride_shift), which the row's `workers` lanes (this one is
// `worker`; `sync_mask` names them: the warp, or one lane group) then write
// out whole, zeros included.
template <int VEC>
__device__ __forceinline__ void write_row_masks(const WorkItem& item, const int32_t (&best_position)[VEC],
                                                bool owner, int64_t column, int64_t pass_column, int pass_words,
                                                int64_t mask_words, int worker, int workers, unsigned sync_mask,
                                                uint32_t* __restrict__ window, int window_capacity,
                                                uint32_t* __restrict__ masks) {
  const int slots = static_cast<int>(item.end - item.begin);
  const int shift = word_stride_shift(pass_words);
  const int word_mask = (1 << shift) - 1;
  const int window_slots = window_capacity >> shift;
  const int64_t first_word = pass_column / 32;
  for (int window_begin = 0; window_begin < slots; window_begin += window_slots) {
    const int window_entries = min(window_slots, slots - window_begin) << shift;
    for (int i = worker; i < window_entries; i += workers) window[i] = 0u;
    __syncwarp(sync_mask);
    if (owner) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const int offset = best_position[v] - window_begin;
        const int feature = static_cast<int>(column + v - pass_column);
        if (offset >= 0 && (offset << shift) < window_entries) {
          atomicOr(&window[(offset << shift) + feature / 32], 1u << (feature % 32));
        }
      }
    }
    __syncwarp(sync_mask);
    for (int i = worker; i < window_entries; i += workers) {
      const int word = i & word_mask;
      if (word < pass_words) {
        const int64_t slot = item.begin + window_begin + (i >> shift);
        masks[slot * mask_words + first_word + word] = window[i];
      }
    }
    __syncwarp(sync_mask);
  }
}

// kWholeWarp: rows of at least 32 vectors (fp32 x 128 and wider), where
// every lane takes the same edge: the lane layout is known at compile time,
// so no per-item arithmetic for it and no merge across lane groups.
template <typename scalar_t, int VEC, bool kWholeWarp>
__device__ __forceinline__ void extremum_item(const WorkItem& item, IndexView indices, uint32_t first_source,
                                              const scalar_t* __restrict__ x,
                                              int64_t width, float sign, scalar_t* __restrict__ out,
                                              uint32_t* __restrict__ masks, int64_t mask_words,
                                              uint32_t* __restrict__ window, float* __restrict__ partial_values,
                                              int32_t* __restrict__ partial_positions) {
  const int lane = threadIdx.x % kWarp;
  const int64_t chunks = width / VEC;
  // Divisions here, not EdgeLanes' shifts: with those the compiler keeps
  // more state across the item loop and spills (ptxas, sm_90).
  const int lanes = kWholeWarp ? kWarp : lanes_per_edge(chunks);
  const int groups = kWholeWarp ? 1 : kWarp / lanes;
  const int group = kWholeWarp ? 0 : lane / lanes;
  const int group_lane = kWholeWarp ? lane : lane % lanes;

  for (int64_t first_chunk = 0; first_chunk < chunks; first_chunk += lanes) {
    const int64_t chunk = first_chunk + group_lane;
    const bool active = chunk < chunks;
    const int64_t column = chunk * VEC;
    float best[VEC];
    int32_t best_position[VEC];
    if constexpr (sizeof(scalar_t) == 2 && VEC == 8) {
      scan_slots_packed<scalar_t>(item, indices, first_source, x, width, column, active, sign, group, groups, best,
                                  best_position);
    } else {
      scan_slots<scalar_t, VEC>(item, indices, first_source, x, width, column, active, sign, group, groups, best,
                                best_position);
    }
    for (int offset = lanes; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const float value = __shfl_xor_sync(kFullMask, best[v], offset);
        const int32_t position = __shfl_xor_sync(kFullMask, best_position[v], offset);
        if (beats(value, position, best[v], best_position[v])) {
          best[v] = value;
          best_position[v] = position;
        }
      }
    }
    const bool owner = group == 0 && active;
    // Passes start at multiples of 32 features (lanes * VEC is 32, 128 or 256
    // whenever there is more than one pass), so each covers whole mask words.
    const int64_t pass_column = first_chunk * VEC;
    const int pass_words = static_cast<int>((min(width - pass_column, static_cast<int64_t>(lanes * VEC)) + 31) / 32);
    if (item.partial < 0) {
      if (owner) store_winners<scalar_t, VEC>(out + item.row * width + column, best, best_position, sign);
      if (masks != nullptr) {
        write_row_masks<VEC>(item, best_position, owner, column, pass_column, pass_words, mask_words, lane, kWarp,
                             kFullMask, window, kMaskWindowWords, masks);
      }
    } else {
      if (owner) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          partial_values[item.partial * width + column + v] = best[v];
          partial_positions[item.partial * width + column + v] = best_position[v];
        }
      }
      // The merge pass sets the winners' bits of heavy rows.
      if (masks == nullptr) continue;
      const int shift = word_stride_shift(pass_words);
      const int entries = static_cast<int>(item.end - item.begin) << shift;
      const int64_t first_word = pass_column / 32;
      for (int i = lane; i < entries; i += kWarp) {
        const int word = i & ((1 << shift) - 1);
        if (word < pass_words) masks[(item.begin + (i >> shift)) * mask_words + first_word + word] = 0u;
      }
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, kMinBlocksPerSm)
    segment_extremum_kernel(RowSchedule schedule, IndexView indices, const scalar_t* __restrict__ x, int64_t width,
                            bool vectorised, float sign, scalar_t* __restrict__ out, uint32_t* __restrict__ masks,
                            int64_t mask_words, float* __restrict__ partial_values,
                            int32_t* __restrict__ partial_positions) {
  __shared__ uint32_t windows[kWarpsPerBlock][kMaskWindowWords];
  uint32_t* window = windows[threadIdx.x / kWarp];
  const auto sources = [&](int64_t begin, int64_t end) { return lane_source(indices, begin, end); };
  for_each_batched_work_item(schedule, sources, [&](const WorkItem& item, uint32_t first_source) {
    constexpr int kVec = vec_width<scalar_t>();
    // (fp32 only: the 16-bit instantiations spill with a third copy of the item.)
    if (sizeof(scalar_t) == 4 && vectorised && width >= kWarp * kVec) {
      extremum_item<scalar_t, kVec, true>(item, indices, first_source, x, width, sign, out, masks, mask_words,
                                          window, partial_values, partial_positions);
    } else if (vectorised) {
      extremum_item<scalar_t, kVec, false>(item, indices, first_source, x, width, sign, out, masks, mask_words,
                                           window, partial_values, partial_positions);
    } else {
      extremum_item<scalar_t, 1, false>(item, indices, first_source, x, width, sign, out, masks, mask_words, window,
                                        partial_values, partial_positions);
    }
  });
}

// ------------------------------------------------------------ subwarp
// 16-bit rows of at most 128 features, 8 per lane: a light row needs only
// F / 8 lanes (16 at 128). extremum_item gives the warp's other lane groups
// further edges of the same row; this variant gives each lane group a row of
// its own, so a warp runs 32 / lanes rows' dependent latency chains (bounds
// -> indices -> features -> masks) at once. A group scans its row's slots in
// ascending order with the packed compare, so its winners (the earliest slot
// of the largest value, NaN largest) and masks equal extremum_item's.
template <typename scalar_t>
__device__ __forceinline__ void extremum_row_in_group(const WorkItem& item, const LaneGroups& groups, IndexView indices,
                                                      const scalar_t* __restrict__ x, int64_t width, float sign,
                                                      scalar_t* __restrict__ out, uint32_t* __restrict__ masks,
                                                      int64_t mask_words, uint32_t* __restrict__ window,
                                                      int window_capacity) {
  const int lanes = groups.lanes;
  const int group_lane = groups.group_lane;
  const int64_t column = static_cast<int64_t>(group_lane) * kSubwarpVec;
  const bool active = column < width;
  uint32_t best_pair[4];
  uint32_t position_pair[4];
  const uint32_t flip = start_packed_scan<scalar_t>(sign, best_pair, position_pair);
  // As csr-subwarp's sum: a group at least as wide as the unroll shares a
  // batch of `lanes` indices by shuffles; a narrower one reads each step's
  // slots directly (the same addresses in every lane: broadcast loads).
  const bool shared = lanes >= kForwardUnroll;
  const int batch = shared ? lanes : kForwardUnroll;
  for (int64_t base = item.begin; base < item.end; base += batch) {
    const int count = static_cast<int>(min(static_cast<int64_t>(batch), item.end - base));
    const uint32_t my_source = shared && group_lane < count ? static_cast<uint32_t>(indices[base + group_lane]) : 0u;
    const uint32_t base_position = static_cast<uint32_t>(base - item.begin);
    for (int step = 0; step < count; step += kForwardUnroll) {
      uint32_t source[kForwardUnroll];
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        const int slot = step + u;
        if (shared) {
          source[u] = __shfl_sync(groups.mask, my_source, slot % lanes, lanes);
        } else {
          source[u] = slot < count ? static_cast<uint32_t>(indices[base + slot]) : 0u;
        }
        if (slot >= count || !active) source[u] = kNoSource;
      }
      packed_step<scalar_t>(source, base_position + step, 1, x, width, column, flip, best_pair, position_pair);
    }
  }
  float best[kSubwarpVec];
  int32_t best_position[kSubwarpVec];
  unpack_winners<scalar_t>(best_pair, position_pair, 0, 0, item.end > item.begin, best, best_position);
  if (active) store_winners<scalar_t, kSubwarpVec>(out + item.row * width + column, best, best_position, sign);
  // The whole row is one pass: every mask word of its slots.
  if (masks != nullptr) {
    write_row_masks<kSubwarpVec>(item, best_position, active, column, 0, static_cast<int>(mask_words), mask_words,
                                 group_lane, lanes, groups.mask, window, window_capacity, masks);
  }
}

// Work items: heavy rows' tiles (one warp each, extremum_item), then the
// light rows in `light`'s order, 32 / lanes per warp, one per lane group, each
// group with its share of the warp's mask window.
template <typename scalar_t>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, kMinBlocksPerSm)
    segment_extremum_subwarp_kernel(RowSchedule schedule, LightRows light, IndexView indices,
                                    const scalar_t* __restrict__ x, int64_t width, float sign,
                                    scalar_t* __restrict__ out, uint32_t* __restrict__ masks, int64_t mask_words,
                                    float* __restrict__ partial_values, int32_t* __restrict__ partial_positions) {
  __shared__ uint32_t windows[kWarpsPerBlock][kMaskWindowWords];
  uint32_t* window = windows[threadIdx.x / kWarp];
  const LaneGroups groups(width);
  const int window_capacity = kMaskWindowWords / groups.rows_per_warp;
  const int64_t items = subwarp_items(schedule, light, groups);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t warp = warp_index(); warp < items; warp += warps) {
    WorkItem item;
    if (warp < schedule.num_tiles) {
      tile_item(schedule, warp, item);
      extremum_item<scalar_t, kSubwarpVec, false>(item, indices, lane_source(indices, item.begin, item.end), x,
                                                  width, sign, out, masks, mask_words, window, partial_values,
                                                  partial_positions);
      continue;
    }
    // A heavy row's tiles and merge pass write its output and masks.
    if (subwarp_row(schedule, light, groups, warp, item)) {
      extremum_row_in_group<scalar_t>(item, groups, indices, x, width, sign, out, masks, mask_words,
                                      window + groups.group * window_capacity, window_capacity);
    }
    // Groups finish their rows at different times; meet before the next item.
    __syncwarp();
  }
}

// Second pass: one block per heavy row merges its tiles' winners. Each warp
// holds 32 consecutive features, i.e. one mask word: the lanes whose winner is
// the same slot write that slot's word in one store, so no two threads write
// one word (the tiles wrote the row's masks zero).
template <typename scalar_t>
__global__ void merge_extremum_kernel(RowSchedule schedule, const float* __restrict__ partial_values,
                                      const int32_t* __restrict__ partial_positions, int64_t width, float sign,
                                      scalar_t* __restrict__ out, uint32_t* __restrict__ masks, int64_t mask_words) {
  const int64_t heavy = blockIdx.x;
  const int64_t row = schedule.heavy_rows[heavy];
  const int64_t row_begin = schedule.indptr[row];
  const int64_t first = schedule.heavy_tile_ptr[heavy];
  const int64_t last = schedule.heavy_tile_ptr[heavy + 1];
  for (int64_t base = 0; base < width; base += blockDim.x) {
    const int64_t column = base + threadIdx.x;
    const bool in_range = column < width;
    float best = -INFINITY;
    int32_t best_position = kNoWinner;
    if (in_range) {
      struct Winner {
        float value;
        int32_t position;
      };
      in_tile_order<Winner>(
          first, last,
          [&](int64_t tile) {
            return Winner{partial_values[tile * width + column], partial_positions[tile * width + column]};
          },
          [&](const Winner& tile) {
            if (beats(tile.value, tile.position, best, best_position)) {
              best = tile.value;
              best_position = tile.position;
            }
          });
      out[row * width + column] = static_cast<scalar_t>(sign * best);
    }
    // Every tile has slots, so an in-range winner exists; out-of-range lanes
    // match only each other.
    const unsigned same_slot = __match_any_sync(kFullMask, in_range ? best_position : kNoWinner);
    if (masks != nullptr && in_range && __ffs(same_slot) - 1 == static_cast<int>(threadIdx.x % kWarp)) {
      masks[(row_begin + best_position) * mask_words + column / 32] = same_slot;
    }
  }
}

// ------------------------------------------------------------------ backward
// Mask words of one pass held per edge of a 32-edge batch: at most 8 (256
// features of 16 bits in one pass).
constexpr int kMaxPassWords = 8;

// One lane's out-edge of a 32-edge batch: its target row and the CSR slot of
// its masks, both 32 bits (the host checks both counts).
struct OutEdge {
  uint32_t target;
  uint32_t mask_slot;
};

__device__ __forceinline__ OutEdge read_out_edge(IndexView targets, IndexView mask_slots, int64_t base, int64_t end) {
  const int lane = threadIdx.x % kWarp;
  if (lane >= end - base) return OutEdge{0u, 0u};
  return OutEdge{static_cast<uint32_t>(targets[base + lane]), static_cast<uint32_t>(mask_slots[base + lane])};
}

// `first` is the lane's edge of the item's first batch, read ahead (see
// for_each_batched_work_item).
template <typename scalar_t, int VEC>
__device__ __forceinline__ void extremum_grad_item(const WorkItem& item, const OutEdge& first, IndexView targets,
                                                   IndexView mask_slots,
                                                   const scalar_t* __restrict__ grad_out,
                                                   const uint32_t* __restrict__ masks, int64_t mask_words,
                                                   int64_t width, uint32_t* __restrict__ staged,
                                                   scalar_t* __restrict__ grad_x, float* __restrict__ partials) {
  const int lane = threadIdx.x % kWarp;
  const int64_t chunks = width / VEC;
  const EdgeLanes layout(chunks);
  const int lanes = layout.lanes();
  const int groups = layout.groups();
  const int group = layout.group();
  const int group_lane = layout.group_lane();
  constexpr uint32_t kLaneBits = (1u << VEC) - 1u;
  constexpr int kUnroll = backward_unroll<scalar_t>();

  for (int64_t first_chunk = 0; first_chunk < chunks; first_chunk += lanes) {
    const int64_t chunk = first_chunk + group_lane;
    const bool active = chunk < chunks;
    const int64_t column = chunk * VEC;
    const int64_t pass_column = first_chunk * VEC;
    const int pass_words = static_cast<int>((min(width - pass_column, static_cast<int64_t>(lanes * VEC)) + 31) / 32);
    const int64_t first_word = pass_column / 32;
    // The lane's VEC features lie in one mask word (VEC divides 32 and column).
    const int word = static_cast<int>((column - pass_column) / 32);
    const int shift = static_cast<int>(column % 32);
    float acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0.f;

    for (int64_t base = item.begin; base < item.end; base += kWarp) {
      const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
      const bool own_slot = lane < count;
      const OutEdge mine = base == item.begin ? first : read_out_edge(targets, mask_slots, base, item.end);
      // Each lane stages its own edge's words of this pass (independent loads,
      // one latency for the batch); staged[w * 32 + slot] keeps the writes
      // free of bank conflicts.
      bool won_any = false;
#pragma unroll
      for (int w = 0; w < kMaxPassWords; ++w) {
        if (w < pass_words) {
          const uint32_t bits = own_slot ? masks[mine.mask_slot * mask_words + first_word + w] : 0u;
          staged[w * kWarp + lane] = bits;
          won_any |= bits != 0u;
        }
      }
      __syncwarp();
      // Edges that won nothing in this pass (most edges into a hub) cost no
      // gradient load: the warp walks only the set bits, groups * unroll a step.
      unsigned pending = __ballot_sync(kFullMask, won_any);
      while (pending != 0u) {
        int slot[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          slot[u] = -1;
          for (int g = 0; g < groups; ++g) {
            const int next = pending != 0u ? __ffs(pending) - 1 : -1;
            pending &= pending - 1u;
            if (g == group) slot[u] = next;
          }
        }
        uint32_t target[kUnroll];
        uint32_t won[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          target[u] = __shfl_sync(kFullMask, mine.target, slot[u] & (kWarp - 1));
          won[u] = slot[u] >= 0 && active ? (staged[word * kWarp + slot[u]] >> shift) & kLaneBits : 0u;
        }
        // The step's gradient loads are all issued before any is used, so
        // their latencies overlap; a lane loads only where its edge won.
        Vec<scalar_t, VEC> grad[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (won[u] != 0u) grad[u] = load_vec<scalar_t, VEC>(grad_out + row_offset(target[u], width) + column);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (won[u] == 0u) continue;
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            if ((won[u] >> v) & 1u) acc[v] += static_cast<float>(grad[u].v[v]);
          }
        }
      }
      __syncwarp();
    }
    for (int offset = lanes; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] += __shfl_xor_sync(kFullMask, acc[v], offset);
    }
    if (group != 0 || !active) continue;
    if (item.partial < 0) {
      Vec<scalar_t, VEC> result;
#pragma unroll
      for (int v = 0; v < VEC; ++v) result.v[v] = static_cast<scalar_t>(acc[v]);
      store_vec<scalar_t, VEC>(grad_x + item.row * width + column, result);
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) partials[item.partial * width + column + v] = acc[v];
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, kMinBlocksPerSm)
    segment_extremum_backward_kernel(RowSchedule schedule, IndexView targets, IndexView mask_slots,
                                     const scalar_t* __restrict__ grad_out, const uint32_t* __restrict__ masks,
                                     int64_t mask_words, int64_t width, bool vectorised,
                                     scalar_t* __restrict__ grad_x, float* __restrict__ partials) {
  __shared__ uint32_t staging[kWarpsPerBlock][kMaxPassWords * kWarp];
  uint32_t* staged = staging[threadIdx.x / kWarp];
  const auto edges = [&](int64_t begin, int64_t end) { return read_out_edge(targets, mask_slots, begin, end); };
  for_each_batched_work_item(schedule, edges, [&](const WorkItem& item, const OutEdge& first) {
    if (vectorised) {
      extremum_grad_item<scalar_t, vec_width<scalar_t>()>(item, first, targets, mask_slots, grad_out, masks,
                                                          mask_words, width, staged, grad_x, partials);
    } else {
      extremum_grad_item<scalar_t, 1>(item, first, targets, mask_slots, grad_out, masks, mask_words, width, staged,
                                      grad_x, partials);
    }
  });
}

int64_t mask_words_for(int64_t width) { return (width + 31) / 32; }

}  // namespace

namespace {

// The forward of both ops: extremum_item for every row (subwarp false) or
// the lane-group variant for 16-bit rows of at most 128 features (true).
std::tuple<at::Tensor, at::Tensor> extremum_forward(const char* op, bool subwarp, const at::Tensor& indptr,
                                                    const at::Tensor& indices, const at::Tensor& x, int64_t num_rows,
                                                    bool is_min, const at::Tensor& tile_row,
                                                    const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                                                    const at::Tensor& heavy_tile_ptr, int64_t tile_edges,
                                                    const std::optional<at::Tensor>& row_order, bool with_masks) {
  check_features(op, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const RowSchedule schedule =
      row_schedule(op, indptr, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  check_index_dtype(op, "indices", indices);
  check_array(op, "indices", indices, x, indices.numel());
  check_array(op, "indptr", indptr, x, num_rows + 1);
  GNNIO_CHECK(indices.numel() < (int64_t{1} << 31), op, "rows are addressed with int32 positions; got ",
              indices.numel(), " slots");
  check_32bit_sources(op, x, "");
  const int64_t width = x.size(1);
  if (subwarp) {
    GNNIO_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, op,
                "x must be float16 or bfloat16 (other dtypes take segment_extremum_masked), got ", x.scalar_type());
    GNNIO_CHECK(width > 0 && width <= kSubwarpMaxWidth && rows_vectorisable(x, width, kSubwarpVec), op,
                "x must have a multiple of ", kSubwarpVec, " features, at most ", kSubwarpMaxWidth,
                ", starting 16-byte aligned (others take segment_extremum_masked), got width ", width);
    GNNIO_CHECK(tile_edges < kPackedPositionLimit, op, "the packed scan counts slots in 16 bits: tile_edges must be < ",
                kPackedPositionLimit, ", got ", tile_edges);
  }
  const LightRows light = light_rows(op, row_order, x, num_rows);
  const int64_t mask_words = mask_words_for(width);
  at::Tensor out = at::empty({num_rows, width}, x.options());
  at::Tensor masks = at::empty({with_masks ? indices.numel() : 0, mask_words}, x.options().dtype(at::kInt));
  if (num_rows == 0 || width == 0) return {out, masks};
  at::Tensor partial_values = at::empty({schedule.num_tiles, width}, x.options().dtype(at::kFloat));
  at::Tensor partial_positions = at::empty({schedule.num_tiles, width}, x.options().dtype(at::kInt));
  const float sign = is_min ? -1.f : 1.f;
  uint32_t* mask_data = with_masks ? reinterpret_cast<uint32_t*>(masks.data_ptr<int32_t>()) : nullptr;
  auto stream = at::cuda::getCurrentCUDAStream();
  // Heavy rows: the tiles' winners merged, after either first pass.
  const auto merge = [&](auto zero) {
    using scalar_t = decltype(zero);
    if (schedule.num_heavy == 0) return;
    const int threads = merge_threads(width);
    merge_extremum_kernel<scalar_t><<<schedule.num_heavy, threads, 0, stream>>>(
        schedule, partial_values.data_ptr<float>(), partial_positions.data_ptr<int32_t>(), width, sign,
        out.data_ptr<scalar_t>(), mask_data, mask_words);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (subwarp) {
    // 16-bit only: two instantiations, not GNNIO_DISPATCH_FEATURES' three.
    const auto launch = [&](auto zero) {
      using scalar_t = decltype(zero);
      const int64_t blocks = resident_first_pass_blocks(segment_extremum_subwarp_kernel<scalar_t>, schedule);
      segment_extremum_subwarp_kernel<scalar_t><<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
          schedule, light, index_view(indices), x.data_ptr<scalar_t>(), width, sign, out.data_ptr<scalar_t>(),
          mask_data, mask_words, partial_values.data_ptr<float>(), partial_positions.data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      merge(zero);
    };
    if (x.scalar_type() == at::kHalf) {
      launch(at::Half(0.f));
    } else {
      launch(at::BFloat16(0.f));
    }
    return {out, masks};
  }
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), op, [&] {
    // The packed 16-bit scan counts positions in 16 bits; longer items take the scalar path.
    const bool vectorised = rows_vectorisable(x, width, vec_width<scalar_t>()) &&
                            rows_vectorisable(out, width, vec_width<scalar_t>()) &&
                            (sizeof(scalar_t) == 4 || tile_edges < kPackedPositionLimit);
    const int64_t blocks = resident_batched_pass_blocks(segment_extremum_kernel<scalar_t>, schedule);
    segment_extremum_kernel<scalar_t><<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
        schedule, index_view(indices), x.data_ptr<scalar_t>(), width, vectorised, sign, out.data_ptr<scalar_t>(),
        mask_data, mask_words, partial_values.data_ptr<float>(), partial_positions.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    merge(scalar_t(0.f));
  });
  return {out, masks};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> segment_extremum_masked(const at::Tensor& indptr, const at::Tensor& indices,
                                                           const at::Tensor& x, int64_t num_rows, bool is_min,
                                                           const at::Tensor& tile_row, const at::Tensor& tile_start,
                                                           const at::Tensor& heavy_rows,
                                                           const at::Tensor& heavy_tile_ptr, int64_t tile_edges,
                                                           bool with_masks) {
  return extremum_forward("gnnio::segment_extremum_masked", false, indptr, indices, x, num_rows, is_min, tile_row,
                          tile_start, heavy_rows, heavy_tile_ptr, tile_edges, std::nullopt, with_masks);
}

std::tuple<at::Tensor, at::Tensor> segment_extremum_masked_subwarp(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x, int64_t num_rows, bool is_min,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const std::optional<at::Tensor>& row_order,
    bool with_masks) {
  return extremum_forward("gnnio::segment_extremum_masked_subwarp", true, indptr, indices, x, num_rows, is_min,
                          tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order, with_masks);
}

at::Tensor segment_extremum_masked_backward(const at::Tensor& csc_indptr, const at::Tensor& csc_indices,
                                            const at::Tensor& csc_mask_slot, const at::Tensor& grad_out,
                                            const at::Tensor& masks, int64_t num_src, const at::Tensor& tile_row,
                                            const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                                            const at::Tensor& heavy_tile_ptr, int64_t tile_edges) {
  const char* op = "gnnio::segment_extremum_masked_backward";
  check_features(op, "grad_out", grad_out);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const RowSchedule schedule =
      row_schedule(op, csc_indptr, num_src, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  check_index_dtype(op, "csc_indices", csc_indices);
  check_array(op, "csc_indices", csc_indices, grad_out, csc_indices.numel());
  check_array(op, "csc_indptr", csc_indptr, grad_out, num_src + 1);
  check_index_dtype(op, "csc_mask_slot", csc_mask_slot);
  check_array(op, "csc_mask_slot", csc_mask_slot, grad_out, csc_indices.numel());
  GNNIO_CHECK(csc_indices.numel() < (int64_t{1} << 31), op, "mask slots are read as 32 bits; got ",
              csc_indices.numel(), " slots");
  check_32bit_sources(op, grad_out, "");
  const int64_t width = grad_out.size(1);
  const int64_t mask_words = mask_words_for(width);
  GNNIO_CHECK(masks.scalar_type() == at::kInt, op, "masks must be int32 (from segment_extremum_masked), got ",
              masks.scalar_type());
  GNNIO_CHECK(masks.dim() == 2 && masks.size(0) == csc_indices.numel() && masks.size(1) == mask_words &&
                  masks.is_contiguous() && masks.device() == grad_out.device(),
              op, "masks must be contiguous [E, ceil(F / 32)] = [", csc_indices.numel(), ", ", mask_words,
              "] on grad_out's device, got shape ", masks.sizes());
  at::Tensor grad_x = at::empty({num_src, width}, grad_out.options());
  if (num_src == 0 || width == 0) return grad_x;
  at::Tensor partials = at::empty({schedule.num_tiles, width}, grad_out.options().dtype(at::kFloat));
  auto stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(grad_out.scalar_type(), op, [&] {
    constexpr int vec = vec_width<scalar_t>();
    const bool vectorised = rows_vectorisable(grad_out, width, vec) && rows_vectorisable(grad_x, width, vec);
    const int64_t blocks = resident_batched_pass_blocks(segment_extremum_backward_kernel<scalar_t>, schedule);
    segment_extremum_backward_kernel<scalar_t><<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
        schedule, index_view(csc_indices), index_view(csc_mask_slot), grad_out.data_ptr<scalar_t>(),
        reinterpret_cast<const uint32_t*>(masks.data_ptr<int32_t>()), mask_words, width, vectorised,
        grad_x.data_ptr<scalar_t>(), partials.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  merge_partial_sums(schedule, partials, grad_x);
  return grad_x;
}

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  // Per-feature max (or min with is_min) over each row's sources, for a CSR
  // whose rows list their sources in ascending order. Returns (out [R, F] in
  // x's dtype, 0 in empty rows; masks int32 [E, ceil(F / 32)]: bit f % 32 of
  // word f / 32 of slot k is set when slot k won feature f of its row).
  // Winner: the largest value (NaN counts as largest), ties to the earliest
  // slot, i.e. the smallest source id. Exactly one bit per (non-empty row,
  // feature). with_masks false (inference: no gradient to route) skips the
  // masks, which are then [0, ceil(F / 32)].
  m.def(
      "segment_extremum_masked(Tensor indptr, Tensor indices, Tensor x, int num_rows, bool is_min, "
      "Tensor tile_row, Tensor tile_start, Tensor heavy_rows, Tensor heavy_tile_ptr, int tile_edges, "
      "bool with_masks=True) -> (Tensor, Tensor)");

  // segment_extremum_masked for fp16/bf16 x of at most 128 features, a
  // multiple of 8, 16-byte aligned, and tile_edges < 65,535: the same outputs
  // and masks, bit for bit, with each light row given a group of F / 8 lanes,
  // so one warp scans several rows at once. row_order: int64 [L, 3], every
  // light row (at most tile_edges slots) once with its indptr bounds, in the
  // order the warps take them (e.g. by descending degree; as
  // segment_sum_subwarp's); None: row order.
  m.def(
      "segment_extremum_masked_subwarp(Tensor indptr, Tensor indices, Tensor x, int num_rows, bool is_min, "
      "Tensor tile_row, Tensor tile_start, Tensor heavy_rows, Tensor heavy_tile_ptr, int tile_edges, "
      "Tensor? row_order, bool with_masks=True) -> (Tensor, Tensor)");

  // Gradient of segment_extremum_masked with respect to x, without atomics:
  // for each source s (a CSC row), the sum of grad_out[t, f] over its edges
  // (s, t) whose mask has bit f. csc_mask_slot int32/int64 [E]: for each CSC
  // slot, the slot of the same edge in the forward's CSR. Returns [num_src, F].
  m.def(
      "segment_extremum_masked_backward(Tensor csc_indptr, Tensor csc_indices, Tensor csc_mask_slot, "
      "Tensor grad_out, Tensor masks, int num_src, Tensor tile_row, Tensor tile_start, Tensor heavy_rows, "
      "Tensor heavy_tile_ptr, int tile_edges) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("segment_extremum_masked", &segment_extremum_masked);
  m.impl("segment_extremum_masked_subwarp", &segment_extremum_masked_subwarp);
  m.impl("segment_extremum_masked_backward", &segment_extremum_masked_backward);
}

}  // namespace gnnio
