"""`gnnio convert`: an edge list file into a cached gnnio graph (.h5)."""

from __future__ import annotations

import click

from gnnio_cli.cli import output
from gnnio_cli.graph.convert import STAGES, ConversionSummary, ConvertOptions, convert_file
from gnnio_cli.graph.io import FORMATS


def render(summary: ConversionSummary) -> None:
    if summary.cached:
        output.note(f"reusing {summary.output}: built from the same input bytes with the same options (--force rebuilds)")
    rows = [
        ("output", summary.output),
        ("format", summary.format),
        ("nodes", summary.nodes),
        ("edges", summary.edges),
        ("directed", not summary.undirected),
        ("entries read", summary.entries_read),
        ("duplicates removed", summary.duplicates_removed),
        ("self-loops removed", summary.self_loops_removed),
        ("ids relabelled", summary.relabelled),
        ("weighted", summary.weighted),
        ("time (s)", round(summary.seconds, 3)),
    ]
    output.stdout.print(output.key_value_table(f"gnnio convert {summary.input}", rows))


@click.command("convert")
@click.argument("input_path", metavar="INPUT")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), help="Output .h5 (default: INPUT's name with .h5).")
@click.option("--format", "input_format", type=click.Choice(FORMATS), help="Input format (default: from the content, else the name).")
@click.option("--undirected", is_flag=True, help="Add the reverse of every edge.")
@click.option("--self-loops", type=click.Choice(["keep", "drop"]), default="keep", show_default=True)
@click.option("--num-nodes", type=click.IntRange(min=1), help="Node count (ids must be below it; isolated nodes past the largest id).")
@click.option("--weights", type=click.Choice(["keep", "drop"]), default="keep", show_default=True,
              help="What to do with a weight column (e.g. timestamps you do not want): drop it, and the graph is unweighted.")
@click.option("--force", is_flag=True,
              help="Rebuild even if OUT is a cache of the same input and options; replace OUT even if it is not a gnnio graph.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--json", "as_json", is_flag=True, help="Write the summary as JSON to stdout (and nothing else).")
def command(input_path, output_path, input_format, undirected, self_loops, num_nodes, weights, force, quiet, as_json):
    """Convert INPUT (edge list, CSV/TSV, .mtx, .npz; .gz ok; '-' = stdin) to a gnnio .h5.

    The format comes from the content (a Matrix Market banner, a zip), then
    the name. A third column is the edge's weight (stored in /edge_weight).
    Duplicate edges are always removed; ids that are not 0..N-1 are renumbered
    and the originals kept in /node_ids.
    """
    options = ConvertOptions(format=input_format, undirected=undirected, self_loops=self_loops, num_nodes=num_nodes,
                             weights=weights)
    with output.DelayedProgress(STAGES, enabled=not quiet) as progress:
        summary = convert_file(input_path, output_path, options, force=force, progress=progress)
    if as_json:
        output.emit_json(summary)
    elif not quiet:
        render(summary)
