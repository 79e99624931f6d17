"""`gnnio compare`: the same inputs through gnnio and other backends, side by side."""

from __future__ import annotations

from typing import Callable, Sequence

import click

from gnnio_cli.cli import options
from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, stdout, table


def _split(ctx, param, value):
    return [item.strip() for item in value.split(",") if item.strip()] if value else []


def _split_known(known: Callable[[], Sequence[str]]):
    """A callback that splits a comma-separated option and refuses, before any work, names not in known()."""
    def callback(ctx, param, value):
        items = _split(ctx, param, value)
        choices = list(known())
        for item in items:
            if item not in choices:
                raise click.BadParameter(f"{item!r} is not one of {', '.join(choices)}")
        return items
    return callback


def _compare_targets() -> Sequence[str]:
    from gnnio_cli.bench.report import COMPARE_TARGETS

    return COMPARE_TARGETS


def _reorder_methods() -> Sequence[str]:
    from gnnio_cli.graph.reorder import METHODS

    return METHODS


@click.command("compare")
@click.option("--layer", "layers", required=True, callback=_split,
              help=f"Layer(s), comma-separated: {', '.join(options.LAYER_CHOICES)}.")
@options.graph_option
@click.option("--against", default="reference,cusparse", show_default=True, callback=_split_known(_compare_targets),
              help="Comma-separated: reference (PyTorch reference ops), cusparse (torch.sparse CSR SpMM at the "
                   "same width: the bandwidth yardstick), pyg (PyG 2.8's layer with the same weights; --scope layer), "
                   "compiled / pyg-compiled (gnnio's / PyG's layer under torch.compile, fed the edge_index; "
                   "--scope layer).")
@click.option("--scope", type=click.Choice(["aggregation", "layer"]), default="aggregation", show_default=True,
              help="aggregation: the op alone (no projections); layer: the whole layer.")
@click.option("--reorder", "reorders", default="", callback=_split_known(_reorder_methods),
              help="Repeat the comparison on the graph relabelled by each of these orders (e.g. "
                   "none,rcm,degree,rabbit,random): time per order, the order's cost, and the training "
                   "steps that repay it relative to the first order listed.")
@click.option("--schedules", is_flag=True,
              help="Attention layers: time the fused kernels under every candidate row schedule (the chosen one, "
                   "fixed tile lengths for split rows, no split) so the choice can be checked. Needs a GPU.")
@options.workload_options
@options.timing_options
@options.minibatch_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(layers, graph, against, scope, reorders, schedules, features, heads, dtype, device, backward, repeat,
            warmup, seed, batch_size, fanout, classes, steps, rounds, as_json):
    """Compare gnnio with the reference, cuSPARSE and PyG on one graph, in one process.

    For each layer: forward and forward+backward time, peak memory, the ratio
    to the byte floor (at the copy bandwidth measured in this run), gnnio's
    speedup over each, and the largest error relative to gnnio's output.

    With --batch-size and --fanout, mini-batch training steps of each layer's
    model against PyG's (see `gnnio run --help`).
    """
    from gnnio_cli.bench import report
    from gnnio_cli.bench.workloads import LAYERS
    from gnnio_cli.errors import GnnioError

    if options.check_minibatch(batch_size, fanout):
        from gnnio_cli.cli.run import show_minibatch

        wanted = [target for target in against if target in ("pyg",)] or ["pyg"]
        show_minibatch(layers, graph, fanout, batch_size, features, classes, heads, device, wanted, warmup, steps,
                       rounds, seed, as_json)
        return
    for layer in layers:
        if layer not in LAYERS:
            raise GnnioError(f"--layer {layer}: unknown layer; choose from {', '.join(LAYERS)}")
    with DelayedProgress(("comparing",)):
        result = report.compare(layers=layers, graph_spec=graph, against=against, scope=scope, features=features,
                                heads=heads, dtype=dtype, device=device, backward=backward, repeat=repeat,
                                warmup=warmup, seed=seed, reorders=reorders, schedules=schedules)
    if as_json:
        emit_json(result)
        return
    info = result["graph"]
    stdout.print(key_value_table("gnnio compare", [
        ("graph", f"{info['name']} ({info['num_nodes']:,} nodes, {info['num_edges']:,} edges, max in-degree {info['max_in_degree']:,})"),
        ("device", f"{result['environment']['device']} ({result['environment']['device_name']})"),
        ("scope", result["scope"]),
        ("copy bandwidth", "-" if result["copy_bandwidth_gbs"] is None else f"{result['copy_bandwidth_gbs']:,.0f} GB/s"),
    ]))
    if schedules:
        for entry in result["schedules"]:
            rows = [report.compare_row(run) for run in entry["runs"]]
            stdout.print(table(f"{entry['layer']}: row schedules (speedup column: chosen over this one)",
                               report.COMPARE_COLUMNS, rows))
        return
    if reorders:
        for index, layer in enumerate(layers):
            rows = [report.reorder_row(entry["method"], entry["reorder_seconds"], entry["locality"], run)
                    for entry in result["reorders"] for run in entry["results"][index]["runs"]]
            stdout.print(table(f"{layer}: node orders (payback relative to '{reorders[0]}')", report.REORDER_COLUMNS, rows))
        return
    for entry in result["results"]:
        settings = entry["settings"]
        title = f"{entry['layer']} ({settings['features']} features, {settings['heads']} heads, {settings['dtype']}): times in ms"
        stdout.print(table(title, report.COMPARE_COLUMNS, [report.compare_row(run) for run in entry["runs"]]))
