// GAT's attention ops (GATConv): score leaky_relu(alpha_src[s] + alpha_dst[t]
// + edge_alpha[e]) per head, message x_src[s]. Their schemas and the
// instantiation of host.cuh's passes for this kind alone.
//
// Tensors: x_src [Ns, H, C], alpha_src [Ns, H], alpha_dst [Nd, H], edge_alpha
// [E, H] or None, all of one dtype (fp32, fp16 or bf16).
//   gat_attention_forward[_edge_balanced] -> (out, lse, scores) (schema.h);
//     out + bias [H, C] when given (a layer's output bias, added at the store);
//     fp32_out: out (and bias) in fp32 for 16-bit features (a caller under autocast)
//   gat_attention_backward_target -> (grad_alpha_dst [Nd, H], row_stats)
//   gat_attention_backward_source (CSC) -> (grad_x_src, grad_alpha_src,
//     grad_edge_alpha (empty without edge_alpha), edge_grads fp32 [E, H] in CSC
//     slot order when write_edge_grads: each edge's d z_e, else empty).
//     row_stats: backward_target's, or the (lse, delta) pairs that
//     attention_row_dots gives with lse.
//   gat_attention_backward_target_from_edges (CSR; edge_grads: the source pass's,
//     edge_grad_slots int64 [E]: the CSC slot of each CSR slot) -> grad_alpha_dst
//     [Nd, H]: each target's sum of its in-edges' edge_grads.
//   packed_grads (as many sources as targets): [N, H*C + 2H] whose rows take
//     (d x_src, d alpha_src, d alpha_dst), written in place: the source pass
//     writes the first two (and returns [0, H, C] and [0, H] in their places),
//     the target pass from edges the third (and returns [0, H]): a layer that
//     projected all three from one x (GATConv) then takes x's gradient in one
//     GEMM over these rows.
#include "host.cuh"

namespace gnnio {
namespace attention {
namespace {

using Optional = c10::optional<at::Tensor>;
using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Triple gat_forward(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& alpha_src,
                   const at::Tensor& alpha_dst, const Optional& edge_alpha, double negative_slope, double dropout,
                   int64_t seed, int64_t offset, int64_t return_scores, const Optional& bias, bool fp32_out) {
  return attention_forward<kGat>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, {}, alpha_src, alpha_dst, {}, edge_alpha,
                                 negative_slope, 1.0, dropout, seed, offset, return_scores, bias, {}, {}, fp32_out);
}

Triple gat_forward_edge_balanced(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& alpha_src,
                                 const at::Tensor& alpha_dst, const Optional& edge_alpha, double negative_slope,
                                 double dropout, int64_t seed, int64_t offset, int64_t return_scores,
                                 const at::Tensor& slot_rows, const Optional& bias, bool fp32_out) {
  return attention_forward_edge_balanced<kGat>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, {}, alpha_src, alpha_dst, {},
                                               edge_alpha, negative_slope, 1.0, dropout, seed, offset, return_scores,
                                               slot_rows, bias, {}, fp32_out);
}

std::tuple<at::Tensor, at::Tensor> gat_backward_target(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src,
                                                       const at::Tensor& alpha_src, const at::Tensor& alpha_dst,
                                                       const Optional& edge_alpha, const at::Tensor& grad_out,
                                                       const at::Tensor& lse, double negative_slope, double dropout,
                                                       int64_t seed, int64_t offset) {
  auto [grad_alpha_dst, no_att, row_stats] =
      attention_backward_target<kGat>(GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, {}, alpha_src, alpha_dst, {},
                                      edge_alpha, grad_out, lse, negative_slope, 1.0, dropout, seed, offset);
  return {grad_alpha_dst, row_stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_backward_source(
    GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src, const at::Tensor& alpha_src, const at::Tensor& alpha_dst,
    const Optional& edge_alpha, const at::Tensor& grad_out, const at::Tensor& row_stats, double negative_slope,
    double dropout, int64_t seed, int64_t offset, bool write_edge_grads, const Optional& packed_grads) {
  auto [grad_x_src, no_key, grad_alpha_src, grad_edge_alpha, edge_grads] = attention_backward_source<kGat>(
      GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, {}, alpha_src, alpha_dst, {}, edge_alpha, grad_out, row_stats,
      negative_slope, 1.0, dropout, seed, offset, write_edge_grads, packed_grads, {});
  if (packed_grads.has_value()) {  // written into packed_grads' rows; no output aliases an input
    grad_x_src = x_src.new_empty({0, x_src.size(1), x_src.size(2)});
    grad_alpha_src = x_src.new_empty({0, x_src.size(1)});
  }
  return {grad_x_src, grad_alpha_src, grad_edge_alpha, edge_grads};
}

at::Tensor gat_backward_target_from_edges(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& x_src,
                                          const at::Tensor& alpha_src, const at::Tensor& alpha_dst,
                                          const Optional& edge_alpha, const at::Tensor& edge_grads,
                                          const at::Tensor& edge_grad_slots, const Optional& packed_grads) {
  at::Tensor grad_alpha_dst = attention_backward_target_from_edges<kGat>(
      GNNIO_ATTENTION_GRAPH_NAMES, x_src, {}, {}, alpha_src, alpha_dst, {}, edge_alpha, edge_grads, edge_grad_slots,
      packed_grads, {});
  // written into packed_grads' last H columns; no output aliases an input
  return packed_grads.has_value() ? x_src.new_empty({0, x_src.size(1)}) : grad_alpha_dst;
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

#define GNNIO_GAT_TENSORS "Tensor x_src, Tensor alpha_src, Tensor alpha_dst, Tensor? edge_alpha, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("gat_attention_forward(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GAT_TENSORS
        "float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor? bias=None, "
        "bool fp32_out=False) -> (Tensor, Tensor, Tensor)");
  m.def("gat_attention_forward_edge_balanced(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GAT_TENSORS
        "float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor slot_rows, "
        "Tensor? bias=None, bool fp32_out=False) -> (Tensor, Tensor, Tensor)");
  m.def("gat_attention_backward_target(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GAT_TENSORS
        "Tensor grad_out, Tensor lse, float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA ") -> (Tensor, Tensor)");
  m.def("gat_attention_backward_source(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GAT_TENSORS
        "Tensor grad_out, Tensor row_stats, float negative_slope, " GNNIO_ATTENTION_DROPOUT_SCHEMA
        ", bool write_edge_grads, Tensor(a!)? packed_grads=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("gat_attention_backward_target_from_edges(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_GAT_TENSORS
        "Tensor edge_grads, Tensor edge_grad_slots, Tensor(a!)? packed_grads=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("gat_attention_forward", &gnnio::attention::gat_forward);
  m.impl("gat_attention_forward_edge_balanced", &gnnio::attention::gat_forward_edge_balanced);
  m.impl("gat_attention_backward_target", &gnnio::attention::gat_backward_target);
  m.impl("gat_attention_backward_source", &gnnio::attention::gat_backward_source);
  m.impl("gat_attention_backward_target_from_edges", &gnnio::attention::gat_backward_target_from_edges);
}
