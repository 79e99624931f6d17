// The pieces of dense.cu's split-TF32 product that its kernels share: the
// tile geometry, column-segmented operands (ColumnSegments, StackedRows), the
// cp.async copiers that fill a stage's tiles, and the two multiply policies
// (WarpMma: mma.sync; WarpgroupMma: wgmma on sm_90a). dense.cu's header
// comment explains the split and the kernels; only dense.cu includes this.
#pragma once

#include "common.cuh"

#include <cstdint>

namespace gnnio {
namespace {
constexpr int kTileM = 128, kTileN = 128, kTileK = 32;
// Each multiply policy keeps kStages stages: four of 36 KiB (and, on wgmma
// without presplit B, 64 KiB of split B), or three of 50 KiB and the 68 KiB
// output tile (presplit B): one block per SM, whose eight warps keep the
// other stages' copies in flight while they multiply one.
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

// The wgmma multiply's B: a k-tile of B split into TF32 halves, each
// [4 k steps][16 groups of 8 n][2 k halves][8 n][4 k] floats (see WarpgroupMma).
constexpr int kSplitFloats = kTileN * kTileK;  // one split half of B's tile
constexpr int kSplitChunks = kSplitFloats / kChunk;
// Rows of an output tile staged in shared memory: 128 floats and a pad that
// puts a warp's float2 writes (8 rows x 4 threads) on all 32 banks twice.
constexpr int kStoreLd = kTileN + 8;

// Where 16-byte chunk c (4 k of one n) of a split half holds B's tile: bits
// 0-2 of c are n within its group of 8, bit 3 the k half of the step, bits
// 4-7 the group of n, bits 8-9 the k step.
__device__ __forceinline__ int split_chunk_n(int chunk) { return ((chunk >> 4) & 15) * 8 + (chunk & 7); }
__device__ __forceinline__ int split_chunk_k(int chunk) { return (chunk >> 8) * 8 + ((chunk >> 3) & 1) * 4; }

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
    if (count == 1) return segment;  // most operands: a uniform branch instead of the selects below
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

// A layer's weights W_i [w_i, K] (each a contiguous row-major tensor)
// stacked along their rows as one [N, K] matrix, the B^T of its projections'
// product, with their biases (null where a projection has none). The
// projection op reads them where they lie: the forward's first launch is
// then the split of B itself, with no concatenation before it (the host's
// time to the first launch is time the GPU waits at the start of a step).
struct StackedRows {
  const float* ptr[kMaxSegments];
  const float* bias[kMaxSegments];
  int64_t start[kMaxSegments + 1];  // block s holds rows [start[s], start[s + 1])
  int count;
  int64_t cols;

  // Blocks selected with constant indices, as in ColumnSegments::segment_of.
  __device__ __forceinline__ const float* at(int64_t row, int64_t col) const {
    const float* base = ptr[0];
    int64_t first = 0;
#pragma unroll
    for (int j = 1; j < kMaxSegments; ++j)
      if (j < count && row >= start[j]) base = ptr[j], first = start[j];
    return base + (row - first) * cols + col;
  }

