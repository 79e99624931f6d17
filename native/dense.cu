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
//
// Ops (at the bottom): matmul_split_tf32, any product of segmented
// operands; project_split_tf32, a layer's projections of one x, reading its
// weights and biases where they lie (no concatenation before the product).
// Kernels (run_product picks them):
// - gemm_split_tf32_kernel: any product; persistent blocks of 128 x 128
//   tiles with a cp.async pipeline, the multiply a policy: WarpMma
//   (mma.sync, sm_80+) or WarpgroupMma (wgmma, sm_90a), the latter with B
//   split in the loop or split before it (presplit).
// - gemm_resident_b_kernel: the forward of a layer's projections on sm_90a
//   (K <= 128, small B): each block keeps its slice of split B in shared
//   memory, each warpgroup runs its own pipeline.
// - presplit_b_kernel: a small B (the weights) into its TF32 halves, once;
//   presplit_weights_kernel: the same from a layer's separate weights, with
//   their biases stacked beside.
// - reduce_splits_kernel: the in-order sum of a split K's partial tiles.
#include "common.cuh"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <vector>

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

struct GemmArgs {
  ColumnSegments<const float*> a;  // A as stored: [M, K] when A_K_MAJOR, else [K, M]
  ColumnSegments<const float*> b;  // B as stored: [N, K] when B_K_MAJOR, else [K, N]
  ColumnSegments<float*> out;      // C [M, N] (with one split)
  const float* b_split;            // B split by presplit_b_kernel (WarpgroupMma<true>), else null
  const float* bias;               // [N] or null (with one split)
  float* partial;                  // [splits, M, N] when split along K, else null
  float* row_sums;                 // sum over k of A[m, k]: [M] with one split, [splits, M] when split; or null
  int64_t m, n, k;
  int64_t k_tiles_per_split;
};

// A k-tile of presplit B (hi, then lo: 2 kSplitFloats, contiguous in
// args.b_split) -> the stage's room for B, as it is.
struct PresplitCopier {
  static constexpr int kChunks = 2 * kSplitChunks / kThreads;
  const float* item_tiles;  // this thread's first chunk in the item's n-tile's first k-tile

  __device__ __forceinline__ void begin_item(const GemmArgs& args, int64_t n0) {
    const int64_t k_tiles = (args.k + kTileK - 1) / kTileK;
    item_tiles = args.b_split + (n0 / kTileN) * k_tiles * 2 * kSplitFloats + threadIdx.x * kChunk;
  }

  __device__ __forceinline__ void copy(int64_t k0, float* smem) const {
    const float* const from = item_tiles + (k0 / kTileK) * 2 * kSplitFloats;
#pragma unroll
    for (int i = 0; i < kChunks; ++i)
      cp_async_16(smem + threadIdx.x * kChunk + i * kThreads * kChunk, from + i * kThreads * kChunk, true);
  }
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
  int64_t tile;
  // 64-bit divisions are a called routine of about a hundred instructions,
  // 32-bit ones a few inline: the item counts of any product seen so far fit.
  if (item <= UINT32_MAX && tiles <= UINT32_MAX) {
    const uint32_t item32 = item, tiles32 = tiles, tiles_n32 = tiles_n;
    work.split = item32 / tiles32;
    tile = item32 % tiles32;
    work.m0 = int64_t{static_cast<uint32_t>(tile) / tiles_n32} * kTileM;
    work.n0 = int64_t{static_cast<uint32_t>(tile) % tiles_n32} * kTileN;
  } else {
    work.split = item / tiles;
    tile = item % tiles;
    work.m0 = (tile / tiles_n) * kTileM;
    work.n0 = (tile % tiles_n) * kTileN;
  }
  work.k_tile_begin = work.split * args.k_tiles_per_split;
  const int64_t left = (args.k + kTileK - 1) / kTileK - work.k_tile_begin;
  work.k_tiles = left < args.k_tiles_per_split ? left : args.k_tiles_per_split;
  return work;
}

// Where `cols` columns of C from first_col go: their first column's address
// in row 0 (in C's block, or in the split's partial tile) and its row stride;
// `whole` when they all lie inside C and inside that one block.
struct TileColumns {
  float* base;
  int64_t row_stride;
  bool one_block, whole;
};

