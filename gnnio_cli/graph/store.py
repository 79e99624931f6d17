"""The HDF5 graph cache (`.h5`), readable with plain h5py.

Layout (see README "The graph file"):

    /                 attrs: format="gnnio-graph", format_version, num_nodes,
                      num_edges, directed, source, source_sha256, params (JSON),
                      created_by, conversion (JSON, files made by `gnnio
                      convert`: what it read and removed), content_sha256
    /csr/{indptr,indices,eid}   rows = targets
    /csc/{indptr,indices,eid}   rows = sources
    /node_ids                   original ids when relabelled
    /edge_weight                float64 [E] by edge id, when the input had weights
    /degree/{in,out}
    /perm/<method>/{new_to_old,old_to_new}   attrs: method, seconds, metrics (JSON)
    /blocked/<kind>/...
    /features/...

content_sha256 digests the root attributes and every dataset as written, so
a file changed after it was written (edited, damaged, a dataset deleted) is
recognised: `gnnio convert` reuses a file only when it still matches.

Writes are atomic (:func:`gnnio_cli.graph.files.atomic_path`): a killed
write leaves the old file (or none), never half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import h5py
import numpy as np
import torch

from gnnio_cli import __version__
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.files import atomic_path, check_readable
from gnnio_cli.graph.graph import INT32_MAX, Graph

FORMAT_NAME = "gnnio-graph"
FORMAT_VERSION = 1
DIGEST_ATTR = "content_sha256"
_STRUCTURE = ("indptr", "indices", "eid")


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
    """A graph as read from (or to be written to) an `.h5` file, with its metadata.

    edge_weight: float64 [E] indexed by edge id (the `edge_weight` argument
    of the layers, in the graph's original edge order), or None.
    conversion: what `gnnio convert` read and removed (its summary's counts),
    empty for graphs made otherwise.
    """

    graph: Graph
    directed: bool = True
    source: str = ""
    source_sha256: str = ""
    params: dict = field(default_factory=dict)
    perms: dict[str, Permutation] = field(default_factory=dict)
    features: dict[str, np.ndarray] = field(default_factory=dict)
    blocked: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    created_by: str = f"gnnio {__version__}"
    edge_weight: Optional[np.ndarray] = None
    conversion: dict = field(default_factory=dict)


@dataclass
class Header:
    """The validated root attributes of a gnnio `.h5`."""

    format_version: int
    num_nodes: int
    num_edges: int
    directed: bool
    source: str
    source_sha256: str
    params: dict
    created_by: str
    conversion: dict
    content_sha256: str


# ----------------------------------------------------------------- writing


def _compact(array: np.ndarray, limit: int) -> np.ndarray:
    """int32 on disk while every value fits (a third less to write for edge ids); read back as int64."""
    return array.astype(np.int32) if limit <= INT32_MAX else array


def _datasets(stored: StoredGraph, graph: Graph) -> dict[str, np.ndarray]:
    """Every dataset of the file, by path, exactly as written."""
    arrays = {}
    for side in ("csr", "csc"):
        indptr, indices, eid = (getattr(graph, f"{side}_{name}").numpy() for name in _STRUCTURE)
        arrays.update({f"{side}/indptr": indptr, f"{side}/indices": indices, f"{side}/eid": _compact(eid, eid.size)})
    if graph.node_ids is not None:
        arrays["node_ids"] = graph.node_ids.numpy()
    if stored.edge_weight is not None:
        arrays["edge_weight"] = np.asarray(stored.edge_weight, dtype=np.float64)
    arrays["degree/in"] = _compact(graph.in_degree.numpy(), graph.num_edges)
    arrays["degree/out"] = _compact(graph.out_degree.numpy(), graph.num_edges)
    for name, perm in stored.perms.items():
        arrays[f"perm/{name}/new_to_old"] = perm.new_to_old
        arrays[f"perm/{name}/old_to_new"] = perm.old_to_new
    for kind, group in stored.blocked.items():
        arrays.update({f"blocked/{kind}/{key}": value for key, value in group.items()})
    arrays.update({f"features/{name}": value for name, value in stored.features.items()})
    return arrays


def _root_attrs(stored: StoredGraph, graph: Graph) -> dict:
    attrs = dict(
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
    if stored.conversion:
        attrs["conversion"] = json.dumps(stored.conversion, sort_keys=True)
    return attrs


def content_digest(attrs: dict, datasets: Iterable[tuple[str, np.ndarray]]) -> str:
    """sha256 of root attributes (all but the digest itself) and (path, array) pairs in the given order."""
    digest = hashlib.sha256()
    plain = {key: value.item() if isinstance(value, np.generic) else value for key, value in attrs.items() if key != DIGEST_ATTR}
    digest.update(json.dumps(plain, sort_keys=True, default=str).encode())
    for name, array in datasets:
        array = np.ascontiguousarray(array)
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data if array.ndim else array.tobytes())
    return digest.hexdigest()


def _write_structure(group: h5py.Group, indptr: np.ndarray, indices: np.ndarray, eid: np.ndarray) -> None:
    group.create_dataset("indptr", data=indptr)
    group.create_dataset("indices", data=indices)
    group.create_dataset("eid", data=eid)


def save(stored: StoredGraph, path: os.PathLike | str) -> None:
    """Write `stored` to `path` atomically; errors are one-line GnnioErrors naming `path`."""
    graph = stored.graph.to("cpu")
    if graph.is_bipartite:
        raise GnnioError(f"{path}: bipartite graphs are not stored in .h5 files")
    arrays = _datasets(stored, graph)
    attrs = _root_attrs(stored, graph)
    with atomic_path(path, "the graph") as tmp, ThreadPoolExecutor(max_workers=1) as pool:
        # hashlib releases the GIL: the digest is computed while h5py writes.
        digest = pool.submit(content_digest, attrs, sorted(arrays.items()))
        with h5py.File(tmp, "w") as h5:
            h5.attrs.update(attrs)
            for side in ("csr", "csc"):
                _write_structure(h5.create_group(side), *(arrays[f"{side}/{name}"] for name in _STRUCTURE))
            for name, array in arrays.items():
                if name.split("/", 1)[0] not in ("csr", "csc"):
                    h5.create_dataset(name, data=array)
            for name, perm in stored.perms.items():
                h5[f"perm/{name}"].attrs.update(method=perm.method, seconds=perm.seconds, metrics=json.dumps(perm.metrics))
            h5.attrs[DIGEST_ATTR] = digest.result()


# ----------------------------------------------------------------- reading


def _damaged(path, what: str) -> GnnioError:
    return GnnioError(f"{path}: damaged gnnio graph ({what}); rebuild it with 'gnnio convert --force'")


def _is_format_name(value) -> bool:
    return isinstance(value, str) and value == FORMAT_NAME


def _integer_attr(attrs, name: str, path, minimum: int = 0) -> int:
    value = attrs.get(name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise _damaged(path, f"attribute {name} is {value!r}, expected an integer >= {minimum}")
    return int(value)


def _json_attr(attrs, name: str, path) -> dict:
    text = attrs.get(name, "{}")
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise _damaged(path, f"attribute {name} is not a JSON object")
    return value


def read_header(h5: h5py.File, path) -> Header:
    """The root attributes, validated: one-line errors for anything gnnio cannot read."""
    attrs = h5.attrs
    if not _is_format_name(attrs.get("format")):
        raise GnnioError(f"{path}: not a gnnio graph (no format='{FORMAT_NAME}' attribute); create one with 'gnnio convert'")
    version = attrs.get("format_version")
    if isinstance(version, (int, np.integer)) and not isinstance(version, (bool, np.bool_)) and version > FORMAT_VERSION:
        raise GnnioError(f"{path}: format version {version} is newer than this gnnio reads ({FORMAT_VERSION}); upgrade gnnio")
    version = _integer_attr(attrs, "format_version", path, minimum=1)
    return Header(
        format_version=version,
        num_nodes=_integer_attr(attrs, "num_nodes", path),
        num_edges=_integer_attr(attrs, "num_edges", path),
        directed=bool(attrs.get("directed", True)),
        source=str(attrs.get("source", "")),
        source_sha256=str(attrs.get("source_sha256", "")),
        params=_json_attr(attrs, "params", path),
        created_by=str(attrs.get("created_by", "")),
        conversion=_json_attr(attrs, "conversion", path),
        content_sha256=str(attrs.get(DIGEST_ATTR, "")),
    )


@contextmanager
def _open(path) -> Iterator[h5py.File]:
    path = check_readable(path, "a gnnio graph")
    try:
        h5 = h5py.File(path, "r")
    except OSError as err:
        raise GnnioError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {err}") from None
    with h5:
        yield h5


def read_attrs(path: os.PathLike | str) -> dict:
    """The root attributes of a gnnio `.h5` (validated; params parsed), without reading arrays."""
    with _open(path) as h5:
        read_header(h5, path)
        attrs = dict(h5.attrs)
    attrs["params"] = json.loads(attrs.get("params", "{}"))
    return attrs


def is_gnnio_graph(path: os.PathLike | str) -> bool:
    """Whether `path` is an HDF5 file that gnnio wrote (intact or not)."""
    try:
        with h5py.File(path, "r") as h5:
            return _is_format_name(h5.attrs.get("format"))
    except Exception:  # not HDF5, unreadable, a folder: not ours
        return False


def _index_array(h5: h5py.File, name: str, path) -> np.ndarray:
    array = h5[name][()]
    if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind != "i":
        raise _damaged(path, f"/{name} is not a one-dimensional integer array")
    return array


def load(path: os.PathLike | str) -> StoredGraph:
    """Read a gnnio `.h5` file; errors name the file and what is wrong."""
    with _open(path) as h5:
        header = read_header(h5, path)
        try:
            arrays = {}
            for side in ("csr", "csc"):
                arrays[f"{side}_indptr"] = torch.from_numpy(_index_array(h5, f"{side}/indptr", path).astype(np.int64, copy=False))
                arrays[f"{side}_indices"] = torch.from_numpy(_index_array(h5, f"{side}/indices", path))
                arrays[f"{side}_eid"] = torch.from_numpy(_index_array(h5, f"{side}/eid", path).astype(np.int64, copy=False))
            node_ids = torch.from_numpy(_index_array(h5, "node_ids", path)) if "node_ids" in h5 else None
            edge_weight = h5["edge_weight"][()] if "edge_weight" in h5 else None
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
        except (KeyError, OSError, ValueError, TypeError, AttributeError) as err:
            raise _damaged(path, str(err)) from None
    graph = Graph(num_src_nodes=header.num_nodes, num_dst_nodes=header.num_nodes, node_ids=node_ids, **arrays)
    _check_consistency(graph, header.num_edges, edge_weight, path)
    return StoredGraph(
        graph=graph,
        directed=header.directed,
        source=header.source,
        source_sha256=header.source_sha256,
        params=header.params,
        perms=perms,
        features=features,
        blocked=blocked,
        created_by=header.created_by,
        edge_weight=edge_weight,
        conversion=header.conversion,
    )


def _check_consistency(graph: Graph, num_edges: int, edge_weight: Optional[np.ndarray], path) -> None:
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
            raise _damaged(path, f"/{side} arrays inconsistent")
    if graph.node_ids is not None and graph.node_ids.numel() != n:
        raise _damaged(path, f"/node_ids has {graph.node_ids.numel()} entries for {n} nodes")
    if edge_weight is not None and (edge_weight.shape != (e,) or edge_weight.dtype.kind != "f"):
        raise _damaged(path, f"/edge_weight has shape {edge_weight.shape} and dtype {edge_weight.dtype}, expected [{e}] floats")


def load_graph(path: os.PathLike | str) -> Graph:
    """Just the Graph from a gnnio `.h5` file."""
    return load(path).graph


def file_sha256(path: os.PathLike | str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def dataset_names(h5: h5py.File) -> list[str]:
    names = []
    h5.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return sorted(names)


def reusable_conversion(path: os.PathLike | str, source_sha256: str, params: dict) -> Optional[Header]:
    """The header of `path` if it is, untouched, what `gnnio convert` made of the same source and options.

    Checks, cheapest first: a gnnio graph of a known format version, made by
    `convert` (it records the conversion), of the same source bytes and
    options, never reordered (no /perm), and every attribute and dataset as
    written (content_sha256). None on any doubt: the caller rebuilds.
    """
    try:
        with _open(path) as h5:
            header = read_header(h5, path)
            same_input = header.source_sha256 == source_sha256 and header.params == json.loads(json.dumps(params))
            if not (same_input and header.conversion and header.content_sha256) or "perm" in h5:
                return None
            datasets = ((name, h5[name][()]) for name in dataset_names(h5))
            if content_digest(dict(h5.attrs), datasets) != header.content_sha256:
                return None
        return header
    except (GnnioError, OSError, ValueError, KeyError, TypeError):
        return None
