// Shared pieces of gnnio's CUDA kernels: boundary checks, the feature-dtype
// switch, 128-bit vector loads, warp reductions and the degree-aware row
// schedule. Every native/*.cu includes this header; host-only helpers are
// inline so several translation units can use them.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

namespace gnnio {

// ------------------------------------------------------------------ checks
// Messages name the op, the argument and what was seen, e.g.
// "gnnio::segment_sum: x must be a CUDA tensor, got cpu".
//
// The message is assembled into one std::string here, numbers through
// std::to_string, and handed to TORCH_CHECK whole: formatting a number
// through TORCH_CHECK's own stream crashed the process on the GPU machine
// (segfault, not an error) where this code inlines that stream.
namespace detail {
inline void append(std::string& out, const char* text) { out += text; }
inline void append(std::string& out, const std::string& text) { out += text; }
inline void append(std::string& out, bool value) { out += value ? "true" : "false"; }
inline void append(std::string& out, c10::ScalarType dtype) { out += c10::toString(dtype); }
inline void append(std::string& out, const c10::Device& device) { out += device.str(); }
inline void append(std::string& out, c10::IntArrayRef values) {
  out += "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  out += "]";
}
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
inline void append(std::string& out, T value) {
  out += std::to_string(value);
}
}  // namespace detail

template <typename... Args>
std::string error_text(const Args&... args) {
  std::string out;
  (detail::append(out, args), ...);
  return out;
}

#define GNNIO_ENSURE(cond, ...) TORCH_CHECK(cond, ::gnnio::error_text(__VA_ARGS__))
#define GNNIO_CHECK(cond, op, ...) GNNIO_ENSURE(cond, op, ": ", __VA_ARGS__)

// Feature dtypes: fp32, fp16, bf16 (accumulation is always fp32). Three
// instantiations per kernel, no more: index widths are runtime flags.
#define GNNIO_DISPATCH_FEATURES(dtype, op, ...)                                            \
  [&] {                                                                                     \
    switch (dtype) {                                                                        \
      case at::kFloat: {                                                                    \
        using scalar_t = float;                                                             \
        return __VA_ARGS__();                                                               \
      }                                                                                     \
      case at::kHalf: {                                                                     \
        using scalar_t = at::Half;                                                          \
        return __VA_ARGS__();                                                               \
      }                                                                                     \
      case at::kBFloat16: {                                                                 \
        using scalar_t = at::BFloat16;                                                      \
        return __VA_ARGS__();                                                               \
      }                                                                                     \
      default:                                                                              \
        GNNIO_ENSURE(false, op, ": features must be float32, float16 or bfloat16, got ", dtype); \
    }                                                                                       \
  }()

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// --------------------------------------------------------------- indices
// Column indices are int32 or int64 (int32 while node ids fit); the width is a runtime flag
// read by a warp-uniform branch, which costs nothing in these memory-bound
// kernels and halves the number of instantiations.
struct IndexView {
  const void* data;
  bool is_int64;

  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i] : static_cast<int64_t>(static_cast<const int32_t*>(data)[i]);
  }
};

inline IndexView index_view(const at::Tensor& t) {
  return IndexView{t.data_ptr(), t.scalar_type() == at::kLong};
}

// Source ids as 32 bits: one shuffle each instead of two, and a 32 x 32 ->
// 64-bit multiply for the row offset; kNoSource marks "no slot" (the host
// checks that x has fewer rows). Kernels that may meet more rows keep int64
// ids (-1: none); both go through these overloads.
constexpr uint32_t kNoSource = 0xffffffffu;
__device__ __forceinline__ bool is_source(int64_t source) { return source >= 0; }
__device__ __forceinline__ bool is_source(uint32_t source) { return source != kNoSource; }
__device__ __forceinline__ int64_t row_offset(int64_t source, int64_t width) { return source * width; }
__device__ __forceinline__ uint64_t row_offset(uint32_t source, int64_t width) {
  return static_cast<uint64_t>(source) * static_cast<uint32_t>(width);
}

