// SpMM family: weighted sums of neighbour rows over a compressed structure.
//
// segment_sum: gnnio's own CSR kernel. One warp per light row; lanes cover the
// row's features with 128-bit loads (4 fp32 or 8 fp16/bf16 per lane), and
// when a row is narrower than a warp's worth of vectors the spare lanes take
// further edges (bf16 x 128 features: two edges per step). Heavy rows are
// cut into tiles, summed per tile in fp32 and merged in tile order by a
// second pass, so a hub never holds one warp for its whole degree and the
// result is deterministic. Warps stay resident and loop over work items (grid
// stride), so a block is not held by its one long row while the other warps
// idle.
//
// segment_sum_subwarp ("csr-subwarp"): the same sum for fp16/bf16 rows of at
// most 128 features; the spare lane groups take further rows instead of
// further edges (see its kernel below for why).
//
// cusparse_spmm: the vendor SpMM (CSR, fp32 compute), the yardstick and the
// fp32 alternative; gnnio_cli/ops/spmm_native.py picks among the kernels.

#include "common.cuh"

#include <cusparse.h>

namespace gnnio {
namespace {

// Edges whose feature loads one lane group issues before using any of them:
// independent 128-bit loads in flight per lane. 8 measured 7-20% slower than
// 4 on rmat20 and uniform20 (H100): the extra registers cost occupancy.
constexpr int kEdgeUnroll = 4;

// acc += weight[u] * x[source[u], column : column + VEC] for the step's
// kEdgeUnroll edges. All loads are issued before any is used, so their
// latencies overlap. Source: int64 ids, or 32-bit ones (common.cuh) in the
// subwarp kernel's light rows, where they keep the bf16 instantiation within
// 64 registers, no spill.
template <typename scalar_t, int VEC, typename Source>
__device__ __forceinline__ void gather_step(const Source (&source)[kEdgeUnroll], const float (&weight)[kEdgeUnroll],
                                            bool active, const scalar_t* __restrict__ x, int64_t width,
                                            int64_t column, float (&acc)[VEC]) {
  Vec<scalar_t, VEC> row[kEdgeUnroll];
#pragma unroll
  for (int u = 0; u < kEdgeUnroll; ++u) {
    if (active && is_source(source[u])) {
      row[u] = load_vec<scalar_t, VEC>(x + row_offset(source[u], width) + column);
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) row[u].v[v] = scalar_t(0.f);
    }
  }
#pragma unroll
  for (int u = 0; u < kEdgeUnroll; ++u) {
    const float w = is_source(source[u]) ? weight[u] : 0.f;
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += w * static_cast<float>(row[u].v[v]);
  }
}

// One lane's slot of a 32-slot batch: its source id and weight (1 without
// values; 0 past the item's end).
struct SlotRead {
  int64_t source;
  float weight;
};

__device__ __forceinline__ SlotRead read_slot(IndexView indices, const float* __restrict__ values, int64_t base,
                                              int64_t end) {
  const int lane = threadIdx.x % kWarp;
  if (lane >= end - base) return SlotRead{0, 0.f};
  return SlotRead{indices[base + lane], values != nullptr ? values[base + lane] : 1.f};
}

// The sum's start: 0, or diagonal[row] * x[row, column : column + VEC] when
// the operator has a diagonal (GCN's self-loops) and this lane starts the
// row (the row's first item, first lane group). x[row] is read in row order,
// not gathered, and its load needs no source id, so it overlaps the row's
// gathers.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void start_sum(const float* __restrict__ diagonal, bool starts_row, int64_t row,
                                          const scalar_t* __restrict__ x, int64_t width, int64_t column,
                                          float (&acc)[VEC]) {
  if (diagonal != nullptr && starts_row) {
    const float scale = diagonal[row];
    const Vec<scalar_t, VEC> own = load_vec<scalar_t, VEC>(x + row * width + column);
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = scale * static_cast<float>(own.v[v]);
  } else {
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
  }
}

