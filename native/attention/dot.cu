// The dot-product attention ops (TransformerConv): score scale * <query[t],
// key[s] + edge[e]> per head, message value[s] + edge[e]. Their schemas and
// the instantiation of host.cuh's passes for this kind alone.
//
// Tensors: query [Nd, H, C], key [Ns, H, C], value [Ns, H, C], edge [E, H, C]
// or None, all of one dtype (fp32, fp16 or bf16); scale: 1 / sqrt(C) for TransformerConv.
//   dot_attention_forward[_edge_balanced] -> (out, lse, scores) (schema.h);
//     out + residual [Nd, H, C] when given (a layer's skip connection, added at the store);
//     fp32_out: out in fp32 for 16-bit features (a caller under autocast; residual in the features' type)
//   dot_attention_backward_target -> (grad_query [Nd, H, C], row_stats)
//   dot_attention_backward_source (CSC) -> (grad_value, grad_key [Ns, H, C],
//     grad_edge (empty without edge), edge_grads fp32 [E, H] in CSC slot order
//     when write_edge_grads: each edge's scale * d score_e, else empty).
//     row_stats: backward_target's, or the (lse, delta) pairs that
//     attention_row_dots gives with lse.
//   dot_attention_backward_target_from_edges (CSR; edge_grads: the source pass's,
//     edge_grad_slots int64 [E]: the CSC slot of each CSR slot) -> grad_query
//     [Nd, H, C]: each target's sum over its in-edges of edge_grads x (key + edge).
#include "host.cuh"

namespace gnnio {
namespace attention {
namespace {

using Optional = c10::optional<at::Tensor>;
using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Triple dot_forward(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& query, const at::Tensor& key,
                   const at::Tensor& value, const Optional& edge, double scale, double dropout, int64_t seed,
                   int64_t offset, int64_t return_scores, const Optional& residual, const Optional& hinted_indices,
                   bool fp32_out) {
  return attention_forward<kDot>(GNNIO_ATTENTION_GRAPH_NAMES, value, key, query, {}, {}, {}, edge, 0.0, scale,
                                 dropout, seed, offset, return_scores, {}, hinted_indices, residual, fp32_out);
}

Triple dot_forward_edge_balanced(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value, const Optional& edge, double scale, double dropout,
                                 int64_t seed, int64_t offset, int64_t return_scores, const at::Tensor& slot_rows,
                                 const Optional& residual, bool fp32_out) {
  return attention_forward_edge_balanced<kDot>(GNNIO_ATTENTION_GRAPH_NAMES, value, key, query, {}, {}, {}, edge, 0.0,
                                               scale, dropout, seed, offset, return_scores, slot_rows, {}, residual,
                                               fp32_out);
}

std::tuple<at::Tensor, at::Tensor> dot_backward_target(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& query,
                                                       const at::Tensor& key, const at::Tensor& value,
                                                       const Optional& edge, const at::Tensor& grad_out,
                                                       const at::Tensor& lse, double scale, double dropout,
                                                       int64_t seed, int64_t offset) {
  auto [grad_query, no_att, row_stats] =
      attention_backward_target<kDot>(GNNIO_ATTENTION_GRAPH_NAMES, value, key, query, {}, {}, {}, edge, grad_out, lse,
                                      0.0, scale, dropout, seed, offset);
  return {grad_query, row_stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dot_backward_source(
    GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const Optional& edge, const at::Tensor& grad_out, const at::Tensor& row_stats, double scale, double dropout,
    int64_t seed, int64_t offset, bool write_edge_grads, const Optional& hinted_indices) {
  auto [grad_value, grad_key, no_scalar, grad_edge, edge_grads] = attention_backward_source<kDot>(
      GNNIO_ATTENTION_GRAPH_NAMES, value, key, query, {}, {}, {}, edge, grad_out, row_stats, 0.0, scale, dropout, seed,
      offset, write_edge_grads, {}, hinted_indices);
  return {grad_value, grad_key, grad_edge, edge_grads};
}

at::Tensor dot_backward_target_from_edges(GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& query,
                                          const at::Tensor& key, const at::Tensor& value, const Optional& edge,
                                          const at::Tensor& edge_grads, const at::Tensor& edge_grad_slots,
                                          const Optional& hinted_indices) {
  return attention_backward_target_from_edges<kDot>(GNNIO_ATTENTION_GRAPH_NAMES, value, key, query, {}, {}, {}, edge,
                                                    edge_grads, edge_grad_slots, {}, hinted_indices);
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

#define GNNIO_DOT_TENSORS "Tensor query, Tensor key, Tensor value, Tensor? edge, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("dot_attention_forward(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_DOT_TENSORS
        "float scale, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor? residual=None, "
        "Tensor? hinted_indices=None, bool fp32_out=False) -> (Tensor, Tensor, Tensor)");
  m.def("dot_attention_forward_edge_balanced(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_DOT_TENSORS
        "float scale, " GNNIO_ATTENTION_DROPOUT_SCHEMA ", int return_scores, Tensor slot_rows, "
        "Tensor? residual=None, bool fp32_out=False) -> (Tensor, Tensor, Tensor)");
  m.def("dot_attention_backward_target(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_DOT_TENSORS
        "Tensor grad_out, Tensor lse, float scale, " GNNIO_ATTENTION_DROPOUT_SCHEMA ") -> (Tensor, Tensor)");
  m.def("dot_attention_backward_source(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_DOT_TENSORS
        "Tensor grad_out, Tensor row_stats, float scale, " GNNIO_ATTENTION_DROPOUT_SCHEMA
        ", bool write_edge_grads, Tensor? hinted_indices=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("dot_attention_backward_target_from_edges(" GNNIO_ATTENTION_GRAPH_SCHEMA GNNIO_DOT_TENSORS
        "Tensor edge_grads, Tensor edge_grad_slots, Tensor? hinted_indices=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("dot_attention_forward", &gnnio::attention::dot_forward);
  m.impl("dot_attention_forward_edge_balanced", &gnnio::attention::dot_forward_edge_balanced);
  m.impl("dot_attention_backward_target", &gnnio::attention::dot_backward_target);
  m.impl("dot_attention_backward_source", &gnnio::attention::dot_backward_source);
  m.impl("dot_attention_backward_target_from_edges", &gnnio::attention::dot_backward_target_from_edges);
}