  __device__ __forceinline__ float bias_at(int64_t row) const {
    const float* values = bias[0];
    int64_t first = 0;
#pragma unroll
    for (int j = 1; j < kMaxSegments; ++j)
      if (j < count && row >= start[j]) values = bias[j], first = start[j];
    return values != nullptr ? values[row - first] : 0.f;
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

// Makes this thread's writes to shared memory (stores, landed cp.async
// copies) visible to the async proxy, through which wgmma and the bulk
// copies read shared memory (sm_90a code only).
__device__ __forceinline__ void fence_async_proxy() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Copies one operand's tiles into shared memory, 16 bytes per cp.async,
// zeros outside the matrix. Column widths are multiples of 4 (checked on the
// host), so a chunk never straddles a block of the segments or the last
// column. Each thread copies CHUNKS chunks of every tile, all in one column
// of the tile and kThreads / CHUNKS_PER_ROW rows apart. What only depends on
// the tile of C is worked out once per work item in begin_item, and a k-tile
// inside one block (all of them where the blocks are 32-multiples wide) costs
// one address and a few instructions per chunk: the copies are issued by the
// same warps that multiply, so every instruction here is one the tensor cores
// may wait for.
// THREADS threads copy the tile (the block, or one warpgroup of it).
template <int CHUNKS_PER_ROW, int THREADS = kThreads>
struct ChunkPlace {
  static constexpr int kRowsApart = THREADS / CHUNKS_PER_ROW;  // between a thread's chunks
  static __device__ __forceinline__ int thread() { return threadIdx.x % THREADS; }
  static __device__ __forceinline__ int row() { return thread() / CHUNKS_PER_ROW; }  // of chunk 0
  static __device__ __forceinline__ int col() { return thread() % CHUNKS_PER_ROW * kChunk; }
};

// K-major tiles ([ROWS][32], the operand stored [M or N, K]): rows fixed per
// item, columns (k) move.
template <int ROWS = kTileM, int THREADS = kThreads>
struct KMajorCopier {
  static constexpr int kChunksPerRow = kTileK / kChunk;
  static constexpr int kChunks = ROWS * kChunksPerRow / THREADS;
  using Place = ChunkPlace<kChunksPerRow, THREADS>;
  int64_t first_row;      // of this thread's chunk 0
  uint32_t inside;         // bit i: chunk i's row is inside the matrix
  const float* item_base;  // a matrix of one block: chunk 0's address at k = 0

  __device__ __forceinline__ void begin_item(const ColumnSegments<const float*>& matrix, int64_t mn0) {
    first_row = mn0 + Place::row();
    inside = 0;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) inside |= uint32_t{first_row + i * Place::kRowsApart < matrix.rows} << i;
    item_base = matrix.ptr[0] + first_row * matrix.start[1] + Place::col();
  }

  __device__ __forceinline__ void copy(const ColumnSegments<const float*>& matrix, int64_t k0, float* smem) const {
    float* const to = smem + Place::row() * kKMajorLd + Place::col();
    const int64_t col = k0 + Place::col();
    // The k-tile inside one block: chunk 0's address and the block's row stride.
    const float* from;
    int64_t width;
    if (matrix.count == 1 && k0 + kTileK <= matrix.start[1]) {  // most k-tiles: no lookup at all
      from = item_base + k0;
      width = matrix.start[1];
    } else {
      const auto segment = matrix.segment_of(k0);
      if (k0 + kTileK > segment.begin + segment.width) {  // straddles blocks or the last column
        const bool col_in = col < matrix.cols();
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          const bool in = ((inside >> i) & 1) && col_in;
          cp_async_16(to + i * Place::kRowsApart * kKMajorLd,
                      in ? matrix.at(first_row + i * Place::kRowsApart, col) : matrix.ptr[0], in);
        }
        return;
      }
      from = segment.ptr + first_row * segment.width + (col - segment.begin);
      width = segment.width;
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const bool in = (inside >> i) & 1;
      cp_async_16(to + i * Place::kRowsApart * kKMajorLd, in ? from : matrix.ptr[0], in);
      from += Place::kRowsApart * width;
    }
  }
};

// MN-major tiles ([32][128], the operand stored [K, M or N]): the thread's
// column fixed per item (its block, and its address in row 0, found once),
// rows (k) move.
struct MnMajorCopier {
  static constexpr int kChunksPerRow = kTileM / kChunk;
  static constexpr int kChunks = kTileK * kChunksPerRow / kThreads;
  using Place = ChunkPlace<kChunksPerRow>;
  // The thread's column in row 0, and whether it is inside the matrix (else
  // column is the matrix's first element, never read: no pointer arithmetic
  // on null, from which the compiler could conclude the column is inside).
  const float* column;
  bool column_inside;
  int64_t width;  // the row stride of its block

  __device__ __forceinline__ void begin_item(const ColumnSegments<const float*>& matrix, int64_t mn0) {
    const int64_t col = mn0 + Place::col();
    const auto segment = matrix.segment_of(col);
    column_inside = col < matrix.cols();
    column = column_inside ? segment.ptr + (col - segment.begin) : matrix.ptr[0];
    width = segment.width;
  }

