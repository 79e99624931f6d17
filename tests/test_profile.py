"""Degree profile and locality metrics against brute-force computations; `gnnio profile-degree`."""

import json
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
from click.testing import CliRunner

from gnnio_cli.cli import cli
from gnnio_cli.graph import Graph
from gnnio_cli.graph.generate import standard_graph
from gnnio_cli.graph.locality import CacheModel, locality, random_order
from gnnio_cli.graph.profile import degree_profile, shared_memory_row_limit, undirected_degree
from gnnio_cli.graph.store import StoredGraph, save
from tests.testing import edge_list, random_graph


def brute_force_gaps(graph: Graph, new_to_old=None):
    """|target - source| of every edge after relabelling, from the plain edge list."""
    n = graph.num_nodes
    old_to_new = np.arange(n) if new_to_old is None else np.argsort(new_to_old)
    return np.array([abs(int(old_to_new[t]) - int(old_to_new[s])) for s, t in edge_list(graph)], dtype=np.int64)


def lru_hit_rate_python(graph: Graph, new_to_old, cache: CacheModel) -> float:
    """A plain OrderedDict LRU over the access trace: targets in new id order, CSR slots within a row."""
    n = graph.num_nodes
    new_to_old = np.arange(n) if new_to_old is None else new_to_old
    old_to_new = np.argsort(new_to_old)
    indptr, indices = graph.csr_indptr.tolist(), graph.csr_indices.tolist()
    lru, hits, loads = OrderedDict(), 0, 0
    for old_target in new_to_old.tolist():
        for slot in range(indptr[old_target], indptr[old_target + 1]):
            entry = int(old_to_new[indices[slot]]) // cache.rows_per_entry
            loads += 1
            if entry in lru:
                hits += 1
                lru.move_to_end(entry)
            else:
                lru[entry] = True
                if len(lru) > cache.capacity_entries:
                    lru.popitem(last=False)
    return hits / loads


