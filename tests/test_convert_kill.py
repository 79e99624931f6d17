"""Killed, interrupted and concurrent conversions: the old graph stays loadable,
and no temporary file outlives the next write into the folder.

A child process runs the real `gnnio convert` with one step of the
conversion patched to announce itself and wait (no test hook in the
library: the script below wraps the functions it pauses in), and is
killed there: SIGKILL, which it cannot act on, or SIGTERM/SIGINT, which it
can. Each child takes a couple of seconds on two cores (interpreter and
imports).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from gnnio_cli.graph import files, store
from gnnio_cli.graph.convert import ConvertOptions, convert_file

REPO = Path(__file__).resolve().parents[1]

PAUSED_CONVERT = textwrap.dedent(
    """
    import sys, time
    from gnnio_cli.graph import convert, files, store

    point, argv = sys.argv[1], sys.argv[2:]

    def pause():
        print("paused", flush=True)
        time.sleep(120)

    def pausing_after(function):
        def paused(*args):
            function(*args)
            pause()
        return paused

    def pausing_before(function):
        def paused(*args):
            pause()
            function(*args)
        return paused

    if point == "structure":  # the temporary file half written: one CSR group in it
        store._write_structure = pausing_after(store._write_structure)
    elif point == "rename":  # the temporary file complete, not yet flushed and renamed
        files._commit = pausing_before(files._commit)
    else:  # at the start of a conversion stage, before any temporary file exists
        report = convert._report
        convert._report = lambda progress, stage: (pause() if stage == point else None, report(progress, stage))

    from gnnio_cli.cli import main
    main(argv)
    """
)


def temporaries(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


@pytest.fixture
def old_graph(tmp_path) -> tuple[Path, Path, bytes]:
    """(edge list, its graph converted with --undirected, that graph's bytes)."""
    rng = np.random.default_rng(11)
    pairs = rng.integers(0, 500, size=(4000, 2))
    source = tmp_path / "g.txt"
    source.write_text("".join(f"{s}\t{d}\n" for s, d in pairs.tolist()))
    graph = tmp_path / "g.h5"
    convert_file(str(source), graph, ConvertOptions(undirected=True))
    return source, graph, graph.read_bytes()


def paused_conversion(point: str, source: Path, graph: Path) -> subprocess.Popen:
    """A child converting `source` over `graph` (other options than the old graph's), paused at `point`."""
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CONVERT, point, "convert", str(source), "-o", str(graph), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    ready, _, _ = select.select([child.stdout], [], [], 120)
    if not ready or child.stdout.readline().strip() != "paused":
        child.kill()
        pytest.fail(f"the conversion never reached {point}: {child.communicate()[1]}")
    return child


def assert_old_graph_intact(graph: Path, old_bytes: bytes) -> None:
    assert graph.read_bytes() == old_bytes
    assert not store.load(graph).directed  # still the --undirected conversion, loadable


@pytest.mark.parametrize("point", ["parse", "build", "structure", "rename"])
def test_sigkill_leaves_the_old_graph_and_the_next_write_sweeps(point, old_graph, tmp_path):
    source, graph, old_bytes = old_graph
    child = paused_conversion(point, source, graph)
    try:
        writing = point in ("structure", "rename")
        assert bool(temporaries(tmp_path)) == writing
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        child.kill()
        child.communicate()
    assert_old_graph_intact(graph, old_bytes)
    assert bool(temporaries(tmp_path)) == writing  # nobody could remove it: the process was killed outright
    convert_file(str(source), tmp_path / "other.h5")  # the next write into the folder
    assert temporaries(tmp_path) == []
    assert store.load(tmp_path / "other.h5").directed


@pytest.mark.parametrize("signum,status,line", [
    (signal.SIGTERM, 143, "gnnio: terminated by SIGTERM"),
    (signal.SIGINT, 130, "gnnio: interrupted"),
])
def test_handled_signal_removes_its_temporary_file(signum, status, line, old_graph, tmp_path):
    source, graph, old_bytes = old_graph
    child = paused_conversion("structure", source, graph)
    try:
        assert len(temporaries(tmp_path)) == 1
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == status
    assert [text for text in stderr.splitlines() if text] == [line]  # click ends a ^C line with a newline first
    assert temporaries(tmp_path) == []
    assert_old_graph_intact(graph, old_bytes)


def test_a_live_conversion_keeps_its_temporary_file(old_graph, tmp_path):
    source, graph, old_bytes = old_graph
    child = paused_conversion("structure", source, graph)
    try:
        live = temporaries(tmp_path)
        convert_file(str(source), tmp_path / "other.h5")  # a concurrent conversion into the same folder
        assert temporaries(tmp_path) == live
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    finally:
        child.kill()
    assert temporaries(tmp_path) == []
    assert_old_graph_intact(graph, old_bytes)


def test_sweep_removes_only_what_no_running_process_owns(tmp_path):
    hour = files.UNOWNED_STALE_SECONDS
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owned = files.temporary_name(tmp_path / "g.h5")
    names = {
        "dead process": owned.name.replace(f"-{os.getpid()}-", f"-{dead.pid}-"),
        "live process": owned.name,
        "other host": owned.name.replace(owned.name.split("-")[1], "0" * 8),
        "old gnnio, stale": ".g.h5.ab12cd34.tmp",
        "old gnnio, recent": ".h.h5.ef56gh78.tmp",
        "not gnnio's": ".notes.txt.ab12cd34.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    long_ago = time.time() - 2 * hour
    for name in (names["old gnnio, stale"], names["not gnnio's"]):
        os.utime(tmp_path / name, (long_ago, long_ago))
    removed = files.sweep_stale_temporaries(tmp_path)
    assert sorted(removed) == sorted([names["dead process"], names["old gnnio, stale"]])
    assert sorted(temporaries(tmp_path)) == sorted(set(names.values()) - set(removed))
