"""CPU measurements of the reordering methods (issue 6): time and simulated cache locality.

    python tests/perf/reorder_study_cpu.py [--graph rmat20] [--communities 1000 --community-size 1000]

Two checks, both printed as tables and returned as records:

- **time**: every method of `gnnio_cli.graph.reorder` on a graph (default the
  standard `rmat20`), as timed by `reorder` itself; Rabbit against scipy's RCM;
- **planted communities**: a stochastic block model whose communities are
  contiguous in the planted order, relabelled at random; the simulated L2
  hit rate of the planted order, the random order and each method.

docs/PERFORMANCE.md ("Node orders") quotes its latest numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass

import numpy as np

from gnnio_cli.graph.build import deduplicate
from gnnio_cli.graph.graph import Graph
from gnnio_cli.graph.locality import CacheModel, locality
from gnnio_cli.graph.reorder import METHODS, reorder


def planted_partition(
    num_communities: int, community_size: int, intra_degree: float, inter_degree: float, seed: int
) -> tuple[Graph, np.ndarray]:
    """A directed stochastic block model with ids randomly permuted.

    Each ordered pair inside a community is an edge with probability
    intra_degree / community_size, each pair across communities with probability
    inter_degree / (N - community_size), so a node has about intra_degree +
    inter_degree in-edges. Edge counts per block pair are drawn, endpoints drawn
    uniformly within the blocks, duplicates and self-loops removed.

    Returns (graph, planted_order): planted_order [N] is new_to_old of the order
    in which every community is contiguous.
    """
    rng = np.random.default_rng(seed)
    n = num_communities * community_size
    intra_edges = rng.poisson(intra_degree * community_size, size=num_communities)
    intra_block = np.repeat(np.arange(num_communities), intra_edges)
    intra_src = intra_block * community_size + rng.integers(0, community_size, intra_block.size)
    intra_dst = intra_block * community_size + rng.integers(0, community_size, intra_block.size)
    num_inter = rng.poisson(inter_degree * n)
    inter_src = rng.integers(0, n, num_inter)
    # a target uniformly outside the source's community
    offset = rng.integers(community_size, n, num_inter)
    inter_dst = (inter_src // community_size * community_size + offset) % n
    src = np.concatenate([intra_src, inter_src])
    dst = np.concatenate([intra_dst, inter_dst])
    keep = src != dst
    src, dst, _ = deduplicate(src[keep], dst[keep], n)
    planted_to_random = rng.permutation(n)
    graph = Graph.from_arrays(planted_to_random[src], planted_to_random[dst], n, n)
    return graph, planted_to_random.astype(np.int64)


@dataclass
class MethodResult:
    graph: str
    method: str
    seconds: float
    cache_hit_rate: float
    mean_log2_gap: float


def measure_methods(name: str, graph: Graph, methods, cache: CacheModel, seed: int = 0) -> list[MethodResult]:
    results = []
    for method in methods:
        perm = reorder(graph, method, seed)
        metrics = locality(graph, perm.new_to_old, cache)
        results.append(MethodResult(name, method, perm.seconds, metrics.cache_hit_rate, metrics.mean_log2_gap))
        print(f"  {name:>10} {method:>12}: {perm.seconds:7.2f} s  hit rate {metrics.cache_hit_rate:.3f}  "
              f"mean log2 gap {metrics.mean_log2_gap:.2f}", flush=True)
    return results


def machine_description() -> str:
    """CPU model, core count and load average: the shared CPU machines are often busy, which slows every method."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


def markdown_table(results: list[MethodResult], planted_rate: float | None = None) -> str:
    lines = ["| graph | order | seconds | hit rate | mean log2(1+gap) |", "| --- | --- | ---: | ---: | ---: |"]
    if planted_rate is not None:
        lines.append(f"| {results[0].graph} | planted | - | {planted_rate:.3f} | - |")
    lines += [f"| {r.graph} | {r.method} | {r.seconds:.2f} | {r.cache_hit_rate:.3f} | {r.mean_log2_gap:.2f} |" for r in results]
    return "\n".join(lines)


def _warm_up_compilation() -> None:
    """Run every numba kernel once on a tiny graph, so timings exclude JIT compilation."""
    tiny, _ = planted_partition(4, 8, 3.0, 1.0, seed=1)
    for method in METHODS:
        locality(tiny, reorder(tiny, method).new_to_old)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="rmat20", help="standard graph for the timing check")
    parser.add_argument("--communities", type=int, default=1000)
    parser.add_argument("--community-size", type=int, default=1000)
    parser.add_argument("--intra-degree", type=float, default=12.0)
    parser.add_argument("--inter-degree", type=float, default=4.0)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--l2-mb", type=float, default=50.0)
    args = parser.parse_args(argv)
    cache = CacheModel(args.features, args.dtype, args.l2_mb)
    print(f"date {time.strftime('%Y-%m-%d %H:%M')}; machine: {machine_description()}")
    print(f"cache model: {cache}, {cache.capacity_entries} entries of {cache.entry_bytes} B")
    _warm_up_compilation()

    from gnnio_cli.graph.generate import standard_graph

    start = time.perf_counter()
    graph = standard_graph(args.graph).graph
    print(f"{args.graph}: {graph} (generated in {time.perf_counter() - start:.1f} s)")
    timed = measure_methods(args.graph, graph, METHODS, cache)
    seconds = {r.method: r.seconds for r in timed}
    print(f"  rabbit / rcm time: {seconds['rabbit'] / seconds['rcm']:.2f}")

    sbm, planted = planted_partition(args.communities, args.community_size, args.intra_degree, args.inter_degree, seed=0)
    name = f"sbm{args.communities}x{args.community_size}"
    print(f"{name}: {sbm}")
    planted_rate = locality(sbm, planted, cache).cache_hit_rate
    print(f"  {name:>10} {'planted':>12}: hit rate {planted_rate:.3f}")
    results = {r.method: r for r in measure_methods(name, sbm, METHODS, cache)}
    rabbit_rate, random_rate = results["rabbit"].cache_hit_rate, results["random"].cache_hit_rate
    print(f"  rabbit / planted hit rate: {rabbit_rate / planted_rate:.3f}; rabbit / random: {rabbit_rate / random_rate:.2f}")
    print(f"finished; machine: {machine_description()}\n")
    print(markdown_table(timed))
    print()
    print(markdown_table(list(results.values()), planted_rate))


if __name__ == "__main__":
    main()
