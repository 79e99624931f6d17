"""`gnnio partition`: split a stored graph's rows across ranks and store the parts in the file."""

from __future__ import annotations

from pathlib import Path

import click

from gnnio_cli.bench.workloads import DTYPES
from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, stdout, table

PART_COLUMNS = ["rank", "nodes", "edges", "edges / mean", "halo nodes", "rows sent", "bytes received", "bytes sent"]


@click.command("partition")
@click.argument("graph_path", metavar="GRAPH.h5", type=click.Path(path_type=Path))
@click.option("--parts", required=True, type=int, help="Number of parts (ranks).")
@click.option("--order", default="none", show_default=True,
              help="Node order applied before cutting, to shrink the halo: none or a reorder method (rcm, rabbit, ...).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the order's tie-breaks.")
@click.option("--features", default=128, show_default=True, type=click.IntRange(1),
              help="Feature width for the bytes each rank exchanges per layer.")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="fp32", show_default=True)
@click.option("--force", is_flag=True, help="Rebuild even when a fresh partition is stored.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(graph_path, parts, order, seed, features, dtype, force, as_json):
    """Split GRAPH.h5's target rows into --parts contiguous blocks balanced by edges.

    Stores each part's local CSR, halo and exchange plan under /partition/<parts>
    in GRAPH.h5 (atomically). A stored partition of the same graph and order is
    reused; one of a graph that has changed since, or of another order, is
    rebuilt. Prints each rank's nodes, edges, halo, and the bytes it receives
    and sends when a layer exchanges a [nodes, --features] tensor (backward
    moves as much again).
    """
    from gnnio_cli.distributed.partition import ensure_partition, summarize

    with DelayedProgress((f"partitioning {graph_path}",)):
        partition, action = ensure_partition(graph_path, parts, order=order, seed=seed, rebuild=force)
    rows = summarize(partition, features, DTYPES[dtype].itemsize)
    halo = sum(row.halo for row in rows)
    balance = max((row.edge_share for row in rows), default=1.0)
    if as_json:
        emit_json({"graph": str(graph_path), "parts": parts, "order": order, "action": action,
                   "num_nodes": partition.num_nodes, "num_edges": partition.num_edges, "halo_nodes": halo,
                   "max_edge_share": balance, "seconds": partition.seconds, "features": features, "dtype": dtype,
                   "ranks": rows})
        return
    stdout.print(key_value_table(f"gnnio partition: {graph_path} into {parts}", [
        ("partition", f"{action} (/partition/{parts})"),
        ("order", order),
        ("nodes", partition.num_nodes),
        ("edges", partition.num_edges),
        ("halo nodes, all ranks", halo),
        ("edge balance (max / mean)", balance),
        ("computed in (s)", partition.seconds),
    ]))
    stdout.print(table(f"Per rank (bytes per exchange of {features} {dtype} features per node)", PART_COLUMNS, [
        [row.rank, row.nodes, row.edges, row.edge_share, row.halo, row.sent_rows, row.bytes_received, row.bytes_sent]
        for row in rows
    ]))