__device__ __forceinline__ TileColumns tile_columns(const GemmArgs& args, const WorkItem& work, int64_t first_col,
                                                    int cols) {
  TileColumns where;
  if (args.partial != nullptr) {
    where.base = args.partial + work.split * args.m * args.n + first_col;
    where.row_stride = args.n;
    where.one_block = true;
  } else {
    const auto segment = args.out.segment_of(first_col);
    where.base = segment.ptr + (first_col - segment.begin);
    where.row_stride = segment.width;
    where.one_block = first_col + cols <= segment.begin + segment.width;
  }
  where.whole = where.one_block && first_col + cols <= args.n;
  return where;
}

// The bias of each of a thread's FRAGS_N column pairs (first_col + 8 j + 2t),
// zeros without a bias or past C's last column.
template <int FRAGS_N>
__device__ __forceinline__ void load_bias(const GemmArgs& args, int64_t first_col, int t, bool whole,
                                          float2 (&bias)[FRAGS_N]) {
#pragma unroll
  for (int j = 0; j < FRAGS_N; ++j) {
    const int64_t col = first_col + j * 8 + 2 * t;
    bias[j] = args.bias != nullptr && (whole || col < args.n) ? make_float2(args.bias[col], args.bias[col + 1])
                                                              : make_float2(0.f, 0.f);
  }
}

// The warp's accumulators to C (+ bias), or to its split's partial tile.
// Where the warp's columns lie in one block of C (always, when the blocks
// are 128-multiples wide), each row's address is found once and the column
// pairs are constant offsets from it; else each column pair finds its block.
template <int FRAGS_M, int FRAGS_N>
__device__ __forceinline__ void store_tile(const GemmArgs& args, const WorkItem& work, int warp_m0, int warp_n0,
                                           const float (&acc)[FRAGS_M][FRAGS_N][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t first_col = work.n0 + warp_n0;  // of the warp's columns; the thread's pairs start 2t in
  const TileColumns where = tile_columns(args, work, first_col, FRAGS_N * 8);
  // The usual case (whole): the stores need no checks but the row's.
  float2 bias[FRAGS_N];
  load_bias(args, first_col, t, where.whole, bias);
#pragma unroll
  for (int i = 0; i < FRAGS_M; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // C fragment rows: g, then g + 8.
      const int64_t row = work.m0 + warp_m0 + i * 16 + g + half * 8;
      if (row >= args.m) continue;
      float* const row_base = where.base + 2 * t + row * where.row_stride;
      if (where.whole) {
#pragma unroll
        for (int j = 0; j < FRAGS_N; ++j)
          *reinterpret_cast<float2*>(row_base + j * 8) =
              make_float2(acc[i][j][2 * half] + bias[j].x, acc[i][j][2 * half + 1] + bias[j].y);
      } else {
#pragma unroll
        for (int j = 0; j < FRAGS_N; ++j) {
          const int64_t col = first_col + j * 8 + 2 * t;
          if (col >= args.n) continue;  // n is even: both columns or neither
          float* const at = where.one_block ? row_base + j * 8 : args.out.at(row, col);
          *reinterpret_cast<float2*>(at) =
              make_float2(acc[i][j][2 * half] + bias[j].x, acc[i][j][2 * half + 1] + bias[j].y);
        }
      }
    }
}

// Waits for this thread's bulk stores: until they have read shared memory
// (READ_ONLY), or until they are done.
template <bool READ_ONLY>
__device__ __forceinline__ void bulk_stores_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (READ_ONLY) {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
#endif
}

// The block's 128 x 128 tile (+ bias) to C through shared memory: the
// threads write it to `staging`, then thread r hands row r (512 contiguous
// bytes of C) to the bulk copy engine, which stores it while the block goes
// on to its next tile's multiply. Why: with direct stores from registers
// the tensor cores wait while a tile's 64 KiB go out. Measured (H100,
// tests/perf/projections.py on x [1M, 128]): the forward of four projections went
// 2.09 -> 2.00 ms with it (that product now runs gemm_resident_b_kernel);
// the input gradient (16 k-tiles per tile, and one stage fewer for this
// room) stayed within run-to-run spread, 1.44-1.55 ms. Returns false,
// storing nothing, where the tile is not whole rows of one block of C (then
// store_tile stores it).
template <int FRAGS_N>
__device__ __forceinline__ bool stage_tile(const GemmArgs& args, const WorkItem& work, int warp_m0,
                                           const float (&acc)[1][FRAGS_N][4], float* staging) {
  static_assert(FRAGS_N * 8 == kTileN, "the warpgroup multiply's warps span the tile's columns");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const TileColumns where = tile_columns(args, work, work.n0, kTileN);
  if (!where.whole) return false;
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  float2 bias[FRAGS_N];
  load_bias(args, work.n0, t, true, bias);
  // The last tile's bulk stores have read the staging room.
  if (threadIdx.x < kTileM) bulk_stores_wait<true>();
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* const row = staging + (warp_m0 + g + half * 8) * kStoreLd + 2 * t;  // C fragment rows g, g + 8
#pragma unroll
    for (int j = 0; j < FRAGS_N; ++j)
      *reinterpret_cast<float2*>(row + j * 8) =
          make_float2(acc[0][j][2 * half] + bias[j].x, acc[0][j][2 * half + 1] + bias[j].y);
  }
  // The bulk copies read the staging room through the async proxy.
  fence_async_proxy();
  __syncthreads();
  const int64_t row = work.m0 + threadIdx.x;
  if (threadIdx.x < kTileM && row < args.m) {
    const uint32_t from = static_cast<uint32_t>(__cvta_generic_to_shared(staging + threadIdx.x * kStoreLd));
    asm volatile(
        "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
        "cp.async.bulk.commit_group;\n" ::"l"(where.base + row * where.row_stride),
        "r"(from), "n"(kTileN * sizeof(float))
        : "memory");
  }
  return true;
#else
  return false;
#endif
}

