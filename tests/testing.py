"""Shared test helpers: dtype and device lists, random graphs with edge cases, dense oracles.

The same tests run in CPU CI and on the GPU machine: 'cuda' appears in
DEVICES only when torch sees a GPU. Append new helpers; do not reshape these.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from gnnio_cli.graph import Graph

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_graph(
    num_nodes: int,
    num_edges: int,
    *,
    hub_degree: int = 0,
    empty_rows: bool = True,
    self_loops: bool = True,
    duplicates: bool = True,
    seed: int,
    num_dst_nodes: Optional[int] = None,
) -> Graph:
    """A seeded random graph with the edge cases kernels get wrong, edges in shuffled order.

    num_nodes:     sources (and targets, unless num_dst_nodes makes it bipartite).
    num_edges:     random edges before the extras below.
    hub_degree:    in-edges added to one target (a super node), 0 for none.
    empty_rows:    about a quarter of the targets get no in-edges; on a
                   non-bipartite graph one of them is isolated (no out-edges either).
    self_loops:    add loops (i, i), one node with two; False removes all loops.
                   Only for non-bipartite graphs.
    duplicates:    repeat about a tenth of the edges; False removes all repeats.
    """
    rng = np.random.default_rng(seed)
    num_src = num_nodes
    num_dst = num_nodes if num_dst_nodes is None else num_dst_nodes
    bipartite = num_dst_nodes is not None and num_dst_nodes != num_nodes

    targets_allowed = np.arange(num_dst)
    sources_allowed = np.arange(num_src)
    if empty_rows and num_dst >= 2:
        empty = rng.choice(num_dst, size=max(1, num_dst // 4), replace=False)
        targets_allowed = np.setdiff1d(targets_allowed, empty)
        if not bipartite:
            sources_allowed = np.setdiff1d(sources_allowed, empty[:1])

    src = rng.choice(sources_allowed, size=num_edges)
    dst = rng.choice(targets_allowed, size=num_edges)
    if hub_degree:
        hub = targets_allowed[0]
        src = np.concatenate([src, rng.choice(sources_allowed, size=hub_degree)])
        dst = np.concatenate([dst, np.full(hub_degree, hub)])
    if self_loops and not bipartite:
        looped = np.intersect1d(sources_allowed, targets_allowed)
        loops = rng.choice(looped, size=max(1, num_edges // 20))
        loops = np.concatenate([loops, loops[:1]])
        src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
    elif not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if duplicates and src.size:
        again = rng.choice(src.size, size=max(1, src.size // 10))
        src, dst = np.concatenate([src, src[again]]), np.concatenate([dst, dst[again]])
    elif not duplicates:
        pairs = np.unique(np.stack([src, dst], axis=1), axis=0)
        src, dst = pairs[:, 0], pairs[:, 1]
    order = rng.permutation(src.size)
    return Graph.from_edge_index(np.stack([src[order], dst[order]]), size=(num_src, num_dst))


def with_index_dtype(graph: Graph, dtype: torch.dtype) -> Graph:
    """The same graph with its column indices (csr_indices, csc_indices) stored as `dtype`."""
    return dataclasses.replace(
        graph,
        csr_indices=graph.csr_indices.to(dtype),
        csc_indices=graph.csc_indices.to(dtype),
        _cache={},
    )


def edge_list(graph: Graph) -> list[tuple[int, int]]:
    """(source, target) of every edge in eid order, as Python ints."""
    source, target = graph.to("cpu").edge_index().tolist()
    return list(zip(source, target))


def dense_adjacency(graph: Graph, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp64 [num_dst, num_src]: A[t, s] = sum of the weights of edges s -> t (duplicates add up).

    Built with a Python loop over the edge list, independently of the ops.
    """
    adjacency = torch.zeros(graph.num_dst_nodes, graph.num_src_nodes, dtype=torch.float64)
    weights = [1.0] * graph.num_edges if edge_weight is None else edge_weight.double().cpu().tolist()
    for (source, target), weight in zip(edge_list(graph), weights):
        adjacency[target, source] += weight
    return adjacency


def randn(*shape: int, dtype: torch.dtype = torch.float32, device="cpu", generator=None) -> torch.Tensor:
    """Standard normal values (never zeros), created in fp32 and cast, so every dtype sees the same numbers."""
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, computed in fp64."""
    if expected.numel() == 0:
        return 0.0
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    scale = max(expected.abs().max().item(), 1e-30)
    return (actual - expected).abs().max().item() / scale


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Compare in fp64 on the CPU (shapes must match; dtypes may differ)."""
    torch.testing.assert_close(
        actual.detach().double().cpu(), expected.detach().double().cpu(), atol=atol, rtol=rtol
    )


def assert_within_torch_error(actual: torch.Tensor, oracle: torch.Tensor, torch_result: torch.Tensor, *,
                              factor: float = 2.0, floor: float = 1e-3) -> None:
    """actual's error against the oracle is at most `factor` x plain PyTorch's, plus `floor`.

    torch_result is the same computation done by plain PyTorch at actual's precision.
    The floor keeps exact PyTorch results from demanding exactness. The defaults are
    the 16-bit rule (2x, floor 1e-3).
    """
    baseline = relative_error(torch_result, oracle)
    error = relative_error(actual, oracle)
    assert error <= factor * baseline + floor, (
        f"relative error {error:.3g} exceeds {factor:g}x PyTorch's {baseline:.3g} + {floor:g}"
    )


