"""Neighbour sampling of one mini-batch, on the CPU (numba) and on a GPU (native/sample.cu).

Both samplers take the base graph's CSR (one row per target: its in-neighbours), the batch's seeds and
the per-hop fan-outs, and return the same :class:`Sampled` record, bit for bit, for the same keys:

- Hop h expands the frontier (hop 0: the seeds; then the nodes first reached at hop h - 1) in local-id
  order. A node of in-degree d with fan-out k takes all d in-edges when k = -1 or (without replacement)
  k >= d, else k of them: without replacement k distinct slots uniformly (Floyd's algorithm), with
  replacement k independent draws. A node's picks are written in CSR slot order, so the sampled edges
  come grouped by target in local-id order: the batch's CSR without a sort.
- Random bits come from a counter-based hash, the same in numba and CUDA: with mix() the SplitMix64
  finaliser, the draw i of node v at a hop whose key is K is mix(mix(K ^ v) ^ i), and an integer below n
  is the high word of that 64 x 64-bit product with n. :func:`hop_keys` derives K from (seed, epoch,
  batch, hop), so a node's picks depend on nothing else (not on the thread that draws them).
- Relabelling: a node table (int64 [N], EMPTY where a node is not in the batch) maps global ids to local
  ones; seeds take 0..B-1 (a seed listed twice keeps its first position), each hop's new sources take
  the next ids in order of first appearance in the hop's edge order. Only the touched entries are reset
  after the batch, so the table is allocated once per loader.

The GPU sampler reads the device once per hop and once before the first: the hop's edge count, then
for each hop the number of new nodes and the next hop's edge count together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from gnnio_cli import native
from gnnio_cli.graph.generate import _splitmix

EMPTY = np.iinfo(np.int64).max  # the node table's entry for a node not in the batch

_MASK = (1 << 64) - 1
_LOW_HALF = np.uint64(0xFFFFFFFF)
_HALF_BITS = np.uint64(32)


@dataclass(frozen=True)
class Sampled:
    """One sampled batch, on the sampler's device.

    n_id:     int64 [N_b]    global ids: the seeds, then each hop's new nodes in order of first appearance
    sources:  int64 [E_b]    local id of each sampled edge's source, grouped by target in local-id order
    e_id:     int64 [E_b]    the base graph's edge id of each sampled edge
    indptr:   int64 [N_b + 1] the batch CSR: target t's edges are sources[indptr[t]:indptr[t + 1]]
    num_sampled_nodes: [B, new nodes of hop 0, ...] (H + 1 counts); num_sampled_edges: per hop (H counts)
    """

    n_id: Tensor
    sources: Tensor
    e_id: Tensor
    indptr: Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]


# ------------------------------------------------------------------ random bits
@numba.njit(cache=True, nogil=True, inline="always")
def _mix(bits):
    """The SplitMix64 finaliser of bits + golden ratio (native/sample.cu's mix)."""
    return _splitmix(bits)[1]


@numba.njit(cache=True, nogil=True, inline="always")
def _below(bits, bound):
    """An integer in [0, bound): the high 64 bits of bits * bound (native/sample.cu's __umul64hi)."""
    bits_low, bits_high = bits & _LOW_HALF, bits >> _HALF_BITS
    bound_low, bound_high = bound & _LOW_HALF, bound >> _HALF_BITS
    low_low = bits_low * bound_low
    high_low = bits_high * bound_low
    cross = (low_low >> _HALF_BITS) + (high_low & _LOW_HALF) + bits_low * bound_high
    return np.int64((high_low >> _HALF_BITS) + (cross >> _HALF_BITS) + bits_high * bound_high)


@numba.njit(cache=True, nogil=True)
def _chain(values):
    """mix(... mix(mix(values[0]) ^ values[1]) ... ^ values[-1])."""
    bits = _mix(np.uint64(values[0]))
    for value in values[1:]:
        bits = _mix(bits ^ np.uint64(value))
    return bits


def hop_keys(seed: int, epoch: int, batch: int, hops: int) -> list[int]:
    """The random key of each hop of batch `batch` in epoch `epoch` (unsigned 64-bit values; the seed is
    taken modulo 2^64)."""
    return [int(_chain(np.array([seed & _MASK, epoch, batch, hop], dtype=np.uint64))) for hop in range(hops)]


def as_signed(key: int) -> int:
    """A 64-bit key as the int64 a native op takes (the same bits)."""
    return key - (1 << 64) if key >= 1 << 63 else key


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator seeded by (seed, epoch): the seed order of a shuffled epoch."""
    key = int(_chain(np.array([seed & _MASK, epoch], dtype=np.uint64)))
    return torch.Generator().manual_seed(key & ((1 << 63) - 1))


# ------------------------------------------------------------------ one row
@numba.njit(cache=True, nogil=True, inline="always")
def _pick_count(degree, fanout, replace):
    """How many in-edges a node of in-degree `degree` takes at fan-out `fanout` (-1: all)."""
    if fanout < 0:
        return degree
    if replace:
        return fanout if degree > 0 else 0
    return min(fanout, degree)


@numba.njit(cache=True, nogil=True)
def _pick_row(picks, start, degree, count, fanout, replace, key, node):
    """Writes the node's `count` picks (slots of its row, 0 .. degree - 1) to picks[start:start + count],
    ascending: all slots, k draws with replacement, or Floyd's k distinct slots. native/sample.cu's
    pick_row does the same, draw for draw."""
    if fanout < 0 or (not replace and count == degree):
        for i in range(count):
            picks[start + i] = i
        return
    node_key = _mix(key ^ np.uint64(node))
    for i in range(count):
        # Floyd: draw t in [0, last]; take t, or last (larger than every pick so far) when t is taken
        last = degree - count + i
        bound = degree if replace else last + 1
        slot = _below(_mix(node_key ^ np.uint64(i)), np.uint64(bound))
        position = i
        while position > 0 and picks[start + position - 1] > slot:
            position -= 1
        if not replace and position > 0 and picks[start + position - 1] == slot:
            picks[start + i] = last
            continue
        for moved in range(i, position, -1):
            picks[start + moved] = picks[start + moved - 1]
        picks[start + position] = slot


# ------------------------------------------------------------------ CPU sampler
@numba.njit(cache=True, nogil=True)
def _claim_seeds(table, seeds):
    for position in range(seeds.size):
        if table[seeds[position]] == EMPTY:
            table[seeds[position]] = position


@numba.njit(cache=True, nogil=True)
def _expand(indptr, indices, eid, frontier, fanout, replace, key, table, first_local):
    """One hop on the CPU: the frontier's picks, relabelled through `table` (new sources take ids from
    first_local on). Returns (row ends within the hop [F], local sources [E], edge ids [E], new nodes)."""
    ends = np.empty(frontier.size, dtype=np.int64)
    total = 0
    for i in range(frontier.size):
        node = frontier[i]
        total += _pick_count(indptr[node + 1] - indptr[node], fanout, replace)
        ends[i] = total
    sources = np.empty(total, dtype=np.int64)
    edge_ids = np.empty(total, dtype=np.int64)
    start = 0
    for i in range(frontier.size):
        node = frontier[i]
        row = indptr[node]
        degree = indptr[node + 1] - row
        _pick_row(edge_ids, start, degree, ends[i] - start, fanout, replace, key, node)
        for edge in range(start, ends[i]):
            slot = row + edge_ids[edge]
            sources[edge] = indices[slot]
            edge_ids[edge] = eid[slot]
        start = ends[i]
    new_nodes = np.empty(total, dtype=np.int64)
    num_new = 0
    for edge in range(total):
        source = sources[edge]
        if table[source] == EMPTY:
            table[source] = first_local + num_new
            new_nodes[num_new] = source
            num_new += 1
        sources[edge] = table[source]
    return ends, sources, edge_ids, new_nodes[:num_new]


class _Hops:
    """The pieces of a batch as its hops come in (torch tensors on the sampler's device)."""

    def __init__(self, seeds: Tensor):
        self.nodes, self.sources, self.edge_ids, self.row_ends = [seeds], [], [], []
        self.num_nodes, self.num_edges = seeds.numel(), 0

    def add(self, ends: Tensor, sources: Tensor, edge_ids: Tensor, new_nodes: Tensor) -> None:
        """A hop's row ends (within the hop, one per frontier node), sources, edge ids and new nodes."""
        self.row_ends.append(ends + self.num_edges)
        self.sources.append(sources)
        self.edge_ids.append(edge_ids)
        self.nodes.append(new_nodes)
        self.num_nodes += new_nodes.numel()
        self.num_edges += edge_ids.numel()

    def n_id(self) -> Tensor:
        return torch.cat(self.nodes)

    def sampled(self, n_id: Tensor, local_sources: Tensor) -> Sampled:
        """The batch, with every source relabelled: the last hop's new nodes are rows without edges."""
        last = self.nodes[-1]
        indptr = torch.cat([last.new_zeros(1), *self.row_ends, last.new_full((last.numel(),), self.num_edges)])
        return Sampled(
            n_id=n_id, sources=local_sources, e_id=torch.cat(self.edge_ids), indptr=indptr,
            num_sampled_nodes=[part.numel() for part in self.nodes],
            num_sampled_edges=[part.numel() for part in self.edge_ids],
        )  # fmt: skip


class _Sampler:
    """A sampler of one CSR (indptr, indices, eid) with its node table, int64 [N] on the CSR's device."""

    def __init__(self, indptr: Tensor, indices: Tensor, eid: Tensor):
        self.indptr, self.indices, self.eid = indptr, indices, eid
        self.table = torch.full((indptr.numel() - 1,), EMPTY, dtype=torch.int64, device=indptr.device)

    def sample(self, seeds: Tensor, fanouts: list[int], replace: bool, keys: list[int]) -> Sampled:
        """The batch of `seeds` (int [B] on the CSR's device) at per-hop `fanouts`, hop h drawing with keys[h]."""
        try:
            return self._sample(seeds.to(torch.int64).contiguous(), fanouts, replace, keys)
        except BaseException:
            self.table.fill_(EMPTY)  # a batch cut short (an interrupt) must not leave its nodes behind
            raise

    def _sample(self, seeds: Tensor, fanouts: list[int], replace: bool, keys: list[int]) -> Sampled:
        raise NotImplementedError


class CpuSampler(_Sampler):
    """Samples on the CPU with numba kernels, a hop per call."""

    def _sample(self, seeds: Tensor, fanouts: list[int], replace: bool, keys: list[int]) -> Sampled:
        table, frontier = self.table.numpy(), seeds.numpy()
        csr = (self.indptr.numpy(), self.indices.numpy(), self.eid.numpy())
        _claim_seeds(table, frontier)
        hops = _Hops(seeds)
        for fanout, key in zip(fanouts, keys):
            ends, local, edge_ids, frontier = _expand(*csr, frontier, fanout, replace, np.uint64(key), table,
                                                      hops.num_nodes)
            hops.add(*(torch.from_numpy(part) for part in (ends, local, edge_ids, frontier)))
        n_id = hops.n_id()
        self.table[n_id] = EMPTY
        return hops.sampled(n_id, torch.cat(hops.sources))


class CudaSampler(_Sampler):
    """Samples batches of a CUDA CSR with native/sample.cu's ops; one node table per sampler.

    Per hop: sample_neighbors (one thread per frontier node), sample_first_seen (claim, then mark the
    edges that reach a node first, with that node's pick count at the next hop), one cumsum, one read of
    its two totals, sample_assign (the new nodes' ids and the next hop's row ends). After the last hop
    sample_relabel maps every source to its local id and resets the table's touched entries.
    """

    def _sample(self, seeds: Tensor, fanouts: list[int], replace: bool, keys: list[int]) -> Sampled:
        ops = torch.ops.gnnio
        frontier = seeds
        ends = ops.sample_seeds(self.table, frontier, self.indptr, fanouts[0], replace).cumsum(0)
        num_picks = int(ends[-1]) if ends.numel() else 0  # a read: the first hop's edge count
        hops = _Hops(frontier)
        for hop, (fanout, key) in enumerate(zip(fanouts, keys)):
            sources, edge_ids = ops.sample_neighbors(
                self.indptr, self.indices, self.eid, frontier, ends, num_picks, fanout, replace, as_signed(key))
            next_fanout = fanouts[hop + 1] if hop + 1 < len(fanouts) else 0
            marks = ops.sample_first_seen(self.table, sources, self.indptr, next_fanout, replace)
            cumulative = marks.cumsum(1)
            # a read: how many nodes this hop reached first, and how many edges the next hop takes
            num_new, next_picks = cumulative[:, -1].tolist() if num_picks else (0, 0)
            frontier, next_ends = ops.sample_assign(self.table, sources, cumulative, hops.num_nodes, num_new)
            hops.add(ends, sources, edge_ids, frontier)
            ends, num_picks = next_ends, next_picks
        n_id = hops.n_id()
        return hops.sampled(n_id, ops.sample_relabel(self.table, torch.cat(hops.sources), n_id))


# ---------------------------------------------------- shapes for the tracer
@native.on_load
def _register_fakes() -> None:
    """Shape-only implementations of the sampling ops (native/sample.cu), so torch.compile and opcheck can trace
    them; the sizes the host passes fix every output's shape."""

    @torch.library.register_fake("gnnio::sample_seeds")
    def _(table, seeds, indptr, fanout, replace):
        return torch.empty_like(seeds)

    @torch.library.register_fake("gnnio::sample_neighbors")
    def _(indptr, indices, eid, frontier, ends, num_picks, fanout, replace, key):
        return indptr.new_empty(num_picks), indptr.new_empty(num_picks)

    @torch.library.register_fake("gnnio::sample_first_seen")
    def _(table, sources, indptr, next_fanout, replace):
        return sources.new_empty((2, sources.shape[0]))

    @torch.library.register_fake("gnnio::sample_assign")
    def _(table, sources, cumulative, first_local, num_new):
        return sources.new_empty(num_new), sources.new_empty(num_new)

    @torch.library.register_fake("gnnio::sample_relabel")
    def _(table, sources, n_id):
        return torch.empty_like(sources)
