"""Dense projections of node features: x @ W_i^T + b_i for weights W_i sharing one x, and their gradients.

Every layer's Linear maps go through here (``nn.linear``). Two implementations:

- torch's own GEMMs (F.linear, @, addmm_; in fp32 without TF32, as torch's
  default). Every dtype and device.
- split TF32 (native/dense.cu): fp32 CUDA tensors on compute capability
  8.0+. Each fp32 operand is split into two TF32 parts and every product is
  taken as three TF32 tensor-core products, whose partial sums (per 8-wide k
  step with mma.sync, per 32-wide k-tile with the warpgroup MMAs that
  H100/H200 builds use) are added to the accumulator in fp32 with
  round-to-nearest. That keeps fp32's accuracy: on rmat20's projections its
  error against fp64 is 0.5x (mma.sync) to 0.8x (wgmma) cuBLAS SGEMM's, and
  the tests hold it to a small multiple of SGEMM's everywhere. All
  projections of one x are one product: the forward writes each output to a
  tensor of its own, the input gradient reads every output gradient as one
  operand, and the weight gradients come out as one [sum of widths, F]
  product whose row sums are the bias gradients. Long products (the weight
  gradients sum over every node) are split into ranges added in order:
  deterministic. Inputs it does not take (another dtype or device, a width
  not a multiple of 4, more than four projections, a double backward) get
  torch's GEMMs.

``GNNIO_FP32_MATMUL`` chooses:

- ``auto`` (the default): the kernel where it can take the product and the
  product uses at least 90% of the work of its whole 128 x 128 x 32 tiles,
  else torch's GEMMs. On rmat20 (H100, wgmma) the kernel takes 1.62 / 1.49 /
  1.88 ms for the forward, input-gradient and weight-gradient products of
  four projections (all tiles full), where cuBLAS takes 3.42 / 3.98 / 3.51
  (mma.sync: 3.42 / 2.84 / 2.67); for GATConv's, 136 wide where tiles hold
  128 (h and the score terms), the mma.sync kernel was not faster: 1.77
  against 1.52 ms for the forward (53% of the work used), 1.06 against 1.06
  for x's gradient (85%), 1.29 against 1.05 for the weight gradients (53%)
  (H100, tests/perf/projections.py on x [1M, 128]).
  On H100/H200 the kernel runs the warpgroup MMAs, and there a B at most 1/16
  of A's size (the weights, in the forward and the input gradient) is split
  into its TF32 halves once, before the product.
- ``split-tf32``: the kernel wherever it can take the product.
- ``cublas``: torch's GEMMs always (bit for bit what F.linear gives).

Where the kernel runs it is recorded as op ``projection`` (``gnnio run``
shows it); torch's GEMMs are not recorded.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnio_cli import native
from gnnio_cli.errors import GnnioError
from gnnio_cli.ops import dispatch

MATMUL_ENV = "GNNIO_FP32_MATMUL"
MATMUL_CHOICES = ("auto", "split-tf32", "cublas")
MAX_PROJECTIONS = 4  # native/dense.cu's kMaxSegments
WIDTH_MULTIPLE = 4  # 16-byte chunks of fp32
TILE_MN, TILE_K = 128, 32  # native/dense.cu's kTileM = kTileN, and kTileK
MIN_TILE_FILL = 0.9  # auto: the least share of its tiles' work a product must use


def matmul_choice() -> str:
    """The fp32 projection kernel asked for by GNNIO_FP32_MATMUL (default auto)."""
    choice = os.environ.get(MATMUL_ENV, "auto")
    if choice not in MATMUL_CHOICES:
        raise GnnioError(f"{MATMUL_ENV}={choice!r}: choose one of {', '.join(MATMUL_CHOICES)}")
    return choice


def tile_fill(m: int, n: int, k: int) -> float:
    """The share of the kernel's multiply work (whole 128 x 128 x 32 tiles) that an [m, k] @ [k, n] product uses."""
    padded = -(-m // TILE_MN) * TILE_MN * -(-n // TILE_MN) * TILE_MN * -(-k // TILE_K) * TILE_K
    return m * n * k / padded if padded else 0.0


def projection_product(x: Tensor, widths: Sequence[int]) -> tuple[int, int, int]:
    """(m, n, k) of the forward product of x [*, F] for projections of `widths`: [rows, F] @ [F, sum widths]."""
    return x.numel() // max(x.shape[-1], 1), sum(widths), x.shape[-1]


def uses_split_tf32(x: Tensor, widths: Sequence[int], *others: Tensor, product: tuple[int, int, int]) -> bool:
    """Whether a product with operand x [*, F] over projections of `widths` (other operands: `others`),
    of shape (m, n, k) = `product` ([m, k] @ [k, n]), takes the split-TF32 kernel.

    The kernel needs F, the widths and n to be multiples of 4; the other operands' shapes follow from
    those (or the op refuses them), so only their dtypes are read here. This runs before a training
    step's first launch, where the GPU waits for every microsecond of the host's.
    """
    choice = matmul_choice()
    if not x.is_cuda or choice == "cublas" or not 0 < len(widths) <= MAX_PROJECTIONS:
        return False
    if choice == "auto" and tile_fill(*product) < MIN_TILE_FILL:
        return False
    if x.dtype is not torch.float32 or x.shape[-1] % WIDTH_MULTIPLE or product[1] % WIDTH_MULTIPLE:
        return False
    if any(width % WIDTH_MULTIPLE for width in widths) or any(t.dtype is not torch.float32 for t in others):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in others)):
        return False  # a double backward's products: the native one has no derivative of its own
    if dispatch.pick("projection", x) != "native":  # the others on another device: the op says so
        return False
    return dispatch.cuda_properties(x.device).major >= 8


