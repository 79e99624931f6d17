"""Every real graph in ../shared/datasets converts to the counts its manifest states.

Undirected graphs are converted as a symmetric simple graph (--undirected
--self-loops drop): nodes_declared nodes, 2 * undirected_pairs edges and
sym_max_deg as the largest in-degree. Directed graphs are converted as stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gnnio_cli.graph import store
from gnnio_cli.graph.convert import ConvertOptions, convert_file

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
MANIFEST = DATASETS / "manifest.json"
ENTRIES = json.loads(MANIFEST.read_text())["datasets"] if MANIFEST.exists() else []

pytestmark = pytest.mark.skipif(not ENTRIES, reason=f"no dataset manifest at {MANIFEST}")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if not e["directed"]], ids=lambda e: e["name"])
def test_symmetric_simple_graph_counts(entry, tmp_path):
    stats = entry["stats"]
    summary = convert_file(
        str(DATASETS / stats["file"]), tmp_path / "g.h5", ConvertOptions(undirected=True, self_loops="drop")
    )
    graph = store.load_graph(tmp_path / "g.h5")
    assert summary.entries_read == stats["stored_entries"]
    assert summary.self_loops_removed == stats["self_loops"]
    assert graph.num_nodes == stats["nodes_declared"]
    assert graph.num_edges == 2 * stats["undirected_pairs"]
    in_degree = graph.in_degree
    assert int(in_degree.max()) == stats["sym_max_deg"]
    assert int((in_degree == 0).sum()) == stats["isolated_nodes"]
    assert (graph.in_degree == graph.out_degree).all()


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["directed"]], ids=lambda e: e["name"])
def test_directed_graph_as_stored(entry, tmp_path):
    stats = entry["stats"]
    summary = convert_file(str(DATASETS / stats["file"]), tmp_path / "g.h5")
    graph = store.load_graph(tmp_path / "g.h5")
    assert summary.duplicates_removed == stats["dup_entries"]
    assert graph.num_nodes == stats["nodes_declared"]
    assert graph.num_edges == stats["arcs"]
    assert int(graph.in_degree.max()) == stats["max_in_deg"]
    assert int(graph.out_degree.max()) == stats["max_out_deg"]
    if stats["id_min"] > 0:
        assert int(graph.node_ids.min()) == stats["id_min"] and int(graph.node_ids.max()) == stats["id_max"]


def test_wiki_vote_numbers(tmp_path):
    """The directed acceptance numbers of issue 2, spelled out."""
    path = DATASETS / "wiki-Vote.txt.gz"
    if not path.exists():
        pytest.skip(f"{path} not present")
    convert_file(str(path), tmp_path / "w.h5")
    graph = store.load_graph(tmp_path / "w.h5")
    assert graph.num_edges == 103_689
    assert int(graph.in_degree.max()) == 457
    assert int(graph.out_degree.max()) == 893


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_profile_degree_json_states_the_manifest_max_degree(entry, tmp_path):
    """`gnnio profile-degree --json` on each converted dataset reports the manifest's degrees."""
    from click.testing import CliRunner

    from gnnio_cli.cli import cli

    stats = entry["stats"]
    options = ConvertOptions() if entry["directed"] else ConvertOptions(undirected=True, self_loops="drop")
    convert_file(str(DATASETS / stats["file"]), tmp_path / "g.h5", options)
    result = CliRunner().invoke(cli, ["profile-degree", str(tmp_path / "g.h5"), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    profile = json.loads(result.output)["profile"]
    assert profile["undirected_degree"]["max"] == stats["sym_max_deg"]
    if entry["directed"]:
        assert profile["in_degree"]["max"] == stats["max_in_deg"]
        assert profile["out_degree"]["max"] == stats["max_out_deg"]
    else:
        assert profile["in_degree"]["max"] == stats["sym_max_deg"]
