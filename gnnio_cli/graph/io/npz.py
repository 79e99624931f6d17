"""scipy sparse matrices saved with ``scipy.sparse.save_npz``: row = source, column = target.

The stored values become edge weights unless every one is 1 (or the matrix
is boolean): saving a plain adjacency matrix always stores ones.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.io.edges import EdgeList

ZIP_MAGIC = b"PK\x03\x04"
_SPARSE_KEYS = {"format", "shape"}


def read_npz(data: np.ndarray, name: str) -> EdgeList:
    import scipy.sparse

    if not data[:4].tobytes().startswith(ZIP_MAGIC):
        raise GnnioError(f"{name}: not an .npz file (a zip archive); text edge lists need --format edgelist, csv or tsv")
    buffer = io.BytesIO(data.tobytes())
    try:
        with np.load(buffer, allow_pickle=False) as archive:
            keys = sorted(archive.files)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise GnnioError(f"{name}: not a readable .npz archive ({_without_buffer(err, buffer, name)})") from None
    if not _SPARSE_KEYS <= set(keys):
        raise GnnioError(
            f"{name}: not a scipy sparse .npz: it holds arrays {', '.join(keys) or '(none)'}, not a sparse matrix; "
            "write one with scipy.sparse.save_npz"
        )
    buffer.seek(0)
    try:
        matrix = scipy.sparse.load_npz(buffer)
    except Exception as err:  # scipy raises ValueError, KeyError, BadZipFile, OSError ...
        raise GnnioError(f"{name}: not a readable scipy sparse .npz ({_without_buffer(err, buffer, name)})") from None
    rows, cols = matrix.shape
    if rows != cols:
        raise GnnioError(f"{name}: matrix is {rows} x {cols}; a graph's adjacency matrix is square")
    if matrix.dtype.kind == "c":
        raise GnnioError(f"{name}: complex values ({matrix.dtype}) are not edge weights; save the real part")
    coo = matrix.tocoo()
    values = coo.data
    weighted = values.dtype != np.bool_ and not bool(np.all(values == 1))
    if weighted and not np.all(np.isfinite(values)):
        raise GnnioError(f"{name}: the matrix holds NaN or infinite values; edge weights must be finite")
    return EdgeList(
        src=coo.row.astype(np.int64),
        dst=coo.col.astype(np.int64),
        declared_num_nodes=int(rows),
        format="npz",
        name=name,
        weights=values.astype(np.float64) if weighted else None,
    )


def _without_buffer(err: Exception, buffer: io.BytesIO, name: str) -> str:
    """The error's message with the in-memory file's repr replaced by the input's name."""
    message = str(err).replace(repr(buffer), name) or type(err).__name__
    return " ".join(message.split())