// Sum of values[k] * x[indices[k]] over the item's slots, written as one output
// row (scalar_t) or one fp32 partial row. VEC is the vector width of this call
// (1 on the scalar path, used when rows are not 16-byte aligned). `first` is
// the lane's slot of the item's first batch, read ahead (see
// for_each_batched_work_item).
template <typename scalar_t, int VEC>
__device__ __forceinline__ void sum_slots(const WorkItem& item, const SlotRead& first, IndexView indices,
                                          const float* __restrict__ values, const float* __restrict__ diagonal,
                                          const scalar_t* __restrict__ x, int64_t width, scalar_t* __restrict__ out,
                                          float* __restrict__ partials) {
  const int lane = threadIdx.x % kWarp;
  const int64_t chunks = width / VEC;
  const int lanes = lanes_per_edge(chunks);
  const int groups = kWarp / lanes;
  const int group = lane / lanes;
  const int group_lane = lane % lanes;

  for (int64_t first_chunk = 0; first_chunk < chunks; first_chunk += lanes) {
    const int64_t chunk = first_chunk + group_lane;
    const bool active = chunk < chunks;
    const int64_t column = chunk * VEC;
    float acc[VEC];
    start_sum<scalar_t, VEC>(diagonal, active && group == 0 && item.begin == item.row_begin, item.row, x, width,
                             column, acc);

    for (int64_t base = item.begin; base < item.end; base += kWarp) {
      // The warp reads 32 slots' indices and weights at once, then shares them.
      const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
      const SlotRead mine = base == item.begin ? first : read_slot(indices, values, base, item.end);
      const int64_t my_source = mine.source;
      const float my_weight = mine.weight;
      for (int step = 0; step < count; step += groups * kEdgeUnroll) {
        int64_t source[kEdgeUnroll];
        float weight[kEdgeUnroll];
#pragma unroll
        for (int u = 0; u < kEdgeUnroll; ++u) {
          const int slot = step + u * groups + group;
          source[u] = __shfl_sync(kFullMask, my_source, slot % kWarp);
          weight[u] = __shfl_sync(kFullMask, my_weight, slot % kWarp);
          if (slot >= count) source[u] = -1;
        }
        gather_step<scalar_t, VEC>(source, weight, active, x, width, column, acc);
      }
    }
    // Lane groups that took different edges add up in a fixed order.
    for (int offset = lanes; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] += __shfl_xor_sync(kFullMask, acc[v], offset);
    }
    if (group == 0 && active) {
      if (item.partial < 0) {
        Vec<scalar_t, VEC> result;
#pragma unroll
        for (int v = 0; v < VEC; ++v) result.v[v] = static_cast<scalar_t>(acc[v]);
        store_vec<scalar_t, VEC>(out + item.row * width + column, result);
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) partials[item.partial * width + column + v] = acc[v];
      }
    }
  }
}

// kDiagonal: whether the operator has a diagonal (an instantiation of its own,
// so the kernels without one keep their registers).
template <typename scalar_t, bool kDiagonal>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    segment_sum_kernel(RowSchedule schedule, IndexView indices, const float* __restrict__ values,
                       const float* __restrict__ diagonal_or_null, const scalar_t* __restrict__ x, int64_t width,
                       bool vectorised, scalar_t* __restrict__ out, float* __restrict__ partials) {
  const float* diagonal = kDiagonal ? diagonal_or_null : nullptr;
  const auto slots = [&](int64_t begin, int64_t end) { return read_slot(indices, values, begin, end); };
  for_each_batched_work_item(schedule, slots, [&](const WorkItem& item, const SlotRead& first) {
    if (vectorised) {
      sum_slots<scalar_t, vec_width<scalar_t>()>(item, first, indices, values, diagonal, x, width, out, partials);
    } else {
      sum_slots<scalar_t, 1>(item, first, indices, values, diagonal, x, width, out, partials);
    }
  });
}

// ------------------------------------------------------------ csr-subwarp
// A 16-bit row of at most 128 features is at most 16 lanes of 128-bit loads.
// csr-vec gives the warp's spare lane groups further edges of the same row;
// on rmat20 that left bf16 only 1.16x faster than fp32, because a light row
// costs a chain of dependent latencies (row bounds -> indices -> features ->
// store) that halving the bytes does not shorten. Here each lane group takes
// a row of its own instead: a warp runs 32 / lanes rows' chains at once (2 at
// 128 features, 4 at 64, 32 at 8) with the same loads in flight per lane.
// Heavy rows' tiles are long, so they keep csr-vec's whole-warp scheme.
constexpr int kSubwarpMinBlocksPerSm = 4;

