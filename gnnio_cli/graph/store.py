"""The HDF5 graph cache (`.h5`), readable with plain h5py.

Layout (see README "File format"):

    /                 attrs: format="gnnio-graph", format_version, num_nodes,
                      num_edges, directed, source, source_sha256, params (JSON),
                      created_by
    /csr/{indptr,indices,eid}   rows = targets
    /csc/{indptr,indices,eid}   rows = sources
    /node_ids                   original ids when relabelled
    /degree/{in,out}
    /perm/<method>/{new_to_old,old_to_new}   attrs: method, seconds, metrics (JSON)
    /blocked/<kind>/...
    /features/...

Writes are atomic: everything goes to a temporary file in the destination's
folder, which is flushed and then renamed over the destination, so a killed
write leaves the old file (or none), never half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import h5py
import numpy as np
import torch

from gnnio_cli import __version__
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.graph import INT32_MAX, Graph

FORMAT_NAME = "gnnio-graph"
FORMAT_VERSION = 1


@dataclass
class Permutation:
    """A node order: new node i is old node new_to_old[i]."""

    method: str
    new_to_old: np.ndarray
    seconds: float = 0.0
    metrics: dict = field(default_factory=dict)

    @property
    def old_to_new(self) -> np.ndarray:
        inverse = np.empty_like(self.new_to_old)
        inverse[self.new_to_old] = np.arange(self.new_to_old.size, dtype=self.new_to_old.dtype)
        return inverse


@dataclass
class StoredGraph:
    """A graph as read from (or to be written to) an `.h5` file, with its metadata."""

    graph: Graph
    directed: bool = True
    source: str = ""
    source_sha256: str = ""
    params: dict = field(default_factory=dict)
    perms: dict[str, Permutation] = field(default_factory=dict)
    features: dict[str, np.ndarray] = field(default_factory=dict)
    blocked: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    created_by: str = f"gnnio {__version__}"


@contextmanager
def atomic_path(path: os.PathLike | str) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` on success only."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise GnnioError(f"{path}: folder {folder} does not exist")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _compact(ids: torch.Tensor, limit: int):
    """int32 on disk while every value fits (a third less to write for edge ids); read back as int64."""
    array = ids.numpy()
    return array.astype(np.int32) if limit <= INT32_MAX else array


def _write_structure(group: h5py.Group, indptr, indices, eid) -> None:
    group.create_dataset("indptr", data=indptr.numpy())
    group.create_dataset("indices", data=indices.numpy())
    group.create_dataset("eid", data=_compact(eid, eid.numel()))


def save(stored: StoredGraph, path: os.PathLike | str) -> None:
    """Write `stored` to `path` atomically."""
    graph = stored.graph.to("cpu")
    if graph.is_bipartite:
        raise GnnioError(f"{path}: bipartite graphs are not stored in .h5 files")
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as h5:
            h5.attrs.update(
                format=FORMAT_NAME,
                format_version=FORMAT_VERSION,
                num_nodes=graph.num_nodes,
                num_edges=graph.num_edges,
                directed=bool(stored.directed),
                source=str(stored.source),
                source_sha256=str(stored.source_sha256),
                params=json.dumps(stored.params, sort_keys=True),
                created_by=stored.created_by,
            )
            _write_structure(h5.create_group("csr"), graph.csr_indptr, graph.csr_indices, graph.csr_eid)
            _write_structure(h5.create_group("csc"), graph.csc_indptr, graph.csc_indices, graph.csc_eid)
            if graph.node_ids is not None:
                h5.create_dataset("node_ids", data=graph.node_ids.numpy())
            degree = h5.create_group("degree")
            degree.create_dataset("in", data=_compact(graph.in_degree, graph.num_edges))
            degree.create_dataset("out", data=_compact(graph.out_degree, graph.num_edges))
            for name, perm in stored.perms.items():
                group = h5.create_group(f"perm/{name}")
                group.attrs.update(method=perm.method, seconds=perm.seconds, metrics=json.dumps(perm.metrics))
                group.create_dataset("new_to_old", data=perm.new_to_old)
                group.create_dataset("old_to_new", data=perm.old_to_new)
            for kind, arrays in stored.blocked.items():
                group = h5.create_group(f"blocked/{kind}")
                for key, value in arrays.items():
                    group.create_dataset(key, data=value)
            for name, value in stored.features.items():
                h5.create_dataset(f"features/{name}", data=value)


def _check_header(h5: h5py.File, path) -> None:
    if h5.attrs.get("format") != FORMAT_NAME:
        raise GnnioError(f"{path}: not a gnnio graph (no format='{FORMAT_NAME}' attribute); create one with 'gnnio convert'")
    version = int(h5.attrs.get("format_version", -1))
    if version > FORMAT_VERSION:
        raise GnnioError(
            f"{path}: format version {version} is newer than this gnnio reads ({FORMAT_VERSION}); upgrade gnnio"
        )
    if version < 1:
        raise GnnioError(f"{path}: invalid format_version {version}")


def read_attrs(path: os.PathLike | str) -> dict:
    """The root attributes of a gnnio `.h5` (validated), without reading arrays."""
    with _open(path) as h5:
        _check_header(h5, path)
        attrs = dict(h5.attrs)
    attrs["params"] = json.loads(attrs.get("params", "{}"))
    return attrs


@contextmanager
def _open(path):
    path = Path(path)
    if not path.exists():
        raise GnnioError(f"{path}: no such file")
    try:
        h5 = h5py.File(path, "r")
    except OSError as err:
        raise GnnioError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {err}") from None
    with h5:
        yield h5


def load(path: os.PathLike | str) -> StoredGraph:
    """Read a gnnio `.h5` file; errors name the file and what is wrong."""
    with _open(path) as h5:
        _check_header(h5, path)
        try:
            num_nodes = int(h5.attrs["num_nodes"])
            arrays = {
                f"{side}_{name}": torch.from_numpy(np.asarray(h5[f"{side}/{name}"][()]))
                for side in ("csr", "csc")
                for name in ("indptr", "indices")
            }
            for side in ("csr", "csc"):
                arrays[f"{side}_eid"] = torch.from_numpy(h5[f"{side}/eid"][()].astype(np.int64, copy=False))
            node_ids = torch.from_numpy(h5["node_ids"][()]) if "node_ids" in h5 else None
            perms = {}
            for name, group in h5.get("perm", {}).items():
                perms[name] = Permutation(
                    method=str(group.attrs.get("method", name)),
                    new_to_old=group["new_to_old"][()],
                    seconds=float(group.attrs.get("seconds", 0.0)),
                    metrics=json.loads(group.attrs.get("metrics", "{}")),
                )
            blocked = {kind: {key: ds[()] for key, ds in group.items()} for kind, group in h5.get("blocked", {}).items()}
            features = {name: ds[()] for name, ds in h5.get("features", {}).items()}
            attrs = dict(h5.attrs)
        except (KeyError, OSError, ValueError) as err:
            raise GnnioError(f"{path}: damaged gnnio graph ({err}); rebuild it with 'gnnio convert --force'") from None
    graph = Graph(num_src_nodes=num_nodes, num_dst_nodes=num_nodes, node_ids=node_ids, **arrays)
    _check_consistency(graph, int(attrs["num_edges"]), path)
    return StoredGraph(
        graph=graph,
        directed=bool(attrs.get("directed", True)),
        source=str(attrs.get("source", "")),
        source_sha256=str(attrs.get("source_sha256", "")),
        params=json.loads(attrs.get("params", "{}")),
        perms=perms,
        features=features,
        blocked=blocked,
        created_by=str(attrs.get("created_by", "")),
    )


def _check_consistency(graph: Graph, num_edges: int, path) -> None:
    """Cheap structural checks, so a damaged file fails here and not in a kernel."""
    n, e = graph.num_nodes, num_edges
    for side in ("csr", "csc"):
        indptr = getattr(graph, f"{side}_indptr")
        indices = getattr(graph, f"{side}_indices")
        eid = getattr(graph, f"{side}_eid")
        ok = (
            indptr.numel() == n + 1
            and int(indptr[0]) == 0
            and int(indptr[-1]) == e
            and indices.numel() == e
            and eid.numel() == e
            and bool((indptr.diff() >= 0).all())
            and (e == 0 or (int(indices.min()) >= 0 and int(indices.max()) < n))
        )
        if not ok:
            raise GnnioError(f"{path}: damaged gnnio graph (/{side} arrays inconsistent); rebuild with 'gnnio convert --force'")


def load_graph(path: os.PathLike | str) -> Graph:
    """Just the Graph from a gnnio `.h5` file."""
    return load(path).graph


def file_sha256(path: os.PathLike | str, chunk: int = 1 << 22) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def matches_cache(path: os.PathLike | str, source_sha256: str, params: dict) -> Optional[dict]:
    """Root attrs of `path` if it is a valid cache of the same source and options, else None."""
    try:
        attrs = read_attrs(path)
    except GnnioError:
        return None
    if attrs.get("source_sha256") == source_sha256 and attrs.get("params") == json.loads(json.dumps(params, sort_keys=True)):
        return attrs
    return None
