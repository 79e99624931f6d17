"""The acceptance benchmarks of the kernel issues, in one process on a GPU.

Runs the same comparisons as `gnnio compare --json` (through the same
library function) on the standard graphs, writes each comparison's JSON and
a verdict file to --out, and prints a short table last: one line per
criterion with the measured ratio, the bound and pass/fail.

    python tests/perf/acceptance.py --out DIR [--suite spmm,attention] [--graphs rmat20,uniform20,grid1024]

16-bit training alone (issue 37: each attention kind's fwd+bwd and a 2-layer GAT step, bf16 against fp32):

    python tests/perf/acceptance.py --out DIR --suite bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gnnio_cli.bench import report, workloads
from gnnio_cli.ops import attention, dispatch

# Where the suites run; the headline graph also gets the bf16, whole-layer and drop-in checks.
# A test runs them on CPU with tiny graphs to keep this module honest.
DEVICE = "cuda"
HEADLINE_GRAPH = "rmat20"
SUPER_NODE_DEGREE = 2_000_000

SPMM_LAYERS = ["gcn", "sage-sum", "sage-mean"]
REDUCE_LAYERS = ["sage-max", "sage-min"]
ATTENTION_LAYERS = ["gatv2", "transformer", "gat", "agnn"]


@dataclass
class Verdict:
    suite: str
    graph: str
    criterion: str
    measured: float
    bound: float
    passed: bool


def _median(run: dict, phase: str) -> float:
    key = "forward_ms" if phase == "forward" else "train_ms"
    return run[key]["median_ms"]


def _runs(entry: dict) -> dict:
    return {run["label"]: run for run in entry["runs"]}


def _compare(graph: str, layers, against, scope: str, dtype: str = "fp32", repeat: int = 10) -> dict:
    return report.compare(layers=layers, graph_spec=graph, against=against, scope=scope, features=128, heads=4,
                          dtype=dtype, device=DEVICE, backward=True, repeat=repeat, warmup=3, seed=0)


def spmm_yardstick_ms(result: dict) -> float:
    """The cuSPARSE SpMM forward time of one comparison: the median over its rows.

    Every layer's row times the same SpMM once; an occasional slow sample
    (25-30% off in one row of a run has been seen) must not move that row's verdicts.
    """
    return statistics.median(_median(_runs(entry)["cusparse"], "forward") for entry in result["results"])


def _aggregation_verdicts(suite, graph, result, bounds) -> list[Verdict]:
    """Forward and fwd+bwd of each op relative to the cuSPARSE SpMM measured in the same run."""
    verdicts = []
    spmm_ms = spmm_yardstick_ms(result)
    for entry in result["results"]:
        gnnio = _runs(entry)["gnnio"]
        fwd_bound, train_bound = bounds[entry["layer"]]
        fwd = _median(gnnio, "forward") / spmm_ms
        train = _median(gnnio, "train") / spmm_ms
        verdicts.append(Verdict(suite, graph, f"{entry['layer']} fwd / SpMM", fwd, fwd_bound, fwd <= fwd_bound))
        verdicts.append(Verdict(suite, graph, f"{entry['layer']} fwd+bwd / SpMM", train, train_bound, train <= train_bound))
        if suite == "spmm" and gnnio["peak_train_mib"] is not None:
            element = 4 if entry["settings"]["dtype"] == "fp32" else 2
            needed_mib = 2 * result["graph"]["num_nodes"] * entry["settings"]["features"] * element / 2**20
            memory = gnnio["peak_train_mib"] / needed_mib
            verdicts.append(Verdict(suite, graph, f"{entry['layer']} fwd+bwd peak / (out + grad_in)", memory, 1.3,
                                    memory <= 1.3))
    return verdicts


def _bf16_verdicts(suite, graph, fp32, bf16, phases=(("forward", "fwd", 1.5),)) -> list[Verdict]:
    """bf16's speedup over fp32 per layer, for each (phase, label, bound) of `phases`."""
    verdicts = []
    for entry32, entry16 in zip(fp32["results"], bf16["results"]):
        for phase, label, bound in phases:
            speedup = _median(_runs(entry32)["gnnio"], phase) / _median(_runs(entry16)["gnnio"], phase)
            verdicts.append(Verdict(suite, graph, f"{entry32['layer']} bf16 speedup over fp32 ({label})", speedup,
                                    bound, speedup >= bound))
    return verdicts


