"""The fused AGNN's gradient formulas (native/attention/, kind Cosine), checked on the CPU in fp64.

The kernels read the rows x themselves with their norms (the cosine is
<x_t, x_s> / max(|x_s|, 1e-12) / max(|x_t|, 1e-12), the message x_s) and
assemble the gradient from
four sums (d beta, A = d u_dst, B = d u_src, V = d x through the messages)
and F.normalize's backward. This file writes those sums out edge by edge in
plain PyTorch (a model of what the kernels add up, not of how) and compares
them with autograd through PyG's AGNNConv and through the reference op, on
rows of norm 0, below, at and just above the floor, so a wrong formula or
floor semantics fails here without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from gnnio_cli.graph import Graph
from gnnio_cli.ops import agnn_attention, dispatch
from testing import assert_close, random_graph, randn

FLOOR = 1e-12  # F.normalize's eps
SPECIAL = 5  # rows 0 .. 4 of special_rows


def unit_rows(x):
    """(u, norm): x / max(|x|, FLOOR) and |x|, row by row."""
    norm = torch.linalg.vector_norm(x, dim=-1)
    return x / norm.clamp_min(FLOOR).unsqueeze(-1), norm


def unit_rows_backward(grad, unit, norm):
    """d(x / max(|x|, FLOOR))/dx applied to grad: (g - [norm >= FLOOR] <g, u> u) / max(norm, FLOOR)."""
    radial = (grad * unit).sum(-1, keepdim=True) * (norm >= FLOOR).unsqueeze(-1)
    return (grad - radial * unit) / norm.clamp_min(FLOOR).unsqueeze(-1)


def scatter_rows(index, values, size):
    return values.new_zeros((size, *values.shape[1:])).index_add(0, index, values)


@dataclass
class ModelResult:
    """The model's output and gradients; `*_conditioning` is max |G| / max(|x|, floor) per row, the size
    of the unit-row term before its radial part cancels: rounding noise of order 1e-16 times that is
    inherent (PyG's autograd has it too), and it is large for tiny rows."""

    out: torch.Tensor
    grad_src: torch.Tensor
    grad_dst: Optional[torch.Tensor]
    grad_beta: torch.Tensor
    src_conditioning: torch.Tensor
    dst_conditioning: Optional[torch.Tensor]


def conditioning(grad, norm):
    return grad.abs().amax(-1) / norm.clamp_min(FLOOR)


def softmax_by_target(score, dst, num_dst):
    """(softmax of each target's in-edge scores, lse per target with 0 for empty rows)."""
    row_max = torch.full((num_dst,), -torch.inf, dtype=score.dtype).scatter_reduce(0, dst, score, "amax")
    weight = torch.exp(score - row_max[dst])
    total = scatter_rows(dst, weight, num_dst)
    lse = torch.where(total > 0, row_max + torch.log(total), torch.zeros_like(total))
    return weight / total[dst], lse


def cosine_model(graph, x_src, x_dst, beta, grad_out, *, shared) -> ModelResult:
    """out and the gradients of (x_src, x_dst, beta) from the kernels' sums (native/attention/passes.cuh's header)."""
    src, dst = graph.edge_index()
    num_dst = graph.num_dst_nodes
    u_src, n_src = unit_rows(x_src)
    u_dst, n_dst = (u_src, n_src) if shared else unit_rows(x_dst)
    inverse_norm = 1.0 / n_src.clamp_min(FLOOR)[src]
    cosine = (u_dst[dst] * x_src[src]).sum(-1) * inverse_norm
    score = beta * cosine
    prob, _ = softmax_by_target(score, dst, num_dst)
    out = scatter_rows(dst, prob.unsqueeze(-1) * x_src[src], num_dst)

    dp = (grad_out[dst] * x_src[src]).sum(-1)
    delta = scatter_rows(dst, prob * dp, num_dst)
    score_grad = prob * (dp - delta[dst])
    grad_beta = (score_grad * cosine).sum()
    a_dst = beta * scatter_rows(dst, (score_grad * inverse_norm).unsqueeze(-1) * x_src[src], num_dst)
    b_src = beta * scatter_rows(src, score_grad.unsqueeze(-1) * u_dst[dst], graph.num_src_nodes)
    v_src = scatter_rows(src, prob.unsqueeze(-1) * grad_out[dst], graph.num_src_nodes)
    if shared:
        unit_grad = a_dst + b_src
        grad_src = v_src + unit_rows_backward(unit_grad, u_src, n_src)
        return ModelResult(out, grad_src, None, grad_beta, conditioning(unit_grad, n_src), None)
    grad_src = v_src + unit_rows_backward(b_src, u_src, n_src)
    grad_dst = unit_rows_backward(a_dst, u_dst, n_dst)
    return ModelResult(
        out, grad_src, grad_dst, grad_beta, conditioning(b_src, n_src), conditioning(a_dst, n_dst)
    )


def assert_rows_close(actual, expected, row_conditioning):
    """Row by row, relative to the larger of the row's size and its conditioning (rows under the floor
    get gradients of order 1e12, so one scale for the whole tensor would hide the ordinary rows)."""
    for row in range(expected.shape[0]):
        scale = max(expected[row].abs().max().item(), row_conditioning[row].item(), 1e-30)
        assert_close(actual[row] / scale, expected[row] / scale, atol=1e-9, rtol=1e-8)


def with_lonely_targets(graph: Graph) -> Graph:
    """`graph` plus SPECIAL new nodes, node num_nodes + i with one in-edge, from node i: their outputs are
    x_i itself (softmax weight 1), so a wrong message for a special row shows at full relative size."""
    src, dst = graph.edge_index()
    extra = torch.arange(SPECIAL)
    edges = torch.stack([torch.cat([src, extra]), torch.cat([dst, graph.num_nodes + extra])])
    return Graph.from_edge_index(edges.numpy(), num_nodes=graph.num_nodes + SPECIAL)


def special_rows(num_nodes, channels, seed):
    """fp64 rows, random except: 0 a zero row, 1 norm 0.5e-12 (below the floor), 2 exactly at the
    floor's value when that is exact in fp64, 3 norm 3e-12 (tiny, above), 4 norm 1e6."""
    x = randn(num_nodes, channels, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x[0] = 0.0
    for row, norm in ((1, 0.5e-12), (3, 3e-12), (4, 1e6)):
        x[row] = x[row] / torch.linalg.vector_norm(x[row]) * norm
    x[2] = 0.0
    x[2, 0] = FLOOR  # |x| = 1e-12: the floor divides, and clamp_min passes the norm's gradient
    return x


@pytest.mark.parametrize("channels", [1, 7, 33, 130])
@pytest.mark.parametrize("beta", [1.7, -0.4])
def test_model_equals_pyg_agnnconv(channels, beta):
    from torch_geometric.nn import AGNNConv

    graph = with_lonely_targets(random_graph(60, 500, hub_degree=80, seed=channels))
    conv = AGNNConv(requires_grad=True, add_self_loops=False).double()
    with torch.no_grad():
        conv.beta.fill_(beta)
    x = special_rows(graph.num_nodes, channels, seed=channels + 1).requires_grad_()
    expected = conv(x, graph.edge_index())
    grad_out = randn(*expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected_x, expected_beta = torch.autograd.grad(expected, (x, conv.beta), grad_out)
    assert torch.isfinite(expected_x).all()

    model = cosine_model(graph, x.detach(), None, conv.beta.detach(), grad_out, shared=True)
    assert_rows_close(model.out, expected, torch.zeros(expected.shape[0]))
    assert_rows_close(model.grad_src, expected_x, model.src_conditioning)
    assert_close(model.grad_beta.reshape(1), expected_beta, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("channels", [1, 7, 33])
def test_model_equals_reference_on_bipartite_graph(channels):
    """x_src and x_dst separate (two unit-row backward passes), with empty target rows."""
    graph = random_graph(50, 400, num_dst_nodes=30, seed=channels + 10)
    x_src = special_rows(graph.num_src_nodes, channels, seed=3).requires_grad_()
    x_dst = special_rows(graph.num_dst_nodes, channels, seed=4).flip(0).contiguous().requires_grad_()
    beta = torch.tensor([0.9], dtype=torch.float64, requires_grad=True)
    with dispatch.use_backend("reference"):
        expected = agnn_attention(graph, x_src, x_dst, beta)
    grad_out = randn(*expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    expected_grads = torch.autograd.grad(expected, (x_src, x_dst, beta), grad_out)

    model = cosine_model(graph, x_src.detach(), x_dst.detach(), beta.detach(), grad_out, shared=False)
    assert_rows_close(model.out, expected, torch.zeros(expected.shape[0]))
    assert_rows_close(model.grad_src, expected_grads[0], model.src_conditioning)
    assert_rows_close(model.grad_dst, expected_grads[1], model.dst_conditioning)
    assert_close(model.grad_beta.reshape(1), expected_grads[2], atol=1e-9, rtol=1e-8)


def test_cosine_needs_the_clamped_norm():
    """x / max(norm, floor) is u for every row (so <u_t, x_s> / max(n_s, floor) is the cosine);
    with the raw norm that fails under the floor."""
    x = special_rows(20, 7, seed=22)
    unit, norm = unit_rows(x)
    assert torch.allclose(norm.clamp_min(FLOOR).unsqueeze(-1) * unit, x, rtol=1e-12, atol=0)
    assert not torch.allclose(norm.unsqueeze(-1) * unit, x, rtol=1e-3, atol=0)


# ------------------------------------------------------------------ the Python side of the native path
class FakeCosineKernels:
    """torch.ops.gnnio's cosine ops on the CPU: each returns what the CUDA op returns
    (native/attention/cosine.cu's schema comment), computed edge by edge in fp64, so attention_native's autograd
    wiring (which sum goes where, shared x, beta's shape) runs without a GPU. No dropout."""

    SCHEDULE_ARGS = 7  # tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order, num_busy_rows

    @staticmethod
    def _split(args):
        indptr, indices, _eid = args[:3]
        rest = args[3 + FakeCosineKernels.SCHEDULE_ARGS :]
        x_src, x_dst, norm_src, norm_dst, beta = rest[:5]
        rows = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())
        # the target's unit rows, as the kernels form them from x_dst and its norm
        # the norms as attention_row_norms gives them: (|x|, 1 / max(|x|, floor)) per (row, head)
        u_dst = x_dst[:, 0] / norm_dst[:, 0, 0].double().clamp_min(FLOOR).unsqueeze(-1)
        return (rows, indices.long()), (x_src[:, 0], u_dst, norm_src[:, 0, 0], beta[0]), rest[5:]

    @staticmethod
    def _scores(x_src, u_dst, n_src, beta, src, dst):
        cosine = (u_dst[dst] * x_src[src]).sum(-1) / n_src.clamp_min(FLOOR)[src]
        return beta * cosine, cosine

    def cosine_attention_forward(self, *args):
        (dst, src), (x_src, u_dst, n_src, beta), rest = self._split(args)
        dropout, _seed, _offset, return_scores = rest
        assert dropout == 0.0
        score, _ = self._scores(x_src, u_dst, n_src, beta, src, dst)
        prob, lse = softmax_by_target(score, dst, u_dst.shape[0])
        out = scatter_rows(dst, prob.unsqueeze(-1) * x_src[src], u_dst.shape[0])
        scores = torch.empty(0, 1, dtype=torch.float32)
        if return_scores:  # eid order
            scores = torch.empty(src.numel(), 1, dtype=torch.float32)
            scores[args[2], 0] = score.float()
        return out.unsqueeze(1), lse.unsqueeze(1).float(), scores

    def _score_grad(self, src, dst, x_src, u_dst, n_src, beta, grad_out, lse):
        score, cosine = self._scores(x_src, u_dst, n_src, beta, src, dst)
        prob = torch.exp(score - lse[dst])
        dp = (grad_out[dst] * x_src[src]).sum(-1)
        return prob, dp, cosine

    def cosine_attention_backward_target(self, *args):
        (dst, src), (x_src, u_dst, n_src, beta), (grad_out, lse_in, *_dropout) = self._split(args)
        grad_out, lse = grad_out[:, 0], lse_in[:, 0].double()
        prob, dp, cosine = self._score_grad(src, dst, x_src, u_dst, n_src, beta, grad_out, lse)
        delta = scatter_rows(dst, prob * dp, u_dst.shape[0])
        score_grad = prob * (dp - delta[dst])
        u_src = x_src[src] / n_src.clamp_min(FLOOR)[src].unsqueeze(-1)
        grad_unit_dst = beta * scatter_rows(dst, score_grad.unsqueeze(-1) * u_src, u_dst.shape[0])
        grad_beta = (score_grad * cosine).sum().reshape(1).float()
        # the source pass's row_stats: (lse, delta, 1 / max(|x_dst|, floor), 0) per (target, head)
        inverse_norm = args[3 + self.SCHEDULE_ARGS + 3][..., 1]  # norm_dst's
        row_stats = torch.stack([lse_in, delta.unsqueeze(1).float(), inverse_norm, torch.zeros_like(lse_in)], -1)
        return grad_unit_dst.unsqueeze(1), grad_beta, row_stats

    def cosine_attention_backward_source(self, *args):
        (src, dst), (x_src, u_dst, n_src, beta), (unit_grad_dst, grad_out, row_stats, *_dropout) = self._split(args)
        assert row_stats.shape == (u_dst.shape[0], 1, 4), row_stats.shape
        grad_out, lse, delta = grad_out[:, 0], row_stats[:, 0, 0].double(), row_stats[:, 0, 1].double()
        prob, dp, _ = self._score_grad(src, dst, x_src, u_dst, n_src, beta, grad_out, lse)
        score_grad = prob * (dp - delta[dst])
        grad_message = scatter_rows(src, prob.unsqueeze(-1) * grad_out[dst], x_src.shape[0])
        grad_unit = beta * scatter_rows(src, score_grad.unsqueeze(-1) * u_dst[dst], x_src.shape[0])
        if unit_grad_dst is not None:
            grad_unit = grad_unit + unit_grad_dst[:, 0]
        unit = x_src / n_src.double().clamp_min(FLOOR).unsqueeze(-1)
        grad_x = grad_message + unit_rows_backward(grad_unit, unit, n_src.double())
        return grad_x.unsqueeze(1)

    def attention_row_norms(self, x):
        norm = unit_rows(x)[1]
        return torch.stack([norm, 1.0 / norm.clamp_min(FLOOR)], -1).float()

    def attention_unit_rows_backward(self, x, norm, grad_unit):
        norm = norm[..., 0].double()
        unit = x / norm.clamp_min(FLOOR).unsqueeze(-1)
        return unit_rows_backward(grad_unit, unit, norm)


@pytest.mark.parametrize("shared", [True, False], ids=["x_dst-is-x_src", "separate"])
def test_native_wiring_with_fake_kernels(shared, monkeypatch):
    """attention_native.agnn_attention's autograd Function over kernels that compute the schema's
    results: forward, the gradients of x (both sharing cases) and beta, and the returned weights."""
    from gnnio_cli.ops import attention_native

    monkeypatch.setattr(torch.ops, "gnnio", FakeCosineKernels())
    graph = random_graph(40, 300, hub_degree=30, seed=31)
    x_src = randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(32)).requires_grad_()
    x_dst = x_src if shared else randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(33)).requires_grad_()
    beta = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)  # 0-dim, as some callers pass it
    leaves = (x_src, beta) if shared else (x_src, x_dst, beta)
    grad_out = randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(34))

    out = attention_native.agnn_attention(graph, x_src, x_dst, beta, 0.0, False, False)
    grads = torch.autograd.grad(out, leaves, grad_out)
    with dispatch.use_backend("reference"):
        expected = agnn_attention(graph, x_src, x_dst, beta)
        expected_grads = torch.autograd.grad(expected, leaves, grad_out)
        with torch.no_grad():
            _, expected_alpha = agnn_attention(graph, x_src, x_dst, beta, return_attention=True)
    assert_close(out, expected, atol=1e-6, rtol=1e-6)  # lse travels in fp32, as in the kernels
    for mine, theirs in zip(grads, expected_grads):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        _, alpha = attention_native.agnn_attention(graph, x_src, x_dst, beta, 0.0, False, True)
    assert_close(alpha, expected_alpha, atol=1e-6, rtol=1e-6)
