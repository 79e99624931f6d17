// Device helpers of the fused attention kernels (native/attention/): the lane
// layout over heads and channels, conversion of gathered elements to fp32,
// reductions inside one head's lane group, the LeakyReLU pair and the
// counter-based dropout mask.
#pragma once

#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace gnnio {
namespace attention {

// Score kinds. GAT: leaky_relu(a_src[s] + a_dst[t] + a_edge[e]), message x_src[s].
// GATv2: sum_c att[c] * leaky_relu(x_src[s] + x_dst[t] + edge[e])[c], message x_src[s].
// Dot (Transformer): scale * <q[t], k[s] + edge[e]>, message v[s] + edge[e].
// Cosine (AGNN): beta[h] * scale * <x[t], x[s]> / max(n[s], 1e-12) / max(n[t], 1e-12)
// (= <u[t], u[s]> with u = F.normalize(x)), message x[s], n = |x| the fp32
// row norms: one gathered row per edge serves as key and value.
enum Kind : int { kGat = 0, kGatV2 = 1, kDot = 2, kCosine = 3 };

// Floats per (target, head) in the backward's statistics rows (row_stats):
// (lse, delta), and for Cosine also 1 / max(|x_dst|, floor) and a pad to 16 bytes.
constexpr int row_stats_width(int kind) { return kind == kCosine ? 4 : 2; }

// F.normalize's floor on the row norm (eps = 1e-12): rows shorter than this
// are divided by it, and their norm gets no gradient (clamp_min's backward
// passes where norm >= floor). A NaN norm stays NaN, as in clamp_min.
constexpr float kNormFloor = 1e-12f;
__device__ __forceinline__ float clamped_norm(float norm) { return norm < kNormFloor ? kNormFloor : norm; }

// A warp covers one target row (or one tile of it) for a group of heads.
// Each head gets `lanes_per_head` lanes (a power of two); lane l of a head
// holds channels (k * lanes_per_head + l) * VEC .. + VEC for k < K.
// VEC = 4 (one 16-byte fp32 or 8-byte 16-bit load) when C % 4 == 0 and
// C <= 128; VEC = 1 with K = 8 otherwise (C <= 256). VEC = 8, 16-bit
// features only (one 16-byte load of 8 elements, C % 8 == 0, C <= 128):
// the warp's two halves (kGroups = 2) each take every other edge of the
// row, so each instruction that is not per-element arithmetic (ids, head
// sums, softmax, loop) serves two edges; the halves' softmax states (forward)
// or gradient sums (backward) merge at the row's end. The forward's packed
// builds sum their scores on the tensor cores, so a 16-bit score recomputed
// in backward equals the forward's up to fp32 rounding, not bit for bit.
template <int VEC>
struct Layout {
  static constexpr int kChunks = VEC == 1 ? 8 : 1;
  static constexpr int kGroups = VEC == 8 ? 2 : 1;
  static constexpr int kGroupLanes = kWarp / kGroups;
};

struct LaneGeometry {
  int heads;           // H
  int channels;        // C
  int lanes_per_head;  // power of two
  int heads_per_warp;  // heads one edge group of the warp covers: group lanes / lanes_per_head
};

// Host: lanes per head for C channels in chunks of VEC, K chunks per lane,
// in edge groups of group_lanes lanes.
inline LaneGeometry lane_geometry(int heads, int channels, int vec, int chunks_per_lane, int group_lanes = kWarp) {
  const int64_t chunks = (channels + vec - 1) / vec;
  const int64_t per_lane = (chunks + chunks_per_lane - 1) / chunks_per_lane;
  const int lanes = lanes_per_edge(per_lane);
  return LaneGeometry{heads, channels, lanes, group_lanes / lanes};
}

// VEC elements of T as fp32. bf16 is the upper half of an fp32, so each
// element of a 32-bit pair converts with one instruction (a shift or a
// mask); static_cast spends two on the pair's upper element.
template <int VEC, typename T>
__device__ __forceinline__ void to_f32(const Vec<T, VEC>& v, float (&out)[VEC]) {
  if constexpr (std::is_same<T, c10::BFloat16>::value && VEC % 2 == 0) {
    uint32_t words[VEC / 2];
    memcpy(words, v.v, sizeof(words));
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = static_cast<float>(v.v[i]);
  }
}

// ONCE: with the evict-first cache policy (store_vec_once).
template <int VEC, typename T, bool ONCE = false>
__device__ __forceinline__ void store_f32(T* __restrict__ p, const float (&in)[VEC]) {
  if constexpr (VEC == 4 || VEC == 8) {
    Vec<T, VEC> v;
#pragma unroll
    for (int i = 0; i < VEC; ++i) v.v[i] = static_cast<T>(in[i]);
    if constexpr (ONCE) {
      store_vec_once<T, VEC>(p, v);
    } else {
      store_vec<T, VEC>(p, v);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = static_cast<T>(in[i]);
  }
}

// Sum over the `lanes` lanes of one head (aligned power-of-two groups).
// Every step's shuffle runs on the whole warp and the steps at or beyond the
// head's width are dropped by a select (never multiplied away, so another
// head's inf or NaN cannot leak in): no loop, branch or divergence check per
// call. A loop over the runtime lane count cost about 20 instructions per
// call for 8 lanes, this costs 10 to 15; it runs once or twice per edge.
// Butterfly order: every lane of a head ends with bit-identical sums.
// MAX_LANES bounds the steps at compile time: an edge group's width (a head
// never spans two groups), or the head's exact width where the kernel was
// built for it (lanes == MAX_LANES: every select folds away).
template <int MAX_LANES>
__device__ __forceinline__ float head_sum(float value, int lanes) {
#pragma unroll
  for (int offset = 1; offset < MAX_LANES; offset <<= 1) {
    const float other = __shfl_xor_sync(kFullMask, value, offset);
    if (offset < lanes) value += other;
  }
  return value;
}

// exp(x) of the softmax weights: a multiply and the hardware's base-2
// exponential, with results below 2^-126 flushed to zero (a weight that small
// vanishes next to the row's largest, 1). __expf adds a four-instruction
// denormal fix-up per call. Forward and both backward passes use it, so the
// recomputed probabilities are the same numbers.
__device__ __forceinline__ float softmax_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

// --------------------------------------------------- copies ahead of use
// cp.async (compute capability 8.0+): BYTES (4, 8 or 16) of global memory
// into shared memory without passing through registers, one commit group
// per copy_ahead_commit, completed by copy_ahead_wait<PENDING> (at most
// PENDING of this thread's groups still in flight). Each thread reads back
// only what it copied itself, so no barrier is needed. The "memory"
// clobbers keep the compiler from moving reads of the copied data above the
// wait, or reads of a buffer below the copy that refills it. Older GPUs
// copy synchronously.
template <int BYTES>
__device__ __forceinline__ void copy_ahead(void* shared, const void* global) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address), "l"(global), "n"(BYTES) : "memory");
  }
