"""`gnnio run`: execute one layer on a graph and print timing and memory."""

from __future__ import annotations

import click

from gnnio_cli.cli import options
from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, stdout, table


@click.command("run")
@click.option("--layer", required=True, type=click.Choice(options.LAYER_CHOICES), help="Layer to run.")
@options.graph_option
@options.workload_options
@click.option("--backend", type=click.Choice(["auto", "native", "reference"]), default="auto", show_default=True,
              help="auto: native kernels on CUDA when built, else the PyTorch reference.")
@click.option("--aggregation-only", is_flag=True, help="Time the layer's aggregation alone (no projections).")
@options.timing_options
@click.option("--profile", is_flag=True,
              help="Also run one more step under torch.profiler and list its costliest kernels.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(layer, graph, features, heads, dtype, device, backend, aggregation_only, backward, repeat, warmup, seed, profile, as_json):
    """Run LAYER on a graph with seeded random weights and features.

    Prints forward and forward+backward time (median, min, max over --repeat
    calls after --warmup), peak memory, the graph, the device and the backend
    and kernels that actually ran. Without --graph, the bundled Cora sample.
    """
    from gnnio_cli.bench import report

    with DelayedProgress((f"measuring {layer}",)):
        result = report.run_layer(
            layer=layer, graph_spec=graph, features=features, heads=heads, dtype=dtype, device=device,
            backend=backend, aggregation_only=aggregation_only, backward=backward, repeat=repeat, warmup=warmup,
            seed=seed, profile=profile,
        )
    if as_json:
        emit_json(result)
        return
    stdout.print(key_value_table(f"gnnio run: {layer}", report.summary_pairs(result)))
    stdout.print(table("Timing and peak memory", report.TIMING_COLUMNS, report.timing_rows(result["measurement"])))
    if profile:
        from gnnio_cli.bench.kernel_profile import PROFILE_COLUMNS, profile_rows

        profiled = result["profile"]
        title = f"Where one {profiled['step']} step's time goes ({profiled['device']}, {profiled['device_total_ms']:.2f} ms in all)"
        stdout.print(table(title, PROFILE_COLUMNS, profile_rows(profiled)))
