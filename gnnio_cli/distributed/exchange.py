"""Halo exchange: the rows of source-side tensors that other ranks own, fetched with one all_to_all.

Each rank owns a contiguous block of target rows. Its part of the graph reads
sources that are its own nodes and a halo of nodes other ranks own. Before an
aggregation a rank fetches the halo rows of a node-wise tensor (features, or a
per-node degree) with ``torch.distributed.all_to_all_single``: rank r sends
rank q the rows of its own nodes that q's halo holds, in q's halo order, and
receives its halo rows grouped by owner (rank 0's first). Backward runs the
same collective the other way: each halo row's gradient goes back to its
owner, which sums the gradients that every rank returned for that row.

The collective runs asynchronously (:func:`start_halo`): a layer starts it,
computes the rows whose sources are all its own while the halo rows are in
flight, and waits only before the rows that read them. Backward overlaps the
same way, and :class:`ExchangeLog` records how much of each exchange the
computation still waited for.

Collectives take the process group's timeout (``init_process_group(timeout=...)``):
a rank that died leaves the others with an error after that time, not a hang.
Every rank must call the exchange the same number of times in the same order,
as for any collective (a model that runs the same layers on every rank does).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
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
    """What the halo exchanges of one rank moved and how long they took, for `gnnio run`'s report.

    calls: forward and backward exchanges; bytes_sent / bytes_received: payload bytes;
    seconds: each collective's duration on this rank (waiting for peers included): NCCL's own timing of
        the collective on a GPU (TORCH_NCCL_ENABLE_TIMING=1, which gnnio's launcher sets; without it, the
        span from the launch to the end of the wait), the host clock up to the completion on the CPU;
    exposed_seconds: the part of it the computation waited for: from when the work that runs while the rows
        are in flight was done to when the rows were there (CUDA events on the computing stream; the host
        time blocked in the wait on the CPU). seconds - exposed_seconds was hidden behind that work.
    GPU times are folded in by :meth:`settle`.
    """

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    exposed_seconds: float = 0.0
    _pending: list = field(default_factory=list, repr=False)

    def reset(self) -> None:
        self.settle()
        self.calls = self.bytes_sent = self.bytes_received = 0
        self.seconds = self.exposed_seconds = 0.0

    def settle(self) -> None:
        """Fold the GPU timings of the exchanges into the totals (synchronises on them)."""
        self._fold(block=True)

    def _add_pending(self, work, launched, reached, arrived) -> None:
        """Keep a GPU exchange's events until they are read; fold in those already done, so that a training loop
        that never settles holds only the exchanges still in flight (and their work handles' tensors)."""
        self._fold(block=False)
        self._pending.append((work, launched, reached, arrived))

    def _fold(self, block: bool) -> None:
        kept = []
        for work, launched, reached, arrived in self._pending:
            if not block and not arrived.query():
                kept.append((work, launched, reached, arrived))
                continue
            arrived.synchronize()
            duration = _nccl_milliseconds(work)
            # without NCCL's timing (or a blocking collective's handle), the launch to the end of the wait
            self.seconds += (launched.elapsed_time(arrived) if duration is None else duration) / 1e3
            self.exposed_seconds += reached.elapsed_time(arrived) / 1e3
        self._pending = kept

    def count(self, bytes_sent: int, bytes_received: int) -> None:
        self.calls += 1
        self.bytes_sent += bytes_sent
        self.bytes_received += bytes_received

    @contextmanager
    def timed(self, on_gpu: bool, bytes_sent: int, bytes_received: int) -> Iterator[None]:
        """Count one blocking collective of these sizes and its time (all of it exposed)."""
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._add_pending(None, start, start, end)
        else:
            started = time.perf_counter()
            yield
            elapsed = time.perf_counter() - started
            self.seconds += elapsed
            self.exposed_seconds += elapsed
        self.count(bytes_sent, bytes_received)


def _nccl_milliseconds(work) -> Optional[float]:
    """NCCL's own timing of a finished collective (TORCH_NCCL_ENABLE_TIMING=1), else None."""
    if work is None:
        return None
    try:
        return work._get_duration()
    except RuntimeError:
        return None


class _InFlight:
    """One all_to_all_single started with async_op=True: wait() blocks (on the CPU) or orders the current stream
    (on a GPU) after it, and logs its duration and how much of it the computation waited for."""

    def __init__(self, rows: Tensor, output_rows: int, output_splits, input_splits, group,
                 log: Optional[ExchangeLog]):
        self.rows = rows.contiguous()  # kept until the collective is done with it
        self.out = self.rows.new_empty((output_rows, *self.rows.shape[1:]))
        self.log = log
        self.on_gpu = self.rows.is_cuda
        if log is not None and self.on_gpu:
            self.launched = torch.cuda.Event(enable_timing=True)
            self.launched.record()
        self.started = time.perf_counter()
        self.done_at: Optional[float] = None
        self.work = dist.all_to_all_single(self.out, self.rows, output_split_sizes=list(output_splits),
                                           input_split_sizes=list(input_splits), group=group, async_op=True)
        if log is not None and not self.on_gpu:
            self.work.get_future().add_done_callback(self._done)

    def _done(self, _future) -> None:
        self.done_at = time.perf_counter()

    def wait(self) -> Tensor:
        log = self.log
        if log is None:
            self.work.wait()
        elif self.on_gpu:
            reached = torch.cuda.Event(enable_timing=True)
            reached.record()
            self.work.wait()
            arrived = torch.cuda.Event(enable_timing=True)
            arrived.record()
            log._add_pending(self.work, self.launched, reached, arrived)
        else:
            waited = time.perf_counter()
            done = self.work.is_completed()
            self.work.wait()
            finished = time.perf_counter()
            if done:  # finished while the computation ran: all of it hidden
                log.seconds += (self.done_at if self.done_at is not None else waited) - self.started
            else:  # it ended when the wait did
                log.seconds += finished - self.started
                log.exposed_seconds += finished - waited
        if log is not None:
            log.count(self.rows.numel() * self.rows.element_size(), self.out.numel() * self.out.element_size())
        self.rows = None
        return self.out


class PendingHalo:
    """The halo rows of one exchange, in flight: :meth:`wait` returns them [num_halo, *] (differentiable).

    Backward mirrors it: the halo rows' gradients start back to their owners as soon as they are known, and
    the owners sum them when the gradient of their own rows is needed, so work in between overlaps that too.
    """

    def __init__(self, own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog]):
        self._box: dict = {}
        self._buffer = _HaloStart.apply(own, plan, log, self._box)

    def wait(self) -> Tensor:
        return _HaloWait.apply(self._buffer, self._box)


