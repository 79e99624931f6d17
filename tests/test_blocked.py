"""Block-sparse tiles and degree buckets against a brute-force construction from the edge list."""

from collections import defaultdict

import numpy as np
import pytest

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.blocked import DEGREE_BUCKETS, block_report, block_tiles, blocked_arrays, degree_buckets
from gnnio_cli.graph.profile import shared_memory_row_limit
from gnnio_cli.graph.store import StoredGraph, load, save
from tests.testing import random_graph


def brute_force_tiles(graph, block):
    """{(tile_row, tile_col): (set of (r, c) positions, list of eids in CSR order)}."""
    tiles = defaultdict(lambda: (set(), []))
    rows, indices, eids = graph.csr_rows.tolist(), graph.csr_indices.tolist(), graph.csr_eid.tolist()
    for target, source, eid in zip(rows, indices, eids):
        positions, members = tiles[(target // block, source // block)]
        positions.add((target % block, source % block))
        members.append(eid)
    return tiles


@pytest.mark.parametrize("block", [1, 5, 16, 33])
@pytest.mark.parametrize("bipartite", [False, True])
def test_tiles_match_brute_force(block, bipartite):
    graph = random_graph(70, 500, hub_degree=60, seed=block, num_dst_nodes=45 if bipartite else None)
    tiles = block_tiles(graph, block)
    expected = brute_force_tiles(graph, block)
    tile_indptr, tile_col, tile_mask = tiles["tile_indptr"], tiles["tile_col"], tiles["tile_mask"]
    assert tile_indptr.size == -(-graph.num_dst_nodes // block) + 1 and tile_indptr[-1] == len(expected)
    assert tile_mask.shape == (len(expected), block, -(-block // 8)) and tile_mask.dtype == np.uint8
    seen = {}
    for tile_row in range(tile_indptr.size - 1):
        cols = tile_col[tile_indptr[tile_row]:tile_indptr[tile_row + 1]]
        assert np.all(np.diff(cols) > 0)
        for t, col in zip(range(tile_indptr[tile_row], tile_indptr[tile_row + 1]), cols.tolist()):
            bits = np.unpackbits(tile_mask[t], axis=1, bitorder="little")[:, :block]
            positions = {(int(r), int(c)) for r, c in zip(*np.nonzero(bits))}
            eids = tiles["tile_eid"][tiles["tile_edge_ptr"][t]:tiles["tile_edge_ptr"][t + 1]].tolist()
            seen[(tile_row, col)] = (positions, eids)
    # eids within a tile: by row, then CSR slot (a stable sort of the brute force's CSR-ordered list)
    rows = {eid: target for target, eid in zip(graph.csr_rows.tolist(), graph.csr_eid.tolist())}
    for key, (positions, eids) in expected.items():
        expected_eids = sorted(eids, key=lambda eid: rows[eid] % block)
        assert seen[key] == (positions, expected_eids)
    assert len(seen) == len(expected)


def test_block_report_and_errors():
    graph = random_graph(64, 800, seed=5, duplicates=False, self_loops=False, empty_rows=False)
    tiles = block_tiles(graph, 16)
    report = block_report(tiles)
    expected = brute_force_tiles(graph, 16)
    positions = np.array([len(p) for p, _ in expected.values()])
    assert report.num_tiles == len(expected) == 16
    assert report.density == pytest.approx(positions.sum() / (16 * 256)) and report.density == pytest.approx(graph.num_edges / 4096)  # no duplicates
    assert report.positions_per_tile_max == positions.max()
    assert report.positions_per_tile_median == np.median(positions)
    assert report.edges_in_dense_tiles == pytest.approx(positions[positions >= 16].sum() / graph.num_edges)
    with pytest.raises(GnnioError, match="--blocked: tile size must be in 1..256, got 0"):
        block_tiles(graph, 0)


def test_degree_buckets():
    graph = random_graph(500, 4000, hub_degree=1200, seed=7)
    buckets = degree_buckets(graph, features=256, dtype="fp32")
    limit = shared_memory_row_limit(256, "fp32")  # 227, between the warp and split limits
    assert buckets["thresholds"].tolist() == [32, limit, 1024]
    in_degree = graph.in_degree.numpy()
    bounds = [-1, 32, limit, 1024, np.inf]
    for k in range(4):
        rows = buckets["rows"][buckets["bucket_ptr"][k]:buckets["bucket_ptr"][k + 1]]
        expected = np.flatnonzero((in_degree > bounds[k]) & (in_degree <= bounds[k + 1]))
        assert np.array_equal(rows, expected)
    assert buckets["bucket_ptr"][-1] == 500 and buckets["bucket_ptr"][-2] == 499  # one hub past 1024


def test_blocked_arrays_round_trip_through_store(tmp_path):
    graph = random_graph(100, 700, seed=8)
    blocked = blocked_arrays(graph, block=8, features=64, dtype="bf16")
    assert set(blocked) == {"tiles8", DEGREE_BUCKETS}
    save(StoredGraph(graph, blocked=blocked), tmp_path / "g.h5")
    loaded = load(tmp_path / "g.h5").blocked
    for kind, arrays in blocked.items():
        for key, value in arrays.items():
            assert np.array_equal(loaded[kind][key], value) and loaded[kind][key].dtype == value.dtype