#else
  struct alignas(BYTES) Bytes {
    unsigned char b[BYTES];
  };
  *static_cast<Bytes*>(shared) = *static_cast<const Bytes*>(global);
#endif
}

// copy_ahead with an L2 eviction policy (l2_evict_first_policy): the pass
// marks the rows it will hardly read again, so that L2 evicts them before
// the rows it keeps coming back to.
template <int BYTES>
__device__ __forceinline__ void copy_ahead(void* shared, const void* global, uint64_t policy) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
                 "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3;\n" ::"r"(address), "l"(global),
                 "n"(BYTES), "l"(policy)
                 : "memory");
  }
#else
  copy_ahead<BYTES>(shared, global);
#endif
}

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

__device__ __forceinline__ void copy_ahead_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int PENDING>
__device__ __forceinline__ void copy_ahead_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// x rounded to T and back to fp32 (x itself for fp32): GATv2's 16-bit score
// terms (passes.cuh's gatv2_hidden).
template <typename T>
__device__ __forceinline__ float rounded(float x) {
  if constexpr (std::is_same<T, float>::value) {
    return x;
  } else {
    return static_cast<float>(static_cast<T>(x));
  }
}

__device__ __forceinline__ float leaky_relu(float x, float slope) { return x > 0.f ? x : x * slope; }
__device__ __forceinline__ float leaky_relu_grad(float x, float slope) { return x > 0.f ? 1.f : slope; }

// Attention dropout without a stored mask: Philox-4x32-10 keyed by torch's
// generator seed, counter (edge id, offset + head / 4); word head % 4 gives a
// uniform in [0, 1). Forward and backward evaluate the same (edge, head) pairs
// to the same bits, so backward regenerates the mask instead of reading one.
__device__ __forceinline__ float dropout_uniform(uint64_t seed, uint64_t offset, int64_t edge, int head) {
  uint32_t c0 = static_cast<uint32_t>(edge), c1 = static_cast<uint32_t>(static_cast<uint64_t>(edge) >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset) + static_cast<uint32_t>(head >> 2), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const int word = head & 3;
  const uint32_t bits = word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// The weight dropout gives an attention coefficient: 0 when dropped, 1/(1-p) when kept.
struct Dropout {
  float p;
  float keep_scale;
  uint64_t seed;
  uint64_t offset;

  __device__ __forceinline__ float weight(int64_t edge, int head) const {
    if (p <= 0.f) return 1.f;
    return dropout_uniform(seed, offset, edge, head) >= p ? keep_scale : 0.f;
  }
};

}  // namespace attention
}  // namespace gnnio
