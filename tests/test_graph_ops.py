"""torch.library.opcheck of the graph-level custom ops (gnnio_cli.nn.graph_ops): schema, fake kernel, autograd
registration and AOT dispatch, on the CPU (the reference behind them) and on CUDA (the native kernels) for
fp32/bf16/fp16 features and int32/int64 edge ids."""

from __future__ import annotations

import pytest
import torch

from gnnio_cli.nn import graph_ops

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CASES = [("cpu", torch.float32)] + [
    pytest.param("cuda", dtype, marks=CUDA) for dtype in (torch.float32, torch.bfloat16, torch.float16)
]
INDEX_DTYPES = [torch.int64, torch.int32]
NUM_SRC, NUM_DST, E = 20, 15, 70


def _edges(device, index_dtype):
    generator = torch.Generator().manual_seed(3)
    source = torch.randint(0, NUM_SRC, (E,), generator=generator)
    target = torch.randint(0, NUM_DST, (E,), generator=generator)
    return torch.stack([source, target]).to(device=device, dtype=index_dtype)


def _features(*shape, device, dtype, grad=True):
    return torch.randn(*shape, device=device).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_graph_propagate_opcheck(device, dtype, index_dtype):
    edge_index = _edges(device, index_dtype)
    x = _features(NUM_SRC, 6, device=device, dtype=dtype)
    for reduction in ("sum", "mean"):
        torch.library.opcheck(torch.ops.gnnio.graph_propagate.default,
                              (edge_index, NUM_SRC, NUM_DST, False, -1, x, None, reduction, False, False, False))
    square = _features(NUM_SRC, 6, device=device, dtype=dtype)
    for normalize, loops in ((True, True), (True, False)):
        torch.library.opcheck(torch.ops.gnnio.graph_propagate.default,
                              (edge_index % NUM_DST, NUM_SRC, NUM_SRC, False, -1, square, None, "sum", normalize,
                               loops, False))
    weights = _features(E, device=device, dtype=dtype)
    torch.library.opcheck(torch.ops.gnnio.graph_propagate.default,
                          (edge_index, NUM_SRC, NUM_DST, False, -1, x, weights, "sum", False, False, False))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_graph_extremum_opcheck(device, dtype, index_dtype):
    edge_index = _edges(device, index_dtype)
    x = _features(NUM_SRC, 40, device=device, dtype=dtype)
    for is_min in (False, True):
        torch.library.opcheck(torch.ops.gnnio.graph_extremum.default,
                              (edge_index, NUM_SRC, NUM_DST, False, -1, x, is_min, True))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_graph_attention_opcheck(device, dtype, index_dtype):
    edge_index = _edges(device, index_dtype)
    heads, channels = 2, 4
    src = _features(NUM_SRC, heads, channels, device=device, dtype=dtype)
    dst = _features(NUM_DST, heads, channels, device=device, dtype=dtype)
    args = {
        graph_ops.GAT: (src, _features(NUM_SRC, heads, device=device, dtype=dtype),
                        _features(NUM_DST, heads, device=device, dtype=dtype), None,
                        _features(heads, channels, device=device, dtype=dtype)),
        graph_ops.GATV2: (src, dst, _features(heads, channels, device=device, dtype=dtype),
                          _features(E, heads, channels, device=device, dtype=dtype), None),
        graph_ops.DOT: (dst, src, _features(NUM_SRC, heads, channels, device=device, dtype=dtype), None, None),
        graph_ops.COSINE: (_features(NUM_SRC, channels, device=device, dtype=dtype),
                           _features(NUM_DST, channels, device=device, dtype=dtype),
                           _features(1, device=device, dtype=dtype), None, None),
    }
    for kind, (a, b, c, d, extra) in args.items():
        for loops in (-1, NUM_DST):  # edge features are in the given edges' order: none with loops added
            torch.library.opcheck(torch.ops.gnnio.graph_attention.default,
                                  (edge_index, NUM_SRC, NUM_DST, False, loops, kind, a, b, c, d if loops < 0 else None,
                                   extra, 0.2, 0.0, False, False, True, None))
