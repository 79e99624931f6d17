"""The library side of `gnnio run` and `gnnio compare`: build, measure, report.

Results are plain dicts of JSON-ready values (what `--json` prints); the CLI
only renders them.
"""

from __future__ import annotations

import platform
from dataclasses import asdict
from typing import Optional

import torch

from gnnio_cli import __version__
from gnnio_cli.bench import workloads
from gnnio_cli.bench.measure import Measurement, measure
from gnnio_cli.bench.timing import copy_bandwidth_gbs
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import catalog
from gnnio_cli.graph.locality import CacheModel
from gnnio_cli.ops import dispatch

MIB = float(1 << 20)
TIMING_COLUMNS = ["phase", "median ms", "min ms", "max ms", "peak MiB"]


def default_device(device: Optional[str]) -> str:
    if device is not None:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def environment(device: torch.device) -> dict:
    info = {
        "gnnio": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
    }
    return info


def graph_summary(named: catalog.NamedGraph) -> dict:
    graph = named.graph
    in_degree = graph.in_degree
    return {
        "name": named.name,
        "origin": named.origin,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "max_in_degree": int(in_degree.max()) if in_degree.numel() else 0,
        "index_dtype": str(graph.csr_indices.dtype).replace("torch.", ""),
    }


def measurement_dict(m: Measurement, label: Optional[str] = None) -> dict:
    out = {
        "name": m.name,
        "label": label or m.backend,
        "backend": m.backend,
        "implementations": m.implementations,
        "forward_ms": asdict(m.forward),
        "train_ms": asdict(m.train) if m.train else None,
        "peak_forward_mib": None if m.peak_forward_bytes is None else m.peak_forward_bytes / MIB,
        "peak_train_mib": None if m.peak_train_bytes is None else m.peak_train_bytes / MIB,
        "floor_bytes": m.floor_bytes,
        "floor_ms": m.floor_ms,
        "floor_ratio": m.floor_ratio,
    }
    return out


def run_layer(*, layer, graph_spec, features, heads, dtype, device, backend, aggregation_only, backward, repeat, warmup, seed,
              profile: bool = False) -> dict:
    """Build and measure one layer (or its aggregation alone); returns the `--json` document.

    With `profile`, one more step (forward+backward, or forward alone without
    `backward`) runs under torch.profiler and the document gains "profile":
    its costliest kernels (see kernel_profile.profile_call).
    """
    device_name = default_device(device)
    settings = workloads.Settings(layer=layer, features=features, heads=heads, dtype=dtype, device=device_name, seed=seed)
    torch_device = workloads.check_device(device_name)
    named = catalog.resolve(graph_spec)
    if backend == "native" and torch_device.type != "cuda":
        raise GnnioError("--backend native needs --device cuda (the native kernels are CUDA kernels)")
    if backend == "native":
        from gnnio_cli import native

        native.load()
    build = workloads.op_workload if aggregation_only else workloads.layer_workload
    workload = build(named.graph, settings)
    bandwidth = copy_bandwidth_gbs(torch_device)
    result = measure(workload, torch_device, backend=backend, backward=backward, warmup=warmup, repeat=repeat,
                     bandwidth_gbs=bandwidth)
    document = {
        "command": "run",
        "layer": layer,
        "scope": "aggregation" if aggregation_only else "layer",
        "settings": asdict(settings),
        "graph": graph_summary(named),
        "environment": environment(torch_device),
        "copy_bandwidth_gbs": bandwidth,
        "backend_requested": backend,
        "measurement": measurement_dict(result),
    }
    if profile:
        document["profile"] = _profile_step(workload, torch_device, backend=backend, backward=backward)
    return document


def _profile_step(workload: workloads.Workload, device: torch.device, *, backend: str, backward: bool) -> dict:
    """The costliest kernels of one training step (or one forward pass), on the backend that was measured."""
    from gnnio_cli.bench.kernel_profile import profile_call

    with dispatch.use_backend(backend):
        if backward:
            profiled = profile_call(workload.train_step, device)
        else:
            with torch.no_grad():
                profiled = profile_call(workload.forward, device)
    profiled["step"] = "forward+backward" if backward else "forward"
    return profiled


