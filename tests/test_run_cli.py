"""`gnnio run` and `gnnio compare` on CPU: JSON shape, backends, bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from gnnio_cli.bench.workloads import LAYERS
from gnnio_cli.cli import cli
from gnnio_cli.graph import Graph
from gnnio_cli.graph.store import StoredGraph, save


@pytest.fixture(scope="module")
def small_graph_file(tmp_path_factory):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 60, 400)
    dst = rng.integers(0, 50, 400)  # nodes 50..59 have no in-edges
    path = tmp_path_factory.mktemp("graphs") / "small.h5"
    save(StoredGraph(Graph.from_arrays(src, dst, 60, 60)), path)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("aggregation_only", [False, True])
def test_run_every_layer_json_on_bundled_cora(layer, aggregation_only):
    args = ["run", "--layer", layer, "--features", "16", "--heads", "2",
            "--device", "cpu", "--repeat", "2", "--warmup", "1", "--json"]
    if aggregation_only:
        args.append("--aggregation-only")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)  # stdout holds only JSON
    m = document["measurement"]
    assert document["graph"]["num_nodes"] == 2708 and document["graph"]["num_edges"] == 10556
    assert m["backend"] == "reference"
    assert m["forward_ms"]["median_ms"] > 0 and m["train_ms"]["median_ms"] > 0
    assert m["forward_ms"]["min_ms"] <= m["forward_ms"]["median_ms"] <= m["forward_ms"]["max_ms"]
    assert set(m["implementations"].values()) == {"reference"}


def test_run_table_and_no_backward(small_graph_file):
    result = invoke("run", "--layer", "gcn", "--graph", small_graph_file, "--features", "8", "--device", "cpu",
                    "--no-backward", "--repeat", "2")
    assert result.exit_code == 0, result.output
    assert "Timing and peak memory" in result.output and "reference" in result.output


@pytest.mark.parametrize("backward", [True, False])
def test_run_profile_lists_the_costliest_operators(small_graph_file, backward):
    args = ["run", "--layer", "gatv2", "--graph", small_graph_file, "--features", "8", "--heads", "2",
            "--device", "cpu", "--repeat", "1", "--profile", "--json"]
    result = invoke(*args, *([] if backward else ["--no-backward"]))
    assert result.exit_code == 0, result.output
    profiled = json.loads(result.output)["profile"]
    assert profiled["step"] == ("forward+backward" if backward else "forward")
    names = [entry["name"] for entry in profiled["entries"]]
    assert any("mm" in name for name in names)  # a GATv2 layer projects with matmuls
    assert sum(entry["share"] for entry in profiled["entries"]) == pytest.approx(1.0)
    assert sum(entry["total_ms"] for entry in profiled["entries"]) == pytest.approx(profiled["device_total_ms"])
    step = "forward+backward" if backward else "forward"
    assert f"Where one {step} step's time goes" in invoke(*args[:-1], *([] if backward else ["--no-backward"])).output


def test_compare_reference_json(small_graph_file):
    result = invoke("compare", "--layer", "sage-max,gatv2", "--graph", small_graph_file, "--features", "8",
                    "--heads", "2", "--device", "cpu", "--against", "reference", "--repeat", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert [entry["layer"] for entry in document["results"]] == ["sage-max", "gatv2"]
    for entry in document["results"]:
        labels = [run["label"] for run in entry["runs"]]
        assert labels == ["gnnio", "reference"]
        assert entry["runs"][1]["max_error_vs_gnnio"] == 0.0  # on CPU both are the reference


def test_compare_compiled_layers_json(small_graph_file):
    """--against compiled,pyg-compiled: gnnio's and PyG's layers under torch.compile (gnnio's with fullgraph=True,
    so a graph break fails the run), same weights, the same results as eager gnnio's."""
    pytest.importorskip("torch_geometric")
    result = invoke("compare", "--layer", "gcn,gat", "--graph", small_graph_file, "--features", "8", "--heads", "2",
                    "--device", "cpu", "--scope", "layer", "--against", "compiled,pyg-compiled", "--repeat", "2",
                    "--warmup", "1", "--json")
    assert result.exit_code == 0, result.output
    for entry in json.loads(result.output)["results"]:
        runs = entry["runs"]
        assert [run["label"] for run in runs] == ["gnnio", "compiled", "pyg-compiled"]
        for run in runs[1:]:
            assert run["max_error_vs_gnnio"] < 1e-5 and run["train_ms"]["median_ms"] > 0
    refused = subprocess.run([sys.executable, "-m", "gnnio_cli", "compare", "--layer", "gcn", "--graph", small_graph_file,
                              "--device", "cpu", "--against", "compiled"], capture_output=True, text=True)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1 and "add --scope layer" in lines[0], refused.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "--layer", "nope"], "Invalid value for '--layer'"),
        (["run", "--layer", "gat", "--features", "10", "--heads", "4", "--device", "cpu"], "does not divide"),
        (["run", "--layer", "gcn", "--graph", "/nonexistent/graph.h5", "--device", "cpu"], "no such file"),
        (["run", "--layer", "gcn", "--graph", "not-a-standard-graph", "--device", "cpu"], "unknown standard graph"),
        (["compare", "--layer", "gcn,bogus", "--device", "cpu"], "unknown layer"),
    ],
)
def test_bad_input_one_line(args, fragment):
    completed = subprocess.run([sys.executable, "-m", "gnnio_cli", *args], capture_output=True, text=True)
    assert completed.returncode != 0
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], completed.stderr