def _layer_verdicts(suite, graph, result, speedup_bound, memory_bound) -> list[Verdict]:
    verdicts = []
    for entry in result["results"]:
        runs = _runs(entry)
        gnnio, pyg = runs["gnnio"], runs["pyg"]
        speedup = _median(pyg, "train") / _median(gnnio, "train")
        verdicts.append(Verdict(suite, graph, f"{entry['layer']} layer train speedup over PyG", speedup, speedup_bound,
                                speedup >= speedup_bound))
        kind, bound = memory_bound
        if gnnio["peak_train_mib"] is None:
            continue
        if kind == "fraction_of_pyg":
            ratio = gnnio["peak_train_mib"] / pyg["peak_train_mib"]
            verdicts.append(Verdict(suite, graph, f"{entry['layer']} layer peak memory / PyG", ratio, bound, ratio <= bound))
        else:
            mib = gnnio["peak_train_mib"]
            verdicts.append(Verdict(suite, graph, f"{entry['layer']} layer peak train MiB", mib, bound, mib <= bound))
    return verdicts


def run_spmm_suite(graphs, out: Path) -> list[Verdict]:
    verdicts = []
    bounds = {layer: (1.05, 2.3) for layer in SPMM_LAYERS} | {layer: (1.3, 2.5) for layer in REDUCE_LAYERS}
    for graph in graphs:
        fp32 = _compare(graph, SPMM_LAYERS + REDUCE_LAYERS, ["cusparse"], "aggregation")
        _write(out / f"spmm_{_label(graph)}_fp32.json", fp32)
        verdicts += _aggregation_verdicts("spmm", graph, fp32, bounds)
        if graph == HEADLINE_GRAPH:
            bf16 = _compare(graph, SPMM_LAYERS + REDUCE_LAYERS, [], "aggregation", dtype="bf16")
            _write(out / f"spmm_{_label(graph)}_bf16.json", bf16)
            verdicts += _bf16_verdicts("spmm", graph, fp32, bf16)
            layers = _compare(graph, ["gcn", "sage-max"], ["pyg"], "layer")
            _write(out / f"spmm_{_label(graph)}_layers.json", layers)
            verdicts += _layer_verdicts("spmm", graph, layers, 10.0, ("fraction_of_pyg", 1 / 8))
        torch.cuda.empty_cache()
    return verdicts


def run_attention_suite(graphs, out: Path) -> list[Verdict]:
    verdicts = []
    bounds = {layer: (2.0, 6.0) for layer in ATTENTION_LAYERS}
    for graph in graphs:
        fp32 = _compare(graph, ATTENTION_LAYERS, ["cusparse"], "aggregation")
        _write(out / f"attention_{_label(graph)}_fp32.json", fp32)
        verdicts += _aggregation_verdicts("attention", graph, fp32, bounds)
        if graph == HEADLINE_GRAPH:
            bf16 = _compare(graph, ATTENTION_LAYERS, [], "aggregation", dtype="bf16")
            _write(out / f"attention_{_label(graph)}_bf16.json", bf16)
            verdicts += _bf16_verdicts("attention", graph, fp32, bf16)
            layers = _compare(graph, ["gatv2", "transformer", "gat"], ["pyg"], "layer")
            _write(out / f"attention_{_label(graph)}_layers.json", layers)
            verdicts += _layer_verdicts("attention", graph, layers, 15.0, ("absolute_mib", 4.5 * 1000**3 / 2**20))
            verdicts += _super_node_verdicts(graph, out)
        torch.cuda.empty_cache()
    return verdicts