  __device__ __forceinline__ void copy(const ColumnSegments<const float*>& matrix, int64_t k0, float* smem) const {
    const int64_t row = k0 + Place::row();
    const float* from = column + row * width;
    float* const to = smem + Place::row() * kMnMajorLd + Place::col();
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const bool in = column_inside && row + i * Place::kRowsApart < matrix.rows;
      cp_async_16(to + i * Place::kRowsApart * kMnMajorLd, in ? from : matrix.ptr[0], in);
      from += Place::kRowsApart * width;
    }
  }
};

template <bool K_MAJOR>
using TileCopier = std::conditional_t<K_MAJOR, KMajorCopier<>, MnMajorCopier>;

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

// Row sums (bias gradients) over K = 1M rows at fp32 accuracy: a k-tile's
// values summed pairwise (a thread's 8 of each row in the warpgroup
// multiply, whose quads then add their four sums; all 32 in
// tile_column_sum), the tiles' sums added with Kahan's compensation. (A
// running fp32 sum's error grows with the count of terms; over a few hundred
// it already passes 4x torch's tree-shaped sum.)
struct CompensatedSum {
  float sum = 0.f, compensation = 0.f;

  __device__ __forceinline__ void add(float x) {
    const float y = x - compensation;
    const float t = sum + y;
    compensation = (t - sum) - y;
    sum = t;
  }
  __device__ __forceinline__ float value() const { return sum; }
};

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
  static constexpr int kBRoomFloats = kOperandFloats;  // a stage's room for B: its tile as stored
  static constexpr int kStages = 4;
  static constexpr bool kStagedStore = false;
  static constexpr int kExtraSharedFloats = 0;
  static constexpr int kTilesAhead = 0;  // reads only the k-tile it multiplies
  static constexpr bool kPresplitB = false;
  static constexpr bool kSumsFragmentRows = false;  // the kernel sums A's tile columns instead (tile_column_sum)
  int warp_m0, warp_n0;  // the warp's block of the 128 x 128 tile

  __device__ __forceinline__ WarpMma() {
    const int warp = threadIdx.x / kWarp;
    warp_m0 = (warp / kWarpsN) * kWarpTileM;
    warp_n0 = (warp % kWarpsN) * kWarpTileN;
  }