def summary_pairs(result: dict) -> list[tuple[str, object]]:
    graph, settings, m = result["graph"], result["settings"], result["measurement"]
    implementations = ", ".join(f"{op}: {impl}" for op, impl in m["implementations"].items()) or "-"
    return [
        ("graph", f"{graph['name']} ({graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges, max in-degree {graph['max_in_degree']:,})"),
        ("workload", f"{m['name']}, {settings['features']} features, {settings['heads']} heads, {settings['dtype']}"),
        ("device", f"{result['environment']['device']} ({result['environment']['device_name']})"),
        ("backend", f"{m['backend']} (asked: {result['backend_requested']})"),
        ("kernels", implementations),
        ("copy bandwidth", "-" if result["copy_bandwidth_gbs"] is None else f"{result['copy_bandwidth_gbs']:,.0f} GB/s"),
        ("forward / byte floor", m["floor_ratio"]),
    ]


def timing_rows(m: dict) -> list[list]:
    """One row for the forward pass and one for forward+backward (when timed)."""
    rows = [["forward", m["forward_ms"]["median_ms"], m["forward_ms"]["min_ms"], m["forward_ms"]["max_ms"],
             m["peak_forward_mib"]]]
    if m["train_ms"]:
        train = m["train_ms"]
        rows.append(["forward+backward", train["median_ms"], train["min_ms"], train["max_ms"], m["peak_train_mib"]])
    return rows


COMPARE_TARGETS = ("reference", "cusparse", "pyg", "compiled", "pyg-compiled")


def max_error(output: torch.Tensor, oracle: torch.Tensor) -> float:
    """max |output - oracle| / max(|oracle|, tiny), computed in fp32 (fp64 for an fp64 oracle)."""
    dtype = torch.float64 if oracle.dtype == torch.float64 else torch.float32
    output, oracle = output.detach().to(dtype), oracle.detach().to(dtype)
    scale = oracle.abs().max().clamp_min(1e-12)
    return float(((output - oracle).abs().max() / scale).item())


def _forward_output(workload: workloads.Workload, backend: str) -> torch.Tensor:
    from gnnio_cli.ops import dispatch

    with dispatch.use_backend(backend), torch.no_grad():
        return workload.forward()


def _pyg_twin(module: torch.nn.Module, settings: workloads.Settings, library=None, *, cached: bool = True) -> torch.nn.Module:
    """PyG's layer (or `library`'s) with `module`'s weights (gnnio's layers share PyG's state_dict keys)."""
    if library is None:
        try:
            import torch_geometric.nn as library
        except ImportError:
            raise GnnioError("--against pyg: torch_geometric is not importable; pip install torch-geometric (or drop pyg)") from None
    twin = workloads.make_layer(settings, library, cached=cached)
    twin.load_state_dict(module.state_dict(), strict=True)
    return twin


def _pyg_library():
    import torch_geometric.nn as pyg_nn

    return pyg_nn


