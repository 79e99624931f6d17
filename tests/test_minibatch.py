"""Mini-batch training: gnnio's models on loader batches equal PyG's, and the CLI's mini-batch mode."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from gnnio_cli import nn as gnnio_nn
from gnnio_cli.bench.minibatch import MODELS, build_model
from gnnio_cli.cli import cli
from gnnio_cli.loader import NeighborLoader
from testing import DEVICES, random_graph, randn

pyg_nn = pytest.importorskip("torch_geometric.nn")


def _batches(device: str, count: int = 3):
    graph = random_graph(400, 4000, hub_degree=300, seed=21)
    features = randn(graph.num_nodes, 24, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 5, (graph.num_nodes,), generator=torch.Generator().manual_seed(3))
    loader = NeighborLoader(graph, [6, 4], batch_size=50, shuffle=True, seed=4, device=device, x=features, y=labels)
    return [batch for _, batch in zip(range(count), loader)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", MODELS)
def test_models_on_sampled_batches_equal_pyg(model, device):
    """A 2-layer model of each kind on gnnio's batch Graph and PyG's on the batch's edge_index, same weights:
    equal loss, outputs and every parameter's gradient (fp32, 1e-5)."""
    torch.manual_seed(0)
    mine = build_model(gnnio_nn, model, 2, 24, 16, 5, 4).to(device)
    theirs = build_model(pyg_nn, model, 2, 24, 16, 5, 4).to(device)
    theirs.load_state_dict(mine.state_dict(), strict=True)
    for batch in _batches(device):
        outputs = []
        for net, edges in ((mine, batch.graph), (theirs, batch.edge_index)):
            net.zero_grad(set_to_none=True)
            out = net(batch.x, edges)
            F.cross_entropy(out[: batch.batch_size], batch.y[: batch.batch_size]).backward()
            outputs.append(out)
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
        grads = dict(theirs.named_parameters())
        for name, parameter in mine.named_parameters():
            torch.testing.assert_close(parameter.grad, grads[name].grad, atol=1e-5, rtol=1e-5, msg=name)


def test_minibatch_mode_on_the_command_line():
    runner = CliRunner()
    result = runner.invoke(cli, ["run", "--layer", "sage-mean", "--graph", "rmat10", "--batch-size", "16", "--fanout",
                                 "4,3", "--steps", "2", "--rounds", "1", "--against", "pyg", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["mode"] == "mini-batch" and document["layers"] == 2
    assert set(document["runs"]) == {"sampling", "gnnio, edge_index", "gnnio, loader graph",
                                     "gnnio, structures cached", "pyg"}
    assert document["summary"]["gnnio_over_pyg_loader_graph"] > 0
    assert document["batches"]["count"] == 3 + 2 and document["batches"]["mean_edges"] > 0
    result = runner.invoke(cli, ["compare", "--layer", "gat,gcn", "--graph", "rmat10", "--batch-size", "16",
                                 "--fanout", "4", "--steps", "1", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    assert "Time per training step" in result.output


def test_minibatch_errors_are_one_line(capsys):
    from gnnio_cli.cli import main

    for arguments, message in [
        (["--batch-size", "16"], "needs both --batch-size and --fanout"),
        (["--batch-size", "16", "--fanout", "0"], "each fan-out must be positive or -1"),
        (["--batch-size", "0", "--fanout", "5"], "--batch-size must be positive"),
        (["--batch-size", "4", "--fanout", "2,2,2,2"], "give 1 to 3 per-hop fan-outs"),
    ]:
        with pytest.raises(SystemExit):
            main(["run", "--layer", "gat", "--graph", "rmat8", *arguments])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
