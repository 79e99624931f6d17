// Graph facts: the few numbers the host needs of a graph built on the GPU
// (gnnio_cli/graph/schedule.py), counted in one pass so that a mini-batch's
// graph costs one small read, not a read per number.
//
// graph_facts(csr_indptr, csc_indptr, src, dst, tiles) -> int64 [17]:
//   [0, 6)   CSR rows: max degree, non-empty rows, rows longer than tiles[0]
//            and their tiles (ceil(degree / tiles[0]) each), and the same two
//            counts with every degree + 1 at tiles[1];
//   [6, 12)  the same for the CSC rows at tiles[2] and tiles[3];
//   [12, 17) the edge list src -> dst: min and max source, min and max
//            target, and how many edges have src == dst; zeros without one.
// The counts are exact (integer atomics), so the result is deterministic.

// The structures a layer derives from a graph every mini-batch step, each one
// call (a chain of small torch ops costs the host several microseconds per op,
// and a mini-batch step waits on the host):
//
// append_loops(indptr, indices, eid, num_loops) -> (indptr, indices, eid):
//   one side with the loop (r, r) appended to each row r < num_loops, edge id
//   num_edges + r (graph/compress.py's append_loops);
// row_plan(indptr, tile_edges, heavy_rows, tiles, max_degree)
//   -> (tile_row, tile_start, heavy_rows, heavy_tile_ptr, light_bounds):
//   graph/schedule.py's build_row_plan, its counts given by the graph's facts;
//   its rows by descending degree (ties by row) from a counting sort in three
//   launches where the longest row is short and the rows few (a mini-batch's
//   graph), from a device radix sort otherwise;
// slot_map(to_eid, from_eid) -> int64 [E]: the slot of to_eid holding each
//   slot's edge of from_eid (the CSC slot of each CSR slot).
#include "common.cuh"

namespace gnnio {
namespace graph {

constexpr int kSideWidth = 6;
constexpr int kEdgeFacts = 5;
constexpr int kFactsWidth = 2 * kSideWidth + kEdgeFacts;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void init_facts_kernel(long long* facts) {
  const int i = threadIdx.x;
  if (i >= kFactsWidth) return;
  // the edge list's minima start at the largest value, everything else at 0
  const bool minimum = i == 2 * kSideWidth || i == 2 * kSideWidth + 2;
  facts[i] = minimum ? INT64_MAX : 0;
}

__device__ __forceinline__ long long warp_sum(long long value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullMask, value, offset);
  return value;
}

__device__ __forceinline__ long long warp_max(long long value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value = max(value, __shfl_down_sync(kFullMask, value, offset));
  return value;
}

__device__ __forceinline__ long long warp_min(long long value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value = min(value, __shfl_down_sync(kFullMask, value, offset));
  return value;
}

__global__ void row_facts_kernel(const int64_t* __restrict__ indptr, int64_t rows, int64_t tile0, int64_t tile1,
                                 long long* __restrict__ facts) {
  long long longest = 0, nonempty = 0, heavy0 = 0, tiles0 = 0, heavy1 = 0, tiles1 = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows; row += stride) {
    const long long degree = indptr[row + 1] - indptr[row];
    longest = max(longest, degree);
    nonempty += degree > 0;
    if (degree > tile0) {
      heavy0 += 1;
      tiles0 += (degree + tile0 - 1) / tile0;
    }
    if (degree + 1 > tile1) {
      heavy1 += 1;
      tiles1 += (degree + tile1) / tile1;
    }
  }
  longest = warp_max(longest);
  const long long sums[5] = {warp_sum(nonempty), warp_sum(heavy0), warp_sum(tiles0), warp_sum(heavy1),
                             warp_sum(tiles1)};
  if (threadIdx.x % kWarp == 0) {
    atomicMax(&facts[0], longest);
#pragma unroll
    for (int i = 0; i < 5; ++i)
      if (sums[i] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&facts[1 + i]), static_cast<unsigned long long>(sums[i]));
  }
}

