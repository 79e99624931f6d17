"""Row partitions of a graph across ranks, and their store in the graph's `.h5` file.

A graph's target rows (after an optional node order that shrinks the halo) are
split into P contiguous blocks. Rank r owns the nodes of its block: their
features, their outputs, and every in-edge of its targets. Its part of the
graph is bipartite: targets are its own nodes (local ids 0..num_own-1),
sources are its own nodes (the same local ids) then its halo, the remote
nodes its edges read (local ids num_own.., sorted by node id, so grouped by
owner). Per part the partition keeps the local CSR, the original id of every
local edge, the halo, and the send plan of the halo exchange
(:mod:`gnnio_cli.distributed.exchange`).

Blocks are balanced by edges plus nodes (a row weighs its in-degree + 1: the
self-loop GCN and GAT add, and the row's own features and output), so a
block of isolated nodes is not free. Parts may be empty.

In the `.h5` file (written atomically; the rest of the file is kept)::

    /partition/<P>/                 attrs: order, seed, graph_sha256, seconds
    /partition/<P>/row_starts       int64 [P + 1], in the partition's node order
    /partition/<P>/new_to_old       int64 [N], the order (absent for the file's own order)
    /partition/<P>/<r>/{indptr, indices, edge_ids, halo, send_index, send_counts, recv_counts}

graph_sha256 digests the graph's structure: a partition of a graph that has
changed since is stale, and :func:`ensure_partition` rebuilds it.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import h5py
import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.files import atomic_path
from gnnio_cli.graph.reorder import METHODS, reorder
from gnnio_cli.graph.store import DIGEST_ATTR, content_digest, dataset_names, load, read_attrs, read_header

PART_ARRAYS = ("indptr", "indices", "edge_ids", "halo", "send_index", "send_counts", "recv_counts")
ORDERS = ("none", *METHODS)


@dataclass(frozen=True)
class Part:
    """One rank's share of a row-partitioned graph (node ids in the partition's order).

    row_start, row_end: the global ids of its own nodes, [row_start, row_end).
    indptr:      int64 [num_own + 1], CSR by local target.
    indices:     int64 [E_r], the local source of each edge (own: id - row_start; halo: num_own + position).
    edge_ids:    int64 [E_r], the original edge id of each local edge (local edge k is CSR slot k).
    halo:        int64 [num_halo], global ids of the remote sources, ascending (so grouped by owner).
    send_index:  int64, local ids of the own rows other ranks read, grouped by reader, in its halo order.
    send_counts, recv_counts: int64 [P], rows sent to / received from each rank.
    """

    row_start: int
    row_end: int
    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray
    halo: np.ndarray
    send_index: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray

    @property
    def num_own(self) -> int:
        return self.row_end - self.row_start

    @property
    def num_edges(self) -> int:
        return int(self.indices.size)


@dataclass(frozen=True)
class Partition:
    """A graph's rows split into P parts.

    row_starts: int64 [P + 1]; new_to_old: int64 [N] the node order the blocks are cut in (None: the
    graph's own order), so rank r owns the original nodes new_to_old[row_starts[r]:row_starts[r + 1]].
    order: the reordering method's name or "none"; graph_sha256: see :func:`structure_digest`.
    """

    num_nodes: int
    num_edges: int
    row_starts: np.ndarray
    new_to_old: Optional[np.ndarray]
    order: str
    seed: int
    graph_sha256: str
    seconds: float
    parts: tuple[Part, ...]

    @property
    def num_parts(self) -> int:
        return len(self.parts)

    def own_nodes(self, rank: int) -> np.ndarray:
        """int64: the original ids of the nodes rank `rank` owns, in its local order."""
        return own_nodes(self.row_starts, self.new_to_old, rank)


def own_nodes(row_starts: np.ndarray, new_to_old: Optional[np.ndarray], rank: int) -> np.ndarray:
    start, end = int(row_starts[rank]), int(row_starts[rank + 1])
    if new_to_old is None:
        return np.arange(start, end, dtype=np.int64)
    return np.asarray(new_to_old[start:end], dtype=np.int64)


def structure_digest(indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray) -> str:
    """sha256 of a graph's CSR (rows = targets) and edge ids: what a partition depends on."""
    digest = hashlib.sha256()
    for array in (indptr, indices, eid):
        array = np.ascontiguousarray(array, dtype=np.int64)
        digest.update(f"\0{array.shape}\0".encode())
        digest.update(array.data)
    return digest.hexdigest()


def check_options(parts: int, order: str) -> None:
    """One-line errors for a part count below 1 and an unknown order."""
    if parts < 1:
        raise GnnioError(f"--parts must be at least 1, got {parts}")
    if order not in ORDERS:
        raise GnnioError(f"--order: unknown order {order!r}; choose one of {', '.join(ORDERS)}")


def balanced_row_starts(indptr: np.ndarray, parts: int) -> np.ndarray:
    """int64 [parts + 1]: contiguous blocks of rows with about equal (in-edges + rows) each."""
    num_rows = indptr.size - 1
    weight = indptr.astype(np.int64) + np.arange(num_rows + 1, dtype=np.int64)  # cumulative edges + rows
    goals = np.arange(parts + 1, dtype=np.float64) * (weight[-1] / parts)
    above = np.minimum(np.searchsorted(weight, goals, side="left"), num_rows)
    below = np.maximum(above - 1, 0)
    # the cut nearest each goal, so a heavy row joins the block it unbalances least
    starts = np.where(goals - weight[below] < weight[above] - goals, below, above).astype(np.int64)
    starts[0], starts[-1] = 0, num_rows
    return np.maximum.accumulate(np.minimum(starts, num_rows))


def partition_graph(graph: Graph, parts: int, *, order: str = "none", seed: int = 0,
                    row_starts: Optional[np.ndarray] = None) -> Partition:
    """Split `graph`'s target rows into `parts` contiguous blocks (see the module docstring).

    order:      a reordering method of gnnio_cli.graph.reorder applied first, or "none".
    row_starts: int [parts + 1] block boundaries to use instead of the balanced ones (0 .. N, non-decreasing).
    Deterministic: every rank computing it gets the same partition.
    """
    started = time.perf_counter()
    check_options(parts, order)
    graph = graph.to("cpu")
    if graph.is_bipartite:
        raise GnnioError("partition: needs a graph with as many sources as targets, got a bipartite graph")
    digest = structure_digest(graph.csr_indptr.numpy(), graph.csr_indices.numpy(), graph.csr_eid.numpy())
    new_to_old = None
    if order != "none":
        new_to_old = reorder(graph, order, seed).new_to_old.astype(np.int64)
        graph = graph.permute(new_to_old)
    indptr = graph.csr_indptr.numpy()
    indices = graph.csr_indices.numpy().astype(np.int64)
    eid = graph.csr_eid.numpy()
    num_nodes = graph.num_nodes
    if row_starts is None:
        row_starts = balanced_row_starts(indptr, parts)
    row_starts = np.asarray(row_starts, dtype=np.int64)
    if (row_starts.shape != (parts + 1,) or row_starts[0] != 0 or row_starts[-1] != num_nodes
            or (np.diff(row_starts) < 0).any()):
        raise GnnioError(f"partition: row_starts must be {parts + 1} non-decreasing ids from 0 to {num_nodes}, "
                         f"got {row_starts.tolist()}")
    slot = np.empty(num_nodes, dtype=np.int64)  # scratch, shared by the parts
    local = [_local_part(indptr, indices, eid, row_starts, rank, slot) for rank in range(parts)]
    sends = _send_plans([halo for *_, halo in local], row_starts)
    built = tuple(
        Part(int(row_starts[rank]), int(row_starts[rank + 1]), part_indptr, part_indices, edge_ids, halo,
             send_index, send_counts, np.diff(np.searchsorted(halo, row_starts)).astype(np.int64))
        for rank, ((part_indptr, part_indices, edge_ids, halo), (send_index, send_counts)) in enumerate(zip(local, sends))
    )
    return Partition(num_nodes, graph.num_edges, row_starts, new_to_old, order, seed, digest,
                     time.perf_counter() - started, built)


def _local_part(indptr, indices, eid, row_starts, rank, slot: np.ndarray):
    """(indptr, local source ids, original edge ids, halo) of rank `rank`'s rows; `slot` [num_nodes] is scratch.

    The halo is found by marking node ids, and a halo node's local id read from `slot`: linear in nodes + edges
    (a sort-based unique and a binary search of every edge took 5 s per part on rmat20)."""
    start, end = int(row_starts[rank]), int(row_starts[rank + 1])
    first, last = int(indptr[start]), int(indptr[end])
    sources = indices[first:last]
    own = (sources >= start) & (sources < end)
    remote = sources[~own]
    marked = np.zeros(slot.size, dtype=bool)
    marked[remote] = True
    halo = np.flatnonzero(marked).astype(np.int64)  # ascending
    slot[halo] = np.arange(end - start, end - start + halo.size)
    local = sources - start
    local[~own] = slot[remote]
    return indptr[start:end + 1] - first, local.astype(np.int64), eid[first:last].astype(np.int64), halo


def _send_plans(halos: list[np.ndarray], row_starts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank: (the local ids of its rows each reader's halo holds, grouped by reader; rows per reader)."""
    plans = []
    for owner in range(len(halos)):
        start, end = int(row_starts[owner]), int(row_starts[owner + 1])
        blocks = [halo[np.searchsorted(halo, start):np.searchsorted(halo, end)] - start for halo in halos]
        plans.append((np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, np.int64),
                      np.array([block.size for block in blocks], dtype=np.int64)))
    return plans


# ------------------------------------------------------------------ the report
@dataclass(frozen=True)
class PartSummary:
    """What `gnnio partition` prints per rank; bytes are per exchange of one [N, features] tensor
    (forward; backward moves the same again)."""

    rank: int
    nodes: int
    edges: int
    halo: int
    sent_rows: int
    edge_share: float
    bytes_received: int
    bytes_sent: int


def summarize(partition: Partition, features: int, bytes_per_value: int) -> list[PartSummary]:
    """Per part: its size, its halo, its edges against the mean (edge_share 1.0 = balanced), exchange bytes."""
    mean_edges = partition.num_edges / max(partition.num_parts, 1)
    row = features * bytes_per_value
    return [
        PartSummary(rank, part.num_own, part.num_edges, int(part.halo.size), int(part.send_index.size),
                    part.num_edges / mean_edges if mean_edges else 1.0, int(part.halo.size) * row,
                    int(part.send_index.size) * row)
        for rank, part in enumerate(partition.parts)
    ]


# ------------------------------------------------------------------ the store
def _group_name(parts: int) -> str:
    return f"partition/{parts}"


def _file_structure_digest(h5: h5py.File) -> str:
    return structure_digest(h5["csr/indptr"][()], h5["csr/indices"][()], h5["csr/eid"][()])


def stored_partition_state(path, parts: int, order: str) -> str:
    """"fresh" when `path` holds a partition into `parts` made with `order` of the graph as it is now,
    "stale" when it holds one of another graph or order, "missing" when it holds none."""
    with h5py.File(path, "r") as h5:
        read_header(h5, path)
        group = h5.get(_group_name(parts))
        if group is None:
            return "missing"
        try:
            digest = _file_structure_digest(h5)
        except (KeyError, ValueError, TypeError):  # a damaged graph: rebuilding reads it, and says what is wrong
            return "stale"
        same = group.attrs.get("order") == order and group.attrs.get("graph_sha256") == digest
    return "fresh" if same else "stale"


def ensure_partition(path, parts: int, *, order: str = "none", seed: int = 0, rebuild: bool = False
                     ) -> tuple[Partition, str]:
    """The partition of the graph in `path` into `parts`, reused from the file when fresh, else built and stored.

    Returns (partition, what happened: "reused", "built" or "rebuilt" (a stale or differently ordered one
    replaced)). `rebuild` builds even when a fresh one is stored.
    """
    path = Path(path)
    check_options(parts, order)
    read_attrs(path)  # one line for a missing, unreadable or foreign file
    state = stored_partition_state(path, parts, order)
    if state == "fresh" and not rebuild:
        return read_partition(path, parts), "reused"
    partition = partition_graph(load(path).graph, parts, order=order, seed=seed)
    write_partition(path, partition)
    return partition, "built" if state == "missing" else "rebuilt"


def write_partition(path, partition: Partition) -> None:
    """Store `partition` in the graph file at `path` (replacing one into as many parts), atomically:
    a copy of the file gains the group and its refreshed content digest, then replaces it."""
    path = Path(path)
    name = _group_name(partition.num_parts)
    with atomic_path(path, "the partition") as tmp:
        shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+") as h5:
            read_header(h5, path)
            if name in h5:
                del h5[name]
            group = h5.create_group(name)
            group.attrs.update(order=partition.order, seed=partition.seed, graph_sha256=partition.graph_sha256,
                               seconds=partition.seconds)
            group.create_dataset("row_starts", data=partition.row_starts)
            if partition.new_to_old is not None:
                group.create_dataset("new_to_old", data=partition.new_to_old)
            for rank, part in enumerate(partition.parts):
                part_group = group.create_group(str(rank))
                part_group.attrs.update(row_start=part.row_start, row_end=part.row_end)
                for array in PART_ARRAYS:
                    part_group.create_dataset(array, data=getattr(part, array))
            h5.attrs[DIGEST_ATTR] = content_digest(dict(h5.attrs), ((n, h5[n][()]) for n in dataset_names(h5)))


def _open_group(h5: h5py.File, path, parts: int) -> h5py.Group:
    group = h5.get(_group_name(parts))
    if group is None:
        raise GnnioError(f"{path}: holds no partition into {parts} parts; make one with 'gnnio partition {path} "
                         f"--parts {parts}'")
    return group


def read_part(path, parts: int, rank: int) -> tuple[Part, np.ndarray, Optional[np.ndarray]]:
    """(rank `rank`'s Part, row_starts, the new_to_old rows of its own nodes or None), reading only those."""
    if not 0 <= rank < parts:
        raise GnnioError(f"rank {rank} is outside a partition into {parts} parts")
    try:
        with h5py.File(path, "r") as h5:
            group = _open_group(h5, path, parts)
            row_starts = group["row_starts"][()]
            part_group = group[str(rank)]
            part = Part(int(part_group.attrs["row_start"]), int(part_group.attrs["row_end"]),
                        **{array: part_group[array][()].astype(np.int64) for array in PART_ARRAYS})
            order = group["new_to_old"][part.row_start:part.row_end] if "new_to_old" in group else None
    except (KeyError, ValueError, TypeError) as error:
        raise GnnioError(f"{path}: damaged partition into {parts} parts ({error}); rebuild it with "
                         f"'gnnio partition {path} --parts {parts} --force'") from None
    return part, row_starts, order


def read_partition(path, parts: int) -> Partition:
    """The whole stored partition into `parts` (every part)."""
    with h5py.File(path, "r") as h5:
        header = read_header(h5, path)
        group = _open_group(h5, path, parts)
        attrs = dict(group.attrs)
        new_to_old = group["new_to_old"][()] if "new_to_old" in group else None
    loaded = [read_part(path, parts, rank) for rank in range(parts)]
    return Partition(header.num_nodes, header.num_edges, loaded[0][1], new_to_old, str(attrs["order"]),
                     int(attrs["seed"]), str(attrs["graph_sha256"]), float(attrs["seconds"]),
                     tuple(part for part, _, _ in loaded))
