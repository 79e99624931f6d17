// GATv2's attention ops (GATv2Conv): score sum_c att[c] * leaky_relu(x_src[s]
// + x_dst[t] + edge[e])[c] per head, message x_src[s]. Their schemas and the
// instantiation of host.cuh's passes for this kind alone.
//
// Tensors: x_src [Ns, H, C], x_dst [Nd, H, C], att [H, C], edge [E, H, C] or
// None, all of one dtype (fp32, fp16 or bf16).
//   gatv2_attention_forward[_edge_balanced] -> (out, lse, scores) (schema.h);
//     out + bias [H, C] when given (a layer's output bias, added at the store)
//   gatv2_attention_backward_target -> (grad_x_dst [Nd, H, C], grad_att [H, C], row_stats)
//   gatv2_attention_backward_source (CSC; row_stats: backward_target's) ->
//     (grad_x_src [Ns, H, C], grad_edge (empty without edge))
#include "host.cuh"

namespace gnnio {
namespace attention {
namespace {

using Optional = c10::optional<at::Tensor>;
using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Triple gatv2_forward(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                     const at::Tensor& att, const Optional& edge, double negative_slope, double dropout, int64_t seed,
                     int64_t offset, int64_t return_scores, const Optional& bias) {
  return attention_forward<kGatV2>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, {}, {}, att, edge, negative_slope,
                                   1.0, dropout, seed, offset, return_scores, bias, {}, {});
}

Triple gatv2_forward_edge_balanced(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                                   const at::Tensor& att, const Optional& edge, double negative_slope,
                                   double dropout, int64_t seed, int64_t offset, int64_t return_scores,
                                   const at::Tensor& slot_rows, const Optional& bias) {
  return attention_forward_edge_balanced<kGatV2>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, {}, {}, att, edge,
                                                 negative_slope, 1.0, dropout, seed, offset, return_scores, slot_rows,
                                                 bias, {});
}

Triple gatv2_backward_target(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& x_dst,
                             const at::Tensor& att, const Optional& edge, const at::Tensor& grad_out,
                             const at::Tensor& lse, double negative_slope, double dropout, int64_t seed,
                             int64_t offset) {
  return attention_backward_target<kGatV2>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, {}, {}, att, edge, grad_out,
                                           lse, negative_slope, 1.0, dropout, seed, offset);
}

std::tuple<at::Tensor, at::Tensor> gatv2_backward_source(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src,
                                                         const at::Tensor& x_dst, const at::Tensor& att,
                                                         const Optional& edge, const at::Tensor& grad_out,
                                                         const at::Tensor& row_stats, double negative_slope,
                                                         double dropout, int64_t seed, int64_t offset) {
  auto [grad_x_src, no_key, no_scalar, grad_edge, no_edge_grads] = attention_backward_source<kGatV2>(
      GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, x_dst, {}, {}, att, edge, grad_out, row_stats, negative_slope, 1.0,
      dropout, seed, offset, false, {}, {});
  return {grad_x_src, grad_edge};
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

#define GNNIO_GATV2_TENSORS "Tensor x_src, Tensor x_dst, Tensor att, Tensor? edge, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("gatv2_attention_forward(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GATV2_TENSORS
        "float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor? bias=None) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("gatv2_attention_forward_edge_balanced(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GATV2_TENSORS
        "float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor slot_rows, "
        "Tensor? bias=None) -> (Tensor, Tensor, Tensor)");
  m.def("gatv2_attention_backward_target(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GATV2_TENSORS
        "Tensor grad_out, Tensor lse, float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA
        ") -> (Tensor, Tensor, Tensor)");
  m.def("gatv2_attention_backward_source(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GATV2_TENSORS
        "Tensor grad_out, Tensor row_stats, float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA
        ") -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("gatv2_attention_forward", &gnnio::attention::gatv2_forward);
  m.impl("gatv2_attention_forward_edge_balanced", &gnnio::attention::gatv2_forward_edge_balanced);
  m.impl("gatv2_attention_backward_target", &gnnio::attention::gatv2_backward_target);
  m.impl("gatv2_attention_backward_source", &gnnio::attention::gatv2_backward_source);
}
