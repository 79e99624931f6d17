"""The Graph: an immutable pair of compressed adjacency structures.

Direction contract (as PyG's ``flow="source_to_target"``): ``edge_index[0]`` is
the source, ``edge_index[1]`` the target, messages are aggregated at the
target. The **CSR has one row per target** (its in-neighbours); the **CSC has
one row per source** (its out-neighbours) and serves backward passes that need
per-source gradients without atomics. Both keep ``eid``, the position of each
slot's edge in the original edge list, for edge features and returned
attention weights.

Derived structures (device copies, degree buckets, normalised edge values,
cuSPARSE handles) are computed once and kept in the graph's cache, keyed by
name, device and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numba
import numpy as np
import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.build import group_by
from gnnio_cli.graph.compress import INT32_MAX, Compressed, compress, group, key_dtype
from gnnio_cli.graph.schedule import GraphFacts, measure

_MISSING = object()


def index_dtype(num_nodes: int) -> torch.dtype:
    """Column indices are int32 while every node id fits, int64 beyond."""
    return torch.int32 if num_nodes <= INT32_MAX else torch.int64


@dataclass(frozen=True, eq=False)
class Graph:
    """A directed graph in CSR-by-target and CSC-by-source form.

    csr_indptr:  int64 [num_dst_nodes + 1]
    csr_indices: int32/int64 [E], the source of each slot
    csr_eid:     int64 [E], original edge id of each CSR slot
    csc_indptr:  int64 [num_src_nodes + 1]
    csc_indices: int32/int64 [E], the target of each slot
    csc_eid:     int64 [E], original edge id of each CSC slot
    node_ids:    int64 [N] original ids when the input's ids were relabelled

    Within a row, slots keep the original edge order (stable construction).
    Duplicate edges and self-loops are kept as given: the file converter
    removes them on request, layers see exactly the edges they are handed.
    """

    csr_indptr: torch.Tensor
    csr_indices: torch.Tensor
    csr_eid: torch.Tensor
    csc_indptr: torch.Tensor
    csc_indices: torch.Tensor
    csc_eid: torch.Tensor
    num_src_nodes: int
    num_dst_nodes: int
    node_ids: Optional[torch.Tensor] = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ---------------------------------------------------------------- build
    @staticmethod
    def from_edge_index(
        edge_index,
        num_nodes: Optional[int] = None,
        size: Optional[tuple[int, int]] = None,
        node_ids=None,
        check: bool = True,
    ) -> "Graph":
        """Build from a [2, E] edge list (row 0 sources, row 1 targets).

        `size=(num_src, num_dst)` gives a bipartite graph; otherwise both sides
        have `num_nodes` nodes (default: largest id + 1).

        A tensor on a GPU is grouped there (graph.compress: device sorts, no
        host round trip) and then read back once: the ids' range, which is
        checked, and the rows' facts the kernels' schedules need, in one read
        of a few numbers. `check=False` skips that read for ids known to be in
        range (its facts are then counted on first use); out-of-range ids
        would then be an illegal memory access, not an error. A CPU tensor or
        array is grouped on the CPU (graph.build's counting sorts).
        """
        if isinstance(edge_index, torch.Tensor) and edge_index.device.type != "cpu":
            return Graph._from_device_edge_index(edge_index, num_nodes, size, node_ids, check)
        if isinstance(edge_index, torch.Tensor):
            edge_index = edge_index.detach().numpy()
        edge_index = np.asarray(edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise GnnioError(f"Graph.from_edge_index: edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        src = np.ascontiguousarray(edge_index[0], dtype=np.int64)
        dst = np.ascontiguousarray(edge_index[1], dtype=np.int64)
        if size is None:
            if num_nodes is None:
                num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1)) + 1)
            size = (num_nodes, num_nodes)
        num_src, num_dst = int(size[0]), int(size[1])
        if src.size:
            _check_ids(int(src.min()), int(src.max()), int(dst.min()), int(dst.max()), num_src, num_dst)
        return Graph.from_arrays(src, dst, num_src, num_dst, node_ids=node_ids)

    @staticmethod
    def _from_device_edge_index(edge_index: torch.Tensor, num_nodes, size, node_ids, check: bool) -> "Graph":
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise GnnioError(f"Graph.from_edge_index: edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
            raise GnnioError(f"Graph.from_edge_index: edge_index must hold integers, got dtype {edge_index.dtype}")
        edge_index = edge_index.detach()
        if size is None:
            if num_nodes is None:  # the largest id: a read, as on the CPU
                num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
            size = (num_nodes, num_nodes)
        num_src, num_dst = int(size[0]), int(size[1])
        src, dst = edge_index[0], edge_index[1]
        parts = compress(src, dst, num_src, num_dst, index_dtype(max(num_src, num_dst)))
        graph = Graph._wrap(parts, num_src, num_dst, node_ids)
        if check:
            measured = measure(parts.csr[0], parts.csc[0], src.numel(), src, dst)
            if measured.id_ranges is not None:
                _check_ids(*measured.id_ranges, num_src, num_dst)
            graph._cache["facts"] = measured.facts
        graph._cache["edge_index"] = edge_index.to(torch.int64, copy=True)  # the ids as given, never aliased
        return graph

    @staticmethod
    def from_csr(indptr: torch.Tensor, indices: torch.Tensor, num_src: int, facts: Optional[GraphFacts] = None,
                 node_ids=None) -> "Graph":
        """A graph whose CSR (rows = targets, in-neighbour lists) is given, on its own device.

        indptr int64 [num_dst + 1], indices int [E] (sources in [0, num_src)); edge ids are the slots.
        The CSC comes from a stable sort of the sources (no read); `facts` (graph.schedule), where the
        caller knows them, spare the read that counting them would take.
        """
        num_dst = indptr.numel() - 1
        num_edges = indices.numel()
        rows = torch.repeat_interleave(
            torch.arange(num_dst, device=indptr.device), indptr.diff(), output_size=num_edges
        )
        idx = index_dtype(max(num_src, num_dst))
        if indptr.device.type == "cpu":  # the counting sort of graph.build: linear time, threads
            np_idx = np.int32 if idx == torch.int32 else np.int64
            csc = tuple(torch.from_numpy(part) for part in group_by(
                indices.numpy(), num_src, values=rows.numpy(), value_dtype=np_idx))
            csc = (csc[0], csc[2], csc[1])  # (indptr, order, grouped) -> (indptr, indices, eid)
        else:
            csc = group(indices.to(key_dtype(max(num_src, num_dst))), num_src, rows.to(idx))
        csr = (indptr, indices.to(idx), torch.arange(num_edges, device=indptr.device))
        graph = Graph._wrap(Compressed(csr, csc), num_src, num_dst, node_ids, facts)
        graph._cache["csr_rows"] = rows
        return graph

    @staticmethod
    def _wrap(parts, num_src: int, num_dst: int, node_ids=None, facts: Optional[GraphFacts] = None) -> "Graph":
        """A Graph of graph.compress's result (tensors already on their device)."""
        (csr_indptr, csr_indices, csr_eid), (csc_indptr, csc_indices, csc_eid) = parts.csr, parts.csc
        graph = Graph(
            csr_indptr=csr_indptr, csr_indices=csr_indices, csr_eid=csr_eid,
            csc_indptr=csc_indptr, csc_indices=csc_indices, csc_eid=csc_eid,
            num_src_nodes=int(num_src), num_dst_nodes=int(num_dst),
            node_ids=None if node_ids is None else torch.as_tensor(node_ids, dtype=torch.int64),
        )  # fmt: skip
        if facts is not None:
            graph._cache["facts"] = facts
        return graph

    @staticmethod
    def from_arrays(src: np.ndarray, dst: np.ndarray, num_src: int, num_dst: int, node_ids=None) -> "Graph":
        """Build from validated int64 source and target arrays (edge ids = positions)."""
        idx = index_dtype(max(num_src, num_dst))
        np_idx = np.int32 if idx == torch.int32 else np.int64
        csr_indptr, csr_eid, csr_indices = group_by(dst, num_dst, values=src, value_dtype=np_idx)
        csc_indptr, csc_eid, csc_indices = group_by(src, num_src, values=dst, value_dtype=np_idx)
        return Graph.from_compressed(
            (csr_indptr, csr_indices, csr_eid), (csc_indptr, csc_indices, csc_eid), num_src, num_dst, node_ids
        )

    @staticmethod
    def from_compressed(csr: tuple, csc: tuple, num_src: int, num_dst: int, node_ids=None) -> "Graph":
        """Wrap numpy (indptr, indices, eid) triples of the CSR (rows = targets) and CSC (rows = sources)."""
        (csr_indptr, csr_indices, csr_eid), (csc_indptr, csc_indices, csc_eid) = csr, csc
        return Graph(
            csr_indptr=torch.from_numpy(csr_indptr),
            csr_indices=torch.from_numpy(csr_indices),
            csr_eid=torch.from_numpy(csr_eid),
            csc_indptr=torch.from_numpy(csc_indptr),
            csc_indices=torch.from_numpy(csc_indices),
            csc_eid=torch.from_numpy(csc_eid),
            num_src_nodes=int(num_src),
            num_dst_nodes=int(num_dst),
            node_ids=None if node_ids is None else torch.as_tensor(node_ids, dtype=torch.int64),
        )

    # ----------------------------------------------------------- properties
    @property
    def num_nodes(self) -> int:
        return max(self.num_src_nodes, self.num_dst_nodes)

    @property
    def num_edges(self) -> int:
        return int(self.csr_indices.numel())

    @property
    def device(self) -> torch.device:
        return self.csr_indptr.device

    @property
    def is_bipartite(self) -> bool:
        return self.num_src_nodes != self.num_dst_nodes

    @property
    def in_degree(self) -> torch.Tensor:
        """int64 [num_dst_nodes]: CSR row lengths."""
        return self.cached("in_degree", lambda: self.csr_indptr.diff())

    @property
    def out_degree(self) -> torch.Tensor:
        """int64 [num_src_nodes]: CSC row lengths."""
        return self.cached("out_degree", lambda: self.csc_indptr.diff())

    @property
    def csr_rows(self) -> torch.Tensor:
        """int64 [E]: the target of each CSR slot (COO row ids beside the CSR)."""
        return self.cached(
            "csr_rows",
            lambda: torch.repeat_interleave(
                torch.arange(self.num_dst_nodes, device=self.device), self.in_degree, output_size=self.num_edges
            ),
        )

    @property
    def facts(self) -> GraphFacts:
        """What the host knows of the rows (graph.schedule.GraphFacts), counted on first use: on the CPU for
        free, on a GPU in one read; graphs built from a GPU edge_index, by gnnio's loader or moved from the
        CPU already have them. The edge list it counts is (csr_indices, csr_rows) in the indices' dtype: the
        native count takes sources and targets of one dtype."""
        return self.cached("facts", lambda: measure(
            self.csr_indptr, self.csc_indptr, self.num_edges, self.csr_indices,
            self.csr_rows.to(self.csr_indices.dtype)).facts)

    def edge_index(self) -> torch.Tensor:
        """int64 [2, E] in original edge order (row 0 sources, row 1 targets)."""

        def build():
            out = torch.empty(2, self.num_edges, dtype=torch.int64, device=self.device)
            out[0, self.csr_eid] = self.csr_indices.long()
            out[1, self.csr_eid] = self.csr_rows
            return out

        return self.cached("edge_index", build)

    # -------------------------------------------------------------- caching
    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """Return the derived structure under `key`, building it once.

        Structures carry no gradient and outlive the call that built them, so they are built outside
        autograd and outside inference mode (a graph first used while predicting serves training later).
        """
        found = self._cache.get(key, _MISSING)
        if found is _MISSING:
            with torch.inference_mode(False), torch.no_grad():
                found = self._cache[key] = build()
        return found

    def uncached(self) -> "Graph":
        """The same arrays with only what a loader counts when it builds a graph cached (its facts and CSR
        rows): the graph as a new batch hands it to a layer, every other structure still to build. Timing
        a step on it (gnnio compare's mini-batch mode) measures the per-graph set-up a training step pays."""
        kept = {key: self._cache[key] for key in ("facts", "csr_rows") if key in self._cache}
        return replace(self, _cache=kept)

    def to(self, device) -> "Graph":
        """The same graph on `device` (copies cached per device)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device == device:
            return self
        if self.device.type == "cpu":
            self.facts  # counted here for free, so the copy never reads them back

        def move():
            moved = Graph(
                csr_indptr=self.csr_indptr.to(device),
                csr_indices=self.csr_indices.to(device),
                csr_eid=self.csr_eid.to(device),
                csc_indptr=self.csc_indptr.to(device),
                csc_indices=self.csc_indices.to(device),
                csc_eid=self.csc_eid.to(device),
                num_src_nodes=self.num_src_nodes,
                num_dst_nodes=self.num_dst_nodes,
                node_ids=self.node_ids,
            )
            if "facts" in self._cache:
                moved._cache["facts"] = self._cache["facts"]
            return moved

        return self.cached(("to", str(device)), move)

    def permute(self, new_to_old: np.ndarray) -> "Graph":
        """Relabel nodes: new node i is old node new_to_old[i]. Edge ids keep their meaning.

        Rows are moved whole (a gather, no sort), so each row keeps its slots in
        their original edge order, as a graph built from the relabelled edges would.
        """
        if self.is_bipartite:
            raise GnnioError("Graph.permute: bipartite graphs cannot be relabelled with one permutation")
        graph = self.to("cpu")
        new_to_old = np.asarray(new_to_old, dtype=np.int64)
        old_to_new = np.empty_like(new_to_old)
        old_to_new[new_to_old] = np.arange(new_to_old.size, dtype=np.int64)
        csr, csc = (
            _move_rows(*(getattr(graph, f"{side}_{name}").numpy() for name in ("indptr", "indices", "eid")),
                       new_to_old, old_to_new)
            for side in ("csr", "csc")
        )
        node_ids = graph.node_ids.numpy()[new_to_old] if graph.node_ids is not None else new_to_old
        return Graph.from_compressed(csr, csc, self.num_nodes, self.num_nodes, node_ids)

    def __repr__(self) -> str:
        side = (
            f"num_nodes={self.num_nodes}"
            if not self.is_bipartite
            else f"num_src_nodes={self.num_src_nodes}, num_dst_nodes={self.num_dst_nodes}"
        )
        return f"Graph({side}, num_edges={self.num_edges}, device={self.device})"


def _check_ids(min_src: int, max_src: int, min_dst: int, max_dst: int, num_src: int, num_dst: int) -> None:
    """One-line errors for negative or out-of-range node ids."""
    if min(min_src, min_dst) < 0:
        raise GnnioError("Graph.from_edge_index: edge_index holds negative node ids")
    if max_src >= num_src or max_dst >= num_dst:
        raise GnnioError(
            f"Graph.from_edge_index: node id out of range for size ({num_src}, {num_dst}): "
            f"max source {max_src}, max target {max_dst}"
        )


@numba.njit(cache=True)
def _move_rows(indptr, indices, eid, new_to_old, old_to_new):
    """Rows of (indptr, indices, eid) in new order, neighbour ids relabelled: (indptr, indices, eid)."""
    num_rows = new_to_old.shape[0]
    new_indptr = np.zeros(num_rows + 1, dtype=np.int64)
    for row in range(num_rows):
        old = new_to_old[row]
        new_indptr[row + 1] = new_indptr[row] + indptr[old + 1] - indptr[old]
    new_indices = np.empty_like(indices)
    new_eid = np.empty_like(eid)
    for row in range(num_rows):
        old = new_to_old[row]
        target = new_indptr[row]
        for slot in range(indptr[old], indptr[old + 1]):
            new_indices[target] = old_to_new[indices[slot]]
            new_eid[target] = eid[slot]
            target += 1
    return new_indptr, new_indices, new_eid
