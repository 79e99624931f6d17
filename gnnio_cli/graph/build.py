"""Linear-time construction of compressed rows from edge lists (numba).

Counting sorts keep every step O(E + N) and stable, so a 16M-edge graph is
built in a fraction of a second and the original edge order survives as the
`eid` of each slot.
"""

import numba
import numpy as np


@numba.njit(cache=True)
def _counting_order(keys, num_keys):
    """Stable permutation that sorts `keys` (each in [0, num_keys)) ascending."""
    counts = np.zeros(num_keys + 1, dtype=np.int64)
    for k in keys:
        counts[k + 1] += 1
    for i in range(num_keys):
        counts[i + 1] += counts[i]
    indptr = counts.copy()
    order = np.empty(keys.shape[0], dtype=np.int64)
    for position in range(keys.shape[0]):
        k = keys[position]
        order[counts[k]] = position
        counts[k] += 1
    return indptr, order


def compress(rows: np.ndarray, num_rows: int):
    """Group edges by `rows` (stable): returns (indptr int64 [num_rows+1], order int64 [E])."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return _counting_order(rows, num_rows)


@numba.njit(cache=True)
def _mark_duplicates(sorted_rows, sorted_cols):
    keep = np.ones(sorted_rows.shape[0], dtype=np.bool_)
    for i in range(1, sorted_rows.shape[0]):
        if sorted_rows[i] == sorted_rows[i - 1] and sorted_cols[i] == sorted_cols[i - 1]:
            keep[i] = False
    return keep


def sort_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Stable order sorting edges by (dst, src): a two-pass LSD radix sort."""
    _, by_src = compress(src, num_nodes)
    _, by_dst = compress(dst[by_src], num_nodes)
    return by_src[by_dst]


def deduplicate(src: np.ndarray, dst: np.ndarray, num_nodes: int):
    """Drop repeated (src, dst) pairs, keeping the first occurrence of each.

    Returns (src, dst) sorted by (dst, src) and the number of removed edges.
    """
    order = sort_pairs(src, dst, num_nodes)
    sorted_src, sorted_dst = src[order], dst[order]
    keep = _mark_duplicates(sorted_dst, sorted_src)
    removed = int(keep.size - np.count_nonzero(keep))
    if removed:
        sorted_src, sorted_dst = sorted_src[keep], sorted_dst[keep]
    return sorted_src, sorted_dst, removed
