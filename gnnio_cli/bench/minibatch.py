"""Mini-batch training steps, as people train on large graphs: a new sampled subgraph every step.

A model of 1-3 layers (GAT, GATv2, Transformer, SAGE mean or GCN; ``hidden``
features, the last layer giving ``classes``) is trained with Adam on batches
from gnnio's neighbour loader (:class:`gnnio_cli.loader.NeighborLoader`,
sampling on the device). The batches are drawn once, before any timing, and
the same ones feed every library, so every library sees the same graphs. A
step is: gather the batch's features, forward, cross-entropy on the seed
nodes, backward, optimizer step.

What is timed (CUDA events around a run of steps, one synchronisation at its
end, as a training loop runs; the median of several runs):

- ``sampling``: the loader producing a batch (its Graph and the Graph's facts
  included);
- ``gnnio, edge_index``: a gnnio step on a new ``edge_index`` every step, the
  structures built by the layers (what a model fed by PyG's loader pays);
- ``gnnio, loader graph``: a gnnio step on the batch's Graph from the loader;
- ``gnnio, structures cached``: the same steps again, every structure already
  built (the compute alone); the difference to the loader-graph step is the
  structure set-up a step pays;
- ``pyg``: PyG's layers with the same weights on the same ``edge_index``.

The two runs on new graphs get, every step, an edge_index or Graph that no
layer has seen (a copy of the tensor; :meth:`Graph.uncached`) and that is freed
after its step, as a training loop drops each batch: the structures built in a
step are freed with it and the next step's reuse their memory. (Kept alive,
every step would grow the allocator's pool, which no training loop does.)
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from gnnio_cli.errors import GnnioError

MODELS = ("gat", "gatv2", "transformer", "sage-mean", "gcn")
MAX_LAYERS = 3


class Net(torch.nn.Module):
    """convs[0] .. convs[-1] with an activation between them (ELU for attention layers, ReLU otherwise)."""

    def __init__(self, convs: list[torch.nn.Module], activation: Callable):
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)
        self.activation = activation

    def forward(self, x: torch.Tensor, edges) -> torch.Tensor:
        for conv in self.convs[:-1]:
            x = self.activation(conv(x, edges))
        return self.convs[-1](x, edges)


def build_model(library, model: str, layers: int, in_features: int, hidden: int, classes: int, heads: int) -> Net:
    """The `model` network of `layers` layers from `library` (gnnio_cli.nn or torch_geometric.nn)."""
    widths = [in_features] + [hidden] * (layers - 1)
    convs = []
    for index, width in enumerate(widths):
        last = index == layers - 1
        out = classes if last else hidden
        if model in ("gat", "gatv2", "transformer"):
            cls = {"gat": library.GATConv, "gatv2": library.GATv2Conv, "transformer": library.TransformerConv}[model]
            convs.append(cls(width, out, heads=1) if last else cls(width, out // heads, heads=heads))
        elif model == "sage-mean":
            convs.append(library.SAGEConv(width, out, aggr="mean"))
        else:
            convs.append(library.GCNConv(width, out))
    return Net(convs, F.elu if model in ("gat", "gatv2", "transformer") else F.relu)


def check_options(model: str, fanout: list[int], batch_size: int, hidden: int, heads: int) -> None:
    if model not in MODELS:
        raise GnnioError(f"--layer {model}: mini-batch mode runs {', '.join(MODELS)}")
    if not 1 <= len(fanout) <= MAX_LAYERS:
        raise GnnioError(f"--fanout: give 1 to {MAX_LAYERS} per-hop fan-outs (one per layer), got {len(fanout)}")
    if batch_size < 1:
        raise GnnioError(f"--batch-size must be positive, got {batch_size}")
    if model in ("gat", "gatv2", "transformer") and (heads < 1 or hidden % heads):
        raise GnnioError(f"--heads {heads}: must be positive and divide --features {hidden}")


def _step(model: Net, optimizer, x: torch.Tensor, y: torch.Tensor, batch, edges) -> None:
    out = model(x.index_select(0, batch.n_id), edges)
    loss = F.cross_entropy(out[: batch.batch_size], y.index_select(0, batch.n_id[: batch.batch_size]))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _time_steps(run: Callable[[int], None], first: int, count: int, device: torch.device) -> float:
    """Milliseconds per step of run(first) .. run(first + count - 1), one synchronisation at the end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        begin = time.perf_counter()
        for index in range(first, first + count):
            run(index)
        end.record()
        end.synchronize()
        return max(start.elapsed_time(end), (time.perf_counter() - begin) * 1e3) / count
    begin = time.perf_counter()
    for index in range(first, first + count):
        run(index)
    return (time.perf_counter() - begin) * 1e3 / count