// Column m of an MN-major tile summed over its 32 k, pairwise.
__device__ __forceinline__ float tile_column_sum(const float* tile, int m) {
  static_assert(kTileK == 32, "four sums of eight");
  float eighths[kTileK / 8];
#pragma unroll
  for (int q = 0; q < kTileK / 8; ++q) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = tile[(q * 8 + i) * kMnMajorLd + m];
    eighths[q] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  }
  return (eighths[0] + eighths[1]) + (eighths[2] + eighths[3]);
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
  constexpr int kStageFloats = kOperandFloats + Mma::kBRoomFloats;  // A's tile, then B's
  Mma mma;
  constexpr int kStages = Mma::kStages;
  float* const mma_shared = shared + kStages * kStageFloats;  // the multiply's own room (Mma::kExtraSharedFloats)

  // The copy cursor runs kStages - 1 k-tiles ahead of the multiply.
  int64_t load_item = blockIdx.x, load_k_tile = 0;
  WorkItem load_work = work_item(args, load_item);
  if (load_work.k_tiles <= 0) load_item = items;  // K = 0: nothing to copy
  int load_stage = 0;
  TileCopier<A_K_MAJOR> a_copier;
  std::conditional_t<Mma::kPresplitB, PresplitCopier, TileCopier<B_K_MAJOR>> b_copier;
  auto copy_next = [&] {
    if (load_item < items) {
      if (load_k_tile == 0) {
        a_copier.begin_item(args.a, load_work.m0);
        if constexpr (Mma::kPresplitB) {
          b_copier.begin_item(args, load_work.n0);
        } else {
          b_copier.begin_item(args.b, load_work.n0);
        }
      }
      float* a_tile = shared + load_stage * kStageFloats;
      const int64_t k0 = (load_work.k_tile_begin + load_k_tile) * kTileK;
      a_copier.copy(args.a, k0, a_tile);
      if constexpr (Mma::kPresplitB) {
        b_copier.copy(k0, a_tile + kOperandFloats);
      } else {
        b_copier.copy(args.b, k0, a_tile + kOperandFloats);
      }
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
    // Row sums (bias gradients) need A's tile MN-major (A's rows are the stored columns): the
    // warpgroup multiply sums its fragments (kSumsFragmentRows), else thread m sums column m of each tile.
    const bool sums_rows = !A_K_MAJOR && args.row_sums != nullptr && work.n0 == 0;
    float acc[Mma::kFragsM][Mma::kFragsN][4] = {};
    CompensatedSum row_sums[2];
    for (int64_t k_tile = 0; k_tile < work.k_tiles; ++k_tile) {
      cp_async_wait<kStages - 2 - Mma::kTilesAhead>();
      // The tensor cores read presplit B's copies through the async proxy.
      if constexpr (Mma::kPresplitB) fence_async_proxy();
      // Everyone's copies of this k-tile (and of the next kTilesAhead) have
      // landed, and everyone is done with the stage the next copy overwrites
      // (multiplied in the last step; the multiply issues that copy).
      __syncthreads();
      const float* a_tile = shared + compute_stage * kStageFloats;
      const bool has_next = k_tile + 1 < work.k_tiles || item + gridDim.x < items;
      const float* b_next = has_next ? shared + (compute_stage + 1) % kStages * kStageFloats + kOperandFloats : nullptr;
      mma.template multiply<A_K_MAJOR, B_K_MAJOR>(a_tile, a_tile + kOperandFloats, b_next, first_tile, mma_shared,
                                                  Mma::kSumsFragmentRows && sums_rows, row_sums, acc, copy_next);
      first_tile = false;
      if (!Mma::kSumsFragmentRows && sums_rows && threadIdx.x < kTileM)
        row_sums[0].add(tile_column_sum(a_tile, threadIdx.x));
      compute_stage = (compute_stage + 1) % kStages;
    }
    if (sums_rows) {
      float* const sums_out = args.row_sums + (args.partial != nullptr ? work.split * args.m : 0);
      if constexpr (Mma::kSumsFragmentRows) {
        mma.store_row_sums(row_sums, sums_out, work.m0, args.m);
      } else if (threadIdx.x < kTileM && work.m0 + threadIdx.x < args.m) {
        sums_out[work.m0 + threadIdx.x] = row_sums[0].value();
      }
    }
    bool stored = false;
    if constexpr (Mma::kStagedStore) stored = stage_tile(args, work, mma.warp_m0, acc, mma_shared);
    if (!stored) store_tile(args, work, mma.warp_m0, mma.warp_n0, acc);
  }
  cp_async_wait<0>();
  if constexpr (Mma::kStagedStore) bulk_stores_wait<false>();
}

