// Node-level kernels beside the edge passes: row dots (delta from the saved
// output, with the output bias's gradient), row norms and F.normalize's
// backward (AGNN), and their host-side launches.
#pragma once

#include "device.cuh"

#include <cmath>

namespace gnnio {
namespace attention {
namespace {

// ------------------------------------------------- Cosine's node-level work
// AGNN's rows before and after the edge kernels, lanes striding over the
// channels of each (node, head) row (coalesced; any C). With
// n = |x|, m = max(n, floor), a = (n >= floor), u = x / m (in fp32):
//   forward:  n (fp32) in one read of x (row_dots_kernel's NORMS form);
//   backward: grad_x = direct + (g - a * <g, u> * u) / m, g = g1 (+ g2),
// which is d(x / max(|x|, floor))/dx applied to g (F.normalize's backward,
// clamp_min's mask included), plus the message path's gradient `direct`:
// the message is x itself, so its gradient reaches x as is.
// One pass each instead of torch's chain of N x C temporaries.

// dots[r] = <a[r], b[r] - offset[r % heads] - residual[r]> per (node, head)
// row in fp32: GAT's and Dot's delta = <g_t, out_t> from the saved output
// (less the output bias and the residual the forward added, when it did),
// before their source pass.
// With lse (fp32 [rows]) the rows' softmax statistics come out instead:
// dots[2r] = lse[r], dots[2r + 1] = the dot, the (lse, delta) pairs the
// source pass gathers per edge, without a separate pass stacking them.
// NORMS: (dots[2r], dots[2r + 1]) = (|a[r]|, 1 / max(|a[r]|, floor))
// instead (b and offset unused), Cosine's row norms and the inverses its
// edge passes multiply by.
//
// Each lane reads whole chunks of VEC elements (16 bytes where the rows are
// 16-byte aligned and C % VEC == 0, else VEC 1), `lanes` lanes per row
// (lanes_per_edge of its chunks), so one load round of the warp covers
// 32 / lanes rows; each warp issues kDotRowsPerWarp such rounds before its
// first sum: with one row per warp the loads in flight were too few (H100,
// rmat20 4 x 32: 0.63 ms for 1 GiB read), and one element per lane read only
// 64 bytes per warp and load in bf16 (the norms of a bf16 1 x 128 x on
// rmat20: 0.24 ms for 256 MiB, slower than fp32's 512 MiB at 0.19 ms; 0.12
// ms in 16-byte chunks).
constexpr int kDotRowsPerWarp = 8;
constexpr int kMaxBiasChannels = kWarp;

// The VEC-element chunks at `channel` of a lane's kDotRowsPerWarp rows (first, first + step, ...),
// zeros past the last row, all loaded before any is used. Why: with each row's loads behind the
// previous row's checks and sums, the compiler kept one row's loads in flight per warp. H100,
// rmat20 4 x 32 fp32 (run 183-184): the Transformer's delta (1.5 GiB read) 0.617 -> 0.584 ms with
// row_dots_kernel's loop, GATConv's delta and bias gradient (1 GiB) 0.507 -> 0.452 ms.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void load_row_chunks(const scalar_t* __restrict__ base, int64_t first, int step,
                                                int64_t rows, int channels, int channel,
                                                Vec<scalar_t, VEC> (&chunks)[kDotRowsPerWarp]) {
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    const int64_t row = first + static_cast<int64_t>(r) * step;
    chunks[r] = row < rows ? load_vec<scalar_t, VEC>(base + row * channels + channel) : Vec<scalar_t, VEC>{};
  }
}

// One group of a lane's rows (first, first + 32 / lanes, ...: kDotRowsPerWarp of them), see row_dots_kernel.
template <typename scalar_t, int VEC, bool NORMS>
__device__ __forceinline__ void row_dots_group(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                               const scalar_t* __restrict__ offset,
                                               const scalar_t* __restrict__ residual, const float* __restrict__ lse,
                                               int64_t rows, int heads, int channels, int lanes, int64_t first,
                                               float* __restrict__ dots) {
  const int in_row = threadIdx.x & (lanes - 1);
  const int rows_per_round = kWarp / lanes;
  float sums[kDotRowsPerWarp] = {};
  for (int c = in_row * VEC; c - in_row * VEC < channels; c += lanes * VEC) {  // one round unless C > 32 VEC
    if (c >= channels) continue;  // a lane past the row's last chunk (lanes is a power of two)
    Vec<scalar_t, VEC> a_chunks[kDotRowsPerWarp], b_chunks[kDotRowsPerWarp], skip_chunks[kDotRowsPerWarp];
    load_row_chunks<scalar_t, VEC>(a, first, rows_per_round, rows, channels, c, a_chunks);
    if constexpr (!NORMS) {
      load_row_chunks<scalar_t, VEC>(b, first, rows_per_round, rows, channels, c, b_chunks);
      if (residual != nullptr) load_row_chunks<scalar_t, VEC>(residual, first, rows_per_round, rows, channels, c, skip_chunks);
    }
#pragma unroll
    for (int r = 0; r < kDotRowsPerWarp; ++r) {
      float x[VEC];
      to_f32<VEC>(a_chunks[r], x);
      if constexpr (NORMS) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) sums[r] += x[v] * x[v];
      } else {
        const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
        float y[VEC], shift[VEC] = {}, skip[VEC] = {};
        to_f32<VEC>(b_chunks[r], y);
        if (offset != nullptr && row < rows)
          to_f32<VEC>(load_vec<scalar_t, VEC>(offset + (row % heads) * channels + c), shift);
        if (residual != nullptr) to_f32<VEC>(skip_chunks[r], skip);
#pragma unroll
        for (int v = 0; v < VEC; ++v) sums[r] += x[v] * (y[v] - shift[v] - skip[v]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    const float sum = head_sum<kWarp>(sums[r], lanes);
    const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
    if (in_row != 0 || row >= rows) continue;
    if constexpr (NORMS) {
      const float norm = sqrtf(sum);
      reinterpret_cast<float2*>(dots)[row] = make_float2(norm, 1.f / clamped_norm(norm));
    } else if (lse != nullptr) {
      reinterpret_cast<float2*>(dots)[row] = make_float2(lse[row], sum);
    } else {
      dots[row] = sum;
    }
  }
}

template <typename scalar_t, int VEC, bool NORMS = false>
__global__ void row_dots_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                const scalar_t* __restrict__ offset, const scalar_t* __restrict__ residual,
                                const float* __restrict__ lse, int64_t rows,
                                int heads, int channels, int lanes, int64_t warps, float* __restrict__ dots) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= warps) return;  // warp-uniform
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
  // The resident warps loop over the groups of rows: with a block per group, each block ended as
  // soon as its loads landed, and with this kernel's registers (one block per SM) the SM idled
  // until the next one started (H100, rmat20's Transformer delta: 0.665 ms, 0.584 looping).
  for (int64_t first = warp * group_rows + lane / lanes; first - lane / lanes < rows; first += warps * group_rows)
    row_dots_group<scalar_t, VEC, NORMS>(a, b, offset, residual, lse, rows, heads, channels, lanes, first, dots);
}

