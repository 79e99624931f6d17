// Reduction family: per-feature max and min over each target's sources, and
// their gradient.
//
// Forward: the degree-aware schedule of common.cuh. A light row is one warp
// with 128-bit feature loads; a heavy row is cut into tiles whose winners
// (value and position) a second pass merges. For each (row, feature) the
// winner's position within the row is saved: 16 bits when no row has more
// than 65,536 slots, else 32 (a quarter or a half of an fp32 output's bytes,
// where a source id would need as much as the output).
//
// Backward: no atomics. Each source row of the CSC gathers, over its
// out-edges, the output gradient of every (target, feature) whose saved
// winner is that very edge, comparing the saved position with the edge's CSR
// position. Sums run in fp32 in slot order (heavy sources per tile, merged in
// tile order), so the gradient is deterministic.
//
// Both passes keep their warps resident and loop over the work items (grid
// stride): on skewed degrees a block is not held by one long row.

#include "common.cuh"

namespace gnnio {
namespace {

// Edges whose loads a lane group issues before using any (8 measured slower
// than 4 for the backward on H100: occupancy).
constexpr int kForwardUnroll = 4;
constexpr int kBackwardUnroll = 4;
constexpr int32_t kNoWinner = -1;

// Whether the slot at `position` (counted from the row's first slot) beats the
// current best. The order: NaN beats every number (as torch's amax), then the
// larger value, then the smaller source id, then the earlier slot. A total
// order, so the winner does not depend on the order in which lanes and tiles
// meet. Sources are read only on ties, so no register holds them.
//
// A missing winner always carries -inf (the start value), so two ordered,
// unequal numbers decide at once; only equal values and NaN take the full
// comparison. Two compares per feature and edge in the common case.
__device__ __forceinline__ bool beats(float value, int32_t position, float best, int32_t best_position,
                                      IndexView indices, int64_t row_begin) {
  if (value > best) return true;
  if (value < best) return false;
  if (position == kNoWinner) return false;
  if (best_position == kNoWinner) return true;
  const bool value_nan = isnan(value);
  const bool best_nan = isnan(best);
  if (value_nan != best_nan) return value_nan;
  if (!value_nan && value != best) return value > best;
  const int64_t source = indices[row_begin + position];
  const int64_t best_source = indices[row_begin + best_position];
  if (source != best_source) return source < best_source;
  return position < best_position;
}

__device__ __forceinline__ void store_position(void* positions, bool compact, int64_t offset, int32_t position) {
  if (compact) {
    static_cast<uint16_t*>(positions)[offset] = static_cast<uint16_t>(position);
  } else {
    static_cast<int32_t*>(positions)[offset] = position;
  }
}

// Winners over the item's slots. Values are compared as sign * x, so min is
// the max of -x and both share one kernel.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void extremum_slots(const WorkItem& item, IndexView indices, const scalar_t* __restrict__ x,
                                               int64_t width, float sign, bool compact, scalar_t* __restrict__ out,
                                               void* __restrict__ positions, float* __restrict__ partial_values,
                                               int32_t* __restrict__ partial_positions) {
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
    float best[VEC];
    int32_t best_position[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      best[v] = -INFINITY;
      best_position[v] = kNoWinner;
    }

    for (int64_t base = item.begin; base < item.end; base += kWarp) {
      const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
      const int64_t my_source = lane < count ? indices[base + lane] : 0;
      for (int step = 0; step < count; step += groups * kForwardUnroll) {
        int64_t source[kForwardUnroll];
        int32_t position[kForwardUnroll];
#pragma unroll
        for (int u = 0; u < kForwardUnroll; ++u) {
          const int slot = step + u * groups + group;
          source[u] = __shfl_sync(kFullMask, my_source, slot % kWarp);
          position[u] = static_cast<int32_t>(base - item.row_begin) + slot;
          if (slot >= count) source[u] = -1;
        }
        Vec<scalar_t, VEC> row[kForwardUnroll];
#pragma unroll
        for (int u = 0; u < kForwardUnroll; ++u) {
          if (active && source[u] >= 0) row[u] = load_vec<scalar_t, VEC>(x + source[u] * width + column);
        }
#pragma unroll
        for (int u = 0; u < kForwardUnroll; ++u) {
          if (!active || source[u] < 0) continue;
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            const float value = sign * static_cast<float>(row[u].v[v]);
            if (beats(value, position[u], best[v], best_position[v], indices, item.row_begin)) {
              best[v] = value;
              best_position[v] = position[u];
            }
          }
        }
      }
    }
    for (int offset = lanes; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const float value = __shfl_xor_sync(kFullMask, best[v], offset);
        const int32_t position = __shfl_xor_sync(kFullMask, best_position[v], offset);
        if (beats(value, position, best[v], best_position[v], indices, item.row_begin)) {
          best[v] = value;
          best_position[v] = position;
        }
      }
    }
    if (group != 0 || !active) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if (item.partial < 0) {
        const int64_t offset = item.row * width + column + v;
        // An empty row has no winner: 0, as PyG; its position is never read.
        out[offset] = static_cast<scalar_t>(best_position[v] == kNoWinner ? 0.f : sign * best[v]);
        store_position(positions, compact, offset, best_position[v]);
      } else {
        const int64_t offset = item.partial * width + column + v;
        partial_values[offset] = best[v];
        partial_positions[offset] = best_position[v];
      }
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    segment_extremum_kernel(RowSchedule schedule, IndexView indices, const scalar_t* __restrict__ x, int64_t width,
                            bool vectorised, float sign, bool compact, scalar_t* __restrict__ out,
                            void* __restrict__ positions, float* __restrict__ partial_values,
                            int32_t* __restrict__ partial_positions) {
  const int64_t items = first_pass_items(schedule);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; warp < items;
       warp += warps) {
    WorkItem item;
    if (!work_item(schedule, warp, item)) continue;
    if (vectorised) {
      extremum_slots<scalar_t, vec_width<scalar_t>()>(item, indices, x, width, sign, compact, out, positions,
                                                      partial_values, partial_positions);
    } else {
      extremum_slots<scalar_t, 1>(item, indices, x, width, sign, compact, out, positions, partial_values,
                                  partial_positions);
    }
  }
}