  template <bool A_K_MAJOR, bool B_K_MAJOR, typename CopyNext>
  __device__ __forceinline__ void multiply(const float* a_tile, const float* b_tile, const float*, bool, float*,
                                           bool, CompensatedSum (&)[2], float (&acc)[kFragsM][kFragsN][4],
                                           CopyNext&& copy_next) {
    copy_next();
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
// PRESPLIT_B: B (a layer's weights, small beside A) was split once before
// the product, into this layout (presplit_b_kernel), and its tiles are copied
// into the stages as they are: no split in the loop. Else B's tile is
// copied as stored and split by the block.
//
// Overlap: each thread splits A's k steps one at a time, each just before its
// wgmmas, so the tensor cores start on the first step at once; while a
// k-tile's wgmmas run, the threads issue the copies of a later k-tile and
// (without PRESPLIT_B) split the next k-tile's B into the other of two
// buffers (so that copy must have landed: kTilesAhead).
//
// Rounding: the tensor cores add into their accumulator rounding toward
// zero, so a k-tile's 12 wgmmas (4 k steps x 3 products) go into a fresh
// partial sum that is added to the accumulator with an ordinary fp32 add
// (mma.sync's path does this per 8-wide step; a k-tile of 32 is the
// coarsest grain that still waits on the tensor cores only once per tile).
template <bool PRESPLIT_B>
struct WarpgroupMma {
  static constexpr int kFragsM = 1, kFragsN = kTileN / 8;
  static constexpr bool kPresplitB = PRESPLIT_B;
  static constexpr int kBRoomFloats = PRESPLIT_B ? 2 * kSplitFloats : kOperandFloats;  // split (hi, lo), or as stored
  static constexpr int kStages = PRESPLIT_B ? 3 : 4;
  // With presplit B the output tile goes out through shared memory (see stage_tile), the
  // room that the split buffers take otherwise.
  static constexpr bool kStagedStore = PRESPLIT_B;
  static constexpr int kExtraSharedFloats = PRESPLIT_B ? kTileM * kStoreLd : 4 * kSplitFloats;
  static constexpr int kTilesAhead = PRESPLIT_B ? 0 : 1;                            // splits the next k-tile's B
  // Row sums (A MN-major) from the A fragments each thread already reads for its split, instead of
  // a second read of A's tile from shared memory (H100, rmat20's weight gradients [512, 1M] @ [1M, 128]:
  // 1.615 ms with that read, 1.522 without the row sums).
  static constexpr bool kSumsFragmentRows = true;
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
    for (int i = 0; i < kSplitChunks / kThreads; ++i) {
      const int chunk = threadIdx.x + i * kThreads;
      const int n = split_chunk_n(chunk), k = split_chunk_k(chunk);
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
    fence_async_proxy();
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

  // acc += this k-tile's product; copy_next() issues a later k-tile's copies. b_tile: this
  // k-tile's B as copied (split already with PRESPLIT_B); b_next: the next k-tile's (null after
  // the block's last k-tile); first: the block's first k-tile, whose B nobody has split yet.
  // With sum_rows, this k-tile's values of the thread's A fragments are added to row_sums, its
  // rows m and m + 8 of A (k = t and t + 4 of each 8-wide step: the quad's four threads hold all
  // 32; store_row_sums adds theirs).
  template <bool A_K_MAJOR, bool B_K_MAJOR, typename CopyNext>
  __device__ __forceinline__ void multiply(const float* a_tile, const float* b_tile, const float* b_next, bool first,
                                           float* extra, bool sum_rows, CompensatedSum (&row_sums)[2],
                                           float (&acc)[kFragsM][kFragsN][4], CopyNext&& copy_next) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const float* hi = b_tile;
    if constexpr (!PRESPLIT_B) {
      if (first) {
        split_b_into<B_K_MAJOR>(buffer, b_tile, extra);
        __syncthreads();
      }
      hi = extra + buffer * 2 * kSplitFloats;
    }
    const float* const lo = hi + kSplitFloats;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int m = warp_m0 + g;
    constexpr int kSteps = kTileK / 8;
    uint32_t a_hi[kSteps][4], a_lo[kSteps][4];
    float partial[kFragsN * 4];
    float row_m[kSteps], row_m8[kSteps];  // the fragments' values per row and step, for row_sums
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      // A fragment (m64k8, per warp as mma.sync's m16k8): (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
      const int k = step * 8 + t;
      const float a[4] = {tile_at<A_K_MAJOR>(a_tile, m, k), tile_at<A_K_MAJOR>(a_tile, m + 8, k),
                          tile_at<A_K_MAJOR>(a_tile, m, k + 4), tile_at<A_K_MAJOR>(a_tile, m + 8, k + 4)};
#pragma unroll
      for (int r = 0; r < 4; ++r) split_tf32(a[r], a_hi[step][r], a_lo[step][r]);
      row_m[step] = a[0] + a[2];
      row_m8[step] = a[1] + a[3];
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      const uint64_t b_hi = descriptor(hi + step * kStepFloats);
      const uint64_t b_lo = descriptor(lo + step * kStepFloats);
      wgmma(partial, a_lo[step], b_hi, step > 0);  // the small terms first, so they are not lost
      wgmma(partial, a_hi[step], b_lo, 1);
      wgmma(partial, a_hi[step], b_hi, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    if (sum_rows) {  // uniform: the block's item asks for row sums or not
      static_assert(kSteps == 4, "pairwise over four steps");
      row_sums[0].add((row_m[0] + row_m[1]) + (row_m[2] + row_m[3]));
      row_sums[1].add((row_m8[0] + row_m8[1]) + (row_m8[2] + row_m8[3]));
    }
    copy_next();
    if constexpr (!PRESPLIT_B) {
      buffer ^= 1;
      // the other buffer's last reader, the previous k-tile's wgmmas, has finished
      if (b_next != nullptr) split_b_into<B_K_MAJOR>(buffer, b_next, extra);
    }
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

  // The item's row sums (see multiply): each quad's four shares added in a fixed order, rows
  // m0 + m and m0 + m + 8 written by the quad's first thread. All threads of the block call it.
  __device__ __forceinline__ void store_row_sums(const CompensatedSum (&row_sums)[2], float* out, int64_t m0,
                                                 int64_t rows) const {
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sums[half].value();
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int64_t row = m0 + warp_m0 + g + 8 * half;
      if (t == 0 && row < rows) out[row] = sum;
    }
  }
};

}  // namespace
}  // namespace gnnio