template <typename index_t>
__global__ void edge_facts_kernel(const index_t* __restrict__ src, const index_t* __restrict__ dst, int64_t edges,
                                  long long* __restrict__ facts) {
  long long min_src = INT64_MAX, max_src = INT64_MIN, min_dst = INT64_MAX, max_dst = INT64_MIN, loops = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < edges; e += stride) {
    const long long s = src[e], d = dst[e];
    min_src = min(min_src, s);
    max_src = max(max_src, s);
    min_dst = min(min_dst, d);
    max_dst = max(max_dst, d);
    loops += s == d;
  }
  min_src = warp_min(min_src);
  max_src = warp_max(max_src);
  min_dst = warp_min(min_dst);
  max_dst = warp_max(max_dst);
  loops = warp_sum(loops);
  if (threadIdx.x % kWarp == 0) {
    // the maxima start at 0 (init_facts_kernel): a list whose ids are all negative is refused by its minimum
    atomicMin(&facts[0], min_src);
    atomicMax(&facts[1], max_src);
    atomicMin(&facts[2], min_dst);
    atomicMax(&facts[3], max_dst);
    if (loops != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&facts[4]), static_cast<unsigned long long>(loops));
  }
}

int64_t blocks_for(int64_t items) {
  return std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, (items + kThreads - 1) / kThreads));
}

void check_indptr(const char* op, const char* name, const at::Tensor& indptr) {
  GNNIO_CHECK(indptr.is_cuda() && indptr.scalar_type() == at::kLong && indptr.dim() == 1 && indptr.is_contiguous() &&
                  indptr.numel() >= 1,
              op, name, " must be a contiguous int64 CUDA tensor [rows + 1], got ", indptr.scalar_type(),
              " of shape ", indptr.sizes(), " on ", indptr.device());
}

