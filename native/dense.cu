// Dense fp32 matrix products on the tensor cores, at fp32's accuracy: the
// projections (x @ W^T + b) of every layer and their gradients.
//
// Why: a layer's projections are GEMMs of tall node-feature matrices
// ([1M, 128] @ [128, 512] on rmat20); cuBLAS runs fp32 ones on the FMA units
// (about 40 TFLOPS on an H100), and TF32 alone would round every operand to
// 11 significant bits, far from what an fp32 layer promises. Here each
// operand x is split into hi = tf32(x) and lo = tf32(x - hi), and a * b is
// taken as lo_a * hi_b + hi_a * lo_b + hi_a * hi_b (the lo * lo term is
// below fp32's rounding): three TF32 MMAs per product, each exact in its
// products, and each 8-wide step's sum (mma.sync, WarpMma) or 32-wide
// k-tile's sum (wgmma on sm_90a, WarpgroupMma) added to an fp32 accumulator
// with round-to-nearest. The result carries about 21-22 significant bits per
// product, against fp32 SGEMM's rounding of its running sums: on rmat20's
// projections 0.5x (mma.sync) to 0.8x (wgmma) SGEMM's error against fp64,
// and the tests hold it to a small multiple of torch's fp32 error everywhere.
// Inputs near fp32's largest value (above about 3.4e38 * (1 - 2^-12)) or
// infinite give NaN where SGEMM gives inf; such inputs overflow any
// projection anyway.
//
// Operands are "column segments": up to four row-major [rows, width_i]
// tensors side by side, read as one [rows, sum width_i] matrix, so a layer's
// several projections are one product without concatenating their inputs or
// outputs (the forward writes q, k, v and skip into four tensors; the input
// gradient reads four gradients as one K = 512 operand).
#include "common.cuh"

#include <cstdlib>
#include <mutex>
#include <vector>

namespace gnnio {
namespace {

constexpr int kTileM = 128, kTileN = 128, kTileK = 32;
// Four stages of 36 KiB (and, on wgmma, 64 KiB of split B): one block per
// SM, whose eight warps keep three tiles in flight while they multiply the
// fourth.
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kWarpTileM = kTileM / kWarpsM;  // 64
constexpr int kWarpTileN = kTileN / kWarpsN;  // 32
constexpr int kFragsM = kWarpTileM / 16;      // m16n8k8 tiles per warp, along M
constexpr int kFragsN = kWarpTileN / 8;       // and along N
constexpr int kMaxSegments = 4;
constexpr int kChunk = 4;  // floats per 16-byte cp.async

// Shared-memory tiles keep the orientation of their operand in global memory:
// "K-major" [128][32 + 4] (rows along M or N, K contiguous) or "MN-major"
// [32][128 + 8]. The pads put the fragment reads (row g = lane / 4, column
// t = lane % 4, or the transpose) on 32 distinct banks: 36 = 4 (mod 32) and
// 136 = 8 (mod 32).
constexpr int kKMajorLd = kTileK + 4;
constexpr int kMnMajorLd = kTileM + 8;
constexpr int kOperandFloats = kTileM * kKMajorLd;
static_assert(kTileK * kMnMajorLd <= kOperandFloats, "an MN-major tile must fit the K-major tile's room");
constexpr int kStageFloats = 2 * kOperandFloats;

// A [rows, cols] matrix made of up to four row-major blocks side by side:
// block s holds columns [start[s], start[s + 1]) with row stride
// start[s + 1] - start[s] (each block is a contiguous tensor).
template <typename P>
struct ColumnSegments {
  P ptr[kMaxSegments];
  int64_t start[kMaxSegments + 1];
  int count;
  int64_t rows;

  __device__ __forceinline__ int64_t cols() const { return start[count]; }

  struct Segment {
    P ptr;
    int64_t begin, width;
  };

  // The block holding column `col`. Selected with constant indices: indexing
  // the kernel's parameters by a register compiles to slow indexed constant loads.
  __device__ __forceinline__ Segment segment_of(int64_t col) const {
    Segment segment{ptr[0], 0, start[1]};
#pragma unroll
    for (int j = 1; j < kMaxSegments; ++j)
      if (j < count && col >= start[j]) segment = Segment{ptr[j], start[j], start[j + 1] - start[j]};
    return segment;
  }

