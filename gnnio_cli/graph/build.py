"""Linear-time construction of compressed rows from edge lists (numba).

Counting sorts keep every step O(E + N) and stable, so a 16M-edge graph is
built in a fraction of a second and the original edge order survives as the
`eid` of each slot. The sorts run over chunks of the edge list in parallel:
each chunk counts its keys into its own histogram, the histograms are turned
into disjoint write offsets, and each chunk scatters its edges in order, which
keeps the result stable and independent of the thread count.
"""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np

# Below this many edges per chunk, a parallel sort costs more in histogram
# memory and merging than it saves.
_MIN_EDGES_PER_CHUNK = 1 << 18


def _histograms(num_chunks: int, num_keys: int, num_items: int) -> np.ndarray:
    """Zeroed per-chunk counters; int32 while every offset fits, to halve the
    random-access footprint of the counting sorts."""
    dtype = np.int32 if num_items < 2**31 else np.int64
    return np.zeros((num_chunks, num_keys), dtype=dtype)


def _num_chunks(num_items: int, num_keys: int) -> int:
    """How many chunks to sort in parallel: bounded by threads, and by keeping
    the per-chunk histograms (num_chunks * num_keys) no larger than the input."""
    by_size = num_items // _MIN_EDGES_PER_CHUNK
    by_memory = num_items // max(num_keys, 1)
    return int(max(1, min(numba.get_num_threads(), by_size, by_memory)))


@numba.njit(cache=True, nogil=True)
def _counts_to_offsets(histograms):
    """Per-chunk key counts [chunks, keys] -> indptr int64 [keys + 1]; each
    count is replaced in place by that chunk's first write slot for the key.
    Keys ascend and, within a key, chunks keep input order, so a scatter
    through these slots is stable."""
    num_chunks, num_keys = histograms.shape
    indptr = np.empty(num_keys + 1, dtype=np.int64)
    running = 0
    for key in range(num_keys):
        indptr[key] = running
        for chunk in range(num_chunks):
            count = histograms[chunk, key]
            histograms[chunk, key] = running
            running += count
    indptr[num_keys] = running
    return indptr


@numba.njit(cache=True, parallel=True, nogil=True)
def _group(keys, histograms, values, grouped_values, order, write_order):
    """Counting sort of positions by `keys` (each in [0, num_keys)), stable.

    histograms: zeros [chunks, num_keys], one row per chunk of the input.
    Writes grouped_values[slot] = values[i] (when `values` is non-empty) and
    order[slot] = i (when `write_order`); returns indptr int64 [num_keys + 1].
    """
    num_items = keys.shape[0]
    num_chunks = histograms.shape[0]
    for chunk in numba.prange(num_chunks):
        lo = chunk * num_items // num_chunks
        hi = (chunk + 1) * num_items // num_chunks
        for i in range(lo, hi):
            histograms[chunk, keys[i]] += 1
    indptr = _counts_to_offsets(histograms)
    with_values = values.shape[0] > 0
    for chunk in numba.prange(num_chunks):
        lo = chunk * num_items // num_chunks
        hi = (chunk + 1) * num_items // num_chunks
        for i in range(lo, hi):
            key = keys[i]
            slot = histograms[chunk, key]
            histograms[chunk, key] = slot + 1
            if write_order:
                order[slot] = i
            if with_values:
                grouped_values[slot] = values[i]
    return indptr


def group_by(
    keys: np.ndarray,
    num_keys: int,
    values: Optional[np.ndarray] = None,
    value_dtype=None,
    want_order: bool = True,
):
    """Stable grouping of positions by `keys` (int, each in [0, num_keys)).

    Returns (indptr int64 [num_keys + 1], order int64 [E] or None,
    grouped int [E] or None) where order[slot] is the input position placed in
    `slot` and grouped[slot] = values[order[slot]] cast to `value_dtype`
    (default: values' dtype). Fusing the gather into the scatter saves a
    random-access pass over the edges.
    """
    keys = np.ascontiguousarray(keys)
    if keys.dtype not in (np.int32, np.int64):
        keys = keys.astype(np.int64)
    num_items = keys.shape[0]
    if values is None:
        values_in = np.empty(0, dtype=np.int64)
        grouped = np.empty(0, dtype=np.int64)
    else:
        values_in = np.ascontiguousarray(values)
        grouped = np.empty(num_items, dtype=value_dtype or values_in.dtype)
    order = np.empty(num_items if want_order else 0, dtype=np.int64)
    histograms = _histograms(_num_chunks(num_items, num_keys), num_keys, num_items)
    indptr = _group(keys, histograms, values_in, grouped, order, want_order)
    return indptr, (order if want_order else None), (grouped if values is not None else None)


