"""Reordering: permutations are valid and round-trip, stored files stay consistent; `gnnio reorder`."""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from gnnio_cli.cli import cli
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.blocked import DEGREE_BUCKETS
from gnnio_cli.graph.generate import standard_graph
from gnnio_cli.graph.locality import locality, random_order
from gnnio_cli.graph.reorder import METHODS, reorder, reorder_stored, warm_up
from gnnio_cli.graph.store import Permutation, StoredGraph, load, save
from tests.testing import edge_list, random_graph


def assert_csr_csc_consistent(graph):
    """CSR (by target) and CSC (by source) hold the same (source, target, eid) triples."""
    csr = set(zip(graph.csr_indices.tolist(), graph.csr_rows.tolist(), graph.csr_eid.tolist()))
    csc_rows = np.repeat(np.arange(graph.num_nodes), graph.out_degree.numpy())
    csc = set(zip(csc_rows.tolist(), graph.csc_indices.tolist(), graph.csc_eid.tolist()))
    assert csr == csc and len(csr) == graph.num_edges
    assert graph.csr_indptr[-1] == graph.csc_indptr[-1] == graph.num_edges


@pytest.mark.parametrize("method", list(METHODS))
def test_permutation_round_trip(method):
    graph = random_graph(120, 900, hub_degree=80, seed=11)
    perm = reorder(graph, method, seed=3)
    assert np.array_equal(np.sort(perm.new_to_old), np.arange(120)) and perm.seconds >= 0
    relabelled = graph.permute(perm.new_to_old)
    assert_csr_csc_consistent(relabelled)
    old_to_new = perm.old_to_new
    # every edge keeps its eid and maps to its relabelled endpoints
    expected = [(int(old_to_new[s]), int(old_to_new[t])) for s, t in edge_list(graph)]
    assert edge_list(relabelled) == expected
    assert edge_list(relabelled.permute(old_to_new)) == edge_list(graph)
    assert np.array_equal(relabelled.node_ids.numpy(), perm.new_to_old)


def test_simple_orders():
    graph = random_graph(200, 1500, hub_degree=300, seed=12)
    degree = (graph.in_degree + graph.out_degree).numpy()
    by_degree = reorder(graph, "degree").new_to_old
    assert np.all(np.diff(degree[by_degree]) <= 0)
    ties = degree[by_degree]
    for value in np.unique(ties):  # ties keep id order (stable)
        assert np.all(np.diff(by_degree[ties == value]) > 0)
    assert np.array_equal(reorder(graph, "none").new_to_old, np.arange(200))
    assert np.array_equal(reorder(graph, "random", seed=5).new_to_old, reorder(graph, "random", seed=5).new_to_old)
    assert not np.array_equal(reorder(graph, "random", seed=5).new_to_old, reorder(graph, "random", seed=6).new_to_old)
    hubs = int((degree > degree.mean()).sum())
    hub_sort = reorder(graph, "hub-sort").new_to_old
    hub_cluster = reorder(graph, "hub-cluster").new_to_old
    assert np.all(np.diff(degree[hub_sort[:hubs]]) <= 0) and np.all(np.diff(hub_sort[hubs:]) > 0)
    assert np.all(np.diff(hub_cluster[:hubs]) > 0) and np.all(np.diff(hub_cluster[hubs:]) > 0)
    assert set(hub_sort[:hubs]) == set(hub_cluster[:hubs]) == set(np.flatnonzero(degree > degree.mean()))


def test_rcm_reduces_bandwidth_of_shuffled_grid():
    grid = standard_graph("grid24").graph
    shuffled = grid.permute(random_order(grid.num_nodes, 1))
    before = locality(shuffled).bandwidth
    after = locality(shuffled, reorder(shuffled, "rcm").new_to_old).bandwidth
    assert before > 500 and after <= 2 * 24


def test_unknown_method_and_bipartite():
    graph = random_graph(10, 30, seed=1)
    with pytest.raises(GnnioError, match="--method: unknown reordering 'metis'"):
        reorder(graph, "metis")
    with pytest.raises(GnnioError, match="--method: unknown reordering 'metis'"):
        warm_up("metis")
    with pytest.raises(GnnioError, match="bipartite"):
        reorder(random_graph(10, 30, seed=1, num_dst_nodes=6), "degree")