  __device__ __forceinline__ P at(int64_t row, int64_t col) const {
    const Segment segment = segment_of(col);
    return segment.ptr + row * segment.width + (col - segment.begin);
  }
};

__device__ __forceinline__ void cp_async_16(float* smem, const float* global, bool inside) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // src-size 0 fills the 16 bytes with zeros: tiles past the matrix's edge add nothing.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "r"(inside ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// Copies one operand's tiles into shared memory, 16 bytes per cp.async,
// zeros outside the matrix. Column widths are multiples of 4 (checked on the
// host), so a chunk never straddles a block of the segments or the last
// column. Each thread copies the same CHUNKS chunks of every tile; what only
// depends on the tile of C (the rows or columns along M or N) is worked out
// once per work item in begin_item, so a k-tile costs a few instructions per
// chunk.
//
// K-major tiles ([128][32], the operand stored [M or N, K]): rows fixed per
// item, columns (k) move; a k-tile inside one block (all of them where the
// blocks are 32-multiples wide) takes the fast path.
// Where chunk i of this thread goes in a tile whose rows hold CHUNKS_PER_ROW
// 16-byte chunks: row, and column in floats.
template <int CHUNKS_PER_ROW>
__device__ __forceinline__ int chunk_row(int i) {
  return (threadIdx.x + i * kThreads) / CHUNKS_PER_ROW;
}
template <int CHUNKS_PER_ROW>
__device__ __forceinline__ int chunk_col(int i) {
  return (threadIdx.x + i * kThreads) % CHUNKS_PER_ROW * kChunk;
}

struct KMajorCopier {
  static constexpr int kChunksPerRow = kTileK / kChunk;
  static constexpr int kChunks = kTileM * kChunksPerRow / kThreads;
  int64_t row[kChunks];

  __device__ __forceinline__ void begin_item(const ColumnSegments<const float*>&, int64_t mn0) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) row[i] = mn0 + chunk_row<kChunksPerRow>(i);
  }

  __device__ __forceinline__ void copy(const ColumnSegments<const float*>& matrix, int64_t k0, float* smem) const {
    const auto segment = matrix.segment_of(k0);
    const bool one_block = k0 + kTileK <= segment.begin + segment.width;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int r = chunk_row<kChunksPerRow>(i), c = chunk_col<kChunksPerRow>(i);
      const int64_t col = k0 + c;
      const float* source = matrix.ptr[0];
      bool inside;
      if (one_block) {  // the whole k-tile inside one block: no lookup, no column bound
        inside = row[i] < matrix.rows;
        if (inside) source = segment.ptr + row[i] * segment.width + (col - segment.begin);
      } else {
        inside = row[i] < matrix.rows && col < matrix.cols();
        if (inside) source = matrix.at(row[i], col);
      }
      cp_async_16(smem + r * kKMajorLd + c, source, inside);
    }
  }
};

// MN-major tiles ([32][128], the operand stored [K, M or N]): columns fixed
// per item (each chunk's block, and its address in row 0, found once), rows
// (k) move.
struct MnMajorCopier {
  static constexpr int kChunksPerRow = kTileM / kChunk;
  static constexpr int kChunks = kTileK * kChunksPerRow / kThreads;
  const float* column[kChunks];  // the chunk's address in row 0, or null outside the matrix
  int64_t width[kChunks];        // the row stride of the chunk's block

  __device__ __forceinline__ void begin_item(const ColumnSegments<const float*>& matrix, int64_t mn0) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int64_t col = mn0 + chunk_col<kChunksPerRow>(i);
      const auto segment = matrix.segment_of(col);
      column[i] = col < matrix.cols() ? segment.ptr + (col - segment.begin) : nullptr;
      width[i] = segment.width;
    }
  }

  __device__ __forceinline__ void copy(const ColumnSegments<const float*>& matrix, int64_t k0, float* smem) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int r = chunk_row<kChunksPerRow>(i), c = chunk_col<kChunksPerRow>(i);
      const int64_t row = k0 + r;
      const bool inside = column[i] != nullptr && row < matrix.rows;
      cp_async_16(smem + r * kMnMajorLd + c, inside ? column[i] + row * width[i] : matrix.ptr[0], inside);
    }
  }
};

template <bool K_MAJOR>
using TileCopier = std::conditional_t<K_MAJOR, KMajorCopier, MnMajorCopier>;

template <bool K_MAJOR>
__device__ __forceinline__ float tile_at(const float* smem, int mn, int k) {
  return K_MAJOR ? smem[mn * kKMajorLd + k] : smem[k * kMnMajorLd + mn];
}

