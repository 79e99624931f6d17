"""Reading edge lists from files: SNAP-style text, CSV/TSV, Matrix Market, scipy .npz.

Every reader returns an :class:`EdgeList`: int64 source and target arrays
(row 0 / row 1 of an ``edge_index``, see DESIGN.md "Direction") plus the node
count the file declares, if it declares one (a SNAP ``# Nodes: N`` comment, the
Matrix Market size line, the shape of a sparse matrix).

Text is parsed by a numba kernel over the file's bytes, in parallel over
chunks cut at line boundaries, so a 16M-edge file parses about as fast as the
disk delivers it. Accepted text, for every text format:

- one edge per line: source, then target, each a non-negative decimal integer;
  fields separated by spaces, tabs, or a comma/semicolon (with optional blanks);
  further fields (weights, timestamps) are ignored;
- lines starting with ``#`` or ``%`` are comments; blank lines are skipped;
  ``\\r\\n`` line ends are accepted;
- ``csv``/``tsv`` may start with a header line (first data line not two integers).

Compressed input (gzip) is recognised by its magic bytes, whatever the name;
``-`` reads standard input. Malformed input raises :class:`InputFormatError`
naming the file, the line number and the offending text.
"""

from __future__ import annotations

import gzip
import io
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numba
import numpy as np

from gnnio_cli.errors import GnnioError, InputFormatError

FORMATS = ("edgelist", "csv", "tsv", "mtx", "npz")

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_HDF5_MAGIC = b"\x89HDF"
_EXTENSIONS = {
    ".mtx": "mtx",
    ".npz": "npz",
    ".csv": "csv",
    ".tsv": "tsv",
}

# Parser status codes (shared by the numba kernel and the messages below).
_OK, _MISSING_FIELD, _NOT_INTEGER, _NEGATIVE, _TOO_LARGE, _BELOW_BASE, _OUT_OF_RANGE = range(7)
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64

# Chunks smaller than this are parsed by one thread: splitting costs more than it saves.
_MIN_CHUNK_BYTES = 1 << 22
_HEADER_SCAN_BYTES = 1 << 16


@dataclass
class EdgeList:
    """Edges as read from a file.

    src, dst: int64 [E], ids as in the file (0-based; Matrix Market ids are
    shifted from 1-based). declared_num_nodes: the node count the file states,
    or None. symmetric: the file stores one triangle of a symmetric matrix:
    the graph has src/dst and their :func:`mirror`. sha256: hex digest of the
    raw input bytes (as stored, compressed or not).
    """

    src: np.ndarray
    dst: np.ndarray
    declared_num_nodes: Optional[int]
    format: str
    name: str
    sha256: str = ""
    symmetric: bool = False

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])


# --------------------------------------------------------------------- bytes


def check_input_file(path: str) -> Path:
    """`path` as a Path if it names an existing file, else a one-line GnnioError."""
    file = Path(path)
    if not file.exists():
        raise GnnioError(f"{path}: no such file")
    if file.is_dir():
        raise GnnioError(f"{path}: is a folder, not an edge list")
    return file


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
            if head.startswith(_GZIP_MAGIC):
                return InputBytes(np.frombuffer(_gunzip_bytes(raw, "<stdin>"), dtype=np.uint8), head, raw)
            data = np.frombuffer(raw, dtype=np.uint8)
            return InputBytes(data, head, data)
        file = check_input_file(path)
        with open(file, "rb") as handle:
            head = handle.read(4)
            if head.startswith(_GZIP_MAGIC):
                return InputBytes(_gunzip_file(file), head, None)
            data = _map_file(handle)
        return InputBytes(data, head, data)
    except PermissionError:
        raise GnnioError(f"{path}: permission denied") from None


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


# -------------------------------------------------------------- format choice


def detect_format(path: str, head: bytes) -> str:
    """Format from the name (a trailing .gz ignored), else from the first bytes."""
    name = Path(path).name.lower() if path != "-" else ""
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    if head.startswith(_ZIP_MAGIC):
        return "npz"
    return "edgelist"


