"""`gnnio profile-degree`: degree statistics, schedule thresholds and locality of a stored graph."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
from rich.table import Table

from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, stdout, table
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.files import atomic_path, check_destination
from gnnio_cli.graph.locality import DEFAULT_L2_MB, DTYPE_BYTES, CacheModel, LocalityMetrics

BAR_WIDTH = 24
EIGHTHS = " ▏▎▍▌▋▊▉"
LOCALITY_COLUMNS = ["order", "bandwidth", "mean gap", "median gap", "mean log2(1+gap)", "hit rate"]
STAGES = ("load", "profile")


def cache_options(fn):
    """--features, --dtype, --l2-mb and --seed (of the random control), shared with `gnnio reorder`."""
    for decorator in reversed(
        [
            click.option("--features", default=128, show_default=True, type=click.IntRange(1),
                         help="Feature width: sets the cache entry size and the shared-memory row limit."),
            click.option("--dtype", type=click.Choice(list(DTYPE_BYTES)), default="fp32", show_default=True),
            click.option("--l2-mb", default=DEFAULT_L2_MB, show_default=True, type=click.FloatRange(min=0, min_open=True),
                         help="Size of the simulated LRU cache in MiB (the GPU's L2; 50 on H100)."),
            click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random order shown as the control (and of reorder's --method random)."),
        ]
    ):
        fn = decorator(fn)
    return fn


def locality_row(name: str, metrics: LocalityMetrics) -> list:
    return [name, metrics.bandwidth, round(metrics.mean_gap), metrics.median_gap, metrics.mean_log2_gap, metrics.cache_hit_rate]


def cache_caption(cache: CacheModel, seed: int) -> str:
    return (f"gaps: |target - source| over edges; hit rate: simulated LRU of {cache.l2_mb:g} MiB, "
            f"{cache.capacity_entries:,} entries of {cache.entry_bytes} B ({cache.features} x {cache.dtype} rows); "
            f"random: a relabelling with seed {seed}")


def bar(count: int, largest: int) -> str:
    """A horizontal bar of block characters, `BAR_WIDTH` wide at `largest`; non-zero counts show at least 1/8."""
    if largest <= 0 or count <= 0:
        return ""
    eighths = max(1, round(8 * BAR_WIDTH * count / largest))
    return "█" * (eighths // 8) + EIGHTHS[eighths % 8].strip()


def histogram_table(histogram) -> Table:
    largest = max(max(histogram.in_count), max(histogram.out_count))
    rows = []
    for lower, upper, in_count, out_count in zip(histogram.lower, histogram.upper, histogram.in_count, histogram.out_count):
        label = str(lower) if lower == upper else f"{lower}-{upper}"
        rows.append([label, in_count, bar(in_count, largest), out_count, bar(out_count, largest)])
    out = table("Degree histogram (log2 bins: nodes per degree range)", ["degree", "in", "", "out", ""], rows)
    for column in (2, 4):
        out.columns[column].justify = "left"
    return out


def pyplot():
    """matplotlib.pyplot with a file-only backend, or a one-line error saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GnnioError("--plot: matplotlib is not installed; pip install matplotlib (or pip install gnnio[plot])") from None
    return plt


def write_plot(plt, graph, path: Path) -> None:
    """Log-log plot of how many nodes have each in- and out-degree (degree 0 left out)."""
    figure, axes = plt.subplots(figsize=(6, 4.5))
    for name, degree in (("in-degree", graph.in_degree.numpy()), ("out-degree", graph.out_degree.numpy())):
        counts = np.bincount(degree)
        present = np.flatnonzero(counts[1:]) + 1
        axes.loglog(present, counts[present], ".", markersize=3, label=name)
    axes.set_xlabel("degree")
    axes.set_ylabel("nodes")
    axes.set_title(f"{graph.num_nodes:,} nodes, {graph.num_edges:,} edges")
    axes.legend()
    figure.tight_layout()
    try:
        with atomic_path(path, "the plot") as tmp:
            figure.savefig(tmp, dpi=120, format=path.suffix[1:].lower() or "png")
    except ValueError as err:  # a format matplotlib does not write
        raise GnnioError(f"--plot {path}: {err}") from None
    finally:
        plt.close(figure)


@click.command("profile-degree")
@click.argument("graph_path", metavar="GRAPH.h5", type=click.Path(path_type=Path))
@cache_options
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Also write a log-log degree plot (PNG, needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(graph_path, features, dtype, l2_mb, seed, plot_path, as_json):
    """Degree profile of GRAPH.h5: statistics, histogram, schedule thresholds and locality.

    Rows are targets (the CSR); the schedule thresholds count rows by in-degree.
    Locality is that of the stored order, beside a seeded random order.
    """
    from gnnio_cli.graph.locality import locality, random_order
    from gnnio_cli.graph.profile import degree_profile
    from gnnio_cli.graph.store import load

    cache = CacheModel(features=features, dtype=dtype, l2_mb=l2_mb)
    plt = None
    if plot_path is not None:  # both checked before any work
        plt = pyplot()
        check_destination(plot_path, "--plot", lambda path: True, "a plot")
    with DelayedProgress(STAGES + (("plot",) if plt is not None else ())) as progress:
        graph = load(graph_path).graph
        progress("profile")
        profile = degree_profile(graph, cache)
        random_control = locality(graph, random_order(graph.num_nodes, seed), cache)
        if plt is not None:
            progress("plot")
            write_plot(plt, graph, plot_path)
    if as_json:
        emit_json({"graph": str(graph_path), "cache": cache, "seed": seed, "profile": profile,
                   "random_order": random_control, "plot": None if plot_path is None else str(plot_path)})
        return
    stdout.print(key_value_table(f"gnnio profile-degree: {graph_path}", [
        ("nodes", profile.num_nodes),
        ("edges", profile.num_edges),
        ("isolated nodes (no in- or out-edges)", profile.isolated_nodes),
    ]))
    stats = [("min", "min"), ("median", "median"), ("mean", "mean"), ("p90", "p90"), ("p99", "p99"), ("max", "max"),
             ("edge share of top 1% nodes", "top1pct_edge_share")]
    sides = [profile.in_degree, profile.out_degree] + ([profile.undirected_degree] if profile.undirected_degree else [])
    stdout.print(table("Degrees", ["", "in", "out", "undirected"][: len(sides) + 1],
                       [[label] + [getattr(side, key) for side in sides] for label, key in stats],
                       caption="undirected: distinct neighbours over both directions, self-loops not counted"))
    stdout.print(histogram_table(profile.histogram))
    schedule = profile.schedule
    stdout.print(table(f"Rows (targets) over the kernels' schedule thresholds at {features} x {dtype}", ["threshold", "rows"], [
        ("in-degree > 32 (past one warp)", schedule.rows_over_warp_limit),
        ("in-degree > 1024 (split rows)", schedule.rows_over_split_limit),
        (f"in-degree > {schedule.shared_memory_row_limit} (past one block's shared memory)", schedule.rows_over_shared_memory),
    ]))
    stdout.print(table("Locality", LOCALITY_COLUMNS,
                       [locality_row("stored", profile.locality), locality_row("random", random_control)],
                       caption=cache_caption(cache, seed)))
    if plot_path is not None:
        stdout.print(f"degree plot written to {plot_path}")