// Host side: 32-bit source ids need x to have fewer than kNoSource rows.
inline void check_32bit_sources(const char* op, const at::Tensor& x, const char* others) {
  GNNIO_CHECK(x.size(0) < int64_t{kNoSource}, op, "source ids are 32-bit: x may have at most ",
              int64_t{kNoSource} - 1, " rows", others, ", got ", x.size(0));
}

// ----------------------------------------------------------- vector loads
// VEC elements of T in one aligned load: 16 bytes (one 128-bit LDG) when
// VEC * sizeof(T) == 16.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_vec(const T* __restrict__ p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

// load_vec with the evict-first cache policy (ld.global.cs): for data a
// kernel reads once, so that it leaves L2 before the rows the kernel gathers
// again. A 2-byte element takes a plain load.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_vec_once(const T* __restrict__ p) {
  Vec<T, VEC> v;
  if constexpr (sizeof(v) == 16) {
    *reinterpret_cast<float4*>(&v) = __ldcs(reinterpret_cast<const float4*>(p));
  } else if constexpr (sizeof(v) == 8) {
    *reinterpret_cast<float2*>(&v) = __ldcs(reinterpret_cast<const float2*>(p));
  } else if constexpr (sizeof(v) == 4) {
    *reinterpret_cast<float*>(&v) = __ldcs(reinterpret_cast<const float*>(p));
  } else {
    v = load_vec<T, VEC>(p);
  }
  return v;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const Vec<T, VEC>& value) {
  *reinterpret_cast<Vec<T, VEC>*>(p) = value;
}

// store_vec with the evict-first cache policy (st.global.cs): for results a
// kernel writes once and does not read back, so that they leave L2 before the
// rows the kernel gathers. A 2-byte element takes a plain store.
template <typename T, int VEC>
__device__ __forceinline__ void store_vec_once(T* __restrict__ p, const Vec<T, VEC>& value) {
  if constexpr (sizeof(value) == 16) {
    __stcs(reinterpret_cast<float4*>(p), *reinterpret_cast<const float4*>(&value));
  } else if constexpr (sizeof(value) == 8) {
    __stcs(reinterpret_cast<float2*>(p), *reinterpret_cast<const float2*>(&value));
  } else if constexpr (sizeof(value) == 4) {
    __stcs(reinterpret_cast<float*>(p), *reinterpret_cast<const float*>(&value));
  } else {
    store_vec<T, VEC>(p, value);
  }
}

// Elements of scalar_t per 128-bit load: 4 for fp32, 8 for fp16/bf16.
template <typename scalar_t>
constexpr int vec_width() {
  return 16 / static_cast<int>(sizeof(scalar_t));
}

