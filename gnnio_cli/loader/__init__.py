"""Mini-batch loaders: neighbour sampling on the CPU and on a GPU, with the batch's Graph ready for the layers."""

from gnnio_cli.loader.neighbor import Batch, NeighborLoader

__all__ = ["Batch", "NeighborLoader"]
