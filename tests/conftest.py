"""Fixtures shared by the test files."""

import pytest


@pytest.fixture(scope="module")
def native_extension():
    """The compiled extension, or a skip whose message says why it cannot load."""
    from gnnio_cli import native

    try:
        native.load()
    except Exception as error:  # the reason is the skip message
        pytest.skip(f"native extension unavailable: {error}")
