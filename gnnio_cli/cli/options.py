"""Options shared by `gnnio run` and `gnnio compare`, declared once."""

from __future__ import annotations

from typing import Optional

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


def _fanout(ctx, param, value):
    if value is None:
        return None
    try:
        fanout = [int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        raise click.BadParameter(f"give comma-separated integers such as 15,10, got {value!r}") from None
    if not fanout or any(k == 0 or k < -1 for k in fanout):
        raise click.BadParameter(f"each fan-out must be positive or -1 (all neighbours), got {value!r}")
    return fanout


def minibatch_options(fn):
    """Mini-batch mode of `run` and `compare`: a new sampled subgraph every training step."""
    for decorator in reversed(
        [
            click.option("--batch-size", type=int, default=None,
                         help="Mini-batch mode: seed nodes per batch (with --fanout); a model of one layer per hop "
                              "is trained on batches from gnnio's neighbour loader."),
            click.option("--fanout", callback=_fanout, default=None,
                         help="Mini-batch mode: neighbours sampled per hop, e.g. 15,10 (-1: all); 1 to 3 hops."),
            click.option("--classes", default=16, show_default=True, type=click.IntRange(2),
                         help="Mini-batch mode: output classes of the last layer."),
            click.option("--steps", default=20, show_default=True, type=click.IntRange(1),
                         help="Mini-batch mode: training steps per timed run."),
            click.option("--rounds", default=5, show_default=True, type=click.IntRange(1),
                         help="Mini-batch mode: timed runs (the median is reported)."),
        ]
    ):
        fn = decorator(fn)
    return fn


def check_minibatch(batch_size, fanout) -> bool:
    """Whether the mini-batch options ask for mini-batch mode (both or neither must be given)."""
    if (batch_size is None) != (fanout is None):
        raise click.UsageError("mini-batch mode needs both --batch-size and --fanout")
    return batch_size is not None


def distributed_options(fn):
    """Distributed mode of `run`: the graph's rows split across ranks (see gnnio_cli.bench.distributed)."""
    for decorator in reversed(
        [
            click.option("--gpus", "--ranks", "ranks", type=click.IntRange(1), default=None,
                         help="Distributed mode: ranks to spawn, one GPU each (CPU processes on gloo with "
                              "--device cpu); needs --graph G.h5."),
            click.option("--order", default="none", show_default=True,
                         help="Distributed mode: node order of the partition (none, rcm, rabbit, ...)."),
            click.option("--baseline/--no-baseline", default=True, show_default=True,
                         help="Distributed mode: also time the model on the whole graph on one device."),
            click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(1),
                         help="Distributed mode: seconds a collective may wait for the other ranks."),
            click.option("--gpu-memory", "gpu_memory", type=click.FloatRange(min=0, min_open=True), default=None,
                         help="Distributed mode: cap each GPU's memory at this many GiB, ranks and baseline alike "
                              "(will the model fit a smaller GPU?)."),
        ]
    ):
        fn = decorator(fn)
    return fn


def distributed_ranks(ranks, graph) -> Optional[int]:
    """The ranks distributed mode runs on (--gpus, or torchrun's world size), None when not asked for;
    it needs a graph file."""
    import os

    from gnnio_cli.distributed.launch import under_torchrun

    if under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        if ranks is not None and ranks != world_size:
            raise click.UsageError(f"--gpus {ranks}: torchrun started {world_size} ranks")
        ranks = world_size
    if ranks is None:
        return None
    if graph is None or not graph.endswith(".h5"):
        raise click.UsageError("--gpus needs --graph G.h5: a gnnio graph file, which stores the partition")
    return ranks
