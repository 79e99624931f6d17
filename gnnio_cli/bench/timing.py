"""Timing and peak memory: after warm-up, CUDA events, medians (how gnnio reports every number).

On CUDA: CUDA events around each call after warm-up, median of the repeats
(min and max too); peak memory is ``max_memory_allocated`` during the measured
call minus what was allocated before it (the inputs). On CPU: a monotonic
host clock, and no memory figure.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass
class Timing:
    """Milliseconds per call over `repeat` timed calls."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeat: int

    @staticmethod
    def of(samples_ms: list[float]) -> "Timing":
        return Timing(statistics.median(samples_ms), min(samples_ms), max(samples_ms), len(samples_ms))


def time_call(fn: Callable[[], object], device: torch.device, *, warmup: int = 3, repeat: int = 10) -> Timing:
    """Time `fn()` on `device`: warm-up calls first, then `repeat` timed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeat):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(repeat):
            begin = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - begin) * 1e3)
    return Timing.of(samples)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Extra device memory `fn()` needs at its peak beyond what was already held (None on CPU)."""
    if device.type != "cuda":
        fn()
        return None
    # Garbage from earlier calls is collected first, and the baseline read after
    # the reset: a tensor freed in between would otherwise count against the
    # call (a negative peak, -7 MiB, was once reported for a bf16 layer).
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - held
    del result
    return int(peak)


def copy_bandwidth_gbs(device: torch.device, megabytes: int = 1024, repeat: int = 20) -> Optional[float]:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    if device.type != "cuda":
        return None
    count = megabytes * (1 << 20) // 4
    source = torch.rand(count, device=device)
    target = torch.empty_like(source)
    timing = time_call(lambda: target.copy_(source), device, warmup=3, repeat=repeat)
    return 2 * count * 4 / (timing.median_ms * 1e-3) / 1e9