// Whether rows of `width` elements starting at `t`'s base can use VEC-wide
// loads: every row start must be 16-byte aligned.
inline bool rows_vectorisable(const at::Tensor& t, int64_t width, int vec) {
  return width % vec == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// ------------------------------------------------------- warp reductions
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

// Lanes that share one edge's feature chunk: the smallest power of two >= the
// number of chunks in a row, at most a warp. The other lanes take further
// edges, so narrow rows (bf16 x 128 = 16 chunks) read two edges per step.
__host__ __device__ inline int lanes_per_edge(int64_t chunks) {
  int lanes = 1;
  while (lanes < kWarp && lanes < chunks) lanes <<= 1;
  return lanes;
}

// ceil(log2(n)) for 1 <= n <= 2^31: the shift of the smallest power of two
// >= n. (__clz exists only in device compilation; the host pass of a .cu
// never runs this.)
__device__ __forceinline__ int ceil_log2(int n) {
#ifdef __CUDA_ARCH__
  return 32 - __clz(n - 1);
#else
  return 0;
#endif
}

// This lane's place in a warp whose lanes share edges' features in groups of
// lanes_per_edge(chunks): a power of two, so shifts and masks instead of the
// integer divisions by a runtime value that the kernels would otherwise pay
// per work item (about 25 instructions each).
struct EdgeLanes {
  int shift;  // log2 of the lanes per edge

  __device__ __forceinline__ explicit EdgeLanes(int64_t chunks)
      : shift(chunks >= kWarp ? 5 : ceil_log2(max(static_cast<int>(chunks), 1))) {}
  __device__ __forceinline__ int lanes() const { return 1 << shift; }        // lanes per edge
  __device__ __forceinline__ int groups() const { return kWarp >> shift; }  // edges a warp step takes
  __device__ __forceinline__ int group() const { return (threadIdx.x % kWarp) >> shift; }  // this lane's group
  __device__ __forceinline__ int group_lane() const { return threadIdx.x & ((1 << shift) - 1); }  // its place in it
};

// ------------------------------------------------------ subwarp layout
// The "subwarp" kernels (spmm.cu, reduce.cu) serve 16-bit rows of at most
// 128 features, 8 per lane in one 128-bit load: a row needs at most 16
// lanes, and each group of that many lanes takes a light row of its own.
constexpr int kSubwarpVec = 8;
constexpr int64_t kSubwarpMaxWidth = kWarp / 2 * kSubwarpVec;

struct LaneGroups {
  int lanes;         // lanes per row: a power of two, 1 to 16
  int rows_per_warp;  // groups in a warp
  int group;         // this lane's group
  int group_lane;    // this lane's place in it
  unsigned mask;     // the group's lanes, for its shuffles and syncs

  __device__ __forceinline__ explicit LaneGroups(int64_t width) {
    lanes = lanes_per_edge(width / kSubwarpVec);
    rows_per_warp = kWarp / lanes;
    const int lane = threadIdx.x % kWarp;
    group = lane / lanes;
    group_lane = lane % lanes;
    mask = ((1u << lanes) - 1u) << (group * lanes);
  }
};

// ------------------------------------------------------ row schedule
// The degree-aware schedule of one CSR (or CSC): rows with at most
// `tile_edges` slots are "light" and handled by one warp each; longer rows
// are "heavy" and cut into tiles of `tile_edges` slots, one warp per tile,
// whose fp32 partial results a second pass merges in tile order (so sums are
// deterministic). Built once per graph by build_row_schedule (gnnio_cli/ops/attention_native.py).
//
//   tile_row       int64 [T]      the heavy row each tile belongs to
//   tile_start     int64 [T]      the tile's first slot
//   heavy_rows     int64 [H]      heavy rows, longest first (ties by row)
//   heavy_tile_ptr int64 [H + 1]  tiles of heavy_rows[h] are heavy_tile_ptr[h] ..
struct RowSchedule {
  const int64_t* indptr;
  const int64_t* tile_row;
  const int64_t* tile_start;
  const int64_t* heavy_rows;
  const int64_t* heavy_tile_ptr;
  int64_t num_rows;
  int64_t num_tiles;
  int64_t num_heavy;
  int64_t tile_edges;
};

// One warp's share of the first pass: slots [begin, end) of `row`, written to
// the output row (partial < 0) or to partial slot `partial`.
struct WorkItem {
  int64_t row;
  int64_t row_begin;  // the row's first slot (positions are relative to it)
  int64_t begin;
  int64_t end;
  int64_t partial;
};

// Work item `tile` (< T) of a first pass: the tiles come first (long, so
// they start first), the light rows after them.
__device__ __forceinline__ void tile_item(const RowSchedule& s, int64_t tile, WorkItem& item) {
  item.row = s.tile_row[tile];
  item.row_begin = s.indptr[item.row];
  item.begin = s.tile_start[tile];
  item.end = min(item.begin + s.tile_edges, s.indptr[item.row + 1]);
  item.partial = tile;
}

constexpr int kWarpsPerBlock = 8;

// Blocks for one warp per tile and per row: an upper bound for any first pass.
inline int64_t first_pass_blocks(const RowSchedule& s) {
  return (s.num_tiles + s.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

// This warp's index in the grid.
__device__ __forceinline__ int64_t warp_index() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}

// ------------------------------------------------------ row batches
// A light row is a chain of dependent loads: its bounds, then its source
// ids, then the source rows. Taken one row per work item, a warp waits out
// the whole chain for every row in turn; on graphs of low in-degree (a grid:
// 4 slots a row) that waiting is most of the pass. A batched first pass
// takes the light rows kWarp consecutive rows per work item instead: one
// load brings all their bounds, and each row's first kWarp slots' ids (or
// whatever `prefetch` reads per slot) are loaded while the row before it
// runs, so a row waits on its feature loads only. Batches of consecutive
// rows also read indptr and the ids in order.
__host__ __device__ __forceinline__ int64_t batched_first_pass_items(const RowSchedule& s) {
  return s.num_tiles + (s.num_rows + kWarp - 1) / kWarp;
}

inline int64_t batched_first_pass_blocks(const RowSchedule& s) {
  return (batched_first_pass_items(s) + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

// Each warp calls body(item, prefetched) for its work items (grid stride):
// the tiles, then the light rows of its batches in row order, skipping
// heavy rows. prefetch(begin, end) reads what the lane needs of slot
// begin + lane (when that is < end) and is called for each item before the
// previous row's body runs; body gets its result as `prefetched`.
template <typename Prefetch, typename Body>
__device__ __forceinline__ void for_each_batched_work_item(const RowSchedule& s, Prefetch&& prefetch, Body&& body) {
  const int lane = threadIdx.x % kWarp;
  const int64_t items = batched_first_pass_items(s);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t warp = warp_index(); warp < items; warp += warps) {
    WorkItem item;
    if (warp < s.num_tiles) {
      tile_item(s, warp, item);
      body(item, prefetch(item.begin, item.end));
      continue;
    }
    const int64_t first_row = (warp - s.num_tiles) * kWarp;
    const int rows = static_cast<int>(min(static_cast<int64_t>(kWarp), s.num_rows - first_row));
    // Lane i holds row first_row + i's first slot; the batch ends at batch_end.
    const int64_t my_begin = lane < rows ? s.indptr[first_row + lane] : 0;
    const int64_t batch_end = s.indptr[first_row + rows];
    const auto row_start = [&](int j) {
      const int64_t start = __shfl_sync(kFullMask, my_begin, min(j, kWarp - 1));
      return j < rows ? start : batch_end;
    };
    item.partial = -1;
    item.begin = row_start(0);
    item.end = row_start(1);
    auto prefetched = prefetch(item.begin, item.end);
    for (int j = 0; j < rows; ++j) {
      // The next row's reads go out before this row's body.
      const int64_t next_end = row_start(j + 2);
      const auto next_prefetched = prefetch(item.end, next_end);
      item.row = first_row + j;
      item.row_begin = item.begin;
      if (item.end - item.begin <= s.tile_edges) body(item, prefetched);
      item.begin = item.end;
      item.end = next_end;
      prefetched = next_prefetched;
    }
  }
}

// The order in which a subwarp first pass takes the light rows: `rows`
// (int64 [count, 3], e.g. by descending degree, so the rows sharing a warp
// are about as long and no group idles behind its neighbour: each row with
// its first and end slot, read together, so a row waits on one load for its
// bounds, not on its id and then on indptr) or, with rows null,
// 0 .. num_rows - 1 (heavy rows skipped).
struct LightRows {
  const int64_t* rows;
  int64_t count;
};

// Work items of a subwarp first pass: the tiles (one warp each), then the
// light rows in runs of rows_per_warp (one per lane group).
__device__ __forceinline__ int64_t subwarp_items(const RowSchedule& s, const LightRows& light,
                                                 const LaneGroups& groups) {
  return s.num_tiles + (light.count + groups.rows_per_warp - 1) / groups.rows_per_warp;
}

// The light row of this lane group in subwarp item `warp` (>= the tiles):
// false when the group has none (past the last row, or a heavy row, whose
// tiles hold its result).
__device__ __forceinline__ bool subwarp_row(const RowSchedule& s, const LightRows& light, const LaneGroups& groups,
                                            int64_t warp, WorkItem& item) {
  const int64_t index = (warp - s.num_tiles) * groups.rows_per_warp + groups.group;
  if (index >= light.count) return false;
  if (light.rows != nullptr) {
    item.row = light.rows[3 * index];
    item.begin = light.rows[3 * index + 1];
    item.end = light.rows[3 * index + 2];
  } else {
    item.row = index;
    item.begin = s.indptr[index];
    item.end = s.indptr[index + 1];
  }
  item.row_begin = item.begin;
  item.partial = -1;
  return item.end - item.begin <= s.tile_edges;
}

// A kernel's resident blocks per SM at `threads` threads and `shared_bytes`
// of dynamic shared memory, on the current device, with the kernel allowed
// that much dynamic shared memory first (above 48 KiB a kernel must opt in,
// on each device it runs on). The runtime's occupancy query and attribute
// call need not run before every launch, as they did: their answers never
// change, so each is asked once per (kernel, device, threads, bytes).
inline int blocks_per_sm(const void* kernel, int threads, int shared_bytes) {
  using Key = std::tuple<const void*, int, int, int>;
  static std::mutex mutex;
  static std::map<Key, int> known;
  const Key key{kernel, static_cast<int>(c10::cuda::current_device()), threads, shared_bytes};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  if (shared_bytes > 0)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes));
  known.emplace(key, blocks);
  return blocks;
}

// Blocks for a first pass whose warps loop over work items with a grid
// stride (item = warp, warp + all warps, ...): as many blocks as stay
// resident at once, never more than the items need. On skewed graphs a block
// of one-row-per-warp lives as long as its longest row while its other warps
// idle; warps that move on to their next item keep the SM's slots busy.
template <typename Kernel>
inline int64_t resident_blocks(Kernel kernel, int64_t needed_blocks) {
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarp * kWarpsPerBlock, 0);
  const int64_t resident =
      static_cast<int64_t>(std::max(per_sm, 1)) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return std::max<int64_t>(1, std::min(needed_blocks, resident));
}