def compare_layer(named: catalog.NamedGraph, settings: workloads.Settings, against: list[str], *, scope: str,
                  backward: bool, repeat: int, warmup: int, bandwidth: Optional[float]) -> dict:
    """Measure gnnio and each of `against` on the same inputs; speedups and errors relative to gnnio."""
    device = torch.device(settings.device)
    timing = dict(backward=backward, repeat=repeat, warmup=warmup, bandwidth_gbs=bandwidth)
    if scope == "aggregation":
        subject = workloads.op_workload(named.graph, settings)
    else:
        subject = workloads.layer_workload(named.graph, settings)
    runs = [measurement_dict(measure(subject, device, backend="auto", **timing), label="gnnio")]
    subject_output = _forward_output(subject, "auto")
    for target in against:
        if target == "reference":
            other, backend = subject, "reference"
        elif target == "cusparse":
            other, backend = workloads.spmm_yardstick(named.graph, settings), "reference"
        elif target == "pyg":
            if scope != "layer":
                raise GnnioError("--against pyg compares whole layers: add --scope layer")
            import torch_geometric.nn as pyg_nn

            twin = _pyg_twin(subject.module, settings)
            other, backend = workloads.layer_workload(named.graph, settings, pyg_nn, module=twin), "reference"
        elif target in ("compiled", "pyg-compiled"):
            if scope != "layer":
                raise GnnioError(f"--against {target} compares whole layers: add --scope layer")
            import gnnio_cli.nn as gnnio_nn

            library = gnnio_nn if target == "compiled" else None
            # GCNConv uncached: a cached normalisation is module state that a compiled call runs PyG's code for
            twin = _pyg_twin(subject.module, settings, library, cached=False)
            library = library or _pyg_library()
            other = workloads.layer_workload(named.graph, settings, library, module=twin, compiled=True)
            backend = "auto" if target == "compiled" else "reference"
        else:
            raise GnnioError(f"--against {target}: choose from {', '.join(COMPARE_TARGETS)}")
        run = measurement_dict(measure(other, device, backend=backend, **timing), label=target)
        if target == "cusparse":
            run["backend"] = "cusparse"
        else:
            run["max_error_vs_gnnio"] = max_error(subject_output, _forward_output(other, backend))
        run["gnnio_speedup_forward"] = run["forward_ms"]["median_ms"] / runs[0]["forward_ms"]["median_ms"]
        if backward:
            run["gnnio_speedup_train"] = run["train_ms"]["median_ms"] / runs[0]["train_ms"]["median_ms"]
        if run["peak_train_mib"] and runs[0]["peak_train_mib"]:
            run["gnnio_memory_ratio_train"] = run["peak_train_mib"] / runs[0]["peak_train_mib"]
        runs.append(run)
        del other
    del subject_output
    return {"layer": settings.layer, "settings": asdict(settings), "scope": scope, "runs": runs}


def _schedule_label(schedule) -> str:
    """How `compare --schedules` names a candidate: chosen, tile N (fused pass) or edge-balanced."""
    if schedule is None:
        return "chosen"
    return f"tile {schedule}" if isinstance(schedule, int) else str(schedule)


def compare_schedules(named: catalog.NamedGraph, settings: workloads.Settings, *, backward: bool, repeat: int,
                      warmup: int, bandwidth: Optional[float]) -> list[dict]:
    """The attention op under each candidate schedule: the chosen one, tile lengths of the fused pass's split
    target rows, and the edge-balanced forward (see attention_native.schedule_candidates)."""
    from gnnio_cli import native
    from gnnio_cli.ops import attention_native

    if settings.layer not in workloads.ATTENTION_LAYERS:
        raise GnnioError(f"--schedules: only attention layers have schedules to choose from, not '{settings.layer}'")
    if torch.device(settings.device).type != "cuda":
        raise GnnioError("--schedules times the fused attention kernels: it needs --device cuda")
    native.load()
    graph = named.graph.to(settings.device)
    subject = workloads.op_workload(graph, settings)
    device = torch.device(settings.device)
    runs = []
    for schedule in attention_native.schedule_candidates(graph):
        with attention_native.forced_schedule(schedule):
            run = measurement_dict(measure(subject, device, backend="native", backward=backward, repeat=repeat,
                                           warmup=warmup, bandwidth_gbs=bandwidth),
                                   label=_schedule_label(schedule))
        runs.append(run)
    for run in runs[1:]:
        run["gnnio_speedup_forward"] = run["forward_ms"]["median_ms"] / runs[0]["forward_ms"]["median_ms"]
        if backward:
            run["gnnio_speedup_train"] = run["train_ms"]["median_ms"] / runs[0]["train_ms"]["median_ms"]
    return runs


