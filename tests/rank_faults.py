"""Workers for the launcher's fault tests, in a module light enough for spawned ranks to import quickly."""

import os

import torch.distributed as dist

from gnnio_cli.errors import GnnioError


def failing_rank(rank: int, world_size: int) -> None:
    """Rank 1 fails before the collective its peers wait in."""
    if rank == 1:
        raise GnnioError("features.h5: no such file")
    dist.barrier()


def dying_rank(rank: int, world_size: int) -> None:
    """Rank 0's process ends abruptly (as when the system kills it) while rank 1 waits for it."""
    if rank == 0:
        os._exit(3)
    dist.barrier()
