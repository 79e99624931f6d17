"""Where graphs come from by name: a `.h5` path, a standard synthetic graph, or the bundled sample.

`gnnio run` and `gnnio compare` accept any of these for `--graph`:

- a path to a gnnio `.h5` file (made by `gnnio convert` or `gnnio generate`);
- a standard graph name from DESIGN.md, generated in-process with a fixed
  seed: `rmat20`, `uniform20`, `grid1024` (and smaller `rmatN`, `uniformN`,
  `gridN`);
- nothing: the bundled Cora citation graph in `sample_graphs/`.

Any of these followed by `+shuffled` (e.g. `grid1024+shuffled`) is the same
graph with its node ids randomly permuted (seed 0): the starting point for
measuring what a reordering recovers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.graph import Graph

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "sample_graphs"
SAMPLE_GRAPH = SAMPLE_DIR / "cora.edges.txt.gz"
SHUFFLED = "+shuffled"


@dataclass
class NamedGraph:
    name: str
    graph: Graph
    origin: str


def resolve(spec: Optional[str]) -> NamedGraph:
    """The graph `spec` names (see module docstring); errors name what was asked for."""
    if spec is not None and spec.endswith(SHUFFLED):
        named = resolve(spec[: -len(SHUFFLED)] or None)
        from gnnio_cli.graph.locality import random_order

        shuffled = named.graph.to("cpu").permute(random_order(named.graph.num_nodes, seed=0))
        return NamedGraph(f"{named.name}{SHUFFLED}", shuffled, named.origin)
    if spec is None or spec == "sample":
        return _sample()
    path = Path(spec)
    if path.suffix == ".h5" or path.exists():
        from gnnio_cli.graph import store

        return NamedGraph(path.stem, store.load(path).graph, str(path))
    return _generated(spec)


@functools.lru_cache(maxsize=4)
def _generated(spec: str) -> NamedGraph:
    """A standard graph, generated once per process (Graphs are immutable, so sharing is safe)."""
    from gnnio_cli.graph import generate

    try:
        stored = generate.standard_graph(spec)
    except GnnioError as err:
        raise GnnioError(f"--graph {spec}: no such file, and {err}") from None
    return NamedGraph(spec, stored.graph, f"generated ({stored.params})")


def _sample() -> NamedGraph:
    if not SAMPLE_GRAPH.exists():
        raise GnnioError(
            f"the bundled sample graph {SAMPLE_GRAPH} is missing (gnnio installed without its sample_graphs folder?); pass --graph"
        )
    from gnnio_cli.graph import convert, io

    stored, _ = convert.convert_edges(io.read_edges(str(SAMPLE_GRAPH)), convert.ConvertOptions())
    return NamedGraph("cora (bundled sample)", stored.graph, str(SAMPLE_GRAPH))
