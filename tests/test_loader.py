"""gnnio's NeighborLoader on the CPU: batches against a pure-Python sampler and PyG's properties.

The oracle (`reference_batch`) samples with Python integers, independently of the numba kernels:
the same counter-based hash, Floyd's algorithm with a set, a dict as the node table. The GPU sampler's
host side runs here too, on ops written in plain torch that do what native/sample.cu's kernels do
(tests/test_native_sample.py compares the real kernels with the CPU, bit for bit).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph
from gnnio_cli.graph.store import StoredGraph, save
from gnnio_cli.loader import NeighborLoader
from gnnio_cli.loader.sample import EMPTY, CpuSampler, CudaSampler, as_signed, hop_keys
from gnnio_cli.nn import GATConv
from testing import INDEX_DTYPES, assert_close, random_graph, randn, with_index_dtype

MASK = (1 << 64) - 1


# ------------------------------------------------------------------ the oracle
def mix(bits: int) -> int:
    """SplitMix64's finaliser of bits + golden ratio, on Python integers."""
    bits = (bits + 0x9E3779B97F4A7C15) & MASK
    bits = ((bits ^ (bits >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    bits = ((bits ^ (bits >> 27)) * 0x94D049BB133111EB) & MASK
    return bits ^ (bits >> 31)


def reference_keys(seed: int, epoch: int, batch: int, hops: int) -> list[int]:
    return [mix(mix(mix(mix(seed) ^ epoch) ^ batch) ^ hop) for hop in range(hops)]


def reference_picks(degree: int, fanout: int, replace: bool, key: int, node: int) -> list[int]:
    """The row slots a node takes, ascending."""
    if fanout < 0 or (not replace and fanout >= degree):
        return list(range(degree))
    if degree == 0:
        return []
    node_key = mix(key ^ node)
    bits = [mix(node_key ^ draw) for draw in range(fanout)]
    if replace:
        return sorted((value * degree) >> 64 for value in bits)
    chosen: set[int] = set()
    for draw, last in enumerate(range(degree - fanout, degree)):
        slot = (bits[draw] * (last + 1)) >> 64
        chosen.add(last if slot in chosen else slot)
    return sorted(chosen)


def reference_batch(graph: Graph, seeds: list[int], fanouts: list[int], replace: bool, keys: list[int]) -> dict:
    """n_id, sources (local), e_id, indptr and the per-hop counts, as Python lists."""
    indptr, indices, eid = (getattr(graph, f"csr_{name}").tolist() for name in ("indptr", "indices", "eid"))
    local = {}
    for position, node in enumerate(seeds):
        local.setdefault(node, position)
    n_id, frontier = list(seeds), list(seeds)
    sources, e_id, row_ends = [], [], []
    num_nodes, num_edges = [len(seeds)], []
    for fanout, key in zip(fanouts, keys):
        new = []
        for node in frontier:
            row = indptr[node]
            for slot in reference_picks(indptr[node + 1] - row, fanout, replace, key, node):
                source = indices[row + slot]
                if source not in local:
                    local[source] = len(n_id)
                    n_id.append(source)
                    new.append(source)
                sources.append(local[source])
                e_id.append(eid[row + slot])
            row_ends.append(len(sources))
        num_nodes.append(len(new))
        num_edges.append(len(sources) - sum(num_edges))
        frontier = new
    row_ends += [len(sources)] * len(frontier)
    return dict(n_id=n_id, sources=sources, e_id=e_id, indptr=[0] + row_ends, num_sampled_nodes=num_nodes,
                num_sampled_edges=num_edges)


def as_lists(sampled) -> dict:
    return dict(n_id=sampled.n_id.tolist(), sources=sampled.sources.tolist(), e_id=sampled.e_id.tolist(),
                indptr=sampled.indptr.tolist(), num_sampled_nodes=sampled.num_sampled_nodes,
                num_sampled_edges=sampled.num_sampled_edges)


# ------------------------------------------------------------------ native/sample.cu's ops in plain torch
def _pick_counts(indptr: torch.Tensor, nodes: torch.Tensor, fanout: int, replace: bool) -> torch.Tensor:
    degree = indptr[nodes + 1] - indptr[nodes]
    if fanout < 0:
        return degree
    if replace:
        return torch.where(degree > 0, fanout, 0)
    return degree.clamp(max=fanout)


class TorchSampleOps:
    """What each of native/sample.cu's ops does, with torch ops on the CPU (claims: scatter_reduce amin)."""

    CLAIM = 1 << 62

    @staticmethod
    def sample_seeds(table, seeds, indptr, fanout, replace):
        positions = torch.arange(seeds.numel())
        table.scatter_reduce_(0, seeds, positions, reduce="amin")
        return _pick_counts(indptr, seeds, fanout, replace)

    @staticmethod
    def sample_neighbors(indptr, indices, eid, frontier, ends, num_picks, fanout, replace, key):
        sources, eids = torch.empty(num_picks, dtype=torch.int64), torch.empty(num_picks, dtype=torch.int64)
        counts = _pick_counts(indptr, frontier, fanout, replace)
        for node, end, count in zip(frontier.tolist(), ends.tolist(), counts.tolist()):
            row = int(indptr[node])
            picks = reference_picks(int(indptr[node + 1]) - row, fanout, replace, key & MASK, node)
            slots = row + torch.tensor(picks, dtype=torch.int64)
            sources[end - count:end], eids[end - count:end] = indices[slots].long(), eid[slots]
        return sources, eids

    @classmethod
    def sample_first_seen(cls, table, sources, indptr, next_fanout, replace):
        edges = torch.arange(sources.numel())
        table.scatter_reduce_(0, sources, cls.CLAIM + edges, reduce="amin")
        first = table[sources] == cls.CLAIM + edges
        counts = torch.where(first, _pick_counts(indptr, sources, next_fanout, replace), 0)
        return torch.stack([first.long(), counts])

    @classmethod
    def sample_assign(cls, table, sources, cumulative, first_local, num_new):
        first = table[sources] == cls.CLAIM + torch.arange(sources.numel())
        positions = cumulative[0][first] - 1
        new_nodes, next_ends = torch.empty(num_new, dtype=torch.int64), torch.empty(num_new, dtype=torch.int64)
        new_nodes[positions], next_ends[positions] = sources[first], cumulative[1][first]
        table[sources[first]] = first_local + positions
        return new_nodes, next_ends

    @staticmethod
    def sample_relabel(table, sources, n_id):
        local = table[sources]
        table[n_id] = EMPTY
        return local


# ------------------------------------------------------------------ graphs
@pytest.fixture(scope="module", params=INDEX_DTYPES, ids=lambda dtype: str(dtype).split(".")[-1])
def graph(request) -> Graph:
    """400 nodes: empty rows, an isolated node, self-loops, duplicate edges and a hub of in-degree 3,000."""
    return with_index_dtype(random_graph(400, 4000, hub_degree=3000, seed=11), request.param)


def hub_of(graph: Graph) -> int:
    return int(graph.in_degree.argmax())


def base_slots(graph: Graph, e_id: torch.Tensor) -> torch.Tensor:
    """The CSR slot of each base edge id."""
    slot_of = torch.empty_like(graph.csr_eid)
    slot_of[graph.csr_eid] = torch.arange(graph.num_edges)
    return slot_of[e_id]


def check_batch(graph: Graph, batch, fanouts: list[int], replace: bool, seeds: torch.Tensor) -> None:
    """PyG's properties of a batch, and the batch graph's agreement with its edge_index."""
    n_id, (source, target) = batch.n_id, batch.edge_index
    assert batch.batch_size == seeds.numel() and torch.equal(n_id[: batch.batch_size], seeds)
    assert n_id.unique().numel() == n_id.numel(), "n_id repeats a node"
    assert batch.num_sampled_nodes[0] == batch.batch_size and sum(batch.num_sampled_nodes) == n_id.numel()
    assert len(batch.num_sampled_edges) == len(fanouts) and sum(batch.num_sampled_edges) == batch.num_edges
    # every sampled edge is a base edge with its id, expanded from the right target
    base_edges = graph.edge_index()[:, batch.e_id]
    assert torch.equal(base_edges, torch.stack([n_id[source], n_id[target]]))
    # per target: min(k, degree) distinct slots (k draws with replacement), in CSR slot order, hop by hop
    counts = torch.bincount(target, minlength=n_id.numel())
    degree = graph.in_degree[n_id]
    first = 0
    for hop, fanout in enumerate([*fanouts, 0]):
        nodes = slice(first, first + batch.num_sampled_nodes[hop])
        if fanout < 0:
            expected = degree[nodes]
        elif replace:
            expected = torch.where(degree[nodes] > 0, fanout, 0)
        else:
            expected = degree[nodes].clamp(max=fanout)
        assert torch.equal(counts[nodes], expected), f"hop {hop}: wrong pick counts"
        first = nodes.stop
    assert bool((target.diff() >= 0).all()), "edges are not grouped by target in local-id order"
    slots = base_slots(graph, batch.e_id)
    same_target = target[1:] == target[:-1]
    steps = slots.diff()[same_target]
    assert bool((steps >= 0).all() if replace else (steps > 0).all()), "a target's picks are not in slot order"
    check_graph(batch)


def check_graph(batch) -> None:
    """batch.graph is the graph of batch.edge_index (all six arrays), its facts already counted and right."""
    assert "facts" in batch.graph._cache, "the batch graph left the loader without its facts"
    fresh = Graph.from_edge_index(batch.edge_index, size=(batch.num_nodes, batch.num_nodes))
    for name in ("csr_indptr", "csr_indices", "csr_eid", "csc_indptr", "csc_indices", "csc_eid"):
        mine, theirs = getattr(batch.graph, name), getattr(fresh, name)
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), name
    assert batch.graph.facts == fresh.facts


# ------------------------------------------------------------------ the samplers against the oracle
def test_keys_are_the_hash_chain():
    for seed, epoch, batch in [(0, 0, 0), (7, 3, 11), (2**63 + 5, 2**40, 99)]:
        assert hop_keys(seed, epoch, batch, 3) == reference_keys(seed, epoch, batch, 3)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[4], [3, 2], [25, -1], [-1, 2, 1]], ids=str)