// x rounded to TF32 (10 mantissa bits), to nearest with ties away from zero:
// add half a TF32 ulp to the magnitude, then clear the 13 bits TF32 drops. Two
// integer instructions, where cvt.rna.tf32.f32 takes four on sm_90 (it also
// guards infinities, which here stay infinite anyway).
__device__ __forceinline__ uint32_t to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// x = hi + lo to 22 significant bits, both TF32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One k-tile of the warp's 64 x 32 block: for each 8-wide k step, its A and B
// fragments split into hi and lo, then three MMAs per fragment pair (the small
// terms first, so they are not lost against the larger ones).
template <bool A_K_MAJOR, bool B_K_MAJOR>
__device__ __forceinline__ void multiply_tile(const float* a_tile, const float* b_tile, int warp_m0, int warp_n0,
                                              float (&acc)[kFragsM][kFragsN][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  // Unrolled by two: by four, ptxas spills in three of the four operand
  // orientations and rmat20's forward took 3.65 ms against 3.45 (by one:
  // 3.61); by two it spills 16 bytes in the two MN-major-A orientations.
#pragma unroll 2
  for (int kk = 0; kk < kTileK; kk += 8) {
    uint32_t b_hi[kFragsN][2], b_lo[kFragsN][2];
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
      const int n = warp_n0 + j * 8 + g;
      // B fragment (k x n): (t, g), (t + 4, g).
      split_tf32(tile_at<B_K_MAJOR>(b_tile, n, kk + t), b_hi[j][0], b_lo[j][0]);
      split_tf32(tile_at<B_K_MAJOR>(b_tile, n, kk + t + 4), b_hi[j][1], b_lo[j][1]);
    }
    // The tensor cores round their fp32 sums toward zero, which over a long K
    // drifts well past SGEMM's error. So each 8-wide step's three MMAs go into
    // a fresh partial sum, added to the accumulator with an ordinary
    // (round-to-nearest) fp32 add. One row of fragments at a time: its four
    // partials are independent MMA chains, and need only 16 more registers
    // (A's fragments are split per row for the same reason).
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int m = warp_m0 + i * 16 + g;
      uint32_t a_hi[4], a_lo[4];
      // m16n8k8 A fragment: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m, kk + t), a_hi[0], a_lo[0]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m + 8, kk + t), a_hi[1], a_lo[1]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m, kk + t + 4), a_hi[2], a_lo[2]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m + 8, kk + t + 4), a_hi[3], a_lo[3]);
      float step[kFragsN][4] = {};
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) mma_tf32(step[j], a_lo, b_hi[j]);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) mma_tf32(step[j], a_hi, b_lo[j]);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) mma_tf32(step[j], a_hi, b_hi[j]);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] += step[j][r];
    }
  }
}

// The warp-level multiply (mma.sync, any sm_80+ GPU): eight warps of 64 x 32
// each, see multiply_tile.
struct WarpMma {
  static constexpr int kFragsM = ::gnnio::kFragsM, kFragsN = ::gnnio::kFragsN;
  static constexpr int kExtraSharedFloats = 0;
  static constexpr int kTilesAhead = 0;  // reads only the k-tile it multiplies
  int warp_m0, warp_n0;  // the warp's block of the 128 x 128 tile

  __device__ __forceinline__ WarpMma() {
    const int warp = threadIdx.x / kWarp;
    warp_m0 = (warp / kWarpsN) * kWarpTileM;
    warp_n0 = (warp % kWarpsN) * kWarpTileN;
  }

  template <bool A_K_MAJOR, bool B_K_MAJOR>
  __device__ __forceinline__ void multiply(const float* a_tile, const float* b_tile, const float*, bool, float*,
                                           float (&acc)[kFragsM][kFragsN][4]) {
    multiply_tile<A_K_MAJOR, B_K_MAJOR>(a_tile, b_tile, warp_m0, warp_n0, acc);
  }
};

// The warpgroup-level multiply (wgmma, sm_90a: H100, H200): two warpgroups of
// 64 x 128 each. Why: mma.sync kept the SM issuing the fragment loads and the
// hi/lo splits of every warp beside its MMAs (about 40% of the TF32 peak on
// a projection); wgmma reads B from shared memory on its own, so B is split
// once per k-tile by the whole block, and each thread splits only its share
// of A (16 elements per k-tile, in registers).
//
// B's split halves go to shared memory in wgmma's K-major layout without
// swizzle: 8 x 16-byte "core matrices" (8 rows of N, 4 k each), the two of
// an 8-wide k step 128 bytes apart (leading byte offset), consecutive groups
// of 8 rows of N 256 bytes apart (stride byte offset), each k step 4 KiB.
// A 16-byte chunk c of a split tile (4 k of one n) is at byte 16 c, so the
// block's writes are contiguous.
//
// Overlap: while a k-tile's wgmmas run, the block splits the next k-tile's B
// into the other of two buffers (so that copy must have landed: kTilesAhead),
// and each thread splits A's k steps one at a time, each just before its
// wgmmas, so the tensor cores start on the first step at once.
//
// Rounding: the tensor cores add into their accumulator rounding toward
// zero, so a k-tile's 12 wgmmas (4 k steps x 3 products) go into a fresh
// partial sum that is added to the accumulator with an ordinary fp32 add
// (mma.sync's path does this per 8-wide step; a k-tile of 32 is the
// coarsest grain that still waits on the tensor cores only once per tile).
struct WarpgroupMma {
  static constexpr int kFragsM = 1, kFragsN = kTileN / 8;
  static constexpr int kSplitFloats = kTileN * kTileK;                  // one split half of B's tile
  static constexpr int kExtraSharedFloats = 4 * kSplitFloats;           // two buffers of (hi, lo)
  static constexpr int kTilesAhead = 1;                                 // splits the next k-tile's B
  static constexpr uint32_t kCoreMatrixBytes = 128, kCoreRowsBytes = 256;  // leading, stride byte offsets
  static constexpr int kStepFloats = kTileN * 8;                        // one 8-wide k step of a split half
  int warp_m0, warp_n0;
  int buffer = 0;  // which split buffer holds the B of the k-tile being multiplied

