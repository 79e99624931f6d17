"""Row partitions: their parts cover the graph exactly, their exchange plans match, and the `.h5` store
reuses them while the graph is unchanged; `gnnio partition` and `gnnio run --gpus` on gloo."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from gnnio_cli.distributed import ensure_partition, partition_graph
from gnnio_cli.distributed.launch import TORCHRUN_VARIABLES, free_port, run_ranks
from gnnio_cli.distributed.partition import balanced_row_starts, read_part
from gnnio_cli.graph.store import StoredGraph, reusable_conversion, save
from testing import random_graph, run_gnnio


def _global_edges(partition, rank: int) -> np.ndarray:
    """(source, target) original ids of every local edge of `rank`, [E_r, 2]."""
    part = partition.parts[rank]
    order = partition.new_to_old if partition.new_to_old is not None else np.arange(partition.num_nodes)
    local_to_ordered = np.concatenate([np.arange(part.row_start, part.row_end), part.halo])
    targets = part.row_start + np.repeat(np.arange(part.num_own), np.diff(part.indptr))
    return np.stack([order[local_to_ordered[part.indices]], order[targets]], axis=1)


@pytest.mark.parametrize("parts, order", [(1, "none"), (3, "none"), (4, "rcm"), (7, "degree")])
def test_parts_hold_every_edge_once_and_plans_match(parts, order):
    graph = random_graph(300, 2500, hub_degree=400, seed=parts)
    partition = partition_graph(graph, parts, order=order)
    edges = graph.edge_index().numpy().T
    seen = np.concatenate([part.edge_ids for part in partition.parts])
    assert np.array_equal(np.sort(seen), np.arange(graph.num_edges))
    for rank in range(parts):
        assert np.array_equal(_global_edges(partition, rank), edges[partition.parts[rank].edge_ids])
    owned = np.concatenate([partition.own_nodes(rank) for rank in range(parts)])
    assert np.array_equal(np.sort(owned), np.arange(graph.num_nodes))
    for receiver, part in enumerate(partition.parts):
        starts = np.cumsum(np.concatenate([[0], part.recv_counts]))
        for owner, sender in enumerate(partition.parts):
            sent_starts = np.cumsum(np.concatenate([[0], sender.send_counts]))
            rows = sender.send_index[sent_starts[receiver]:sent_starts[receiver + 1]]
            assert sender.send_counts[receiver] == part.recv_counts[owner]
            assert np.array_equal(sender.row_start + rows, part.halo[starts[owner]:starts[owner + 1]])
        assert part.recv_counts[receiver] == 0 and not np.isin(part.halo, np.arange(part.row_start, part.row_end)).any()


def test_blocks_balance_edges_plus_rows():
    indptr = np.concatenate([[0], np.cumsum(np.r_[np.full(99, 2), 200])])  # 99 light rows, then a hub
    starts = balanced_row_starts(indptr, 4)
    assert starts[0] == 0 and starts[-1] == 100 and (np.diff(starts) >= 0).all()
    assert starts[3] == 99  # the hub's row alone outweighs a quarter: its block holds nothing else
    with pytest.raises(ValueError, match="row_starts must be 3 non-decreasing ids"):
        partition_graph(random_graph(10, 30, seed=0), 2, row_starts=np.array([0, 7, 5]))


def _stored(tmp_path, seed=0):
    path = tmp_path / "g.h5"
    save(StoredGraph(random_graph(200, 1500, hub_degree=100, seed=seed)), path)
    return path


def test_store_reuses_a_fresh_partition_and_rebuilds_a_stale_one(tmp_path):
    path = _stored(tmp_path)
    first, action = ensure_partition(path, 3, order="rcm")
    assert action == "built"
    again, action = ensure_partition(path, 3, order="rcm")
    assert action == "reused"
    for built, read in zip(first.parts, again.parts):
        assert np.array_equal(built.send_index, read.send_index) and np.array_equal(built.indices, read.indices)
    part, row_starts, order = read_part(path, 3, 1)
    assert np.array_equal(row_starts, first.row_starts) and np.array_equal(order, first.own_nodes(1))
    assert ensure_partition(path, 3, order="none")[1] == "rebuilt"  # another order replaces it
    assert ensure_partition(path, 2)[1] == "built"  # a partition per part count
    with h5py.File(path, "r+") as h5:  # the graph changes under the stored partitions: a different edge
        indices = h5["csr/indices"][()]
        indices[0] = (indices[0] + 1) % 200
        h5["csr/indices"][...] = indices
    assert ensure_partition(path, 2)[1] == "rebuilt"
    assert ensure_partition(path, 2)[1] == "reused"


def test_a_partitioned_conversion_is_still_reused_by_convert(tmp_path, capsys, monkeypatch):
    edges = tmp_path / "e.txt"
    edges.write_text("".join(f"{i} {(i * 7 + 3) % 50}\n" for i in range(50)))
    assert run_gnnio(["convert", edges, "-o", tmp_path / "e.h5"], capsys, monkeypatch)[0] == 0
    assert run_gnnio(["partition", tmp_path / "e.h5", "--parts", "2"], capsys, monkeypatch)[0] == 0
    with h5py.File(tmp_path / "e.h5", "r") as h5:
        params = json.loads(h5.attrs["params"])
    assert reusable_conversion(tmp_path / "e.h5", hashlib.sha256(edges.read_bytes()).hexdigest(), params) is not None


def test_real_entry_point_partitions(tmp_path):
    path = _stored(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gnnio_cli", "partition", str(path), "--parts", "2", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["action"] == "built"


def test_partition_cli_json(tmp_path, capsys, monkeypatch):
    path = _stored(tmp_path)
    status, out, _ = run_gnnio(["partition", path, "--parts", "3", "--features", "16", "--json"], capsys, monkeypatch)
    document = json.loads(out)
    assert status == 0 and document["action"] == "built" and len(document["ranks"]) == 3
    assert sum(rank["edges"] for rank in document["ranks"]) == document["num_edges"]
    assert all(rank["bytes_received"] == rank["halo"] * 16 * 4 for rank in document["ranks"])
    status, out, _ = run_gnnio(["partition", path, "--parts", "3", "--json"], capsys, monkeypatch)
    assert json.loads(out)["action"] == "reused"


def test_run_on_gloo_ranks_reports_ranks_and_scaling(tmp_path, capsys, monkeypatch):
    path = _stored(tmp_path)
    status, out, err = run_gnnio(["run", "--layer", "gatv2", "--graph", path, "--gpus", "2", "--device", "cpu",
                                  "--features", "8", "--heads", "2", "--repeat", "2", "--warmup", "1", "--json"],
                                 capsys, monkeypatch)
    assert status == 0, err
    document = json.loads(out)
    ranks = document["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    assert sum(rank["nodes"] for rank in ranks) == 200 and all(rank["halo_nodes"] > 0 for rank in ranks)
    # two layers, each fetching its source projection (8 wide, as x): one exchange forward, one backward returning
    # the projected rows' gradients (they feed the weights' gradients even where the features take none)
    assert all(rank["exchanges_per_step"] == 4 and rank["halo_bytes_per_step"] > 0 for rank in ranks)
    assert all(0 <= rank["halo_exposed_ms"] <= rank["halo_exchange_ms"] + 1 for rank in ranks)
    assert all(0 <= rank["interior_nodes"] <= rank["nodes"] for rank in ranks)
    assert [row["ranks"] for row in document["scaling"]] == [1, 2] and document["baseline"]["step_ms"]["median_ms"] > 0
    assert document["environment"]["backend"] == "gloo"


def _rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    return rank, world_size


def test_run_ranks_joins_a_torchrun_group(monkeypatch):
    for name, value in zip(TORCHRUN_VARIABLES, ("0", "1", "127.0.0.1", str(free_port()))):
        monkeypatch.setenv(name, value)
    assert run_ranks(_rank_and_size, 5, device="cpu", timeout=30) == [(0, 1)]
    assert not torch.distributed.is_initialized()


def test_run_under_torchrun_joins_its_group(tmp_path, capsys, monkeypatch):
    path = _stored(tmp_path)
    for name, value in zip(TORCHRUN_VARIABLES, ("0", "1", "127.0.0.1", str(free_port()))):
        monkeypatch.setenv(name, value)
    status, out, err = run_gnnio(["run", "--layer", "gcn", "--graph", path, "--device", "cpu", "--features", "8",
                                  "--repeat", "1", "--warmup", "0", "--no-baseline", "--json"], capsys, monkeypatch)
    assert status == 0, err
    document = json.loads(out)
    assert document["environment"]["torchrun"] and len(document["ranks"]) == 1 and document["baseline"] is None
    assert document["ranks"][0]["halo_nodes"] == 0 and document["ranks"][0]["nodes"] == 200
    status, _, err = run_gnnio(["run", "--layer", "gcn", "--graph", path, "--device", "cpu", "--gpus", "2"],
                               capsys, monkeypatch)
    assert status == 2 and "--gpus 2: torchrun started 1 ranks" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_memory_cap_makes_the_baseline_run_out_of_memory(tmp_path):
    """--gpu-memory: a process capped below what the model needs runs out of memory as a smaller GPU would (the
    baseline reports it); uncapped, the same baseline runs."""
    import subprocess
    import sys

    from gnnio_cli.bench.distributed import RunSettings, baseline_step
    from gnnio_cli.graph.store import load

    path = _stored(tmp_path)
    settings = RunSettings(graph=str(path), layer="gatv2", features=256, heads=4, dtype="fp32", device="cuda",
                           order="none", warmup=1, repeat=2, seed=0)
    assert "step_ms" in baseline_step(settings, load(path).graph)
    # in a process of its own: the cap stays with the process that sets it
    capped = ("from gnnio_cli.bench.distributed import RunSettings, baseline_step; from gnnio_cli.graph.store import load; "
              f"s = RunSettings(graph={str(path)!r}, layer='gatv2', features=256, heads=4, dtype='fp32', device='cuda', "
              "order='none', warmup=1, repeat=2, seed=0, gpu_memory_gib=0.0005); "
              "print(baseline_step(s, load(s.graph).graph))")
    done = subprocess.run([sys.executable, "-c", capped], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "out of memory" in done.stdout