def test_cpu_sampler_matches_the_oracle(graph, fanouts, replace):
    sampler = CpuSampler(graph.csr_indptr, graph.csr_indices, graph.csr_eid)
    rng = np.random.default_rng(3)
    for trial in range(4):
        seeds = rng.choice(graph.num_nodes, size=24, replace=False).tolist()
        if trial == 0:
            seeds[:3] = [hub_of(graph), 0, hub_of(graph)]  # the hub, listed twice
        keys = hop_keys(trial, 1, trial, len(fanouts))
        got = sampler.sample(torch.tensor(seeds), fanouts, replace, keys)
        assert as_lists(got) == reference_batch(graph, seeds, fanouts, replace, keys)
        assert bool((sampler.table == EMPTY).all()), "the node table kept entries of the last batch"


@pytest.mark.parametrize("replace", [False, True])
def test_gpu_sampler_host_side_on_torch_ops(graph, replace, monkeypatch):
    """CudaSampler's hop loop (sizes, cumsums, row ends) on torch versions of its ops equals the CPU."""
    monkeypatch.setattr(torch.ops, "gnnio", TorchSampleOps)
    cpu = CpuSampler(graph.csr_indptr, graph.csr_indices, graph.csr_eid)
    gpu = CudaSampler(graph.csr_indptr, graph.csr_indices, graph.csr_eid)
    seeds = torch.tensor([hub_of(graph), 5, 17, 5, 300, 42])
    for fanouts in ([3, 2], [-1, 4, 1], [6]):
        keys = hop_keys(9, 0, 2, len(fanouts))
        assert as_lists(gpu.sample(seeds, fanouts, replace, keys)) == as_lists(cpu.sample(seeds, fanouts, replace, keys))
        assert bool((gpu.table == EMPTY).all())


