"""Choosing among kernels that compute the same result: by rule where one is known, else timed once per shape.

Some ops have several native kernels that give the same numbers (the SpMM
family's ``csr-vec``, ``csr-subwarp``, ``cusparse``; max/min's ``warp`` and
``subwarp`` kernels). Which is faster depends on the graph's shape, the dtype
and the width, not on the values. :func:`choose_kernel` times the candidates on
the first input of each *shape class* (:func:`shape_class`: the sizes' orders
of magnitude, the tile length and whether rows are split) and keeps the winner
for the process, keyed by (op, shape class, dtype, width, device): a fixed
graph is timed once, as before, and a mini-batch loop, whose graphs all fall
into one or two classes, is timed on its first batch only, never again.

:func:`fits_subwarp` is the rule shared by the SpMM and max/min families: which
inputs their lane-group ("subwarp") kernels take, so which candidates are timed.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.schedule import RowFacts

# Calls timed per kernel when choosing (after one warm-up call each).
TUNING_CALLS = 3

# The subwarp kernels' bounds (native/spmm.cu, native/reduce.cu): 8 features per 128-bit load, at most 16 lanes per row.
SUBWARP_VEC = 8
SUBWARP_MAX_WIDTH = 128

# (op, shape class, dtype, width, device, candidates) -> the kernel that won
_CHOSEN: dict = {}


def shape_class(facts: RowFacts) -> tuple:
    """The orders of magnitude of a side's rows and slots, its tile length and whether any row is split."""
    return (facts.num_rows.bit_length(), facts.num_slots.bit_length(), facts.tile_edges, facts.heavy_rows > 0)


def fits_subwarp(x: torch.Tensor) -> bool:
    """Whether the lane-group ("subwarp") kernels of native/spmm.cu and native/reduce.cu take x [N, F]:
    fp16/bf16, F a multiple of 8 up to 128, rows starting 16-byte aligned."""
    width = x.shape[1]
    return (
        x.dtype in (torch.float16, torch.bfloat16)
        and 0 < width <= SUBWARP_MAX_WIDTH
        and width % SUBWARP_VEC == 0
        and x.data_ptr() % 16 == 0
    )


def fastest(candidates: tuple[str, ...], run: Callable[[str], object]) -> str:
    """The candidate whose `run(name)` costs least: the longer of its GPU time (CUDA events) and the host's
    time to issue it, after one warm-up call each.

    On a large graph the GPU's time decides. On a small one (a mini-batch) the GPU finishes each call before
    the host has issued the next, so a step takes the host's time: a kernel that the GPU runs faster but whose
    call costs the host more (cuSPARSE's descriptors around its SpMM) is the slower choice there.
    """
    timings = {}
    for kernel in candidates:
        run(kernel)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        begin = time.perf_counter()
        for _ in range(TUNING_CALLS):
            run(kernel)
        host_ms = (time.perf_counter() - begin) * 1e3
        end.record()
        end.synchronize()
        timings[kernel] = max(start.elapsed_time(end), host_ms)
    return min(timings, key=timings.get)


def choose_kernel(candidates: tuple[str, ...], *, variable: str, names: tuple[str, ...], fallback: str, key,
                  run: Callable[[str], object], chosen: dict = _CHOSEN) -> str:
    """One input's kernel among `candidates` (its first is `fallback`, which takes every input).

    The environment `variable` (one of `names`) forces a kernel, for debugging; one that cannot take the
    input gives `fallback`. Otherwise the only candidate, or the fastest by :func:`fastest`, timed on the
    first call per `key` (which names the op, the shape class, dtype, width, device and candidates) and
    kept in `chosen` (`fallback` inside CUDA graph capture, where nothing can be timed).
    """
    forced = os.environ.get(variable)
    if forced:
        if forced not in names:
            raise GnnioError(f"{variable} must be one of {', '.join(names)}, got '{forced}'")
        return forced if forced in candidates else fallback
    if len(candidates) == 1:
        return candidates[0]
    found = chosen.get(key)
    if found is None:
        if torch.cuda.is_current_stream_capturing():
            return fallback
        found = chosen[key] = fastest(candidates, run)
    return found
