"""Generators (R-MAT, uniform, grid), the standard graph names, and `gnnio generate`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gnnio_cli.cli import cli
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import generate, store
from gnnio_cli.graph.convert import convert_file


def edge_array(graph) -> np.ndarray:
    return graph.edge_index().numpy()


def assert_simple(graph) -> None:
    src, dst = edge_array(graph)
    assert not np.any(src == dst), "self-loop left"
    assert np.unique(dst * graph.num_nodes + src).size == graph.num_edges, "duplicate left"


@pytest.mark.parametrize("levels", [1, 2, 4])
def test_rmat_path_table_reproduces_the_quadrant_probabilities(levels):
    a, b, c = 0.57, 0.19, 0.19
    table = generate._path_table(levels, a, b, c)
    size = 4**levels
    keep = table.threshold / float(1 << generate._THRESHOLD_BITS)
    implied = keep.copy()
    np.add.at(implied, table.alias, 1.0 - keep)
    quadrant = np.array([a, b, c, 1 - a - b - c])
    digits = [(np.arange(size) >> (2 * (levels - 1 - level))) & 3 for level in range(levels)]
    expected = np.prod([quadrant[d] for d in digits], axis=0)
    np.testing.assert_allclose(implied / size, expected, atol=1e-7)
    row_bits = sum((d >> 1) << (levels - 1 - level) for level, d in enumerate(digits))
    np.testing.assert_array_equal(table.row_bits, row_bits)


@pytest.mark.parametrize("scale", [1, 5, 12])
def test_rmat_id_permutation_is_a_bijection(scale):
    ids = np.arange(1 << scale, dtype=np.int64)
    keys = generate._permutation_keys(seed=11)
    mask, shift = np.uint64((1 << scale) - 1), np.uint64(max(1, (scale + 1) // 2))
    permuted = np.array([generate._permute_id(node, mask, shift, keys) for node in ids])
    np.testing.assert_array_equal(np.sort(permuted), ids)
    if scale > 1:
        assert not np.array_equal(permuted, ids)


def test_rmat_counts_and_determinism():
    first = generate.rmat(10, seed=3)
    graph = first.stored.graph
    assert graph.num_nodes == 1024
    assert graph.num_edges + first.duplicates_removed + first.self_loops_removed == 16 * 1024
    assert first.duplicates_removed > 0
    assert_simple(graph)
    again = generate.rmat(10, seed=3).stored.graph
    np.testing.assert_array_equal(edge_array(graph), edge_array(again))
    other = generate.rmat(10, seed=4).stored.graph
    assert graph.num_edges != other.num_edges or not np.array_equal(edge_array(graph), edge_array(other))


def test_rmat_is_skewed_and_its_hubs_are_spread():
    graph = generate.rmat(12, seed=5).stored.graph
    in_degree = graph.in_degree.numpy()
    assert in_degree.max() > 20 * in_degree.mean()
    hubs = np.argsort(in_degree)[-10:]
    assert hubs.max() > 4096 // 4  # ids are permuted: hubs are not all near id 0


def test_rmat_odd_scale_uses_the_tail_table():
    generated = generate.rmat(7, edge_factor=4, seed=1)
    assert generated.stored.graph.num_nodes == 128
    assert generated.stored.graph.num_edges + generated.duplicates_removed + generated.self_loops_removed == 512


def test_uniform_exact_in_degree():
    generated = generate.uniform(9, degree=16, seed=2)
    graph = generated.stored.graph
    assert graph.num_nodes == 512 and graph.num_edges == 512 * 16
    assert (graph.in_degree.numpy() == 16).all()
    assert_simple(graph)
    np.testing.assert_array_equal(edge_array(graph), edge_array(generate.uniform(9, degree=16, seed=2).stored.graph))


def test_grid_structure():
    rows, cols = 5, 7
    graph = generate.grid(rows, cols).stored.graph
    assert graph.num_nodes == rows * cols
    assert graph.num_edges == 2 * (rows * (cols - 1) + (rows - 1) * cols)
    assert_simple(graph)
    degree = graph.in_degree.numpy().reshape(rows, cols)
    assert degree[0, 0] == 2 and degree[0, 3] == 3 and degree[2, 3] == 4
    edges = set(zip(*edge_array(graph).tolist()))
    node = 2 * cols + 3
    assert {(node, node + 1), (node, node - 1), (node, node + cols), (node, node - cols)} <= edges
    assert (node, node + cols + 1) not in edges


def test_standard_graph_names():
    assert generate.standard_graph("grid8").graph.num_nodes == 64
    assert generate.standard_graph("uniform6").graph.num_edges == 64 * 16
    rmat = generate.standard_graph("rmat8")
    assert rmat.graph.num_nodes == 256 and rmat.params["generator"] == "rmat" and rmat.directed
    with pytest.raises(GnnioError, match=r"unknown standard graph 'cora'"):
        generate.standard_graph("cora")


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: generate.rmat(0), r"--scale: must be in 1\.\.31, got 0"),
        (lambda: generate.rmat(5, a=0.9, b=0.2, c=0.1), r"a \+ b \+ c <= 1"),
        (lambda: generate.uniform(3, degree=8), r"--degree: must be in 1\.\.7"),
        (lambda: generate.grid(0, 4), r"at least 1"),
    ],
)
def test_generator_errors(call, message):
    with pytest.raises(GnnioError, match=message):
        call()


def test_cli_generate_writes_h5_and_edges_that_convert_back(tmp_path):
    runner = CliRunner()
    out, text = tmp_path / "r.h5", tmp_path / "r.txt.gz"
    result = runner.invoke(cli, ["generate", "rmat", "--scale", "9", "--seed", "7", "-o", str(out), "--write-edges", str(text), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    generated = store.load(out)
    assert record["edges"] == generated.graph.num_edges and record["nodes"] == 512
    assert generated.params["seed"] == 7

    summary = convert_file(str(text), tmp_path / "back.h5")
    assert summary.nodes == 512 and not summary.relabelled and summary.duplicates_removed == 0
    back = store.load_graph(tmp_path / "back.h5")
    original = set(zip(*edge_array(generated.graph).tolist()))
    assert set(zip(*edge_array(back).tolist())) == original


def test_cli_generate_default_name_and_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["generate", "grid", "--rows", "4", "--cols", "4"])
    assert result.exit_code == 0, result.output
    assert "grid4" in result.output and (tmp_path / "grid4.h5").exists()
    result = CliRunner().invoke(cli, ["generate", "uniform", "--scale", "5", "--degree", "3", "--quiet"])
    assert result.exit_code == 0 and result.stdout == "" and (tmp_path / "uniform5.h5").exists()
