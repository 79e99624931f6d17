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
#include "split_tf32.cuh"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace gnnio {
namespace {

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
