"""The wheel carries everything an installed gnnio needs: every module, the CUDA sources and the sample graphs.

The wheel is built from a copy of the checkout's top-level files (so the
checkout gets no build folders) with the current interpreter's setuptools,
without network access, as `pip install .` builds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("pyproject.toml", "README.md", "gnnio_cli", "native", "sample_graphs")


def relative_files(folder: Path, pattern: str = "*") -> set[str]:
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob(pattern)
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_wheel_carries_modules_native_sources_and_sample_graphs(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in TOP_LEVEL:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    (wheel,) = (tmp_path / "dist").glob("gnnio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    modules = {f"gnnio_cli/{name}" for name in relative_files(REPO / "gnnio_cli", "*.py")}
    native = {f"gnnio_cli/_native/{name}" for name in relative_files(REPO / "native")}
    samples = {f"gnnio_cli/_sample_graphs/{name}" for name in relative_files(REPO / "sample_graphs")}
    assert {"gnnio_cli/_native/gnnio.cpp", "gnnio_cli/_native/attention/gatv2.cu",
            "gnnio_cli/_sample_graphs/cora.edges.txt.gz"} <= native | samples
    assert modules - names == set(), "modules missing from the wheel (a package not listed in pyproject.toml?)"
    assert native - names == set(), "native sources missing from the wheel"
    assert samples - names == set(), "sample graphs missing from the wheel"
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    assert "gnnio = gnnio_cli.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_resources_point_at_this_checkout():
    """A checkout (editable install or PYTHONPATH) reads its own native/ and sample_graphs/, never another copy's."""
    from gnnio_cli import native
    from gnnio_cli.graph import catalog
    from gnnio_cli.resources import NATIVE_DIR, SAMPLE_GRAPHS_DIR

    assert NATIVE_DIR == REPO / "native" and SAMPLE_GRAPHS_DIR == REPO / "sample_graphs"
    assert (NATIVE_DIR / "gnnio.cpp") in native.source_files()
    assert (NATIVE_DIR / "attention" / "gatv2.cu") in native.source_files()
    names = [path.name for path in native.source_files()]
    assert len(names) == len(set(names)), "the build names each object after its source's basename"
    assert catalog.SAMPLE_GRAPH.is_file()