// One light row summed by this lane's group, in slot order, fp32, rounded
// once. No lane leaves early: the group shuffles.
template <typename scalar_t>
__device__ __forceinline__ void sum_row_in_group(const WorkItem& item, const LaneGroups& groups, IndexView indices,
                                                 const float* __restrict__ values, const float* __restrict__ diagonal,
                                                 const scalar_t* __restrict__ x, int64_t width, float scale,
                                                 scalar_t* __restrict__ out) {
  constexpr int VEC = kSubwarpVec;
  const int lanes = groups.lanes;
  const int group_lane = groups.group_lane;
  const int64_t column = static_cast<int64_t>(group_lane) * VEC;
  const bool active = column < width;
  float acc[VEC];
  start_sum<scalar_t, VEC>(diagonal, active, item.row, x, width, column, acc);
  // A group at least as wide as the unroll reads a batch of `lanes` indices
  // and weights at once (one latency) and shares them by shuffles; a narrower
  // one (8 or 16 features) reads each step's few slots directly, every lane
  // the same addresses (one broadcast load each).
  const bool shared = lanes >= kEdgeUnroll;
  const int batch = shared ? lanes : kEdgeUnroll;
  for (int64_t base = item.begin; base < item.end; base += batch) {
    const int count = static_cast<int>(min(static_cast<int64_t>(batch), item.end - base));
    // 32-bit source ids (see gather_step); a plain sum's weights are all 1
    // and take no shuffle.
    uint32_t my_source = 0;
    float my_weight = 1.f;
    if (shared && group_lane < count) {
      my_source = static_cast<uint32_t>(indices[base + group_lane]);
      if (values != nullptr) my_weight = values[base + group_lane];
    }
    for (int step = 0; step < count; step += kEdgeUnroll) {
      uint32_t source[kEdgeUnroll];
      float weight[kEdgeUnroll];
#pragma unroll
      for (int u = 0; u < kEdgeUnroll; ++u) {
        const int slot = step + u;
        if (shared) {
          source[u] = __shfl_sync(groups.mask, my_source, slot % lanes, lanes);
          weight[u] = values != nullptr ? __shfl_sync(groups.mask, my_weight, slot % lanes, lanes) : 1.f;
        } else {
          source[u] = slot < count ? static_cast<uint32_t>(indices[base + slot]) : 0;
          weight[u] = slot < count && values != nullptr ? values[base + slot] : 1.f;
        }
        if (slot >= count) source[u] = kNoSource;
      }
      gather_step<scalar_t, VEC>(source, weight, active, x, width, column, acc);
    }
  }
  if (active) {
    Vec<scalar_t, VEC> result;
#pragma unroll
    for (int v = 0; v < VEC; ++v) result.v[v] = static_cast<scalar_t>(scale * acc[v]);
    store_vec<scalar_t, VEC>(out + item.row * width + column, result);
  }
}

// Work items: the heavy rows' tiles (one warp each, as csr-vec), then the
// light rows in `light`'s order, 32 / lanes per warp, one per lane group.
// At most 64 registers (4 blocks of 8 warps per SM, csr-vec's occupancy):
// left alone, the fp16 instantiation took 70, one block less, and this
// kernel exists to keep more rows in flight.
template <typename scalar_t, bool kDiagonal>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, kSubwarpMinBlocksPerSm)
    segment_sum_subwarp_kernel(RowSchedule schedule, LightRows light, IndexView indices,
                               const float* __restrict__ values, const float* __restrict__ row_scale,
                               const float* __restrict__ diagonal_or_null, const scalar_t* __restrict__ x,
                               int64_t width, scalar_t* __restrict__ out, float* __restrict__ partials) {
  const float* diagonal = kDiagonal ? diagonal_or_null : nullptr;
  const LaneGroups groups(width);
  const int64_t items = subwarp_items(schedule, light, groups);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t warp = warp_index(); warp < items; warp += warps) {
    WorkItem item;
    if (warp < schedule.num_tiles) {
      tile_item(schedule, warp, item);
      sum_slots<scalar_t, kSubwarpVec>(item, read_slot(indices, values, item.begin, item.end), indices, values,
                                       diagonal, x, width, out, partials);
      continue;
    }
    if (subwarp_row(schedule, light, groups, warp, item)) {
      // row_scale: every slot of the row has the same value, applied once to the plain sum
      if (row_scale != nullptr) {
        sum_row_in_group<scalar_t>(item, groups, indices, nullptr, diagonal, x, width, row_scale[item.row], out);
      } else {
        sum_row_in_group<scalar_t>(item, groups, indices, values, diagonal, x, width, 1.f, out);
      }
    }
    // Groups finish their rows at different times; meet before the next item.
    __syncwarp();
  }
}

}  // namespace

