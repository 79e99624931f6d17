"""Graphs: the Graph type and everything that makes or changes one."""

from gnnio_cli.graph.graph import Graph, index_dtype

__all__ = ["Graph", "index_dtype"]
