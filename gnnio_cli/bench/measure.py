"""One measurement of a workload: forward and training-step time, peak memory, byte floor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from gnnio_cli.bench.timing import Timing, peak_memory_bytes, time_call
from gnnio_cli.bench.workloads import Workload
from gnnio_cli.ops import dispatch


@dataclass
class Measurement:
    name: str
    backend: str
    implementations: dict
    forward: Timing
    train: Optional[Timing]
    peak_forward_bytes: Optional[int]
    peak_train_bytes: Optional[int]
    floor_bytes: int
    floor_ms: Optional[float]

    @property
    def floor_ratio(self) -> Optional[float]:
        return self.forward.median_ms / self.floor_ms if self.floor_ms else None


def measure(
    workload: Workload,
    device: torch.device,
    *,
    backend: str = "auto",
    backward: bool = True,
    warmup: int = 3,
    repeat: int = 10,
    bandwidth_gbs: Optional[float] = None,
) -> Measurement:
    """Time `workload` under `backend`; the implementations that ran are recorded."""
    with dispatch.use_backend(backend):
        dispatch.reset()
        with torch.no_grad():
            forward = time_call(workload.forward, device, warmup=warmup, repeat=repeat)
            peak_forward = peak_memory_bytes(workload.forward, device)
        train = peak_train = None
        if backward:
            train = time_call(workload.train_step, device, warmup=warmup, repeat=repeat)
            peak_train = peak_memory_bytes(workload.train_step, device)
        implementations = dispatch.ran()
    floor_ms = workload.floor_bytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs else None
    # PyG's own code (options gnnio has no kernel for) is plain PyTorch, as the reference is
    used = "native" if any(impl not in ("reference", "pyg") for impl in implementations.values()) else "reference"
    return Measurement(
        name=workload.name,
        backend=used,
        implementations=implementations,
        forward=forward,
        train=train,
        peak_forward_bytes=peak_forward,
        peak_train_bytes=peak_train,
        floor_bytes=workload.floor_bytes,
        floor_ms=floor_ms,
    )
