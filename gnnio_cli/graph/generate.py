"""Synthetic graphs: R-MAT, uniform random in-edges, 2-D grids.

The standard benchmark graphs (docs/PERFORMANCE.md uses them) come from here, by name
(:func:`standard_graph`): ``rmat<S>`` (R-MAT scale S, edge factor 16,
a=0.57, b=c=0.19, ids randomly permuted, duplicates and self-loops removed),
``uniform<S>`` (2^S nodes, each with 16 distinct uniformly random in-edges)
and ``grid<R>`` (an R x R 4-neighbour grid).

Random draws come from a counter-based generator (SplitMix64 of the seed and
the edge's index), so every edge is drawn independently in parallel and the
result depends only on the seed, never on the thread count.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numba
import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.build import drop_self_loops
from gnnio_cli.graph.convert import check_memory, simple_graph
from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.store import StoredGraph

RMAT_DEFAULTS = {"edge_factor": 16, "a": 0.57, "b": 0.19, "c": 0.19}
MAX_SCALE = 31

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True)
def _splitmix(state):
    """One SplitMix64 step: returns (next state, 64 random bits)."""
    state = state + _GOLDEN
    bits = state
    bits = (bits ^ (bits >> np.uint64(30))) * _MIX1
    bits = (bits ^ (bits >> np.uint64(27))) * _MIX2
    return state, bits ^ (bits >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _stream(seed, index):
    """The starting state of item `index`'s own random stream."""
    _, bits = _splitmix(np.uint64(seed) ^ (np.uint64(index) * _MIX2))
    return bits


# R-MAT descends the adjacency matrix LEVELS_PER_DRAW levels per random draw:
# the 4^k quadrant paths of k levels are sampled at once from an alias table,
# one 32-bit half of a 64-bit draw each (8 bits pick the bucket, 24 the
# threshold), instead of one comparison chain per level.
LEVELS_PER_DRAW = 4
_THRESHOLD_BITS = 24


@dataclass
class _PathTable:
    """Alias table over the 4^levels quadrant paths of `levels` R-MAT levels."""

    levels: int
    threshold: np.ndarray  # uint32 [4^levels]: keep the bucket's own path below this
    alias: np.ndarray  # int64 [4^levels]: the other path of the bucket
    row_bits: np.ndarray  # int64 [4^levels]: the path's row bits, first level highest
    col_bits: np.ndarray  # int64 [4^levels]


def _path_table(levels: int, a: float, b: float, c: float) -> _PathTable:
    """Quadrants 0..3 = (row, col) bits (0,0), (0,1), (1,0), (1,1) with
    probabilities a, b, c, 1-a-b-c; a path's index holds one quadrant per
    level in base 4, first level most significant. Vose's alias method."""
    quadrant = np.array([a, b, c, max(0.0, 1.0 - a - b - c)])
    probability = np.ones(1)
    for _ in range(levels):
        probability = np.outer(probability, quadrant).ravel()
    size = probability.size
    paths = np.arange(size)
    row_bits = np.zeros(size, dtype=np.int64)
    col_bits = np.zeros(size, dtype=np.int64)
    for level in range(levels):
        digit = (paths >> (2 * (levels - 1 - level))) & 3
        row_bits = (row_bits << 1) | (digit >> 1)
        col_bits = (col_bits << 1) | (digit & 1)
    scaled = probability * size
    threshold = np.ones(size)
    alias = paths.copy()
    small = [i for i in range(size) if scaled[i] < 1.0]
    large = [i for i in range(size) if scaled[i] >= 1.0]
    while small and large:
        lo, hi = small.pop(), large.pop()
        threshold[lo], alias[lo] = scaled[lo], hi
        scaled[hi] -= 1.0 - scaled[lo]
        (small if scaled[hi] < 1.0 else large).append(hi)
    full = 1 << _THRESHOLD_BITS
    return _PathTable(
        levels=levels,
        threshold=np.minimum(np.round(threshold * full), full).astype(np.uint32),
        alias=alias.astype(np.int64),
        row_bits=row_bits,
        col_bits=col_bits,
    )


@numba.njit(cache=True, nogil=True)
def _draw_path(half, threshold, alias):
    """Sample a path index from 32 random bits."""
    bucket = np.int64(half & np.uint64(threshold.shape[0] - 1))
    if (half >> np.uint64(8)) < threshold[bucket]:
        return bucket
    return alias[bucket]


@numba.njit(cache=True, nogil=True, inline="always")
def _permute_id(node, mask, shift, keys):
    """A keyed bijection of [0, mask] (mask = 2^scale - 1): xor with a key,
    multiply by an odd key, fold the high half into the low half, twice.
    Each step is invertible modulo 2^scale; no table, so no cache misses."""
    x = np.uint64(node)
    for round in range(2):
        x = ((x ^ keys[2 * round]) * keys[2 * round + 1]) & mask
        x ^= x >> shift
    return np.int64(x)