def test_keys_pass_to_native_ops_as_their_bits():
    for key in (0, 5, 2**63 - 1, 2**63, MASK):
        assert as_signed(key) & MASK == key and -(2**63) <= as_signed(key) < 2**63


# ------------------------------------------------------------------ the loader
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[5], [15, 10], [-1, 3], [2, 2, 2]], ids=str)
def test_batches_have_pyg_properties(graph, fanouts, replace):
    loader = NeighborLoader(graph, fanouts, batch_size=32, replace=replace, shuffle=True, seed=4)
    batches = list(loader)
    assert len(batches) == len(loader) == math.ceil(graph.num_nodes / 32)
    seen = []
    for batch in batches:
        check_batch(graph, batch, fanouts, replace, batch.n_id[: batch.batch_size])
        assert torch.equal(batch.n_id[: batch.batch_size], loader.input_nodes[batch.input_id])
        seen.append(batch.input_id)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(graph.num_nodes))


def test_seeds_with_no_in_edges_and_an_isolated_node():
    graph = random_graph(50, 100, seed=5)
    empty = (graph.in_degree == 0).nonzero().view(-1)
    loader = NeighborLoader(graph, [3, 3], batch_size=8, input_nodes=empty, seed=0)
    for batch in loader:
        assert batch.num_edges == 0 and batch.num_sampled_nodes == [batch.batch_size, 0, 0]
        assert batch.num_sampled_edges == [0, 0] and batch.edge_index.shape == (2, 0)
        check_graph(batch)