// Second pass: one block per heavy row merges its tiles' winners.
template <typename scalar_t>
__global__ void merge_extremum_kernel(RowSchedule schedule, IndexView indices, const float* __restrict__ partial_values,
                                      const int32_t* __restrict__ partial_positions, int64_t width, float sign,
                                      bool compact, scalar_t* __restrict__ out, void* __restrict__ positions) {
  const int64_t heavy = blockIdx.x;
  const int64_t row = schedule.heavy_rows[heavy];
  const int64_t row_begin = schedule.indptr[row];
  const int64_t first = schedule.heavy_tile_ptr[heavy];
  const int64_t last = schedule.heavy_tile_ptr[heavy + 1];
  for (int64_t column = threadIdx.x; column < width; column += blockDim.x) {
    float best = -INFINITY;
    int32_t best_position = kNoWinner;
    for (int64_t tile = first; tile < last; ++tile) {
      const float value = partial_values[tile * width + column];
      const int32_t position = partial_positions[tile * width + column];
      if (beats(value, position, best, best_position, indices, row_begin)) {
        best = value;
        best_position = position;
      }
    }
    out[row * width + column] = static_cast<scalar_t>(sign * best);
    store_position(positions, compact, row * width + column, best_position);
  }
}

// ------------------------------------------------------------------ backward
template <int VEC>
__device__ __forceinline__ void load_positions(const void* positions, bool compact, int64_t offset,
                                               int32_t (&result)[VEC]) {
  if (compact) {
    const Vec<uint16_t, VEC> loaded = load_vec<uint16_t, VEC>(static_cast<const uint16_t*>(positions) + offset);
#pragma unroll
    for (int v = 0; v < VEC; ++v) result[v] = loaded.v[v];
  } else {
    const Vec<int32_t, VEC> loaded = load_vec<int32_t, VEC>(static_cast<const int32_t*>(positions) + offset);
#pragma unroll
    for (int v = 0; v < VEC; ++v) result[v] = loaded.v[v];
  }
}

