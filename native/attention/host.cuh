// The host side of the attention passes: boundary checks, Params, launches,
// and each op's body as a template on the kind, over the kinds' common tensor
// slots (msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge). Each
// kind's file (gat.cu, gatv2.cu, dot.cu, cosine.cu) includes this header,
// declares its typed ops (schema.h) and fills the slots from them, so every
// kind compiles in a translation unit of its own.
#pragma once

#include "ahead.cuh"
#include "backward_source.cuh"
#include "backward_target.cuh"
#include "forward.cuh"
#include "schema.h"
#include "rows.cuh"

#include <algorithm>
#include <type_traits>

namespace gnnio {
namespace attention {
namespace {

// ---------------------------------------------------------------- host side
// Each op's name per kind (indexed by Kind), for its error messages.
constexpr const char* kForward[] = {"gnnio::gat_attention_forward", "gnnio::gatv2_attention_forward",
                                    "gnnio::dot_attention_forward", "gnnio::cosine_attention_forward"};
constexpr const char* kForwardEdgeBalanced[] = {
    "gnnio::gat_attention_forward_edge_balanced", "gnnio::gatv2_attention_forward_edge_balanced",
    "gnnio::dot_attention_forward_edge_balanced", "gnnio::cosine_attention_forward_edge_balanced"};
constexpr const char* kBackwardTarget[] = {
    "gnnio::gat_attention_backward_target", "gnnio::gatv2_attention_backward_target",
    "gnnio::dot_attention_backward_target", "gnnio::cosine_attention_backward_target"};
constexpr const char* kBackwardSource[] = {
    "gnnio::gat_attention_backward_source", "gnnio::gatv2_attention_backward_source",
    "gnnio::dot_attention_backward_source", "gnnio::cosine_attention_backward_source"};
constexpr const char* kBackwardTargetFromEdges[] = {"gnnio::gat_attention_backward_target_from_edges", "",
                                                    "gnnio::dot_attention_backward_target_from_edges", ""};

// The runtime vector width becomes a template parameter; each kind's file
// (gat.cu, gatv2.cu, dot.cu, cosine.cu) instantiates the passes for its kind:
// 2 widths x 3 dtypes = 6 instantiations per kernel and kind, and VEC 8 for
// the two 16-bit dtypes (the forward's launch_paired_forward, the backward
// passes' GNNIO_ATTENTION_PAIRED_VEC_SWITCH): 2 more.
#define GNNIO_ATTENTION_VEC_SWITCH(vec, ...) \
  [&] {                                      \
    if (vec == 4) {                          \
      constexpr int VEC = 4;                 \
      return __VA_ARGS__();                  \
    }                                        \
    constexpr int VEC = 1;                   \
    return __VA_ARGS__();                    \
  }()

// GNNIO_ATTENTION_VEC_SWITCH with VEC 8 as well where scalar_t is 16-bit
// (paired_vector_width picks it only there).
#define GNNIO_ATTENTION_PAIRED_VEC_SWITCH(vec, ...)      \
  [&] {                                                  \
    if constexpr (sizeof(scalar_t) == 2) {               \
      if (vec == 8) {                                    \
        constexpr int VEC = 8;                           \
        return __VA_ARGS__();                            \
      }                                                  \
    }                                                    \
    return GNNIO_ATTENTION_VEC_SWITCH(vec, __VA_ARGS__); \
  }()

// The widest head C that the two layouts hold: VEC 4 x 1 chunk x 32 lanes,
// VEC 1 x 8 chunks x 32 lanes.
constexpr int64_t kMaxVectorChannels = 128;
constexpr int64_t kMaxChannels = 256;

// The feature tensors of one call, checked once.
struct Features {
  int64_t kind;
  int64_t heads;
  int64_t channels;
  int64_t num_src;
  at::ScalarType dtype;
  at::Tensor msg_src;
  c10::optional<at::Tensor> key_src, dst_vec, src_scalar, dst_scalar, att, edge;
};


const at::Tensor& required(const char* op, const char* name, const c10::optional<at::Tensor>& t, int64_t kind) {
  GNNIO_ENSURE(t.has_value(), op, ": ", name, " is required for kind ", kind);
  return *t;
}

Features check_features(const char* op, int64_t kind, int64_t num_dst, int64_t num_edges, const at::Tensor& msg_src,
                        const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
                        const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
                        const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge) {
  GNNIO_ENSURE(kind == kGat || kind == kGatV2 || kind == kDot || kind == kCosine, op,
              ": kind must be 0 (GAT), 1 (GATv2), 2 (dot) or 3 (cosine), got ", kind);
  GNNIO_ENSURE(msg_src.dim() == 3, op, ": msg_src must have 3 dims [N, H, C], got shape ", msg_src.sizes());
  const int64_t ns = msg_src.size(0), h = msg_src.size(1), c = msg_src.size(2);
  // The kernels address rows with 32-bit ids (passes.cuh: row_start).
  constexpr int64_t max_rows = int64_t{1} << 32;
  GNNIO_ENSURE(ns < max_rows && num_dst < max_rows && num_edges < max_rows, op,
              ": node and edge counts must be below 2^32, got ", ns, " sources, ", num_dst, " targets, ", num_edges,
              " edges");
  GNNIO_ENSURE(h > 0 && c > 0 && c <= kMaxChannels, op, ": heads must be >= 1 and channels in 1..", kMaxChannels,
              ", got shape ", msg_src.sizes());
  const at::ScalarType dtype = msg_src.scalar_type();
  check_tensor(op, "msg_src", msg_src, dtype, {ns, h, c});
  if (kind == kDot) check_tensor(op, "key_src", required(op, "key_src", key_src, kind), dtype, {ns, h, c});
  if (kind != kGat) check_tensor(op, "dst_vec", required(op, "dst_vec", dst_vec, kind), dtype, {num_dst, h, c});
  if (kind == kGat) {
    check_tensor(op, "src_scalar", required(op, "src_scalar", src_scalar, kind), dtype, {ns, h});
    check_tensor(op, "dst_scalar", required(op, "dst_scalar", dst_scalar, kind), dtype, {num_dst, h});
  }
  if (kind == kGatV2) check_tensor(op, "att", required(op, "att", att, kind), dtype, {h, c});
  if (kind == kCosine) {
    // fp32 whatever the features' dtype: the norms divide every cosine, beta scales every score;
    // the norms as attention_row_norms gives them, (|x|, 1 / max(|x|, floor)) per (row, head)
    check_tensor(op, "src_scalar", required(op, "src_scalar", src_scalar, kind), at::kFloat, {ns, h, 2});
    check_tensor(op, "dst_scalar", required(op, "dst_scalar", dst_scalar, kind), at::kFloat, {num_dst, h, 2});
    check_tensor(op, "att", required(op, "att", att, kind), at::kFloat, {h});
    GNNIO_ENSURE(!edge.has_value(), op, ": kind 3 (cosine) takes no edge features");
    // key_src's slot: the target pass's d u of the same rows (source pass, x_dst is x_src)
    if (key_src.has_value()) check_tensor(op, "key_src", *key_src, dtype, {ns, h, c});
  }
  if (edge.has_value()) {
    if (kind == kGat)
      check_tensor(op, "edge", *edge, dtype, {num_edges, h});
    else
      check_tensor(op, "edge", *edge, dtype, {num_edges, h, c});
  }
  return Features{kind, h, c, ns, dtype, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge};
}

// Whether every [.., H, C] tensor of the call (and `more`) starts on a
// multiple of `elements` elements.
bool all_aligned(const Features& f, std::initializer_list<const at::Tensor*> more, int elements) {
  const uintptr_t align = elements * at::elementSize(f.dtype);
  auto aligned = [&](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0; };
  bool ok = aligned(f.msg_src);
  for (const auto* t : {&f.key_src, &f.dst_vec}) ok = ok && (!t->has_value() || aligned(**t));
  if (f.kind == kGatV2) ok = ok && aligned(*f.att);  // Cosine's att is beta, read one float at a time
  if (f.kind != kGat && f.edge.has_value()) ok = ok && aligned(*f.edge);
  for (const at::Tensor* t : more) ok = ok && aligned(*t);
  return ok;
}

// 4-wide loads need C % 4 == 0 and every [.., H, C] tensor aligned to 4 elements.
int vector_width(const Features& f, std::initializer_list<const at::Tensor*> more) {
  if (f.channels % 4 != 0 || f.channels > kMaxVectorChannels) return 1;
  return all_aligned(f, more, 4) ? 4 : 1;
}

// The fused forward and both backward passes also take VEC 8 (two edges per
// warp at a time, see Layout) for 16-bit features with C % 8 == 0 and
// 8-element alignment. In the 4-wide layout a 16-bit pass issued as many
// loads, shuffles and instructions per edge as an fp32 one, for half the
// bytes: these latency-bound gathers then took fp32's time (H200, rmat20
// 4 x 32, bf16 against fp32 fwd+bwd: GAT 5.85 vs 5.59 ms, GATv2 9.77 vs 9.66).
int paired_vector_width(const Features& f, std::initializer_list<const at::Tensor*> more) {
  const int vec = vector_width(f, more);
  const bool paired = vec == 4 && at::elementSize(f.dtype) == 2 && f.channels % 8 == 0 && all_aligned(f, more, 8);
  return paired ? 8 : vec;
}


// The light rows of a pass in item order (for_each_item), [L, 3] (row,
// first slot, end slot): the first `busy` are the non-empty ones.
struct RowOrder {
  const int64_t* rows;
  int64_t busy;
  int64_t empty;
};

RowOrder row_order_view(const char* op, const RowSchedule& schedule, const at::Tensor& row_order,
                        int64_t num_busy_rows) {
  GNNIO_ENSURE(row_order.is_cuda() && row_order.scalar_type() == at::kLong && row_order.dim() == 2 &&
                  row_order.size(1) == 3 && row_order.is_contiguous(),
              op, ": row_order must be a contiguous int64 CUDA tensor of shape [L, 3] (row, first slot, end slot), got ",
              row_order.scalar_type(), " of shape ", row_order.sizes(), " on ", row_order.device());
  const int64_t light = row_order.size(0);
  GNNIO_ENSURE(light == schedule.num_rows - schedule.num_heavy, op, ": row_order must list the ",
              schedule.num_rows - schedule.num_heavy, " light rows, got ", light);
  GNNIO_ENSURE(num_busy_rows >= 0 && num_busy_rows <= light, op, ": num_busy_rows must be in 0..", light, ", got ",
              num_busy_rows);
  return RowOrder{row_order.data_ptr<int64_t>(), num_busy_rows, light - num_busy_rows};
}

template <typename scalar_t>
Params<scalar_t> make_params(const Features& f, const RowSchedule& schedule, const RowOrder& order,
                             const at::Tensor& indices, const at::Tensor& eid, int vec, double negative_slope,
                             double scale, double dropout, int64_t seed, int64_t offset) {
  Params<scalar_t> p{};
  p.schedule = schedule;
  p.indices = index_view(indices);
  p.eid = eid.data_ptr<int64_t>();
  p.geo = lane_geometry(static_cast<int>(f.heads), static_cast<int>(f.channels), vec, vec == 1 ? 8 : 1,
                        vec == 8 ? kWarp / 2 : kWarp);
  p.row_bounds = order.rows;
  p.num_busy_rows = order.busy;
  p.num_empty_rows = order.empty;
  p.msg_src = f.msg_src.data_ptr<scalar_t>();
  p.key_src = ptr_or_null<scalar_t>(f.key_src);
  p.dst_vec = ptr_or_null<scalar_t>(f.dst_vec);
  if (f.kind == kCosine) {
    p.src_norm = f.src_scalar->data_ptr<float>();
    p.dst_norm = f.dst_scalar->data_ptr<float>();
    p.unit_grad = ptr_or_null<scalar_t>(f.key_src);  // source pass only
    p.beta = f.att->data_ptr<float>();
  } else {
    p.src_scalar = ptr_or_null<scalar_t>(f.src_scalar);
    p.dst_scalar = ptr_or_null<scalar_t>(f.dst_scalar);
    p.att = ptr_or_null<scalar_t>(f.att);
  }
  p.edge = ptr_or_null<scalar_t>(f.edge);
  p.grad_vec_stride = f.heads * f.channels;
  p.grad_scalar_stride = f.heads;
  // GATv2's 16-bit scores take the slope in the features' type (see gatv2_hidden)
  p.slope = static_cast<float>(negative_slope);
  if (f.kind == kGatV2) p.slope = static_cast<float>(static_cast<scalar_t>(p.slope));
  p.scale = static_cast<float>(scale);
  p.dropout = Dropout{static_cast<float>(dropout), dropout < 1.0 ? static_cast<float>(1.0 / (1.0 - dropout)) : 0.f,
                      static_cast<uint64_t>(seed), static_cast<uint64_t>(offset)};
  return p;
}

void check_graph(const char* op, const at::Tensor& indices, const at::Tensor& eid, int64_t num_edges) {
  GNNIO_ENSURE(indices.is_cuda() && eid.is_cuda(), op, ": indices and eid must be CUDA tensors, got ", indices.device(),
              " and ", eid.device());
  GNNIO_ENSURE(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong, op,
              ": indices must be int32 or int64, got ", indices.scalar_type());
  GNNIO_ENSURE(eid.scalar_type() == at::kLong, op, ": eid must be int64, got ", eid.scalar_type());
  GNNIO_ENSURE(indices.is_contiguous() && eid.is_contiguous() && indices.numel() == num_edges &&
                  eid.numel() == num_edges,
              op, ": indices and eid must be contiguous with ", num_edges, " entries, got ", indices.numel(), " and ",
              eid.numel());
}

// Blocks of a pass whose warps loop over the work items (for_each_item): as
// many as stay resident on the GPU (this kernel's occupancy), never more than
// one item per warp. y: the head groups (heads wider than a warp's share).
template <typename Kernel, typename scalar_t>
dim3 resident_grid(Kernel kernel, const Params<scalar_t>& p, int shared_bytes = 0) {
  const int64_t items = p.schedule.num_tiles + p.num_busy_rows + (p.num_empty_rows + kWarp - 1) / kWarp;
  const int64_t needed = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarpsPerBlock * kWarp, shared_bytes);
  const int head_groups = (p.geo.heads + p.geo.heads_per_warp - 1) / p.geo.heads_per_warp;
  const int64_t resident =
      static_cast<int64_t>(std::max(per_sm, 1)) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::min(needed, std::max<int64_t>(1, resident / head_groups));
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(head_groups));
}

// Launches a pass whose warps loop over the work items on resident_grid,
// with shared_bytes of dynamic shared memory per block (the rings of the
// passes that gather ahead; resident_grid's blocks_per_sm lets the kernel
// have them).
template <typename Kernel, typename scalar_t>
void launch_resident(Kernel kernel, const Params<scalar_t>& p, cudaStream_t stream, int shared_bytes = 0) {
  const dim3 grid = resident_grid(kernel, p, shared_bytes);
  if (grid.x == 0) return;
  kernel<<<grid, kWarpsPerBlock * kWarp, shared_bytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Whether Dot's passes (dot_forward_ahead_kernel and the two backward ones)
// and GAT's fp32 forward (gat_forward_ahead_kernel) may gather ahead:
// copy_ahead needs compute capability 8.0 for its asynchronous copies
// (older GPUs would copy synchronously, no faster than the passes that
// gather per step). Each caller adds its own conditions: the layout, no edge
// features, and for the forwards and the source pass no dropout.
bool gathers_ahead() { return at::cuda::getCurrentDeviceProperties()->major >= 8; }

// Lanes per head of 32-channel heads (8 in the 4-wide layout, 4 in the
// 8-wide one). The forward of the kinds that sum a head's shares for every
// edge (GATv2, Dot) is also built for that width: 3 butterfly steps per
// head sum instead of 5, or 2 instead of 4, with no select.
template <int VEC>
constexpr int fixed_head_lanes() {
  return VEC == 1 ? 0 : kWarp / VEC;
}

// A pass that gathers ahead in the VEC-wide layout, built for 32-channel
// heads (HEAD_LANES fixed_head_lanes<VEC>()) where the head is that wide,
// else for any width.
template <typename Ring, int VEC, typename KernelForFixed, typename KernelForAny, typename scalar_t>
void launch_ahead(KernelForFixed for_fixed_lanes, KernelForAny for_any, const Params<scalar_t>& p,
                  cudaStream_t stream) {
  if (p.geo.lanes_per_head == fixed_head_lanes<VEC>()) {
    launch_resident(for_fixed_lanes, p, stream, Ring::kBlockBytes);
  } else {
    launch_resident(for_any, p, stream, Ring::kBlockBytes);
  }
}

// The fused forward (one pass, scores from the rows), built for the head
// width where that is one of fixed_head_lanes' widths.
template <int KIND, int VEC, typename scalar_t>
void launch_forward(const Params<scalar_t>& p, cudaStream_t stream) {
  // packed scores take 8 channels in every lane of a head, and no per-edge extras (see forward_kernel)
  constexpr int kPackedLanes = packed_head_lanes<KIND, VEC, scalar_t>();
  const bool plain = p.edge == nullptr && p.dropout.p <= 0.f && p.scores == nullptr;
  if constexpr (kPackedLanes > 0) {
    if (plain && p.geo.lanes_per_head == kPackedLanes && p.geo.channels == kPackedLanes * VEC) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, kPackedLanes>, p, stream);
      return;
    }
  }
  // GAT's 16-bit forward without those extras: the plain build (see forward_blocks_per_sm)
  if constexpr (KIND == kGat && VEC == 8) {
    if (plain) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, 0, true>, p, stream);
      return;
    }
  }
  constexpr int kFixed = fixed_head_lanes<VEC>();
  if constexpr ((KIND == kGatV2 || KIND == kDot) && kFixed > 0 && kFixed != kPackedLanes) {
    if (p.geo.lanes_per_head == kFixed) {
      launch_resident(forward_kernel<KIND, VEC, scalar_t, false, kFixed>, p, stream);
      return;
    }
  }
  launch_resident(forward_kernel<KIND, VEC, scalar_t>, p, stream);
}

