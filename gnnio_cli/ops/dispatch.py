"""Choosing between the native kernels and the PyTorch reference.

Every op asks :func:`pick` which backend to use for its inputs:

- ``"reference"``: the pure-PyTorch implementation (any device, autograd);
- ``"native"``: the compiled CUDA kernels (CUDA tensors only); asking for it
  when it cannot run is an error that says why;
- ``"auto"`` (default): native for CUDA tensors when the extension loads,
  the reference otherwise.

Ops :func:`record` which implementation actually ran (e.g. ``"cusparse"``,
``"csr-vec4"``, ``"reference"``), so `gnnio run` and `compare` can show it.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Iterator

import torch

from gnnio_cli import native
from gnnio_cli.errors import GnnioError

BACKENDS = ("auto", "native", "reference")

_state = threading.local()


def current_backend() -> str:
    return getattr(_state, "backend", "auto")


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the enclosed ops with backend `name` (auto, native or reference)."""
    if name not in BACKENDS:
        raise GnnioError(f"unknown backend '{name}': choose one of {', '.join(BACKENDS)}")
    previous = current_backend()
    _state.backend = name
    try:
        yield
    finally:
        _state.backend = previous


def pick(op_name: str, *tensors: torch.Tensor) -> str:
    """'native' or 'reference' for an op on these tensors, under the current backend."""
    wanted = current_backend()
    if wanted == "reference":
        return "reference"
    on_cuda = all(t.is_cuda for t in tensors if isinstance(t, torch.Tensor))
    if wanted == "native":
        if not on_cuda:
            raise GnnioError(f"{op_name}: the native backend needs CUDA tensors; use --device cuda or --backend reference")
        native.load()  # raises NativeUnavailable with the reason
        return "native"
    if not on_cuda:
        return "reference"
    return "native" if native.is_available() else "reference"


def record(op_name: str, implementation: str) -> None:
    """Note that `op_name` ran through `implementation` (shown by run/compare)."""
    log = getattr(_state, "ran", None)
    if log is None:
        log = _state.ran = {}
    log[op_name] = implementation


def ran() -> dict[str, str]:
    """op name -> implementation, for every op run since :func:`reset`."""
    return dict(getattr(_state, "ran", {}))


def reset() -> None:
    _state.ran = {}


@functools.lru_cache(maxsize=None)
def cuda_properties(device: torch.device):
    """torch.cuda.get_device_properties of a CUDA device (with its index), looked up once: ops ask on every
    call, before their first launch, and torch's lookup costs the host tens of microseconds each time."""
    return torch.cuda.get_device_properties(device)
