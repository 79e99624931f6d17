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

}  // namespace graph
}  // namespace gnnio

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("graph_facts(Tensor csr_indptr, Tensor csc_indptr, Tensor? src, Tensor? dst, int[] tiles) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) { m.impl("graph_facts", &gnnio::graph::graph_facts); }