// The fused forward in the VEC 8 layout (16-bit features only; the host
// picks it through paired_vector_width).
template <int KIND, typename scalar_t>
void launch_paired_forward(const Params<scalar_t>& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) == 2) {
    launch_forward<KIND, 8, scalar_t>(p, stream);
  } else {
    TORCH_INTERNAL_ASSERT(false, "the VEC 8 attention forward takes 16-bit features only");
  }
}

// Dot's forward gathering ahead, in the 4-wide layout or (16-bit rows only)
// the 8-wide one.
template <typename scalar_t>
void launch_dot_forward_ahead(int vec, const Params<scalar_t>& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) == 2) {
    if (vec == 8) {
      launch_ahead<DotForwardRing<scalar_t, 8>, 8>(dot_forward_ahead_kernel<scalar_t, 8, fixed_head_lanes<8>()>,
                                                   dot_forward_ahead_kernel<scalar_t, 8, 0>, p, stream);
      return;
    }
  }
  TORCH_INTERNAL_ASSERT(vec == 4, "Dot's forward gathers ahead 4-wide, or 8-wide for 16-bit features");
  launch_ahead<DotForwardRing<scalar_t, 4>, 4>(dot_forward_ahead_kernel<scalar_t, 4, fixed_head_lanes<4>()>,
                                               dot_forward_ahead_kernel<scalar_t, 4, 0>, p, stream);
}

