"""Text edge lists (SNAP-style, CSV, TSV) and the parser every text format shares.

Text is parsed by a numba kernel over the file's bytes, in parallel over
chunks cut at line boundaries, so a 16M-edge file parses about as fast as the
disk delivers it. Accepted text, for every text format:

- one edge per line: source, then target, each a non-negative decimal
  integer up to 2^63 - 1; fields separated by spaces, tabs, or a
  comma/semicolon (with optional blanks);
- an optional third field, the edge's weight: a finite decimal number
  (``1``, ``-0.5``, ``2.5e-3``). The first edge line decides: with a weight
  there, every edge line needs one; without, none may have one. Anything
  past the weight is refused with its line number, never dropped;
- lines starting with ``#`` or ``%`` are comments; blank lines are skipped;
  ``\\r\\n`` line ends are accepted;
- ``csv``/``tsv`` may start with a header line (first data line not two integers).

A SNAP ``# Nodes: N`` comment before the first edge declares the node count.
Malformed input raises :class:`InputFormatError` naming the file, the line
number and the offending text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numba
import numpy as np

from gnnio_cli.errors import InputFormatError
from gnnio_cli.graph.io.edges import EdgeList

# Parser status codes (shared by the numba kernel and the messages below).
(_OK, _MISSING_FIELD, _NOT_INTEGER, _NEGATIVE, _TOO_LARGE, _BELOW_BASE, _OUT_OF_RANGE, _EXTRA_FIELD, _MISSING_WEIGHT,
 _BAD_WEIGHT) = range(10)
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64; longer ones are checked exactly
_INT64_MAX = np.uint64(2**63 - 1)
_MAX_SIGNIFICANT = 19  # decimal digits of a weight's mantissa kept (more only shift the exponent)

# Chunks smaller than this are parsed by one thread: splitting costs more than it saves.
_MIN_CHUNK_BYTES = 1 << 22
HEADER_SCAN_BYTES = 1 << 16

# Exact powers of ten: a mantissa below 2^53 times or over one of these is correctly rounded.
_EXACT_POWERS = np.array([10.0**k for k in range(23)])


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
def _long_id(buf, first, end):
    """(status, value) of the more than _MAX_DIGITS digits buf[first:end]: exact, leading zeros allowed."""
    while first < end - 1 and buf[first] == 48:
        first += 1
    if end - first > _MAX_DIGITS + 1:
        return _TOO_LARGE, 0
    value = np.uint64(0)
    for pos in range(first, end):
        value = value * np.uint64(10) + np.uint64(buf[pos] - 48)
    if end - first > _MAX_DIGITS and value > _INT64_MAX:  # 19 digits stay below 2^64: no wrap-around here
        return _TOO_LARGE, 0
    return _OK, np.int64(value)


@numba.njit(cache=True, nogil=True, inline="always")
def _digits(buf, pos):
    """(value, position after them) of the decimal digits at buf[pos] (none: 0, pos); wraps past 18 digits."""
    value = 0
    digit = np.int64(buf[pos]) - 48
    while 0 <= digit <= 9:
        value = value * 10 + digit
        pos += 1
        digit = np.int64(buf[pos]) - 48
    return value, pos


@numba.njit(cache=True, nogil=True, inline="always")
def _read_id(buf, pos):
    """(status, value, position after the field) of the node id expected at buf[pos]."""
    first = pos
    value, pos = _digits(buf, pos)
    if pos == first:
        byte = buf[pos]
        if byte == 10 or byte == 13:
            return _MISSING_FIELD, 0, pos
        if byte == 45 and 48 <= buf[pos + 1] <= 57:  # '-' then a digit
            return _NEGATIVE, 0, pos
        return _NOT_INTEGER, 0, pos
    if not _is_field_end(buf[pos]):
        return _NOT_INTEGER, 0, pos
    if pos - first > _MAX_DIGITS:
        status, value = _long_id(buf, first, pos)
        return status, value, pos
    return _OK, value, pos


@numba.njit(cache=True, nogil=True)
def _exact_ids(buf, pos, id_base, id_limit):
    """(status, source, target, position after the target) of the line at buf[pos],
    every id checked exactly (the slow path: errors and ids of 19 digits or leading zeros)."""
    status, source, pos = _read_id(buf, pos)
    target = 0
    if status == _OK:
        status, target, pos = _read_id(buf, _skip_separator(buf, pos))
    source -= id_base
    target -= id_base
    if status == _OK and (source < 0 or target < 0):
        status = _BELOW_BASE
    elif status == _OK and id_limit >= 0 and (source >= id_limit or target >= id_limit):
        status = _OUT_OF_RANGE
    return status, source, target, pos


@numba.njit(cache=True, nogil=True)
def _read_number(buf, pos, powers):
    """(status, value, position after the field) of the decimal number at buf[pos]:
    [+-] digits [. digits] [e [+-] digits], at least one mantissa digit, finite.

    Correctly rounded for up to 15 significant digits and exponents within
    +-22 (the usual weights); otherwise within 2 units in the last place.
    """
    negative = buf[pos] == 45
    if buf[pos] == 43 or buf[pos] == 45:
        pos += 1
    mantissa = np.uint64(0)
    significant = 0
    exponent = 0
    digits = 0
    while 48 <= buf[pos] <= 57:
        if significant < _MAX_SIGNIFICANT:
            mantissa = mantissa * np.uint64(10) + np.uint64(buf[pos] - 48)
            if mantissa > 0:
                significant += 1
        else:
            exponent += 1
        digits += 1
        pos += 1
    if buf[pos] == 46:  # '.'
        pos += 1
        while 48 <= buf[pos] <= 57:
            if significant < _MAX_SIGNIFICANT:
                mantissa = mantissa * np.uint64(10) + np.uint64(buf[pos] - 48)
                exponent -= 1
                if mantissa > 0:
                    significant += 1
            digits += 1
            pos += 1
    if digits == 0:
        return _BAD_WEIGHT, 0.0, pos
    if buf[pos] == 101 or buf[pos] == 69:  # 'e' or 'E'
        pos += 1
        exponent_negative = buf[pos] == 45
        if buf[pos] == 43 or buf[pos] == 45:
            pos += 1
        if not 48 <= buf[pos] <= 57:
            return _BAD_WEIGHT, 0.0, pos
        written = 0
        while 48 <= buf[pos] <= 57:
            if written < 100000:  # beyond any float64 range either way; stop growing
                written = written * 10 + (buf[pos] - 48)
            pos += 1
        exponent += -written if exponent_negative else written
    if not _is_field_end(buf[pos]):
        return _BAD_WEIGHT, 0.0, pos
    value = np.float64(mantissa)
    if mantissa == 0:
        value = 0.0
    elif mantissa < np.uint64(2**53) and -22 <= exponent <= 22:
        value = value * powers[exponent] if exponent >= 0 else value / powers[-exponent]
    elif exponent > 0:
        value = value * 10.0 ** min(exponent, 400)
    else:
        value = value / 10.0 ** min(-exponent, 400)
    if not np.isfinite(value):
        return _BAD_WEIGHT, 0.0, pos
    return _OK, -value if negative else value, pos


@numba.njit(cache=True, nogil=True, inline="always")
def _read_tail(buf, pos, columns, powers):
    """(status, weight, position of the line's newline) for the fields after the
    target id, which ends at buf[pos]: a weight when columns == 3, then only
    blanks up to the line end."""
    weight = 1.0
    if columns == 3:
        pos = _skip_separator(buf, pos)
        if buf[pos] == 10 or buf[pos] == 13:
            return _MISSING_WEIGHT, weight, pos
        status, weight, pos = _read_number(buf, pos, powers)
        if status != _OK:
            return status, weight, pos
    while buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 13:
        pos += 1
    if buf[pos] != 10:
        return _EXTRA_FIELD, weight, pos
    return _OK, weight, pos


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
def _parse_lines(buf, words, start, end, line, src, dst, weights, out, id_base, id_limit, columns, error):
    """Parse the lines of buf[start:end] into src/dst (and weights, when
    columns == 3) from slot `out` on.

    buf[end - 1] must be a newline: every scan stops at one, so the inner
    loops need no bounds checks. words: buf's bytes as uint64 (empty when
    buf is not 8-byte aligned) for the SWAR fast path. `line` is the
    1-based number of the first line. Returns the number of edges written;
    at the first bad line, stops and fills error = [status, line number,
    byte offset of the line]. The byte loop below only detects that a line
    needs a closer look; _exact_ids takes it, once per file at most, or per
    line for ids of 19 digits.
    """
    powers = _EXACT_POWERS
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
                    if columns == 2 and buf[after] == 10:  # the common line, done
                        status, weight, line_end = _OK, 1.0, after
                    else:
                        status, weight, line_end = _read_tail(buf, after, columns, powers)
                    if status == _OK:
                        src[out + written] = source
                        dst[out + written] = target
                        if columns == 3:
                            weights[out + written] = weight
                        written += 1
                        pos = line_end + 1
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
        # The digit loops are written out here: through _digits this loop runs about a fifth slower.
        source = 0
        digit = np.int64(byte) - 48
        while 0 <= digit <= 9:
            source = source * 10 + digit
            pos += 1
            digit = np.int64(buf[pos]) - 48
        good = 0 < pos - line_start <= _MAX_DIGITS and _is_field_end(buf[pos])
        pos = _skip_separator(buf, pos)
        field_start = pos
        target = 0
        digit = np.int64(buf[pos]) - 48
        while 0 <= digit <= 9:
            target = target * 10 + digit
            pos += 1
            digit = np.int64(buf[pos]) - 48
        good = good and 0 < pos - field_start <= _MAX_DIGITS and _is_field_end(buf[pos])
        source -= id_base
        target -= id_base
        good = good and source >= 0 and target >= 0 and (id_limit < 0 or (source < id_limit and target < id_limit))
        status = _OK
        if not good:  # an error, or ids longer than the loops above take
            status, source, target, pos = _exact_ids(buf, line_start, id_base, id_limit)
        weight = 1.0
        if status == _OK and not (columns == 2 and buf[pos] == 10):
            status, weight, pos = _read_tail(buf, pos, columns, powers)
        if status != _OK:
            error[0] = status
            error[1] = line
            error[2] = line_start
            return written
        src[out + written] = source
        dst[out + written] = target
        if columns == 3:
            weights[out + written] = weight
        written += 1
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
def _parse_chunks(buf, words, bounds, first_lines, slots, id_base, id_limit, columns, src, dst, weights, written, errors):
    for chunk in numba.prange(bounds.shape[0] - 1):
        written[chunk] = _parse_lines(
            buf, words, bounds[chunk], bounds[chunk + 1], first_lines[chunk], src, dst, weights, slots[chunk], id_base,
            id_limit, columns, errors[chunk],
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



@dataclass(frozen=True)
class TextLayout:
    """What an edge line holds (`columns`: 2, source and target; 3, and a
    weight) and what the messages say when a line holds more (`extra`) or
    lacks the weight (`missing`)."""

    columns: int
    extra: str
    missing: str = ""


EDGE_PAIRS = TextLayout(2, "more than two fields (source, target)")


def edge_layout(columns: int, line: int) -> TextLayout:
    """The layout of a text edge list whose first edge, on `line`, has `columns` fields."""
    if columns == 3:
        return TextLayout(3, "more than three fields (source, target, weight)",
                          f"no weight (line {line}, the first edge, has one; every edge line needs the same fields)")
    return TextLayout(2, f"unexpected third field (line {line}, the first edge, has two; every edge line needs the same fields)")


def _describe(status: int, id_base: int, id_limit: int, layout: TextLayout) -> str:
    return {
        _MISSING_FIELD: "expected two node ids (source and target)",
        _NOT_INTEGER: "node ids must be integers",
        _NEGATIVE: "node ids must be non-negative",
        _TOO_LARGE: "node id larger than 2^63 - 1",
        _BELOW_BASE: f"node ids are {id_base}-based here, got {id_base - 1}",
        _OUT_OF_RANGE: f"node id beyond the declared size {id_limit}",
        _BAD_WEIGHT: "the weight must be a finite decimal number",
        _EXTRA_FIELD: layout.extra,
        _MISSING_WEIGHT: layout.missing,
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
    layout: TextLayout = EDGE_PAIRS,
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Parse text lines of `data[start:]` into (src, dst, weights) arrays:
    int64, int64, and float64 when layout.columns == 3, else None.

    first_line: the 1-based number of the line at `start`. id_base:
    subtracted from every id (1 for Matrix Market); id_limit: ids after the
    shift must be below it (-1: no limit). Raises InputFormatError naming
    `name`, the line and its text at the first bad line; if that is line
    `header_hint_line` and holds a non-integer, the message suggests
    --format csv for a header.
    """
    columns = layout.columns
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
    weights = np.empty(total if columns == 3 else 0, dtype=np.float64)
    written = np.zeros(num_chunks + 1, dtype=np.int64)
    errors = np.zeros((num_chunks + 1, 3), dtype=np.int64)
    _parse_chunks(data, words, bounds, first_lines, slots, int(id_base), int(id_limit), columns, src, dst, weights,
                  written, errors)
    if last_line.size:
        written[-1] = _parse_lines(
            last_line, _as_words(last_line), 0, last_line.size, first_lines[-1], src, dst, weights, slots[-1],
            int(id_base), int(id_limit), columns, errors[-1],
        )
    failed = np.flatnonzero(errors[:, 0])
    if failed.size:
        status, line, offset = (int(v) for v in errors[failed[0]])
        text = _line_text(last_line if failed[0] == num_chunks else data, offset)
        looks_like_header = status == _NOT_INTEGER and line == header_hint_line
        hint = " (if this is a header, use --format csv)" if looks_like_header else ""
        raise InputFormatError(f"{name}: line {line}: {_describe(status, id_base, id_limit, layout)}: {text!r}{hint}")
    count = int(written.sum())
    arrays = [src, dst] + ([weights] if columns == 3 else [])
    # Move each chunk's edges down over the slots that comments and blank lines left free.
    position = 0
    for chunk in range(num_chunks + 1):
        begin, length = int(slots[chunk]), int(written[chunk])
        if begin != position and length:
            for array in arrays:
                array[position : position + length] = array[begin : begin + length]
        position += length
    arrays = [array[:count].copy() if count < total * 0.9 else array[:count] for array in arrays]
    return arrays[0], arrays[1], arrays[2] if columns == 3 else None