  __device__ __forceinline__ WarpgroupMma() {
    const int warp = threadIdx.x / kWarp;
    warp_m0 = (warp / 4) * 64 + (warp % 4) * 16;  // wgmma gives warp w of a warpgroup rows 16 w .. 16 w + 15
    warp_n0 = 0;
  }

  // The shared-memory matrix descriptor of one k step of a split half (no swizzle).
  static __device__ __forceinline__ uint64_t descriptor(const float* step) {
    const uint64_t address = static_cast<uint32_t>(__cvta_generic_to_shared(step));
    return ((address & 0x3ffff) >> 4) | (uint64_t{kCoreMatrixBytes >> 4} << 16) |
           (uint64_t{kCoreRowsBytes >> 4} << 32);
  }

  // B's tile (as copied, either orientation) -> its hi and lo halves in wgmma's layout.
  template <bool B_K_MAJOR>
  static __device__ __forceinline__ void split_b(const float* b_tile, float* hi, float* lo) {
#pragma unroll
    for (int i = 0; i < kSplitFloats / 4 / kThreads; ++i) {
      const int chunk = threadIdx.x + i * kThreads;
      // chunk bits: 0-2 n within its group of 8, 3 the k half of the step, 4-7 the group of n, 8-9 the k step
      const int n = ((chunk >> 4) & 15) * 8 + (chunk & 7);
      const int k = (chunk >> 8) * 8 + ((chunk >> 3) & 1) * 4;
      float value[4];
      if constexpr (B_K_MAJOR) {
        const float4 row = *reinterpret_cast<const float4*>(b_tile + n * kKMajorLd + k);
        value[0] = row.x, value[1] = row.y, value[2] = row.z, value[3] = row.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) value[j] = b_tile[(k + j) * kMnMajorLd + n];
      }
      uint4 high, low;
      split_tf32(value[0], high.x, low.x);
      split_tf32(value[1], high.y, low.y);
      split_tf32(value[2], high.z, low.z);
      split_tf32(value[3], high.w, low.w);
      reinterpret_cast<uint4*>(hi)[chunk] = high;
      reinterpret_cast<uint4*>(lo)[chunk] = low;
    }
  }

  // B's tile -> split buffer `which` (hi, then lo), fenced for the tensor cores, which read it
  // through the async proxy; the next block-wide barrier publishes it.
  template <bool B_K_MAJOR>
  static __device__ __forceinline__ void split_b_into(int which, const float* b_tile, float* extra) {
    float* const hi = extra + which * 2 * kSplitFloats;
    split_b<B_K_MAJOR>(b_tile, hi, hi + kSplitFloats);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }

  // d (+)= a @ B's k step: one m64n128k8 wgmma, A from registers.
  static __device__ __forceinline__ void wgmma(float (&d)[kFragsN * 4], const uint32_t (&a)[4], uint64_t b,
                                               int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
      "{\n.reg .pred scale_d;\nsetp.ne.b32 scale_d, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, scale_d, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
  }

  // Keeps the compiler from moving reads or reuse of r across a wgmma wait:
  // the tensor cores write (or read) r until then.
  static __device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
  static __device__ __forceinline__ void pin(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

  // acc += this k-tile's product. b_next: the next k-tile's B as copied (null after the block's
  // last k-tile); first: the block's first k-tile, whose B nobody has split yet.
  template <bool A_K_MAJOR, bool B_K_MAJOR>
  __device__ __forceinline__ void multiply(const float* a_tile, const float* b_tile, const float* b_next, bool first,
                                           float* extra, float (&acc)[kFragsM][kFragsN][4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (first) {
      split_b_into<B_K_MAJOR>(buffer, b_tile, extra);
      __syncthreads();
    }
    const float* const hi = extra + buffer * 2 * kSplitFloats;
    const float* const lo = hi + kSplitFloats;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int m = warp_m0 + g;
    constexpr int kSteps = kTileK / 8;
    uint32_t a_hi[kSteps][4], a_lo[kSteps][4];
    float partial[kFragsN * 4];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      // A fragment (m64k8, per warp as mma.sync's m16k8): (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
      const int k = step * 8 + t;
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m, k), a_hi[step][0], a_lo[step][0]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m + 8, k), a_hi[step][1], a_lo[step][1]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m, k + 4), a_hi[step][2], a_lo[step][2]);
      split_tf32(tile_at<A_K_MAJOR>(a_tile, m + 8, k + 4), a_hi[step][3], a_lo[step][3]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      const uint64_t b_hi = descriptor(hi + step * kStepFloats);
      const uint64_t b_lo = descriptor(lo + step * kStepFloats);
      wgmma(partial, a_lo[step], b_hi, step > 0);  // the small terms first, so they are not lost
      wgmma(partial, a_hi[step], b_lo, 1);
      wgmma(partial, a_hi[step], b_hi, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    buffer ^= 1;
    // the other buffer's last reader, the previous k-tile's wgmmas, has finished
    if (b_next != nullptr) split_b_into<B_K_MAJOR>(buffer, b_next, extra);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int step = 0; step < kSteps; ++step)
#pragma unroll
      for (int r = 0; r < 4; ++r) pin(a_hi[step][r]), pin(a_lo[step][r]);
#pragma unroll
    for (int j = 0; j < kFragsN; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pin(partial[4 * j + r]);
        acc[0][j][r] += partial[4 * j + r];
      }
#else
    __trap();  // launched only where the build has sm_90a code (wgmma_built)
#endif
  }
};

