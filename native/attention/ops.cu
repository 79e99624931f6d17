// The attention edge passes' schemas and their CUDA implementations: each op
// checks its kind and hands the call to that kind's instantiation
// (KindOps<KIND> in kinds.h; gat.cu, gatv2.cu, dot.cu, cosine.cu).
#include "kinds.h"

#include <type_traits>

namespace gnnio {
namespace attention {
namespace {

// f(std::integral_constant<int, KIND>) for the runtime kind; another kind is an error naming `op`.
template <typename F>
auto by_kind(const char* op, int64_t kind, F&& f) {
  switch (kind) {
    case kGat:
      return f(std::integral_constant<int, kGat>{});
    case kGatV2:
      return f(std::integral_constant<int, kGatV2>{});
    case kDot:
      return f(std::integral_constant<int, kDot>{});
    case kCosine:
      return f(std::integral_constant<int, kCosine>{});
  }
  GNNIO_ENSURE(false, op, ": kind must be 0 (GAT), 1 (GATv2), 2 (dot) or 3 (cosine), got ", kind);
  return f(std::integral_constant<int, kGat>{});  // not reached
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(
    int64_t kind, GNNIO_ATTENTION_GRAPH_PARAMS, double negative_slope, double scale, double dropout, int64_t seed,
    int64_t offset, int64_t return_scores, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& hinted_indices, const c10::optional<at::Tensor>& residual) {
  return by_kind("gnnio::attention_forward", kind, [&](auto k) {
    return KindOps<decltype(k)::value>::forward(GNNIO_ATTENTION_GRAPH_NAMES, negative_slope, scale, dropout, seed,
                                                offset, return_scores, bias, hinted_indices, residual);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward_edge_balanced(
    int64_t kind, GNNIO_ATTENTION_GRAPH_PARAMS, double negative_slope, double scale, double dropout, int64_t seed,
    int64_t offset, int64_t return_scores, const at::Tensor& slot_rows, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& residual) {
  return by_kind("gnnio::attention_forward_edge_balanced", kind, [&](auto k) {
    return KindOps<decltype(k)::value>::forward_edge_balanced(GNNIO_ATTENTION_GRAPH_NAMES, negative_slope, scale,
                                                              dropout, seed, offset, return_scores, slot_rows, bias,
                                                              residual);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_target(
    int64_t kind, GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& grad_out, const at::Tensor& lse,
    double negative_slope, double scale, double dropout, int64_t seed, int64_t offset) {
  return by_kind("gnnio::attention_backward_target", kind, [&](auto k) {
    return KindOps<decltype(k)::value>::backward_target(GNNIO_ATTENTION_GRAPH_NAMES, grad_out, lse, negative_slope,
                                                        scale, dropout, seed, offset);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_source(
    int64_t kind, GNNIO_ATTENTION_GRAPH_PARAMS, const at::Tensor& grad_out, const at::Tensor& row_stats,
    double negative_slope, double scale, double dropout, int64_t seed, int64_t offset, bool write_edge_grads,
    const c10::optional<at::Tensor>& packed_grads, const c10::optional<at::Tensor>& hinted_indices) {
  return by_kind("gnnio::attention_backward_source", kind, [&](auto k) {
    return KindOps<decltype(k)::value>::backward_source(GNNIO_ATTENTION_GRAPH_NAMES, grad_out, row_stats,
                                                        negative_slope, scale, dropout, seed, offset,
                                                        write_edge_grads, packed_grads, hinted_indices);
  });
}

at::Tensor attention_backward_target_from_edges(int64_t kind, GNNIO_ATTENTION_GRAPH_PARAMS,
                                                const at::Tensor& edge_grads, const at::Tensor& edge_grad_slots,
                                                const c10::optional<at::Tensor>& packed_grads,
                                                const c10::optional<at::Tensor>& hinted_indices) {
  GNNIO_ENSURE(kind == kGat || kind == kDot, "gnnio::attention_backward_target_from_edges: kind must be 0 (GAT) or 2 (dot), got ",
               kind);
  if (kind == kGat)
    return FromEdgesOps<kGat>::backward_target(GNNIO_ATTENTION_GRAPH_NAMES, edge_grads, edge_grad_slots, packed_grads,
                                               hinted_indices);
  return FromEdgesOps<kDot>::backward_target(GNNIO_ATTENTION_GRAPH_NAMES, edge_grads, edge_grad_slots, packed_grads,
                                             hinted_indices);
}

}  // namespace
}  // namespace attention
}  // namespace gnnio

// Schemas. kind: 0 GAT, 1 GATv2, 2 dot product (Transformer), 3 cosine (AGNN). The
// graph arguments are (indptr, indices, eid) of the CSR for the forward and
// target-side passes, of the CSC for the source-side pass, each with its row
// schedule (common.cuh) and row_order: int64 [L, 3], the light rows (at
// most tile_edges slots) each with its first and end slot, the
// num_busy_rows non-empty ones first by descending length, then the empty
// ones (gnnio_cli/ops/attention_native.py builds it once per graph).
// Per-edge tensors are in eid order. hinted_indices (forward, source pass,
// target pass from edges; optional): the pass's indices as int32 with bit 31
// set where the neighbour's rows are rarely read; Dot's passes that gather
// ahead then give those rows L2's evict-first policy (attention_native.py's
// hinted_indices builds them). Results do not depend on them.
//   msg_src [Ns, H, C]: x_src (GAT, GATv2, cosine) or value (dot)
//   key_src [Ns, H, C]: key (dot);  dst_vec [Nd, H, C]: x_dst (GATv2, cosine) or query (dot)
//   src_scalar [Ns, H], dst_scalar [Nd, H]: alpha_src, alpha_dst (GAT);
//     src_scalar fp32 [Ns, H, 2], dst_scalar fp32 [Nd, H, 2]: attention_row_norms of x_src, x_dst (cosine)
//   att [H, C] (GATv2) or beta fp32 [H] (cosine);  edge: [E, H] (GAT) or [E, H, C]
// attention_forward -> (out [Nd, H, C] (+ bias [H, C] and + residual
//   [Nd, H, C] when given: a layer's output bias and skip connection, added
//   at the store), lse fp32 [Nd, H] (0 for empty rows),
//   scores fp32 [E, H] raw scores when return_scores is 1, or 2 for -inf on
//   dropped edges; [0, H] otherwise).
// attention_backward_target (every kind; the host runs GAT and dot in fp32
//   through attention_backward_target_from_edges instead) -> (grad of dst_vec [Nd, H, C] or dst_scalar [Nd, H],
//   grad of att [H, C] (GATv2) or of beta fp32 [H] (cosine), else empty; row_stats for
//   the source pass: (lse, delta) fp32 [Nd, H, 2], or for cosine (lse, delta,
//   1 / max(|x_dst|, 1e-12), 0) fp32 [Nd, H, 4]; an empty row's (0, 0[, 0, 0])).
// attention_backward_source (row_stats: attention_backward_target's, or for GAT and
//   dot the pairs (lse, delta) fp32 [Nd, H, 2] that attention_row_dots gives with lse) ->
//   (grad of msg_src, grad of key_src (dot, else empty), grad of src_scalar
//   (GAT, else empty), grad of edge (else empty),
//   edge_grads fp32 [E, H] in CSC slot order when write_edge_grads, GAT and
//   dot only: each edge's s_e = d z_e (GAT) or scale * d score_e (dot); else empty).
//   packed_grads (GAT, as many sources as targets): [N, H*C + 2H] whose rows
//   take (d x_src, d alpha_src, d alpha_dst); the first two come back as views
//   of it, and attention_backward_target_from_edges given the same tensor
//   writes the third: a layer that projected all three from one x (GATConv)
//   then takes x's gradient in one GEMM over these rows.
// attention_backward_target_from_edges(kind 0 or 2, CSR graph, tensors,
//   edge_grads, edge_grad_slots int64 [E]: the CSC slot of each CSR slot) ->
//   grad of dst_scalar [Nd, H] (GAT; a view of packed_grads when given) or of dst_vec [Nd, H, C] (dot): sums
//   over each target's in-edges of s_e (x key_s + edge_e).
//   Cosine: the first holds the whole d out / d x_src (messages, scores, and
//   F.normalize's backward; with key_src set to the target pass's d u_dst when
//   x_dst is x_src, that too), the others are empty.
// Deterministic; no atomics.
#define GNNIO_ATTENTION_GRAPH_ARGS                                                                          \
  "Tensor indptr, Tensor indices, Tensor eid, Tensor tile_row, Tensor tile_start, Tensor heavy_rows, " \
  "Tensor heavy_tile_ptr, int tile_edges, Tensor row_order, int num_busy_rows, Tensor msg_src, "             \
  "Tensor? key_src, Tensor? dst_vec, Tensor? src_scalar, Tensor? dst_scalar, Tensor? att, Tensor? edge, "

TORCH_LIBRARY_FRAGMENT(gnnio, m) {
  m.def("attention_forward(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "float negative_slope, float scale, float dropout, int seed, int offset, int return_scores, "
        "Tensor? bias=None, Tensor? hinted_indices=None, Tensor? residual=None) -> (Tensor, Tensor, Tensor)");
  m.def("attention_forward_edge_balanced(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "float negative_slope, float scale, float dropout, int seed, int offset, int return_scores, "
        "Tensor slot_rows, Tensor? bias=None, Tensor? residual=None) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward_target(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor grad_out, Tensor lse, float negative_slope, float scale, float dropout, int seed, int offset) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("attention_backward_source(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor grad_out, Tensor row_stats, float negative_slope, float scale, float dropout, int seed, "
        "int offset, bool write_edge_grads, Tensor? packed_grads=None, Tensor? hinted_indices=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("attention_backward_target_from_edges(int kind, " GNNIO_ATTENTION_GRAPH_ARGS
        "Tensor edge_grads, Tensor edge_grad_slots, Tensor? packed_grads=None, Tensor? hinted_indices=None) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("attention_forward", &gnnio::attention::attention_forward);
  m.impl("attention_forward_edge_balanced", &gnnio::attention::attention_forward_edge_balanced);
  m.impl("attention_backward_target", &gnnio::attention::attention_backward_target);
  m.impl("attention_backward_source", &gnnio::attention::attention_backward_source);
  m.impl("attention_backward_target_from_edges", &gnnio::attention::attention_backward_target_from_edges);
}
