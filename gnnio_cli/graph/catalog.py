"""Where graphs come from by name: a `.h5` path, a standard synthetic graph, or the bundled sample.

`gnnio run` and `gnnio compare` accept any of these for `--graph`:

- a path to a gnnio `.h5` file (made by `gnnio convert` or `gnnio generate`);
- a standard benchmark graph name, generated in-process with a fixed
  seed: `rmat20`, `uniform20`, `grid1024` (and smaller `rmatN`, `uniformN`,
  `gridN`);
- nothing: the bundled Cora citation graph in `sample_graphs/`.

Any of these can be followed by modifiers, applied left to right:

- `+shuffled` (e.g. `grid1024+shuffled`): node ids randomly permuted (seed 0),
  the starting point for measuring what a reordering recovers;
- `+hubK` (e.g. `rmat20+hub2000000`): one more node, the target of K edges
  from random sources (repeats allowed, so K may exceed the node count): a
  super node;
- `+spreadK`: one more (isolated) node and K more edges between random nodes:
  the same node and edge counts as `+hubK` without the super node.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.graph import Graph
from gnnio_cli.resources import SAMPLE_GRAPHS_DIR

SAMPLE_GRAPH = SAMPLE_GRAPHS_DIR / "cora.edges.txt.gz"
MODIFIER = re.compile(r"shuffled|(hub|spread)(\d+)")


@dataclass
class NamedGraph:
    name: str
    graph: Graph
    origin: str


def resolve(spec: Optional[str]) -> NamedGraph:
    """The graph `spec` names (see module docstring); errors name what was asked for."""
    if spec is not None and "+" in spec and not Path(spec).exists():
        base, modifier = spec.rsplit("+", 1)
        named = resolve(base or None)
        return NamedGraph(f"{named.name}+{modifier}", _modified(named.graph, modifier, spec), named.origin)
    if spec is None or spec == "sample":
        return _sample()
    path = Path(spec)
    if path.suffix == ".h5" or path.exists():
        from gnnio_cli.graph import store

        return NamedGraph(path.stem, store.load(path).graph, str(path))
    return _generated(spec)


def _modified(graph: Graph, modifier: str, spec: str) -> Graph:
    """`graph` changed by one `+modifier` (see module docstring); seeded, so reproducible."""
    import numpy as np

    graph = graph.to("cpu")
    match = MODIFIER.fullmatch(modifier)
    if match is None:
        raise GnnioError(f"--graph {spec}: unknown modifier '+{modifier}'; use +shuffled, +hubK or +spreadK")
    if modifier == "shuffled":
        from gnnio_cli.graph.locality import random_order

        return graph.permute(random_order(graph.num_nodes, seed=0))
    kind, count = match.group(1), int(match.group(2))
    rng = np.random.default_rng(0)
    n = graph.num_nodes
    edges = graph.edge_index().numpy()
    sources = rng.integers(0, n, count)
    targets = np.full(count, n, dtype=np.int64) if kind == "hub" else rng.integers(0, n, count)
    src = np.concatenate([edges[0], sources])
    dst = np.concatenate([edges[1], targets])
    return Graph.from_arrays(src, dst, n + 1, n + 1)


@functools.lru_cache(maxsize=4)
def _generated(spec: str) -> NamedGraph:
    """A standard graph, generated once per process (Graphs are immutable, so sharing is safe)."""
    from gnnio_cli.graph import generate

    try:
        stored = generate.standard_graph(spec)
    except GnnioError as err:
        if generate.is_standard_name(spec):
            raise GnnioError(f"--graph {err}") from None
        raise GnnioError(f"--graph {spec}: no such file, and {err}") from None
    return NamedGraph(spec, stored.graph, f"generated ({stored.params})")


def _sample() -> NamedGraph:
    if not SAMPLE_GRAPH.exists():
        raise GnnioError(
            f"the bundled sample graph {SAMPLE_GRAPH} is missing (gnnio installed without its sample graphs? reinstall it); pass --graph"
        )
    from gnnio_cli.graph import convert, io

    stored, _ = convert.convert_edges(io.read_edges(str(SAMPLE_GRAPH)), convert.ConvertOptions())
    return NamedGraph("cora (bundled sample)", stored.graph, str(SAMPLE_GRAPH))