struct GemmArgs {
  ColumnSegments<const float*> a;  // A as stored: [M, K] when A_K_MAJOR, else [K, M]
  ColumnSegments<const float*> b;  // B as stored: [N, K] when B_K_MAJOR, else [K, N]
  ColumnSegments<float*> out;      // C [M, N] (with one split)
  const float* bias;               // [N] or null (with one split)
  float* partial;                  // [splits, M, N] when split along K, else null
  float* row_sums;                 // sum over k of A[m, k]: [M] with one split, [splits, M] when split; or null
  int64_t m, n, k;
  int64_t k_tiles_per_split;
};

// A block's share of the product: work items are (tile of C, range of K),
// split-major and along N first within a split, so the blocks running at
// once share bands of A's rows and of B and find them in L2.
struct WorkItem {
  int64_t m0, n0, split, k_tile_begin, k_tiles;
};

__device__ __forceinline__ WorkItem work_item(const GemmArgs& args, int64_t item) {
  const int64_t tiles_n = (args.n + kTileN - 1) / kTileN;
  const int64_t tiles = ((args.m + kTileM - 1) / kTileM) * tiles_n;
  WorkItem work;
  work.split = item / tiles;
  const int64_t tile = item % tiles;
  work.m0 = (tile / tiles_n) * kTileM;
  work.n0 = (tile % tiles_n) * kTileN;
  work.k_tile_begin = work.split * args.k_tiles_per_split;
  const int64_t left = (args.k + kTileK - 1) / kTileK - work.k_tile_begin;
  work.k_tiles = left < args.k_tiles_per_split ? left : args.k_tiles_per_split;
  return work;
}

// The warp's accumulators to C (+ bias), or to its split's partial tile.
// Each thread's four column pairs (and their block of C and bias) are found
// once, then written row by row.
template <int FRAGS_M, int FRAGS_N>
__device__ __forceinline__ void store_tile(const GemmArgs& args, const WorkItem& work, int warp_m0, int warp_n0,
                                           const float (&acc)[FRAGS_M][FRAGS_N][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  float* column[FRAGS_N];  // the pair's address in row 0 (C fragment columns 2t, 2t + 1 of each n tile)
  int64_t stride[FRAGS_N];
  float2 bias[FRAGS_N];
#pragma unroll
  for (int j = 0; j < FRAGS_N; ++j) {
    const int64_t col = work.n0 + warp_n0 + j * 8 + 2 * t;
    bias[j] = make_float2(0.f, 0.f);
    if (args.partial != nullptr) {
      column[j] = args.partial + work.split * args.m * args.n + col;
      stride[j] = args.n;
    } else {
      const auto segment = args.out.segment_of(col);
      column[j] = segment.ptr + (col - segment.begin);
      stride[j] = segment.width;
      if (args.bias != nullptr && col < args.n) bias[j] = make_float2(args.bias[col], args.bias[col + 1]);
    }
  }
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // C fragment rows: g, then g + 8.
      const int64_t row = work.m0 + warp_m0 + i * 16 + g + half * 8;
      if (row >= args.m) continue;
#pragma unroll
      for (int j = 0; j < FRAGS_N; ++j) {
        if (work.n0 + warp_n0 + j * 8 + 2 * t >= args.n) continue;  // n is even: both columns or neither
        *reinterpret_cast<float2*>(column[j] + row * stride[j]) =
            make_float2(acc[i][j][2 * half] + bias[j].x, acc[i][j][2 * half + 1] + bias[j].y);
      }
    }
}

