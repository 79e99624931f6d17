"""Training GCN and GAT on the Planetoid citation graphs, with gnnio's layers and PyG's.

The data are the original Planetoid files (``ind.<name>.{x,tx,allx,y,ty,ally,
graph,test.index}``), read with pickle and scipy and processed exactly as
``torch_geometric.datasets.Planetoid`` does (public split, CiteSeer's
isolated test nodes, self-loops dropped, edges coalesced), then row-normalised
as ``NormalizeFeatures``. The models and optimisers are those of PyG's
``examples/gcn.py`` and ``examples/gat.py``. The same model code runs with
either library's layers: :func:`build_model` takes the layer namespace, and
for a seed both libraries start from identical weights.

Reported accuracy: the test accuracy at the epoch of best validation
accuracy (the first such epoch), as PyG's examples report it.
"""

from __future__ import annotations

import functools
import math
import pickle
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from gnnio_cli.errors import GnnioError
from gnnio_cli.resources import SAMPLE_GRAPHS_DIR

DATASETS = {"cora": "Cora", "citeseer": "CiteSeer"}
MODELS = ("gcn", "gat")
PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
NUM_VALIDATION = 500


# -------------------------------------------------------------------- data
@dataclass
class Planetoid:
    """One Planetoid graph with its public split.

    x: float32 [N, F] row-normalised bag-of-words; y: int64 [N] classes;
    edge_index: int64 [2, E] both directions, no self-loops, sorted by (target, source);
    *_mask: bool [N].
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    raw_dir: Path

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1

    def to(self, device) -> "Planetoid":
        moved = {name: getattr(self, name).to(device) for name in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask")}
        return Planetoid(self.name, raw_dir=self.raw_dir, **moved)


def planetoid_search_path(name: str) -> list[Path]:
    """Where the raw files of dataset `name` (Cora, CiteSeer) are looked for without --data-dir: the bundled copy."""
    return [SAMPLE_GRAPHS_DIR / "planetoid" / name / "raw"]


def find_planetoid(dataset: str, data_dir: Optional[Path] = None) -> Path:
    """The raw folder of `dataset` ("cora" or "citeseer"): `data_dir` if given, else the search path.

    data_dir may be the raw folder itself or a Planetoid root holding <Name>/raw.
    """
    name = _dataset_name(dataset)
    if data_dir is not None:
        candidates = [Path(data_dir), Path(data_dir) / name / "raw"]
    else:
        candidates = planetoid_search_path(name)
    for folder in candidates:
        if all((folder / f"ind.{name.lower()}.{part}").is_file() for part in PLANETOID_PARTS):
            return folder
    looked = ", ".join(str(folder) for folder in candidates)
    raise GnnioError(f"Planetoid files ind.{name.lower()}.* not found in {looked}; pass --data-dir")


def load_planetoid(dataset: str, data_dir: Optional[Path] = None) -> Planetoid:
    """Read and process a Planetoid dataset as torch_geometric's Planetoid + NormalizeFeatures."""
    name = _dataset_name(dataset)
    raw_dir = find_planetoid(dataset, data_dir)
    parts = {part: _read_part(raw_dir, name, part) for part in PLANETOID_PARTS}
    tx, allx = parts["tx"], parts["allx"]  # the training rows' own "x" file is a subset of allx
    y, ty, ally = parts["y"], parts["ty"], parts["ally"]
    test_index = parts["test.index"]
    sorted_test_index = np.sort(test_index)
    if name == "CiteSeer":
        # Some CiteSeer test nodes have no features or label in the files (isolated
        # nodes): the test block spans min..max of the test ids, with zero rows for them.
        span = int(test_index.max() - test_index.min()) + 1
        tx_full = np.zeros((span, tx.shape[1]), dtype=tx.dtype)
        tx_full[sorted_test_index - test_index.min()] = tx
        ty_full = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_full[sorted_test_index - test_index.min()] = ty
        tx, ty = tx_full, ty_full
    features = np.concatenate([allx, tx])
    features[test_index] = features[sorted_test_index]
    labels = np.concatenate([ally, ty]).argmax(axis=1)
    labels[test_index] = labels[sorted_test_index]
    num_nodes = labels.shape[0]

    def mask(indices) -> torch.Tensor:
        out = torch.zeros(num_nodes, dtype=torch.bool)
        out[torch.as_tensor(indices, dtype=torch.int64)] = True
        return out

    features = torch.from_numpy(features.astype(np.float32))
    features = features / features.sum(dim=-1, keepdim=True).clamp(min=1)
    return Planetoid(
        name=name,
        x=features,
        y=torch.from_numpy(labels.astype(np.int64)),
        edge_index=_edges_from_adjacency_lists(parts["graph"], num_nodes),
        train_mask=mask(np.arange(y.shape[0])),
        val_mask=mask(np.arange(y.shape[0], y.shape[0] + NUM_VALIDATION)),
        test_mask=mask(test_index),
        raw_dir=raw_dir,
    )


