"""Edge list -> gnnio graph: the work behind `gnnio convert`.

Steps, in order (each reported to an optional `progress` callback by name):

1. read: the input's bytes (gzip undone), hashed for the cache key;
2. parse: an :class:`~gnnio_cli.graph.io.EdgeList` (int64 src/dst);
3. check/relabel: ids are kept when they fit ``0..N-1`` for a declared N
   (``--num-nodes``, else a SNAP ``# Nodes:`` line, Matrix Market size, npz
   shape) or when every id in ``0..max`` occurs; otherwise they are renumbered
   ``0..N-1`` in increasing order of the original id, which is kept as
   ``node_ids``. A ``# Nodes: N`` header that the ids contradict (ids past
   N - 1, and not exactly N distinct ones to renumber) is an error, never
   ignored. Relabelling sees every id in the file, self-loops included,
   so a node whose only edge is a dropped loop stays as an isolated node;
4. self-loops dropped on request, reverse edges added for ``undirected``
   and for symmetric Matrix Market files (self-loops are not doubled; a
   reversed edge keeps its weight, negated for skew-symmetric files),
   duplicates removed (always), each counted. Duplicates of a weighted edge
   must agree on the weight: two different weights for one edge are an
   error, not a guess (``weights="drop"`` reads the graph unweighted);
5. build: CSR by target and CSC by source; the stored edge order (``eid``) is
   the deduplicated list grouped by target, in input order within a target
   (:func:`simple_graph`); weights follow as ``edge_weight`` by edge id;
6. write: the `.h5` file, atomically.

An existing output is replaced only when it is a gnnio graph (or with
``force``); it is reused instead when it is, untouched, the conversion of the
same input bytes with the same options (see :func:`store.reusable_conversion`).
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional

import numba
import numpy as np
import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import files, io, store
from gnnio_cli.graph.build import deduplicate_csr, drop_self_loops, positions, transpose
from gnnio_cli.graph.graph import Graph, index_dtype

SELF_LOOP_CHOICES = ("keep", "drop")
WEIGHT_CHOICES = ("keep", "drop")
STAGES = ("read", "parse", "relabel", "build", "write")

# Relabel through a dense old->new table while the largest id is at most this
# many times the number of edge endpoints; beyond, through a sort (np.unique).
_DENSE_TABLE_FACTOR = 4
# Building a graph holds at least this much per node (both indptrs, degrees,
# their on-disk copies) and per edge (ids, CSR and CSC, edge ids).
_BYTES_PER_NODE = 40
_BYTES_PER_EDGE = 48


@dataclass(frozen=True)
class ConvertOptions:
    """How to turn an edge list into a graph; recorded in the .h5 as `params`."""

    format: Optional[str] = None
    undirected: bool = False
    self_loops: str = "keep"
    num_nodes: Optional[int] = None
    weights: str = "keep"

    def __post_init__(self):
        if self.self_loops not in SELF_LOOP_CHOICES:
            raise GnnioError(f"--self-loops: expected keep or drop, got {self.self_loops!r}")
        if self.weights not in WEIGHT_CHOICES:
            raise GnnioError(f"--weights: expected keep or drop, got {self.weights!r}")
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
    weighted: bool
    cached: bool
    seconds: float

    def record(self) -> dict:
        """What the conversion did, independent of where and when: kept in the .h5 so a cache hit reports it too."""
        return {key: value for key, value in asdict(self).items() if key not in _RUN_FIELDS}


# Fields of a ConversionSummary that describe one run, not the conversion.
_RUN_FIELDS = ("input", "output", "cached", "seconds")


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
    num_nodes, original = _relabel(src, dst, largest)
    if declared is not None and num_nodes != declared and edges.declared_by:
        raise GnnioError(
            f"{edges.name}: {edges.declared_by} declares {declared} nodes, but the edges hold {num_nodes} distinct ids "
            f"up to {largest}; correct the header, or give the node count with --num-nodes"
        )
    return num_nodes, original


def _relabel(src: np.ndarray, dst: np.ndarray, largest: int) -> tuple[int, Optional[np.ndarray]]:
    """Renumber the ids of src/dst in place to 0..N-1 in increasing order when they leave gaps.

    Returns (N, original ids int64 [N], or None when the ids were 0..largest already)."""
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


def check_memory(num_nodes: int, num_edges: int, what: str) -> None:
    """Refuse, in one line naming `what`, a graph that cannot fit in this machine's memory at all."""
    needed = _BYTES_PER_NODE * num_nodes + _BYTES_PER_EDGE * num_edges
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not knowable here: let the allocation decide
        return
    if needed > total:
        raise GnnioError(
            f"{what}: a graph of {num_nodes:,} nodes and {num_edges:,} edges needs at least {needed / 2**30:,.1f} GiB "
            f"of memory; this machine has {total / 2**30:,.1f} GiB"
        )


