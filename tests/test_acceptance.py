"""The acceptance benchmarks' code runs end to end (on CPU, tiny graphs): no suite may break on the GPU machine."""

import json

import pytest
import torch

from perf import acceptance


@pytest.fixture(autouse=True)
def restore_configuration():
    yield
    acceptance.configure("cuda", "rmat20")


def test_every_suite_runs_and_writes_verdicts(tmp_path):
    pytest.importorskip("torch_geometric")
    status = acceptance.main(["--out", str(tmp_path), "--device", "cpu", "--graphs", "grid6", "--headline", "grid6",
                              "--super-node-degree", "200"])
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    broken = [v["criterion"] for v in verdicts if v["criterion"].startswith("suite ran")]
    assert broken == []
    assert {v["suite"] for v in verdicts} == {"spmm", "attention", "dropin", "study", "bf16"}
    # CPU timings decide the speed verdicts; the exit status must be theirs, whichever way they went.
    assert status == (0 if all(v["passed"] for v in verdicts) else 1), [v for v in verdicts if not v["passed"]]
    criteria = {v["criterion"] for v in verdicts}
    assert "gcn fwd / SpMM" in criteria and "sage-max layer train speedup over PyG" in criteria
    assert "patched vs PyG output max rel. error" in criteria
    assert "gatv2 fwd+bwd with super node / without" in criteria
    assert "agnn bf16 speedup over fp32 (fwd+bwd)" in criteria
    assert "2-layer GAT step, autocast bf16 over fp32" in criteria
    dropin = [v for v in verdicts if v["criterion"] == "patched vs PyG output max rel. error"][0]
    assert dropin["passed"], dropin
    for name in ("spmm_grid6_fp32.json", "attention_grid6_bf16.json", "dropin_grid6.json", "study_grid6.json",
                 "bf16_grid6_gat_step.json"):
        assert (tmp_path / name).exists(), name


def test_spmm_yardstick_ignores_one_slow_sample():
    def row(spmm_ms):
        return {"runs": [{"label": "gnnio", "forward_ms": {"median_ms": 3.0}},
                         {"label": "cusparse", "forward_ms": {"median_ms": spmm_ms}}]}

    result = {"results": [row(1.9), row(2.46), row(1.95), row(1.89)]}
    assert acceptance.spmm_yardstick_ms(result) == pytest.approx(1.925)


def test_super_node_correctness_checks_every_kind():
    """The super node's row against fp64 and every tensor against the reference, for each attention kind. On the
    CPU the library's path is the reference itself, so here the fp32 reference is held to the fp64 oracle."""
    acceptance.configure("cpu", "grid6", super_node_degree=200)
    document, verdicts = acceptance._super_node_correctness("grid6")
    assert document["in_degree"] == 200
    assert set(document["kinds"]) == set(acceptance.ATTENTION_LAYERS)
    assert len(verdicts) == 2 * len(acceptance.ATTENTION_LAYERS)
    assert all(v.passed for v in verdicts), verdicts
    for kind, errors in document["kinds"].items():
        assert 0 < errors["fp32_reference_hub_row_error_vs_fp64"] < 1e-5, kind


def test_super_node_correctness_catches_a_wrong_super_node_row(monkeypatch):
    """A library path whose super node row is off (a lost tile, say) fails both checks of every kind."""
    op_workload = acceptance.workloads.op_workload

    def off_at_the_hub(graph, settings):
        workload = op_workload(graph, settings)
        forward, hub = workload.forward, int(graph.in_degree.argmax())

        def shifted():
            out = forward()
            if acceptance.dispatch.current_backend() != "auto":
                return out
            return out.index_add(0, torch.tensor([hub]), torch.full_like(out[hub:hub + 1], 1e-2))

        workload.forward = shifted
        return workload

    monkeypatch.setattr(acceptance.workloads, "op_workload", off_at_the_hub)
    acceptance.configure("cpu", "grid6", super_node_degree=200)
    _, verdicts = acceptance._super_node_correctness("grid6")
    assert len(verdicts) == 2 * len(acceptance.ATTENTION_LAYERS)
    assert not any(v.passed for v in verdicts), [v for v in verdicts if v.passed]
