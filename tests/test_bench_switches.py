"""The switch bench's argument handling (its timing needs a GPU and is a benchmark, not a test)."""

import os

import pytest

from perf import switches
from gnnio_cli.errors import GnnioError


def test_variant_settings_are_parsed():
    assert switches.parse_variant("GNNIO_FP32_MATMUL=cublas  GNNIO_SPMM_KERNEL=csr-vec") == {
        "GNNIO_FP32_MATMUL": "cublas", "GNNIO_SPMM_KERNEL": "csr-vec"}
    assert switches.parse_variant("") == {}


@pytest.mark.parametrize("text", ["AHEAD", "=1", "A=1 B"])
def test_a_malformed_variant_is_a_one_line_error(text):
    with pytest.raises(GnnioError, match="--variant"):
        switches.parse_variant(text)


def test_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("GNNIO_TEST_SWITCH_KEPT", "kept")
    monkeypatch.delenv("GNNIO_TEST_SWITCH_NEW", raising=False)
    with switches.environment({"GNNIO_TEST_SWITCH_KEPT": "changed", "GNNIO_TEST_SWITCH_NEW": "1"}):
        assert os.environ["GNNIO_TEST_SWITCH_KEPT"] == "changed"
        assert os.environ["GNNIO_TEST_SWITCH_NEW"] == "1"
    assert os.environ["GNNIO_TEST_SWITCH_KEPT"] == "kept"
    assert "GNNIO_TEST_SWITCH_NEW" not in os.environ


def test_without_a_gpu_the_bench_exits_with_an_error(capsys):
    if switches.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert switches.main(["--variant", "A=1", "--graph", "cora"]) == 2
    assert capsys.readouterr().err == "error: the switches bench times the CUDA kernels, and no GPU is visible to torch\n"


def test_no_rounds_is_a_one_line_error(capsys):
    assert switches.main(["--variant", "A=1", "--rounds", "0"]) == 2
    assert capsys.readouterr().err == "error: --rounds and --repeat must be at least 1, got 0 and 5\n"
