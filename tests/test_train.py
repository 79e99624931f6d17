"""Planetoid loading (equal to PyG's processing), the training recipes, and `gnnio train`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from click.testing import CliRunner

import gnnio_cli.nn as gnnio_nn
from gnnio_cli.cli import cli
from gnnio_cli.errors import GnnioError
from gnnio_cli.train import build_model, evaluate, find_planetoid, load_planetoid, train, train_seed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def cora():
    return load_planetoid("cora")


@pytest.mark.parametrize("dataset, name", [("cora", "Cora"), ("citeseer", "CiteSeer")])
def test_loading_equals_pyg_planetoid(dataset, name, tmp_path):
    pytest.importorskip("torch_geometric")
    from torch_geometric.datasets import Planetoid
    from torch_geometric.transforms import NormalizeFeatures

    raw_dir = find_planetoid(dataset)
    shutil.copytree(raw_dir, tmp_path / name / "raw")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = Planetoid(str(tmp_path), name, transform=NormalizeFeatures())[0]
    ours = load_planetoid(dataset, tmp_path)
    assert torch.equal(ours.x, expected.x)
    assert torch.equal(ours.y, expected.y)
    assert torch.equal(ours.edge_index, expected.edge_index)
    for split in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ours, split), getattr(expected, split)), split


def test_public_split_sizes_and_citeseer_isolated_test_nodes():
    citeseer = load_planetoid("citeseer")
    assert citeseer.x.shape == (3327, 3703) and citeseer.num_classes == 6
    assert [int(mask.sum()) for mask in (citeseer.train_mask, citeseer.val_mask, citeseer.test_mask)] == [120, 500, 1000]
    # Test-block ids missing from the files get all-zero features (kept zero by the row normalisation).
    test_block = torch.arange(int(citeseer.test_mask.nonzero().min()), citeseer.x.shape[0])
    missing = test_block[~citeseer.test_mask[test_block]]
    assert missing.numel() == 15
    assert torch.all(citeseer.x[missing] == 0)
    row_sums = citeseer.x.sum(dim=1)
    assert torch.allclose(row_sums[row_sums > 0], torch.ones(1))


def test_missing_files_name_the_folders(tmp_path):
    with pytest.raises(GnnioError, match=str(tmp_path)):
        load_planetoid("cora", tmp_path)
    with pytest.raises(GnnioError, match="unknown dataset"):
        load_planetoid("pubmed")


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_training_follows_pyg_step_for_step(model, cora):
    """Same seed, same initial weights, same dropout masks (attention's too, on the CPU): the same run."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    ours = train_seed(model, gnnio_nn, cora, seed=3, epochs=4)
    theirs = train_seed(model, pyg_nn, cora, seed=3, epochs=4)
    assert (ours.test_accuracy, ours.val_accuracy, ours.best_epoch) == (
        theirs.test_accuracy,
        theirs.val_accuracy,
        theirs.best_epoch,
    )


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_models_start_identical_to_pyg(model, cora):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ours, _ = build_model(model, gnnio_nn, cora)
    torch.manual_seed(0)
    theirs, _ = build_model(model, pyg_nn, cora)
    assert evaluate(ours, cora) == evaluate(theirs, cora)
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(cora.x, cora.edge_index), theirs(cora.x, cora.edge_index), atol=1e-5, rtol=1e-5)


def test_training_learns_and_reports_per_library(cora):
    report = train("gcn", "cora", seeds=1, epochs=20, device="cpu", against_pyg=False)
    assert [result.library for result in report.libraries] == ["gnnio"]
    result = report.libraries[0]
    assert len(result.runs) == 1 and result.std == 0
    assert result.mean > 0.5  # far above the 1/7 of chance after 20 epochs


def test_train_command_json_and_errors(cora, tmp_path):
    runner = CliRunner()
    outcome = runner.invoke(cli, ["train", "--model", "gcn", "--seeds", "2", "--epochs", "3", "--json"])
    assert outcome.exit_code == 0, outcome.output
    document = json.loads(outcome.stdout)
    libraries = [entry["library"] for entry in document["results"]]
    assert libraries[0] == "gnnio" and len(document["results"][0]["runs"]) == 2
    outcome = runner.invoke(cli, ["train", "--model", "gcn", "--data-dir", str(tmp_path)], standalone_mode=False)
    assert isinstance(outcome.exception, GnnioError)


def test_gnnio_train_entry_point_runs():
    completed = subprocess.run(
        [sys.executable, "-m", "gnnio_cli", "train", "--model", "gcn", "--seeds", "1", "--epochs", "1", "--no-against-pyg"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "mean test acc" in completed.stdout and "gnnio" in completed.stdout
    assert "pyg" not in completed.stdout.split("mean test acc")[1]


def test_train_without_pyg_says_why(cora, monkeypatch):
    import gnnio_cli.train as training

    monkeypatch.setattr(training, "pyg_layers", lambda: (None, "No module named 'torch_geometric'"))
    report = training.train("gcn", "cora", seeds=1, epochs=1, device="cpu")
    assert [result.library for result in report.libraries] == ["gnnio"]
    assert "torch_geometric" in report.pyg_missing
    outcome = CliRunner().invoke(cli, ["train", "--model", "gcn", "--seeds", "1", "--epochs", "1"])
    assert outcome.exit_code == 0, outcome.output
    assert "PyG's layers not trained" in outcome.stderr
