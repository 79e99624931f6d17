"""Edge list -> gnnio graph: the work behind `gnnio convert`.

Steps, in order (each reported to an optional `progress` callback by name):

1. read: the input's bytes (gzip undone), hashed for the cache key;
2. parse: an :class:`~gnnio_cli.graph.io.EdgeList` (int64 src/dst);
3. check/relabel: ids are kept when they fit ``0..N-1`` for a declared N
   (``--num-nodes``, else a SNAP ``# Nodes:`` line, Matrix Market size, npz
   shape) or when every id in ``0..max`` occurs; otherwise they are renumbered
   ``0..N-1`` in increasing order of the original id, which is kept as
   ``node_ids``. Relabelling sees every id in the file, self-loops included,
   so a node whose only edge is a dropped loop stays as an isolated node;
4. self-loops dropped on request, reverse edges added for ``undirected``
   and for symmetric Matrix Market files (self-loops are not doubled),
   duplicates removed (always), each counted;
5. build: CSR by target and CSC by source; the stored edge order (``eid``) is
   the deduplicated list grouped by target, in input order within a target
   (:func:`simple_graph`);
6. write: the `.h5` file, atomically.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numba
import numpy as np
import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import io, store
from gnnio_cli.graph.build import deduplicate_csr, drop_self_loops, positions, transpose
from gnnio_cli.graph.graph import Graph, index_dtype

SELF_LOOP_CHOICES = ("keep", "drop")
STAGES = ("read", "parse", "relabel", "build", "write")

# Relabel through a dense old->new table while the largest id is at most this
# many times the number of edge endpoints; beyond, through a sort (np.unique).
_DENSE_TABLE_FACTOR = 4


@dataclass(frozen=True)
class ConvertOptions:
    """How to turn an edge list into a graph; recorded in the .h5 as `params`."""

    format: Optional[str] = None
    undirected: bool = False
    self_loops: str = "keep"
    num_nodes: Optional[int] = None

    def __post_init__(self):
        if self.self_loops not in SELF_LOOP_CHOICES:
            raise GnnioError(f"--self-loops: expected keep or drop, got {self.self_loops!r}")
        if self.num_nodes is not None and self.num_nodes < 1:
            raise GnnioError(f"--num-nodes: must be at least 1, got {self.num_nodes}")
        if self.format is not None and self.format not in io.FORMATS:
            raise GnnioError(f"--format: unknown format {self.format!r}; choose from {', '.join(io.FORMATS)}")

    def params(self) -> dict:
        return asdict(self)


@dataclass
class ConversionSummary:
    """What a conversion did (also the `--json` record of `gnnio convert`)."""

    input: str
    output: Optional[str]
    format: str
    nodes: int
    edges: int
    entries_read: int
    duplicates_removed: int
    self_loops_removed: int
    relabelled: bool
    undirected: bool
    cached: bool
    seconds: float


Progress = Optional[Callable[[str], None]]


def _report(progress: Progress, stage: str) -> None:
    if progress is not None:
        progress(stage)


@numba.njit(cache=True, nogil=True)
def _mark_present(src, dst, present):
    for i in range(src.shape[0]):
        present[src[i]] = True
        present[dst[i]] = True


@numba.njit(cache=True, nogil=True, parallel=True)
def _map_ids(ids, new_id):
    for i in numba.prange(ids.shape[0]):
        ids[i] = new_id[ids[i]]


def _first_at_or_above(src: np.ndarray, dst: np.ndarray, limit: int) -> tuple[int, int]:
    """(edge position, id) of the first edge with an endpoint >= limit."""
    position = int(np.flatnonzero((src >= limit) | (dst >= limit))[0])
    return position, int(max(src[position], dst[position]))


def assign_node_ids(edges: io.EdgeList, num_nodes: Optional[int]) -> tuple[int, Optional[np.ndarray]]:
    """Decide the node count and relabel edges.src/dst in place if needed.

    Returns (number of nodes, original ids int64 [N] or None when ids are kept).
    `num_nodes` (the user's --num-nodes) is a hard bound: an id at or beyond it
    is an error naming the edge.
    """
    src, dst = edges.src, edges.dst
    largest = int(max(src.max(), dst.max()))
    if num_nodes is not None:
        if largest >= num_nodes:
            position, node = _first_at_or_above(src, dst, num_nodes)
            raise GnnioError(
                f"{edges.name}: edge {position + 1} has node id {node}, but --num-nodes is {num_nodes} (ids must be below it)"
            )
        return num_nodes, None
    declared = edges.declared_num_nodes
    if declared is not None and largest < declared:
        return declared, None
    if largest < _DENSE_TABLE_FACTOR * 2 * src.size:
        present = np.zeros(largest + 1, dtype=np.bool_)
        _mark_present(src, dst, present)
        original = np.flatnonzero(present)
        if original.size == largest + 1:
            return largest + 1, None
        new_id = np.zeros(largest + 1, dtype=np.int64)
        new_id[original] = np.arange(original.size, dtype=np.int64)
        _map_ids(src, new_id)
        _map_ids(dst, new_id)
        return int(original.size), original.astype(np.int64)
    original, inverse = np.unique(np.concatenate((src, dst)), return_inverse=True)
    src[:] = inverse[: src.size]
    dst[:] = inverse[src.size :]
    return int(original.size), original.astype(np.int64)


def simple_graph(src: np.ndarray, dst: np.ndarray, num_nodes: int, node_ids=None) -> tuple[Graph, int]:
    """The Graph of the distinct (src, dst) pairs, and how many repeats were dropped.

    src, dst: int64 [E] in [0, num_nodes), consumed: their memory is reused
    for the result. Edge ids number the distinct pairs grouped by target, in
    input order within a target, so the CSR is that list itself
    (eid = 0..E'-1) and the CSC its transpose.
    """
    np_index = np.int32 if index_dtype(num_nodes) == torch.int32 else np.int64
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    csr_indptr, csr_indices, duplicates = deduplicate_csr(src, dst, num_nodes, np_index)
    csc_indptr, csc_indices, csc_eid = transpose(csr_indptr, csr_indices, num_nodes, np_index, scratch=src, eid_out=dst)
    csr_eid = positions(csr_indices.shape[0], out=src)
    graph = Graph.from_compressed(
        (csr_indptr, csr_indices, csr_eid), (csc_indptr, csc_indices, csc_eid), num_nodes, num_nodes, node_ids
    )
    return graph, duplicates


def convert_edges(edges: io.EdgeList, options: ConvertOptions, progress: Progress = None):
    """Build the graph of `edges` under `options` (edges' arrays are modified).

    Returns (StoredGraph, ConversionSummary) with output None and seconds 0;
    the caller fills in those.
    """
    entries = edges.num_edges
    _report(progress, "relabel")
    num_nodes, original_ids = assign_node_ids(edges, options.num_nodes)
    src, dst = edges.src, edges.dst
    edges.src = edges.dst = None  # the arrays are consumed here; let them go as soon as possible
    self_loops_removed = 0
    if options.self_loops == "drop":
        kept = drop_self_loops(src, dst)
        self_loops_removed = src.size - kept
        src, dst = src[:kept], dst[:kept]
    if options.undirected or edges.symmetric:
        src, dst = io.mirror(src, dst)
    _report(progress, "build")
    graph, duplicates = simple_graph(src, dst, num_nodes, node_ids=original_ids)
    del src, dst
    stored = store.StoredGraph(
        graph=graph,
        directed=not (options.undirected or edges.symmetric),
        source=edges.name,
        source_sha256=edges.sha256,
        params=options.params(),
    )
    summary = ConversionSummary(
        input=edges.name,
        output=None,
        format=edges.format,
        nodes=num_nodes,
        edges=graph.num_edges,
        entries_read=entries,
        duplicates_removed=duplicates,
        self_loops_removed=self_loops_removed,
        relabelled=original_ids is not None,
        undirected=options.undirected or edges.symmetric,
        cached=False,
        seconds=0.0,
    )
    return stored, summary


def default_output(input_path: str) -> Path:
    """`graph.txt.gz` -> `graph.h5` beside the input."""
    if input_path == "-":
        raise GnnioError("reading standard input ('-') needs an output file: add -o OUT.h5")
    path = Path(input_path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    stem = Path(name).stem if Path(name).suffix else name
    return path.with_name(f"{stem}.h5")


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _cached_summary(input_path: str, output: Path, attrs: dict, seconds: float) -> ConversionSummary:
    params = attrs.get("params", {})
    return ConversionSummary(
        input=input_path,
        output=str(output),
        format=params.get("format") or "cached",
        nodes=int(attrs["num_nodes"]),
        edges=int(attrs["num_edges"]),
        entries_read=0,
        duplicates_removed=0,
        self_loops_removed=0,
        relabelled=False,
        undirected=not bool(attrs.get("directed", True)),
        cached=True,
        seconds=seconds,
    )


def convert_file(
    input_path: str,
    output: Optional[str | Path] = None,
    options: ConvertOptions = ConvertOptions(),
    force: bool = False,
    progress: Progress = None,
) -> ConversionSummary:
    """Convert the edge list at `input_path` ("-": stdin) into a gnnio `.h5`.

    output: default `<input stem>.h5` beside the input. When `output` already
    holds a graph of the same source bytes (sha256) and options, it is reused
    (summary.cached) unless `force`. The write is atomic: on any failure the
    old file (or none) stays.
    """
    started = time.perf_counter()
    output = Path(output) if output is not None else default_output(input_path)
    from_stdin = input_path == "-"
    if not from_stdin and Path(input_path).exists() and Path(input_path).resolve() == output.resolve():
        raise GnnioError(f"{output}: the output would overwrite the input; choose another -o")
    params = options.params()
    may_reuse = not force and output.exists()
    _report(progress, "read")
    digest = None
    if may_reuse and not from_stdin:
        digest = store.file_sha256(io.check_input_file(input_path))
        if attrs := store.matches_cache(output, digest, params):
            return _cached_summary(input_path, output, attrs, time.perf_counter() - started)
    content = io.read_bytes(input_path)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Hash while parsing: hashlib and the numba parser both release the GIL.
        if digest is None:
            hashing = pool.submit(_sha256, content.raw) if content.raw is not None else pool.submit(store.file_sha256, input_path)
            if may_reuse:  # stdin: the bytes had to be read before the cache could be checked
                digest = hashing.result()
                if attrs := store.matches_cache(output, digest, params):
                    return _cached_summary(input_path, output, attrs, time.perf_counter() - started)
        _report(progress, "parse")
        edges = io.read_edges(input_path, options.format, content=content)
        del content
        edges.sha256 = digest or hashing.result()
    stored, summary = convert_edges(edges, options, progress)
    _report(progress, "write")
    try:
        store.save(stored, output)
    except OSError as err:  # permissions, a full disk: say where, without a traceback
        raise GnnioError(f"{output}: could not write the graph: {err.strerror or err}") from err
    summary.output = str(output)
    summary.seconds = time.perf_counter() - started
    return summary
