"""Every real graph of the manifests (sample_graphs/, and $GNNIO_DATASETS when set) converts to the
counts its manifest states.

Undirected graphs are converted as a symmetric simple graph (--undirected
--self-loops drop): nodes_declared nodes, 2 * undirected_pairs edges and
sym_max_deg as the largest in-degree. Directed graphs are converted as stored.
"""

from __future__ import annotations

import json

import pytest

from gnnio_cli.graph import store
from gnnio_cli.graph.convert import ConvertOptions, convert_file
from testing import real_graphs

GRAPHS = real_graphs()


def test_the_bundled_graphs_are_in_the_manifest():
    assert {"cora", "citeseer", "minnesota"} <= {graph.name for graph in GRAPHS}
    assert all(graph.path.is_file() for graph in GRAPHS), [str(graph.path) for graph in GRAPHS]


@pytest.mark.parametrize("graph", [g for g in GRAPHS if not g.directed], ids=lambda g: g.name)
def test_symmetric_simple_graph_counts(graph, tmp_path):
    stats = graph.stats
    summary = convert_file(str(graph.path), tmp_path / "g.h5", ConvertOptions(undirected=True, self_loops="drop"))
    stored = store.load_graph(tmp_path / "g.h5")
    assert summary.entries_read == stats["stored_entries"]
    assert summary.self_loops_removed == stats["self_loops"]
    assert stored.num_nodes == stats["nodes_declared"]
    assert stored.num_edges == 2 * stats["undirected_pairs"]
    in_degree = stored.in_degree
    assert int(in_degree.max()) == stats["sym_max_deg"]
    assert int((in_degree == 0).sum()) == stats["isolated_nodes"]
    assert (stored.in_degree == stored.out_degree).all()


@pytest.mark.parametrize("graph", [g for g in GRAPHS if g.directed], ids=lambda g: g.name)
def test_directed_graph_as_stored(graph, tmp_path):
    stats = graph.stats
    summary = convert_file(str(graph.path), tmp_path / "g.h5")
    stored = store.load_graph(tmp_path / "g.h5")
    assert summary.duplicates_removed == stats["dup_entries"]
    assert stored.num_nodes == stats["nodes_declared"]
    assert stored.num_edges == stats["arcs"]
    assert int(stored.in_degree.max()) == stats["max_in_deg"]
    assert int(stored.out_degree.max()) == stats["max_out_deg"]
    if stats["id_min"] > 0:
        assert int(stored.node_ids.min()) == stats["id_min"] and int(stored.node_ids.max()) == stats["id_max"]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.name)
def test_profile_degree_json_states_the_manifest_max_degree(graph, tmp_path):
    """`gnnio profile-degree --json` on each converted graph reports the manifest's degrees."""
    from click.testing import CliRunner

    from gnnio_cli.cli import cli

    stats = graph.stats
    options = ConvertOptions() if graph.directed else ConvertOptions(undirected=True, self_loops="drop")
    convert_file(str(graph.path), tmp_path / "g.h5", options)
    result = CliRunner().invoke(cli, ["profile-degree", str(tmp_path / "g.h5"), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    profile = json.loads(result.output)["profile"]
    assert profile["undirected_degree"]["max"] == stats["sym_max_deg"]
    if graph.directed:
        assert profile["in_degree"]["max"] == stats["max_in_deg"]
        assert profile["out_degree"]["max"] == stats["max_out_deg"]
    else:
        assert profile["in_degree"]["max"] == stats["sym_max_deg"]