# ------------------------------------------------------- SNAP, CSV and TSV

_SNAP_NODES = re.compile(rb"^[#%].*?\bNodes:\s*(\d+)", re.MULTILINE)
_TWO_INTEGERS = re.compile(rb"^\s*\d+\s*[,;]?\s*\d+(\s|[,;]|$)")
_FIELD_SEPARATOR = re.compile(rb"\s*[,;]\s*|\s+")


def count_fields(line: bytes) -> int:
    """How many fields the parser's separators cut `line` into."""
    stripped = line.strip()
    return len(_FIELD_SEPARATOR.split(stripped)) if stripped else 0


def leading_comments(data: np.ndarray) -> tuple[bytes, int, int]:
    """(comment block text, byte offset and 1-based line of the first non-comment line)."""
    head = data[:HEADER_SCAN_BYTES].tobytes()
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


def _first_line(data: np.ndarray, offset: int) -> bytes:
    return data[offset : offset + 4096].tobytes().split(b"\n", 1)[0]


def read_text(data: np.ndarray, name: str, fmt: str) -> EdgeList:
    """A SNAP-style edge list, CSV or TSV (see the module docstring)."""
    comments, offset, line = leading_comments(data)
    declared, declared_by = None, ""
    match = _SNAP_NODES.search(comments)
    if match:
        declared = int(match.group(1))
        declared_line = comments[: match.start()].count(b"\n") + 1
        line_end = comments.find(b"\n", match.start())
        header_text = comments[match.start() : line_end if line_end >= 0 else None].decode(errors="replace").strip()
        declared_by = f"{header_text!r} on line {declared_line}"
    first_data = _first_line(data, offset)
    has_header = fmt in ("csv", "tsv") and bool(first_data) and not _TWO_INTEGERS.match(first_data)
    start, first_line = 0, 1  # the parser skips the comments itself
    if has_header:
        start, first_line = offset + len(first_data) + 1, line + 1
        first_edge = _first_line(data, start)
        header_columns, edge_columns = count_fields(first_data), count_fields(first_edge)
        if first_edge.strip() and header_columns != edge_columns:
            raise InputFormatError(
                f"{name}: line {line}: the header has {header_columns} fields but line {first_line} has {edge_columns}: "
                f"{first_data.decode(errors='replace').strip()!r}"
            )
    else:
        first_edge = first_data
    edge_line = first_line if has_header else line
    layout = edge_layout(3 if count_fields(first_edge) >= 3 else 2, edge_line)
    src, dst, weights = parse_pairs(
        data, name, start=start, first_line=first_line, header_hint_line=line if fmt == "edgelist" else 0, layout=layout
    )
    return EdgeList(src=src, dst=dst, declared_num_nodes=declared, format=fmt, name=name, weights=weights,
                    declared_by=declared_by)