def _super_node_verdicts(graph: str, out: Path) -> list[Verdict]:
    """One target of in-degree SUPER_NODE_DEGREE on the graph, against the same edges spread evenly; and that
    every attention kind computes it correctly (_super_node_correctness)."""
    verdicts, timings = [], {}
    for kind in ("hub", "spread"):
        spec = f"{graph}+{kind}{SUPER_NODE_DEGREE}"
        timings[kind] = _compare(spec, ["gatv2", "transformer"], [], "aggregation")
        _write(out / f"attention_{_label(graph)}_{kind}.json", timings[kind])
    for hub, spread in zip(timings["hub"]["results"], timings["spread"]["results"]):
        for phase in ("forward", "train"):
            ratio = _median(_runs(hub)["gnnio"], phase) / _median(_runs(spread)["gnnio"], phase)
            label = "fwd" if phase == "forward" else "fwd+bwd"
            verdicts.append(Verdict("attention", graph, f"{hub['layer']} {label} with super node / without", ratio,
                                    1.5, ratio <= 1.5))
    document, correctness = _super_node_correctness(graph)
    _write(out / f"attention_{_label(graph)}_hub_check.json", document)
    return verdicts + correctness


# Each attention kind's op on op_workload's inputs and parameters (in that order), for the fp64 oracle.
_ATTENTION_CALLS = {
    "gatv2": lambda graph, t: attention.gatv2_attention(graph, t[0], t[1], t[2]),
    "transformer": lambda graph, t: attention.transformer_attention(graph, t[0], t[1], t[2]),
    "gat": lambda graph, t: attention.gat_attention(graph, t[0], t[1], t[2]),
    "agnn": lambda graph, t: attention.agnn_attention(graph, t[0], t[0], t[1]),
}
SUPER_NODE_TENSOR_BOUND = 1e-4  # output and gradients against the fp32 reference, relative to the largest value


def _super_node_correctness(graph: str) -> tuple[dict, list[Verdict]]:
    """Every attention kind (fp32, 4 x 32) on the graph with its super node: the super node's output row against
    fp64 (the reference op on its in-edges alone, inputs in fp64), held to 4x the error of the fp32 reference
    op plus 1e-6; and the output and every input gradient against the fp32 reference op, within
    SUPER_NODE_TENSOR_BOUND. A missing tile or a wrong merge of the super node's partial states shows in both."""
    from gnnio_cli.graph import Graph, catalog

    spec = f"{graph}+hub{SUPER_NODE_DEGREE}"
    hub_graph = catalog.resolve(spec).graph.to(DEVICE)
    hub = int(hub_graph.in_degree.argmax())
    begin, end = int(hub_graph.csr_indptr[hub]), int(hub_graph.csr_indptr[hub + 1])
    sources = hub_graph.csr_indices[begin:end].long()
    hub_edges = Graph.from_edge_index(torch.stack([sources, torch.full_like(sources, hub)]),
                                      size=(hub_graph.num_src_nodes, hub_graph.num_dst_nodes)).to(DEVICE)
    document = {"graph": spec, "super_node": hub, "in_degree": end - begin, "kinds": {}}
    verdicts = []
    for kind in ATTENTION_LAYERS:
        workload = workloads.op_workload(hub_graph, workloads.Settings(kind, device=DEVICE))
        tensors = workload.inputs + workload.parameters
        results = {}
        for backend in ("auto", "reference"):
            with dispatch.use_backend(backend):
                dispatch.reset()
                out = workload.forward()
                grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
                grads = torch.autograd.grad(out, tensors, grad_out)
                if backend == "auto":
                    ran = dispatch.ran().get(f"{kind}_attention")
            results[backend] = [out.detach().cpu()] + [g.cpu() for g in grads]
            del out, grads, grad_out
            torch.cuda.empty_cache()
        with dispatch.use_backend("reference"), torch.no_grad():
            oracle = _ATTENTION_CALLS[kind](hub_edges, [t.detach().double() for t in tensors])[hub].cpu()
        hub_error = report.max_error(results["auto"][0][hub], oracle)
        reference_hub_error = report.max_error(results["reference"][0][hub], oracle)
        tensor_error = max(report.max_error(a, b) for a, b in zip(results["auto"], results["reference"]))
        document["kinds"][kind] = {"ran": ran, "hub_row_error_vs_fp64": hub_error,
                                   "fp32_reference_hub_row_error_vs_fp64": reference_hub_error,
                                   "output_and_gradients_error_vs_fp32_reference": tensor_error}
        bound = 4 * reference_hub_error + 1e-6
        verdicts.append(Verdict("attention", graph, f"{kind} super node row error vs fp64", hub_error, bound,
                                hub_error <= bound))
        verdicts.append(Verdict("attention", graph, f"{kind} super node output+grads error vs reference",
                                tensor_error, SUPER_NODE_TENSOR_BOUND, tensor_error <= SUPER_NODE_TENSOR_BOUND))
        del workload, results
        torch.cuda.empty_cache()
    return document, verdicts