def test_cuda_requested_without_gpu(small_graph_file):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    completed = subprocess.run(
        [sys.executable, "-m", "gnnio_cli", "run", "--layer", "gcn", "--graph", small_graph_file, "--device", "cuda"],
        capture_output=True, text=True,
    )
    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines() == [
        "gnnio: error: --device cuda: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); use --device cpu"
    ]


def test_compare_reorder_and_shuffled_graph():
    result = invoke("compare", "--layer", "sage-sum", "--graph", "grid8+shuffled", "--reorder", "none,rcm,random",
                    "--features", "4", "--device", "cpu", "--against", "reference", "--repeat", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["graph"]["name"] == "grid8+shuffled" and document["graph"]["num_edges"] == 2 * 2 * 8 * 7
    assert [entry["method"] for entry in document["reorders"]] == ["none", "rcm", "random"]
    none, rcm, _ = document["reorders"]
    assert rcm["reorder_seconds"] > 0
    # RCM recovers a banded order from the shuffled grid.
    assert rcm["locality"]["bandwidth"] < none["locality"]["bandwidth"]
    for run in none["results"][0]["runs"]:
        assert run["saved_ms_per_step"] == 0 and run["payback_steps"] is None


def test_graph_modifiers_hub_and_spread():
    from gnnio_cli.graph import catalog

    hub, spread = catalog.resolve("grid8+hub300"), catalog.resolve("grid8+spread300")
    assert hub.graph.num_nodes == spread.graph.num_nodes == 65
    assert hub.graph.num_edges == spread.graph.num_edges == 224 + 300
    assert int(hub.graph.in_degree[64]) == 300 and int(spread.graph.in_degree[64]) == 0
    assert hub.name == "grid8+hub300"
    with pytest.raises(Exception, match="unknown modifier"):
        catalog.resolve("grid8+hubby")


@pytest.mark.parametrize(
    "layer, fragment", [("gatv2", "needs --device cuda"), ("sage-max", "only attention layers")]
)
def test_compare_schedules_refuses_what_it_cannot_time(layer, fragment):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    completed = subprocess.run(
        [sys.executable, "-m", "gnnio_cli", "compare", "--layer", layer, "--graph", "grid8", "--schedules",
         "--device", "cpu"],
        capture_output=True, text=True,
    )
    assert completed.returncode == 1
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], completed.stderr