def test_the_same_seed_gives_the_same_batches(graph):
    def epochs(seed, count=2):
        loader = NeighborLoader(graph, [4, 3], batch_size=50, shuffle=True, seed=seed)
        return [[(b.n_id, b.edge_index, b.e_id) for b in loader] for _ in range(count)]

    first, again, other = epochs(7), epochs(7), epochs(8)
    for epoch_a, epoch_b in zip(first, again):
        for a, b in zip(epoch_a, epoch_b):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(first[0][0][0], first[1][0][0]), "a new epoch must draw new batches"
    assert not torch.equal(first[0][0][0], other[0][0][0]), "another seed must draw other batches"


def test_an_unseeded_loader_follows_torch_manual_seed(graph):
    torch.manual_seed(3)
    first = next(iter(NeighborLoader(graph, [4], batch_size=10, shuffle=True)))
    torch.manual_seed(3)
    again = next(iter(NeighborLoader(graph, [4], batch_size=10, shuffle=True)))
    assert torch.equal(first.n_id, again.n_id) and torch.equal(first.e_id, again.e_id)


def test_shuffle_drop_last_and_len():
    graph = random_graph(103, 500, seed=6)
    plain = NeighborLoader(graph, [2], batch_size=10, seed=1)
    assert len(plain) == 11
    assert torch.equal(torch.cat([b.n_id[: b.batch_size] for b in plain]), torch.arange(103))
    assert [b.batch_size for b in plain][-2:] == [10, 3]
    dropped = NeighborLoader(graph, [2], batch_size=10, drop_last=True, shuffle=True, seed=1)
    assert len(dropped) == 10
    orders = [torch.cat([b.n_id[: b.batch_size] for b in dropped]) for _ in range(2)]
    assert all(order.numel() == 100 and order.unique().numel() == 100 for order in orders)
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[0], torch.arange(100))
    assert dropped.epoch == 2
    exact = NeighborLoader(graph, [2], batch_size=103, drop_last=True)
    assert len(exact) == 1 and len(NeighborLoader(graph, [2], batch_size=104, drop_last=True)) == 0


