"""`gnnio reorder`: relabel a stored graph's nodes and show the locality it gains."""

from __future__ import annotations

import time
from pathlib import Path

import click

from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, note, stdout, table
from gnnio_cli.cli.profile_degree import LOCALITY_COLUMNS, cache_caption, cache_options, locality_row
from gnnio_cli.graph.blocked import MAX_BLOCK
from gnnio_cli.graph.locality import CacheModel
from gnnio_cli.graph.reorder import METHODS

STAGES = ("load", "reorder", "write")

def default_output(graph_path: Path, method: str) -> Path:
    """`<stem>.<method>.h5` beside the input."""
    return graph_path.with_name(f"{graph_path.stem}.{method}.h5")


@click.command("reorder")
@click.argument("graph_path", metavar="GRAPH.h5", type=click.Path(path_type=Path))
@click.option("--method", required=True, type=click.Choice(list(METHODS)), help="How to order the nodes.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the reordered graph. Default: <stem>.<method>.h5 beside the input; "
                   "naming the input itself replaces it atomically.")
@cache_options
@click.option("--blocked", "block", type=click.IntRange(1, MAX_BLOCK), default=None,
              help="Also store B x B block-sparse tiles and the degree buckets (e.g. 16).")
@click.option("--force", is_flag=True, help="Replace OUT even if it is not a gnnio graph.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(graph_path, method, output, features, dtype, l2_mb, seed, block, force, as_json):
    """Relabel the nodes of GRAPH.h5 by METHOD and write the reordered graph.

    Stores the order under /perm/<method> (both directions, with its locality
    metrics and time), the relabelled CSR/CSC, and node features permuted
    alongside; earlier orders and features are kept. Prints locality before and
    after, beside a seeded random order, and the time taken.
    """
    from gnnio_cli.graph.files import check_destination
    from gnnio_cli.graph.reorder import reorder_stored
    from gnnio_cli.graph.store import is_gnnio_graph, load, save

    started = time.perf_counter()
    cache = CacheModel(features=features, dtype=dtype, l2_mb=l2_mb)
    output = output if output is not None else default_output(graph_path, method)
    with DelayedProgress(STAGES) as progress:
        stored = load(graph_path)
        check_destination(output, "-o", is_gnnio_graph, "a gnnio graph", force)
        progress("reorder")
        reordered, report = reorder_stored(stored, method, seed=seed, cache=cache, block=block)
        progress("write")
        write_start = time.perf_counter()
        save(reordered, output)
        write_seconds = time.perf_counter() - write_start
    total_seconds = time.perf_counter() - started
    if report.dropped_blocked:
        note(f"dropped blocked formats of the input order: {', '.join(report.dropped_blocked)} (rebuild with --blocked)")
    if as_json:
        emit_json({"input": str(graph_path), "output": str(output), "report": report,
                   "write_seconds": write_seconds, "total_seconds": total_seconds})
        return
    graph = reordered.graph
    stdout.print(key_value_table(f"gnnio reorder: {graph_path} -> {output}", [
        ("method", method),
        ("nodes", graph.num_nodes),
        ("edges", graph.num_edges),
        ("order computed (s)", report.reorder_seconds),
        ("order applied (s)", report.apply_seconds),
        ("written (s)", write_seconds),
        ("total incl. load and metrics (s)", total_seconds),
    ]))
    stdout.print(table("Locality before and after", LOCALITY_COLUMNS, [
        locality_row("input", report.input_order),
        locality_row(method, report.new_order),
        locality_row("random", report.random_order),
    ], caption=cache_caption(cache, seed)))
    if report.blocked is not None:
        tiles = report.blocked
        stdout.print(key_value_table(f"Block-sparse tiles {tiles.block} x {tiles.block}", [
            ("tiles", tiles.num_tiles),
            ("non-empty tile rows", tiles.nonempty_tile_rows),
            ("density (positions / tile area)", tiles.density),
            ("positions per tile: median", tiles.positions_per_tile_median),
            ("positions per tile: p90", tiles.positions_per_tile_p90),
            ("positions per tile: max", tiles.positions_per_tile_max),
            (f"edges in tiles with >= {tiles.block} positions", tiles.edges_in_dense_tiles),
        ]))