def compress(rows: np.ndarray, num_rows: int):
    """Group edges by `rows` (stable): returns (indptr int64 [num_rows+1], order int64 [E])."""
    indptr, order, _ = group_by(rows, num_rows)
    return indptr, order


@numba.njit(cache=True, nogil=True)
def _expand_rows(indptr, out):
    """out[slot] = the row holding `slot` (COO row ids beside a CSR)."""
    for row in range(indptr.shape[0] - 1):
        for slot in range(indptr[row], indptr[row + 1]):
            out[slot] = row


def expand_rows(indptr: np.ndarray, dtype=np.int64) -> np.ndarray:
    """int [indptr[-1]]: the row id of every slot of a compressed structure."""
    out = np.empty(int(indptr[-1]), dtype=dtype)
    _expand_rows(indptr, out)
    return out


def deduplicate(src: np.ndarray, dst: np.ndarray, num_nodes: int):
    """Drop repeated (src, dst) pairs.

    src, dst: int [E], ids in [0, num_nodes). Returns (src, dst) int64 grouped
    by target (ascending), each pair once at its first occurrence, in input
    order within a target; and the number of removed edges.
    """
    indptr, kept_src, removed = deduplicate_csr(src, dst, num_nodes)
    return kept_src, expand_rows(indptr), removed


def deduplicate_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, index_dtype=np.int64):
    """Drop repeated (src, dst) pairs, returning the result as rows by target.

    Returns (indptr int64 [num_nodes + 1], sources [E'] of `index_dtype`:
    each target's distinct sources in order of first occurrence, number of
    removed edges).
    One counting sort groups sources by target; a second pass keeps a
    source only if it has not been seen in the current row (a per-chunk
    `last row seen` table indexed by source, so no sorting is needed).
    """
    num_edges = src.shape[0]
    indptr, _, sources = group_by(dst, num_nodes, values=src, value_dtype=index_dtype, want_order=False)
    row_bounds = _row_chunks(indptr, _num_chunks(num_edges, num_nodes))
    seen_dtype = np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64
    last_row_seen = np.full((row_bounds.shape[0] - 1, num_nodes), -1, dtype=seen_dtype)
    row_lengths = np.empty(num_nodes, dtype=np.int64)
    chunk_lengths = _drop_repeats_in_rows(indptr, sources, row_bounds, last_row_seen, row_lengths)
    del last_row_seen
    # Close the gaps the dropped repeats left at the end of each chunk.
    position = 0
    for chunk, length in enumerate(chunk_lengths.tolist()):
        begin = int(indptr[row_bounds[chunk]])
        if begin != position and length:
            sources[position : position + length] = sources[begin : begin + length]
        position += length
    kept_indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=kept_indptr[1:])
    if position < 0.9 * num_edges:  # else keep the view: a copy costs more than the slack
        sources = sources[:position].copy()
    return kept_indptr, sources[:position], int(num_edges - position)


@numba.njit(cache=True, parallel=True, nogil=True)
def _drop_repeats_in_rows(indptr, values, row_bounds, last_row_seen, row_lengths):
    """Within each row, keep the first occurrence of each value, compacting
    each chunk of rows in place to the front of its slots. Returns the kept
    length of every chunk; row_lengths[r] gets row r's kept length."""
    num_chunks = row_bounds.shape[0] - 1
    chunk_lengths = np.zeros(num_chunks, dtype=np.int64)
    for chunk in numba.prange(num_chunks):
        chunk_start = indptr[row_bounds[chunk]]
        write = chunk_start
        for row in range(row_bounds[chunk], row_bounds[chunk + 1]):
            row_start = write
            for slot in range(indptr[row], indptr[row + 1]):
                value = values[slot]
                if last_row_seen[chunk, value] != row:
                    last_row_seen[chunk, value] = row
                    values[write] = value
                    write += 1
            row_lengths[row] = write - row_start
        chunk_lengths[chunk] = write - chunk_start
    return chunk_lengths


def _row_chunks(indptr: np.ndarray, num_chunks: int) -> np.ndarray:
    """Row boundaries cutting the rows into `num_chunks` runs of about equal slot counts."""
    num_rows = indptr.shape[0] - 1
    slot_bounds = np.linspace(0, int(indptr[-1]), num_chunks + 1).astype(np.int64)
    row_bounds = np.searchsorted(indptr, slot_bounds, side="left").clip(0, num_rows)
    row_bounds[0], row_bounds[-1] = 0, num_rows
    return np.maximum.accumulate(row_bounds)


