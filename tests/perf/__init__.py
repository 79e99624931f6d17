"""Benchmarks that serve gnnio's development, not its users: each is a script (``python tests/perf/NAME.py
--help``, from the repository root with the checkout importable) and a module the tests import.

- ``acceptance``: the issues' acceptance criteria on a GPU (kernel families against cuSPARSE and PyG, the
  super node, the drop-in, the reordering study), verdicts and JSON into one folder; ``.ci/gpu`` runs it.
- ``convert_throughput``: ``gnnio convert`` on a generated edge list, MB/s and peak memory.
- ``projections``: the layers' fp32 projections, split-TF32 against cuBLAS.
- ``reorder_study_cpu``: every node order's time and simulated L2 hit rate on rmat20 and a planted-partition
  graph.
- ``switches``: a layer timed under several values of environment switches in one process, round by round.

`gnnio run` and `gnnio compare` (``gnnio_cli.bench``) measure what users measure.
"""
