"""What every reader returns: the edges as read, and what the file declares about them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class EdgeList:
    """Edges as read from a file.

    src, dst: int64 [E], ids as in the file (0-based; Matrix Market ids are
    shifted from 1-based). weights: float64 [E] when the file gives one
    value per edge (a weight column, a real or integer Matrix Market, a
    weighted npz), else None. declared_num_nodes: the node count the file
    states, or None; declared_by says where (e.g. "'# Nodes: 7' on line 2"),
    set only for a header that merely describes the ids (a SNAP comment),
    not for a size that bounds them (Matrix Market, npz). symmetric: the
    file stores one triangle of a symmetric matrix: the graph has src/dst
    and their :func:`mirror`; skew: the mirrored entries' weights are
    negated (a skew-symmetric matrix). sha256: hex digest of the raw input
    bytes (as stored, compressed or not).
    """

    src: np.ndarray
    dst: np.ndarray
    declared_num_nodes: Optional[int]
    format: str
    name: str
    sha256: str = ""
    symmetric: bool = False
    weights: Optional[np.ndarray] = None
    skew: bool = False
    declared_by: str = ""

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])


def mirror(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Append the reverse of every edge that is not a self-loop: [E] -> [E + E_nonloop]."""
    off_diagonal = src != dst
    return np.concatenate((src, dst[off_diagonal])), np.concatenate((dst, src[off_diagonal]))


def mirror_weights(src: np.ndarray, dst: np.ndarray, weights: np.ndarray, negate: bool = False) -> np.ndarray:
    """The weights of :func:`mirror`'s edges: each reversed edge keeps its weight (negated if `negate`)."""
    reversed_weights = weights[src != dst]
    return np.concatenate((weights, -reversed_weights if negate else reversed_weights))