def parameter_gradients_use_split_tf32(grads: Sequence[Tensor], rows: Tensor) -> bool:
    """Whether the weight gradients g_i^T @ rows (g_i [R, width_i], rows [R, F]) take the split-TF32 kernel."""
    widths = [g.shape[-1] for g in grads]
    return uses_split_tf32(rows, widths, *grads, product=(sum(widths), rows.shape[-1], rows.shape[0]))


def _aligned_rows(tensor: Tensor) -> Tensor:
    """`tensor` as contiguous [rows, width] starting on a 16-byte boundary (a copy only where needed)."""
    rows = (tensor if tensor.dim() == 2 else tensor.reshape(-1, tensor.shape[-1])).contiguous()
    return rows if rows.data_ptr() % 16 == 0 else rows.clone()


def _stacked(tensors: Sequence[Tensor]) -> Tensor:
    return tensors[0].contiguous() if len(tensors) == 1 else torch.cat(list(tensors))


def bias_gradient(grad: Tensor) -> Tensor:
    """The gradient of a bias added to every row of `grad` ([*, F]): its column sums, as ones @ grad.

    A matrix-vector product instead of torch's column reduction, which the
    bias of F.linear and of a broadcast add get: on tall node-feature tensors
    cuBLAS reads the rows at close to full bandwidth (H100, [1048576, 128]
    fp32: 0.213 ms against 0.391 ms for grad.sum(0)).
    """
    rows = grad.reshape(-1, grad.shape[-1])
    return torch.mv(rows.t(), rows.new_ones(rows.shape[0]))


def project(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]]) -> tuple[Tensor, ...]:
    """(x @ w_i^T + b_i for each i): x [*, F], w_i [width_i, F], b_i [width_i] or None -> [*, width_i] each.

    The kernel's op reads the weights and biases where they lie: a layer's
    forward starts on the GPU only when the host reaches this product's first
    launch, so no copies (or their host time) come before it.
    """
    widths = [w.shape[0] for w in weights]
    product = projection_product(x, widths)
    if not uses_split_tf32(x, widths, *weights, *[b for b in biases if b is not None], product=product):
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
    return project_split_tf32(x, weights, biases)


