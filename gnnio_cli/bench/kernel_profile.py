"""Where one call's time goes: the kernels (or CPU operators) it ran, by self time.

`gnnio run --profile` uses this to show, for a layer's training step, how the
time splits between gnnio's fused kernels, the projections (GEMMs) and the
node-sized elementwise work around them, so a user can see what a faster
aggregation would and would not buy.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

# Kernel names from templates run to hundreds of characters; the table keeps this many.
NAME_WIDTH = 90


def _self_time_us(event, on_cuda: bool) -> float:
    """An averaged event's self time in microseconds on the device that did the work."""
    if on_cuda:
        # torch >= 2.4 calls it device time; older releases, cuda time.
        value = getattr(event, "self_device_time_total", None)
        if value is None:
            value = getattr(event, "self_cuda_time_total", 0.0)
        return float(value)
    return float(event.self_cpu_time_total)


def profile_call(fn: Callable[[], object], device: torch.device, *, top: int = 15, warmup: int = 1) -> dict:
    """Run `fn()` once under torch.profiler and return its costliest entries.

    On CUDA the entries are device kernels and copies by self time; on CPU,
    operators by self CPU time. Returns {"device_total_ms", "entries": [
    {"name", "calls", "total_ms", "share"}]} with at most `top` entries (the rest
    summed into one "(other)" entry so the shares add up to 1).
    """
    on_cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize(device)
    # acc_events keeps this one-cycle profile's events without torch's warning that they are cleared per cycle
    options = {"acc_events": True} if "acc_events" in inspect.signature(profile.__init__).parameters else {}
    with profile(activities=activities, **options) as prof:
        fn()
        if on_cuda:
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        self_us = _self_time_us(event, on_cuda)
        if self_us <= 0.0:
            continue
        if on_cuda and getattr(event, "device_type", None) is not None and "CUDA" not in str(event.device_type):
            continue
        rows.append((event.key, int(event.count), self_us))
    rows.sort(key=lambda row: row[2], reverse=True)
    total_us = sum(row[2] for row in rows)
    kept, rest = rows[:top], rows[top:]
    entries = [
        {"name": name[:NAME_WIDTH], "calls": calls, "total_ms": us / 1e3, "share": us / total_us if total_us else 0.0}
        for name, calls, us in kept
    ]
    if rest:
        rest_us = sum(row[2] for row in rest)
        entries.append({"name": f"(other: {len(rest)} entries)", "calls": sum(row[1] for row in rest),
                        "total_ms": rest_us / 1e3, "share": rest_us / total_us if total_us else 0.0})
    return {"device": "cuda" if on_cuda else "cpu", "device_total_ms": total_us / 1e3, "entries": entries}


PROFILE_COLUMNS = ["kernel", "calls", "ms", "share"]


def profile_rows(profiled: dict) -> list[list]:
    return [[e["name"], e["calls"], e["total_ms"], f"{100 * e['share']:.1f}%"] for e in profiled["entries"]]
