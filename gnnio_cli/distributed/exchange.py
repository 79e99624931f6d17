"""Halo exchange: the rows of source-side tensors that other ranks own, fetched with one all_to_all.

Each rank owns a contiguous block of target rows. Its part of the graph reads
sources that are its own nodes and a halo of nodes other ranks own. Before an
aggregation a rank fetches the halo rows of a node-wise tensor (features, or a
per-node degree) with ``torch.distributed.all_to_all_single``: rank r sends
rank q the rows of its own nodes that q's halo holds, in q's halo order, and
receives its halo rows grouped by owner (rank 0's first). Backward runs the
same collective the other way: each halo row's gradient goes back to its
owner, which sums the gradients that every rank returned for that row.

Collectives take the process group's timeout (``init_process_group(timeout=...)``):
a rank that died leaves the others with an error after that time, not a hang.
Every rank must call the exchange the same number of times in the same order,
as for any collective (a model that runs the same layers on every rank does).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from gnnio_cli.errors import GnnioError

@dataclass(frozen=True)
class HaloPlan:
    """Who sends which rows to whom, for one rank of a partitioned graph.

    send_index:  int64 [sum(send_counts)]: local own-row index of every row this rank sends, grouped by
                 receiving rank (rank 0's first), each group in the receiver's halo order.
    send_counts: rows sent to each rank [world_size] (0 to itself).
    recv_counts: halo rows received from each rank [world_size] (0 from itself); their sum is the halo size.
    num_own:     rows this rank owns.
    group:       the process group (None: the default group).
    """

    send_index: Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    num_own: int
    group: Optional[dist.ProcessGroup] = None

    @property
    def num_halo(self) -> int:
        return sum(self.recv_counts)

    @property
    def num_sent(self) -> int:
        return sum(self.send_counts)

    def to(self, device) -> "HaloPlan":
        return HaloPlan(self.send_index.to(device), self.send_counts, self.recv_counts, self.num_own, self.group)


@dataclass
class ExchangeLog:
    """What the exchanges of one rank moved and how long they took, for `gnnio run`'s report.

    calls: forward and backward exchanges; bytes_sent / bytes_received: payload bytes;
    seconds: time from each collective's start to its completion on this rank (waiting for peers
    included), read with CUDA events on a GPU (after :meth:`settle`) and the host clock on the CPU.
    """

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    _pending: list = field(default_factory=list, repr=False)

    def reset(self) -> None:
        self.settle()
        self.calls = self.bytes_sent = self.bytes_received = 0
        self.seconds = 0.0

    def settle(self) -> None:
        """Fold the CUDA events of finished exchanges into `seconds` (synchronises on them)."""
        for start, end in self._pending:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1e3
        self._pending.clear()

    @contextmanager
    def timed(self, on_gpu: bool, bytes_sent: int, bytes_received: int) -> Iterator[None]:
        """Count one collective of these sizes, and its time (CUDA events on the current stream on a GPU)."""
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending.append((start, end))
        else:
            started = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - started
        self.calls += 1
        self.bytes_sent += bytes_sent
        self.bytes_received += bytes_received


def _all_to_all(rows: Tensor, output_rows: int, output_splits, input_splits, group, log: Optional[ExchangeLog]) -> Tensor:
    """all_to_all_single of the rows of `rows` [sum(input_splits), *] -> [output_rows, *]."""
    rows = rows.contiguous()
    out = rows.new_empty((output_rows, *rows.shape[1:]))
    with log.timed(rows.is_cuda, rows.numel() * rows.element_size(), out.numel() * out.element_size()) \
            if log is not None else nullcontext():
        dist.all_to_all_single(out, rows, output_split_sizes=list(output_splits), input_split_sizes=list(input_splits),
                               group=group)
    return out


class _HaloExchange(torch.autograd.Function):
    """own rows [num_own, *] -> halo rows [num_halo, *]; backward sums each halo row's gradients into its owner's row."""

    @staticmethod
    def forward(ctx, own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog]) -> Tensor:
        ctx.plan, ctx.log = plan, log
        sent = own.index_select(0, plan.send_index)
        return _all_to_all(sent, plan.num_halo, plan.recv_counts, plan.send_counts, plan.group, log)

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        plan = ctx.plan
        returned = _all_to_all(grad_halo, plan.num_sent, plan.send_counts, plan.recv_counts, plan.group, ctx.log)
        grad_own = returned.new_zeros((plan.num_own, *returned.shape[1:]))
        return grad_own.index_add_(0, plan.send_index, returned), None, None


def halo_rows(own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog] = None) -> Tensor:
    """The halo rows [num_halo, *] of a node-wise tensor whose rows [num_own, *] each rank holds for its own nodes.

    A collective: every rank of the plan's group calls it with the same trailing shape and dtype.
    Gradients flow back to the owners' rows (summed over the ranks that read them).
    """
    if own.shape[0] != plan.num_own:
        raise GnnioError(f"halo exchange: this rank owns {plan.num_own} nodes, the tensor has {own.shape[0]} rows")
    return _HaloExchange.apply(own, plan, log)