def timed(run: Callable[[int], None], *, warmup: int, steps: int, rounds: int, device: torch.device) -> dict:
    """The median, min and max over `rounds` of the per-step time of `steps` steps, after `warmup` steps;
    step i of the whole sequence is run(i)."""
    for index in range(warmup):
        run(index)
    samples = [_time_steps(run, warmup + r * steps, steps, device) for r in range(rounds)]
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "steps": steps, "rounds": rounds}


def run_minibatch(*, model: str, graph_spec: Optional[str], fanout: list[int], batch_size: int, features: int,
                  hidden: int, classes: int, heads: int, device: Optional[str], against: list[str], warmup: int,
                  steps: int, rounds: int, seed: int, progress=None) -> dict:
    """Time mini-batch training steps of `model` (gnnio, and PyG where `against` names it); the `--json` document."""
    from gnnio_cli import nn as gnnio_nn
    from gnnio_cli.bench.report import default_device, environment, graph_summary
    from gnnio_cli.bench.workloads import check_device
    from gnnio_cli.graph import catalog
    from gnnio_cli.loader import NeighborLoader

    check_options(model, fanout, batch_size, hidden, heads)
    for target in against:
        if target != "pyg":
            raise GnnioError(f"--against {target}: mini-batch mode compares with pyg only")
    torch_device = check_device(default_device(device))
    named = catalog.resolve(graph_spec)
    graph = named.graph
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(graph.num_nodes, features, generator=generator).to(torch_device)
    y = torch.randint(0, classes, (graph.num_nodes,), generator=generator).to(torch_device)

    total = warmup + steps * rounds
    loader = NeighborLoader(graph, num_neighbors=fanout, batch_size=batch_size, shuffle=True, seed=seed,
                            device=torch_device)
    batches, sampling = _draw(loader, total, torch_device, progress)
    torch.manual_seed(seed)
    gnnio_model = build_model(gnnio_nn, model, len(fanout), features, hidden, classes, heads).to(torch_device)
    pyg_model = None
    if "pyg" in against:
        try:
            import torch_geometric.nn as pyg_nn
        except ImportError:
            raise GnnioError("--against pyg: torch_geometric is not importable; pip install torch-geometric") from None
        pyg_model = build_model(pyg_nn, model, len(fanout), features, hidden, classes, heads).to(torch_device)
        pyg_model.load_state_dict(gnnio_model.state_dict(), strict=True)

    timing = dict(warmup=warmup, steps=steps, rounds=rounds, device=torch_device)
    runs = {"sampling": sampling}

    def trainer(net: Net, edges_of: Callable[[int], object]) -> Callable[[int], None]:
        optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
        return lambda index: _step(net, optimizer, x, y, batches[index], edges_of(index))

    def handed_over(new: Callable) -> Callable[[int], object]:
        """Step i's edges, new(batch i) made before the timing and released to the step (see above)."""
        pending = {index: new(batch) for index, batch in enumerate(batches)}
        return pending.pop

    state = {name: tensor.clone() for name, tensor in gnnio_model.state_dict().items()}
    plans = [("gnnio, edge_index", gnnio_model, lambda: handed_over(lambda b: b.edge_index.clone())),
             ("gnnio, loader graph", gnnio_model, lambda: handed_over(lambda b: b.graph.uncached())),
             ("gnnio, structures cached", gnnio_model, lambda: lambda index: batches[index].graph)]
    if pyg_model is not None:
        plans.append(("pyg", pyg_model, lambda: lambda index: batches[index].edge_index))
    for label, net, edges_for_run in plans:
        if progress is not None:
            progress(f"timing {label}")
        if net is gnnio_model:
            if label == "gnnio, structures cached":  # every batch's structures built before the timing
                build = trainer(net, edges_for_run())
                for index in range(total):
                    build(index)
            net.load_state_dict(state)
        runs[label] = timed(trainer(net, edges_for_run()), **timing)
    batch_sizes = [(int(b.n_id.numel()), int(b.edge_index.shape[1])) for b in batches]
    document = {
        "command": "run",
        "mode": "mini-batch",
        "model": model,
        "layers": len(fanout),
        "settings": {"fanout": fanout, "batch_size": batch_size, "features": features, "hidden": hidden,
                     "classes": classes, "heads": heads, "seed": seed, "warmup": warmup, "steps": steps,
                     "rounds": rounds},
        "graph": graph_summary(named),
        "environment": environment(torch_device),
        "batches": {"count": len(batches),
                    "mean_nodes": statistics.mean(n for n, _ in batch_sizes),
                    "mean_edges": statistics.mean(e for _, e in batch_sizes)},
        "runs": runs,
    }
    document["summary"] = summarize(runs)
    return document


