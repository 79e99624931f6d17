// The node-level attention ops (row norms, row dots, F.normalize's backward)
// and the dropout seed: their schemas, CUDA implementations and checks. The
// kernels are rows.cuh's; the edge passes' ops are in gat.cu, gatv2.cu, dot.cu and cosine.cu.
#include "rows.cuh"

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <mutex>
#include <numeric>

namespace gnnio {
namespace attention {
namespace {

constexpr const char* kRowNorms = "gnnio::attention_row_norms";
constexpr const char* kUnitRowsBackward = "gnnio::attention_unit_rows_backward";
constexpr const char* kRowDots = "gnnio::attention_row_dots";

void check_rows(const char* op, const char* name, const at::Tensor& t) {
  GNNIO_ENSURE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", t.device());
  GNNIO_ENSURE(t.dim() == 3, op, ": ", name, " must have 3 dims [N, H, C], got shape ", t.sizes());
  GNNIO_ENSURE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
}

// x [N, H, C] -> (|x|, 1 / max(|x|, floor)) fp32 [N, H, 2].
at::Tensor attention_row_norms(const at::Tensor& x) {
  check_rows(kRowNorms, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0) * x.size(1);
  at::Tensor norm = at::empty({x.size(0), x.size(1), 2}, x.options().dtype(at::kFloat));
  if (rows == 0) return norm;
  if (x.size(2) == 0) {  // empty rows: norm 0, clamped to the floor
    norm.select(2, 0).zero_();
    norm.select(2, 1).fill_(1.f / kNormFloor);  // fp32, as the kernel divides
    return norm;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), kRowNorms, [&] {
    launch_row_dots<true, scalar_t>(x, nullptr, c10::nullopt, c10::nullopt, nullptr, norm.data_ptr<float>(), stream);
  });
  return norm;
}

// a, b [N, H, C] (offset [H, C]) -> (<a, b - offset> per (node, head) fp32 [N, H],
// or with lse [N, H] the pairs (lse, <a, b - offset>) fp32 [N, H, 2];
// with column_sums a's sums over the nodes fp32 [H, C], else empty).
std::tuple<at::Tensor, at::Tensor> attention_row_dots(const at::Tensor& a, const at::Tensor& b,
                                                      const c10::optional<at::Tensor>& offset,
                                                      const c10::optional<at::Tensor>& lse, bool column_sums,
                                                      const c10::optional<at::Tensor>& residual) {
  check_rows(kRowDots, "a", a);
  check_tensor(kRowDots, "b", b, a.scalar_type(), {a.size(0), a.size(1), a.size(2)});
  if (offset.has_value()) check_tensor(kRowDots, "offset", *offset, a.scalar_type(), {a.size(1), a.size(2)});
  if (residual.has_value()) check_tensor(kRowDots, "residual", *residual, a.scalar_type(), {a.size(0), a.size(1), a.size(2)});
  if (lse.has_value()) check_tensor(kRowDots, "lse", *lse, at::kFloat, {a.size(0), a.size(1)});
  const int64_t nodes = a.size(0), heads = a.size(1), channels = a.size(2);
  GNNIO_ENSURE(!column_sums || channels <= kMaxBiasChannels, kRowDots, ": column sums take heads of at most ",
              kMaxBiasChannels, " channels, got ", channels);
  const c10::cuda::CUDAGuard guard(a.device());
  const auto float_options = a.options().dtype(at::kFloat);
  const int64_t rows = nodes * heads;
  at::Tensor dots = lse.has_value() ? at::empty({nodes, heads, 2}, float_options)
                                    : at::empty({nodes, heads}, float_options);
  at::Tensor sums = at::empty({column_sums ? heads : 0, channels}, float_options);
  if (rows == 0 || channels == 0) {
    sums.zero_();
    if (lse.has_value()) return {at::stack({*lse, at::zeros_like(*lse)}, -1), sums};
    return {dots.zero_(), sums};
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(a.scalar_type(), kRowDots, [&] {
    const float* lse_data = lse.has_value() ? lse->data_ptr<float>() : nullptr;
    if (!column_sums) {
      launch_row_dots<false, scalar_t>(a, &b, offset, residual, lse_data, dots.data_ptr<float>(), stream);
      return;
    }
    constexpr int kVec = vec_width<scalar_t>();
    const int vec = row_chunk<scalar_t>(a, &b, offset, residual);
    const int lanes = lanes_per_edge(channels / vec);
    const auto kernel = vec == kVec ? row_dots_columns_kernel<scalar_t, kVec> : row_dots_columns_kernel<scalar_t, 1>;
    // the resident warps loop over the groups of rows, a multiple of `step` warps (see row_dots_columns_kernel)
    const int64_t group_rows = int64_t{kDotRowsPerWarp} * (kWarp / lanes);
    const int64_t groups = (rows + group_rows - 1) / group_rows;
    const int64_t step = heads / std::gcd(heads, group_rows);
    const int64_t resident = resident_blocks(kernel, (groups + kWarpsPerBlock - 1) / kWarpsPerBlock) * kWarpsPerBlock;
    const int64_t warps = std::max(step, std::min(resident, groups) / step * step);
    at::Tensor partials = at::empty({warps * group_rows, channels}, float_options);
    kernel<<<unit_row_blocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
        a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(offset), ptr_or_null<scalar_t>(residual),
        lse_data, rows,
        static_cast<int>(heads), static_cast<int>(channels), lanes, warps, dots.data_ptr<float>(),
        partials.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // partial row p belongs to head p % heads; summed in a fixed order (deterministic)
    at::sum_out(sums, partials.view({-1, heads, channels}), {0});
  });
  return {dots, sums};
}

// grad_x = (g - [|x| >= 1e-12] <g, u> u) / max(|x|, 1e-12), g = grad_unit, u = x / max(|x|, 1e-12).
// (The kernel's second gradient and direct term serve the source pass's heavy rows.)
at::Tensor attention_unit_rows_backward(const at::Tensor& x, const at::Tensor& norm, const at::Tensor& grad_unit) {
  const char* op = kUnitRowsBackward;
  check_rows(op, "x", x);
  check_tensor(op, "grad_unit", grad_unit, x.scalar_type(), {x.size(0), x.size(1), x.size(2)});
  check_tensor(op, "norm", norm, at::kFloat, {x.size(0), x.size(1), 2});
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0) * x.size(1);
  at::Tensor grad_x = at::empty_like(x);
  if (rows == 0 || x.size(2) == 0) return grad_x;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  GNNIO_DISPATCH_FEATURES(x.scalar_type(), op, [&] {
    unit_rows_backward_kernel<scalar_t><<<unit_row_blocks(rows), kWarpsPerBlock * kWarp, 0, stream>>>(
        x.data_ptr<scalar_t>(), norm.data_ptr<float>(), grad_unit.data_ptr<scalar_t>(), nullptr, nullptr, rows, nullptr,
        static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), grad_x.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_x;
}

// (seed, offset) for `increment` Philox draws per thread from the current
// device's default CUDA generator, advancing it as torch's own dropout does.
std::vector<int64_t> attention_dropout_seed(int64_t increment) {
  GNNIO_ENSURE(increment > 0, "gnnio::attention_dropout_seed: increment must be positive, got ", increment);
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(c10::nullopt,
                                                                  at::cuda::detail::getDefaultCUDAGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  const at::PhiloxCudaState state = gen->philox_cuda_state(static_cast<uint64_t>((increment + 3) / 4 * 4));
  GNNIO_ENSURE(!state.captured_, "gnnio::attention_dropout_seed: attention dropout cannot run under CUDA graph capture");
  return {static_cast<int64_t>(state.seed_.val), static_cast<int64_t>(state.offset_.val)};
}


}  // namespace
}  // namespace attention
}  // namespace gnnio

// attention_row_dots(a, b [N, H, C], offset [H, C] or None, lse [N, H] or None,
//   column_sums, residual [N, H, C] or None) -> (<a, b - offset - residual>
//   fp32 [N, H] (delta from the saved output, less the bias and residual the
//   forward added), or with lse the pairs (lse, delta) fp32
//   [N, H, 2], which GAT's and Dot's backward_source ops take as row_stats; a's sums
//   over the nodes fp32 [H, C] with column_sums (C <= 32: the gradient of
//   that bias), else empty).
// attention_row_norms(x [N, H, C]) -> (|x|, 1 / max(|x|, 1e-12)) fp32 [N, H, 2].
// attention_unit_rows_backward(x, norm (attention_row_norms'), grad_unit) -> the gradient of x through
//   x / max(|x|, 1e-12) (F.normalize) of grad_unit.
// attention_dropout_seed(increment) -> [seed, offset] of the default CUDA generator, advanced.
// Deterministic; no atomics.
TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("attention_dropout_seed(int increment) -> int[]", &gnnio::attention::attention_dropout_seed);
  m.def("attention_row_norms(Tensor x) -> Tensor");
  m.def("attention_row_dots(Tensor a, Tensor b, Tensor? offset=None, Tensor? lse=None, bool column_sums=False, "
        "Tensor? residual=None) -> (Tensor, Tensor)");
  m.def("attention_unit_rows_backward(Tensor x, Tensor norm, Tensor grad_unit) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("attention_row_norms", &gnnio::attention::attention_row_norms);
  m.impl("attention_row_dots", &gnnio::attention::attention_row_dots);
  m.impl("attention_unit_rows_backward", &gnnio::attention::attention_unit_rows_backward);
}