def _dataset_name(dataset: str) -> str:
    try:
        return DATASETS[dataset.lower()]
    except KeyError:
        raise GnnioError(f"unknown dataset '{dataset}': choose one of {', '.join(DATASETS)}") from None


def _read_part(raw_dir: Path, name: str, part: str):
    """One raw file: test.index as int64 [T], graph as a dict, the rest as dense float32 arrays."""
    path = raw_dir / f"ind.{name.lower()}.{part}"
    if part == "test.index":
        return np.loadtxt(path, dtype=np.int64).reshape(-1)
    try:
        with open(path, "rb") as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the pickles name scipy's old module paths
            content = pickle.load(handle, encoding="latin1")
    except (pickle.UnpicklingError, EOFError, ModuleNotFoundError, AttributeError) as err:
        raise GnnioError(f"{path}: not a readable Planetoid pickle ({err})") from None
    if part == "graph":
        return content
    dense = content.todense() if hasattr(content, "todense") else content
    return np.asarray(dense, dtype=np.float32)


def _edges_from_adjacency_lists(adjacency_lists: dict, num_nodes: int) -> torch.Tensor:
    """int64 [2, E]: every (node, neighbour) pair once, self-loops dropped, sorted by (neighbour, node)."""
    sources = np.fromiter(
        (node for node, neighbours in adjacency_lists.items() for _ in neighbours), dtype=np.int64
    )
    targets = np.fromiter(
        (neighbour for neighbours in adjacency_lists.values() for neighbour in neighbours), dtype=np.int64
    )
    keep = sources != targets
    keys = np.unique(targets[keep] * num_nodes + sources[keep])
    return torch.from_numpy(np.stack([keys % num_nodes, keys // num_nodes]))


# ------------------------------------------------------------------ models
class GCN(torch.nn.Module):
    """Two GCNConv layers (hidden 16, ReLU, dropout 0.5 on inputs and hidden), as PyG's example."""

    def __init__(self, layers: ModuleType, in_channels: int, hidden_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = layers.GCNConv(in_channels, hidden_channels, cached=True)
        self.conv2 = layers.GCNConv(hidden_channels, out_channels, cached=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class GAT(torch.nn.Module):
    """GATConv 8 heads x 8, ELU, then one head averaged; dropout 0.6 on features and attention."""

    def __init__(self, layers: ModuleType, in_channels: int, hidden_channels: int, out_channels: int, heads: int = 8):
        super().__init__()
        self.conv1 = layers.GATConv(in_channels, hidden_channels, heads=heads, dropout=0.6)
        self.conv2 = layers.GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


@dataclass(frozen=True)
class Recipe:
    """A model with its PyG-example hyper-parameters."""

    hidden_channels: int
    learning_rate: float
    weight_decay: float
    build: Callable[[ModuleType, int, int, int], torch.nn.Module]
    decay_first_layer_only: bool


RECIPES = {
    # Kipf and Welling (and PyG's example) decay only the first layer's weights.
    "gcn": Recipe(16, 0.01, 5e-4, GCN, decay_first_layer_only=True),
    "gat": Recipe(8, 0.005, 5e-4, GAT, decay_first_layer_only=False),
}


def build_model(model: str, layers: ModuleType, data: Planetoid) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model named `model` built from `layers` (gnnio_cli.nn or torch_geometric.nn), and its Adam."""
    recipe = RECIPES[model]
    network = recipe.build(layers, data.x.shape[1], recipe.hidden_channels, data.num_classes)
    if recipe.decay_first_layer_only:
        groups = [
            {"params": network.conv1.parameters(), "weight_decay": recipe.weight_decay},
            {"params": network.conv2.parameters(), "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": network.parameters(), "weight_decay": recipe.weight_decay}]
    return network, torch.optim.Adam(groups, lr=recipe.learning_rate)


# ---------------------------------------------------------------- training
@dataclass
class SeedResult:
    """One training run: accuracies at the epoch of best validation accuracy, and time per epoch."""

    seed: int
    test_accuracy: float
    val_accuracy: float
    best_epoch: int
    seconds_per_epoch: float


@dataclass
class LibraryResult:
    """All seeds of one library: mean and sample standard deviation of test accuracy."""

    library: str
    runs: list[SeedResult] = field(default_factory=list)

    @property
    def accuracies(self) -> list[float]:
        return [run.test_accuracy for run in self.runs]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracies)

    @property
    def std(self) -> float:
        return statistics.stdev(self.accuracies) if len(self.runs) > 1 else 0.0

    @property
    def seconds_per_epoch(self) -> float:
        return statistics.fmean(run.seconds_per_epoch for run in self.runs)


@dataclass
class TrainingReport:
    """What `gnnio train` prints."""

    model: str
    dataset: str
    epochs: int
    seeds: int
    device: str
    raw_dir: str
    libraries: list[LibraryResult]
    pyg_missing: Optional[str] = None


def train_seed(
    model: str, layers: ModuleType, data: Planetoid, seed: int, epochs: int, on_epoch: Optional[Callable[[int], None]] = None
) -> SeedResult:
    """Train one model from torch.manual_seed(seed); data must be on the target device.
    on_epoch(epoch) is called after each epoch (1-based), for progress displays."""
    torch.manual_seed(seed)
    network, optimizer = build_model(model, layers, data)
    network = network.to(data.x.device)
    best_val, best_test, best_epoch = -math.inf, 0.0, 0
    started = time.perf_counter()
    for epoch in range(1, epochs + 1):
        network.train()
        optimizer.zero_grad()
        out = network(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        optimizer.step()
        val_accuracy, test_accuracy = evaluate(network, data)
        if val_accuracy > best_val:
            best_val, best_test, best_epoch = val_accuracy, test_accuracy, epoch
        if on_epoch is not None:
            on_epoch(epoch)
    if data.x.is_cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / max(epochs, 1)
    return SeedResult(seed, best_test, best_val, best_epoch, seconds)


@torch.no_grad()
def evaluate(network: torch.nn.Module, data: Planetoid) -> tuple[float, float]:
    """(validation accuracy, test accuracy) in eval mode."""
    network.eval()
    predicted = network(data.x, data.edge_index).argmax(dim=-1)
    correct = predicted == data.y
    return tuple(float(correct[mask].float().mean()) for mask in (data.val_mask, data.test_mask))


def pyg_layers() -> tuple[Optional[ModuleType], Optional[str]]:
    """(torch_geometric.nn, None) when PyG imports, else (None, why not)."""
    try:
        import torch_geometric.nn as layers
    except ImportError as err:
        return None, str(err)
    return layers, None


def train(
    model: str,
    dataset: str,
    *,
    seeds: int = 10,
    epochs: int = 200,
    device: Optional[str] = None,
    against_pyg: bool = True,
    data_dir: Optional[Path] = None,
    progress: Optional[Callable[[str, SeedResult], None]] = None,
    on_epoch: Optional[Callable[[str, int, int], None]] = None,
) -> TrainingReport:
    """Train `model` on `dataset` for seeds 0..seeds-1 with gnnio's layers and, if asked and installed, PyG's.

    progress(library, run) is called after each seed, on_epoch(library, seed, epoch) after each epoch."""
    if model not in RECIPES:
        raise GnnioError(f"unknown model '{model}': choose one of {', '.join(MODELS)}")
    if seeds < 1 or epochs < 1:
        raise GnnioError(f"--seeds and --epochs must be at least 1, got {seeds} and {epochs}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise GnnioError("--device cuda: torch sees no CUDA GPU; use --device cpu")
    data = load_planetoid(dataset, data_dir).to(device)
    import gnnio_cli.nn as gnnio_layers

    libraries = [("gnnio", gnnio_layers)]
    pyg_missing = None
    if against_pyg:
        layers, pyg_missing = pyg_layers()
        if layers is not None:
            libraries.append(("pyg", layers))
    results = []
    for library, layers in libraries:
        result = LibraryResult(library)
        for seed in range(seeds):
            epoch_done = None if on_epoch is None else functools.partial(on_epoch, library, seed)
            run = train_seed(model, layers, data, seed, epochs, epoch_done)
            result.runs.append(run)
            if progress is not None:
                progress(library, run)
        results.append(result)
    return TrainingReport(model, dataset, epochs, seeds, device, str(data.raw_dir), results, pyg_missing)
