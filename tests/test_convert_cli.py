"""`gnnio convert` and the conversion behind it: ids, duplicates, self-loops,
direction, the cache, atomic writes, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from gnnio_cli.cli import cli
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import store
from gnnio_cli.graph.convert import ConvertOptions, convert_file, default_output

REPO = Path(__file__).resolve().parents[1]


def write_edges(path: Path, pairs, header: str = "") -> str:
    path.write_text(header + "".join(f"{s}\t{d}\n" for s, d in pairs))
    return str(path)


def edge_set(graph) -> set[tuple[int, int]]:
    src, dst = graph.edge_index().numpy()
    return set(zip(src.tolist(), dst.tolist()))


def random_edges(seed: int, num_nodes: int, count: int):
    rng = np.random.default_rng(seed)
    return list(zip(rng.integers(0, num_nodes, count).tolist(), rng.integers(0, num_nodes, count).tolist()))


# ------------------------------------------------------------ conversion


def test_duplicates_and_self_loops_counted(tmp_path):
    pairs = random_edges(seed=1, num_nodes=40, count=600)
    pairs += [(3, 3), (3, 3), (7, 7)] + pairs[:50]
    path = write_edges(tmp_path / "g.txt", pairs)
    distinct = set(pairs)
    loops = {pair for pair in distinct if pair[0] == pair[1]}

    kept = convert_file(path, tmp_path / "keep.h5")
    assert kept.duplicates_removed == len(pairs) - len(distinct)
    assert kept.self_loops_removed == 0 and kept.edges == len(distinct) and kept.entries_read == len(pairs)
    assert edge_set(store.load_graph(tmp_path / "keep.h5")) == distinct

    dropped = convert_file(path, tmp_path / "drop.h5", ConvertOptions(self_loops="drop"))
    assert dropped.self_loops_removed == sum(1 for s, d in pairs if s == d)
    assert dropped.duplicates_removed == len(pairs) - dropped.self_loops_removed - len(distinct - loops)
    assert edge_set(store.load_graph(tmp_path / "drop.h5")) == distinct - loops


def test_undirected_adds_reverses_without_doubling_loops(tmp_path):
    pairs = [(0, 1), (1, 0), (1, 2), (2, 2), (3, 1)]
    summary = convert_file(write_edges(tmp_path / "g.txt", pairs), tmp_path / "g.h5", ConvertOptions(undirected=True))
    stored = store.load(tmp_path / "g.h5")
    assert edge_set(stored.graph) == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 2), (3, 1), (1, 3)}
    assert summary.duplicates_removed == 2  # (0,1) and (1,0) each appear twice after mirroring
    assert summary.undirected and not stored.directed


def test_csr_csc_and_degrees_stored(tmp_path):
    pairs = random_edges(seed=2, num_nodes=30, count=200)
    convert_file(write_edges(tmp_path / "g.txt", pairs), tmp_path / "g.h5")
    graph = store.load_graph(tmp_path / "g.h5")
    src, dst = graph.edge_index().numpy()
    np.testing.assert_array_equal(graph.in_degree.numpy(), np.bincount(dst, minlength=graph.num_nodes))
    np.testing.assert_array_equal(graph.out_degree.numpy(), np.bincount(src, minlength=graph.num_nodes))
    np.testing.assert_array_equal(graph.csc_indices.numpy(), dst[graph.csc_eid.numpy()])
    with h5py.File(tmp_path / "g.h5") as h5:
        np.testing.assert_array_equal(h5["degree/in"][()], graph.in_degree.numpy())
        assert json.loads(h5.attrs["params"]) == ConvertOptions().params()
        assert h5.attrs["source_sha256"] == store.file_sha256(tmp_path / "g.txt")


def test_non_contiguous_ids_are_relabelled_in_order(tmp_path):
    pairs = [(100, 7), (7, 3000), (3000, 100), (55, 55)]
    summary = convert_file(write_edges(tmp_path / "g.txt", pairs), tmp_path / "g.h5")
    graph = store.load_graph(tmp_path / "g.h5")
    assert summary.relabelled and graph.num_nodes == 4
    originals = graph.node_ids.numpy()
    np.testing.assert_array_equal(originals, [7, 55, 100, 3000])
    src, dst = graph.edge_index().numpy()
    assert set(zip(originals[src].tolist(), originals[dst].tolist())) == set(pairs)


def test_loop_only_node_survives_relabelling_as_isolated(tmp_path):
    pairs = [(10, 20), (20, 10), (30, 30)]
    convert_file(write_edges(tmp_path / "g.txt", pairs), tmp_path / "g.h5", ConvertOptions(self_loops="drop"))
    graph = store.load_graph(tmp_path / "g.h5")
    assert graph.num_nodes == 3 and graph.num_edges == 2
    assert graph.node_ids.tolist() == [10, 20, 30]
    assert int(graph.in_degree[2]) == 0 and int(graph.out_degree[2]) == 0


def test_ids_kept_when_contiguous_or_within_declared_count(tmp_path):
    contiguous = convert_file(write_edges(tmp_path / "a.txt", [(0, 2), (2, 1)]), tmp_path / "a.h5")
    assert not contiguous.relabelled and contiguous.nodes == 3
    assert store.load_graph(tmp_path / "a.h5").node_ids is None

    declared = convert_file(write_edges(tmp_path / "b.txt", [(0, 5), (9, 0)], header="# Nodes: 20 Edges: 2\n"), tmp_path / "b.h5")
    assert not declared.relabelled and declared.nodes == 20

    too_small = convert_file(write_edges(tmp_path / "c.txt", [(0, 5), (900, 0)], header="# Nodes: 3 Edges: 2\n"), tmp_path / "c.h5")
    assert too_small.relabelled and too_small.nodes == 3


def test_num_nodes_pads_and_bounds(tmp_path):
    path = write_edges(tmp_path / "g.txt", [(0, 5), (9, 0)])
    summary = convert_file(path, tmp_path / "g.h5", ConvertOptions(num_nodes=50))
    graph = store.load_graph(tmp_path / "g.h5")
    assert summary.nodes == 50 and graph.num_nodes == 50 and not summary.relabelled
    assert int(graph.in_degree[40:].sum()) == 0
    with pytest.raises(GnnioError, match=r"g\.txt: edge 2 has node id 9, but --num-nodes is 8"):
        convert_file(path, tmp_path / "h.h5", ConvertOptions(num_nodes=8))
    assert not (tmp_path / "h.h5").exists()


def test_symmetric_matrix_market_becomes_undirected(tmp_path):
    path = tmp_path / "g.mtx"
    path.write_text("%%MatrixMarket matrix coordinate pattern symmetric\n5 5 3\n2 1\n5 3\n4 4\n")
    summary = convert_file(str(path), tmp_path / "g.h5")
    graph = store.load_graph(tmp_path / "g.h5")
    assert edge_set(graph) == {(1, 0), (0, 1), (4, 2), (2, 4), (3, 3)}
    assert summary.nodes == 5 and summary.entries_read == 3 and summary.undirected


def test_default_output_name():
    assert default_output("data/cora.edges.txt.gz") == Path("data/cora.edges.h5")
    assert default_output("g.mtx") == Path("g.h5")
    assert default_output("edges") == Path("edges.h5")
    with pytest.raises(GnnioError, match=r"needs an output file: add -o"):
        default_output("-")


def test_option_validation():
    with pytest.raises(GnnioError, match=r"--self-loops: expected keep or drop, got 'maybe'"):
        ConvertOptions(self_loops="maybe")
    with pytest.raises(GnnioError, match=r"--num-nodes: must be at least 1, got 0"):
        ConvertOptions(num_nodes=0)


# ------------------------------------------------------------- the CLI


def invoke(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input)


def test_cli_table_json_and_quiet(tmp_path):
    path = write_edges(tmp_path / "g.txt", random_edges(seed=3, num_nodes=20, count=100))
    table = invoke("convert", path)
    assert table.exit_code == 0, table.output
    assert (tmp_path / "g.h5").exists()
    for label in ("nodes", "edges", "duplicates removed", "self-loops removed", "time (s)"):
        assert label in table.output

    as_json = invoke("convert", path, "-o", str(tmp_path / "j.h5"), "--json", "--self-loops", "drop")
    assert as_json.exit_code == 0
    record = json.loads(as_json.stdout)
    assert record["output"] == str(tmp_path / "j.h5") and record["cached"] is False
    assert record["edges"] == store.read_attrs(tmp_path / "j.h5")["num_edges"]

    quiet = invoke("convert", path, "-o", str(tmp_path / "q.h5"), "--quiet")
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_cli_cache_reuse_and_force(tmp_path):
    path = write_edges(tmp_path / "g.txt", random_edges(seed=4, num_nodes=20, count=100))
    out = tmp_path / "g.h5"
    first = json.loads(invoke("convert", path, "--json").stdout)
    assert first["cached"] is False
    stamp = out.stat().st_mtime_ns

    again = invoke("convert", path)
    assert again.exit_code == 0 and "reusing" in again.stderr
    assert out.stat().st_mtime_ns == stamp
    assert json.loads(invoke("convert", path, "--json").stdout)["cached"] is True

    forced = json.loads(invoke("convert", path, "--json", "--force").stdout)
    assert forced["cached"] is False and out.stat().st_mtime_ns != stamp

    other_options = json.loads(invoke("convert", path, "--json", "--undirected").stdout)
    assert other_options["cached"] is False

    Path(path).write_text("0\t1\n")  # new content, same name: the cache no longer matches
    changed = json.loads(invoke("convert", path, "--json", "--undirected").stdout)
    assert changed["cached"] is False and changed["edges"] == 2


def test_cli_stdin_needs_output(tmp_path):
    missing_output = invoke("convert", "-", input="0 1\n")
    assert missing_output.exit_code == 1
    assert isinstance(missing_output.exception, GnnioError)
    out = tmp_path / "s.h5"
    result = invoke("convert", "-", "-o", str(out), "--json", input="# Nodes: 6\n0 1\n1 5\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nodes"] == 6
    reused = invoke("convert", "-", "-o", str(out), "--json", input="# Nodes: 6\n0 1\n1 5\n")
    assert json.loads(reused.stdout)["cached"] is True


@pytest.mark.parametrize(
    "content,message",
    [
        ("0 1\n2 3\n5\n", r"bad\.txt: line 3: expected two node ids \(source and target\): '5'"),
        ("0 1\n2 3 4\n5\n", r"bad\.txt: line 2: unexpected third field \(line 1, the first edge, has two; "),
        ("0 1\n2 three\n", r"bad\.txt: line 2: node ids must be integers: '2 three'"),
        ("0 1\n-2 3\n", r"bad\.txt: line 2: node ids must be non-negative: '-2 3'"),
        ("", r"bad\.txt: no edges found \(empty file\?\)"),
    ],
)
def test_cli_bad_input_one_line_nonzero(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    result = invoke("convert", str(path))
    assert result.exit_code == 1
    assert isinstance(result.exception, GnnioError)
    error = str(result.exception)
    assert "\n" not in error
    assert __import__("re").search(message, error), error
    assert not (tmp_path / "bad.h5").exists()


def test_cli_missing_file_and_folder(tmp_path):
    result = invoke("convert", str(tmp_path / "absent.txt"))
    assert result.exit_code == 1 and str(result.exception) == f"{tmp_path / 'absent.txt'}: no such file"
    (tmp_path / "absent.h5").write_bytes(b"x")  # an existing output takes the cache-check path first
    result = invoke("convert", str(tmp_path / "absent.txt"))
    assert str(result.exception) == f"{tmp_path / 'absent.txt'}: no such file"
    folder = tmp_path / "edges"
    folder.mkdir()
    result = invoke("convert", str(folder), "-o", str(tmp_path / "f.h5"))
    assert result.exit_code == 1 and str(result.exception) == f"{folder}: is a folder, not an edge list"


def test_unwritable_output_folder(tmp_path):
    path = write_edges(tmp_path / "g.txt", [(0, 1)])
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        result = invoke("convert", path, "-o", str(locked / "g.h5"))
        assert result.exit_code == 1 and "could not write the graph" in str(result.exception)
    finally:
        locked.chmod(0o700)


def test_real_entry_point_prints_one_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("1 2\n3 x\n")
    run = subprocess.run(
        [sys.executable, "-m", "gnnio_cli", "convert", str(path)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr == f"gnnio: error: {path}: line 2: node ids must be integers: '3 x'\n"


# -------------------------------------------------------- damaged .h5


def small_cache(tmp_path) -> Path:
    convert_file(write_edges(tmp_path / "g.txt", random_edges(seed=5, num_nodes=30, count=200)), tmp_path / "g.h5")
    return tmp_path / "g.h5"


def test_truncated_h5(tmp_path):
    path = small_cache(tmp_path)
    path.write_bytes(path.read_bytes()[:600])
    with pytest.raises(GnnioError, match=r"g\.h5: not a readable HDF5 file \(truncated or corrupt\?\)"):
        store.load(path)


def test_corrupt_h5(tmp_path):
    path = tmp_path / "noise.h5"
    path.write_bytes(np.random.default_rng(6).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(GnnioError, match=r"not a readable HDF5 file"):
        store.load(path)


def test_h5_that_is_not_a_gnnio_graph(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as h5:
        h5["x"] = np.arange(5)
    with pytest.raises(GnnioError, match=r"other\.h5: not a gnnio graph"):
        store.load(path)


def test_h5_from_a_newer_gnnio(tmp_path):
    path = small_cache(tmp_path)
    with h5py.File(path, "r+") as h5:
        h5.attrs["format_version"] = store.FORMAT_VERSION + 1
    with pytest.raises(GnnioError, match=r"format version 2 is newer than this gnnio reads \(1\); upgrade gnnio"):
        store.load(path)


def test_h5_with_inconsistent_arrays(tmp_path):
    path = small_cache(tmp_path)
    with h5py.File(path, "r+") as h5:
        del h5["csc/indices"]
        h5["csc/indices"] = np.full(3, 10**6, dtype=np.int32)
    with pytest.raises(GnnioError, match=r"damaged gnnio graph"):
        store.load(path)


def test_damaged_cache_is_rebuilt_not_reused(tmp_path):
    path = small_cache(tmp_path)
    path.write_bytes(b"garbage")  # nothing shows gnnio made this: it is kept unless --force
    refused = invoke("convert", str(tmp_path / "g.txt"), "--json")
    assert refused.exit_code == 1 and "is not a gnnio graph; add --force to replace it" in str(refused.exception)
    assert path.read_bytes() == b"garbage"
    result = invoke("convert", str(tmp_path / "g.txt"), "--json", "--force")
    assert json.loads(result.stdout)["cached"] is False
    assert store.load_graph(path).num_edges > 0


# ------------------------------------------------ interrupted conversions


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_failure_inside_save_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = write_edges(tmp_path / "g.txt", random_edges(seed=7, num_nodes=30, count=200))
    out = tmp_path / "g.h5"
    out.write_bytes(b"the previous file")
    calls = []

    def failing_write(group, indptr, indices, eid):
        calls.append(group.name)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(store, "_write_structure", failing_write)
    with pytest.raises(GnnioError, match=r"g\.h5: could not write the graph: disk full \(simulated\)"):
        convert_file(path, out, force=True)
    assert calls == ["/csr"]
    assert out.read_bytes() == b"the previous file"
    assert leftovers(tmp_path) == []

    out.unlink()
    with pytest.raises(GnnioError, match="simulated"):
        convert_file(path, out)
    assert not out.exists() and leftovers(tmp_path) == []


KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from gnnio_cli.graph import store
    from gnnio_cli.graph.convert import convert_file

    original = store._write_structure

    def slow_write(group, indptr, indices, eid):
        original(group, indptr, indices, eid)
        print("writing", flush=True)
        time.sleep(60)

    store._write_structure = slow_write
    convert_file(sys.argv[1], sys.argv[2], force=True)
    """
)


@pytest.mark.parametrize("had_old_file", [False, True])
def test_sigkill_during_write_leaves_no_h5(tmp_path, had_old_file):
    path = write_edges(tmp_path / "g.txt", random_edges(seed=8, num_nodes=30, count=200))
    out = tmp_path / "g.h5"
    if had_old_file:
        out.write_bytes(b"the previous file")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, path, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert child.stdout.readline().strip() == "writing"
        assert leftovers(tmp_path)  # the half-written temporary file exists now
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    if had_old_file:
        assert out.read_bytes() == b"the previous file"
    else:
        assert not out.exists()
    assert not any(p.suffix == ".h5" and p.name != "g.h5" for p in tmp_path.iterdir())