// row_dots_kernel's dots and, in the same read, a's column sums
// (channels <= 32), the gradient of the output bias the forward added to
// every row, instead of a second pass over a (GATConv on rmat20: a 0.19 ms
// matrix-vector product per step). Rows are read as row_dots_kernel reads
// them: chunks of VEC elements, `lanes` lanes per row, 32 / lanes rows per
// load round, kDotRowsPerWarp rounds per warp and group of rows (one element
// per lane read 1 GiB in 0.56 ms on rmat20's 4 x 32 rows, 16-byte chunks
// 0.48 ms; H100, runs 93 and 95). Each lane sums its channels per row position r of the group in
// registers and writes them once, as partial row
// warp * group_rows + (its row in the group); the host launches a multiple
// of heads / gcd(heads, group_rows) warps that loop over the groups, so all
// rows a lane sees at one position are of one head, and attention_row_dots
// adds the partial rows of each head in a fixed order (deterministic).
template <typename scalar_t, int VEC>
__global__ void row_dots_columns_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                        const scalar_t* __restrict__ offset, const scalar_t* __restrict__ residual,
                                        const float* __restrict__ lse, int64_t rows, int heads, int channels,
                                        int lanes, int64_t warps,
                                        float* __restrict__ dots, float* __restrict__ column_partials) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= warps) return;  // warp-uniform
  const int lane = threadIdx.x & (kWarp - 1);
  const int rows_per_round = kWarp / lanes;
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * rows_per_round;
  const int channel = (lane & (lanes - 1)) * VEC;  // this lane's first channel
  const bool has_channels = channel < channels;
  const int64_t my_row = warp * group_rows + lane / lanes;  // at position 0 of the warp's first group
  // each position's head, the same in every group the warp takes (the stride
  // warps * group_rows is a multiple of heads); found once: a 64-bit
  // remainder per element doubled the kernel's time (0.41 -> 0.91 ms)
  int head_of[kDotRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) head_of[r] = static_cast<int>((my_row + r * rows_per_round) % heads);
  float column[kDotRowsPerWarp][VEC] = {};
  for (int64_t first = my_row; first - lane / lanes < rows; first += warps * group_rows) {
    float sums[kDotRowsPerWarp] = {};
    if (has_channels) {
      Vec<scalar_t, VEC> a_chunks[kDotRowsPerWarp], b_chunks[kDotRowsPerWarp], skip_chunks[kDotRowsPerWarp];
      load_row_chunks<scalar_t, VEC>(a, first, rows_per_round, rows, channels, channel, a_chunks);
      load_row_chunks<scalar_t, VEC>(b, first, rows_per_round, rows, channels, channel, b_chunks);
      if (residual != nullptr) load_row_chunks<scalar_t, VEC>(residual, first, rows_per_round, rows, channels, channel, skip_chunks);
#pragma unroll
      for (int r = 0; r < kDotRowsPerWarp; ++r) {  // rows past the last one add zeros
        float value[VEC], other[VEC], shift[VEC] = {}, skip[VEC] = {};
        to_f32<VEC>(a_chunks[r], value);
        to_f32<VEC>(b_chunks[r], other);
        if (offset != nullptr) to_f32<VEC>(load_vec<scalar_t, VEC>(offset + head_of[r] * channels + channel), shift);
        if (residual != nullptr) to_f32<VEC>(skip_chunks[r], skip);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          sums[r] += value[v] * (other[v] - shift[v] - skip[v]);
          column[r][v] += value[v];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kDotRowsPerWarp; ++r) {
      const float sum = head_sum<kWarp>(sums[r], lanes);
      const int64_t row = first + static_cast<int64_t>(r) * rows_per_round;
      if ((lane & (lanes - 1)) != 0 || row >= rows) continue;
      if (lse != nullptr) {
        reinterpret_cast<float2*>(dots)[row] = make_float2(lse[row], sum);
      } else {
        dots[row] = sum;
      }
    }
  }
  if (!has_channels) return;
#pragma unroll
  for (int r = 0; r < kDotRowsPerWarp; ++r) {
    float* partial = column_partials + (my_row + static_cast<int64_t>(r) * rows_per_round) * channels + channel;
#pragma unroll
    for (int v = 0; v < VEC; ++v) partial[v] = column[r][v];
  }
}

