// Neighbour sampling of one mini-batch on the GPU (gnnio_cli/loader/sample.py drives these ops hop by
// hop; its numba kernels are the CPU twin, draw for draw).
//
// The base graph is its CSR (indptr int64 [N + 1], indices int32/int64 [E]: a row per target, its
// in-neighbours; eid int64 [E]). A node table (int64 [N], kEmpty where a node is not in the batch)
// maps global ids to the batch's local ids; it lives as long as the loader and each batch resets the
// entries it touched (sample_relabel).
//
// sample_seeds(table!, seeds, indptr, fanout, replace) -> counts int64 [B]
//   table[seeds[i]] = i (the first position of a seed listed twice); counts: each seed's picks.
// sample_neighbors(indptr, indices, eid, frontier, ends, num_picks, fanout, replace, key)
//   -> (sources int64 [num_picks], eids int64 [num_picks])
//   node frontier[i] writes its picks to [ends[i] - count, ends[i]) in CSR slot order: the global id of
//   each pick's source and the base graph's edge id. One thread per frontier node.
// sample_first_seen(table!, sources, indptr, next_fanout, replace) -> marks int64 [2, E]
//   marks[0][e] = 1 where edge e is the first (lowest e) to reach a node not in the batch yet;
//   marks[1][e] = that node's pick count at the next hop (next_fanout 0: no next hop), else 0.
//   The table is left holding claims kClaim + e for those nodes; sample_assign replaces each one.
// sample_assign(table!, sources, cumulative, first_local, num_new) -> (new_nodes [num_new],
//   next_ends [num_new]): with cumulative = marks.cumsum(1), the new node of edge e takes local id
//   first_local + cumulative[0][e] - 1 and ends its next-hop picks at cumulative[1][e].
// sample_relabel(table!, sources, n_id) -> local int64 [E]: table[sources[e]]; then the entries of n_id
//   are reset to kEmpty.
//
// Random bits (mix, draw_below, pick_row) are gnnio_cli/loader/sample.py's: the draw i of node v at a
// hop of key K is mix(mix(K ^ v) ^ i), an integer below n its high 64-bit product with n. The order of
// new nodes comes from claims (atomicMin of an edge position), so it never depends on thread timing.

#include "common.cuh"

namespace gnnio {
namespace sample {

constexpr int64_t kEmpty = INT64_MAX;
// A claim is kClaim + the claiming edge's position: above every local id, below kEmpty, so an
// atomicMin claims an empty entry and leaves a node already in the batch alone.
constexpr int64_t kClaim = int64_t{1} << 62;
constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t mix(uint64_t bits) {
  bits += 0x9E3779B97F4A7C15ull;
  bits = (bits ^ (bits >> 30)) * 0xBF58476D1CE4E5B9ull;
  bits = (bits ^ (bits >> 27)) * 0x94D049BB133111EBull;
  return bits ^ (bits >> 31);
}

// an integer in [0, bound): the high 64 bits of the 128-bit product
__device__ __forceinline__ int64_t draw_below(uint64_t bits, int64_t bound) {
  return static_cast<int64_t>(__umul64hi(bits, static_cast<uint64_t>(bound)));
}

__device__ __forceinline__ int64_t pick_count(int64_t degree, int64_t fanout, bool replace) {
  if (fanout < 0) return degree;
  if (replace) return degree > 0 ? fanout : 0;
  return min(fanout, degree);
}

// The node's `count` picks (slots of its row, 0 .. degree - 1) in ascending order: every slot, k draws
// with replacement, or Floyd's k distinct slots (draw t in [0, last]; take t, or last, which is larger
// than every pick so far, when t is taken). The picks are kept sorted by insertion: k is a fan-out,
// a few dozen at most, so the quadratic steps stay in L1.
__device__ void pick_row(int64_t* picks, int64_t degree, int64_t count, int64_t fanout, bool replace,
                         uint64_t key, int64_t node) {
  if (fanout < 0 || (!replace && count == degree)) {
    for (int64_t i = 0; i < count; ++i) picks[i] = i;
    return;
  }
  const uint64_t node_key = mix(key ^ static_cast<uint64_t>(node));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t last = degree - count + i;
    const int64_t slot = draw_below(mix(node_key ^ static_cast<uint64_t>(i)), replace ? degree : last + 1);
    int64_t position = i;
    while (position > 0 && picks[position - 1] > slot) --position;
    if (!replace && position > 0 && picks[position - 1] == slot) {
      picks[i] = last;
      continue;
    }
    for (int64_t moved = i; moved > position; --moved) picks[moved] = picks[moved - 1];
    picks[position] = slot;
  }
}

__global__ void seeds_kernel(long long* __restrict__ table, const int64_t* __restrict__ seeds, int64_t num_seeds,
                             const int64_t* __restrict__ indptr, int64_t fanout, bool replace,
                             int64_t* __restrict__ counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_seeds) return;
  const int64_t node = seeds[i];
  atomicMin(&table[node], static_cast<long long>(i));
  counts[i] = pick_count(indptr[node + 1] - indptr[node], fanout, replace);
}