template <typename scalar_t, int VEC>
__device__ __forceinline__ void extremum_grad_slots(const WorkItem& item, IndexView targets,
                                                    const int32_t* __restrict__ csc_position,
                                                    const scalar_t* __restrict__ grad_out,
                                                    const void* __restrict__ positions, bool compact, int64_t width,
                                                    scalar_t* __restrict__ grad_x, float* __restrict__ partials) {
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
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0.f;

    for (int64_t base = item.begin; base < item.end; base += kWarp) {
      const int count = static_cast<int>(min(static_cast<int64_t>(kWarp), item.end - base));
      const int64_t my_target = lane < count ? targets[base + lane] : 0;
      const int32_t my_position = lane < count ? csc_position[base + lane] : 0;
      for (int step = 0; step < count; step += groups * kBackwardUnroll) {
        int64_t target[kBackwardUnroll];
        int32_t edge_position[kBackwardUnroll];
#pragma unroll
        for (int u = 0; u < kBackwardUnroll; ++u) {
          const int slot = step + u * groups + group;
          target[u] = __shfl_sync(kFullMask, my_target, slot % kWarp);
          edge_position[u] = __shfl_sync(kFullMask, my_position, slot % kWarp);
          if (slot >= count || !active) target[u] = -1;
        }
        int32_t winner[kBackwardUnroll][VEC];
#pragma unroll
        for (int u = 0; u < kBackwardUnroll; ++u) {
          if (target[u] >= 0) load_positions<VEC>(positions, compact, target[u] * width + column, winner[u]);
        }
        // Which of the lane's features each edge won. Most (target, feature)
        // pairs were won by another edge: their gradient bytes are skipped.
        bool won[kBackwardUnroll][VEC];
        bool any[kBackwardUnroll];
#pragma unroll
        for (int u = 0; u < kBackwardUnroll; ++u) {
          any[u] = false;
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            won[u][v] = target[u] >= 0 && winner[u][v] == edge_position[u];
            any[u] |= won[u][v];
          }
        }
        // All of the step's gradient loads are issued before any is used, so
        // their latencies overlap instead of adding up edge by edge.
        Vec<scalar_t, VEC> grad[kBackwardUnroll];
#pragma unroll
        for (int u = 0; u < kBackwardUnroll; ++u) {
          if (any[u]) {
            grad[u] = load_vec<scalar_t, VEC>(grad_out + target[u] * width + column);
          } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) grad[u].v[v] = scalar_t(0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < kBackwardUnroll; ++u) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            if (won[u][v]) acc[v] += static_cast<float>(grad[u].v[v]);
          }
        }
      }
    }
    for (int offset = lanes; offset < kWarp; offset <<= 1) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] += __shfl_xor_sync(kFullMask, acc[v], offset);
    }
    if (group != 0 || !active) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if (item.partial < 0) {
        grad_x[item.row * width + column + v] = static_cast<scalar_t>(acc[v]);
      } else {
        partials[item.partial * width + column + v] = acc[v];
      }
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    segment_extremum_backward_kernel(RowSchedule schedule, IndexView targets, const int32_t* __restrict__ csc_position,
                                     const scalar_t* __restrict__ grad_out, const void* __restrict__ positions,
                                     bool compact, int64_t width, bool vectorised, scalar_t* __restrict__ grad_x,
                                     float* __restrict__ partials) {
  const int64_t items = first_pass_items(schedule);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; warp < items;
       warp += warps) {
    WorkItem item;
    if (!work_item(schedule, warp, item)) continue;
    if (vectorised) {
      extremum_grad_slots<scalar_t, vec_width<scalar_t>()>(item, targets, csc_position, grad_out, positions,
                                                           compact, width, grad_x, partials);
    } else {
      extremum_grad_slots<scalar_t, 1>(item, targets, csc_position, grad_out, positions, compact, width, grad_x,
                                       partials);
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> segment_extremum(const at::Tensor& indptr, const at::Tensor& indices,
                                                    const at::Tensor& x, int64_t num_rows, bool is_min,
                                                    bool compact_position, const at::Tensor& tile_row,
                                                    const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                                                    const at::Tensor& heavy_tile_ptr, int64_t tile_edges) {
  const char* op = "gnnio::segment_extremum";
  check_features(op, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const RowSchedule schedule =
      row_schedule(op, indptr, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  check_index_dtype(op, "indices", indices);
  check_array(op, "indices", indices, x, indices.numel());
  check_array(op, "indptr", indptr, x, num_rows + 1);
  // compact_position is the caller's promise that no row has more than 65,536
  // slots (checking it here would cost a device sync).
  const int64_t width = x.size(1);
  at::Tensor out = at::empty({num_rows, width}, x.options());
  at::Tensor positions = at::empty({num_rows, width}, x.options().dtype(compact_position ? at::kShort : at::kInt));
  if (num_rows == 0 || width == 0) return {out, positions};
  at::Tensor partial_values = at::empty({schedule.num_tiles, width}, x.options().dtype(at::kFloat));
  at::Tensor partial_positions = at::empty({schedule.num_tiles, width}, x.options().dtype(at::kInt));
  const float sign = is_min ? -1.f : 1.f;
  auto stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), op, [&] {
    const bool vectorised = rows_vectorisable(x, width, vec_width<scalar_t>()) &&
                            rows_vectorisable(out, width, vec_width<scalar_t>());
    const int64_t blocks = resident_first_pass_blocks(segment_extremum_kernel<scalar_t>, schedule);
    segment_extremum_kernel<scalar_t><<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
        schedule, index_view(indices), x.data_ptr<scalar_t>(), width, vectorised, sign, compact_position,
        out.data_ptr<scalar_t>(), positions.data_ptr(), partial_values.data_ptr<float>(),
        partial_positions.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (schedule.num_heavy > 0) {
      const int threads = static_cast<int>(std::min<int64_t>(256, (width + 31) / 32 * 32));
      merge_extremum_kernel<scalar_t><<<schedule.num_heavy, threads, 0, stream>>>(
          schedule, index_view(indices), partial_values.data_ptr<float>(), partial_positions.data_ptr<int32_t>(),
          width, sign, compact_position, out.data_ptr<scalar_t>(), positions.data_ptr());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {out, positions};
}

at::Tensor segment_extremum_backward(const at::Tensor& csc_indptr, const at::Tensor& csc_indices,
                                     const at::Tensor& csc_position, const at::Tensor& grad_out,
                                     const at::Tensor& position, int64_t num_src, const at::Tensor& tile_row,
                                     const at::Tensor& tile_start, const at::Tensor& heavy_rows,
                                     const at::Tensor& heavy_tile_ptr, int64_t tile_edges) {
  const char* op = "gnnio::segment_extremum_backward";
  check_features(op, "grad_out", grad_out);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const RowSchedule schedule =
      row_schedule(op, csc_indptr, num_src, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  check_index_dtype(op, "csc_indices", csc_indices);
  check_array(op, "csc_indices", csc_indices, grad_out, csc_indices.numel());
  check_array(op, "csc_indptr", csc_indptr, grad_out, num_src + 1);
  GNNIO_CHECK(csc_position.scalar_type() == at::kInt, op, "csc_position must be int32, got ",
              csc_position.scalar_type());
  check_array(op, "csc_position", csc_position, grad_out, csc_indices.numel());
  GNNIO_CHECK(position.scalar_type() == at::kShort || position.scalar_type() == at::kInt, op,
              "position must be int16 or int32 (from segment_extremum), got ", position.scalar_type());
  GNNIO_CHECK(position.sizes() == grad_out.sizes() && position.is_contiguous() && position.device() == grad_out.device(),
              op, "position must be contiguous with grad_out's shape ", grad_out.sizes(), " and device, got shape ",
              position.sizes());
  const int64_t width = grad_out.size(1);
  at::Tensor grad_x = at::empty({num_src, width}, grad_out.options());
  if (num_src == 0 || width == 0) return grad_x;
  at::Tensor partials = at::empty({schedule.num_tiles, width}, grad_out.options().dtype(at::kFloat));
  const bool compact = position.scalar_type() == at::kShort;
  auto stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(grad_out.scalar_type(), op, [&] {
    constexpr int vec = vec_width<scalar_t>();
    const bool vectorised = rows_vectorisable(grad_out, width, vec) && rows_vectorisable(grad_x, width, vec) &&
                            rows_vectorisable(position, width, vec);
    const int64_t blocks = resident_first_pass_blocks(segment_extremum_backward_kernel<scalar_t>, schedule);
    segment_extremum_backward_kernel<scalar_t><<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
        schedule, index_view(csc_indices), csc_position.data_ptr<int32_t>(), grad_out.data_ptr<scalar_t>(),
        position.data_ptr(), compact, width, vectorised, grad_x.data_ptr<scalar_t>(), partials.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  merge_partial_sums(schedule, partials, grad_x);
  return grad_x;
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("segment_extremum", &segment_extremum);
  m.impl("segment_extremum_backward", &segment_extremum_backward);
}

}  // namespace gnnio