def _permutation_keys(seed: int) -> np.ndarray:
    """Four uint64 keys of _permute_id (multipliers odd) drawn from the seed."""
    keys = np.random.default_rng([seed, 0x5EED]).integers(0, 2**63, size=4, dtype=np.uint64)
    keys[1::2] |= np.uint64(1)
    return keys


@numba.njit(cache=True, nogil=True, parallel=True)
def _rmat_edges(full_groups, full, tail_levels, tail, seed, keys, src, dst):
    """Edge i: `full_groups` paths from the `full` table, then one from `tail`
    (when tail_levels > 0); row/column ids are then relabelled by
    _permute_id. Each table is (threshold, alias, row_bits, col_bits, levels)."""
    levels = full_groups * full[4] + tail_levels
    mask = np.uint64((1 << levels) - 1)
    shift = np.uint64(max(1, (levels + 1) // 2))
    draws = full_groups + (1 if tail_levels > 0 else 0)
    for edge in numba.prange(src.shape[0]):
        state = _stream(seed, edge)
        row = 0
        col = 0
        bits = np.uint64(0)
        for draw in range(draws):
            if draw % 2 == 0:
                state, bits = _splitmix(state)
                half = bits >> np.uint64(32)
            else:
                half = bits & np.uint64(0xFFFFFFFF)
            if draw < full_groups:
                path = _draw_path(half, full[0], full[1])
                row = (row << full[4]) | full[2][path]
                col = (col << full[4]) | full[3][path]
            else:
                path = _draw_path(half, tail[0], tail[1])
                row = (row << tail_levels) | tail[2][path]
                col = (col << tail_levels) | tail[3][path]
        src[edge] = _permute_id(row, mask, shift, keys)
        dst[edge] = _permute_id(col, mask, shift, keys)


@numba.njit(cache=True, nogil=True, parallel=True)
def _uniform_in_edges(num_nodes, degree, seed, src):
    """For target v, src[v*degree : (v+1)*degree] = `degree` distinct sources
    != v, uniform over the rest; a repeat or v itself is redrawn."""
    for target in numba.prange(num_nodes):
        state = _stream(seed, target)
        base = target * degree
        filled = 0
        while filled < degree:
            state, bits = _splitmix(state)
            candidate = ((bits >> np.uint64(32)) * np.uint64(num_nodes)) >> np.uint64(32)
            source = np.int64(candidate)
            fresh = source != target
            for k in range(filled):
                if src[base + k] == source:
                    fresh = False
                    break
            if fresh:
                src[base + filled] = source
                filled += 1


@dataclass
class GeneratedGraph:
    """A generated graph and what generating it removed."""

    name: str
    stored: StoredGraph
    duplicates_removed: int = 0
    self_loops_removed: int = 0
    seconds: float = 0.0
    params: dict = field(default_factory=dict)


def _check_scale(scale: int) -> None:
    if not 1 <= scale <= MAX_SCALE:
        raise GnnioError(f"--scale: must be in 1..{MAX_SCALE}, got {scale}")


def rmat_name(scale: int) -> str:
    return f"rmat{scale}"


def uniform_name(scale: int) -> str:
    return f"uniform{scale}"


def grid_name(rows: int, cols: int) -> str:
    return f"grid{rows}" if rows == cols else f"grid{rows}x{cols}"


def _stored(name: str, graph: Graph, params: dict, directed: bool) -> StoredGraph:
    return StoredGraph(graph=graph, directed=directed, source=f"gnnio generate {name}", params=params)


def rmat(scale: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19, c: float = 0.19, seed: int = 0) -> GeneratedGraph:
    """R-MAT graph on 2^scale nodes from edge_factor * 2^scale drawn edges.

    Node ids are permuted by a seeded pseudo-random bijection (so hubs are
    not clustered at id 0), then
    self-loops and duplicate edges are removed; isolated nodes are kept, so the
    graph has exactly 2^scale nodes. Edges come out grouped by target.
    """
    _check_scale(scale)
    if edge_factor < 1:
        raise GnnioError(f"--edge-factor: must be at least 1, got {edge_factor}")
    if min(a, b, c) < 0 or a + b + c > 1:
        raise GnnioError(f"rmat: need a, b, c >= 0 and a + b + c <= 1, got a={a}, b={b}, c={c}")
    num_nodes = 1 << scale
    num_drawn = edge_factor * num_nodes
    check_memory(num_nodes, num_drawn, rmat_name(scale))
    started = time.perf_counter()
    src = np.empty(num_drawn, dtype=np.int64)
    dst = np.empty(num_drawn, dtype=np.int64)
    full_groups, tail_levels = divmod(scale, LEVELS_PER_DRAW)
    tables = [_path_table(levels, a, b, c) for levels in (LEVELS_PER_DRAW, max(tail_levels, 1))]
    full, tail = ((t.threshold, t.alias, t.row_bits, t.col_bits, t.levels) for t in tables)
    _rmat_edges(full_groups, full, tail_levels, tail, seed, _permutation_keys(seed), src, dst)
    kept = drop_self_loops(src, dst)
    self_loops = num_drawn - kept
    graph, duplicates = simple_graph(src[:kept], dst[:kept], num_nodes)
    del src, dst
    params = {"generator": "rmat", "scale": scale, "edge_factor": edge_factor, "a": a, "b": b, "c": c, "seed": seed}
    name = rmat_name(scale)
    return GeneratedGraph(
        name=name,
        stored=_stored(name, graph, params, directed=True),
        duplicates_removed=duplicates,
        self_loops_removed=self_loops,
        seconds=time.perf_counter() - started,
        params=params,
    )


def uniform(scale: int, degree: int = 16, seed: int = 0) -> GeneratedGraph:
    """2^scale nodes, each with exactly `degree` in-edges from distinct sources
    drawn uniformly among the other nodes (self-loops and repeats are redrawn,
    so nothing is removed). Edges come out grouped by target."""
    _check_scale(scale)
    num_nodes = 1 << scale
    if not 1 <= degree < num_nodes:
        raise GnnioError(f"--degree: must be in 1..{num_nodes - 1} for 2^{scale} nodes, got {degree}")
    check_memory(num_nodes, num_nodes * degree, uniform_name(scale))
    started = time.perf_counter()
    src = np.empty(num_nodes * degree, dtype=np.int64)
    _uniform_in_edges(num_nodes, degree, seed, src)
    dst = np.repeat(np.arange(num_nodes, dtype=np.int64), degree)
    params = {"generator": "uniform", "scale": scale, "degree": degree, "seed": seed}
    graph = Graph.from_arrays(src, dst, num_nodes, num_nodes)
    name = uniform_name(scale)
    return GeneratedGraph(
        name=name,
        stored=_stored(name, graph, params, directed=True),
        seconds=time.perf_counter() - started,
        params=params,
    )


def grid(rows: int, cols: int) -> GeneratedGraph:
    """rows x cols 4-neighbour grid; node (r, c) has id r * cols + c; every
    neighbour pair is linked in both directions: 2 * (rows*(cols-1) + (rows-1)*cols) edges."""
    if rows < 1 or cols < 1:
        raise GnnioError(f"grid: --rows and --cols must be at least 1, got {rows} x {cols}")
    check_memory(rows * cols, 4 * rows * cols, grid_name(rows, cols))
    started = time.perf_counter()
    ids = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    left, right = ids[:, :-1].ravel(), ids[:, 1:].ravel()
    up, down = ids[:-1, :].ravel(), ids[1:, :].ravel()
    src = np.concatenate((left, right, up, down))
    dst = np.concatenate((right, left, down, up))
    params = {"generator": "grid", "rows": rows, "cols": cols}
    graph = Graph.from_arrays(src, dst, rows * cols, rows * cols)
    name = grid_name(rows, cols)
    return GeneratedGraph(
        name=name,
        stored=_stored(name, graph, params, directed=False),
        seconds=time.perf_counter() - started,
        params=params,
    )


_STANDARD = re.compile(r"^(rmat|uniform|grid)(\d+)$")


def is_standard_name(name: str) -> bool:
    """Whether `name` has the form of a standard graph's name (rmat<S>, uniform<S>, grid<R>), valid size or not."""
    return _STANDARD.match(name) is not None


def generate_standard(name: str, seed: int = 0) -> GeneratedGraph:
    """The generated graph called `name`: rmat<S>, uniform<S> or grid<R> (see module doc)."""
    match = _STANDARD.match(name)
    if not match:
        raise GnnioError(f"unknown standard graph {name!r}: expected rmat<scale>, uniform<scale> or grid<side>, e.g. rmat20")
    kind, size = match.group(1), int(match.group(2))
    if kind == "grid":
        if size < 1:
            raise GnnioError(f"{name}: grid<side> needs a side of at least 1")
        return grid(size, size)
    if not 1 <= size <= MAX_SCALE:
        raise GnnioError(f"{name}: {kind}<scale> needs a scale in 1..{MAX_SCALE}, got {size}")
    if kind == "rmat":
        return rmat(size, seed=seed)
    return uniform(size, degree=16, seed=seed)


def standard_graph(name: str, seed: int = 0) -> StoredGraph:
    """StoredGraph of a standard graph: 'rmat20', 'uniform20', 'grid1024', 'rmat12', ..."""
    return generate_standard(name, seed=seed).stored
