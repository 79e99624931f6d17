"""Starting ranks: spawn a process group on this host, or join the one torchrun started.

:func:`spawn` starts `world_size` processes (NCCL with one GPU each on CUDA,
gloo on the CPU), runs ``worker(rank, world_size, *args)`` in each and returns
their results by rank. A rank that fails (an exception, a bad file, a crash,
running out of memory) ends the whole run: the other ranks are stopped and
one :class:`GnnioError` names the rank and the cause. Collectives carry the
group's timeout, and the run as a whole a deadline, so nothing hangs.

Under ``torchrun`` (its RANK, WORLD_SIZE and MASTER_ADDR in the environment)
:func:`run_ranks` joins the group instead, so multi-node launches work as
torchrun does them; rank 0 gets every rank's result.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from gnnio_cli.errors import GnnioError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# A failing rank's peers fail too, a moment later, on the broken collective: errors arriving within this
# window of the first are compared, and the earliest failure is the cause reported.
GRACE_SECONDS = 2.0


def under_torchrun() -> bool:
    """Whether torchrun (or another env:// launcher) started this process as one rank of a group."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _init_group(device: str, **options) -> None:
    """Join the process group; NCCL times its collectives on the GPU, so the halo exchange's report can tell
    how long each took even when the rank's computation hid it (exchange.ExchangeLog)."""
    backend = backend_for(device)
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    dist.init_process_group(backend, **options)


def free_port() -> int:
    """A TCP port no process listens on now (for the group's rendezvous on this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_device(device: str, local_rank: int) -> torch.device:
    """The device a rank computes on: its own GPU (by local rank) on CUDA, else the CPU."""
    if torch.device(device).type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise GnnioError(f"rank {local_rank} needs GPU {local_rank}, but {torch.cuda.device_count()} are visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _bound_device(device: str, local_rank: int) -> Optional[torch.device]:
    """The rank's GPU, made current and bound to its NCCL communicator (so barriers know it); None on the CPU."""
    bound = rank_device(device, local_rank)
    return bound if bound.type == "cuda" else None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, GnnioError) else f"{type(error).__name__}: {text}"


def _rank_main(worker: Callable, rank: int, world_size: int, port: int, device: str, timeout: float,
               args: tuple, results) -> None:
    """One spawned rank: join the group, run the worker, post (rank, "ok", result, when) or (rank, "error", cause,
    when)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    try:
        _init_group(device, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout),
                    device_id=_bound_device(device, rank))
        outcome = ("ok", worker(rank, world_size, *args))
    except BaseException as error:  # the parent reports it, in one line
        outcome = ("error", _one_line(error))
    # posted before the group is torn down: the failure's time is when it happened, not when the peers noticed
    results.put((rank, *outcome, time.time()))
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(worker: Callable, world_size: int, args: tuple = (), *, device: str = "cpu", timeout: float = 300.0,
          deadline: Optional[float] = None) -> list[Any]:
    """Run ``worker(rank, world_size, *args)`` in `world_size` new processes of one group; their results by rank.

    worker:   a module-level function (the processes are spawned, so it is imported by name).
    timeout:  seconds any collective may wait (the process group's timeout).
    deadline: seconds the whole run may take (default: no limit but the collectives' timeout).
    Raises GnnioError("rank R failed: cause") for the first rank that failed, after stopping the others.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank_main, args=(worker, rank, world_size, port, device, timeout, args, results),
                                 daemon=True) for rank in range(world_size)]
    for process in processes:
        process.start()
    outcomes: dict[int, Any] = {}
    failures: list[tuple[float, int, str]] = []
    ends = None if deadline is None else time.monotonic() + deadline
    try:
        while len(outcomes) < world_size and not failures:
            try:
                rank, status, value, when = results.get(timeout=0.2)
            except queue.Empty:
                failures.extend(_silent_deaths(processes, outcomes, failures))
                if ends is not None and time.monotonic() > ends:
                    raise GnnioError(f"the ranks did not finish within {deadline:g} s; stopped them") from None
                continue
            if status == "ok":
                outcomes[rank] = value
            else:
                failures.append((when, rank, value))
        if failures:
            failures.extend(_more_failures(results, GRACE_SECONDS))
            failures.extend(_silent_deaths(processes, outcomes, failures))
            _, rank, cause = min(failures)
            raise GnnioError(f"rank {rank} failed: {cause}")
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [outcomes[rank] for rank in range(world_size)]


def _silent_deaths(processes, outcomes: dict, failures: list) -> list[tuple[float, int, str]]:
    """Ranks whose process ended without posting a result (killed, crashed) and not yet listed, as failures
    timed 0: a rank that crashed is the cause of its peers' broken collectives, which they post."""
    listed = {rank for _, rank, _ in failures}
    return [(0.0, rank, f"its process exited with status {process.exitcode} without a result")
            for rank, process in enumerate(processes)
            if rank not in outcomes and rank not in listed and process.exitcode not in (None, 0)]


def _more_failures(results, seconds: float) -> list[tuple[float, int, str]]:
    found, ends = [], time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            rank, status, value, when = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if status == "error":
            found.append((when, rank, value))
    return found


def run_ranks(worker: Callable, world_size: int, args: tuple = (), *, device: str = "cpu", timeout: float = 300.0,
              deadline: Optional[float] = None) -> Optional[list[Any]]:
    """Under torchrun: join its group, run the worker, and gather every rank's result on rank 0 (other
    ranks get None); `world_size` is ignored there. Otherwise :func:`spawn` `world_size` ranks."""
    if not under_torchrun():
        return spawn(worker, world_size, args, device=device, timeout=timeout, deadline=deadline)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _init_group(device, timeout=timedelta(seconds=timeout),
                device_id=_bound_device(device, int(os.environ.get("LOCAL_RANK", rank))))
    try:
        try:
            result = worker(rank, size, *args)
        except Exception as error:
            raise GnnioError(f"rank {rank} failed: {_one_line(error)}") from error
        gathered = [None] * size if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()
