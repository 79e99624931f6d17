"""The native loader's failure messages and the fallback to the reference (CPU, no build needed).

Each failure must be one line that says what is missing and what to do;
is_available() must never raise and must remember the reason; ops on CPU
tensors must run the reference and say so.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gnnio_cli import native
from gnnio_cli.cli import cli
from gnnio_cli.errors import NativeUnavailable
from gnnio_cli.ops import aggregate, dispatch, spmm
from testing import random_graph, randn


@pytest.fixture(autouse=True)
def fresh_loader(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNIO_CACHE_DIR", str(tmp_path / "cache"))
    native._reset_for_tests()
    yield
    native._reset_for_tests()


def pretend_cuda_build(monkeypatch, tmp_path, arch="9.0"):
    """Make _configure pass on this CPU machine, with the build folder in tmp_path."""
    folder = tmp_path / "build"
    monkeypatch.setattr(native, "_configure", lambda: (folder, arch, [], []))
    return folder


def assert_one_line(message: str, *fragments: str) -> None:
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_sources_include_every_family():
    names = [path.name for path in native.source_files()]
    assert names[0] == "gnnio.cpp" and "spmm.cu" in names and "reduce.cu" in names


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("GNNIO_NATIVE", "0")
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "GNNIO_NATIVE=0", "unset it")
    assert native.is_available() is False and native.reason() == str(caught.value)


def test_cpu_only_torch_is_reported(monkeypatch):
    monkeypatch.delenv("GNNIO_NATIVE", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "CPU-only build", "install a CUDA build of torch")


def test_missing_nvcc_is_reported(monkeypatch):
    monkeypatch.delenv("GNNIO_NATIVE", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(native, "_nvcc_path", lambda: None)
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "nvcc not found", "CUDA_HOME")


def test_missing_arch_list_is_reported(monkeypatch):
    monkeypatch.delenv("GNNIO_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    # No GPU to read the capability from: on a GPU machine the arch would come from the device and load() would build.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(native, "_nvcc_path", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(native, "ninja_version", lambda: "1.13.0")
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "TORCH_CUDA_ARCH_LIST", "9.0")


def test_arch_list_follows_the_environment(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert native.arch_list() == "8.0;9.0"


@pytest.mark.parametrize("capability,expected", [((9, 0), "9.0a"), ((8, 0), "8.0"), ((10, 0), "10.0")])
def test_arch_list_defaults_to_the_visible_gpu(monkeypatch, capability, expected):
    """Hopper (9.0) builds for sm_90a, whose wgmma the projections use; other GPUs for their own capability."""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(native.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(native.torch.cuda, "get_device_capability", lambda *args: capability)
    assert native.arch_list() == expected


def test_build_key_changes_with_the_arch_list():
    assert native._build_key("9.0", [], []) != native._build_key("8.0", [], [])
    assert native._build_key("9.0", [], []) == native._build_key("9.0", [], [])


def test_stale_torch_lock_is_reported_with_its_path(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    folder = pretend_cuda_build(monkeypatch, tmp_path)
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    monkeypatch.setattr(cpp_extension, "FileBaton", object, raising=False)
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "stale build lock", str(folder / "lock"), f"rm {folder / 'lock'}")


def test_compiler_error_becomes_one_line_with_the_log(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    folder = pretend_cuda_build(monkeypatch, tmp_path)
    monkeypatch.delattr(cpp_extension, "FileBaton", raising=False)

    def failing_build(**kwargs):
        assert kwargs["build_directory"] == str(folder)
        raise RuntimeError("Error building extension 'gnnio_native': [1/3] nvcc ...\nspmm.cu(12): error: bad type\n")

    monkeypatch.setattr(cpp_extension, "load", failing_build)
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "native build failed", "spmm.cu(12): error: bad type", "build.log")
    assert "bad type" in (folder / "build.log").read_text()
    assert native.is_available() is False


def test_library_that_does_not_load_is_reported(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    folder = pretend_cuda_build(monkeypatch, tmp_path)
    monkeypatch.delattr(cpp_extension, "FileBaton", raising=False)

    def unloadable(**kwargs):
        raise OSError("gnnio_native.so: undefined symbol: cusparseSpMM")

    monkeypatch.setattr(cpp_extension, "load", unloadable)
    with pytest.raises(NativeUnavailable) as caught:
        native.load()
    assert_one_line(str(caught.value), "does not load", "undefined symbol", str(folder))


def test_registrations_wait_for_the_load_and_run_once(monkeypatch, tmp_path):
    """on_load (the families' fake kernels): queued before the extension loads, run right after it, at once when
    it is loaded, and never again when load() runs a second time in the process."""
    from torch.utils import cpp_extension

    pretend_cuda_build(monkeypatch, tmp_path)
    monkeypatch.delattr(cpp_extension, "FileBaton", raising=False)
    monkeypatch.setattr(native, "_pending", [])  # the real families' registrations need the real ops
    ran = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: ran.append("extension"))

    def first():
        ran.append("first")

    assert native.on_load(first) is first
    assert ran == []
    native.load()
    assert ran == ["extension", "first"]
    native.on_load(lambda: ran.append("second"))
    assert ran == ["extension", "first", "second"]
    native._reset_for_tests()
    native.load()
    assert ran == ["extension", "first", "second", "extension"]


def test_is_available_never_raises(monkeypatch):
    def broken():
        raise ValueError("unexpected")

    monkeypatch.setattr(native, "_configure", broken)
    assert native.is_available() is False
    assert "ValueError" in native.reason()


def test_cpu_tensors_run_the_reference_and_say_so():
    graph = random_graph(30, 120, seed=1)
    x = randn(30, 8, generator=torch.Generator().manual_seed(2))
    dispatch.reset()
    spmm(graph, x)
    aggregate(graph, x, "max")
    assert dispatch.ran() == {"spmm": "reference", "aggregate": "reference"}


def test_doctor_json_reports_backends(monkeypatch):
    monkeypatch.setenv("GNNIO_NATIVE", "0")
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["torch"] == torch.__version__ and report["loaded"] is False
    assert report["backends"]["reference"].startswith("available")
    assert "GNNIO_NATIVE=0" in report["backends"]["native"]


def test_doctor_build_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("GNNIO_NATIVE", "0")
    from gnnio_cli.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--build"])
    assert exited.value.code == 1


def test_doctor_table_lists_versions(monkeypatch):
    monkeypatch.setenv("GNNIO_NATIVE", "0")
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0, result.output
    for label in ("Python", "torch", "nvcc", "ninja", "arch list", "build cache", "Backends"):
        assert label in result.output