// The forward of a layer's projections (A = x, K-major, K <= 128; B its
// weights, presplit): each block keeps one n-tile's whole split B in shared
// memory (up to 128 KiB, copied once), and each of its two warpgroups runs
// its own pipeline over its own 64-row tiles of C, synchronising only within
// the warpgroup. Why: with K = 128 a 128 x 128 tile is four k-tiles, and in
// gemm_split_tf32_kernel the block-wide barrier of every k-tile and the
// tile's stores keep the tensor cores waiting for the slowest warp; here one
// warpgroup's waits and stores overlap the other's multiply, and B is read
// from L2 once per block instead of once per k-tile (H100, four projections
// of x [1M, 128]: 2.00 -> 1.86 ms, then 1.62 with the stores' fast path;
// still about half the tensor cores' peak: ncu finds the warps waiting on
// instruction latencies and the instruction cache).
constexpr int kResidentKTiles = 4;  // K up to 128
constexpr int kGroupRows = 64;      // rows of C per warpgroup item
constexpr int kGroupThreads = 128;
constexpr int kGroupStages = 4;
constexpr int kGroupStageFloats = kGroupRows * kKMajorLd;
constexpr int kResidentSharedBytes =
    sizeof(float) * (kResidentKTiles * 2 * kSplitFloats + 2 * kGroupStages * kGroupStageFloats);

__device__ __forceinline__ void warpgroup_barrier(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "n"(kGroupThreads) : "memory");  // id 0 is __syncthreads
}