// `nodes` (optional): only these nodes' rows (all heads), e.g. the heavy
// source rows whose d x the source pass leaves to this kernel; `direct` may
// then be `grad_x` itself (each element is read before the same thread
// writes it), so neither is __restrict__.
template <typename scalar_t>
__global__ void unit_rows_backward_kernel(const scalar_t* __restrict__ x, const float* __restrict__ norm,
                                          const scalar_t* __restrict__ grad1, const scalar_t* __restrict__ grad2,
                                          const scalar_t* direct, int64_t rows, const int64_t* __restrict__ nodes,
                                          int heads, int channels, scalar_t* grad_x) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (index >= rows) return;  // warp-uniform
  const int64_t row = nodes != nullptr ? nodes[index / heads] * heads + index % heads : index;
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t base = row * channels;
  auto grad_at = [&](int64_t i) {
    return static_cast<float>(grad1[i]) + (grad2 != nullptr ? static_cast<float>(grad2[i]) : 0.f);
  };
  const float row_norm = norm[2 * row];  // (|x|, inverse) pairs, attention_row_norms'
  const float divisor = clamped_norm(row_norm);
  const float inverse = 1.f / divisor;
  // a quotient, not x * inverse: for one channel x / sqrt(x * x) is exactly +-1, so the
  // gradient through the unit row is exactly 0 there, as F.normalize's is
  auto unit_at = [&](int64_t i) { return static_cast<float>(x[i]) / divisor; };
  float radial = 0.f;
  for (int c = lane; c < channels; c += kWarp) radial += grad_at(base + c) * unit_at(base + c);
  radial = warp_sum(radial);
  // clamp_min passes the norm's gradient only where norm >= floor (a NaN norm gets none)
  const float kept = row_norm >= kNormFloor ? radial : 0.f;
  // the second read of the row hits L1: no registers held across the reduction for any C
  for (int c = lane; c < channels; c += kWarp) {
    const int64_t i = base + c;
    float value = (grad_at(i) - kept * unit_at(i)) * inverse;
    if (direct != nullptr) value += static_cast<float>(direct[i]);
    grad_x[i] = static_cast<scalar_t>(value);
  }
}