// C = A @ B (+ bias). Persistent blocks (one per SM) take work items
// blockIdx.x, + gridDim.x, ...; the copy pipeline runs on across items, so
// the next tile's first k-tiles load while this one's last multiply and its
// results are stored: a projection has K = 128, only four k-tiles per item.
// With several K ranges each item writes its partial tile to `partial`,
// summed in order by reduce_splits_kernel: deterministic, no atomics.
template <bool A_K_MAJOR, bool B_K_MAJOR, typename Mma>
__global__ void __launch_bounds__(kThreads, 1) gemm_split_tf32_kernel(const GemmArgs args, int64_t items) {
  extern __shared__ __align__(16) float shared[];
  Mma mma;
  float* const mma_shared = shared + kStages * kStageFloats;  // the multiply's own room (Mma::kExtraSharedFloats)

  // The copy cursor runs kStages - 1 k-tiles ahead of the multiply.
  int64_t load_item = blockIdx.x, load_k_tile = 0;
  WorkItem load_work = work_item(args, load_item);
  if (load_work.k_tiles <= 0) load_item = items;  // K = 0: nothing to copy
  int load_stage = 0;
  TileCopier<A_K_MAJOR> a_copier;
  TileCopier<B_K_MAJOR> b_copier;
  auto copy_next = [&] {
    if (load_item < items) {
      if (load_k_tile == 0) {
        a_copier.begin_item(args.a, load_work.m0);
        b_copier.begin_item(args.b, load_work.n0);
      }
      float* a_tile = shared + load_stage * kStageFloats;
      const int64_t k0 = (load_work.k_tile_begin + load_k_tile) * kTileK;
      a_copier.copy(args.a, k0, a_tile);
      b_copier.copy(args.b, k0, a_tile + kOperandFloats);
      if (++load_k_tile == load_work.k_tiles) {
        load_item += gridDim.x;
        load_k_tile = 0;
        if (load_item < items) load_work = work_item(args, load_item);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    load_stage = (load_stage + 1) % kStages;
  };
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) copy_next();

  int compute_stage = 0;
  bool first_tile = true;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const WorkItem work = work_item(args, item);
    // Row sums (bias gradients) need A's tile MN-major: thread m sums column m of each tile.
    const bool sums_rows = !A_K_MAJOR && args.row_sums != nullptr && work.n0 == 0 && threadIdx.x < kTileM;
    float acc[Mma::kFragsM][Mma::kFragsN][4] = {};
    float row_sum = 0.f;
    for (int64_t k_tile = 0; k_tile < work.k_tiles; ++k_tile) {
      cp_async_wait<kStages - 2 - Mma::kTilesAhead>();
      // Everyone's copies of this k-tile (and of the next kTilesAhead) have
      // landed, and everyone is done with the stage the next copy overwrites
      // (multiplied in the last step).
      __syncthreads();
      copy_next();
      const float* a_tile = shared + compute_stage * kStageFloats;
      const bool has_next = k_tile + 1 < work.k_tiles || item + gridDim.x < items;
      const float* b_next = has_next ? shared + (compute_stage + 1) % kStages * kStageFloats + kOperandFloats : nullptr;
      mma.template multiply<A_K_MAJOR, B_K_MAJOR>(a_tile, a_tile + kOperandFloats, b_next, first_tile, mma_shared,
                                                  acc);
      first_tile = false;
      if (sums_rows) {
#pragma unroll 8
        for (int k = 0; k < kTileK; ++k) row_sum += a_tile[k * kMnMajorLd + threadIdx.x];
      }
      compute_stage = (compute_stage + 1) % kStages;
    }
    if (sums_rows && work.m0 + threadIdx.x < args.m) {
      const int64_t split_offset = args.partial != nullptr ? work.split * args.m : 0;
      args.row_sums[split_offset + work.m0 + threadIdx.x] = row_sum;
    }
    store_tile(args, work, mma.warp_m0, mma.warp_n0, acc);
  }
  cp_async_wait<0>();
}

// C = sum over splits of the partial tiles (+ bias), in split order; likewise
// the row sums.
__global__ void reduce_splits_kernel(const float* __restrict__ partial, int64_t splits, int64_t m, int64_t n,
                                     const float* __restrict__ bias, ColumnSegments<float*> out,
                                     const float* __restrict__ partial_row_sums, float* __restrict__ row_sums) {
  const int64_t cells = m * n;
  const int64_t total = cells + (row_sums != nullptr ? m : 0);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < cells) {
      float sum = bias != nullptr ? bias[i % n] : 0.f;
      for (int64_t s = 0; s < splits; ++s) sum += partial[s * cells + i];
      *out.at(i / n, i % n) = sum;
    } else {
      const int64_t row = i - cells;
      float sum = 0.f;
      for (int64_t s = 0; s < splits; ++s) sum += partial_row_sums[s * m + row];
      row_sums[row] = sum;
    }
  }
}

constexpr const char* kOp = "gnnio::matmul_split_tf32";