__global__ void __launch_bounds__(kThreads, 1) gemm_resident_b_kernel(const GemmArgs args, int n_tiles) {
  extern __shared__ __align__(16) float shared[];
  const int64_t k_tiles = (args.k + kTileK - 1) / kTileK;
  const int group = threadIdx.x / kGroupThreads;
  float* const b_resident = shared;
  float* const a_stages = shared + kResidentKTiles * 2 * kSplitFloats + group * kGroupStages * kGroupStageFloats;

  // This block's n-tile of split B, all its k-tiles (contiguous in b_split), copied once.
  const int n_tile = blockIdx.x % n_tiles;
  const float* const b_tiles = args.b_split + n_tile * k_tiles * 2 * kSplitFloats;
  for (int64_t i = threadIdx.x; i < k_tiles * 2 * kSplitChunks; i += kThreads)
    cp_async_16(b_resident + i * kChunk, b_tiles + i * kChunk, true);
  cp_async_commit();
  cp_async_wait<0>();
  fence_async_proxy();  // wgmma reads it through the async proxy
  __syncthreads();

  WarpgroupMma<true> mma;
  mma.warp_m0 = (threadIdx.x / kWarp % 4) * 16;  // within the warpgroup's 64 rows
  const int64_t m_tiles = (args.m + kGroupRows - 1) / kGroupRows;
  const int64_t first_item = blockIdx.x / n_tiles * 2 + group;
  const int64_t item_stride = gridDim.x / n_tiles * 2;
  WorkItem work{0, n_tile * int64_t{kTileN}, 0, 0, k_tiles};

  // The warpgroup's copy cursor runs kGroupStages - 1 k-tiles ahead of its multiply.
  KMajorCopier<kGroupRows, kGroupThreads> a_copier;
  int64_t load_item = first_item, load_k_tile = 0;
  int load_stage = 0;
  auto copy_next = [&] {
    if (load_item < m_tiles) {
      if (load_k_tile == 0) a_copier.begin_item(args.a, load_item * kGroupRows);
      a_copier.copy(args.a, load_k_tile * kTileK, a_stages + load_stage * kGroupStageFloats);
      if (++load_k_tile == k_tiles) {
        load_k_tile = 0;
        load_item += item_stride;
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    load_stage = (load_stage + 1) % kGroupStages;
  };
#pragma unroll
  for (int stage = 0; stage < kGroupStages - 1; ++stage) copy_next();

  int compute_stage = 0;
  for (int64_t item = first_item; item < m_tiles; item += item_stride) {
    work.m0 = item * kGroupRows;
    float acc[1][WarpgroupMma<true>::kFragsN][4] = {};
    CompensatedSum no_sums[2];
    for (int64_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      cp_async_wait<kGroupStages - 2>();
      // The warpgroup's copies of this k-tile have landed, and it is done with the stage the
      // next copy overwrites (multiplied in the last step; the multiply issues that copy).
      warpgroup_barrier(group);
      mma.template multiply<true, true>(a_stages + compute_stage * kGroupStageFloats,
                                        b_resident + k_tile * 2 * kSplitFloats, nullptr, false, nullptr, false,
                                        no_sums, acc, copy_next);
      compute_stage = (compute_stage + 1) % kGroupStages;
    }
    store_tile(args, work, mma.warp_m0, 0, acc);
  }
  cp_async_wait<0>();
}

// B (either orientation) -> b_split: for each n-tile, each k-tile's hi and
// lo halves in the wgmma multiply's layout (zeros outside B), so the product
// copies B's tiles into its stages as they are. Matrix: ColumnSegments, or
// StackedRows (K-major).
template <bool B_K_MAJOR, typename Matrix>
__device__ __forceinline__ void presplit_b(const Matrix& b, int64_t n, int64_t k, float* __restrict__ b_split) {
  const int64_t k_tiles = (k + kTileK - 1) / kTileK;
  const int64_t chunks = (n + kTileN - 1) / kTileN * k_tiles * kSplitChunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tile = i / kSplitChunks;  // n-tile major, then k-tile
    const int chunk = static_cast<int>(i % kSplitChunks);
    const int64_t col = tile / k_tiles * kTileN + split_chunk_n(chunk);
    const int64_t row = tile % k_tiles * kTileK + split_chunk_k(chunk);
    uint32_t high[4], low[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool inside = col < n && row + j < k;
      const float value = !inside ? 0.f : B_K_MAJOR ? *b.at(col, row + j) : *b.at(row + j, col);
      split_tf32(value, high[j], low[j]);
    }
    float* const halves = b_split + tile * 2 * kSplitFloats;
    reinterpret_cast<uint4*>(halves)[chunk] = make_uint4(high[0], high[1], high[2], high[3]);
    reinterpret_cast<uint4*>(halves + kSplitFloats)[chunk] = make_uint4(low[0], low[1], low[2], low[3]);
  }
}

template <bool B_K_MAJOR>
__global__ void presplit_b_kernel(const ColumnSegments<const float*> b, int64_t n, int64_t k,
                                  float* __restrict__ b_split) {
  presplit_b<B_K_MAJOR>(b, n, k, b_split);
}

// A layer's stacked weights -> b_split, and their biases -> stacked_bias [N]
// (zeros for a projection without one; null when none has one).
__global__ void presplit_weights_kernel(const StackedRows weights, int64_t n, int64_t k, float* __restrict__ b_split,
                                        float* __restrict__ stacked_bias) {
  presplit_b<true>(weights, n, k, b_split);
  if (stacked_bias == nullptr) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    stacked_bias[i] = weights.bias_at(i);
}

// C = sum over splits of the partial tiles (+ bias), in split order and
// compensated; likewise the row sums.
__global__ void reduce_splits_kernel(const float* __restrict__ partial, int64_t splits, int64_t m, int64_t n,
                                     const float* __restrict__ bias, ColumnSegments<float*> out,
                                     const float* __restrict__ partial_row_sums, float* __restrict__ row_sums) {
  const int64_t cells = m * n;
  const int64_t total = cells + (row_sums != nullptr ? m : 0);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < cells) {
      CompensatedSum sum;
      for (int64_t s = 0; s < splits; ++s) sum.add(partial[s * cells + i]);
      *out.at(i / n, i % n) = sum.value() + (bias != nullptr ? bias[i % n] : 0.f);
    } else {
      const int64_t row = i - cells;
      CompensatedSum sum;
      for (int64_t s = 0; s < splits; ++s) sum.add(partial_row_sums[s * m + row]);
      row_sums[row] = sum.value();
    }
  }
}