class _TwoLayerGATv2(torch.nn.Module):
    """A model written for PyG: two GATv2Conv layers, as a user would write it."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        self.conv1 = pyg_nn.GATv2Conv(width, width // heads, heads=heads)
        self.conv2 = pyg_nn.GATv2Conv(width, width // heads, heads=heads)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


def run_dropin_suite(graphs, out: Path) -> list[Verdict]:
    """Issue 5: an unchanged PyG model, with and without patch_pyg(), on the same inputs and weights."""
    from gnnio_cli.bench.timing import peak_memory_bytes, time_call
    from gnnio_cli.graph import catalog
    from gnnio_cli.nn import patch_pyg

    verdicts, device, width, heads = [], torch.device(DEVICE), 128, 4
    for graph_name in [HEADLINE_GRAPH]:
        graph = catalog.resolve(graph_name).graph.to(device)
        edge_index = graph.edge_index()
        x = torch.randn(graph.num_nodes, width, device=device)
        torch.manual_seed(0)
        pyg_model = _TwoLayerGATv2(width, heads).to(device)
        with patch_pyg():
            patched_model = _TwoLayerGATv2(width, heads).to(device)
        patched_model.load_state_dict(pyg_model.state_dict(), strict=True)
        grad = torch.randn(graph.num_nodes, width, device=device)
        document = {"graph": graph_name, "model": "2 x GATv2Conv(128, 32, heads=4)"}
        outputs = {}
        for label, model in (("patched", patched_model), ("pyg", pyg_model)):
            def step(model=model):
                model.zero_grad(set_to_none=True)
                out = model(x, edge_index)
                out.backward(grad)
                return out
            timing = time_call(step, device, warmup=2, repeat=10)
            peak = peak_memory_bytes(step, device)
            document[label] = {"train_ms": asdict(timing), "peak_train_mib": None if peak is None else peak / 2**20}
            with torch.no_grad():
                outputs[label] = model(x, edge_index).float()
        error = float(((outputs["patched"] - outputs["pyg"]).abs().max() / outputs["pyg"].abs().max()).item())
        document["max_rel_error"] = error
        speedup = document["pyg"]["train_ms"]["median_ms"] / document["patched"]["train_ms"]["median_ms"]
        document["speedup"] = speedup
        _write(out / f"dropin_{graph_name}.json", document)
        verdicts.append(Verdict("dropin", graph_name, "2-layer GATv2 model train speedup with patch_pyg", speedup, 10.0,
                                speedup >= 10.0))
        verdicts.append(Verdict("dropin", graph_name, "patched vs PyG output max rel. error", error, 1e-3, error <= 1e-3))
        del pyg_model, patched_model, outputs
        torch.cuda.empty_cache()
    return verdicts


class _TwoLayerGAT(torch.nn.Module):
    """Two gnnio GATConv layers with an ELU between: the 16-bit training step's model."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        from gnnio_cli.nn import GATConv

        self.conv1 = GATConv(width, width // heads, heads=heads)
        self.conv2 = GATConv(width, width // heads, heads=heads)

    def forward(self, x, edge_index):
        return self.conv2(torch.nn.functional.elu(self.conv1(x, edge_index)), edge_index)


def run_bf16_suite(graphs, out: Path) -> list[Verdict]:
    """Issue 37, on the headline graph (128 features, 4 heads x 32): each attention kind's aggregation forward and
    fwd+bwd in bf16 against fp32, and a 2-layer GAT training step under torch.autocast(bfloat16) against fp32
    (one model, the two steps timed alternately in this process). Prints the times and ratios."""
    from gnnio_cli.bench.timing import time_call
    from gnnio_cli.graph import catalog

    graph_name, device, width, heads = HEADLINE_GRAPH, torch.device(DEVICE), 128, 4
    fp32 = _compare(graph_name, ATTENTION_LAYERS, [], "aggregation")
    bf16 = _compare(graph_name, ATTENTION_LAYERS, [], "aggregation", dtype="bf16")
    _write(out / f"bf16_{_label(graph_name)}_aggregation_fp32.json", fp32)
    _write(out / f"bf16_{_label(graph_name)}_aggregation_bf16.json", bf16)
    verdicts = _bf16_verdicts("bf16", graph_name, fp32, bf16, (("forward", "fwd", 1.5), ("train", "fwd+bwd", 1.6)))
    print(f"\n{graph_name}, {heads} x {width // heads}: aggregation   fp32 ms   bf16 ms   fp32/bf16")
    for entry32, entry16 in zip(fp32["results"], bf16["results"]):
        for phase, label in (("forward", "fwd"), ("train", "fwd+bwd")):
            ms32, ms16 = _median(_runs(entry32)["gnnio"], phase), _median(_runs(entry16)["gnnio"], phase)
            print(f"{entry32['layer']:12s} {label:8s} {ms32:9.3f} {ms16:9.3f} {ms32 / ms16:9.2f}", flush=True)

    graph = catalog.resolve(graph_name).graph.to(device)
    edge_index = graph.edge_index()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, width, generator=generator).to(device)
    grad = torch.randn(graph.num_nodes, width, generator=generator).to(device)
    torch.manual_seed(0)
    model = _TwoLayerGAT(width, heads).to(device)

    def step(autocast: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            result = model(x, edge_index)
        result.backward(grad.to(result.dtype))

    times = {"fp32": [], "autocast bf16": []}
    for _ in range(3):  # alternate rounds: drift falls on both alike
        for label, autocast in (("fp32", False), ("autocast bf16", True)):
            times[label].append(time_call(lambda: step(autocast), device, warmup=2, repeat=5).median_ms)
    medians = {label: statistics.median(samples) for label, samples in times.items()}
    speedup = medians["fp32"] / medians["autocast bf16"]
    document = {"graph": graph_name, "model": f"2 x GATConv({width}, {width // heads}, heads={heads})",
                "train_step_median_ms": medians, "speedup": speedup}
    _write(out / f"bf16_{_label(graph_name)}_gat_step.json", document)
    print(f"2-layer GAT train step  {medians['fp32']:9.3f} {medians['autocast bf16']:9.3f} {speedup:9.2f}", flush=True)
    verdicts.append(Verdict("bf16", graph_name, "2-layer GAT step, autocast bf16 over fp32", speedup,
                            1.6, speedup >= 1.6))
    return verdicts


STUDY_ORDERS = ["none", "rcm", "degree", "rabbit", "random"]
STUDY_LAYERS = ["sage-sum", "sage-max", "gatv2"]


def run_study_suite(graphs, out: Path) -> list[Verdict]:
    """Issue 6: each node order through SpMM (cuSPARSE), max aggregation and GATv2, with its cost and payback.

    The grid starts from randomly permuted ids (what a file with arbitrary ids
    gives); the criterion: RCM and Rabbit bring SpMM and GATv2 to within 1.2x
    of the natural row-major grid order.
    """
    verdicts = []
    for graph in graphs:
        spec = f"{graph}+shuffled" if graph.startswith("grid") else graph
        result = report.compare(layers=STUDY_LAYERS, graph_spec=spec, against=["cusparse"], scope="aggregation",
                                features=128, heads=4, dtype="fp32", device=DEVICE, backward=True, repeat=10,
                                warmup=3, seed=0, reorders=STUDY_ORDERS)
        _write(out / f"study_{_label(graph)}.json", result)
        if graph.startswith("grid"):
            natural = _compare(graph, ["gatv2"], ["cusparse"], "aggregation")
            _write(out / f"study_{_label(graph)}_natural.json", natural)
            natural_runs = _runs(natural["results"][0])
            gatv2_index = STUDY_LAYERS.index("gatv2")
            for entry in result["reorders"]:
                if entry["method"] not in ("rcm", "rabbit"):
                    continue
                runs = _runs(entry["results"][gatv2_index])
                for label, name in (("cusparse", "SpMM"), ("gnnio", "GATv2")):
                    ratio = _median(runs[label], "forward") / _median(natural_runs[label], "forward")
                    verdicts.append(Verdict("study", graph, f"{entry['method']} {name} fwd / natural order", ratio,
                                            1.2, ratio <= 1.2))
        torch.cuda.empty_cache()
    return verdicts


def _label(graph: str) -> str:
    """The name a graph's JSON files and verdicts carry: a `.h5` path by its stem."""
    return Path(graph).stem if graph.endswith(".h5") else graph


def _write(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=1))


SUITES = {"spmm": run_spmm_suite, "attention": run_attention_suite, "dropin": run_dropin_suite,
          "study": run_study_suite, "bf16": run_bf16_suite}


def configure(device: str, headline: str, super_node_degree: int = 2_000_000) -> None:
    global DEVICE, HEADLINE_GRAPH, SUPER_NODE_DEGREE
    DEVICE, HEADLINE_GRAPH, SUPER_NODE_DEGREE = device, headline, super_node_degree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--suite", default="spmm,attention,dropin,study,bf16")
    parser.add_argument("--graphs", default="rmat20,uniform20,grid1024")
    parser.add_argument("--device", default=DEVICE)
    parser.add_argument("--headline", default=HEADLINE_GRAPH, help="graph for the bf16, whole-layer and drop-in checks")
    parser.add_argument("--super-node-degree", type=int, default=SUPER_NODE_DEGREE)
    args = parser.parse_args(argv)
    configure(args.device, args.headline, args.super_node_degree)
    args.out.mkdir(parents=True, exist_ok=True)
    verdicts: list[Verdict] = []
    started = time.time()
    for suite in args.suite.split(","):
        try:
            verdicts += SUITES[suite](args.graphs.split(","), args.out)
        except Exception as err:  # keep the other suites' numbers when one fails
            print(f"suite {suite} failed: {type(err).__name__}: {err}", flush=True)
            verdicts.append(Verdict(suite, "-", f"suite ran ({type(err).__name__})", 0.0, 1.0, False))
        # Written after every suite, so a run cut short keeps what it measured.
        (args.out / "verdicts.json").write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
        print(f"suite {suite} done at {time.time() - started:.0f} s", flush=True)
    print(f"\nacceptance ({time.time() - started:.0f} s): suite graph criterion measured bound pass")
    for v in verdicts:
        measured, bound = _shown(v.measured), _shown(v.bound)
        print(f"{v.suite:9s} {v.graph:9s} {v.criterion:45s} {measured} {bound} {'PASS' if v.passed else 'FAIL'}")
    return 0 if all(v.passed for v in verdicts) else 1


def _shown(value: float) -> str:
    """A verdict's number in 9 characters: 3 decimals, or an exponent for errors far below 1."""
    return f"{value:9.3f}" if value == 0 or abs(value) >= 0.01 else f"{value:9.2e}"


if __name__ == "__main__":
    raise SystemExit(main())