// CSR slots per warp of the edge-balanced score phase: enough warps to fill
// the GPU several times over, each with the same share of the edges.
constexpr int64_t kSlotsPerScoreWarp = 64;

// The hinted neighbour ids of a pass (Params::hinted), checked against its
// indices: int32 [E] on their device, or none.
const uint32_t* hinted_ids(const char* op, const c10::optional<at::Tensor>& hinted, const at::Tensor& indices) {
  if (!hinted.has_value()) return nullptr;
  const at::Tensor& h = *hinted;
  GNNIO_ENSURE(h.is_cuda() && h.device() == indices.device() && h.scalar_type() == at::kInt && h.dim() == 1 &&
                   h.is_contiguous() && h.numel() == indices.numel(),
               op, ": hinted_indices must be a contiguous int32 tensor of ", indices.numel(), " entries on ",
               indices.device(), ", got ", h.scalar_type(), " of shape ", h.sizes(), " on ", h.device());
  return reinterpret_cast<const uint32_t*>(h.data_ptr<int32_t>());
}

// Both forward ops: the fused pass alone (slot_rows null), or the
// edge-balanced score phase first and the fused pass reading its scores.
// fp32_out: the output (and the bias, which is added to it) in fp32 whatever
// the features' type, still accumulated in fp32: a caller that keeps fp32
// (autocast) takes it as it is, and its backward takes delta from the exact
// output (the source pass first, see attention_native.py's _source_first).
template <int KIND>
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_impl(
    const char* op, const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const at::Tensor* slot_rows,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual, bool fp32_out,
    const c10::optional<at::Tensor>& hinted_indices = c10::nullopt) {
  constexpr int64_t kind = KIND;
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f = check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar,
                                    dst_scalar, att, edge);
  GNNIO_ENSURE(return_scores >= 0 && return_scores <= 2, op,
              ": return_scores must be 0 (none), 1 (before dropout) or 2 (after dropout), got ", return_scores);
  const at::ScalarType out_dtype = fp32_out ? at::kFloat : f.dtype;
  if (bias.has_value()) check_tensor(op, "bias", *bias, out_dtype, {f.heads, f.channels});
  if (residual.has_value()) check_tensor(op, "residual", *residual, f.dtype, {num_dst, f.heads, f.channels});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);

  at::Tensor out = at::empty({num_dst, f.heads, f.channels}, msg_src.options().dtype(out_dtype));
  at::Tensor lse = at::empty({num_dst, f.heads}, float_options);
  at::Tensor scores = at::empty({return_scores ? num_edges : 0, f.heads}, float_options);
  // The tiles' softmax states (max, sum, accumulator) share one buffer: each
  // allocation costs the host microseconds before the first launch.
  const int64_t tiles = schedule.num_tiles;
  at::Tensor tile_states = at::empty({tiles * f.heads * (2 + f.channels)}, float_options);
  float* const part_acc = tile_states.data_ptr<float>();  // first: its rows take 16-byte stores
  float* const part_max = part_acc + tiles * f.heads * f.channels;
  float* const part_sum = part_max + tiles * f.heads;
  at::Tensor edge_scores;  // the edge-balanced schedule's score phase only
  if (slot_rows != nullptr) {
    GNNIO_ENSURE(slot_rows->is_cuda() && slot_rows->device() == msg_src.device() &&
                     slot_rows->scalar_type() == at::kInt && slot_rows->dim() == 1 && slot_rows->is_contiguous() &&
                     slot_rows->numel() == num_edges,
                 op, ": slot_rows must be a contiguous int32 tensor of ", num_edges, " entries on ", msg_src.device(),
                 ", got ", slot_rows->scalar_type(), " of shape ", slot_rows->sizes(), " on ", slot_rows->device());
    GNNIO_ENSURE(num_dst < (int64_t{1} << 31), op, ": slot_rows holds int32 rows; got ", num_dst, " targets");
    edge_scores = at::empty({num_edges, f.heads}, float_options);
  }
  // the edge-balanced schedule's fused pass keeps the one-edge-per-warp layouts
  const at::Tensor& bias_or_out = bias.has_value() ? *bias : out;  // alignment of each tensor read
  const at::Tensor& residual_or_out = residual.has_value() ? *residual : out;
  int vec = slot_rows == nullptr ? paired_vector_width(f, {&out, &bias_or_out, &residual_or_out})
                                 : vector_width(f, {&out, &bias_or_out, &residual_or_out});
  // all_aligned counts the features' elements; an fp32 bias's 4-wide loads need 16 bytes
  if (fp32_out && vec > 1 && reinterpret_cast<uintptr_t>(bias_or_out.data_ptr()) % 16 != 0) vec = 1;
  // Dot's forward gathers ahead in the 4-wide layout and, for 16-bit rows, the 8-wide one (two edge
  // groups per warp). H100, rmat20, bf16 4 x 32: 1.97 ms per step (8-wide forward_kernel), 2.09
  // through the 4-wide ring (run 118), 1.69 through the 8-wide ring (run 128).
  const bool plain = slot_rows == nullptr && !edge.has_value() && dropout <= 0.0 && return_scores == 0;
  const bool dot_ahead = plain && kind == kDot && (vec == 4 || vec == 8) && gathers_ahead();
  const bool gat_ahead = plain && kind == kGat && vec == 4 && f.dtype == at::kFloat && gathers_ahead();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    const bool separate_f32 = fp32_out && !std::is_same<scalar_t, float>::value;
    if (separate_f32) {
      p.out_f32 = out.data_ptr<float>();
      p.out_bias_f32 = ptr_or_null<float>(bias);
    } else {
      p.out = out.data_ptr<scalar_t>();
      p.out_bias = ptr_or_null<scalar_t>(bias);
    }
    p.out_residual = ptr_or_null<scalar_t>(residual);
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.lse = lse.data_ptr<float>();
    p.scores = return_scores ? scores.data_ptr<float>() : nullptr;
    p.scores_after_dropout = return_scores == 2;
    p.part_max = part_max;
    p.part_sum = part_sum;
    p.part_acc = part_acc;
    if (dot_ahead) {
      if constexpr (KIND == kDot) launch_dot_forward_ahead<scalar_t>(vec, p, stream);
    } else if (gat_ahead) {
      if constexpr (KIND == kGat && std::is_same<scalar_t, float>::value)  // gat_ahead: fp32 only
        launch_resident(gat_forward_ahead_kernel<scalar_t>, p, stream, GatForwardRing::kBlockBytes);
    } else if (vec == 8) {
      launch_paired_forward<KIND, scalar_t>(p, stream);
    } else GNNIO_ATTENTION_VEC_SWITCH(vec, [&] {
      if (slot_rows == nullptr) {
        launch_forward<KIND, VEC, scalar_t>(p, stream);
        return;
      }
      if (num_edges > 0) {
        const int64_t warps = (num_edges + kSlotsPerScoreWarp - 1) / kSlotsPerScoreWarp;
        const int head_groups = (p.geo.heads + p.geo.heads_per_warp - 1) / p.geo.heads_per_warp;
        const dim3 score_grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock),
                              static_cast<unsigned>(head_groups));
        edge_scores_kernel<KIND, VEC, scalar_t><<<score_grid, kWarpsPerBlock * kWarp, 0, stream>>>(
            p, slot_rows->data_ptr<int32_t>(), num_edges, kSlotsPerScoreWarp, edge_scores.data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      p.scores_in = edge_scores.data_ptr<float>();
      launch_resident(forward_kernel<KIND, VEC, scalar_t, true>, p, stream);
    });
    if (schedule.num_heavy > 0) {
      const int threads = merge_threads(f.heads * f.channels);
      const auto blocks = static_cast<unsigned>(schedule.num_heavy);
      const int heads = static_cast<int>(f.heads), channels = static_cast<int>(f.channels);
      if (separate_f32) {
        merge_tiles_kernel<scalar_t, float><<<blocks, threads, 0, stream>>>(
            schedule, heads, channels, p.part_max, p.part_sum, p.part_acc, p.out_bias_f32, p.out_residual, p.out_f32,
            p.lse);
      } else {
        merge_tiles_kernel<scalar_t><<<blocks, threads, 0, stream>>>(
            schedule, heads, channels, p.part_max, p.part_sum, p.part_acc, p.out_bias, p.out_residual, p.out, p.lse);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {out, lse, scores};
}

template <int KIND>
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& hinted_indices, const c10::optional<at::Tensor>& residual,
    bool fp32_out = false) {
  return forward_impl<KIND>(kForward[KIND], indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr,
                      tile_edges, row_order, num_busy_rows, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att,
                      edge, negative_slope, scale, dropout, seed, offset, return_scores, nullptr, bias, residual,
                      fp32_out, hinted_indices);
}

