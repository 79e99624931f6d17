"""The files gnnio ships beside its code: the CUDA sources and the sample graphs.

The repository keeps them in its top-level ``native/`` and ``sample_graphs/``
folders. A wheel (``pip install .``) carries them inside the package, as
``gnnio_cli/_native`` and ``gnnio_cli/_sample_graphs`` (pyproject.toml maps
the folders there); a source checkout (an editable install, or the repository
on ``PYTHONPATH``) has them beside the package. Both layouts are found from
the imported package itself, so a checkout never reads another copy's files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _shipped(installed: str, checkout: str) -> Path:
    """The folder `installed` inside the imported package where it exists (a wheel), else `checkout` beside it."""
    package = Path(str(files("gnnio_cli")))
    inside = package / installed
    return inside if inside.is_dir() else package.parent / checkout


NATIVE_DIR = _shipped("_native", "native")
"""The extension's C++/CUDA sources and headers (gnnio.cpp, *.cu, *.cuh)."""

SAMPLE_GRAPHS_DIR = _shipped("_sample_graphs", "sample_graphs")
"""The bundled real graphs and their licences (see the folder's README.md)."""