// Second pass, shared with the max/min backward and attention's source pass:
// each block merges one heavy row's tile partials in tile order, and the
// second pair's with them where given (partials2 non-null: attention's
// d value and d key), in the same rounds of loads. Rows of out and out2 lie
// out_stride and out2_stride elements apart (width, or more for the row
// views of a wider tensor).
template <typename scalar_t>
__global__ void merge_partial_sums_kernel(RowSchedule schedule, int64_t width, const float* __restrict__ partials,
                                          int64_t out_stride, scalar_t* __restrict__ out,
                                          const float* __restrict__ partials2, int64_t out2_stride,
                                          scalar_t* __restrict__ out2) {
  const int64_t heavy = blockIdx.x;
  const int64_t row = schedule.heavy_rows[heavy];
  const int64_t first = schedule.heavy_tile_ptr[heavy];
  const int64_t last = schedule.heavy_tile_ptr[heavy + 1];
  for (int64_t column = threadIdx.x; column < width; column += blockDim.x) {
    if (partials2 == nullptr) {
      float acc = 0.f;
      in_tile_order<float>(
          first, last, [&](int64_t tile) { return partials[tile * width + column]; },
          [&](float value) { acc += value; });
      out[row * out_stride + column] = static_cast<scalar_t>(acc);
    } else {
      float2 acc = make_float2(0.f, 0.f);
      in_tile_order<float2>(
          first, last,
          [&](int64_t tile) { return make_float2(partials[tile * width + column], partials2[tile * width + column]); },
          [&](float2 value) {
            acc.x += value.x;
            acc.y += value.y;
          });
      out[row * out_stride + column] = static_cast<scalar_t>(acc.x);
      out2[row * out2_stride + column] = static_cast<scalar_t>(acc.y);
    }
  }
}