class _HaloStart(torch.autograd.Function):
    """own rows [num_own, *] -> the (not yet filled) halo buffer [num_halo, *], its exchange started; backward
    waits for the returned gradients that _HaloWait started and sums them into their owners' rows."""

    @staticmethod
    def forward(ctx, own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog], box: dict) -> Tensor:
        ctx.plan, ctx.log, ctx.box = plan, log, box
        box["forward"] = _InFlight(own.index_select(0, plan.send_index), plan.num_halo, plan.recv_counts,
                                   plan.send_counts, plan.group, log)
        box["plan"], box["log"] = plan, log
        return box["forward"].out

    @staticmethod
    def backward(ctx, _grad_buffer: Tensor):
        plan = ctx.plan
        returned = ctx.box.pop("backward").wait()
        grad_own = returned.new_zeros((plan.num_own, *returned.shape[1:]))
        return grad_own.index_add_(0, plan.send_index, returned), None, None, None


class _HaloWait(torch.autograd.Function):
    """The halo buffer -> the halo rows, once they are there; backward starts their gradients back to the owners."""

    @staticmethod
    def forward(ctx, buffer: Tensor, box: dict) -> Tensor:
        ctx.box = box
        box.pop("forward").wait()
        return buffer

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        box = ctx.box
        plan = box["plan"]
        box["backward"] = _InFlight(grad_halo, plan.num_sent, plan.send_counts, plan.recv_counts, plan.group,
                                    box["log"])
        return grad_halo, None


def halo_rows(own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog] = None) -> Tensor:
    """The halo rows [num_halo, *] of a node-wise tensor whose rows [num_own, *] each rank holds for its own nodes.

    A collective: every rank of the plan's group calls it with the same trailing shape and dtype.
    Gradients flow back to the owners' rows (summed over the ranks that read them).
    """
    return start_halo(own, plan, log).wait()


def start_halo(own: Tensor, plan: HaloPlan, log: Optional[ExchangeLog] = None) -> PendingHalo:
    """Start fetching the halo rows of `own` [num_own, *] (see :func:`halo_rows`); ``.wait()`` returns them.
    Work that needs no halo row can run before the wait, while they are in flight."""
    if own.shape[0] != plan.num_own:
        raise GnnioError(f"halo exchange: this rank owns {plan.num_own} nodes, the tensor has {own.shape[0]} rows")
    return PendingHalo(own, plan, log)
