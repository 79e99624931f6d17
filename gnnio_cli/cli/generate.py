"""`gnnio generate rmat|uniform|grid`: synthetic graphs, including the standard
ones of the benchmarks (rmat20, uniform20, grid1024)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional

import click

from gnnio_cli.cli import output
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import generate as generators
from gnnio_cli.graph import store
from gnnio_cli.graph.files import atomic_path, check_destination
from gnnio_cli.graph.io import is_gnnio_edge_list, write_edge_list

STAGES = ("generate", "write")

_COMMON_OPTIONS = (
    click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), help="Output .h5 (default: <name>.h5, e.g. rmat20.h5)."),
    click.option("--write-edges", type=click.Path(dir_okay=False), help="Also write the edges as a SNAP text edge list (.gz compresses)."),
    click.option("--force", is_flag=True, help="Replace the outputs even if they are not files gnnio wrote."),
    click.option("--quiet", is_flag=True, help="Print nothing but errors."),
    click.option("--json", "as_json", is_flag=True, help="Write the summary as JSON to stdout (and nothing else)."),
)


def _common_options(func):
    """-o, --write-edges, --force, --quiet, --json: shared by every generator."""
    for option in reversed(_COMMON_OPTIONS):
        func = option(func)
    return func


def _destinations(name: str, output_path, write_edges, force: bool) -> tuple[Path, Optional[Path]]:
    """Both outputs checked before any work: writable, and replaceable unless --force."""
    output_file = check_destination(output_path or f"{name}.h5", "-o" if output_path else "output", store.is_gnnio_graph,
                                    "a gnnio graph", force)
    edges_file = None
    if write_edges:
        if Path(write_edges).resolve() == output_file.resolve():
            raise GnnioError(f"--write-edges {write_edges}: the same file as the graph's output; choose another name")
        edges_file = check_destination(write_edges, "--write-edges", is_gnnio_edge_list, "an edge list written by gnnio",
                                       force)
    return output_file, edges_file


def _generate(name: str, make: Callable[[], generators.GeneratedGraph], output_path, write_edges, force, quiet,
              as_json) -> None:
    """Check the outputs, generate, write the graph (and edge list) atomically: both files or neither."""
    output_file, edges_file = _destinations(name, output_path, write_edges, force)
    with output.DelayedProgress(STAGES, enabled=not quiet) as progress:
        generated = make()
        progress("write")
        started = time.perf_counter()
        graph = generated.stored.graph
        with ExitStack() as stack:
            if edges_file is not None:  # committed after the graph, so a failure leaves neither
                edges_tmp = stack.enter_context(atomic_path(edges_file, "the edge list"))
                edge_index = graph.edge_index().numpy()
                write_edge_list(edges_tmp, edge_index[0], edge_index[1], graph.num_nodes, title=generated.name,
                                compress=edges_file.name.endswith(".gz"))
            store.save(generated.stored, output_file)
    summary = {
        "name": generated.name,
        "output": str(output_file),
        "edges_file": write_edges,
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "max_in_degree": int(graph.in_degree.max()) if graph.num_nodes else 0,
        "max_out_degree": int(graph.out_degree.max()) if graph.num_nodes else 0,
        "duplicates_removed": generated.duplicates_removed,
        "self_loops_removed": generated.self_loops_removed,
        "params": generated.params,
        "generate_seconds": round(generated.seconds, 3),
        "write_seconds": round(time.perf_counter() - started, 3),
    }
    if as_json:
        output.emit_json(summary)
    elif not quiet:
        rows = [(key.replace("_", " "), value) for key, value in summary.items() if key != "params" and value is not None]
        output.stdout.print(output.key_value_table(f"gnnio generate {generated.name}", rows))


@click.group("generate")
def command():
    """Generate a synthetic graph into an .h5 file.

    The standard benchmark graphs: `gnnio generate rmat --scale 20` (rmat20),
    `gnnio generate uniform --scale 20` (uniform20),
    `gnnio generate grid --rows 1024 --cols 1024` (grid1024).
    """


@command.command("rmat")
@click.option("--scale", type=int, required=True, help="2^scale nodes.")
@click.option("--edge-factor", type=click.IntRange(min=1), default=16, show_default=True, help="Edges drawn per node.")
@click.option("-a", "a", type=float, default=0.57, show_default=True, help="Probability of the top-left quadrant.")
@click.option("-b", "b", type=float, default=0.19, show_default=True, help="Top-right (row bit 0, column bit 1).")
@click.option("-c", "c", type=float, default=0.19, show_default=True, help="Bottom-left; bottom-right gets 1-a-b-c.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@_common_options
def rmat_command(scale, edge_factor, a, b, c, seed, output_path, write_edges, force, quiet, as_json):
    """R-MAT graph: skewed degrees; ids permuted; self-loops and duplicates removed."""
    _generate(generators.rmat_name(scale),
              lambda: generators.rmat(scale, edge_factor=edge_factor, a=a, b=b, c=c, seed=seed),
              output_path, write_edges, force, quiet, as_json)


@command.command("uniform")
@click.option("--scale", type=int, required=True, help="2^scale nodes.")
@click.option("--degree", type=int, default=16, show_default=True, help="In-edges per node, from distinct random sources.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@_common_options
def uniform_command(scale, degree, seed, output_path, write_edges, force, quiet, as_json):
    """Every node gets exactly DEGREE in-edges from distinct uniformly random other nodes."""
    _generate(generators.uniform_name(scale), lambda: generators.uniform(scale, degree=degree, seed=seed),
              output_path, write_edges, force, quiet, as_json)


@command.command("grid")
@click.option("--rows", type=int, required=True)
@click.option("--cols", type=int, required=True)
@_common_options
def grid_command(rows, cols, output_path, write_edges, force, quiet, as_json):
    """ROWS x COLS 4-neighbour grid, both directions, node id = row * COLS + col."""
    _generate(generators.grid_name(rows, cols), lambda: generators.grid(rows, cols),
              output_path, write_edges, force, quiet, as_json)