template <typename Kernel>
inline int64_t resident_first_pass_blocks(Kernel kernel, const RowSchedule& s) {
  return resident_blocks(kernel, first_pass_blocks(s));
}

template <typename Kernel>
inline int64_t resident_batched_pass_blocks(Kernel kernel, const RowSchedule& s) {
  return resident_blocks(kernel, batched_first_pass_blocks(s));
}

// Host side: check and view the schedule tensors built in Python.
inline RowSchedule row_schedule(const char* op, const at::Tensor& indptr, int64_t num_rows,
                                const at::Tensor& tile_row, const at::Tensor& tile_start,
                                const at::Tensor& heavy_rows, const at::Tensor& heavy_tile_ptr,
                                int64_t tile_edges) {
  const at::Tensor* parts[] = {&indptr, &tile_row, &tile_start, &heavy_rows, &heavy_tile_ptr};
  const char* names[] = {"indptr", "tile_row", "tile_start", "heavy_rows", "heavy_tile_ptr"};
  for (int i = 0; i < 5; ++i) {
    GNNIO_ENSURE(parts[i]->is_cuda(), op, ": ", names[i], " must be a CUDA tensor, got ", parts[i]->device());
    GNNIO_ENSURE(parts[i]->scalar_type() == at::kLong, op, ": ", names[i], " must be int64, got ",
                parts[i]->scalar_type());
    GNNIO_ENSURE(parts[i]->dim() == 1 && parts[i]->is_contiguous(), op, ": ", names[i],
                " must be a contiguous 1-d tensor, got shape ", parts[i]->sizes());
  }
  GNNIO_ENSURE(indptr.numel() == num_rows + 1, op, ": indptr must have num_rows + 1 = ", num_rows + 1,
              " entries, got ", indptr.numel());
  GNNIO_ENSURE(tile_edges > 0, op, ": tile_edges must be positive, got ", tile_edges);
  GNNIO_ENSURE(tile_row.numel() == tile_start.numel(), op, ": tile_row and tile_start differ in length: ",
              tile_row.numel(), " vs ", tile_start.numel());
  GNNIO_ENSURE(heavy_tile_ptr.numel() == heavy_rows.numel() + 1, op,
              ": heavy_tile_ptr must have len(heavy_rows) + 1 = ", heavy_rows.numel() + 1, " entries, got ",
              heavy_tile_ptr.numel());
  return RowSchedule{indptr.data_ptr<int64_t>(),     tile_row.data_ptr<int64_t>(), tile_start.data_ptr<int64_t>(),
                     heavy_rows.data_ptr<int64_t>(), heavy_tile_ptr.data_ptr<int64_t>(), num_rows,
                     tile_row.numel(),               heavy_rows.numel(),            tile_edges};
}