constexpr const char* kOp = "gnnio::matmul_split_tf32";
constexpr const char* kProjectOp = "gnnio::project_split_tf32";

// Checks `blocks` (fp32, CUDA, 2-D, contiguous, equal row counts, widths
// multiples of 4, 16-byte aligned) and views them as one matrix: the
// operands (P = const float*) and the outputs (float*).
template <typename P>
ColumnSegments<P> column_segments(at::TensorList blocks, const char* name, const at::Device& device,
                                  const char* op = kOp) {
  GNNIO_CHECK(!blocks.empty() && blocks.size() <= kMaxSegments, op, name, " takes 1 to ", kMaxSegments,
              " tensors, got ", blocks.size());
  ColumnSegments<P> matrix{};
  matrix.count = static_cast<int>(blocks.size());
  matrix.rows = blocks[0].dim() == 2 ? blocks[0].size(0) : -1;
  for (size_t s = 0; s < blocks.size(); ++s) {
    const at::Tensor& block = blocks[s];
    GNNIO_CHECK(block.device() == device, op, name, "[", s, "] must be on ", device, ", got ", block.device());
    GNNIO_CHECK(block.scalar_type() == at::kFloat, op, name, "[", s, "] must be float32, got ",
                block.scalar_type());
    GNNIO_CHECK(block.dim() == 2 && block.size(0) == matrix.rows, op, name, "[", s, "] must be [", matrix.rows,
                ", width], got shape ", block.sizes());
    GNNIO_CHECK(block.is_contiguous(), op, name, "[", s, "] must be contiguous");
    GNNIO_CHECK(block.size(1) % kChunk == 0 && reinterpret_cast<uintptr_t>(block.data_ptr()) % 16 == 0, op, name,
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
// sm_90a, e.g. TORCH_CUDA_ARCH_LIST=9.0).
bool wgmma_built(int device) {
  static std::mutex mutex;
  static std::vector<int> built;  // per device: -1 unknown, 0, 1
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
  constexpr int shared_bytes =
      sizeof(float) * (Mma::kStages * (kOperandFloats + Mma::kBRoomFloats) + Mma::kExtraSharedFloats);
  blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, shared_bytes);  // lets it have shared_bytes
  kernel<<<blocks, kThreads, shared_bytes, stream>>>(args, items);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool A_K_MAJOR, bool B_K_MAJOR>
void launch_gemm(const GemmArgs& args, int64_t items, unsigned blocks, bool wgmma, cudaStream_t stream) {
  if (args.b_split != nullptr) {
    // B's orientation no longer matters; presplit B is only used with A K-major (see below)
    if constexpr (A_K_MAJOR) launch_gemm<true, true, WarpgroupMma<true>>(args, items, blocks, stream);
  } else if (wgmma) {
    launch_gemm<A_K_MAJOR, B_K_MAJOR, WarpgroupMma<false>>(args, items, blocks, stream);
  } else {
    launch_gemm<A_K_MAJOR, B_K_MAJOR, WarpMma>(args, items, blocks, stream);
  }
}

// Whether B (small beside A: a layer's weights, in the forward and the
// input gradient, where A is K-major) is split once before the product, so
// the product's blocks copy it split.
bool presplit_fits(const GemmArgs& args, bool a_transposed, bool wgmma) {
  return wgmma && !a_transposed && args.k > 0 && args.n * 16 <= args.m;
}

// The product behind both ops, with args' operands (args.b unused where
// `weights` is given: then B^T is a layer's stacked weights, split before the
// product, which presplit_fits must allow) and shape set. bias: C's [N], or
// null (with `weights`, their biases are used instead).
std::vector<at::Tensor> run_product(GemmArgs& args, const at::Tensor& a0, bool a_transposed, bool b_transposed,
                                    const float* bias, c10::IntArrayRef out_widths, bool row_sums,
                                    const StackedRows* weights) {
  const at::Device device = a0.device();
  const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
  const auto options = a0.options();
  std::vector<at::Tensor> outputs;
  for (int64_t width : out_widths) outputs.push_back(at::empty({args.m, width}, options));
  args.out = column_segments<float*>(outputs, "out", device);
  at::Tensor sums = row_sums ? at::empty({args.m}, options) : at::Tensor();
  const int64_t k_tiles = (args.k + kTileK - 1) / kTileK;
  const int64_t n_tiles = (args.n + kTileN - 1) / kTileN;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool wgmma = wgmma_built(device.index());
  const bool presplit = weights != nullptr || presplit_fits(args, a_transposed, wgmma);

  // B split first: the product waits for it (launched before the rest of the host's work).
  at::Tensor b_split;
  if (presplit) {
    const int64_t chunks = n_tiles * k_tiles * kSplitChunks;
    bool weights_biased = false;
    for (int s = 0; weights != nullptr && s < weights->count; ++s) weights_biased |= weights->bias[s] != nullptr;
    // the weights' stacked biases, if any, after the split halves
    b_split = at::empty({chunks * 2 * kChunk + (weights_biased ? args.n : 0)}, options);
    float* const split = b_split.data_ptr<float>();
    args.b_split = split;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((chunks + threads - 1) / threads, 8 * properties->multiProcessorCount);
    if (weights != nullptr) {
      float* const stacked_bias = weights_biased ? split + chunks * 2 * kChunk : nullptr;
      presplit_weights_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(*weights, args.n, args.k, split,
                                                                                      stacked_bias);
      bias = stacked_bias;
    } else if (b_transposed) {
      presplit_b_kernel<true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(args.b, args.n, args.k, split);
    } else {
      presplit_b_kernel<false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(args.b, args.n, args.k, split);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Split K when there are too few tiles of C to give every SM two
  // (weight gradients: [512, 128] from K = 1M rows), keeping at least four
  // k-tiles per split.
  const int64_t tiles = ((args.m + kTileM - 1) / kTileM) * n_tiles;
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
  args.bias = splits == 1 ? bias : nullptr;
  args.row_sums = !row_sums ? nullptr : (splits > 1 ? partial_sums.data_ptr<float>() : sums.data_ptr<float>());

  const int64_t items = tiles * splits;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(items, properties->multiProcessorCount));
  // Operand orientations: A stored [M, K] unless transposed; B stored [K, N] unless transposed.
  if (presplit && k_tiles <= kResidentKTiles && n_tiles <= properties->multiProcessorCount) {
    const unsigned resident_blocks = properties->multiProcessorCount / n_tiles * n_tiles;  // n-tile = block % n_tiles
    blocks_per_sm(reinterpret_cast<const void*>(gemm_resident_b_kernel), kThreads, kResidentSharedBytes);  // opts in
    gemm_resident_b_kernel<<<resident_blocks, kThreads, kResidentSharedBytes, stream>>>(args, static_cast<int>(n_tiles));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else if (!a_transposed && b_transposed)
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
        args.partial, splits, args.m, args.n, bias, args.out,
        partial_sums.defined() ? partial_sums.data_ptr<float>() : nullptr, row_sums ? sums.data_ptr<float>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (row_sums) outputs.push_back(sums);
  return outputs;
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
  if (args.m == 0 || args.n == 0) {  // nothing to multiply; A's row sums may still be asked for
    std::vector<at::Tensor> outputs;
    for (int64_t width : out_widths) outputs.push_back(at::empty({args.m, width}, a[0].options()));
    if (row_sums) outputs.push_back(at::cat(a, 1).sum(0));
    return outputs;
  }
  return run_product(args, a[0], a_transposed, b_transposed, bias.has_value() ? bias->data_ptr<float>() : nullptr,
                     out_widths, row_sums, nullptr);
}

// See the schema below.
std::vector<at::Tensor> project_split_tf32(const at::Tensor& x, at::TensorList weights,
                                           const c10::List<std::optional<at::Tensor>>& biases) {
  GNNIO_CHECK(x.is_cuda(), kProjectOp, "x must be a CUDA tensor");
  const at::Device device = x.device();
  const c10::cuda::CUDAGuard guard(device);
  const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
  GNNIO_CHECK(properties->major >= 8, kProjectOp, "TF32 tensor cores need compute capability 8.0 or newer, got ",
              properties->major, ".", properties->minor);
  GNNIO_CHECK(!weights.empty() && weights.size() <= kMaxSegments, kProjectOp, "weights takes 1 to ", kMaxSegments,
              " tensors, got ", weights.size());
  GNNIO_CHECK(biases.size() == weights.size(), kProjectOp, "biases must be one per weight (None for none): ",
              weights.size(), " weights, ", biases.size(), " biases");
  GemmArgs args{};
  args.a = column_segments<const float*>(x, "x", device, kProjectOp);
  args.m = args.a.rows;
  args.k = args.a.start[1];
  StackedRows stacked{};
  stacked.count = static_cast<int>(weights.size());
  stacked.cols = args.k;
  std::vector<int64_t> widths;
  bool any_bias = false;
  for (size_t s = 0; s < weights.size(); ++s) {
    const at::Tensor& weight = weights[s];
    GNNIO_CHECK(weight.device() == device && weight.scalar_type() == at::kFloat && weight.dim() == 2 &&
                    weight.size(1) == args.k && weight.size(0) % kChunk == 0 && weight.is_contiguous(),
                kProjectOp, "weights[", s, "] must be a contiguous float32 [width, ", args.k,
                "] on ", device, " with width a multiple of 4, got ", weight.scalar_type(), " of shape ",
                weight.sizes());
    stacked.ptr[s] = weight.data_ptr<float>();
    stacked.start[s + 1] = stacked.start[s] + weight.size(0);
    widths.push_back(weight.size(0));
    const std::optional<at::Tensor> bias = biases.get(s);
    if (bias.has_value()) {
      GNNIO_CHECK(bias->device() == device && bias->scalar_type() == at::kFloat && bias->dim() == 1 &&
                      bias->size(0) == weight.size(0) && bias->is_contiguous(),
                  kProjectOp, "biases[", s, "] must be a contiguous float32 [", weight.size(0), "] on ", device,
                  ", got ", bias->scalar_type(), " of shape ", bias->sizes());
      stacked.bias[s] = bias->data_ptr<float>();
      any_bias = true;
    }
  }
  for (int s = stacked.count; s < kMaxSegments; ++s) stacked.ptr[s] = stacked.ptr[0];
  args.n = stacked.start[stacked.count];
  if (args.m == 0 || args.n == 0 || !presplit_fits(args, false, wgmma_built(device.index()))) {
    // the general product, on the weights stacked and their biases (zeros where missing) concatenated
    std::optional<at::Tensor> bias;
    if (any_bias) {
      std::vector<at::Tensor> parts;
      for (size_t s = 0; s < weights.size(); ++s) {
        const std::optional<at::Tensor> part = biases.get(s);
        parts.push_back(part.has_value() ? *part : at::zeros({weights[s].size(0)}, x.options()));
      }
      bias = at::cat(parts);
    }
    return matmul_split_tf32(x, false, at::cat(weights), true, bias, widths, false);
  }
  return run_product(args, x, false, true, nullptr, widths, false, &stacked);
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
  // x @ W_i^T + b_i for each of a layer's projections of one x [M, K]:
  // weights W_i [w_i, K] (w_i multiples of 4), biases b_i [w_i] or None, one
  // per weight. The same product as matmul_split_tf32 on the weights stacked
  // (b_transposed) and their biases concatenated, without the copies: on
  // H100/H200 the weights are split where they lie. Returns [M, w_i] each.
  m.def("project_split_tf32(Tensor x, Tensor[] weights, Tensor?[] biases) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("matmul_split_tf32", &matmul_split_tf32);
  m.impl("project_split_tf32", &project_split_tf32);
}

}  // namespace gnnio
