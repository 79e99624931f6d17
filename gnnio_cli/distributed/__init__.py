"""Full-graph layers on several devices: row partitions, the halo exchange, and the DistributedGraph
that gnnio's layers take in place of edge_index (see docs/distributed.md).

The partition's names load on first use: every layer module imports DistributedGraph, and a model that
never splits a graph should not pay for h5py and the reordering code at import.
"""

from gnnio_cli.distributed.exchange import ExchangeLog, HaloPlan, PendingHalo, halo_rows, start_halo
from gnnio_cli.distributed.graph import DistributedGraph

_PARTITION_NAMES = ("Partition", "ensure_partition", "partition_graph")

__all__ = ["DistributedGraph", "ExchangeLog", "HaloPlan", "PendingHalo", "halo_rows", "start_halo", *_PARTITION_NAMES]


def __getattr__(name: str):
    if name in _PARTITION_NAMES:
        from gnnio_cli.distributed import partition

        return getattr(partition, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
