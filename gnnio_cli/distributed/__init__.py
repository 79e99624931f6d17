"""Full-graph layers on several devices: row partitions, the halo exchange, and the DistributedGraph
that gnnio's layers take in place of edge_index (see docs/distributed.md)."""

from gnnio_cli.distributed.exchange import ExchangeLog, HaloPlan, halo_rows
from gnnio_cli.distributed.graph import DistributedGraph
from gnnio_cli.distributed.partition import Partition, ensure_partition, partition_graph

__all__ = ["DistributedGraph", "ExchangeLog", "HaloPlan", "Partition", "ensure_partition", "halo_rows",
           "partition_graph"]
