"""`gnnio run --gpus N`: a 2-layer model's training step on a graph split across N ranks, against one rank.

Each rank loads its part of the partition stored in the graph file (built or
refreshed first by the spawning process, or under torchrun by rank 0 while
the others wait at a barrier: partition a large graph with `gnnio partition`
beforehand), draws its own rows of seeded random features, and times full
training steps: forward through both layers (each fetching its halo rows),
backward (returning the halo gradients of the second layer's input to their
owners; input features take no gradient), one all-reduce of the parameter
gradients, an SGD update. It reports its step time, the time and bytes of
its halo exchanges and how much of that time the computation waited for
(exposed; the rest ran behind the interior rows' work), the gradient
all-reduce's time, and its peak memory. The one-rank baseline runs the same model on
the whole graph on one device, without partitions; a baseline that runs out
of memory is reported as such.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.distributed as dist

from gnnio_cli.bench import workloads
from gnnio_cli.bench.timing import time_call
from gnnio_cli.distributed.exchange import ExchangeLog
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph

DEPTH = 2
RANK_COLUMNS = ["rank", "nodes", "interior nodes", "edges", "halo nodes", "step ms", "halo exchange ms",
                "exposed ms", "all-reduce ms", "halo MB / step", "peak MiB"]
SCALING_COLUMNS = ["ranks", "step ms", "speedup", "efficiency"]


@dataclass(frozen=True)
class RunSettings:
    """What every rank runs: the model (layer kind, width, heads, dtype), the graph file and its partition
    order, the device kind, and the timing (warmup, repeat, seed)."""

    graph: str
    layer: str
    features: int
    heads: int
    dtype: str
    device: str
    order: str
    warmup: int
    repeat: int
    seed: int
    gpu_memory_gib: Optional[float] = None  # each GPU's memory capped at this, as a smaller GPU holds

    def layer_settings(self, device) -> workloads.Settings:
        return workloads.Settings(self.layer, self.features, self.heads, self.dtype, str(device), self.seed)


class Stack(torch.nn.Module):
    """DEPTH layers of one kind with ReLU between them: forward(x, edges) as a single-GPU model is written."""

    def __init__(self, layers: list):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x, edges):
        for index, layer in enumerate(self.layers):
            x = layer(x, edges)
            if index + 1 < len(self.layers):
                x = x.relu()
        return x


def _model(settings: RunSettings, device) -> Stack:
    import gnnio_cli.nn as gnnio_nn

    layer_settings = settings.layer_settings(device)
    torch.manual_seed(settings.seed)
    model = Stack([workloads.make_layer(layer_settings, gnnio_nn) for _ in range(DEPTH)])
    return model.to(device=device, dtype=layer_settings.torch_dtype)


def _device(settings: RunSettings) -> torch.device:
    """This process's device, its memory capped at settings.gpu_memory_gib (see cap_gpu_memory)."""
    if torch.device(settings.device).type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        cap_gpu_memory(device, settings.gpu_memory_gib)
        return device
    return torch.device("cpu")