def test_reorder_stored_keeps_perms_and_permutes_features():
    graph = random_graph(90, 600, seed=13)
    rng = np.random.default_rng(0)
    features = {"x": rng.standard_normal((90, 5)), "y": rng.integers(0, 3, 90), "edge_weight": rng.random(graph.num_edges)}
    earlier = Permutation("random", random_order(90, 2), 0.5, {"note": 1})
    stored = StoredGraph(graph, perms={"random": earlier}, features=features, blocked={"tiles8": {"tile_col": np.arange(3)}})
    out, report = reorder_stored(stored, "degree", block=8)
    new_to_old = out.perms["degree"].new_to_old
    assert set(out.perms) == {"random", "degree"} and out.perms["random"] is earlier
    assert np.array_equal(out.features["x"], features["x"][new_to_old])
    assert np.array_equal(out.features["y"], features["y"][new_to_old])
    assert out.features["edge_weight"] is features["edge_weight"]  # per edge: eids keep their meaning
    assert set(out.blocked) == {"tiles8", DEGREE_BUCKETS} and out.blocked["tiles8"]["tile_col"].size != 3
    assert report.dropped_blocked == [] and report.blocked.block == 8
    assert report.new_order == locality(out.graph) and report.input_order == locality(graph)
    assert out.perms["degree"].metrics["new_order"]["bandwidth"] == report.new_order.bandwidth
    unblocked, report = reorder_stored(stored, "rcm")
    assert unblocked.blocked == {} and report.dropped_blocked == ["tiles8"] and report.blocked is None


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reorder") / "g.h5"
    graph = random_graph(150, 1200, hub_degree=200, seed=14)
    save(StoredGraph(graph, features={"x": np.random.default_rng(1).standard_normal((150, 4))}), path)
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("method", ["rcm", "rabbit"])
def test_cli_json_and_file(graph_file, method):
    result = invoke("reorder", graph_file, "--method", method, "--json", "--blocked", "16", "--features", "32")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    output = graph_file.with_name(f"g.{method}.h5")
    assert document["output"] == str(output)
    report = document["report"]
    assert report["method"] == method and report["reorder_seconds"] >= 0
    assert set(report) >= {"input_order", "new_order", "random_order", "blocked"}
    original, reordered = load(graph_file), load(output)
    perm = reordered.perms[method]
    assert_csr_csc_consistent(reordered.graph)
    assert edge_list(reordered.graph) == [(int(perm.old_to_new[s]), int(perm.old_to_new[t])) for s, t in edge_list(original.graph)]
    assert np.array_equal(reordered.features["x"], original.features["x"][perm.new_to_old])
    with h5py.File(output) as h5:  # both directions on disk, plain h5py
        assert np.array_equal(h5[f"perm/{method}/old_to_new"][()][h5[f"perm/{method}/new_to_old"][()]], np.arange(150))
        assert {"tile_indptr", "tile_col", "tile_mask"} <= set(h5["blocked/tiles16"])
        assert json.loads(h5[f"perm/{method}"].attrs["metrics"])["cache"]["features"] == 32


def test_cli_in_place_and_table(graph_file, tmp_path):
    target = tmp_path / "copy.h5"
    target.write_bytes(graph_file.read_bytes())
    result = invoke("reorder", target, "--method", "degree", "-o", target)
    assert result.exit_code == 0, result.output
    for text in ("Locality before and after", "input", "degree", "random", "order computed (s)"):
        assert text in result.output
    assert set(load(target).perms) == {"degree"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.h5"]  # no temporary left behind


def test_entry_point_bad_method_and_missing_file(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "gnnio_cli", "reorder", str(tmp_path / "none.h5"), "--method", "rcm"],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [f"gnnio: error: {tmp_path / 'none.h5'}: no such file"]
    assert not (tmp_path / "none.rcm.h5").exists()
    bad = invoke("reorder", tmp_path / "none.h5", "--method", "metis")
    assert bad.exit_code == 2 and "metis" in bad.output