__global__ void neighbors_kernel(const int64_t* __restrict__ indptr, IndexView indices,
                                 const int64_t* __restrict__ eid, const int64_t* __restrict__ frontier,
                                 const int64_t* __restrict__ ends, int64_t num_frontier, int64_t fanout,
                                 bool replace, uint64_t key, int64_t* __restrict__ sources,
                                 int64_t* __restrict__ eids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_frontier) return;
  const int64_t node = frontier[i];
  const int64_t row = indptr[node];
  const int64_t degree = indptr[node + 1] - row;
  const int64_t count = pick_count(degree, fanout, replace);
  const int64_t start = ends[i] - count;
  // the picks go to the edge ids' place first, each replaced by its edge id below
  int64_t* picks = eids + start;
  pick_row(picks, degree, count, fanout, replace, key, node);
  for (int64_t c = 0; c < count; ++c) {
    const int64_t slot = row + picks[c];
    sources[start + c] = indices[slot];
    picks[c] = eid[slot];
  }
}

__global__ void claim_kernel(long long* __restrict__ table, const int64_t* __restrict__ sources, int64_t edges) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < edges) atomicMin(&table[sources[e]], static_cast<long long>(kClaim + e));
}

__global__ void mark_kernel(const long long* __restrict__ table, const int64_t* __restrict__ sources,
                            int64_t edges, const int64_t* __restrict__ indptr, int64_t next_fanout, bool replace,
                            int64_t* __restrict__ marks) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= edges) return;
  const int64_t node = sources[e];
  const bool first = table[node] == kClaim + e;
  marks[e] = first;
  marks[edges + e] = first ? pick_count(indptr[node + 1] - indptr[node], next_fanout, replace) : 0;
}

__global__ void assign_kernel(long long* __restrict__ table, const int64_t* __restrict__ sources, int64_t edges,
                              const int64_t* __restrict__ cumulative, int64_t first_local,
                              int64_t* __restrict__ new_nodes, int64_t* __restrict__ next_ends) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= edges) return;
  const int64_t node = sources[e];
  // only edge e's thread may hold this claim; the others compare with their own and move on
  if (table[node] != kClaim + e) return;
  const int64_t position = cumulative[e] - 1;
  table[node] = first_local + position;
  new_nodes[position] = node;
  next_ends[position] = cumulative[edges + e];
}

__global__ void relabel_kernel(const long long* __restrict__ table, const int64_t* __restrict__ sources,
                               int64_t edges, int64_t* __restrict__ local) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < edges) local[e] = table[sources[e]];
}

__global__ void reset_kernel(long long* __restrict__ table, const int64_t* __restrict__ nodes, int64_t num_nodes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < num_nodes) table[nodes[i]] = kEmpty;
}

int64_t blocks_for(int64_t items) { return (items + kThreads - 1) / kThreads; }

long long* table_data(const at::Tensor& table) { return reinterpret_cast<long long*>(table.data_ptr<int64_t>()); }