def test_input_nodes_as_ids_mask_and_list():
    graph = random_graph(60, 400, seed=7)
    ids = torch.tensor([5, 40, 3, 59, 0], dtype=torch.int32)
    mask = torch.zeros(60, dtype=torch.bool)
    mask[ids.long()] = True
    for input_nodes, expected in ((ids, ids.long()), (ids.tolist(), ids.long()), (mask, ids.long().sort().values)):
        loader = NeighborLoader(graph, [3], batch_size=2, input_nodes=input_nodes, seed=2)
        assert len(loader) == 3
        assert torch.equal(torch.cat([b.n_id[: b.batch_size] for b in loader]), expected)
        assert torch.equal(torch.cat([b.input_id for b in loader]), torch.arange(5))
    assert len(NeighborLoader(graph, [3], input_nodes=torch.tensor([], dtype=torch.int64))) == 0


def test_every_input_form_gives_the_same_batches(tmp_path):
    from torch_geometric.data import Data

    graph = random_graph(80, 600, seed=8)
    edge_index = graph.edge_index()
    x, y = randn(80, 7), torch.randint(0, 4, (80,))
    path = tmp_path / "graph.h5"
    save(StoredGraph(graph=graph, features={"x": x.numpy(), "y": y.numpy()}), path)
    loaders = [
        NeighborLoader(Data(edge_index=edge_index, x=x, y=y, num_nodes=80), [4, 2], batch_size=16, seed=3),
        NeighborLoader((edge_index, 80), [4, 2], batch_size=16, seed=3, x=x, y=y),
        NeighborLoader((edge_index.int().numpy(), 80), [4, 2], batch_size=16, seed=3, x=x.numpy(), y=y),
        NeighborLoader(path, [4, 2], batch_size=16, seed=3),
        NeighborLoader(graph, [4, 2], batch_size=16, seed=3, x=x, y=y),
    ]
    reference = list(loaders[0])
    for loader in loaders[1:]:
        for mine, theirs in zip(loader, reference):
            for name in ("n_id", "edge_index", "e_id", "x", "y"):
                assert torch.equal(getattr(mine, name), getattr(theirs, name)), name
    for batch in reference:
        assert torch.equal(batch.x, x[batch.n_id]) and torch.equal(batch.y, y[batch.n_id])


def test_features_override_data_and_batches_move():
    from torch_geometric.data import Data

    graph = random_graph(30, 200, seed=9)
    data = Data(edge_index=graph.edge_index(), x=randn(30, 4), num_nodes=30)
    other = randn(30, 2)
    batch = next(iter(NeighborLoader(data, [3], batch_size=5, seed=0, x=other)))
    assert torch.equal(batch.x, other[batch.n_id]) and batch.y is None
    moved = batch.to("cpu")
    assert torch.equal(moved.edge_index, batch.edge_index) and moved.graph.facts == batch.graph.facts
    assert "edge_index=[2, " in repr(batch) and "batch_size=5" in repr(batch)


def test_picks_are_uniform():
    """6,000 nodes of in-degree 10 at fan-out 3 (each node draws its own stream): each of the 120 subsets
    of slots about 50 times, and with replacement each slot about 1,800 times (chi-square far below the
    bounds for any fair sampler)."""
    degree, fanout, targets = 10, 3, 6000
    source = targets + torch.arange(degree).repeat(targets)  # target t's slot j holds source targets + j
    edge_index = torch.stack([source, torch.arange(targets).repeat_interleave(degree)])

    def slots(replace: bool) -> torch.Tensor:
        loader = NeighborLoader((edge_index, targets + degree), [fanout], batch_size=targets, replace=replace,
                                input_nodes=torch.arange(targets), seed=12)
        batch = next(iter(loader))
        return (batch.n_id[batch.edge_index[0]] - targets).view(targets, fanout)

    def chi_square(observed: torch.Tensor) -> float:
        expected = observed.sum() / observed.numel()
        return float(((observed - expected) ** 2 / expected).sum())

    picked = slots(replace=False)
    assert bool((picked.diff(dim=1) > 0).all()), "picks must be distinct and in slot order"
    subsets = torch.bincount((1 << picked).sum(dim=1), minlength=1 << degree)
    subsets = subsets[subsets > 0]
    assert subsets.numel() == math.comb(degree, fanout), "some subsets were never drawn"
    assert chi_square(subsets.double()) < 200  # 119 degrees of freedom
    assert chi_square(torch.bincount(slots(replace=True).view(-1), minlength=degree).double()) < 40  # 9


