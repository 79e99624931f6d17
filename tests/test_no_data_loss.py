"""The command line never loses or silently misreads data: one test per way it used to.

Matrix Market by content, foreign outputs kept, caches checked before reuse,
byte-order marks, weights and extra fields, one-line errors where there
were tracebacks, temporary files (see also test_convert_kill.py), and the
smaller cases: file modes, 19-digit ids, messages, help, the cache hit's
JSON, progress. Layers on 0-node graphs: test_zero_node_layers.py.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import sys

import h5py
import numpy as np
import pytest
import scipy.sparse
import torch

from gnnio_cli.graph import store
from gnnio_cli.graph.convert import ConvertOptions, convert_file
from testing import run_gnnio

ROAD_PAIRS = [(2, 1), (3, 2), (4, 3), (5, 4), (5, 1), (6, 6)]  # 1-based, one triangle, one self-loop
ROADS = "%%MatrixMarket matrix coordinate pattern symmetric\n% a road network\n6 6 6\n" + "".join(
    f"{row} {col}\n" for row, col in ROAD_PAIRS
)
EDGES = "0\t1\n1\t2\n2\t0\n"


def edge_pairs(path) -> set[tuple[int, int]]:
    src, dst = store.load_graph(path).edge_index().tolist()
    return set(zip(src, dst))


def one_error_line(status: int, stdout: str, stderr: str) -> str:
    lines = stderr.splitlines()
    assert status != 0 and stdout == "" and len(lines) == 1 and lines[0].startswith("gnnio: error: "), stderr
    return lines[0]


# ---------------------------------------------- 1. Matrix Market by content


@pytest.mark.parametrize("source", ["stdin", "stdin-gzip", "roads.txt", "roads"])
def test_matrix_market_is_recognised_by_its_banner(source, tmp_path, capsys, monkeypatch):
    data = ROADS.encode()
    if source.startswith("stdin"):
        args, stdin = ["-"], gzip.compress(data) if source.endswith("gzip") else data
    else:
        (tmp_path / source).write_bytes(data)
        args, stdin = [tmp_path / source], None
    status, stdout, stderr = run_gnnio(["convert", *args, "-o", tmp_path / "roads.h5", "--json"], capsys, monkeypatch, stdin)
    assert status == 0, stderr
    summary = json.loads(stdout)
    off_diagonal = sum(1 for row, col in ROAD_PAIRS if row != col)
    assert summary["format"] == "mtx" and summary["nodes"] == 6 and summary["undirected"]
    assert summary["edges"] == 2 * off_diagonal + 1  # every pair mirrored, the loop once; no size line as an edge
    assert (0, 1) in edge_pairs(tmp_path / "roads.h5") and (1, 0) in edge_pairs(tmp_path / "roads.h5")


# ------------------------------------------ 2. outputs gnnio did not make


def test_default_output_never_replaces_a_foreign_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "data.txt").write_text(EDGES)
    with h5py.File(tmp_path / "data.h5", "w") as h5:
        h5["measurements"] = np.arange(10)
    foreign = (tmp_path / "data.h5").read_bytes()
    line = one_error_line(*run_gnnio(["convert", tmp_path / "data.txt"], capsys, monkeypatch))
    assert line.endswith("data.h5: exists and is not a gnnio graph; add --force to replace it")
    assert (tmp_path / "data.h5").read_bytes() == foreign
    status, _, stderr = run_gnnio(["convert", tmp_path / "data.txt", "--force", "--quiet"], capsys, monkeypatch)
    assert status == 0 and stderr == "" and store.load_graph(tmp_path / "data.h5").num_edges == 3


# ----------------------------------------------- 3. cache reuse, checked


def convert_json(args, capsys, monkeypatch) -> dict:
    status, stdout, stderr = run_gnnio(["convert", *args, "--json"], capsys, monkeypatch)
    assert status == 0, stderr
    return json.loads(stdout)


@pytest.mark.parametrize("damage", ["delete degree", "delete eid", "edit num_edges", "edit node ids", "add a dataset"])
def test_a_changed_cache_is_rebuilt_not_reused(damage, tmp_path, capsys, monkeypatch):
    source = tmp_path / "g.txt"
    source.write_text("10 20\n20 30\n30 10\n30 40\n")
    graph = tmp_path / "g.h5"
    fresh = convert_json([source], capsys, monkeypatch)
    assert convert_json([source], capsys, monkeypatch)["cached"] is True
    with h5py.File(graph, "r+") as h5:
        if damage == "delete degree":
            del h5["degree/in"]
        elif damage == "delete eid":
            del h5["csc/eid"]
        elif damage == "edit num_edges":
            h5.attrs["num_edges"] = 3
        elif damage == "edit node ids":
            h5["node_ids"][0] = 11
        else:
            h5["features/x"] = np.zeros(4)
    rebuilt = convert_json([source], capsys, monkeypatch)
    assert rebuilt["cached"] is False and rebuilt["edges"] == fresh["edges"]
    loaded = store.load(graph)
    assert loaded.graph.node_ids.tolist() == [10, 20, 30, 40] and loaded.features == {}
    with h5py.File(graph) as h5:
        assert "degree/in" in h5 and "csc/eid" in h5


def test_reordered_in_place_is_not_the_conversion(tmp_path, capsys, monkeypatch):
    source = tmp_path / "g.txt"
    rng = np.random.default_rng(3)
    source.write_text("".join(f"{s} {d}\n" for s, d in rng.integers(0, 60, size=(300, 2)).tolist()))
    graph = tmp_path / "g.h5"
    convert_json([source], capsys, monkeypatch)
    expected = store.load_graph(graph).edge_index()
    status, _, stderr = run_gnnio(["reorder", graph, "--method", "random", "-o", graph, "--json"], capsys, monkeypatch)
    assert status == 0, stderr
    assert not torch.equal(store.load_graph(graph).edge_index(), expected)
    assert convert_json([source, "-o", graph], capsys, monkeypatch)["cached"] is False
    assert torch.equal(store.load_graph(graph).edge_index(), expected)  # node ids follow the input's order again
    assert store.load(graph).perms == {}


# ------------------------------------------------------ 4. byte-order mark


@pytest.mark.parametrize("name,text,forced", [
    ("g.txt", EDGES, None),
    ("g.txt", EDGES, "csv"),
    ("g.csv", EDGES.replace("\t", ","), None),
    ("g.csv", "source,target\n" + EDGES.replace("\t", ","), None),
    ("g.tsv", EDGES, None),
    ("g.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 2\n2 3\n3 1\n", None),
    ("g.dat", "%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 2\n2 3\n3 1\n", None),
])
def test_byte_order_mark_is_dropped_in_every_text_format(name, text, forced, tmp_path, capsys, monkeypatch):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    args = [path, "-o", tmp_path / "g.h5"] + (["--format", forced] if forced else [])
    summary = convert_json(args, capsys, monkeypatch)
    assert summary["entries_read"] == 3 and summary["edges"] == 3
    assert edge_pairs(tmp_path / "g.h5") == {(0, 1), (1, 2), (2, 0)}


# ---------------------------------------- 5. weights, extra fields, headers


@pytest.mark.parametrize("name,text", [
    ("g.txt", "0 1 0.5\n1 2 2\n2 0 -1.25e1\n2 2 4\n"),
    ("g.csv", "src,dst,weight\n0,1,0.5\n1,2,2\n2,0,-12.5\n2,2,4\n"),
    ("g.mtx", "%%MatrixMarket matrix coordinate real general\n3 3 4\n1 2 0.5\n2 3 2\n3 1 -12.5\n3 3 4\n"),
])
def test_weights_are_stored_and_usable_by_the_layers(name, text, tmp_path, capsys, monkeypatch):
    (tmp_path / name).write_text(text)
    assert convert_json([tmp_path / name, "-o", tmp_path / "g.h5"], capsys, monkeypatch)["weighted"] is True
    stored = store.load(tmp_path / "g.h5")
    edge_index = stored.graph.edge_index()
    weights = dict(zip(map(tuple, edge_index.t().tolist()), stored.edge_weight.tolist()))
    assert weights == {(0, 1): 0.5, (1, 2): 2.0, (2, 0): -12.5, (2, 2): 4.0}
    with h5py.File(tmp_path / "g.h5") as h5:
        assert h5["edge_weight"].dtype == np.float64

    pyg_nn = pytest.importorskip("torch_geometric.nn")
    import gnnio_cli.nn as gnnio_nn

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    edge_weight = torch.from_numpy(stored.edge_weight).float()
    torch.manual_seed(1)
    theirs = pyg_nn.GCNConv(4, 2, normalize=False)
    torch.manual_seed(1)
    ours = gnnio_nn.GCNConv(4, 2, normalize=False)
    torch.testing.assert_close(ours(x, stored.graph, edge_weight), theirs(x, edge_index, edge_weight))


def test_weights_follow_mirroring_and_duplicates(tmp_path):
    (tmp_path / "g.txt").write_text("0 1 3\n1 2 5\n0 1 3\n")
    summary = convert_file(str(tmp_path / "g.txt"), tmp_path / "g.h5", ConvertOptions(undirected=True))
    stored = store.load(tmp_path / "g.h5")
    pairs = map(tuple, stored.graph.edge_index().t().tolist())
    assert dict(zip(pairs, stored.edge_weight.tolist())) == {(0, 1): 3, (1, 0): 3, (1, 2): 5, (2, 1): 5}
    assert summary.duplicates_removed == 2
    skew = "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 1\n2 1 1.5\n"
    (tmp_path / "s.mtx").write_text(skew)
    convert_file(str(tmp_path / "s.mtx"), tmp_path / "s.h5")
    stored = store.load(tmp_path / "s.h5")
    pairs = map(tuple, stored.graph.edge_index().t().tolist())
    assert dict(zip(pairs, stored.edge_weight.tolist())) == {(1, 0): 1.5, (0, 1): -1.5}


def test_a_third_column_that_is_not_a_weight_can_be_dropped(tmp_path, capsys, monkeypatch):
    (tmp_path / "messages.txt").write_text("1 2 1082040961\n1 2 1082155839\n2 3 1082414391\n")  # timestamps
    line = one_error_line(*run_gnnio(["convert", tmp_path / "messages.txt"], capsys, monkeypatch))
    assert "edge 1 -> 2 appears with weights 1.08204e+09 and 1.08216e+09" in line and "--weights drop" in line
    summary = convert_json([tmp_path / "messages.txt", "--weights", "drop"], capsys, monkeypatch)
    assert summary["weighted"] is False and summary["edges"] == 2 and summary["duplicates_removed"] == 1
    assert store.load(tmp_path / "messages.h5").edge_weight is None


def test_npz_values_become_weights_unless_all_ones(tmp_path):
    weighted = scipy.sparse.coo_matrix((np.array([0.5, 2.0]), ([0, 1], [1, 2])), shape=(3, 3))
    scipy.sparse.save_npz(tmp_path / "w.npz", weighted.tocsr())
    convert_file(str(tmp_path / "w.npz"), tmp_path / "w.h5")
    assert sorted(store.load(tmp_path / "w.h5").edge_weight.tolist()) == [0.5, 2.0]
    scipy.sparse.save_npz(tmp_path / "p.npz", (weighted > 0).astype(np.float32).tocsr())
    assert not convert_file(str(tmp_path / "p.npz"), tmp_path / "p.h5").weighted


@pytest.mark.parametrize("text,message", [
    ("1 2 x\n", "line 1: the weight must be a finite decimal number: '1 2 x'"),
    ("0 1\n1 2 x\n", "line 2: unexpected third field (line 1, the first edge, has two"),
    ("0 1 1\n1 2 1 1\n", "line 2: more than three fields (source, target, weight): '1 2 1 1'"),
    ("0 1 1 1\n", "line 1: more than three fields"),
    ("0 1 1\n2 3\n", "line 2: no weight (line 1, the first edge, has one"),
    ("# Nodes: 2\n0 1\n1 5\n", "'# Nodes: 2' on line 1 declares 2 nodes, but the edges hold 3 distinct ids up to 5"),
    ("# c\n# Nodes: 4 Edges: 2\n0 1\n1 2\n2 3\n3 4\n", "'# Nodes: 4 Edges: 2' on line 2 declares 4 nodes"),
])
def test_extra_fields_and_contradicted_headers_are_refused(text, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text(text)
    line = one_error_line(*run_gnnio(["convert", tmp_path / "g.txt"], capsys, monkeypatch))
    assert message in line
    assert not (tmp_path / "g.h5").exists()


# ------------------------------------------------- 6. one line, not a traceback


def test_string_format_version_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text(EDGES)
    convert_file(str(tmp_path / "g.txt"), tmp_path / "g.h5")
    with h5py.File(tmp_path / "g.h5", "r+") as h5:
        h5.attrs["format_version"] = "1.0"
    line = one_error_line(*run_gnnio(["profile-degree", tmp_path / "g.h5"], capsys, monkeypatch))
    assert "damaged gnnio graph (attribute format_version is '1.0', expected an integer >= 1)" in line


@pytest.mark.parametrize("command", [
    ["reorder", "{graph}", "--method", "rcm", "-o", "{locked}/r.h5"],
    ["generate", "grid", "--rows", "3", "--cols", "3", "-o", "{locked}/r.h5"],
    ["convert", "{source}", "-o", "{locked}/r.h5"],
])
def test_unwritable_folder_is_one_line(command, tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text(EDGES)
    convert_file(str(tmp_path / "g.txt"), tmp_path / "g.h5")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    real_access = os.access
    # Root may write anywhere: there, the folder is made to look read-only as a user sees it.
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    try:
        args = [part.format(graph=tmp_path / "g.h5", locked=locked, source=tmp_path / "g.txt") for part in command]
        line = one_error_line(*run_gnnio(args, capsys, monkeypatch))
    finally:
        locked.chmod(0o700)
    assert f"cannot write into folder {locked} (permission denied)" in line
    assert list(locked.iterdir()) == []


def test_failure_creating_the_temporary_file_is_one_line(tmp_path, capsys, monkeypatch):
    from gnnio_cli.graph import files

    def refuse(tmp):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "_create", refuse)
    line = one_error_line(*run_gnnio(["generate", "grid", "--rows", "3", "--cols", "3", "-o", tmp_path / "g.h5"],
                                     capsys, monkeypatch))
    assert line == f"gnnio: error: {tmp_path / 'g.h5'}: could not write the graph: Permission denied"


def test_write_edges_into_a_missing_folder_leaves_nothing(tmp_path, capsys, monkeypatch):
    args = ["generate", "grid", "--rows", "3", "--cols", "3", "-o", tmp_path / "g.h5", "--write-edges",
            tmp_path / "missing" / "g.txt"]
    line = one_error_line(*run_gnnio(args, capsys, monkeypatch))
    assert "folder" in line and "does not exist" in line
    assert list(tmp_path.iterdir()) == []


def test_edge_list_failure_leaves_neither_file(tmp_path, capsys, monkeypatch):
    from gnnio_cli.cli import generate as generate_command

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(generate_command, "write_edge_list", failing)
    args = ["generate", "grid", "--rows", "3", "--cols", "3", "-o", tmp_path / "g.h5", "--write-edges", tmp_path / "e.txt"]
    line = one_error_line(*run_gnnio(args, capsys, monkeypatch))
    assert line.endswith("e.txt: could not write the edge list: no space left on the device")
    assert list(tmp_path.iterdir()) == []


def test_huge_num_nodes_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text(EDGES)
    line = one_error_line(*run_gnnio(["convert", tmp_path / "g.txt", "--num-nodes", "1000000000000"], capsys, monkeypatch))
    assert "--num-nodes 1000000000000: a graph of 1,000,000,000,000 nodes" in line and "GiB of memory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.txt"]


# ------------------------------------------------------------ 8. the rest


def test_outputs_follow_the_umask(tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text(EDGES)
    previous = os.umask(0o027)
    try:
        assert run_gnnio(["convert", tmp_path / "g.txt", "--quiet"], capsys, monkeypatch)[0] == 0
        assert run_gnnio(["generate", "grid", "--rows", "2", "--cols", "2", "-o", tmp_path / "grid.h5", "--quiet",
                          "--write-edges", tmp_path / "grid.txt"], capsys, monkeypatch)[0] == 0
    finally:
        os.umask(previous)
    for name in ("g.h5", "grid.h5", "grid.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name


def test_ids_that_fit_int64_are_read(tmp_path):
    largest = 2**63 - 1
    (tmp_path / "g.txt").write_text(f"{largest} 1000000000000000000\n0000000000000000000007 {largest}\n")
    convert_file(str(tmp_path / "g.txt"), tmp_path / "g.h5")
    assert store.load_graph(tmp_path / "g.h5").node_ids.tolist() == [7, 10**18, largest]


def test_npz_and_matrix_market_messages(tmp_path, capsys, monkeypatch):
    np.savez(tmp_path / "dense.npz", x=np.arange(3))
    (tmp_path / "g.txt").write_text(EDGES)
    (tmp_path / "g.mtx").write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 1\n1 2\n2 3\n")
    lines = [one_error_line(*run_gnnio(["convert", *args], capsys, monkeypatch)) for args in (
        [tmp_path / "dense.npz"], [tmp_path / "g.txt", "--format", "npz"], [tmp_path / "g.mtx"])]
    assert "dense.npz: not a scipy sparse .npz" in lines[0] and "BytesIO" not in lines[0]
    assert "not an .npz file" in lines[1] and "pickle" not in lines[1]
    assert "2 entries, more than the 1 the size line (line 2) promises" in lines[2] and "truncated" not in lines[2]


def test_run_messages_name_the_right_thing(capsys, monkeypatch):
    rmat = one_error_line(*run_gnnio(["run", "--layer", "gcn", "--graph", "rmat99", "--device", "cpu"], capsys, monkeypatch))
    assert rmat == "gnnio: error: --graph rmat99: rmat<scale> needs a scale in 1..31, got 99"
    heads = one_error_line(*run_gnnio(["run", "--layer", "gat", "--heads", "-2", "--device", "cpu"], capsys, monkeypatch))
    assert heads == "gnnio: error: --heads must be at least 1, got -2"


@pytest.mark.parametrize("args", [[], ["generate"]])
def test_bare_group_prints_its_help_as_written(args, capsys, monkeypatch):
    status, stdout, stderr = run_gnnio(args, capsys, monkeypatch)
    lines = stderr.splitlines()
    assert status == 2 and lines[0].startswith("Usage: gnnio") and len(lines) > 8
    assert "Commands:" in lines and not stderr.startswith("gnnio: error")


def test_cache_hit_reports_what_the_conversion_did(tmp_path, capsys, monkeypatch):
    (tmp_path / "g.txt").write_text("5 6 1\n6 5 2\n5 6 1\n7 7 3\n")
    fresh = convert_json([tmp_path / "g.txt", "--self-loops", "drop"], capsys, monkeypatch)
    cached = convert_json([tmp_path / "g.txt", "--self-loops", "drop"], capsys, monkeypatch)
    assert cached.pop("cached") is True and fresh.pop("cached") is False
    cached.pop("seconds"), fresh.pop("seconds")
    assert cached == fresh and fresh["duplicates_removed"] == 1 and fresh["relabelled"] and fresh["weighted"]


def test_plot_without_matplotlib_fails_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    loaded = []
    monkeypatch.setattr(store, "load", lambda path: loaded.append(path))
    line = one_error_line(*run_gnnio(["profile-degree", tmp_path / "g.h5", "--plot", tmp_path / "d.png"], capsys,
                                     monkeypatch))
    assert "pip install matplotlib" in line and loaded == []


def test_training_reports_every_epoch(monkeypatch):
    from gnnio_cli import train as training

    monkeypatch.setattr(training, "load_planetoid", lambda dataset, data_dir: _tiny_planetoid())
    epochs = []
    training.train("gcn", "cora", seeds=2, epochs=3, device="cpu", against_pyg=False,
                   on_epoch=lambda library, seed, epoch: epochs.append((library, seed, epoch)))
    assert epochs == [("gnnio", seed, epoch) for seed in range(2) for epoch in (1, 2, 3)]


def _tiny_planetoid():
    """A stand-in for a Planetoid split: 12 nodes, 4 features, 2 classes."""
    from types import SimpleNamespace

    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 12, (2, 40), generator=generator)
    masks = [torch.zeros(12, dtype=torch.bool) for _ in range(3)]
    for mask, part in zip(masks, (slice(0, 4), slice(4, 8), slice(8, 12))):
        mask[part] = True
    data = SimpleNamespace(x=torch.randn(12, 4, generator=generator), y=torch.randint(0, 2, (12,), generator=generator),
                           edge_index=edge_index, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                           num_features=4, num_classes=2, raw_dir="tiny")
    data.to = lambda device: data
    return data