// Checks `blocks` (fp32, CUDA, 2-D, contiguous, equal row counts, widths
// multiples of 4, 16-byte aligned) and views them as one matrix: the
// operands (P = const float*) and the outputs (float*).
template <typename P>
ColumnSegments<P> column_segments(at::TensorList blocks, const char* name, const at::Device& device) {
  GNNIO_CHECK(!blocks.empty() && blocks.size() <= kMaxSegments, kOp, name, " takes 1 to ", kMaxSegments,
              " tensors, got ", blocks.size());
  ColumnSegments<P> matrix{};
  matrix.count = static_cast<int>(blocks.size());
  matrix.rows = blocks[0].dim() == 2 ? blocks[0].size(0) : -1;
  for (size_t s = 0; s < blocks.size(); ++s) {
    const at::Tensor& block = blocks[s];
    GNNIO_CHECK(block.device() == device, kOp, name, "[", s, "] must be on ", device, ", got ", block.device());
    GNNIO_CHECK(block.scalar_type() == at::kFloat, kOp, name, "[", s, "] must be float32, got ",
                block.scalar_type());
    GNNIO_CHECK(block.dim() == 2 && block.size(0) == matrix.rows, kOp, name, "[", s, "] must be [", matrix.rows,
                ", width], got shape ", block.sizes());
    GNNIO_CHECK(block.is_contiguous(), kOp, name, "[", s, "] must be contiguous");
    GNNIO_CHECK(block.size(1) % kChunk == 0 && reinterpret_cast<uintptr_t>(block.data_ptr()) % 16 == 0, kOp, name,
                "[", s, "] needs a width that is a multiple of 4 and a 16-byte aligned start, got width ",
                block.size(1));
    matrix.ptr[s] = block.data_ptr<float>();
    matrix.start[s + 1] = matrix.start[s] + block.size(1);
  }
  for (size_t s = blocks.size(); s < kMaxSegments; ++s) matrix.ptr[s] = matrix.ptr[0];
  return matrix;
}