def test_gat_on_the_batch_graph_equals_gat_on_its_edge_index(graph):
    batch = next(iter(NeighborLoader(graph, [10, 5], batch_size=40, seed=1, x=randn(graph.num_nodes, 16))))
    torch.manual_seed(0)
    layer = GATConv(16, 8, heads=2)
    assert_close(layer(batch.x, batch.graph), layer(batch.x, batch.edge_index))


def test_an_uncached_batch_graph_shares_the_arrays_and_builds_the_rest_again(graph):
    """Graph.uncached (what gnnio compare hands a step as a new batch): the same arrays, the loader's facts and
    CSR rows kept, every structure a layer built gone, and a layer on it gives the same output."""
    batch = next(iter(NeighborLoader(graph, [10, 5], batch_size=40, seed=2, x=randn(graph.num_nodes, 16))))
    torch.manual_seed(0)
    layer = GATConv(16, 8, heads=2)
    expected = layer(batch.x, batch.graph)
    loaded = set(batch.graph.uncached()._cache)
    assert loaded and loaded <= {"facts", "csr_rows"} and len(batch.graph._cache) > len(loaded)
    fresh = batch.graph.uncached()
    assert fresh.csr_indices is batch.graph.csr_indices and fresh.csc_eid is batch.graph.csc_eid
    assert fresh.facts is batch.graph.facts
    assert_close(layer(batch.x, fresh), expected)
    assert set(batch.graph._cache) > set(fresh.uncached()._cache)


def test_pyg_layers_take_the_batches():
    """PyG's own GATConv on a gnnio batch equals gnnio's on the batch graph (same weights)."""
    from torch_geometric.nn import GATConv as PygGATConv

    graph = random_graph(200, 2000, seed=10)
    batch = next(iter(NeighborLoader(graph, [6, 4], batch_size=30, seed=5, x=randn(200, 12))))
    torch.manual_seed(1)
    theirs = PygGATConv(12, 6, heads=2)
    mine = GATConv(12, 6, heads=2)
    mine.load_state_dict(theirs.state_dict())
    assert_close(mine(batch.x, batch.graph), theirs(batch.x, batch.edge_index), atol=1e-5)


def test_gnnio_layers_take_pyg_loader_batches():
    """Where PyG's NeighborLoader can run (pyg-lib or torch-sparse), gnnio's layers take its batches."""
    from torch_geometric.data import Data
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        pytest.skip("PyG's NeighborLoader needs pyg-lib or torch-sparse")
    from torch_geometric.loader import NeighborLoader as PygNeighborLoader
    from torch_geometric.nn import GATConv as PygGATConv

    graph = random_graph(200, 2000, seed=10)
    data = Data(edge_index=graph.edge_index(), x=randn(200, 12), num_nodes=200)
    batch = next(iter(PygNeighborLoader(data, num_neighbors=[6, 4], batch_size=30)))
    torch.manual_seed(1)
    theirs = PygGATConv(12, 6, heads=2)
    mine = GATConv(12, 6, heads=2)
    mine.load_state_dict(theirs.state_dict())
    assert_close(mine(batch.x, batch.edge_index), theirs(batch.x, batch.edge_index), atol=1e-5)