at::Tensor graph_facts(const at::Tensor& csr_indptr, const at::Tensor& csc_indptr, const c10::optional<at::Tensor>& src,
                       const c10::optional<at::Tensor>& dst, c10::IntArrayRef tiles) {
  const char* op = "gnnio::graph_facts";
  check_indptr(op, "csr_indptr", csr_indptr);
  check_indptr(op, "csc_indptr", csc_indptr);
  GNNIO_CHECK(tiles.size() == 4 && tiles[0] > 0 && tiles[1] > 0 && tiles[2] > 0 && tiles[3] > 0, op,
              "tiles must be 4 positive tile lengths, got ", tiles);
  GNNIO_CHECK(src.has_value() == dst.has_value(), op, "src and dst must be given together");
  const c10::cuda::CUDAGuard guard(csr_indptr.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor facts = at::empty({kFactsWidth}, csr_indptr.options());
  auto* out = reinterpret_cast<long long*>(facts.data_ptr<int64_t>());
  init_facts_kernel<<<1, kWarp, 0, stream>>>(out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor* sides[2] = {&csr_indptr, &csc_indptr};
  for (int side = 0; side < 2; ++side) {
    const int64_t rows = sides[side]->numel() - 1;
    if (rows == 0) continue;
    row_facts_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(sides[side]->data_ptr<int64_t>(), rows,
                                                                 tiles[2 * side], tiles[2 * side + 1],
                                                                 out + side * kSideWidth);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (src.has_value() && src->numel() > 0) {
    const at::Tensor& s = *src;
    const at::Tensor& d = *dst;
    GNNIO_CHECK(s.device() == csr_indptr.device() && d.device() == csr_indptr.device(), op,
                "src and dst must be on the indptrs' device ", csr_indptr.device());
    GNNIO_CHECK(s.dim() == 1 && d.dim() == 1 && s.numel() == d.numel() && s.scalar_type() == d.scalar_type(), op,
                "src and dst must be 1-d of one length and dtype, got ", s.sizes(), " ", s.scalar_type(), " and ",
                d.sizes(), " ", d.scalar_type());
    check_index_dtype(op, "src", s);
    const at::Tensor sc = s.contiguous(), dc = d.contiguous();
    const int64_t edges = sc.numel();
    if (sc.scalar_type() == at::kLong) {
      edge_facts_kernel<int64_t><<<blocks_for(edges), kThreads, 0, stream>>>(
          sc.data_ptr<int64_t>(), dc.data_ptr<int64_t>(), edges, out + 2 * kSideWidth);
    } else {
      edge_facts_kernel<int32_t><<<blocks_for(edges), kThreads, 0, stream>>>(
          sc.data_ptr<int32_t>(), dc.data_ptr<int32_t>(), edges, out + 2 * kSideWidth);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    // no edge list: its five entries read 0
    facts.narrow(0, 2 * kSideWidth, kEdgeFacts).zero_();
  }
  return facts;
}

// ------------------------------------------------------------ derived structures
// One warp per row: the row's slots move down by the loops of the rows before it, then its own loop; the
// row's new start likewise (and the end, by the last row's warp).
template <typename index_t>
__global__ void append_loops_kernel(const int64_t* __restrict__ indptr, const index_t* __restrict__ indices,
                                    const int64_t* __restrict__ eid, int64_t rows, int64_t num_loops,
                                    int64_t num_edges, int64_t* __restrict__ new_indptr,
                                    index_t* __restrict__ new_indices, int64_t* __restrict__ new_eid) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; row < rows;
       row += warps) {
    const int64_t begin = indptr[row], end = indptr[row + 1], shift = min(row, num_loops);
    if (lane == 0) {
      new_indptr[row] = begin + shift;
      if (row == rows - 1) new_indptr[rows] = end + min(rows, num_loops);
    }
    for (int64_t slot = begin + lane; slot < end; slot += kWarp) {
      new_indices[slot + shift] = indices[slot];
      new_eid[slot + shift] = eid[slot];
    }
    if (lane == 0 && row < num_loops) {
      new_indices[end + row] = static_cast<index_t>(row);
      new_eid[end + row] = num_edges + row;
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> append_loops(const at::Tensor& indptr, const at::Tensor& indices,
                                                            const at::Tensor& eid, int64_t num_loops) {
  const char* op = "gnnio::append_loops";
  check_indptr(op, "indptr", indptr);
  const int64_t rows = indptr.numel() - 1, edges = indices.numel();
  GNNIO_CHECK(num_loops >= 0 && num_loops <= rows, op, "num_loops must be in [0, ", rows, "], got ", num_loops);
  check_index_dtype(op, "indices", indices);
  GNNIO_CHECK(indices.device() == indptr.device() && indices.dim() == 1 && indices.is_contiguous(), op,
              "indices must be a contiguous 1-d tensor on ", indptr.device());
  GNNIO_CHECK(eid.device() == indptr.device() && eid.scalar_type() == at::kLong && eid.dim() == 1 &&
                  eid.is_contiguous() && eid.numel() == edges,
              op, "eid must be a contiguous int64 tensor [", edges, "] on ", indptr.device(), ", got ",
              eid.scalar_type(), " of shape ", eid.sizes());
  const c10::cuda::CUDAGuard guard(indptr.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor new_indptr = at::empty_like(indptr);
  at::Tensor new_indices = at::empty({edges + num_loops}, indices.options());
  at::Tensor new_eid = at::empty({edges + num_loops}, eid.options());
  if (rows == 0) return {new_indptr.copy_(indptr), new_indices, new_eid};  // no rows: no slots, no loops
  const int64_t blocks = blocks_for(rows * kWarp);
  if (indices.scalar_type() == at::kLong) {
    append_loops_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), eid.data_ptr<int64_t>(), rows, num_loops, edges,
        new_indptr.data_ptr<int64_t>(), new_indices.data_ptr<int64_t>(), new_eid.data_ptr<int64_t>());
  } else {
    append_loops_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int32_t>(), eid.data_ptr<int64_t>(), rows, num_loops, edges,
        new_indptr.data_ptr<int64_t>(), new_indices.data_ptr<int32_t>(), new_eid.data_ptr<int64_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {new_indptr, new_indices, new_eid};
}

template <typename key_t>
__global__ void degree_keys_kernel(const int64_t* __restrict__ indptr, int64_t rows, key_t* __restrict__ keys) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows; row += stride)
    keys[row] = static_cast<key_t>(indptr[row + 1] - indptr[row]);
}

// light_bounds[i] = (row, first slot, end slot) of the i-th light row in the order
__global__ void light_bounds_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ light,
                                    int64_t count, int64_t* __restrict__ bounds) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = light[i];
    bounds[3 * i] = row;
    bounds[3 * i + 1] = indptr[row];
    bounds[3 * i + 2] = indptr[row + 1];
  }
}

