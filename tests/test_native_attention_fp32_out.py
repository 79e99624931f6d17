"""GAT and the Transformer with 16-bit features and an fp32 output (out_dtype=torch.float32, what their layers take
under CUDA autocast): the forward stores fp32 rows, the backward takes the source pass first with delta from that
output. Output and every gradient within twice plain PyTorch's own 16-bit error of the fp64 oracle, in NaN-poisoned
memory, with a large output bias or residual (which a delta from a rounded output would not survive). GPU only.
"""

from __future__ import annotations

import pytest
import torch

from gnnio_cli.ops import attention as attention_ops
from gnnio_cli.ops import attention_native, dispatch
from test_native_attention import forward_backward, make_inputs, small_graph
from testing import assert_within_torch_error, poison_cuda_cache, randn, relative_error

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("native_extension"),
]


def _with_extra(kind, graph, inputs, heads, channels, dtype, scale, seed):
    """inputs plus GAT's fp32 bias [H, C] or the Transformer's 16-bit residual [Nd, H, C], `scale` x randn."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "gat":
        extra = {"bias": (scale * randn(heads, channels, generator=gen)).to("cuda")}
    else:
        extra = {"residual": (scale * randn(graph.num_dst_nodes, heads, channels, generator=gen)).to("cuda", dtype)}
    return {**inputs, **{name: t.requires_grad_() for name, t in extra.items()}}


def _cast(inputs, dtype):
    """The features in `dtype`; GAT's bias in fp32 (the output's dtype) unless `dtype` is wider."""
    wide = dtype == torch.float64
    return {name: t.detach().to(dtype if wide or name != "bias" else torch.float32).requires_grad_()
            for name, t in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.0, 1.0, 10.0], ids=["no-extra", "extra", "extra-10x"])
@pytest.mark.parametrize("edges", [False, True], ids=["no-edge-features", "edge-features"])
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 16), (2, 128), (2, 12), (3, 33)])
@pytest.mark.parametrize("kind", ["gat", "transformer"])
def test_fp32_output_within_twice_torch_error(kind, heads, channels, edges, scale, dtype):
    """C % 8 == 0 takes the 8-wide layouts, 12 the 4-wide, 33 the scalar; the hub graph cuts rows into tiles
    (the split rows' merge stores fp32 too)."""
    graph = small_graph().to("cuda")
    inputs = make_inputs(kind, graph, heads, channels, dtype, edges=edges, seed=5 + heads * channels)
    if scale > 0.0:
        inputs = _with_extra(kind, graph, inputs, heads, channels, dtype, scale, seed=heads + channels)
    forward_backward(kind, graph, inputs, "native", out_dtype=torch.float32)  # the graph's structures, then poison
    poison_cuda_cache(16 * graph.num_edges * heads * channels)
    out, _, grads = forward_backward(kind, graph, inputs, "native", out_dtype=torch.float32)
    torch_out, _, torch_grads = forward_backward(kind, graph, _cast(inputs, dtype), "reference",
                                                 out_dtype=torch.float32)
    oracle_out, _, oracle_grads = forward_backward(kind, graph, _cast(inputs, torch.float64), "reference")
    assert out.dtype == torch.float32 and torch_out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert_within_torch_error(out, oracle_out, torch_out)
    for name in grads:
        assert grads[name].dtype == inputs[name].dtype, name
        assert torch.isfinite(grads[name]).all(), name
        assert_within_torch_error(grads[name], oracle_grads[name], torch_grads[name])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["gat", "transformer"])
def test_fp32_output_is_the_16bit_output_unrounded(kind, dtype):
    """The same sums as the 16-bit output's: rounding the fp32 output to the features' dtype gives it; the
    returned attention weights are fp32 and equal the 16-bit call's to its rounding."""
    graph = small_graph().to("cuda")
    inputs = make_inputs(kind, graph, 4, 32, dtype, seed=29)
    op = getattr(attention_ops, f"{kind}_attention")
    options = {"negative_slope": 0.2} if kind == "gat" else {}
    with dispatch.use_backend("native"), torch.no_grad():
        wide, wide_alpha = op(graph, **inputs, return_attention=True, out_dtype=torch.float32, **options)
        narrow, narrow_alpha = op(graph, **inputs, return_attention=True, **options)
    assert wide.dtype == wide_alpha.dtype == torch.float32
    assert torch.equal(wide.to(dtype), narrow)
    assert relative_error(wide_alpha.to(dtype).float(), narrow_alpha.float()) <= torch.finfo(dtype).eps


@pytest.mark.parametrize("kind", ["gat", "transformer"])
def test_fp32_output_backward_takes_the_source_pass_first(kind, monkeypatch):
    """With an fp32 output the backward reads the saved output (the row dots) and never runs the recomputing
    target pass; with a 16-bit one it runs the target pass first."""
    graph = small_graph().to("cuda")
    prefix = attention_native._OP_PREFIX[attention_native.GAT if kind == "gat" else attention_native.DOT]
    called = []
    looked_up = attention_native._op

    def recording(op_kind, name):
        called.append(name)
        return looked_up(op_kind, name)

    monkeypatch.setattr(attention_native, "_op", recording)
    for out_dtype, target_first in ((torch.float32, False), (None, True)):
        called.clear()
        inputs = make_inputs(kind, graph, 4, 32, torch.bfloat16, seed=31)
        forward_backward(kind, graph, inputs, "native", out_dtype=out_dtype)
        assert ("backward_target" in called) == target_first, (prefix, out_dtype, called)


def test_out_dtype_refuses_other_dtypes():
    graph = small_graph().to("cuda")
    inputs = make_inputs("gat", graph, 2, 8, torch.bfloat16, seed=37)
    with pytest.raises(ValueError, match=r"gat_attention: out_dtype must be None, the features' dtype or"):
        attention_ops.gat_attention(graph, **inputs, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"gat_attention: bias must have the output's dtype torch.float32"):
        attention_ops.gat_attention(graph, **inputs, out_dtype=torch.float32,
                                    bias=torch.zeros(2, 8, dtype=torch.bfloat16, device="cuda"))
