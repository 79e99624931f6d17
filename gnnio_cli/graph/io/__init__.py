"""Reading edge lists from files: SNAP-style text, CSV/TSV, Matrix Market, scipy .npz.

Every reader returns an :class:`EdgeList`: int64 source and target arrays
(row 0 / row 1 of an ``edge_index``: source, then target, as in PyG), the weights
when the file gives one value per edge, and the node count the file
declares, if it declares one (a SNAP ``# Nodes: N`` comment, the Matrix
Market size line, the shape of a sparse matrix).

One module per format family: :mod:`.source` (bytes, gzip, stdin, the
byte-order mark), :mod:`.text` (the parallel text parser; SNAP, CSV, TSV),
:mod:`.matrix_market`, :mod:`.npz`, :mod:`.write` (text edge lists out).

The format comes from the content first: a Matrix Market banner is Matrix
Market and a zip archive is an npz, whatever the name (stdin has none); then
from the name (``.mtx``, ``.npz``, ``.csv``, ``.tsv``, a trailing ``.gz``
ignored); otherwise a SNAP-style edge list. ``format`` overrides all of it.
Malformed input raises :class:`InputFormatError` (or :class:`GnnioError`)
with one line naming the file and, for text, the line and its text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.io.edges import EdgeList, mirror, mirror_weights
from gnnio_cli.graph.io.matrix_market import BANNER_PREFIX, read_mtx
from gnnio_cli.graph.io.npz import ZIP_MAGIC, read_npz
from gnnio_cli.graph.io.source import InputBytes, check_input_file, read_bytes, without_byte_order_mark
from gnnio_cli.graph.io.text import parse_pairs, read_text
from gnnio_cli.graph.io.write import is_gnnio_edge_list, write_edge_list

FORMATS = ("edgelist", "csv", "tsv", "mtx", "npz")

_HDF5_MAGIC = b"\x89HDF"
_EXTENSIONS = {
    ".mtx": "mtx",
    ".npz": "npz",
    ".csv": "csv",
    ".tsv": "tsv",
}

__all__ = [
    "EdgeList", "FORMATS", "InputBytes", "check_input_file", "detect_format", "is_gnnio_edge_list", "mirror",
    "mirror_weights", "parse_pairs", "read_bytes", "read_edges", "write_edge_list",
]


def detect_format(path: str, head: bytes) -> str:
    """Format from `head`, the first bytes of the content (gzip undone, byte-order mark dropped),
    else from the name (a trailing .gz ignored), else "edgelist"."""
    if head[: len(BANNER_PREFIX)].lower() == BANNER_PREFIX:
        return "mtx"
    if head.startswith(ZIP_MAGIC):
        return "npz"
    name = Path(path).name.lower() if path != "-" else ""
    if name.endswith(".gz"):
        name = name[:-3]
    return _EXTENSIONS.get(Path(name).suffix, "edgelist")


def _check_not_binary(name: str, head: bytes) -> None:
    if head.startswith(_HDF5_MAGIC):
        raise GnnioError(f"{name}: is an HDF5 file; 'gnnio convert' reads edge lists (load .h5 graphs directly)")
    if head.startswith(ZIP_MAGIC):
        raise GnnioError(f"{name}: is a zip/npz archive; use --format npz")


def read_edges(path: str, format: Optional[str] = None, content: Optional[InputBytes] = None) -> EdgeList:
    """Read the edge list at `path` ("-" for stdin) in `format` (None: detect).

    `content`: the input as :func:`read_bytes` returned it, when the caller
    has read it already. Raises GnnioError / InputFormatError with one-line
    messages naming the file (and line, for text).
    """
    name = "<stdin>" if path == "-" else str(path)
    if format is not None and format not in FORMATS:
        raise GnnioError(f"--format: unknown format {format!r}; choose from {', '.join(FORMATS)}")
    content = content if content is not None else read_bytes(path)
    data = content.data
    fmt = format or detect_format(path, without_byte_order_mark(data[:64], name).tobytes())
    if fmt == "npz":
        edges = read_npz(data, name)
    else:
        data = without_byte_order_mark(data, name)
        _check_not_binary(name, data[:4].tobytes())
        edges = read_mtx(data, name) if fmt == "mtx" else read_text(data, name, fmt)
    if edges.num_edges == 0:
        raise GnnioError(f"{name}: no edges found (empty file?)")
    return edges