void merge_partial_sums(const RowSchedule& schedule, const at::Tensor& partials, at::Tensor& out,
                        const at::Tensor* partials2, at::Tensor* out2) {
  const int64_t width = out.size(1);
  if (schedule.num_heavy == 0 || width == 0) return;
  GNNIO_ENSURE(out.stride(1) == 1 && out.stride(0) >= width,
              "gnnio::merge_partial_sums: out rows must be dense, got strides ", out.strides());
  GNNIO_ENSURE((partials2 == nullptr) == (out2 == nullptr),
              "gnnio::merge_partial_sums: partials2 and out2 come together");
  if (out2 != nullptr) {
    GNNIO_ENSURE(out2->dim() == 2 && out2->size(1) == width && out2->stride(1) == 1 && out2->stride(0) >= width &&
                     out2->scalar_type() == out.scalar_type() && partials2->sizes() == partials.sizes(),
                 "gnnio::merge_partial_sums: the second pair must match the first, got out2 ", out2->sizes(),
                 " strides ", out2->strides(), " and partials2 ", partials2->sizes(), " against ", partials.sizes());
  }
  const int threads = merge_threads(width);
  auto stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(out.scalar_type(), "gnnio::merge_partial_sums", [&] {
    merge_partial_sums_kernel<scalar_t><<<schedule.num_heavy, threads, 0, stream>>>(
        schedule, width, partials.data_ptr<float>(), out.stride(0), out.data_ptr<scalar_t>(),
        partials2 == nullptr ? nullptr : partials2->data_ptr<float>(), out2 == nullptr ? 0 : out2->stride(0),
        out2 == nullptr ? nullptr : out2->data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

namespace {

// Both ops: segment_sum_kernel for every input (subwarp false) or the
// lane-group kernel for 16-bit rows of at most 128 features (true).
at::Tensor sum_forward(const char* op, bool subwarp, const at::Tensor& indptr, const at::Tensor& indices,
                       const std::optional<at::Tensor>& values, const at::Tensor& x, int64_t num_rows,
                       const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                       const at::Tensor& heavy_tile_ptr, int64_t tile_edges,
                       const std::optional<at::Tensor>& row_order, const std::optional<at::Tensor>& row_scale,
                       const std::optional<at::Tensor>& diagonal) {
  check_features(op, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const RowSchedule schedule =
      row_schedule(op, indptr, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  check_index_dtype(op, "indices", indices);
  check_array(op, "indices", indices, x, indices.numel());
  check_array(op, "indptr", indptr, x, num_rows + 1);
  if (values.has_value()) {
    GNNIO_CHECK(values->scalar_type() == at::kFloat, op, "values must be float32, got ", values->scalar_type());
    check_array(op, "values", *values, x, indices.numel());
  }
  if (diagonal.has_value()) {
    GNNIO_CHECK(diagonal->scalar_type() == at::kFloat, op, "diagonal must be float32, got ", diagonal->scalar_type());
    check_array(op, "diagonal", *diagonal, x, num_rows);
    GNNIO_CHECK(x.size(0) == num_rows, op, "a diagonal needs a square operator: x must have num_rows = ", num_rows,
                " rows, got ", x.size(0));
    GNNIO_CHECK(!row_scale.has_value(), op, "row_scale and diagonal cannot be combined");
  }
  const int64_t width = x.size(1);
  if (subwarp) {
    GNNIO_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, op,
                "x must be float16 or bfloat16 (other dtypes take segment_sum), got ", x.scalar_type());
    GNNIO_CHECK(width > 0 && width <= kSubwarpMaxWidth && rows_vectorisable(x, width, kSubwarpVec), op,
                "x must have a multiple of ", kSubwarpVec, " features, at most ", kSubwarpMaxWidth,
                ", starting 16-byte aligned (others take segment_sum), got width ", width);
    check_32bit_sources(op, x, " (others take segment_sum)");
    if (row_scale.has_value()) {
      GNNIO_CHECK(row_scale->scalar_type() == at::kFloat, op, "row_scale must be float32, got ",
                  row_scale->scalar_type());
      check_array(op, "row_scale", *row_scale, x, num_rows);
    }
  }
  const LightRows light = light_rows(op, row_order, x, num_rows);
  at::Tensor out = at::empty({num_rows, width}, x.options());
  if (num_rows == 0 || width == 0) return out;
  at::Tensor partials = at::empty({schedule.num_tiles, width}, x.options().dtype(at::kFloat));
  const float* value_data = values.has_value() ? values->data_ptr<float>() : nullptr;
  const float* diagonal_data = diagonal.has_value() ? diagonal->data_ptr<float>() : nullptr;
  auto stream = at::cuda::getCurrentCUDAStream();
  if (subwarp) {
    // 16-bit only: two instantiations, not GNNIO_DISPATCH_FEATURES' three.
    const auto launch = [&](auto zero) {
      using scalar_t = decltype(zero);
      const auto kernel = diagonal_data != nullptr ? segment_sum_subwarp_kernel<scalar_t, true>
                                                   : segment_sum_subwarp_kernel<scalar_t, false>;
      const int64_t blocks = resident_first_pass_blocks(kernel, schedule);
      kernel<<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
          schedule, light, index_view(indices), value_data,
          row_scale.has_value() ? row_scale->data_ptr<float>() : nullptr, diagonal_data, x.data_ptr<scalar_t>(),
          width, out.data_ptr<scalar_t>(), partials.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (x.scalar_type() == at::kHalf) {
      launch(at::Half(0.f));
    } else {
      launch(at::BFloat16(0.f));
    }
  } else {
    GNNIO_DISPATCH_FEATURES(x.scalar_type(), op, [&] {
      const bool vectorised = rows_vectorisable(x, width, vec_width<scalar_t>()) &&
                              rows_vectorisable(out, width, vec_width<scalar_t>());
      const auto kernel =
          diagonal_data != nullptr ? segment_sum_kernel<scalar_t, true> : segment_sum_kernel<scalar_t, false>;
      const int64_t blocks = resident_batched_pass_blocks(kernel, schedule);
      kernel<<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
          schedule, index_view(indices), value_data, diagonal_data, x.data_ptr<scalar_t>(), width, vectorised,
          out.data_ptr<scalar_t>(), partials.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  merge_partial_sums(schedule, partials, out);
  return out;
}

}  // namespace

at::Tensor segment_sum(const at::Tensor& indptr, const at::Tensor& indices, const std::optional<at::Tensor>& values,
                       const at::Tensor& x, int64_t num_rows, const at::Tensor& tile_row,
                       const at::Tensor& tile_start, const at::Tensor& heavy_rows, const at::Tensor& heavy_tile_ptr,
                       int64_t tile_edges, const std::optional<at::Tensor>& diagonal) {
  return sum_forward("gnnio::segment_sum", false, indptr, indices, values, x, num_rows, tile_row, tile_start,
                     heavy_rows, heavy_tile_ptr, tile_edges, std::nullopt, std::nullopt, diagonal);
}

at::Tensor segment_sum_subwarp(const at::Tensor& indptr, const at::Tensor& indices,
                               const std::optional<at::Tensor>& values, const at::Tensor& x, int64_t num_rows,
                               const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                               const at::Tensor& heavy_tile_ptr, int64_t tile_edges,
                               const std::optional<at::Tensor>& row_order,
                               const std::optional<at::Tensor>& row_scale,
                               const std::optional<at::Tensor>& diagonal) {
  return sum_forward("gnnio::segment_sum_subwarp", true, indptr, indices, values, x, num_rows, tile_row, tile_start,
                     heavy_rows, heavy_tile_ptr, tile_edges, row_order, row_scale, diagonal);
}

// ------------------------------------------------------------------ cuSPARSE
namespace {

#define GNNIO_CUSPARSE_CHECK(op, call)                                                                  \
  do {                                                                                                  \
    const cusparseStatus_t status = (call);                                                             \
    GNNIO_ENSURE(status == CUSPARSE_STATUS_SUCCESS, op, ": cuSPARSE call ", #call, " failed: ",          \
                cusparseGetErrorString(status));                                                        \
  } while (0)

cudaDataType cuda_data_type(const char* op, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return CUDA_R_32F;
    case at::kHalf:
      return CUDA_R_16F;
    case at::kBFloat16:
      return CUDA_R_16BF;
    default:
      GNNIO_ENSURE(false, op, ": features must be float32, float16 or bfloat16, got ", dtype);
  }
}

// The descriptors of one out = A @ x call. They only wrap pointers (host
// objects, no device work), so they are made per call; what costs time to
// build, the workspace and the values, is cached by the caller.
class SpmmCall {
 public:
  SpmmCall(const char* op, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
           const at::Tensor& x, int64_t num_rows, const at::Tensor& out)
      : op_(op) {
    check_features(op, "x", x);
    check_index_dtype(op, "indices", indices);
    GNNIO_CHECK(indptr.scalar_type() == indices.scalar_type(), op,
                "indptr and indices must share one index dtype for cuSPARSE, got ", indptr.scalar_type(), " and ",
                indices.scalar_type());
    check_array(op, "indptr", indptr, x, num_rows + 1);
    check_array(op, "indices", indices, x, indices.numel());
    GNNIO_CHECK(values.scalar_type() == x.scalar_type(), op, "values must have x's dtype ", x.scalar_type(),
                ", got ", values.scalar_type());
    check_array(op, "values", values, x, indices.numel());
    const cusparseIndexType_t index_type =
        indices.scalar_type() == at::kLong ? CUSPARSE_INDEX_64I : CUSPARSE_INDEX_32I;
    const cudaDataType value_type = cuda_data_type(op, x.scalar_type());
    const int64_t width = x.size(1);
    GNNIO_CUSPARSE_CHECK(op, cusparseCreateCsr(&a_, num_rows, x.size(0), indices.numel(), indptr.data_ptr(),
                                               indices.data_ptr(), values.data_ptr(), index_type, index_type,
                                               CUSPARSE_INDEX_BASE_ZERO, value_type));
    GNNIO_CUSPARSE_CHECK(op, cusparseCreateDnMat(&b_, x.size(0), width, width, x.data_ptr(), value_type,
                                                 CUSPARSE_ORDER_ROW));
    GNNIO_CUSPARSE_CHECK(op, cusparseCreateDnMat(&c_, num_rows, width, width, out.data_ptr(), value_type,
                                                 CUSPARSE_ORDER_ROW));
  }
  ~SpmmCall() {
    if (c_ != nullptr) cusparseDestroyDnMat(c_);
    if (b_ != nullptr) cusparseDestroyDnMat(b_);
    if (a_ != nullptr) cusparseDestroySpMat(a_);
  }
  SpmmCall(const SpmmCall&) = delete;
  SpmmCall& operator=(const SpmmCall&) = delete;

  size_t buffer_size() {
    size_t bytes = 0;
    GNNIO_CUSPARSE_CHECK(op_, cusparseSpMM_bufferSize(at::cuda::getCurrentCUDASparseHandle(),
                                                      CUSPARSE_OPERATION_NON_TRANSPOSE,
                                                      CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, a_, b_, &zero_, c_,
                                                      CUDA_R_32F, kAlgorithm, &bytes));
    return bytes;
  }

  void run(void* workspace) {
    GNNIO_CUSPARSE_CHECK(op_, cusparseSpMM(at::cuda::getCurrentCUDASparseHandle(), CUSPARSE_OPERATION_NON_TRANSPOSE,
                                           CUSPARSE_OPERATION_NON_TRANSPOSE, &one_, a_, b_, &zero_, c_, CUDA_R_32F,
                                           kAlgorithm, workspace));
  }

 private:
  // ALG2: row-major dense operands, bit-wise deterministic results.
  static constexpr cusparseSpMMAlg_t kAlgorithm = CUSPARSE_SPMM_CSR_ALG2;
  const char* op_;
  const float one_ = 1.f;
  const float zero_ = 0.f;
  cusparseSpMatDescr_t a_ = nullptr;
  cusparseDnMatDescr_t b_ = nullptr;
  cusparseDnMatDescr_t c_ = nullptr;
};

}  // namespace

int64_t cusparse_spmm_buffer_size(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                                  const at::Tensor& x, int64_t num_rows) {
  const char* op = "gnnio::cusparse_spmm_buffer_size";
  check_features(op, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  if (num_rows == 0 || indices.numel() == 0 || x.size(1) == 0) return 0;
  const at::Tensor out_shape = at::empty({num_rows, x.size(1)}, x.options());
  SpmmCall call(op, indptr, indices, values, x, num_rows, out_shape);
  return static_cast<int64_t>(call.buffer_size());
}

at::Tensor cusparse_spmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                         const at::Tensor& x, int64_t num_rows, at::Tensor& workspace) {
  const char* op = "gnnio::cusparse_spmm";
  check_features(op, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  // cuSPARSE rejects empty operands; an empty product is all zeros.
  if (num_rows == 0 || indices.numel() == 0 || x.size(1) == 0) return at::zeros({num_rows, x.size(1)}, x.options());
  at::Tensor out = at::empty({num_rows, x.size(1)}, x.options());
  SpmmCall call(op, indptr, indices, values, x, num_rows, out);
  const size_t needed = call.buffer_size();
  GNNIO_CHECK(workspace.is_cuda() && workspace.is_contiguous() && workspace.device() == x.device(), op,
              "workspace must be a contiguous buffer on ", x.device(), ", got ", workspace.device());
  GNNIO_CHECK(static_cast<size_t>(workspace.nbytes()) >= needed, op, "workspace holds ", workspace.nbytes(),
              " bytes, cuSPARSE needs ", needed, "; size it with gnnio::cusparse_spmm_buffer_size");
  call.run(needed > 0 ? workspace.data_ptr() : nullptr);
  return out;
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("segment_sum", &segment_sum);
  m.impl("segment_sum_subwarp", &segment_sum_subwarp);
  m.impl("cusparse_spmm", &cusparse_spmm);
  m.impl("cusparse_spmm_buffer_size", &cusparse_spmm_buffer_size);
}

}  // namespace gnnio