// Host side: the optional light-row order of a subwarp op (int64 [L, 3]:
// each row with its indptr bounds, L <= num_rows, on x's device), or natural
// order. The bounds must be the CSR's own (not checked: a copy).
inline LightRows light_rows(const char* op, const std::optional<at::Tensor>& row_order, const at::Tensor& x,
                            int64_t num_rows) {
  if (!row_order.has_value()) return LightRows{nullptr, num_rows};
  const at::Tensor& rows = *row_order;
  GNNIO_ENSURE(rows.device() == x.device(), op, ": row_order is on ", rows.device(), " but x is on ", x.device());
  GNNIO_ENSURE(rows.scalar_type() == at::kLong, op, ": row_order must be int64, got ", rows.scalar_type());
  GNNIO_ENSURE(rows.dim() == 2 && rows.size(1) == 3 && rows.is_contiguous() && rows.size(0) <= num_rows, op,
              ": row_order must be a contiguous [L, 3] tensor (row, first slot, end slot) of at most num_rows = ",
              num_rows, " rows, got shape ", rows.sizes());
  return LightRows{rows.data_ptr<int64_t>(), rows.size(0)};
}

// Check the feature matrix [rows, width]: CUDA, contiguous, 2-d.
inline void check_features(const char* op, const char* name, const at::Tensor& t) {
  GNNIO_ENSURE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device());
  GNNIO_ENSURE(t.dim() == 2, op, ": ", name, " must have 2 dims [N, F], got shape ", t.sizes());
  GNNIO_ENSURE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
}

