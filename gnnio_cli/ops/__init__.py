"""Functional GNN ops, one module per kernel family.

Each op validates its inputs, asks :mod:`gnnio_cli.ops.dispatch` for a backend
(native CUDA kernels or the pure-PyTorch reference) and records which
implementation ran.
"""

from gnnio_cli.ops.attention import agnn_attention, gat_attention, gatv2_attention, transformer_attention
from gnnio_cli.ops.reduce import aggregate
from gnnio_cli.ops.spmm import gcn_norm, gcn_propagate, spmm

__all__ = [
    "agnn_attention",
    "aggregate",
    "gat_attention",
    "gatv2_attention",
    "gcn_norm",
    "gcn_propagate",
    "spmm",
    "transformer_attention",
]