def _draw(loader, count: int, device: torch.device, progress) -> tuple[list, dict]:
    """`count` batches from `loader` (epochs repeat as needed) and the time per batch it took."""
    batches = []
    samples = []
    iterator = iter(loader)
    while len(batches) < count:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        begin = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            continue
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - begin) * 1e3)
        batches.append(batch)
        if progress is not None and len(batches) % 20 == 0:
            progress(f"sampled {len(batches)}/{count} batches")
    timed_samples = samples[min(3, len(samples) - 1):]  # the first batches pay one-time costs (kernel loads)
    sampling = {"median_ms": statistics.median(timed_samples), "min_ms": min(timed_samples),
                "max_ms": max(timed_samples), "steps": len(timed_samples), "rounds": 1}
    return batches, sampling


def summarize(runs: dict) -> dict:
    """The ratios the tables show: gnnio over PyG per input kind, and the structure set-up's share of a step."""
    median = {label: run["median_ms"] for label, run in runs.items()}
    cached = median["gnnio, structures cached"]
    summary = {
        "structure_ms_loader_graph": median["gnnio, loader graph"] - cached,
        "structure_share_loader_graph": (median["gnnio, loader graph"] - cached) / median["gnnio, loader graph"],
        "structure_ms_edge_index": median["gnnio, edge_index"] - cached,
        "structure_share_edge_index": (median["gnnio, edge_index"] - cached) / median["gnnio, edge_index"],
    }
    if "pyg" in median:
        summary["gnnio_over_pyg_loader_graph"] = median["gnnio, loader graph"] / median["pyg"]
        summary["gnnio_over_pyg_edge_index"] = median["gnnio, edge_index"] / median["pyg"]
    return summary


MINIBATCH_COLUMNS = ["run", "median ms/step", "min ms", "max ms", "over pyg"]


def minibatch_rows(document: dict) -> list[list]:
    runs = document["runs"]
    pyg = runs.get("pyg", {}).get("median_ms")
    rows = []
    for label, run in runs.items():
        ratio = run["median_ms"] / pyg if pyg and label != "sampling" else None
        rows.append([label, run["median_ms"], run["min_ms"], run["max_ms"], ratio])
    return rows