__global__ void heavy_tiles_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ heavy,
                                   int64_t count, int64_t tile_edges, int64_t* __restrict__ tiles_per_row) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = heavy[i];
    tiles_per_row[i] = (indptr[row + 1] - indptr[row] + tile_edges - 1) / tile_edges;
  }
}

// One warp per heavy row writes its tiles' row and first slot.
__global__ void fill_tiles_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ heavy,
                                  const int64_t* __restrict__ heavy_tile_ptr, int64_t count, int64_t tile_edges,
                                  int64_t* __restrict__ tile_row, int64_t* __restrict__ tile_start) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < count; i += warps) {
    const int64_t row = heavy[i], first = heavy_tile_ptr[i], last = heavy_tile_ptr[i + 1];
    for (int64_t tile = first + lane; tile < last; tile += kWarp) {
      tile_row[tile] = row;
      tile_start[tile] = indptr[row] + (tile - first) * tile_edges;
    }
  }
}

// The counting sort of the rows by descending degree (ties by row), where max_degree < kCountingBins and
// rows <= kCountingMaxRows: the histogram of each chunk of kChunkRows rows, the position of each (degree,
// chunk) pair, then a stable scatter. Its launches replace a radix sort's (a dozen with the id fill and the
// key copy), which a mini-batch step pays on the host for every new graph.
constexpr int64_t kCountingBins = 1024;
constexpr int64_t kCountingMaxRows = int64_t{1} << 22;
constexpr int kChunkRows = 1024;

__device__ __forceinline__ int64_t row_degree_bin(const int64_t* __restrict__ indptr, int64_t row, int bins) {
  // max_degree bounds every degree (the graph's facts); the clamp only keeps a wrong bound inside the counts
  return min(indptr[row + 1] - indptr[row], static_cast<int64_t>(bins - 1));
}

// counts[bin * chunks + chunk]: rows of the chunk with degree bin
__global__ void degree_histogram_kernel(const int64_t* __restrict__ indptr, int64_t rows, int bins, int64_t chunks,
                                        int64_t* __restrict__ counts) {
  __shared__ int hist[kCountingBins];
  for (int bin = threadIdx.x; bin < bins; bin += blockDim.x) hist[bin] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkRows, end = min(rows, begin + kChunkRows);
  for (int64_t row = begin + threadIdx.x; row < end; row += blockDim.x) atomicAdd(&hist[row_degree_bin(indptr, row, bins)], 1);
  __syncthreads();
  for (int bin = threadIdx.x; bin < bins; bin += blockDim.x) counts[bin * chunks + blockIdx.x] = hist[bin];
}

// One block: counts become the first position of each (degree, chunk) pair in the descending order, i.e.
// the rows of every larger degree, then this degree's rows in the chunks before.
__global__ void degree_positions_kernel(int64_t* __restrict__ counts, int bins, int64_t chunks) {
  __shared__ int64_t totals[kCountingBins];
  for (int bin = threadIdx.x; bin < bins; bin += blockDim.x) {
    int64_t running = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t count = counts[bin * chunks + chunk];
      counts[bin * chunks + chunk] = running;
      running += count;
    }
    totals[bin] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // at most kCountingBins sums: the larger degrees' rows come first
    int64_t before = 0;
    for (int bin = bins - 1; bin >= 0; --bin) {
      const int64_t total = totals[bin];
      totals[bin] = before;
      before += total;
    }
  }
  __syncthreads();
  for (int bin = threadIdx.x; bin < bins; bin += blockDim.x)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) counts[bin * chunks + chunk] += totals[bin];
}