// ---------------------------------------------------------------- host side
void check_tensor(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  std::initializer_list<int64_t> shape) {
  GNNIO_ENSURE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device());
  GNNIO_ENSURE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
  GNNIO_ENSURE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
  GNNIO_ENSURE(t.sizes().equals(shape), op, ": ", name, " must have shape ", at::IntArrayRef(shape), ", got ",
              t.sizes());
}

template <typename scalar_t>
const scalar_t* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<scalar_t>() : nullptr;
}

// Blocks of the node-level Cosine kernels: one warp per (node, head) row.
unsigned unit_row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Elements per read of the row-dots kernels: a 16-byte chunk where every [.., C] row of a (and of b,
// offset and residual, where given) allows it, else one.
template <typename scalar_t>
int row_chunk(const at::Tensor& a, const at::Tensor* b, const c10::optional<at::Tensor>& offset,
              const c10::optional<at::Tensor>& residual) {
  constexpr int kVec = vec_width<scalar_t>();
  const int64_t channels = a.size(2);
  const bool whole_chunks = rows_vectorisable(a, channels, kVec) &&
                            (b == nullptr || rows_vectorisable(*b, channels, kVec)) &&
                            (!offset.has_value() || rows_vectorisable(*offset, channels, kVec)) &&
                            (!residual.has_value() || rows_vectorisable(*residual, channels, kVec));
  return whole_chunks ? kVec : 1;
}

// Launches row_dots_kernel in 16-byte chunks where every row allows, else one element at a time.
template <bool NORMS, typename scalar_t>
void launch_row_dots(const at::Tensor& a, const at::Tensor* b, const c10::optional<at::Tensor>& offset,
                     const c10::optional<at::Tensor>& residual, const float* lse, float* dots, cudaStream_t stream) {
  const int64_t heads = a.size(1), channels = a.size(2), rows = a.size(0) * heads;
  const int vec = row_chunk<scalar_t>(a, b, offset, residual);
  const int lanes = lanes_per_edge(channels / vec);
  const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
  const int64_t groups = (rows + group_rows - 1) / group_rows;
  constexpr int kVec = vec_width<scalar_t>();
  const auto kernel = vec == kVec ? row_dots_kernel<scalar_t, kVec, NORMS> : row_dots_kernel<scalar_t, 1, NORMS>;
  const int64_t warps = std::min(groups, resident_blocks(kernel, (groups + kWarpsPerBlock - 1) / kWarpsPerBlock) *
                                             kWarpsPerBlock);
  kernel<<<unit_row_blocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
      a.data_ptr<scalar_t>(), b == nullptr ? nullptr : b->data_ptr<scalar_t>(), ptr_or_null<scalar_t>(offset),
      ptr_or_null<scalar_t>(residual), lse, rows, static_cast<int>(heads), static_cast<int>(channels), lanes, warps,
      dots);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace attention
}  // namespace gnnio