def tiny_cache(entries: int, features: int = 32) -> CacheModel:
    """A cache of `entries` rows of `features` fp32 values (for features >= 32 a row fills whole lines)."""
    row_bytes = -(-features * 4 // 128) * 128
    return CacheModel(features=features, dtype="fp32", l2_mb=entries * row_bytes / 2**20)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_degree_stats_match_numpy(seed):
    graph = random_graph(250, 2000, hub_degree=500, seed=seed)
    profile = degree_profile(graph)
    edges = np.array(edge_list(graph))
    in_degree = np.bincount(edges[:, 1], minlength=250)
    out_degree = np.bincount(edges[:, 0], minlength=250)
    for stats, degree in ((profile.in_degree, in_degree), (profile.out_degree, out_degree)):
        assert stats.min == degree.min() and stats.max == degree.max()
        assert stats.mean == pytest.approx(degree.mean())
        assert stats.median == pytest.approx(np.median(degree))
        assert stats.p90 == pytest.approx(np.percentile(degree, 90))
        assert stats.p99 == pytest.approx(np.percentile(degree, 99))
        top = sorted(degree.tolist(), reverse=True)[:2]  # floor(1% of 250 nodes)
        assert stats.top1pct_edge_share == pytest.approx(sum(top) / degree.sum())
    neighbours = [set() for _ in range(250)]
    for s, t in edges.tolist():
        if s != t:
            neighbours[s].add(t)
            neighbours[t].add(s)
    undirected = np.array([len(n) for n in neighbours])
    assert np.array_equal(undirected_degree(graph), undirected)
    assert profile.undirected_degree.max == undirected.max() and profile.undirected_degree.median == np.median(undirected)
    touched = set(edges.ravel().tolist())
    assert profile.isolated_nodes == sum(1 for v in range(250) if v not in touched) >= 1
    assert profile.num_edges == len(edges)


def test_histogram_bins_and_schedule_counts():
    graph = random_graph(400, 3000, hub_degree=2000, seed=3)
    profile = degree_profile(graph, CacheModel(features=64, dtype="bf16"))
    in_degree = graph.in_degree.numpy()
    histogram = profile.histogram
    for lower, upper, count in zip(histogram.lower, histogram.upper, histogram.in_count):
        assert count == sum(1 for d in in_degree.tolist() if lower <= d <= upper)
    assert sum(histogram.out_count) == sum(histogram.in_count) == 400
    assert [int(d).bit_length() for d in (0, 1, 2, 3, 4, 2000)] == [0, 1, 2, 2, 3, 11]
    assert histogram.lower[:4] == [0, 1, 2, 4] and histogram.upper[:4] == [0, 1, 3, 7]
    limit = shared_memory_row_limit(64, "bf16")
    assert limit == 227 * 1024 // (64 * 2) == 1816
    assert profile.schedule.shared_memory_row_limit == limit
    assert profile.schedule.rows_over_warp_limit == int((in_degree > 32).sum())
    assert profile.schedule.rows_over_split_limit == int((in_degree > 1024).sum()) == 1
    assert profile.schedule.rows_over_shared_memory == int((in_degree > limit).sum()) == 1
    assert shared_memory_row_limit(128, "fp32") == 454


@pytest.mark.parametrize("permuted", [False, True])
def test_gap_metrics_match_brute_force(permuted):
    graph = random_graph(200, 1500, hub_degree=100, seed=4)
    new_to_old = random_order(200, seed=9) if permuted else None
    metrics = locality(graph, new_to_old)
    gaps = brute_force_gaps(graph, new_to_old)
    assert metrics.bandwidth == gaps.max()
    assert metrics.mean_gap == pytest.approx(gaps.mean())
    assert metrics.median_gap == np.median(gaps)
    assert metrics.mean_log2_gap == pytest.approx(np.log2(1 + gaps).mean())
    if permuted:  # measuring through the permutation equals measuring the relabelled graph
        assert metrics == locality(graph.permute(new_to_old))


@pytest.mark.parametrize("entries", [1, 2, 7, 40])
@pytest.mark.parametrize("features", [32, 130, 4])
def test_lru_simulation_matches_python_lru(entries, features):
    graph = random_graph(150, 1200, hub_degree=60, seed=entries)
    cache = tiny_cache(entries, features)
    assert cache.capacity_entries == entries if features >= 32 else cache.capacity_entries >= 1
    for new_to_old in (None, random_order(150, seed=5)):
        expected = lru_hit_rate_python(graph, new_to_old, cache)
        assert locality(graph, new_to_old, cache).cache_hit_rate == pytest.approx(expected, abs=1e-12)


def test_cache_model_entries():
    wide = CacheModel(features=130, dtype="fp32", l2_mb=1)
    assert wide.rows_per_entry == 1 and wide.entry_bytes == 640 and wide.capacity_entries == 2**20 // 640
    narrow = CacheModel(features=8, dtype="fp16", l2_mb=1)  # 16-byte rows, 8 per line
    assert narrow.rows_per_entry == 8 and narrow.entry_bytes == 128


def test_natural_grid_beats_random_order():
    grid = standard_graph("grid32").graph
    cache = tiny_cache(256)  # holds the last 64 rows' neighbours: only the row 32 ahead is new
    natural = locality(grid, cache=cache)
    shuffled = locality(grid, random_order(grid.num_nodes, 0), cache)
    assert natural.bandwidth == 32 and natural.mean_gap == natural.median_gap == 16.5  # as many gaps of 1 as of 32
    assert natural.cache_hit_rate > 0.7 > 0.3 > shuffled.cache_hit_rate


def test_empty_graph_profile():
    graph = Graph.from_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 5, 5)
    profile = degree_profile(graph)
    assert profile.isolated_nodes == 5 and profile.in_degree.max == 0
    assert profile.locality.cache_hit_rate == 0.0 and profile.locality.bandwidth == 0


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "g.h5"
    save(StoredGraph(random_graph(300, 2500, hub_degree=1500, seed=6)), path)
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_cli_json(graph_file):
    result = invoke("profile-degree", graph_file, "--json", "--features", "64", "--l2-mb", "0.01")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    profile = document["profile"]
    assert profile["num_nodes"] == 300 and profile["in_degree"]["max"] >= 1500
    assert profile["schedule"]["shared_memory_row_limit"] == 908
    assert set(profile["locality"]) == {"bandwidth", "mean_gap", "median_gap", "mean_log2_gap", "cache_hit_rate"}
    assert 0 <= document["random_order"]["cache_hit_rate"] <= 1
    assert document["cache"]["features"] == 64


def test_cli_tables(graph_file):
    result = invoke("profile-degree", graph_file)
    assert result.exit_code == 0, result.output
    for heading in ("Degrees", "undirected", "Degree histogram", "schedule thresholds", "Locality", "random", "seed 0", "█"):
        assert heading in result.output


def test_cli_plot_without_matplotlib(graph_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(Exception, match=r"pip install matplotlib \(or pip install gnnio\[plot\]\)"):
        invoke("profile-degree", graph_file, "--plot", tmp_path / "deg.png")
    assert not (tmp_path / "deg.png").exists()


def test_cli_plot_with_matplotlib(graph_file, tmp_path):
    pytest.importorskip("matplotlib")
    result = invoke("profile-degree", graph_file, "--plot", tmp_path / "deg.png", "--json")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "deg.png").stat().st_size > 0


def test_entry_point_missing_file(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gnnio_cli", "profile-degree", str(tmp_path / "none.h5")],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"gnnio: error: {tmp_path / 'none.h5'}: no such file"]