// One warp per chunk takes its rows in order, 32 at a time: rows of one degree get consecutive positions
// in row order (a stable sort). Position p < heavy_rows is a heavy row; the others are light rows, written
// with their bounds as light_bounds_kernel writes them.
__global__ void degree_scatter_kernel(const int64_t* __restrict__ indptr, int64_t rows, int bins, int64_t chunks,
                                      const int64_t* __restrict__ positions, int64_t heavy_rows,
                                      int64_t* __restrict__ heavy, int64_t* __restrict__ bounds) {
  __shared__ int64_t cursor[kCountingBins];
  const int lane = threadIdx.x;
  for (int bin = lane; bin < bins; bin += kWarp) cursor[bin] = positions[bin * chunks + blockIdx.x];
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkRows, end = min(rows, begin + kChunkRows);
  const unsigned lanes_before = (1u << lane) - 1u;
  for (int64_t first = begin; first < end; first += kWarp) {
    const int64_t row = first + lane;
    const bool active = row < end;
    const int bin = active ? static_cast<int>(row_degree_bin(indptr, row, bins)) : -1 - lane;  // idle lanes alone
    const unsigned peers = __match_any_sync(kFullMask, bin);
    if (active) {
      const int64_t position = cursor[bin] + __popc(peers & lanes_before);
      if (position < heavy_rows) {
        heavy[position] = row;
      } else {
        int64_t* out = bounds + 3 * (position - heavy_rows);
        out[0] = row;
        out[1] = indptr[row];
        out[2] = indptr[row + 1];
      }
    }
    __syncwarp();
    if (active && lane == __ffs(peers) - 1) cursor[bin] += __popc(peers);
    __syncwarp();
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> row_plan(const at::Tensor& indptr,
                                                                                int64_t tile_edges, int64_t heavy_rows,
                                                                                int64_t tiles, int64_t max_degree) {
  const char* op = "gnnio::row_plan";
  check_indptr(op, "indptr", indptr);
  const int64_t rows = indptr.numel() - 1;
  GNNIO_CHECK(tile_edges > 0 && heavy_rows >= 0 && heavy_rows <= rows && tiles >= heavy_rows && max_degree >= 0, op,
              "needs tile_edges > 0, 0 <= heavy_rows <= rows (", rows, ") and tiles >= heavy_rows, got ", tile_edges,
              ", ", heavy_rows, ", ", tiles);
  const c10::cuda::CUDAGuard guard(indptr.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor heavy, bounds;
  if (rows > 0 && max_degree < kCountingBins && rows <= kCountingMaxRows) {
    const int bins = static_cast<int>(max_degree + 1);
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    at::Tensor positions = at::empty({bins * chunks}, indptr.options());
    heavy = at::empty({heavy_rows}, indptr.options());
    bounds = at::empty({rows - heavy_rows, 3}, indptr.options());
    degree_histogram_kernel<<<chunks, kThreads, 0, stream>>>(indptr.data_ptr<int64_t>(), rows, bins, chunks,
                                                             positions.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    degree_positions_kernel<<<1, static_cast<int>(kCountingBins), 0, stream>>>(positions.data_ptr<int64_t>(), bins,
                                                                              chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    degree_scatter_kernel<<<chunks, kWarp, 0, stream>>>(indptr.data_ptr<int64_t>(), rows, bins, chunks,
                                                        positions.data_ptr<int64_t>(), heavy_rows,
                                                        heavy.data_ptr<int64_t>(), bounds.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    // A stable sort by descending degree on the narrowest key: a radix sort makes one pass per key byte.
    const at::ScalarType key_type =
        max_degree < (int64_t{1} << 15) ? at::kShort : (max_degree < (int64_t{1} << 31) ? at::kInt : at::kLong);
    at::Tensor keys = at::empty({rows}, indptr.options().dtype(key_type));
    if (rows > 0) {
      const int64_t* degrees_of = indptr.data_ptr<int64_t>();
      if (key_type == at::kShort) {
        degree_keys_kernel<int16_t><<<blocks_for(rows), kThreads, 0, stream>>>(degrees_of, rows, keys.data_ptr<int16_t>());
      } else if (key_type == at::kInt) {
        degree_keys_kernel<int32_t><<<blocks_for(rows), kThreads, 0, stream>>>(degrees_of, rows, keys.data_ptr<int32_t>());
      } else {
        degree_keys_kernel<int64_t><<<blocks_for(rows), kThreads, 0, stream>>>(degrees_of, rows, keys.data_ptr<int64_t>());
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const at::Tensor by_degree = std::get<1>(at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/true));
    heavy = by_degree.narrow(0, 0, heavy_rows).contiguous();
    const at::Tensor light = by_degree.narrow(0, heavy_rows, rows - heavy_rows);
    bounds = at::empty({rows - heavy_rows, 3}, indptr.options());
    if (light.numel() > 0) {
      light_bounds_kernel<<<blocks_for(light.numel()), kThreads, 0, stream>>>(
          indptr.data_ptr<int64_t>(), light.data_ptr<int64_t>(), light.numel(), bounds.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  at::Tensor heavy_tile_ptr = at::zeros({heavy_rows + 1}, indptr.options());
  at::Tensor tile_row = at::empty({heavy_rows ? tiles : 0}, indptr.options());
  at::Tensor tile_start = at::empty({heavy_rows ? tiles : 0}, indptr.options());
  if (heavy_rows > 0) {
    at::Tensor tiles_per_row = at::empty({heavy_rows}, indptr.options());
    heavy_tiles_kernel<<<blocks_for(heavy_rows), kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), heavy.data_ptr<int64_t>(), heavy_rows, tile_edges, tiles_per_row.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor running = heavy_tile_ptr.narrow(0, 1, heavy_rows);
    at::cumsum_out(running, tiles_per_row, 0);
    fill_tiles_kernel<<<blocks_for(heavy_rows * kWarp), kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), heavy.data_ptr<int64_t>(), heavy_tile_ptr.data_ptr<int64_t>(), heavy_rows,
        tile_edges, tile_row.data_ptr<int64_t>(), tile_start.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {tile_row, tile_start, heavy, heavy_tile_ptr, bounds};
}

__global__ void slot_of_eid_kernel(const int64_t* __restrict__ eid, int64_t edges, int64_t* __restrict__ slot_of) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; slot < edges; slot += stride)
    slot_of[eid[slot]] = slot;
}

__global__ void gather_slots_kernel(const int64_t* __restrict__ slot_of, const int64_t* __restrict__ eid,
                                    int64_t edges, int64_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; slot < edges; slot += stride)
    out[slot] = slot_of[eid[slot]];
}

at::Tensor slot_map(const at::Tensor& to_eid, const at::Tensor& from_eid) {
  const char* op = "gnnio::slot_map";
  for (const at::Tensor* t : {&to_eid, &from_eid})
    GNNIO_CHECK(t->is_cuda() && t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(), op,
                "edge ids must be contiguous int64 CUDA tensors [E], got ", t->scalar_type(), " of shape ", t->sizes());
  GNNIO_CHECK(to_eid.numel() == from_eid.numel() && to_eid.device() == from_eid.device(), op,
              "both edge id lists must have one length and device, got ", to_eid.numel(), " and ", from_eid.numel());
  const c10::cuda::CUDAGuard guard(to_eid.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t edges = to_eid.numel();
  at::Tensor slot_of = at::empty_like(to_eid), out = at::empty_like(from_eid);
  if (edges > 0) {
    slot_of_eid_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(to_eid.data_ptr<int64_t>(), edges,
                                                                  slot_of.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    gather_slots_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(slot_of.data_ptr<int64_t>(),
                                                                   from_eid.data_ptr<int64_t>(), edges,
                                                                   out.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace graph
}  // namespace gnnio

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("graph_facts(Tensor csr_indptr, Tensor csc_indptr, Tensor? src, Tensor? dst, int[] tiles) -> Tensor");
  m.def("append_loops(Tensor indptr, Tensor indices, Tensor eid, int num_loops) -> (Tensor, Tensor, Tensor)");
  m.def("row_plan(Tensor indptr, int tile_edges, int heavy_rows, int tiles, int max_degree) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("slot_map(Tensor to_eid, Tensor from_eid) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("graph_facts", &gnnio::graph::graph_facts);
  m.impl("append_loops", &gnnio::graph::append_loops);
  m.impl("row_plan", &gnnio::graph::row_plan);
  m.impl("slot_map", &gnnio::graph::slot_map);
}
