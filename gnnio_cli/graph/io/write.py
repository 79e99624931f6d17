"""Writing SNAP-style text edge lists (`gnnio generate --write-edges`)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional

import numba
import numpy as np

from gnnio_cli.graph.io.source import GZIP_MAGIC

# The first line of every edge list gnnio writes ends with this: such a file may be replaced without --force.
WRITER_MARK = "(written by gnnio)"


@numba.njit(cache=True, nogil=True)
def _decimal_width(value):
    width = 1
    while value >= 10:
        value //= 10
        width += 1
    return width


@numba.njit(cache=True, nogil=True)
def _write_decimal(out, pos, value, terminator):
    """Write `value` in decimal and one terminator byte at out[pos]; returns the next pos."""
    width = _decimal_width(value)
    for digit in range(width - 1, -1, -1):
        out[pos + digit] = 48 + value % 10
        value //= 10
    out[pos + width] = terminator
    return pos + width + 1


@numba.njit(cache=True, nogil=True)
def _format_pairs(src, dst):
    """SNAP text lines 'src<TAB>dst<LF>' as uint8 bytes."""
    size = 0
    for i in range(src.shape[0]):
        size += _decimal_width(src[i]) + _decimal_width(dst[i]) + 2
    out = np.empty(size, dtype=np.uint8)
    pos = 0
    for i in range(src.shape[0]):
        pos = _write_decimal(out, pos, src[i], 9)
        pos = _write_decimal(out, pos, dst[i], 10)
    return out


def write_edge_list(
    path, src: np.ndarray, dst: np.ndarray, num_nodes: int, title: str = "gnnio graph", compress: Optional[bool] = None
) -> None:
    """Write a SNAP-style text edge list: '#' header with 'Nodes: N Edges: E', then
    'src<TAB>dst' lines. gzip-compressed if `compress`; None: if the name ends in .gz."""
    header = (
        f"# Directed graph: {title} {WRITER_MARK}\n"
        f"# Nodes: {num_nodes} Edges: {src.size}\n"
        "# FromNodeId\tToNodeId\n"
    ).encode()
    body = _format_pairs(np.ascontiguousarray(src, dtype=np.int64), np.ascontiguousarray(dst, dtype=np.int64))
    opener = gzip.open if (str(path).endswith(".gz") if compress is None else compress) else open
    with opener(path, "wb") as handle:
        handle.write(header)
        handle.write(memoryview(body))


def is_gnnio_edge_list(path: Path) -> bool:
    """Whether `path` is an edge list gnnio wrote (its first line carries WRITER_MARK)."""
    try:
        with open(path, "rb") as handle:
            compressed = handle.read(2) == GZIP_MAGIC
        with (gzip.open if compressed else open)(path, "rb") as handle:
            first = handle.readline(4096)
    except (OSError, EOFError):
        return False
    return first.startswith(b"# ") and first.rstrip().endswith(WRITER_MARK.encode())