template <int KIND>
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward_edge_balanced(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, double negative_slope, double scale,
    double dropout, int64_t seed, int64_t offset, int64_t return_scores, const at::Tensor& slot_rows,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual, bool fp32_out = false) {
  return forward_impl<KIND>(kForwardEdgeBalanced[KIND], indptr, indices, eid, tile_row, tile_start, heavy_rows,
                      heavy_tile_ptr, tile_edges, row_order, num_busy_rows, msg_src, key_src, dst_vec, src_scalar,
                      dst_scalar, att, edge, negative_slope, scale, dropout, seed, offset, return_scores, &slot_rows,
                      bias, residual, fp32_out);
}

// Heavy rows of the backward source pass: the tiles' partial rows [T, width]
// added in tile order into their rows of out ([N, H, C] or [N, H]), and
// where given partial2's into out2's in the same pass (Dot's and Cosine's d key
// beside d value: one pass of one block per heavy row, not two).
void sum_tiles(const RowSchedule& s, int64_t width, const at::Tensor& partial, const at::Tensor& out,
               const at::Tensor* partial2 = nullptr, const at::Tensor* out2 = nullptr) {
  at::Tensor rows = out.view({out.size(0), width});
  at::Tensor rows2 = out2 != nullptr ? out2->view({out2->size(0), width}) : at::Tensor();
  merge_partial_sums(s, partial, rows, partial2, out2 != nullptr ? &rows2 : nullptr);
}