// Check a per-slot (or per-row) 1-d array on x's device with `numel` entries.
inline void check_array(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x, int64_t numel) {
  GNNIO_CHECK(t.device() == x.device(), op, name, " is on ", t.device(), " but x is on ", x.device());
  GNNIO_CHECK(t.dim() == 1 && t.is_contiguous(), op, name, " must be a contiguous 1-d tensor, got shape ",
              t.sizes(), " strides ", t.strides());
  GNNIO_CHECK(t.numel() == numel, op, name, " must have ", numel, " entries, got ", t.numel());
}

inline void check_index_dtype(const char* op, const char* name, const at::Tensor& t) {
  GNNIO_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, name, " must be int32 or int64, got ",
              t.scalar_type());
}

// ------------------------------------------------------------ tile merges
// The second passes merge each heavy row's tiles in tile order, so results are
// deterministic. A super node has hundreds of tiles: if each tile's load
// waited for the previous tile's add, its merge would cost one memory latency
// per tile in sequence (0.1-0.27 ms per merge pass on rmat20, H100, most of
// it in the largest rows). in_tile_order issues kTileBatch tiles' loads
// before using any of them, then uses them in tile order.
constexpr int kTileBatch = 8;

template <typename T, typename Load, typename Use>
__device__ __forceinline__ void in_tile_order(int64_t first, int64_t last, Load&& load, Use&& use) {
  for (int64_t base = first; base < last; base += kTileBatch) {
    T value[kTileBatch];
#pragma unroll
    for (int i = 0; i < kTileBatch; ++i) {
      if (base + i < last) value[i] = load(base + i);
    }
#pragma unroll
    for (int i = 0; i < kTileBatch; ++i) {
      if (base + i < last) use(value[i]);
    }
  }
}

// Threads per block of a merge pass (one block per heavy row) over rows of
// `width` values: whole warps, at most 256, so narrow rows leave none idle.
inline int merge_threads(int64_t width) {
  return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (width + 31) / 32 * 32)));
}

// Second pass of every summing kernel (spmm.cu): out[heavy_rows[h]] = the sum,
// in tile order, of the fp32 partial rows [T, F] of h's tiles. out is 2-d
// [rows, F] (a view of a wider tensor's rows is fine). Given a second pair
// (partials2 [T, F], out2 [rows, F], same dtype as out), both are merged in
// the same pass: the pass takes as long as its one block per heavy row
// lasts, not as long as its loads, so two pairs cost about what one does.
void merge_partial_sums(const RowSchedule& schedule, const at::Tensor& partials, at::Tensor& out,
                        const at::Tensor* partials2 = nullptr, at::Tensor* out2 = nullptr);

}  // namespace gnnio