def _check_not_binary(path: str, head: bytes, data: np.ndarray) -> None:
    if head.startswith(_HDF5_MAGIC) or data[:4].tobytes().startswith(_HDF5_MAGIC):
        raise GnnioError(f"{path}: is an HDF5 file; 'gnnio convert' reads edge lists (load .h5 graphs directly)")
    if data[:4].tobytes().startswith(_ZIP_MAGIC):
        raise GnnioError(f"{path}: is a zip/npz archive; use --format npz")


# ------------------------------------------------------------ numba parsing


@numba.njit(cache=True, nogil=True, inline="always")
def _is_field_end(byte):
    """Blank, ',', ';' or a line end."""
    return byte == 32 or byte == 9 or byte == 44 or byte == 59 or byte == 10 or byte == 13


@numba.njit(cache=True, nogil=True, inline="always")
def _skip_separator(buf, pos):
    """Skip blanks, at most one ',' or ';', blanks."""
    while buf[pos] == 32 or buf[pos] == 9:
        pos += 1
    if buf[pos] == 44 or buf[pos] == 59:
        pos += 1
        while buf[pos] == 32 or buf[pos] == 9:
            pos += 1
    return pos


@numba.njit(cache=True, nogil=True)
def _diagnose_field(buf, pos):
    """(status, value, position after the field) of the id expected at buf[pos]."""
    first = pos
    value = 0
    while 48 <= buf[pos] <= 57:
        value = value * 10 + (np.int64(buf[pos]) - 48)
        pos += 1
    if pos == first:
        byte = buf[pos]
        if byte == 10 or byte == 13:
            return _MISSING_FIELD, value, pos
        if byte == 45 and 48 <= buf[pos + 1] <= 57:  # '-' then a digit
            return _NEGATIVE, value, pos
        return _NOT_INTEGER, value, pos
    if not _is_field_end(buf[pos]):
        return _NOT_INTEGER, value, pos
    if pos - first > _MAX_DIGITS:
        return _TOO_LARGE, value, pos
    return _OK, value, pos


@numba.njit(cache=True, nogil=True)
def _diagnose_line(buf, pos, id_base, id_limit):
    """Why the line at buf[pos] was rejected (the slow path, once per file)."""
    status, source, pos = _diagnose_field(buf, pos)
    if status != _OK:
        return status
    status, target, _ = _diagnose_field(buf, _skip_separator(buf, pos))
    if status != _OK:
        return status
    if min(source, target) < id_base:
        return _BELOW_BASE
    return _OUT_OF_RANGE


