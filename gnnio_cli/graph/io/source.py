"""An input's bytes: plain files memory-mapped, gzip undone, standard input read whole.

gzip is recognised by its magic bytes, whatever the name. A UTF-8 byte-order
mark is dropped before any format sees the text; UTF-16 text is refused with
a hint, since every text format here is ASCII.
"""

from __future__ import annotations

import gzip
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph.files import check_readable

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def check_input_file(path: str) -> Path:
    """`path` as a Path if it names an existing, readable file, else a one-line GnnioError."""
    return check_readable(path, "an edge list")


@dataclass
class InputBytes:
    """An input file's content. data: uint8 [size], gzip already undone;
    head: its first raw bytes; raw: the raw bytes when they are in memory
    anyway (plain files: `data` itself; stdin: as read), else None."""

    data: np.ndarray
    head: bytes
    raw: Optional[object]


def read_bytes(path: str) -> InputBytes:
    """The whole input ("-": standard input), gzip recognised by its magic bytes.

    Raises GnnioError for missing or unreadable files and corrupt gzip streams.
    """
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
            head = raw[:4]
            if head.startswith(GZIP_MAGIC):
                return InputBytes(np.frombuffer(_gunzip_bytes(raw, "<stdin>"), dtype=np.uint8), head, raw)
            data = np.frombuffer(raw, dtype=np.uint8)
            return InputBytes(data, head, data)
        file = check_input_file(path)
        with open(file, "rb") as handle:
            head = handle.read(4)
            if head.startswith(GZIP_MAGIC):
                return InputBytes(_gunzip_file(file), head, None)
            data = _map_file(handle)
        return InputBytes(data, head, data)
    except PermissionError:
        raise GnnioError(f"{path}: permission denied") from None
    except OSError as err:  # an I/O error on the device, a file that vanished meanwhile
        raise GnnioError(f"{path}: could not read: {err.strerror or err}") from None


def _map_file(handle) -> np.ndarray:
    """The file's bytes, memory-mapped read-only: parsing reads the page cache
    directly instead of a private copy (the mapping lives as long as the array)."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        return np.empty(0, dtype=np.uint8)
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(handle.fileno(), size, flags=flags, prot=mmap.PROT_READ), dtype=np.uint8)


def _gunzip_bytes(raw: bytes, name: str) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise GnnioError(f"{name}: corrupt or truncated gzip data ({err})") from None


def _gunzip_file(file: Path) -> np.ndarray:
    """Decompress into one growing numpy buffer, sized from the gzip trailer so
    a single-member file is read without any copy."""
    with open(file, "rb") as handle:
        handle.seek(-4, 2)
        size_hint = struct.unpack("<I", handle.read(4))[0]
    buffer = np.empty(max(size_hint, 1 << 16), dtype=np.uint8)
    filled = 0
    try:
        with gzip.open(file, "rb") as stream:
            while True:
                if filled == buffer.size:
                    grown = np.empty(buffer.size * 2, dtype=np.uint8)
                    grown[:filled] = buffer[:filled]
                    buffer = grown
                got = stream.readinto(memoryview(buffer)[filled:])
                if not got:
                    break
                filled += got
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise GnnioError(f"{file}: corrupt or truncated gzip data ({err})") from None
    return buffer[:filled]


def without_byte_order_mark(data: np.ndarray, name: str) -> np.ndarray:
    """Text without a leading UTF-8 byte-order mark (copied, so the parser's
    8-byte alignment holds); UTF-16 text is refused."""
    start = data[:3].tobytes()
    if start.startswith(UTF16_BOMS):
        raise GnnioError(f"{name}: is UTF-16 text; save it as UTF-8 or ASCII (e.g. iconv -f UTF-16 -t UTF-8)")
    if start == UTF8_BOM:
        return data[3:].copy()
    return data