def project_split_tf32(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]]
) -> tuple[Tensor, ...]:
    """project's split-TF32 product, for a caller that has asked uses_split_tf32 already."""
    dispatch.record("projection", "split-tf32")
    outputs = torch.ops.gnnio.project_split_tf32(
        _aligned_rows(x), [w.contiguous() for w in weights], [b if b is None else b.contiguous() for b in biases]
    )
    if x.dim() == 2:
        return tuple(outputs)
    return tuple(out.view(*x.shape[:-1], out.shape[-1]) for out in outputs)


def project_input_gradient(grads: Sequence[Tensor], weights: Sequence[Tensor]) -> Tensor:
    """sum_i g_i @ w_i: g_i [rows, width_i], w_i [width_i, F] -> [rows, F].

    The cuBLAS path forms one g_i @ w_i and adds each further one inside its
    GEMM (addmm_, beta = 1), narrowest g_i first: a GEMM with a wide g is
    bound by its arithmetic, so the read of the sum it adds to hides behind
    it, where a narrow one (8 wide, say) is bound by memory and would pay for
    reading and writing the whole sum again.
    """
    product = (grads[0].shape[0], weights[0].shape[1], sum(g.shape[-1] for g in grads))
    if uses_split_tf32(grads[0], [g.shape[-1] for g in grads], *grads, *weights, product=product):
        stacked = _stacked(weights)
        operands = [_aligned_rows(g) for g in grads]
        return torch.ops.gnnio.matmul_split_tf32(operands, False, [stacked], False, None, [stacked.shape[1]])[0]
    narrow_first = sorted(range(len(grads)), key=lambda i: grads[i].shape[-1])
    grad_x = grads[narrow_first[0]] @ weights[narrow_first[0]]
    for i in narrow_first[1:]:
        grad_x.addmm_(grads[i], weights[i])
    return grad_x


def project_parameter_gradients(
    grads: Sequence[Tensor], rows: Tensor, weights_needed: Sequence[bool], biases_needed: Sequence[bool]
) -> list[Optional[Tensor]]:
    """[grad w_1, grad b_1, grad w_2, ...] of the projections of `rows` [R, F] whose outputs got g_i [R, width_i].

    grad w_i = g_i^T @ rows [width_i, F]; grad b_i = column sums of g_i; None where not needed.
    """
    widths = [g.shape[-1] for g in grads]
    if not any(weights_needed) and not any(biases_needed):
        return [None] * (2 * len(grads))
    if parameter_gradients_use_split_tf32(grads, rows):
        operands = [_aligned_rows(g) for g in grads]
        outputs = torch.ops.gnnio.matmul_split_tf32(
            operands, True, [_aligned_rows(rows)], False, None, [rows.shape[-1]], any(biases_needed)
        )
        weight_grads = outputs[0].split(widths)
        bias_grads = outputs[1].split(widths) if any(biases_needed) else [None] * len(grads)
    else:
        weight_grads = [g.t() @ rows if needed else None for g, needed in zip(grads, weights_needed)]
        bias_grads = [bias_gradient(g) if needed else None for g, needed in zip(grads, biases_needed)]
    result: list[Optional[Tensor]] = []
    for i in range(len(grads)):
        result.append(weight_grads[i] if weights_needed[i] else None)
        result.append(bias_grads[i] if biases_needed[i] else None)
    return result


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of the dense products (native/dense.cu), so torch.compile and opcheck can
    trace them."""

    @torch.library.register_fake("gnnio::matmul_split_tf32")
    def _(a, a_transposed, b, b_transposed, bias, out_widths, row_sums=False):
        rows = sum(t.shape[1] for t in a) if a_transposed else a[0].shape[0]
        outputs = [a[0].new_empty((rows, width)) for width in out_widths]
        return outputs + ([a[0].new_empty(rows)] if row_sums else [])

    @torch.library.register_fake("gnnio::project_split_tf32")
    def _(x, weights, biases):
        return [x.new_empty((x.shape[0], weight.shape[0])) for weight in weights]