# SWAR ("SIMD within a register") parsing of the common line shape
# "<digits><one separator><digits>\n": 8 bytes at a time, no per-digit branches.
_ASCII_ZEROS = np.uint64(0x3030303030303030)
_DIGIT_TEST = np.uint64(0x7676767676767676)
_HIGH_BITS = np.uint64(0x8080808080808080)
_BYTE_INDEX = np.uint64(0x0001020304050607)
_PAIRS = np.uint64(0x00FF00FF00FF00FF)
_QUADS = np.uint64(0x0000FFFF0000FFFF)
_LOW_HALF = np.uint64(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _load8(words, pos):
    """The 8 bytes at byte offset `pos` as a little-endian uint64 (words[pos // 8 + 1] must exist)."""
    index = pos >> 3
    shift = np.uint64((pos & 7) * 8)
    return (words[index] >> shift) | ((words[index + 1] << (np.uint64(63) - shift)) << np.uint64(1))


@numba.njit(cache=True, nogil=True, inline="always")
def _swar_decimal(word):
    """(value, digit count) of the leading decimal digits of 8 bytes;
    count 0 when the first byte is not a digit, 8 when all are (too long here)."""
    digits = word ^ _ASCII_ZEROS
    non_digit = ((digits + _DIGIT_TEST) | digits) & _HIGH_BITS
    if non_digit == 0:
        return 0, 8
    lowest = non_digit & (~non_digit + np.uint64(1))
    count = ((lowest >> np.uint64(7)) * _BYTE_INDEX) >> np.uint64(56)
    if count == 0:
        return 0, 0
    value = digits << (np.uint64(64) - np.uint64(8) * count)  # the digits, most significant in the lowest byte used
    value = (value * np.uint64(10) + (value >> np.uint64(8))) & _PAIRS
    value = (value * np.uint64(100) + (value >> np.uint64(16))) & _QUADS
    value = (value * np.uint64(10000) + (value >> np.uint64(32))) & _LOW_HALF
    return np.int64(value), np.int64(count)


@numba.njit(cache=True, nogil=True, inline="always")
def _fast_line(words, pos):
    """Parse "<1-7 digits><blank or ,;><1-7 digits>" + line end at byte `pos`.

    Returns (ok, source, target, position of the byte after the target).
    Anything else (comments, longer ids, several blanks, errors) is left
    to the general byte loop: ok is False and nothing is consumed.
    """
    word = _load8(words, pos)
    source, count = _swar_decimal(word)
    if count == 0 or count == 8:
        return False, 0, 0, pos
    separator = (word >> (np.uint64(8) * np.uint64(count))) & np.uint64(0xFF)
    if not (separator == 9 or separator == 32 or separator == 44 or separator == 59):
        return False, 0, 0, pos
    pos += count + 1
    word = _load8(words, pos)
    target, count = _swar_decimal(word)
    if count == 0 or count == 8:
        return False, 0, 0, pos
    ending = (word >> (np.uint64(8) * np.uint64(count))) & np.uint64(0xFF)
    if not _is_field_end(ending):
        return False, 0, 0, pos
    return True, source, target, pos + count


@numba.njit(cache=True, nogil=True)
def _parse_lines(buf, words, start, end, line, src, dst, out, id_base, id_limit, error):
    """Parse the lines of buf[start:end] into src/dst from slot `out` on.

    buf[end - 1] must be a newline: every scan stops at one, so the inner
    loops need no bounds checks. words: buf's bytes as uint64 (empty when
    buf is not 8-byte aligned) for the SWAR fast path. `line` is the
    1-based number of the first line. Returns the number of edges written;
    at the first bad line, stops and fills error = [status, line number,
    byte offset of the line]. The loop only detects that a line is bad;
    _diagnose_line says why.
    """
    written = 0
    pos = start
    fast_end = min(end, (words.shape[0] - 2) * 8)  # both 8-byte loads of a line stay inside words
    while pos < end:
        if pos + 16 <= fast_end:
            ok, source, target, after = _fast_line(words, pos)
            if ok:
                source -= id_base
                target -= id_base
                if source >= 0 and target >= 0 and (id_limit < 0 or (source < id_limit and target < id_limit)):
                    src[out + written] = source
                    dst[out + written] = target
                    written += 1
                    pos = after
                    while buf[pos] != 10:  # '\r' or further fields
                        pos += 1
                    pos += 1
                    line += 1
                    continue
        byte = buf[pos]
        while byte == 32 or byte == 9 or byte == 13:
            pos += 1
            byte = buf[pos]
        if byte == 10 or byte == 35 or byte == 37:  # blank line, '#' or '%' comment
            while buf[pos] != 10:
                pos += 1
            pos += 1
            line += 1
            continue
        line_start = pos
        source = 0
        digit = np.int64(byte) - 48
        while 0 <= digit <= 9:
            source = source * 10 + digit
            pos += 1
            digit = np.int64(buf[pos]) - 48
        source_digits = pos - line_start
        good = 0 < source_digits <= _MAX_DIGITS and _is_field_end(buf[pos])
        pos = _skip_separator(buf, pos)
        field_start = pos
        target = 0
        digit = np.int64(buf[pos]) - 48
        while 0 <= digit <= 9:
            target = target * 10 + digit
            pos += 1
            digit = np.int64(buf[pos]) - 48
        target_digits = pos - field_start
        good = good and 0 < target_digits <= _MAX_DIGITS and _is_field_end(buf[pos])
        source -= id_base
        target -= id_base
        good = good and source >= 0 and target >= 0 and (id_limit < 0 or (source < id_limit and target < id_limit))
        if not good:
            error[0] = _diagnose_line(buf, line_start, id_base, id_limit)
            error[1] = line
            error[2] = line_start
            return written
        src[out + written] = source
        dst[out + written] = target
        written += 1
        while buf[pos] != 10:  # further fields are ignored
            pos += 1
        pos += 1
        line += 1
    return written


_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_LOW_SEVEN = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONE_PER_BYTE = np.uint64(0x0101010101010101)


@numba.njit(cache=True, nogil=True, inline="always")
def _newlines_in_word(word):
    """How many of the 8 bytes of `word` are '\n' (exact zero-byte test, no borrows between bytes)."""
    x = word ^ _NEWLINES
    zero_bytes = ~(((x & _LOW_SEVEN) + _LOW_SEVEN) | x | _LOW_SEVEN)
    return np.int64(((zero_bytes >> np.uint64(7)) * _ONE_PER_BYTE) >> np.uint64(56))


@numba.njit(cache=True, nogil=True, parallel=True)
def _count_newlines(buf, words, bounds, counts):
    """counts[c] = newlines in buf[bounds[c]:bounds[c+1]]; whole words 8 bytes at a time."""
    for chunk in numba.prange(bounds.shape[0] - 1):
        start, end = bounds[chunk], bounds[chunk + 1]
        total = 0
        pos = start
        if words.shape[0] > 0:
            while pos < end and pos % 8 != 0:
                total += buf[pos] == 10
                pos += 1
            while pos + 8 <= end:
                total += _newlines_in_word(words[pos >> 3])
                pos += 8
        while pos < end:
            total += buf[pos] == 10
            pos += 1
        counts[chunk] = total


@numba.njit(cache=True, nogil=True, parallel=True)
def _parse_chunks(buf, words, bounds, first_lines, slots, id_base, id_limit, src, dst, written, errors):
    for chunk in numba.prange(bounds.shape[0] - 1):
        written[chunk] = _parse_lines(
            buf, words, bounds[chunk], bounds[chunk + 1], first_lines[chunk], src, dst, slots[chunk], id_base, id_limit,
            errors[chunk],
        )


def _as_words(data: np.ndarray) -> np.ndarray:
    """data's whole 8-byte words as uint64 (a view), or an empty array when data is not 8-byte aligned."""
    if data.ctypes.data % 8:
        return np.empty(0, dtype=np.uint64)
    return data[: data.size // 8 * 8].view(np.uint64)


def _chunk_bounds(data: np.ndarray, start: int, end: int) -> np.ndarray:
    """Offsets cutting data[start:end] (which ends with a newline) into about
    four chunks per thread, each cut just after a newline."""
    size = end - start
    num_chunks = int(max(1, min(numba.get_num_threads() * 4, size // _MIN_CHUNK_BYTES)))
    bounds = [start]
    for chunk in range(1, num_chunks):
        guess = start + chunk * size // num_chunks
        newline = data[guess : guess + (1 << 20)].tobytes().find(b"\n")
        if newline >= 0 and guess + newline + 1 > bounds[-1]:  # a megabyte-long line: no cut here
            bounds.append(guess + newline + 1)
    bounds.append(end)
    return np.unique(np.asarray(bounds, dtype=np.int64))


def _describe(status: int, id_base: int, id_limit: int) -> str:
    return {
        _MISSING_FIELD: "expected two node ids (source and target)",
        _NOT_INTEGER: "node ids must be integers",
        _NEGATIVE: "node ids must be non-negative",
        _TOO_LARGE: f"node id has more than {_MAX_DIGITS} digits",
        _BELOW_BASE: f"node ids are {id_base}-based here, got {id_base - 1}",
        _OUT_OF_RANGE: f"node id beyond the declared size {id_limit}",
    }[status]


def _line_text(data: np.ndarray, offset: int) -> str:
    chunk = data[offset : offset + 200].tobytes()
    text = chunk.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")
    return text if len(text) <= 80 else text[:77] + "..."


def _split_last_line(data: np.ndarray, start: int) -> tuple[int, np.ndarray]:
    """(end of the newline-terminated body of data[start:], the rest as a
    newline-terminated copy, empty when the data ends with a newline)."""
    if data.size == start or data[-1] == 10:
        return data.size, np.empty(0, dtype=np.uint8)
    window = max(start, data.size - (1 << 20))
    newline = data[window:].tobytes().rfind(b"\n")
    body_end = window + newline + 1 if newline >= 0 else start
    return body_end, np.frombuffer(data[body_end:].tobytes() + b"\n", dtype=np.uint8)


def parse_pairs(
    data: np.ndarray,
    name: str,
    start: int = 0,
    first_line: int = 1,
    id_base: int = 0,
    id_limit: int = -1,
    header_hint_line: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Parse text lines of `data[start:]` into (src, dst) int64 arrays.

    first_line: the 1-based number of the line at `start`. id_base:
    subtracted from every id (1 for Matrix Market); id_limit: ids after the
    shift must be below it (-1: no limit). Raises InputFormatError naming
    `name`, the line and its text at the first bad line; if that is line
    `header_hint_line` and holds a non-integer, the message suggests
    --format csv for a header.
    """
    body_end, last_line = _split_last_line(data, start)
    bounds = _chunk_bounds(data, start, body_end)
    num_chunks = bounds.size - 1
    newlines = np.empty(num_chunks, dtype=np.int64)
    words = _as_words(data)
    _count_newlines(data, words, bounds, newlines)
    first_lines = first_line + np.concatenate(([0], np.cumsum(newlines))).astype(np.int64)
    slots = np.concatenate(([0], np.cumsum(newlines))).astype(np.int64)
    total = int(newlines.sum()) + (1 if last_line.size else 0)
    src = np.empty(total, dtype=np.int64)
    dst = np.empty(total, dtype=np.int64)
    written = np.zeros(num_chunks + 1, dtype=np.int64)
    errors = np.zeros((num_chunks + 1, 3), dtype=np.int64)
    _parse_chunks(data, words, bounds, first_lines, slots, int(id_base), int(id_limit), src, dst, written, errors)
    if last_line.size:
        written[-1] = _parse_lines(
            last_line, _as_words(last_line), 0, last_line.size, first_lines[-1], src, dst, slots[-1], int(id_base),
            int(id_limit), errors[-1],
        )
    failed = np.flatnonzero(errors[:, 0])
    if failed.size:
        status, line, offset = (int(v) for v in errors[failed[0]])
        text = _line_text(last_line if failed[0] == num_chunks else data, offset)
        looks_like_header = status == _NOT_INTEGER and line == header_hint_line
        hint = " (if this is a header, use --format csv)" if looks_like_header else ""
        raise InputFormatError(f"{name}: line {line}: {_describe(status, id_base, id_limit)}: {text!r}{hint}")
    count = int(written.sum())
    # Move each chunk's edges down over the slots that comments and blank lines left free.
    position = 0
    for chunk in range(num_chunks + 1):
        begin, length = int(slots[chunk]), int(written[chunk])
        if begin != position and length:
            src[position : position + length] = src[begin : begin + length]
            dst[position : position + length] = dst[begin : begin + length]
        position += length
    if count < total * 0.9:
        return src[:count].copy(), dst[:count].copy()
    return src[:count], dst[:count]


# ---------------------------------------------------------------- formats

_SNAP_NODES = re.compile(rb"^[#%].*?\bNodes:\s*(\d+)", re.MULTILINE)
_TWO_INTEGERS = re.compile(rb"^\s*\d+\s*[,;]?\s*\d+(\s|[,;]|$)")


def _leading_comments(data: np.ndarray) -> tuple[bytes, int, int]:
    """(comment block text, byte offset and 1-based line of the first non-comment line)."""
    head = data[:_HEADER_SCAN_BYTES].tobytes()
    offset = 0
    line = 1
    while offset < len(head):
        newline = head.find(b"\n", offset)
        stripped = head[offset : newline if newline >= 0 else len(head)].strip()
        if stripped and not stripped.startswith((b"#", b"%")):
            break
        if newline < 0:
            offset = len(head)
            break
        offset = newline + 1
        line += 1
    return head[:offset], offset, line


def _read_text(data: np.ndarray, name: str, fmt: str) -> EdgeList:
    comments, offset, line = _leading_comments(data)
    declared = None
    match = _SNAP_NODES.search(comments)
    if match:
        declared = int(match.group(1))
    first_data = data[offset : offset + 4096].tobytes().split(b"\n", 1)[0]
    has_header = fmt in ("csv", "tsv") and bool(first_data) and not _TWO_INTEGERS.match(first_data)
    if has_header:
        src, dst = parse_pairs(data, name, start=offset + len(first_data) + 1, first_line=line + 1)
    else:
        src, dst = parse_pairs(data, name, header_hint_line=line if fmt == "edgelist" else 0)
    return EdgeList(src=src, dst=dst, declared_num_nodes=declared, format=fmt, name=name)


_MTX_BANNER = re.compile(rb"^%%matrixmarket\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.IGNORECASE)


def _read_mtx(data: np.ndarray, name: str) -> EdgeList:
    """Matrix Market coordinate: 1-based (row, col) entries, row = source."""
    head = data[:_HEADER_SCAN_BYTES].tobytes()
    first_newline = head.find(b"\n")
    banner = _MTX_BANNER.match(head[: first_newline if first_newline >= 0 else len(head)].rstrip(b"\r"))
    if not banner:
        raise InputFormatError(f"{name}: line 1: not a Matrix Market banner ('%%MatrixMarket matrix coordinate ...')")
    obj, layout, field, symmetry = (part.decode().lower() for part in banner.groups())
    if obj != "matrix" or layout != "coordinate":
        raise InputFormatError(f"{name}: line 1: only 'matrix coordinate' Matrix Market files are graphs, got '{obj} {layout}'")
    if field not in ("pattern", "real", "integer", "double"):
        raise InputFormatError(f"{name}: line 1: unsupported Matrix Market field '{field}' (pattern, real or integer)")
    if symmetry not in ("general", "symmetric", "skew-symmetric", "hermitian"):
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
    sizes = text.split()
    if len(sizes) != 3 or not all(part.isdigit() for part in sizes):
        raise InputFormatError(f"{name}: line {line - 1}: expected 'rows cols entries', got {text.decode(errors='replace')!r}")
    rows, cols, entries = (int(part) for part in sizes)
    if rows != cols:
        raise InputFormatError(f"{name}: line {line - 1}: matrix is {rows} x {cols}; a graph's adjacency matrix is square")
    src, dst = parse_pairs(data, name, start=offset, first_line=line, id_base=1, id_limit=rows)
    if src.size != entries:
        raise InputFormatError(f"{name}: size line promises {entries} entries, found {src.size} (truncated file?)")
    return EdgeList(src=src, dst=dst, declared_num_nodes=rows, format="mtx", name=name, symmetric=symmetry != "general")


def mirror(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Append the reverse of every edge that is not a self-loop: [E] -> [E + E_nonloop]."""
    off_diagonal = src != dst
    return np.concatenate((src, dst[off_diagonal])), np.concatenate((dst, src[off_diagonal]))


def _read_npz(source, name: str) -> EdgeList:
    """A scipy sparse matrix saved with save_npz: row = source, column = target."""
    import scipy.sparse

    try:
        matrix = scipy.sparse.load_npz(source)
    except Exception as err:  # scipy raises ValueError, KeyError, BadZipFile, OSError ...
        raise GnnioError(f"{name}: not a scipy sparse .npz (save_npz) file: {err}") from None
    rows, cols = matrix.shape
    if rows != cols:
        raise GnnioError(f"{name}: matrix is {rows} x {cols}; a graph's adjacency matrix is square")
    coo = matrix.tocoo()
    return EdgeList(
        src=coo.row.astype(np.int64),
        dst=coo.col.astype(np.int64),
        declared_num_nodes=int(rows),
        format="npz",
        name=name,
    )


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
    data, head = content.data, content.head
    fmt = format or detect_format(path, head)
    if fmt == "npz":
        edges = _read_npz(io.BytesIO(data.tobytes()), name)
    else:
        _check_not_binary(name, head, data)
        edges = _read_mtx(data, name) if fmt == "mtx" else _read_text(data, name, fmt)
    if edges.num_edges == 0:
        raise GnnioError(f"{name}: no edges found (empty file?)")
    return edges


# ---------------------------------------------------------------- writing


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


def write_edge_list(path, src: np.ndarray, dst: np.ndarray, num_nodes: int, title: str = "gnnio graph") -> None:
    """Write a SNAP-style text edge list: '#' header with 'Nodes: N Edges: E', then
    'src<TAB>dst' lines. A name ending in .gz is gzip-compressed."""
    header = (
        f"# Directed graph: {title}\n"
        f"# Nodes: {num_nodes} Edges: {src.size}\n"
        "# FromNodeId\tToNodeId\n"
    ).encode()
    body = _format_pairs(np.ascontiguousarray(src, dtype=np.int64), np.ascontiguousarray(dst, dtype=np.int64))
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header)
        handle.write(memoryview(body))