# ------------------------------------------------------------------ on the GPU
def on_gpu(test):
    """Runs `test` only where CUDA is visible and the native extension builds."""
    test = pytest.mark.usefixtures("native_extension")(pytest.mark.gpu(test))
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test)


def assert_same_batch(on_device, on_cpu) -> None:
    """Two batches are equal, tensor for tensor, graph array for graph array, facts included."""
    for name in ("n_id", "edge_index", "e_id", "input_id", "x", "y"):
        mine, theirs = getattr(on_device, name), getattr(on_cpu, name)
        assert (mine is None) == (theirs is None), name
        assert mine is None or (mine.device == on_device.graph.device and torch.equal(mine.cpu(), theirs)), name
    for name in ("batch_size", "num_sampled_nodes", "num_sampled_edges"):
        assert getattr(on_device, name) == getattr(on_cpu, name), name
    for name in ("csr_indptr", "csr_indices", "csr_eid", "csc_indptr", "csc_indices", "csc_eid"):
        assert torch.equal(getattr(on_device.graph, name).cpu(), getattr(on_cpu.graph, name)), name
    assert on_device.graph._cache["facts"] == on_cpu.graph.facts


@on_gpu
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[15, 10], [-1, 3], [4, 4, 4]], ids=str)
def test_gpu_batches_equal_cpu_batches(graph, fanouts, replace):
    """The same seed gives the same batches on the GPU as on the CPU, bit for bit, epoch after epoch."""
    x, y = randn(graph.num_nodes, 8), torch.randint(0, 5, (graph.num_nodes,))
    options = dict(batch_size=64, shuffle=True, replace=replace, seed=21, x=x, y=y)
    on_cpu = NeighborLoader(graph, fanouts, **options)
    on_gpu = NeighborLoader(graph, fanouts, device="cuda", **options)
    assert isinstance(on_gpu.sampler, CudaSampler) and on_gpu.graph.device.type == "cuda"
    for _ in range(2):
        for mine, theirs in zip(on_gpu, on_cpu, strict=True):
            assert_same_batch(mine, theirs)
            check_graph(mine)
    assert bool((on_gpu.sampler.table == EMPTY).all()), "the node table kept entries of the last batch"


@on_gpu
def test_gpu_batches_of_a_large_graph_equal_cpu_batches():
    """Batches of 1,024 seeds at fan-out 15, 10 of 40,000 nodes with a 20,000 in-degree hub, some seeds listed
    twice."""
    from testing import named_test_graph

    graph = named_test_graph("many-rows")
    seeds = torch.cat([torch.arange(0, 40_000, 19), torch.tensor([hub_of(graph), hub_of(graph), 7, 7])])
    on_cpu = NeighborLoader(graph, [15, 10], batch_size=1024, input_nodes=seeds, seed=5)
    on_gpu = NeighborLoader(graph.to("cuda"), [15, 10], batch_size=1024, input_nodes=seeds.cuda(), seed=5)
    for mine, theirs in zip(on_gpu, on_cpu, strict=True):
        assert_same_batch(mine, theirs)


@on_gpu
def test_gpu_sampling_ops_pass_opcheck(graph):
    device_graph = graph.to("cuda")
    frontier = torch.tensor([hub_of(graph), 3, 17, 250], device="cuda")
    indptr = device_graph.csr_indptr
    ends = (indptr[frontier + 1] - indptr[frontier]).clamp(max=6).cumsum(0)
    arguments = (indptr, device_graph.csr_indices, device_graph.csr_eid, frontier, ends, int(ends[-1]), 6, False,
                 as_signed(hop_keys(1, 2, 3, 1)[0]))
    torch.library.opcheck(torch.ops.gnnio.sample_neighbors.default, arguments)