template <int KIND>
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_target(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& grad_out,
    const at::Tensor& lse, double negative_slope, double scale, double dropout, int64_t seed, int64_t offset) {
  const char* op = kBackwardTarget[KIND];
  constexpr int64_t kind = KIND;
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  check_tensor(op, "grad_out", grad_out, f.dtype, {num_dst, f.heads, f.channels});
  check_tensor(op, "lse", lse, at::kFloat, {num_dst, f.heads});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t tiles = schedule.num_tiles;
  const int64_t per_head = kind == kGat ? 1 : f.channels;

  at::Tensor grad_dst = at::empty({num_dst, f.heads * per_head}, msg_src.options());
  // (lse, delta[, 1 / |x_dst|, 0]) per (target, head): the source pass's row_stats (store_row_stats)
  at::Tensor row_stats = at::empty({num_dst, f.heads, row_stats_width(kind)}, float_options);
  at::Tensor part_delta = at::empty({tiles, f.heads}, float_options);
  at::Tensor part_weighted = at::empty({tiles, f.heads * per_head}, float_options);
  at::Tensor part_plain = at::empty({tiles, f.heads * per_head}, float_options);
  const int64_t att_tiles = kind == kGatV2 ? tiles : 0;
  at::Tensor part_att_weighted = at::empty({att_tiles, f.heads * f.channels}, float_options);
  at::Tensor part_att_plain = at::empty({att_tiles, f.heads * f.channels}, float_options);
  at::Tensor att_rows = at::empty({kind == kGatV2 ? schedule.num_heavy : 0, f.heads * f.channels}, float_options);
  // Cosine: the tiles' and the heavy rows' shares of d beta
  const bool cosine = kind == kCosine;
  at::Tensor part_beta_weighted = at::empty({cosine ? tiles : 0, f.heads}, float_options);
  at::Tensor part_beta_plain = at::empty({cosine ? tiles : 0, f.heads}, float_options);
  at::Tensor beta_rows = at::empty({cosine ? schedule.num_heavy : 0, f.heads}, float_options);
  const int vec = paired_vector_width(f, {&grad_out, &grad_dst});
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor grad_att = at::empty({0}, msg_src.options());

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    at::Tensor att_partial = at::empty({0, f.heads * f.channels}, float_options);
    p.grad_out = grad_out.data_ptr<scalar_t>();
    p.lse_in = lse.data_ptr<float>();
    p.grad_vec = kind == kGat ? nullptr : grad_dst.data_ptr<scalar_t>();
    p.grad_scalar = kind == kGat ? grad_dst.data_ptr<scalar_t>() : nullptr;
    p.stats_out = row_stats.data_ptr<float>();
    p.part_delta = part_delta.data_ptr<float>();
    p.part_vec = part_weighted.data_ptr<float>();
    p.part_vec2 = part_plain.data_ptr<float>();
    p.part_scalar = (cosine ? part_beta_weighted : part_weighted).data_ptr<float>();
    p.part_scalar2 = (cosine ? part_beta_plain : part_plain).data_ptr<float>();
    p.part_att = part_att_weighted.data_ptr<float>();
    p.part_att2 = part_att_plain.data_ptr<float>();
    GNNIO_ATTENTION_PAIRED_VEC_SWITCH(vec, [&] {
      const auto kernel = backward_target_kernel<KIND, VEC, scalar_t>;
      const dim3 grid = resident_grid(kernel, p);
      // GATv2: one attention-vector partial row per resident warp; Cosine: one d beta row
      if (kind == kGatV2) att_partial = at::empty({grid.x * int64_t{kWarpsPerBlock}, f.heads * f.channels}, float_options);
      if (cosine) att_partial = at::zeros({grid.x * int64_t{kWarpsPerBlock}, f.heads}, float_options);
      p.att_partial = att_partial.data_ptr<float>();
      if (grid.x == 0) return;
      kernel<<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (schedule.num_heavy > 0) {
      const int threads = merge_threads(f.heads * per_head);
      finish_target_tiles_kernel<scalar_t><<<static_cast<unsigned>(schedule.num_heavy), threads, 0, stream>>>(
          schedule, static_cast<int>(f.heads), static_cast<int>(per_head), kind == kDot || cosine ? p.scale : 1.f,
          cosine ? p.beta : nullptr, p.part_delta, p.part_vec, p.part_vec2, p.part_att, p.part_att2, p.part_scalar,
          p.part_scalar2, grad_dst.data_ptr<scalar_t>(), p.lse_in, cosine ? p.dst_norm : nullptr, p.stats_out,
          kind == kGatV2 ? att_rows.data_ptr<float>() : nullptr, cosine ? beta_rows.data_ptr<float>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (kind == kGatV2) grad_att = (att_partial.sum(0) + att_rows.sum(0)).view({f.heads, f.channels}).to(f.dtype);
    // fp32 like beta itself
    if (cosine) grad_att = att_partial.sum(0) + beta_rows.sum(0);
  });
  if (kind != kGat) grad_dst = grad_dst.view({num_dst, f.heads, f.channels});
  return {grad_dst, grad_att, row_stats};
}


// GAT's packed gradients (see the schemas): [N, H * C + 2H], rows of (d x_src,
// d alpha_src, d alpha_dst), for x_src and alpha_dst rows of the same nodes.
int64_t check_packed_grads(const char* op, const c10::optional<at::Tensor>& packed, const Features& f,
                           int64_t num_dst) {
  if (!packed.has_value()) return 0;
  GNNIO_ENSURE(f.kind == kGat, op, ": packed_grads are for kind 0 (GAT) only, got kind ", f.kind);
  GNNIO_ENSURE(f.num_src == num_dst, op, ": packed_grads need as many sources as targets, got ", f.num_src, " and ",
              num_dst);
  const int64_t width = f.heads * f.channels + 2 * f.heads;
  check_tensor(op, "packed_grads", *packed, f.dtype, {f.num_src, width});
  return width;
}

template <int KIND>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_source(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& grad_out,
    const at::Tensor& row_stats, double negative_slope, double scale, double dropout,
    int64_t seed, int64_t offset, bool write_edge_grads, const c10::optional<at::Tensor>& packed_grads,
    const c10::optional<at::Tensor>& hinted_indices) {
  const char* op = kBackwardSource[KIND];
  constexpr int64_t kind = KIND;
  const int64_t num_src = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_src, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  GNNIO_ENSURE(grad_out.dim() == 3, op, ": grad_out must have 3 dims [Nd, H, C], got shape ", grad_out.sizes());
  const int64_t num_dst = grad_out.size(0);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  GNNIO_ENSURE(f.num_src == num_src, op, ": msg_src has ", f.num_src, " rows but the CSC has ", num_src);
  check_tensor(op, "grad_out", grad_out, f.dtype, {num_dst, f.heads, f.channels});
  // (lse, delta[, 1 / |x_dst|, 0]) side by side, as attention_row_dots (given lse) or attention_backward_target
  // writes them: the pass gathers them for every edge
  check_tensor(op, "row_stats", row_stats, at::kFloat, {num_dst, f.heads, row_stats_width(kind)});
  GNNIO_ENSURE(!write_edge_grads || kind == kGat || kind == kDot, op,
              ": edge gradients are written for kinds 0 (GAT) and 2 (dot) only, got kind ", kind);
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t tiles = schedule.num_tiles;

  at::Tensor edge_grads = at::empty({write_edge_grads ? num_edges : 0, f.heads}, float_options);
  const int64_t packed_width = check_packed_grads(op, packed_grads, f, num_dst);
  const int64_t row_width = f.heads * f.channels;
  // packed: d x_src and d alpha_src are views of packed_grads' rows
  at::Tensor grad_msg = packed_width > 0 ? packed_grads->narrow(1, 0, row_width).view({num_src, f.heads, f.channels})
                                         : at::empty({num_src, f.heads, f.channels}, msg_src.options());
  // Cosine: d u_src through the scores, kept only for the heavy rows' node pass (the light rows' is folded in)
  const bool has_key = kind == kDot || kind == kCosine;
  const int64_t key_rows = kind == kDot || (kind == kCosine && schedule.num_heavy > 0) ? num_src : 0;
  at::Tensor grad_key = at::empty({key_rows, f.heads, f.channels}, msg_src.options());
  at::Tensor grad_scalar = packed_width > 0 ? packed_grads->narrow(1, row_width, f.heads)
                                            : at::empty({kind == kGat ? num_src : 0, f.heads}, msg_src.options());
  at::Tensor grad_edge = edge.has_value() ? at::empty_like(*edge) : at::empty({0}, msg_src.options());
  at::Tensor part_vec = at::empty({tiles, f.heads, f.channels}, float_options);
  at::Tensor part_vec2 = at::empty({has_key ? tiles : 0, f.heads, f.channels}, float_options);
  at::Tensor part_scalar = at::empty({kind == kGat ? tiles : 0, f.heads}, float_options);
  // vector stores into packed rows need their width a multiple of the vector width as well
  int vec = paired_vector_width(f, {&grad_out, &grad_msg, &grad_key, &grad_edge});
  while (packed_width % vec != 0) vec = vec == 8 ? 4 : 1;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p =
        make_params<scalar_t>(f, schedule, order, indices, eid, vec, negative_slope, scale, dropout, seed, offset);
    if (packed_width > 0) p.grad_vec_stride = p.grad_scalar_stride = packed_width;
    p.grad_out = grad_out.data_ptr<scalar_t>();
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.row_stats = row_stats.data_ptr<float>();
    p.grad_vec = grad_msg.data_ptr<scalar_t>();
    p.grad_vec2 = has_key ? grad_key.data_ptr<scalar_t>() : nullptr;
    p.grad_scalar = kind == kGat ? grad_scalar.data_ptr<scalar_t>() : nullptr;
    p.grad_edge = edge.has_value() ? grad_edge.data_ptr<scalar_t>() : nullptr;
    p.edge_grads = write_edge_grads ? edge_grads.data_ptr<float>() : nullptr;
    p.part_vec = part_vec.data_ptr<float>();
    p.part_vec2 = part_vec2.data_ptr<float>();
    p.part_scalar = part_scalar.data_ptr<float>();
    if (kind == kDot && vec == 4 && p.edge == nullptr && p.dropout.p <= 0.f && gathers_ahead()) {
      if constexpr (KIND == kDot)
        launch_ahead<DotSourceRing<scalar_t>, 4>(dot_source_ahead_kernel<scalar_t, 8>,
                                                 dot_source_ahead_kernel<scalar_t, 0>, p, stream);
    } else {
      GNNIO_ATTENTION_PAIRED_VEC_SWITCH(vec, [&] {
        launch_resident(backward_source_kernel<KIND, VEC, scalar_t>, p, stream);
      });
    }
    sum_tiles(schedule, f.heads * f.channels, part_vec, grad_msg, has_key ? &part_vec2 : nullptr,
              has_key ? &grad_key : nullptr);
    if (kind == kGat) sum_tiles(schedule, f.heads, part_scalar, grad_scalar);
    if constexpr (KIND == kCosine) {
      if (schedule.num_heavy > 0) {
      // the heavy rows' d x_src = V + F.normalize's backward of B (+ A), V already in grad_msg
      const int64_t rows = schedule.num_heavy * f.heads;
      unit_rows_backward_kernel<scalar_t><<<unit_row_blocks(rows), kWarpsPerBlock * kWarp, 0, stream>>>(
          p.msg_src, p.src_norm, grad_key.data_ptr<scalar_t>(), p.unit_grad, grad_msg.data_ptr<scalar_t>(), rows,
          schedule.heavy_rows, static_cast<int>(f.heads), static_cast<int>(f.channels),
          grad_msg.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    }
  });
  if (kind == kCosine) grad_key = at::empty({0}, msg_src.options());  // scratch, not an output
  return {grad_msg, grad_key, grad_scalar, grad_edge, edge_grads};
}

// GAT's and Dot's target-side gradients from the source pass's edge_grads
// (gat_target_sums_kernel, dot_target_from_edges_kernel): d alpha_dst [Nd, H] or d query [Nd, H, C].
template <int KIND>
at::Tensor attention_backward_target_from_edges(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
    const at::Tensor& tile_row, const at::Tensor& tile_start, const at::Tensor& heavy_rows,
    const at::Tensor& heavy_tile_ptr, int64_t tile_edges, const at::Tensor& row_order, int64_t num_busy_rows,
    const at::Tensor& msg_src,
    const c10::optional<at::Tensor>& key_src, const c10::optional<at::Tensor>& dst_vec,
    const c10::optional<at::Tensor>& src_scalar, const c10::optional<at::Tensor>& dst_scalar,
    const c10::optional<at::Tensor>& att, const c10::optional<at::Tensor>& edge, const at::Tensor& edge_grads,
    const at::Tensor& edge_grad_slots, const c10::optional<at::Tensor>& packed_grads,
    const c10::optional<at::Tensor>& hinted_indices) {
  const char* op = kBackwardTargetFromEdges[KIND];
  static_assert(KIND == kGat || KIND == kDot, "GAT and Dot alone sum the source pass's score gradients");
  constexpr int64_t kind = KIND;
  const int64_t num_dst = indptr.numel() - 1, num_edges = indices.numel();
  const RowSchedule schedule =
      row_schedule(op, indptr, num_dst, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges);
  const RowOrder order = row_order_view(op, schedule, row_order, num_busy_rows);
  check_graph(op, indices, eid, num_edges);
  const Features f =
      check_features(op, kind, num_dst, num_edges, msg_src, key_src, dst_vec, src_scalar, dst_scalar, att, edge);
  check_tensor(op, "edge_grads", edge_grads, at::kFloat, {num_edges, f.heads});
  check_tensor(op, "edge_grad_slots", edge_grad_slots, at::kLong, {num_edges});
  const c10::cuda::CUDAGuard guard(msg_src.device());
  const auto float_options = msg_src.options().dtype(at::kFloat);
  const int64_t per_head = kind == kGat ? 1 : f.channels;
  const int64_t packed_width = check_packed_grads(op, packed_grads, f, num_dst);
  // packed: d alpha_dst is a view of packed_grads' last H columns
  at::Tensor grad_dst = packed_width > 0 ? packed_grads->narrow(1, packed_width - f.heads, f.heads)
                                         : at::empty({num_dst, f.heads * per_head}, msg_src.options());
  at::Tensor partial = at::empty({schedule.num_tiles, f.heads * per_head}, float_options);
  const int vec = vector_width(f, {&grad_dst});
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  GNNIO_DISPATCH_FEATURES(f.dtype, op, [&] {
    Params<scalar_t> p = make_params<scalar_t>(f, schedule, order, indices, eid, vec, 0.0, 1.0, 0.0, 0, 0);
    p.edge_grads_in = edge_grads.data_ptr<float>();
    p.edge_grad_slot = edge_grad_slots.data_ptr<int64_t>();
    p.hinted = hinted_ids(op, hinted_indices, indices);
    p.grad_vec = kind == kDot ? grad_dst.data_ptr<scalar_t>() : nullptr;
    p.grad_scalar = kind == kGat ? grad_dst.data_ptr<scalar_t>() : nullptr;
    if (packed_width > 0) p.grad_scalar_stride = packed_width;
    p.part_vec = partial.data_ptr<float>();
    p.part_scalar = partial.data_ptr<float>();
    if constexpr (KIND == kGat) {
      const int64_t items = schedule.num_tiles + order.busy + order.empty;
      const int64_t threads = kWarpsPerBlock * kWarp;
      const bool four_heads = f.heads % 4 == 0 && reinterpret_cast<uintptr_t>(p.edge_grads_in) % 16 == 0;
      const unsigned blocks = static_cast<unsigned>((items + threads - 1) / threads);
      if (items > 0 && four_heads) gat_target_sums_kernel<scalar_t, 4><<<blocks, threads, 0, stream>>>(p);
      if (items > 0 && !four_heads) gat_target_sums_kernel<scalar_t, 1><<<blocks, threads, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if constexpr (KIND == kDot) {
      if (vec == 4 && p.edge == nullptr && gathers_ahead()) {
        launch_resident(dot_target_ahead_kernel<scalar_t>, p, stream, DotTargetRing<scalar_t>::kBlockBytes);
      } else if (vec == 4) {
        launch_resident(dot_target_from_edges_kernel<4, scalar_t>, p, stream);
      }
      if (vec == 1) launch_resident(dot_target_from_edges_kernel<1, scalar_t>, p, stream);
    }
    sum_tiles(schedule, f.heads * per_head, partial, grad_dst);
  });
  if (kind == kDot) grad_dst = grad_dst.view({num_dst, f.heads, f.channels});
  return grad_dst;
}

}  // namespace
}  // namespace attention
}  // namespace gnnio