@numba.njit(cache=True, parallel=True, nogil=True)
def _transpose(indptr, indices, histograms, row_bounds, packed, t_indices, t_eid):
    """Counting sort of CSR slots by column, chunked by rows (see _group).

    With a non-empty `packed`, each transposed slot gets one 8-byte write
    (row << 32 | slot) instead of two scattered writes; _unpack splits it.
    """
    num_chunks = row_bounds.shape[0] - 1
    for chunk in numba.prange(num_chunks):
        for slot in range(indptr[row_bounds[chunk]], indptr[row_bounds[chunk + 1]]):
            histograms[chunk, indices[slot]] += 1
    t_indptr = _counts_to_offsets(histograms)
    use_packed = packed.shape[0] > 0
    for chunk in numba.prange(num_chunks):
        for row in range(row_bounds[chunk], row_bounds[chunk + 1]):
            for slot in range(indptr[row], indptr[row + 1]):
                col = indices[slot]
                target = histograms[chunk, col]
                histograms[chunk, col] = target + 1
                if use_packed:
                    packed[target] = (np.uint64(row) << np.uint64(32)) | np.uint64(slot)
                else:
                    t_indices[target] = row
                    t_eid[target] = slot
    return t_indptr


@numba.njit(cache=True, parallel=True, nogil=True)
def _unpack(packed, t_indices, t_eid):
    for i in numba.prange(packed.shape[0]):
        t_indices[i] = packed[i] >> np.uint64(32)
        t_eid[i] = packed[i] & np.uint64(0xFFFFFFFF)


def transpose(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_cols: int,
    index_dtype=np.int64,
    scratch: Optional[np.ndarray] = None,
    eid_out: Optional[np.ndarray] = None,
):
    """The transpose of a compressed structure, with slot ids.

    indptr int64 [R + 1], indices int [E] (columns in [0, num_cols)).
    Returns (t_indptr int64 [num_cols + 1], t_indices [E] of `index_dtype`:
    the row of each transposed slot, t_eid int64 [E]: the slot it came from).
    Stable: within a transposed row, rows (and slots) ascend.

    scratch (8-byte items, >= E) and eid_out (int64, >= E): buffers the caller
    no longer needs, used instead of fresh memory (first-touch page faults
    of fresh arrays cost as much as the sort itself on some machines).
    """
    num_rows = indptr.shape[0] - 1
    num_slots = indices.shape[0]
    row_bounds = _row_chunks(indptr, _num_chunks(num_slots, num_cols))
    t_indices = np.empty(num_slots, dtype=index_dtype)
    t_eid = eid_out[:num_slots] if eid_out is not None else np.empty(num_slots, dtype=np.int64)
    fits_32_bits = max(num_rows, num_slots) < (1 << 32)
    if not fits_32_bits:
        packed = np.empty(0, dtype=np.uint64)
    elif scratch is not None:
        packed = scratch.view(np.uint64)[:num_slots]
    else:
        packed = np.empty(num_slots, dtype=np.uint64)
    histograms = _histograms(row_bounds.shape[0] - 1, num_cols, num_slots)
    t_indptr = _transpose(indptr, indices, histograms, row_bounds, packed, t_indices, t_eid)
    if fits_32_bits:
        _unpack(packed, t_indices, t_eid)
    return t_indptr, t_indices, t_eid


@numba.njit(cache=True, parallel=True, nogil=True)
def _fill_positions(out):
    for i in numba.prange(out.shape[0]):
        out[i] = i


def positions(count: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """int64 [count] = 0, 1, ..., count-1, written into `out[:count]` if given."""
    target = out[:count] if out is not None else np.empty(count, dtype=np.int64)
    _fill_positions(target)
    return target


@numba.njit(cache=True, nogil=True)
def _drop_self_loops(src, dst):
    kept = 0
    for i in range(src.shape[0]):
        if src[i] != dst[i]:
            src[kept] = src[i]
            dst[kept] = dst[i]
            kept += 1
    return kept


def drop_self_loops(src: np.ndarray, dst: np.ndarray) -> int:
    """Move the edges with src != dst to the front, in order, in place.

    Returns how many there are: src[:kept], dst[:kept] is the loop-free list.
    """
    return int(_drop_self_loops(src, dst))
