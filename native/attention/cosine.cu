// The cosine attention ops (AGNNConv): score beta[h] * <x_dst[t], x_src[s]> /
// max(|x_src[s]|, 1e-12) / max(|x_dst[t]|, 1e-12), message x_src[s] (device.cuh's
// Kind; passes.cuh's header has the derivation). Their schemas and the
// instantiation of host.cuh's passes for this kind alone.
//
// Tensors: x_src [Ns, H, C], x_dst [Nd, H, C] of one dtype (fp32, fp16 or
// bf16); norm_src fp32 [Ns, H, 2], norm_dst fp32 [Nd, H, 2]: their
// attention_row_norms, (|x|, 1 / max(|x|, 1e-12)); beta fp32 [H]. No edge features.
//   cosine_attention_forward[_edge_balanced] -> (out, lse, scores) (schema.h)
//   cosine_attention_backward_target -> (grad_unit_dst [Nd, H, C]: the gradient
//     of u_dst = F.normalize(x_dst), grad_beta fp32 [H], row_stats fp32 [Nd, H, 4]:
//     (lse, delta, 1 / max(|x_dst|, 1e-12), 0), an empty row's (0, 0, 0, 0))
//   cosine_attention_backward_source (CSC; row_stats: backward_target's) ->
//     grad_x_src [Ns, H, C], the whole d out / d x_src: through the messages and,
//     by F.normalize's backward, through the scores; with grad_unit_dst given
//     (backward_target's, when x_dst is x_src) that too.
#include "host.cuh"

namespace gnnio {
namespace attention {
namespace {

using Optional = c10::optional<at::Tensor>;
using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The cosine scores take no slope and no extra scale: beta scales them.
constexpr double kNoSlope = 0.0;
constexpr double kUnitScale = 1.0;

Triple cosine_forward(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                      const at::Tensor& norm_src, const at::Tensor& norm_dst, const at::Tensor& beta, double dropout,
                      int64_t seed, int64_t offset, int64_t return_scores) {
  return attention_forward<kCosine>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, norm_src, norm_dst, beta, {},
                                    kNoSlope, kUnitScale, dropout, seed, offset, return_scores, {}, {}, {});
}

Triple cosine_forward_edge_balanced(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                                    const at::Tensor& norm_src, const at::Tensor& norm_dst, const at::Tensor& beta,
                                    double dropout, int64_t seed, int64_t offset, int64_t return_scores,
                                    const at::Tensor& slot_rows) {
  return attention_forward_edge_balanced<kCosine>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, norm_src, norm_dst,
                                                  beta, {}, kNoSlope, kUnitScale, dropout, seed, offset,
                                                  return_scores, slot_rows, {}, {});
}

Triple cosine_backward_target(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                              const at::Tensor& norm_src, const at::Tensor& norm_dst, const at::Tensor& beta,
                              const at::Tensor& grad_out, const at::Tensor& lse, double dropout, int64_t seed,
                              int64_t offset) {
  return attention_backward_target<kCosine>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, norm_src, norm_dst, beta,
                                            {}, grad_out, lse, kNoSlope, kUnitScale, dropout, seed, offset);
}

at::Tensor cosine_backward_source(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                                  const at::Tensor& norm_src, const at::Tensor& norm_dst, const at::Tensor& beta,
                                  const Optional& grad_unit_dst, const at::Tensor& grad_out,
                                  const at::Tensor& row_stats, double dropout, int64_t seed, int64_t offset) {
  // grad_unit_dst takes the key_src slot: the source pass adds it to its rows' d u_src
  return std::get<0>(attention_backward_source<kCosine>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, grad_unit_dst, x_dst,
                                                        norm_src, norm_dst, beta, {}, grad_out, row_stats, kNoSlope,
                                                        kUnitScale, dropout, seed, offset, false, {}, {}));
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

#define GNNIO_COSINE_TENSORS "Tensor x_src, Tensor x_dst, Tensor norm_src, Tensor norm_dst, Tensor beta, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("cosine_attention_forward(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_COSINE_TENSORS
        GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores) -> (Tensor, Tensor, Tensor)");
  m.def("cosine_attention_forward_edge_balanced(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_COSINE_TENSORS
        GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor slot_rows) -> (Tensor, Tensor, Tensor)");
  m.def("cosine_attention_backward_target(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_COSINE_TENSORS
        "Tensor grad_out, Tensor lse, " GNNIO_ATTENTION_DROPOUT_SCHEMA ") -> (Tensor, Tensor, Tensor)");
  m.def("cosine_attention_backward_source(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_COSINE_TENSORS
        "Tensor? grad_unit_dst, Tensor grad_out, Tensor row_stats, " GNNIO_ATTENTION_DROPOUT_SCHEMA ") -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("cosine_attention_forward", &gnnio::attention::cosine_forward);
  m.impl("cosine_attention_forward_edge_balanced", &gnnio::attention::cosine_forward_edge_balanced);
  m.impl("cosine_attention_backward_target", &gnnio::attention::cosine_backward_target);
  m.impl("cosine_attention_backward_source", &gnnio::attention::cosine_backward_source);
}
