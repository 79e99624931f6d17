"""Matrix Market coordinate files: 1-based (row, column[, value]) entries, row = source.

The banner decides what an entry line holds: ``pattern`` two indices,
``real``/``integer`` a value too (kept as the edge's weight). ``symmetric``
(and ``hermitian``, which for real values is the same) stores one triangle:
the graph gets every entry and its mirror; ``skew-symmetric`` mirrors with
the value negated. Indices must lie within the size line's dimensions, and
the entry count must match it exactly.
"""

from __future__ import annotations

import re

import numpy as np

from gnnio_cli.errors import InputFormatError
from gnnio_cli.graph.io.edges import EdgeList
from gnnio_cli.graph.io.text import HEADER_SCAN_BYTES, TextLayout, parse_pairs

BANNER = re.compile(rb"^%%matrixmarket\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.IGNORECASE)
BANNER_PREFIX = b"%%matrixmarket"
FIELDS = ("pattern", "real", "integer", "double")
SYMMETRIES = ("general", "symmetric", "skew-symmetric", "hermitian")


def read_mtx(data: np.ndarray, name: str) -> EdgeList:
    head = data[:HEADER_SCAN_BYTES].tobytes()
    first_newline = head.find(b"\n")
    banner = BANNER.match(head[: first_newline if first_newline >= 0 else len(head)].rstrip(b"\r"))
    if not banner:
        raise InputFormatError(f"{name}: line 1: not a Matrix Market banner ('%%MatrixMarket matrix coordinate ...')")
    obj, layout, field, symmetry = (part.decode(errors="replace").lower() for part in banner.groups())
    if obj != "matrix" or layout != "coordinate":
        raise InputFormatError(f"{name}: line 1: only 'matrix coordinate' Matrix Market files are graphs, got '{obj} {layout}'")
    if field not in FIELDS:
        raise InputFormatError(f"{name}: line 1: unsupported Matrix Market field '{field}' (pattern, real or integer)")
    if symmetry not in SYMMETRIES:
        raise InputFormatError(f"{name}: line 1: unknown Matrix Market symmetry '{symmetry}'")
    offset, line = first_newline + 1, 2
    while True:
        newline = head.find(b"\n", offset)
        if newline < 0:
            raise InputFormatError(f"{name}: no Matrix Market size line ('rows cols entries') after the banner")
        text = head[offset:newline].strip()
        offset, line = newline + 1, line + 1
        if text and not text.startswith(b"%"):
            break
    size_line = line - 1
    sizes = text.split()
    if len(sizes) != 3 or not all(part.isdigit() for part in sizes):
        raise InputFormatError(f"{name}: line {size_line}: expected 'rows cols entries', got {text.decode(errors='replace')!r}")
    rows, cols, entries = (int(part) for part in sizes)
    if rows != cols:
        raise InputFormatError(f"{name}: line {size_line}: matrix is {rows} x {cols}; a graph's adjacency matrix is square")
    if field == "pattern":
        layout = TextLayout(2, "unexpected third field (a 'pattern' Matrix Market file has only row and column)")
    else:
        layout = TextLayout(3, "more than three fields (row, column, value)",
                            f"no value (a '{field}' Matrix Market file has one per entry)")
    src, dst, weights = parse_pairs(data, name, start=offset, first_line=line, id_base=1, id_limit=rows, layout=layout)
    if src.size < entries:
        raise InputFormatError(f"{name}: size line promises {entries} entries, found {src.size} (truncated file?)")
    if src.size > entries:
        raise InputFormatError(f"{name}: {src.size} entries, more than the {entries} the size line (line {size_line}) promises")
    return EdgeList(src=src, dst=dst, declared_num_nodes=rows, format="mtx", name=name, weights=weights,
                    symmetric=symmetry != "general", skew=symmetry == "skew-symmetric")