// A contiguous 1-d int64 CUDA tensor on `device` (numel < 0: any length).
void check_ids(const char* op, const char* name, const at::Tensor& t, const c10::Device& device,
               int64_t numel = -1) {
  GNNIO_CHECK(t.is_cuda() && t.device() == device, op, name, " must be on ", device, ", got ", t.device());
  GNNIO_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(), op, name,
              " must be a contiguous 1-d int64 tensor, got ", t.scalar_type(), " of shape ", t.sizes());
  GNNIO_CHECK(numel < 0 || t.numel() == numel, op, name, " must have ", numel, " entries, got ", t.numel());
}

void check_table(const char* op, const at::Tensor& table, const at::Tensor& indptr) {
  GNNIO_CHECK(indptr.is_cuda(), op, "indptr must be a CUDA tensor, got ", indptr.device());
  check_ids(op, "indptr", indptr, indptr.device());
  check_ids(op, "table", table, indptr.device(), indptr.numel() - 1);
}

at::Tensor sample_seeds(at::Tensor& table, const at::Tensor& seeds, const at::Tensor& indptr, int64_t fanout,
                        bool replace) {
  const char* op = "gnnio::sample_seeds";
  check_table(op, table, indptr);
  check_ids(op, "seeds", seeds, indptr.device());
  const c10::cuda::CUDAGuard guard(indptr.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor counts = at::empty_like(seeds);
  const int64_t num_seeds = seeds.numel();
  if (num_seeds == 0) return counts;
  seeds_kernel<<<blocks_for(num_seeds), kThreads, 0, stream>>>(table_data(table), seeds.data_ptr<int64_t>(),
                                                                num_seeds, indptr.data_ptr<int64_t>(), fanout,
                                                                replace, counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return counts;
}

std::tuple<at::Tensor, at::Tensor> sample_neighbors(const at::Tensor& indptr, const at::Tensor& indices,
                                                    const at::Tensor& eid, const at::Tensor& frontier,
                                                    const at::Tensor& ends, int64_t num_picks, int64_t fanout,
                                                    bool replace, int64_t key) {
  const char* op = "gnnio::sample_neighbors";
  GNNIO_CHECK(indptr.is_cuda(), op, "indptr must be a CUDA tensor, got ", indptr.device());
  const c10::Device device = indptr.device();
  check_ids(op, "indptr", indptr, device);
  GNNIO_CHECK(indices.device() == device && indices.dim() == 1 && indices.is_contiguous(), op,
              "indices must be a contiguous 1-d tensor on ", device, ", got shape ", indices.sizes(), " on ",
              indices.device());
  check_index_dtype(op, "indices", indices);
  check_ids(op, "eid", eid, device, indices.numel());
  check_ids(op, "frontier", frontier, device);
  check_ids(op, "ends", ends, device, frontier.numel());
  GNNIO_CHECK(num_picks >= 0, op, "num_picks must be >= 0, got ", num_picks);
  GNNIO_CHECK(fanout > 0 || fanout == -1, op, "fanout must be > 0 or -1, got ", fanout);
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor sources = at::empty({num_picks}, indptr.options());
  at::Tensor eids = at::empty({num_picks}, indptr.options());
  const int64_t num_frontier = frontier.numel();
  if (num_frontier == 0 || num_picks == 0) return {sources, eids};
  neighbors_kernel<<<blocks_for(num_frontier), kThreads, 0, stream>>>(
      indptr.data_ptr<int64_t>(), index_view(indices), eid.data_ptr<int64_t>(), frontier.data_ptr<int64_t>(),
      ends.data_ptr<int64_t>(), num_frontier, fanout, replace, static_cast<uint64_t>(key),
      sources.data_ptr<int64_t>(), eids.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {sources, eids};
}

at::Tensor sample_first_seen(at::Tensor& table, const at::Tensor& sources, const at::Tensor& indptr,
                             int64_t next_fanout, bool replace) {
  const char* op = "gnnio::sample_first_seen";
  check_table(op, table, indptr);
  check_ids(op, "sources", sources, indptr.device());
  GNNIO_CHECK(next_fanout >= -1, op, "next_fanout must be >= -1, got ", next_fanout);
  const c10::cuda::CUDAGuard guard(indptr.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t edges = sources.numel();
  at::Tensor marks = at::empty({2, edges}, sources.options());
  if (edges == 0) return marks;
  // two launches: every claim must land before any edge asks whether it won
  claim_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(table_data(table), sources.data_ptr<int64_t>(), edges);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  mark_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(table_data(table), sources.data_ptr<int64_t>(), edges,
                                                          indptr.data_ptr<int64_t>(), next_fanout, replace,
                                                          marks.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return marks;
}

std::tuple<at::Tensor, at::Tensor> sample_assign(at::Tensor& table, const at::Tensor& sources,
                                                 const at::Tensor& cumulative, int64_t first_local,
                                                 int64_t num_new) {
  const char* op = "gnnio::sample_assign";
  GNNIO_CHECK(table.is_cuda(), op, "table must be a CUDA tensor, got ", table.device());
  const c10::Device device = table.device();
  check_ids(op, "table", table, device);
  check_ids(op, "sources", sources, device);
  const int64_t edges = sources.numel();
  GNNIO_CHECK(cumulative.device() == device && cumulative.scalar_type() == at::kLong && cumulative.dim() == 2 &&
                  cumulative.size(0) == 2 && cumulative.size(1) == edges && cumulative.is_contiguous(),
              op, "cumulative must be a contiguous int64 [2, ", edges, "] tensor on ", device, ", got ",
              cumulative.scalar_type(), " of shape ", cumulative.sizes(), " on ", cumulative.device());
  GNNIO_CHECK(first_local >= 0 && num_new >= 0 && num_new <= edges, op,
              "first_local must be >= 0 and num_new in [0, ", edges, "], got ", first_local, " and ", num_new);
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor new_nodes = at::empty({num_new}, sources.options());
  at::Tensor next_ends = at::empty({num_new}, sources.options());
  if (edges == 0) return {new_nodes, next_ends};
  assign_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(table_data(table), sources.data_ptr<int64_t>(), edges,
                                                            cumulative.data_ptr<int64_t>(), first_local,
                                                            new_nodes.data_ptr<int64_t>(),
                                                            next_ends.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {new_nodes, next_ends};
}

at::Tensor sample_relabel(at::Tensor& table, const at::Tensor& sources, const at::Tensor& n_id) {
  const char* op = "gnnio::sample_relabel";
  GNNIO_CHECK(table.is_cuda(), op, "table must be a CUDA tensor, got ", table.device());
  const c10::Device device = table.device();
  check_ids(op, "table", table, device);
  check_ids(op, "sources", sources, device);
  check_ids(op, "n_id", n_id, device);
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t edges = sources.numel(), num_nodes = n_id.numel();
  at::Tensor local = at::empty_like(sources);
  if (edges > 0) {
    relabel_kernel<<<blocks_for(edges), kThreads, 0, stream>>>(table_data(table), sources.data_ptr<int64_t>(), edges,
                                                               local.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (num_nodes > 0) {
    // after every lookup above (same stream): the table is ready for the next batch
    reset_kernel<<<blocks_for(num_nodes), kThreads, 0, stream>>>(table_data(table), n_id.data_ptr<int64_t>(),
                                                                 num_nodes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return local;
}

}  // namespace sample
}  // namespace gnnio

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("sample_seeds(Tensor(a!) table, Tensor seeds, Tensor indptr, int fanout, bool replace) -> Tensor");
  m.def(
      "sample_neighbors(Tensor indptr, Tensor indices, Tensor eid, Tensor frontier, Tensor ends, int num_picks, "
      "int fanout, bool replace, int key) -> (Tensor, Tensor)");
  m.def(
      "sample_first_seen(Tensor(a!) table, Tensor sources, Tensor indptr, int next_fanout, bool replace) -> Tensor");
  m.def(
      "sample_assign(Tensor(a!) table, Tensor sources, Tensor cumulative, int first_local, int num_new) "
      "-> (Tensor, Tensor)");
  m.def("sample_relabel(Tensor(a!) table, Tensor sources, Tensor n_id) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("sample_seeds", &gnnio::sample::sample_seeds);
  m.impl("sample_neighbors", &gnnio::sample::sample_neighbors);
  m.impl("sample_first_seen", &gnnio::sample::sample_first_seen);
  m.impl("sample_assign", &gnnio::sample::sample_assign);
  m.impl("sample_relabel", &gnnio::sample::sample_relabel);
}
