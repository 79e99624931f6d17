"""Fixtures shared by the test files."""

import pytest
import torch
import torch._inductor.config

# Inductor compiles in a pool of subprocesses, one pool per test process: under pytest-xdist (the GPU suite
# runs with -n 16) that is hundreds of processes, which oversubscribe the machine and can hold a worker at
# exit. The tests compile small graphs; one thread per process compiles them as fast.
torch._inductor.config.compile_threads = 1


@pytest.fixture(scope="module")
def native_extension():
    """The compiled extension. Without a CUDA device the GPU tests skip; with one, an extension that does not
    build or load fails them, so a broken build can never pass as skipped tests."""
    from gnnio_cli import native

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        native.load()
    except Exception as error:  # the reason is the failure message
        pytest.fail(f"a CUDA GPU is visible but the native extension does not load: {error}", pytrace=False)


@pytest.fixture
def fused_dense_path(monkeypatch):
    """gnnio's fused dense autograd functions for every input, however small: tests of those functions and of
    the kernels they choose (inputs up to nn.linear.HOST_BOUND_ELEMENTS otherwise take plain torch)."""
    from gnnio_cli.nn import linear as linear_module

    monkeypatch.setattr(linear_module, "HOST_BOUND_ELEMENTS", -1)