def _size_origin(edges: io.EdgeList, options: ConvertOptions) -> str:
    """Who set the node count, for messages: the option, the file's declaration, or the ids."""
    if options.num_nodes is not None:
        return f"--num-nodes {options.num_nodes}"
    if edges.declared_num_nodes is not None:
        return f"{edges.name} (declared size {edges.declared_num_nodes:,})"
    return edges.name


def merge_weighted_duplicates(
    src: np.ndarray, dst: np.ndarray, weights: np.ndarray, name: str, node_ids: Optional[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The distinct (src, dst) pairs in order of first occurrence, with their weights, and how many repeats were dropped.

    Repeats of a pair must carry the same weight; two different weights for
    one edge raise a GnnioError naming the edge (original ids) and both weights.
    """
    order = np.lexsort((src, dst))  # stable: within a pair, input order
    sorted_src, sorted_dst, sorted_weights = src[order], dst[order], weights[order]
    repeat = (sorted_src[1:] == sorted_src[:-1]) & (sorted_dst[1:] == sorted_dst[:-1])
    conflict = np.flatnonzero(repeat & (sorted_weights[1:] != sorted_weights[:-1]))
    if conflict.size:
        at = int(conflict[0])
        source, target = int(sorted_src[at]), int(sorted_dst[at])
        if node_ids is not None:
            source, target = int(node_ids[source]), int(node_ids[target])
        raise GnnioError(
            f"{name}: edge {source} -> {target} appears with weights {sorted_weights[at]:g} and "
            f"{sorted_weights[at + 1]:g}; combine repeated edges into one, or drop the weights with --weights drop"
        )
    first = order[np.concatenate(([True], ~repeat))] if src.size else order
    first.sort()
    return src[first], dst[first], weights[first], int(src.size - first.size)


def convert_edges(edges: io.EdgeList, options: ConvertOptions, progress: Progress = None):
    """Build the graph of `edges` under `options` (edges' arrays are modified).

    Returns (StoredGraph, ConversionSummary) with output None and seconds 0;
    the caller fills in those.
    """
    entries = edges.num_edges
    _report(progress, "relabel")
    num_nodes, original_ids = assign_node_ids(edges, options.num_nodes)
    mirrored = options.undirected or edges.symmetric
    check_memory(num_nodes, entries * (2 if mirrored else 1), _size_origin(edges, options))
    src, dst, weights = edges.src, edges.dst, edges.weights if options.weights == "keep" else None
    edges.src = edges.dst = edges.weights = None  # the arrays are consumed here; let them go as soon as possible
    self_loops_removed = 0
    if options.self_loops == "drop" and weights is None:
        kept = drop_self_loops(src, dst)
        self_loops_removed = src.size - kept
        src, dst = src[:kept], dst[:kept]
    elif options.self_loops == "drop":
        kept = src != dst
        self_loops_removed = int(src.size - np.count_nonzero(kept))
        src, dst, weights = src[kept], dst[kept], weights[kept]
    if mirrored:
        if weights is not None:
            weights = io.mirror_weights(src, dst, weights, negate=edges.skew)
        src, dst = io.mirror(src, dst)
    _report(progress, "build")
    edge_weight, duplicates = None, 0
    if weights is not None:
        src, dst, weights, duplicates = merge_weighted_duplicates(src, dst, weights, edges.name, original_ids)
        edge_weight = weights[np.argsort(dst, kind="stable")]  # edge ids number the edges grouped by target
    graph, repeats = simple_graph(src, dst, num_nodes, node_ids=original_ids)
    duplicates += repeats
    del src, dst
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
        undirected=mirrored,
        weighted=edge_weight is not None,
        cached=False,
        seconds=0.0,
    )
    stored = store.StoredGraph(
        graph=graph,
        directed=not mirrored,
        source=edges.name,
        source_sha256=edges.sha256,
        params=options.params(),
        edge_weight=edge_weight,
        conversion=summary.record(),
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


def _reused(input_path: str, output: Path, source_sha256: str, params: dict, started: float) -> Optional[ConversionSummary]:
    """The summary of `output` if it can be reused for this conversion (see store.reusable_conversion), else None."""
    header = store.reusable_conversion(output, source_sha256, params)
    if header is None or set(header.conversion) != {f.name for f in fields(ConversionSummary)} - set(_RUN_FIELDS):
        return None
    return ConversionSummary(
        input=input_path, output=str(output), cached=True, seconds=time.perf_counter() - started, **header.conversion
    )


def convert_file(
    input_path: str,
    output: Optional[str | Path] = None,
    options: ConvertOptions = ConvertOptions(),
    force: bool = False,
    progress: Progress = None,
) -> ConversionSummary:
    """Convert the edge list at `input_path` ("-": stdin) into a gnnio `.h5`.

    output: default `<input stem>.h5` beside the input. An existing `output`
    that is not a gnnio graph is replaced only with `force`. When `output`
    is, untouched, the conversion of the same source bytes (sha256) with the
    same options, it is reused (summary.cached, the same counts as when it was
    made) unless `force`. The write is atomic: on any failure the old file
    (or none) stays.
    """
    started = time.perf_counter()
    from_stdin = input_path == "-"
    if not from_stdin:
        io.check_input_file(input_path)
    option = "-o" if output is not None else "output"
    output = Path(output) if output is not None else default_output(input_path)
    if not from_stdin and Path(input_path).resolve() == output.resolve():
        raise GnnioError(f"{output}: the output would overwrite the input; choose another -o")
    files.check_destination(output, option, store.is_gnnio_graph, "a gnnio graph", force=force)
    params = options.params()
    may_reuse = not force and output.exists()
    _report(progress, "read")
    digest = None
    if may_reuse and not from_stdin:
        digest = store.file_sha256(input_path)
        if reused := _reused(input_path, output, digest, params, started):
            return reused
    content = io.read_bytes(input_path)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Hash while parsing: hashlib and the numba parser both release the GIL.
        if digest is None:
            hashing = pool.submit(_sha256, content.raw) if content.raw is not None else pool.submit(store.file_sha256, input_path)
            if may_reuse:  # stdin: the bytes had to be read before the cache could be checked
                digest = hashing.result()
                if reused := _reused(input_path, output, digest, params, started):
                    return reused
        _report(progress, "parse")
        edges = io.read_edges(input_path, options.format, content=content)
        del content
        edges.sha256 = digest or hashing.result()
    name, entries = edges.name, edges.num_edges
    try:
        stored, summary = convert_edges(edges, options, progress)
    except MemoryError:
        raise GnnioError(f"{name}: not enough memory to build the graph of its {entries:,} edges") from None
    _report(progress, "write")
    store.save(stored, output)
    summary.output = str(output)
    summary.seconds = time.perf_counter() - started
    return summary
