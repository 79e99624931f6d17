"""Options shared by `gnnio run` and `gnnio compare`, declared once."""

from __future__ import annotations

import click

from gnnio_cli.bench.workloads import DTYPES, LAYERS

LAYER_CHOICES = list(LAYERS)


def graph_option(fn):
    return click.option(
        "--graph",
        default=None,
        help="A gnnio .h5 file, or a standard graph name (rmat20, uniform20, grid1024, rmatN, ...). "
        "Default: the bundled Cora sample.",
    )(fn)


def workload_options(fn):
    for decorator in reversed(
        [
            click.option("--features", default=128, show_default=True, type=int, help="Feature width (input and output)."),
            click.option("--heads", default=4, show_default=True, type=int, help="Attention heads (must divide --features)."),
            click.option("--dtype", type=click.Choice(list(DTYPES)), default="fp32", show_default=True),
            click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                         help="Default: cuda when a GPU is visible, else cpu."),
        ]
    ):
        fn = decorator(fn)
    return fn


def timing_options(fn):
    for decorator in reversed(
        [
            click.option("--backward/--no-backward", default=True, show_default=True, help="Also time forward+backward."),
            click.option("--repeat", default=10, show_default=True, type=click.IntRange(1), help="Timed calls."),
            click.option("--warmup", default=3, show_default=True, type=click.IntRange(0), help="Untimed calls first."),
            click.option("--seed", default=0, show_default=True, type=int, help="Seed for weights and features."),
        ]
    ):
        fn = decorator(fn)
    return fn