// Writes 1 where the code the GPU runs was built for sm_90a (wgmma), else 0.
__global__ void wgmma_probe_kernel(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

// Whether the current device runs this build's wgmma multiply: asked of the
// device once per process and device (the arch list may hold sm_90 without
// sm_90a, e.g. TORCH_CUDA_ARCH_LIST=9.0). GNNIO_SPLIT_TF32_WGMMA=0 keeps the
// mma.sync multiply (to compare the two).
bool wgmma_built(int device) {
  static std::mutex mutex;
  static std::vector<int> built;  // per device: -1 unknown, 0, 1
  const char* choice = std::getenv("GNNIO_SPLIT_TF32_WGMMA");
  if (choice != nullptr && std::string(choice) == "0") return false;
  const std::lock_guard<std::mutex> lock(mutex);
  if (built.size() <= static_cast<size_t>(device)) built.resize(device + 1, -1);
  if (built[device] < 0) {
    const at::Tensor flag = at::empty({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
    wgmma_probe_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(flag.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    built[device] = flag.item<int>();
  }
  return built[device] == 1;
}

template <bool A_K_MAJOR, bool B_K_MAJOR, typename Mma>
void launch_gemm(const GemmArgs& args, int64_t items, unsigned blocks, cudaStream_t stream) {
  const auto kernel = gemm_split_tf32_kernel<A_K_MAJOR, B_K_MAJOR, Mma>;
  constexpr int shared_bytes = sizeof(float) * (kStages * kStageFloats + Mma::kExtraSharedFloats);
  // Above 48 KiB of dynamic shared memory a kernel must opt in (on each device it runs on).
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<blocks, kThreads, shared_bytes, stream>>>(args, items);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool A_K_MAJOR, bool B_K_MAJOR>
void launch_gemm(const GemmArgs& args, int64_t items, unsigned blocks, bool wgmma, cudaStream_t stream) {
  if (wgmma) {
    launch_gemm<A_K_MAJOR, B_K_MAJOR, WarpgroupMma>(args, items, blocks, stream);
  } else {
    launch_gemm<A_K_MAJOR, B_K_MAJOR, WarpMma>(args, items, blocks, stream);
  }
}

// See the schema below.
std::vector<at::Tensor> matmul_split_tf32(at::TensorList a, bool a_transposed, at::TensorList b, bool b_transposed,
                                          const std::optional<at::Tensor>& bias, c10::IntArrayRef out_widths,
                                          bool row_sums) {
  GNNIO_CHECK(!a.empty() && a[0].is_cuda(), kOp, "a must be CUDA tensors");
  const at::Device device = a[0].device();
  const c10::cuda::CUDAGuard guard(device);
  const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
  GNNIO_CHECK(properties->major >= 8, kOp, "TF32 tensor cores need compute capability 8.0 or newer, got ",
              properties->major, ".", properties->minor);
  GemmArgs args{};
  args.a = column_segments<const float*>(a, "a", device);
  args.b = column_segments<const float*>(b, "b", device);
  const int64_t a_cols = args.a.start[args.a.count], b_cols = args.b.start[args.b.count];
  args.m = a_transposed ? a_cols : args.a.rows;
  args.k = a_transposed ? args.a.rows : a_cols;
  const int64_t b_k = b_transposed ? b_cols : args.b.rows;
  args.n = b_transposed ? args.b.rows : b_cols;
  GNNIO_CHECK(b_k == args.k, kOp, "a gives K = ", args.k, " but b gives K = ", b_k);
  GNNIO_CHECK(!row_sums || a_transposed, kOp, "row_sums needs a_transposed (A's rows are the stored columns)");
  GNNIO_CHECK(!out_widths.empty() && out_widths.size() <= kMaxSegments, kOp, "out_widths takes 1 to ", kMaxSegments,
              " widths, got ", out_widths);
  int64_t out_total = 0;
  for (int64_t width : out_widths) {
    GNNIO_CHECK(width >= 0 && width % kChunk == 0, kOp, "out_widths must be multiples of 4, got ", out_widths);
    out_total += width;
  }
  GNNIO_CHECK(out_total == args.n, kOp, "out_widths must add up to N = ", args.n, ", got ", out_widths);
  if (bias.has_value()) {
    GNNIO_CHECK(bias->device() == device && bias->scalar_type() == at::kFloat && bias->dim() == 1 &&
                    bias->size(0) == args.n && bias->is_contiguous(),
                kOp, "bias must be a contiguous float32 [", args.n, "] on ", device, ", got ", bias->scalar_type(),
                " of shape ", bias->sizes());
  }

  const auto options = a[0].options();
  std::vector<at::Tensor> outputs;
  for (int64_t width : out_widths) outputs.push_back(at::empty({args.m, width}, options));
  if (args.m == 0 || args.n == 0) {  // nothing to multiply; A's row sums may still be asked for
    if (row_sums) outputs.push_back(at::cat(a, 1).sum(0));
    return outputs;
  }
  args.out = column_segments<float*>(outputs, "out", device);
  at::Tensor sums = row_sums ? at::empty({args.m}, options) : at::Tensor();

  // Split K when there are too few tiles of C to give every SM two
  // (weight gradients: [512, 128] from K = 1M rows), keeping at least four
  // k-tiles per split.
  const int64_t tiles = ((args.m + kTileM - 1) / kTileM) * ((args.n + kTileN - 1) / kTileN);
  const int64_t k_tiles = (args.k + kTileK - 1) / kTileK;
  const int64_t wanted = (2 * static_cast<int64_t>(properties->multiProcessorCount) + tiles - 1) / tiles;
  int64_t splits = std::max<int64_t>(1, std::min(wanted, k_tiles / 4));
  args.k_tiles_per_split = std::max<int64_t>(1, (k_tiles + splits - 1) / splits);
  splits = std::max<int64_t>(1, (k_tiles + args.k_tiles_per_split - 1) / args.k_tiles_per_split);
  at::Tensor partial, partial_sums;
  if (splits > 1) {
    partial = at::empty({splits, args.m, args.n}, options);
    args.partial = partial.data_ptr<float>();
    if (row_sums) partial_sums = at::empty({splits, args.m}, options);
  }
  args.bias = splits == 1 && bias.has_value() ? bias->data_ptr<float>() : nullptr;
  args.row_sums = !row_sums ? nullptr : (splits > 1 ? partial_sums.data_ptr<float>() : sums.data_ptr<float>());

  const int64_t items = tiles * splits;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(items, properties->multiProcessorCount));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool wgmma = wgmma_built(device.index());
  // Operand orientations: A stored [M, K] unless transposed; B stored [K, N] unless transposed.
  if (!a_transposed && b_transposed)
    launch_gemm<true, true>(args, items, blocks, wgmma, stream);
  else if (!a_transposed)
    launch_gemm<true, false>(args, items, blocks, wgmma, stream);
  else if (b_transposed)
    launch_gemm<false, true>(args, items, blocks, wgmma, stream);
  else
    launch_gemm<false, false>(args, items, blocks, wgmma, stream);

  if (splits > 1) {
    const int64_t total = args.m * args.n + (row_sums ? args.m : 0);
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 8 * properties->multiProcessorCount);
    reduce_splits_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        args.partial, splits, args.m, args.n, bias.has_value() ? bias->data_ptr<float>() : nullptr, args.out,
        partial_sums.defined() ? partial_sums.data_ptr<float>() : nullptr, row_sums ? sums.data_ptr<float>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (row_sums) outputs.push_back(sums);
  return outputs;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  // C = op(A) @ op(B) (+ bias) in fp32 at fp32's accuracy on the TF32 tensor
  // cores (see the top of this file). A is the tensors `a` side by side
  // (each a contiguous fp32 [R, w_i], w_i a multiple of 4), op(A) = A^T when
  // a_transposed; likewise B and b. Returns C [M, N] cut along its columns
  // into tensors of out_widths (multiples of 4, adding up to N), then, with
  // row_sums (needs a_transposed), the sums of op(A)'s rows [M]: a bias
  // gradient next to its weight gradient. bias: fp32 [N] or None.
  // Deterministic: a long K is split into ranges whose partial results are
  // added in order. Needs compute capability 8.0+.
  m.def(
      "matmul_split_tf32(Tensor[] a, bool a_transposed, Tensor[] b, bool b_transposed, Tensor? bias, "
      "int[] out_widths, bool row_sums=False) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) { m.impl("matmul_split_tf32", &matmul_split_tf32); }

}  // namespace gnnio