def compare(*, layers, graph_spec, against, scope, features, heads, dtype, device, backward, repeat, warmup, seed,
            reorders=(), schedules=False) -> dict:
    """`gnnio compare`: every layer in `layers` through gnnio and each target, one process, one graph.

    With `reorders` (method names of `gnnio reorder`), the whole comparison is
    repeated on the graph relabelled by each method; each entry records the
    time the order took to compute and, against the first order listed, the
    training steps it takes to pay that time back.
    """
    device_name = default_device(device)
    torch_device = workloads.check_device(device_name)
    named = catalog.resolve(graph_spec)
    bandwidth = copy_bandwidth_gbs(torch_device)

    def compare_all(graph: catalog.NamedGraph) -> list[dict]:
        results = []
        for layer in layers:
            settings = workloads.Settings(layer=layer, features=features, heads=heads, dtype=dtype, device=device_name,
                                          seed=seed)
            results.append(compare_layer(graph, settings, against, scope=scope, backward=backward, repeat=repeat,
                                         warmup=warmup, bandwidth=bandwidth))
            if torch_device.type == "cuda":
                torch.cuda.empty_cache()
        return results

    document = {
        "command": "compare",
        "graph": graph_summary(named),
        "environment": environment(torch_device),
        "copy_bandwidth_gbs": bandwidth,
        "against": against,
        "scope": scope,
    }
    if schedules:
        document["schedules"] = [
            {"layer": layer, "runs": compare_schedules(
                named, workloads.Settings(layer=layer, features=features, heads=heads, dtype=dtype, device=device_name,
                                          seed=seed),
                backward=backward, repeat=repeat, warmup=warmup, bandwidth=bandwidth)}
            for layer in layers
        ]
        return document
    if not reorders:
        document["results"] = compare_all(named)
        return document
    cache = CacheModel(features=features, dtype=dtype)
    document["reorders"] = [_compare_reordered(named, method, seed, cache, compare_all) for method in reorders]
    _add_payback(document["reorders"])
    return document


def _compare_reordered(named: catalog.NamedGraph, method: str, seed: int, cache: CacheModel, compare_all) -> dict:
    from gnnio_cli.graph.locality import locality
    from gnnio_cli.graph.reorder import reorder, warm_up

    warm_up(method)
    permutation = reorder(named.graph, method, seed)
    graph = named.graph.to("cpu").permute(permutation.new_to_old)
    metrics = locality(graph, cache=cache)
    relabelled = catalog.NamedGraph(f"{named.name} ({method})", graph, named.origin)
    return {"method": method, "reorder_seconds": permutation.seconds, "locality": asdict(metrics),
            "results": compare_all(relabelled)}


def _add_payback(entries: list[dict]) -> None:
    """Training steps after which each order's compute time is repaid, relative to the first order listed."""
    baseline = entries[0]
    for entry in entries:
        for result, base in zip(entry["results"], baseline["results"]):
            for run, base_run in zip(result["runs"], base["runs"]):
                phase = "train_ms" if run["train_ms"] else "forward_ms"
                saved_ms = base_run[phase]["median_ms"] - run[phase]["median_ms"]
                run["saved_ms_per_step"] = saved_ms
                run["payback_steps"] = entry["reorder_seconds"] * 1e3 / saved_ms if saved_ms > 0 else None


def reorder_row(method: str, reorder_seconds: float, locality: dict, run: dict) -> list:
    train = run["train_ms"] or {}
    return [method, run["label"], reorder_seconds, locality["cache_hit_rate"], run["forward_ms"]["median_ms"],
            train.get("median_ms"), run.get("saved_ms_per_step"), run.get("payback_steps")]


REORDER_COLUMNS = ["order", "run", "reorder s", "sim. L2 hit rate", "fwd ms", "fwd+bwd ms", "saved ms/step",
                   "payback steps"]


def compare_row(run: dict) -> list:
    train = run["train_ms"] or {}
    return [
        run["label"],
        ", ".join(sorted(set(run["implementations"].values()))) or run["backend"],
        run["forward_ms"]["median_ms"],
        train.get("median_ms"),
        run["peak_train_mib"] if run["peak_train_mib"] is not None else run["peak_forward_mib"],
        run["floor_ratio"],
        run.get("gnnio_speedup_forward"),
        run.get("gnnio_speedup_train"),
        run.get("max_error_vs_gnnio"),
    ]


COMPARE_COLUMNS = ["run", "kernels", "fwd ms", "fwd+bwd ms", "peak MiB", "fwd / floor", "gnnio speedup fwd",
                   "gnnio speedup fwd+bwd", "max rel. error"]