def poison_cuda_cache(nbytes: int) -> None:
    """Fill `nbytes` of freshly allocated CUDA memory with NaN and free it.

    The caching allocator hands the same block to the next allocation of a
    similar size, so an op that leaves part of its output unwritten shows NaN
    there instead of a lucky zero.
    """
    poison = torch.full((max(nbytes, 4) // 4 + 1,), float("nan"), dtype=torch.float32, device="cuda")
    del poison


@functools.lru_cache(maxsize=None)
def named_test_graph(name: str, seed_base: int = 0) -> Graph:
    """The kernel tests' graphs (CPU; callers move them), all with empty rows, an isolated node,
    self-loops and duplicates:

    small / small-int64: 300 nodes, 3,000 edges (int32 / int64 indices);
    hub: a target of in-degree 100,000; bipartite: 200 sources, 150 targets;
    many-rows: 40,000 nodes and a 20,000 in-degree hub, more rows than a GPU keeps warps resident;
    ladder: see degree_ladder_graph.
    """
    if name == "small":
        return random_graph(300, 3000, seed=seed_base)
    if name == "small-int64":
        return with_index_dtype(random_graph(300, 3000, seed=seed_base), torch.int64)
    if name == "hub":
        return random_graph(2000, 20000, hub_degree=100_000, seed=seed_base + 1)
    if name == "bipartite":
        return random_graph(200, 2000, num_dst_nodes=150, seed=seed_base + 2)
    if name == "many-rows":
        return random_graph(40_000, 400_000, hub_degree=20_000, seed=seed_base + 3)
    if name == "ladder":
        return degree_ladder_graph(seed=seed_base + 4)
    raise KeyError(name)


# In-degrees the ladder graph cycles through: empty, the smallest counts,
# odd ones, and both sides of 4, 8, 16 and 32 (the kernels' unroll and lane
# groups' and a warp's batches of slots).
LADDER_DEGREES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 127)


def degree_ladder_graph(num_nodes: int = 3000, hub_degree: int = 100_000, *, seed: int) -> Graph:
    """Target 0 is a hub of in-degree `hub_degree` (split into tiles); targets 1, 2, 3 have in-degree T - 1, T and
    T + 1 for the graph's tile length T (the light/heavy cut of the row schedule); every other target t has
    LADDER_DEGREES[t % len]. Sources are drawn at random (self-loops and duplicate edges occur), edges shuffled."""
    from gnnio_cli.graph.schedule import choose_tile_edges

    def indptr(degrees: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([[0], np.cumsum(degrees)]))

    rng = np.random.default_rng(seed)
    degrees = np.array([hub_degree] + [LADDER_DEGREES[t % len(LADDER_DEGREES)] for t in range(1, num_nodes)])
    degrees[1:4] = 0
    tile = choose_tile_edges(indptr(degrees))
    degrees[1:4] = (tile - 1, tile, tile + 1)
    assert choose_tile_edges(indptr(degrees)) == tile, "the rows at the cut moved the cut"
    dst = np.repeat(np.arange(num_nodes), degrees)
    src = rng.integers(0, num_nodes, size=dst.size)
    order = rng.permutation(src.size)
    return Graph.from_edge_index(np.stack([src[order], dst[order]]), size=(num_nodes, num_nodes))


def run_gnnio(args: list[str], capsys, monkeypatch, stdin: Optional[bytes] = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `gnnio ARGS`, run in-process through the entry point's main()
    (where every failure becomes its one line), with `stdin` as standard input."""
    import io
    import sys

    from gnnio_cli.cli import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b"")))
    try:
        main([str(arg) for arg in args])
        status = 0
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@dataclasses.dataclass(frozen=True)
class RealGraph:
    """One real graph of a manifest: its file, whether it is directed, and the counts the manifest states."""

    name: str
    path: Path
    directed: bool
    stats: dict


def real_graphs() -> list[RealGraph]:
    """The graphs of sample_graphs/manifest.json, then those of $GNNIO_DATASETS/manifest.json when that
    variable names a folder of the user's own graphs (same manifest format)."""
    import json
    import os

    from gnnio_cli.resources import SAMPLE_GRAPHS_DIR

    folders = [SAMPLE_GRAPHS_DIR] + ([Path(os.environ["GNNIO_DATASETS"])] if os.environ.get("GNNIO_DATASETS") else [])
    graphs = []
    for folder in folders:
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            raise FileNotFoundError(f"no manifest.json in {folder} (GNNIO_DATASETS must name a folder with one)")
        for entry in json.loads(manifest.read_text())["datasets"]:
            graphs.append(RealGraph(entry["name"], folder / entry["stats"]["file"], entry["directed"], entry["stats"]))
    return graphs