def cap_gpu_memory(device: torch.device, gib: Optional[float]) -> None:
    """Let this process use at most `gib` GiB of `device` (PyTorch's per-process memory fraction), so that a
    model runs out of memory where a GPU of that size would; nothing where gib is None."""
    if gib is None:
        return
    total = torch.cuda.get_device_properties(device).total_memory
    if gib * 2**30 > total:
        raise GnnioError(f"--gpu-memory {gib:g}: the GPU holds {total / 2**30:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(gib * 2**30 / total, device)


def _features(rows: int, settings: RunSettings, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [rows, F], the output gradient [rows, F]) from `seed`. x takes no gradient, as input features in
    training: the first layer's halo exchange has no backward."""
    generator = torch.Generator().manual_seed(seed)
    dtype = workloads.DTYPES[settings.dtype]
    x = torch.randn(rows, settings.features, generator=generator).to(device=device, dtype=dtype)
    grad = torch.randn(rows, settings.features, generator=generator).to(device=device, dtype=dtype)
    return x, grad


def _training_step(model: Stack, x, edges, grad_out, reduce_log: Optional[ExchangeLog]):
    """One step: forward, backward, the gradient all-reduce (when reduce_log is given: several ranks), SGD."""
    parameters = [p for p in model.parameters() if p.requires_grad]

    def step():
        for parameter in parameters:
            parameter.grad = None
        model(x, edges).backward(grad_out)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        if reduce_log is not None:
            flat = torch.cat([g.reshape(-1) for g in grads])
            size = flat.numel() * flat.element_size()
            with reduce_log.timed(flat.is_cuda, size, size):
                dist.all_reduce(flat)
            grads = torch.split(flat, [g.numel() for g in grads])
        with torch.no_grad():
            for parameter, grad in zip(parameters, grads):
                parameter.add_(grad.view_as(parameter), alpha=-1e-3)

    return step


def _peak_mib(device) -> Optional[float]:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def rank_step(rank: int, world_size: int, settings: RunSettings) -> dict:
    """Worker of one rank (see the module docstring): its numbers as a plain dict."""
    from gnnio_cli.distributed import DistributedGraph, ensure_partition
    from gnnio_cli.distributed.launch import under_torchrun

    if under_torchrun():  # (spawned ranks find the partition their parent made)
        if rank == 0:
            ensure_partition(settings.graph, world_size, order=settings.order, seed=settings.seed)
        dist.barrier()
    device = _device(settings)
    dgraph = DistributedGraph.load(settings.graph, device=device)
    model = _model(settings, device)
    x, grad_out = _features(dgraph.num_own, settings, device, settings.seed + 1 + rank)
    reduce_log = ExchangeLog()
    step = _training_step(model, x, dgraph, grad_out, reduce_log)
    for _ in range(settings.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    dgraph.log.reset()
    reduce_log.reset()
    timing = time_call(step, device, warmup=0, repeat=settings.repeat)
    dgraph.log.settle()
    reduce_log.settle()
    halo = dgraph.log
    return {
        "rank": rank, "nodes": dgraph.num_own, "interior_nodes": dgraph.num_interior, "edges": dgraph.graph.num_edges,
        "halo_nodes": dgraph.num_halo, "step_ms": asdict(timing),
        "halo_exchange_ms": halo.seconds * 1e3 / settings.repeat,
        "halo_exposed_ms": halo.exposed_seconds * 1e3 / settings.repeat,
        "allreduce_ms": reduce_log.seconds * 1e3 / settings.repeat,
        "halo_bytes_per_step": (halo.bytes_sent + halo.bytes_received) // settings.repeat,
        "exchanges_per_step": halo.calls // settings.repeat,
        "peak_mib": _peak_mib(device),
    }


def baseline_step(settings: RunSettings, graph: Graph) -> dict:
    """The same model on the whole graph on one device: {"step_ms": ...} or {"error": "out of memory ..."}."""
    device = _device(settings)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        graph = graph.to(device)
        model = _model(settings, device)
        x, grad_out = _features(graph.num_nodes, settings, device, settings.seed + 1)
        timing = time_call(_training_step(model, x, graph, grad_out, None), device, warmup=settings.warmup,
                           repeat=settings.repeat)
    except torch.OutOfMemoryError as error:
        return {"error": f"out of memory ({' '.join(str(error).split())[:160]})", "peak_mib": _peak_mib(device)}
    return {"step_ms": asdict(timing), "peak_mib": _peak_mib(device)}


def scaling_rows(baseline: Optional[dict], ranks: list[dict]) -> list[list]:
    """[ranks, step ms, speedup, efficiency] for 1 rank (when measured) and for all: the slowest rank's median
    sets the pace of a step."""
    step = max(rank["step_ms"]["median_ms"] for rank in ranks)
    rows = []
    single = baseline.get("step_ms", {}).get("median_ms") if baseline else None
    if baseline is not None:
        rows.append([1, single if single is not None else baseline.get("error"), 1.0 if single else None,
                     1.0 if single else None])
    speedup = single / step if single else None
    rows.append([len(ranks), step, speedup, speedup / len(ranks) if speedup else None])
    return rows


def rank_rows(ranks: list[dict]) -> list[list]:
    return [[r["rank"], r["nodes"], r["interior_nodes"], r["edges"], r["halo_nodes"], r["step_ms"]["median_ms"],
             r["halo_exchange_ms"], r["halo_exposed_ms"], r["allreduce_ms"], r["halo_bytes_per_step"] / 1e6,
             r["peak_mib"]] for r in ranks]


def run_distributed(settings: RunSettings, ranks: int, *, baseline: bool, timeout: float) -> Optional[dict]:
    """Spawn `ranks` ranks (or join torchrun's group) and measure; the report on the spawning process or
    torchrun's rank 0, None on torchrun's other ranks. A failing rank raises GnnioError naming it."""
    from gnnio_cli.bench.report import environment
    from gnnio_cli.distributed import ensure_partition
    from gnnio_cli.distributed.launch import run_ranks, under_torchrun
    from gnnio_cli.graph.store import load, read_attrs

    from gnnio_cli.distributed.partition import check_options

    settings.layer_settings("cpu")  # one-line errors for the layer, width, heads and order before any rank starts
    check_options(ranks, settings.order)
    attrs = read_attrs(settings.graph)
    device = workloads.check_device(settings.device)
    if device.type == "cuda" and not under_torchrun() and ranks > torch.cuda.device_count():
        raise GnnioError(f"--gpus {ranks}: only {torch.cuda.device_count()} GPUs are visible")
    if settings.gpu_memory_gib is not None:
        if device.type != "cuda":
            raise GnnioError(f"--gpu-memory {settings.gpu_memory_gib:g}: caps a GPU's memory; the device is {device}")
        if settings.gpu_memory_gib * 2**30 > torch.cuda.get_device_properties(device).total_memory:
            cap_gpu_memory(device, settings.gpu_memory_gib)  # its one-line error, before any rank starts
    if not under_torchrun():  # made here, so no rank waits on a collective while rank 0 partitions a large graph
        ensure_partition(settings.graph, ranks, order=settings.order, seed=settings.seed)
    results = run_ranks(rank_step, ranks, (settings,), device=settings.device, timeout=timeout)
    if results is None:
        return None
    single = baseline_step(settings, load(settings.graph).graph) if baseline else None
    return {
        "command": "run", "mode": "distributed", "settings": asdict(settings), "ranks": results,
        "graph": {"path": settings.graph, "num_nodes": int(attrs["num_nodes"]), "num_edges": int(attrs["num_edges"])},
        "environment": {**environment(device), "backend": "nccl" if device.type == "cuda" else "gloo",
                        "torchrun": under_torchrun()},
        "baseline": single,
        "total": {
            "step_ms": max(rank["step_ms"]["median_ms"] for rank in results),
            "halo_bytes_per_step": sum(rank["halo_bytes_per_step"] for rank in results),
            "halo_exchange_ms_max": max(rank["halo_exchange_ms"] for rank in results),
            "halo_exposed_ms_max": max(rank["halo_exposed_ms"] for rank in results),
        },
        "scaling": [dict(zip(SCALING_COLUMNS, row)) for row in scaling_rows(single, results)],
    }
