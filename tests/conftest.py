"""Fixtures shared by the test files."""

import pytest
import torch


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