@on_gpu
def test_gpu_table_ops_pass_opcheck(graph):
    """The ops that write the node table, one hop in turn: schema (only the table mutates) and fake kernels,
    each checked on a copy of the table as it is before the op runs."""
    ops, device_graph = torch.ops.gnnio, graph.to("cuda")
    indptr = device_graph.csr_indptr
    table = torch.full((graph.num_nodes,), EMPTY, dtype=torch.int64, device="cuda")
    seeds = torch.tensor([hub_of(graph), 3, 17, 3], device="cuda")

    def run(op, *arguments):
        torch.library.opcheck(op.default, (table.clone(), *arguments), test_utils=("test_schema", "test_faketensor"))
        return op(table, *arguments)

    ends = run(ops.sample_seeds, seeds, indptr, 6, False).cumsum(0)
    sources, _ = ops.sample_neighbors(indptr, device_graph.csr_indices, device_graph.csr_eid, seeds, ends,
                                      int(ends[-1]), 6, False, 12345)
    cumulative = run(ops.sample_first_seen, sources, indptr, 4, False).cumsum(1)
    new_nodes, _ = run(ops.sample_assign, sources, cumulative, seeds.numel(), int(cumulative[0, -1]))
    n_id = torch.cat([seeds, new_nodes])
    local = run(ops.sample_relabel, sources, n_id)
    assert torch.equal(n_id[local], sources)
    assert bool((table == EMPTY).all())


@on_gpu
def test_gat_on_the_gpu_batch_graph_equals_gat_on_its_edge_index(graph):
    loader = NeighborLoader(graph, [10, 5], batch_size=40, seed=1, x=randn(graph.num_nodes, 16), device="cuda")
    torch.manual_seed(0)
    layer = GATConv(16, 8, heads=2).cuda()
    for batch in loader:
        assert_close(layer(batch.x, batch.graph), layer(batch.x, batch.edge_index), atol=1e-5)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(input_nodes=torch.tensor([3, 20])), "NeighborLoader: input_nodes holds node id 20, outside [0, 20)"),
        (dict(input_nodes=torch.tensor([-1, 2])), "NeighborLoader: input_nodes holds node id -1, outside [0, 20)"),
        (dict(input_nodes=torch.tensor([0.5])), "NeighborLoader: input_nodes must be a 1-d tensor of node ids"),
        (dict(input_nodes=torch.ones(19, dtype=torch.bool)), "an input_nodes mask must have one entry per node"),
        (dict(num_neighbors=[5, 0]), "NeighborLoader: num_neighbors must hold fan-outs > 0 or -1 (all neighbours), got [5, 0]"),
        (dict(num_neighbors=[-2]), "must hold fan-outs > 0 or -1 (all neighbours), got [-2]"),
        (dict(num_neighbors=[]), "NeighborLoader: num_neighbors must give at least one hop's fan-out, got []"),
        (dict(num_neighbors=5), "NeighborLoader: num_neighbors must be a list of per-hop fan-outs, got 5"),
        (dict(batch_size=0), "NeighborLoader: batch_size must be an integer >= 1, got 0"),
        (dict(x=torch.ones(19, 3)), "NeighborLoader: x must have one row per node (num_nodes=20), got shape (19, 3)"),
        (dict(y=torch.ones(21)), "NeighborLoader: y must have one row per node (num_nodes=20), got shape (21,)"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_arguments_are_one_line_errors(arguments, message):
    graph = random_graph(20, 60, seed=12)
    arguments = {"num_neighbors": [3], **arguments}
    with pytest.raises(GnnioError) as caught:
        NeighborLoader(graph, **arguments)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_unreadable_files_and_data_are_one_line_errors(tmp_path):
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not an hdf5 file")
    for data, message in [
        (broken, f"{broken}: not a readable HDF5 file"),
        (tmp_path / "missing.h5", "missing.h5: no such file"),
        (42, "NeighborLoader: data must be a PyG Data, an (edge_index, num_nodes) pair, a path to a gnnio .h5 or a gnnio Graph, got int"),
    ]:
        with pytest.raises(GnnioError) as caught:
            NeighborLoader(data, [3])
        assert message in str(caught.value) and "\n" not in str(caught.value)
