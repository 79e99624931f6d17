"""What `gnnio run` and `gnnio compare` execute: layers and aggregation-only ops.

A workload is built once per (graph, settings) with seeded random inputs and
weights, then called repeatedly. Every workload has a `forward()` and a
`train_step()` (forward plus backward of a fixed random output gradient) and
knows the fewest bytes its forward pass must move (the byte floor).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import Graph

LAYERS = ("gcn", "sage-mean", "sage-sum", "sage-max", "sage-min", "gin", "gat", "gatv2", "transformer", "agnn")
ATTENTION_LAYERS = ("gat", "gatv2", "transformer", "agnn")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Settings:
    layer: str
    features: int = 128
    heads: int = 4
    dtype: str = "fp32"
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self):
        if self.layer not in LAYERS:
            raise GnnioError(f"unknown layer '{self.layer}': choose one of {', '.join(LAYERS)}")
        if self.dtype not in DTYPES:
            raise GnnioError(f"unknown dtype '{self.dtype}': choose one of {', '.join(DTYPES)}")
        if self.features < 1:
            raise GnnioError(f"--features must be positive, got {self.features}")
        if self.layer in ATTENTION_LAYERS and self.layer != "agnn":
            if self.heads < 1:
                raise GnnioError(f"--heads must be at least 1, got {self.heads}")
            if self.features % self.heads:
                raise GnnioError(
                    f"--heads {self.heads} does not divide --features {self.features}: "
                    "attention layers split the features evenly across heads"
                )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def head_width(self) -> int:
        return self.features // self.heads


@dataclass
class Workload:
    """A callable forward pass with its inputs; `train_step` adds the backward pass."""

    name: str
    forward: Callable[[], torch.Tensor]
    inputs: list[torch.Tensor] = field(default_factory=list)
    parameters: list[torch.Tensor] = field(default_factory=list)
    floor_bytes: int = 0
    module: Optional[torch.nn.Module] = None

    def train_step(self) -> torch.Tensor:
        for tensor in self.inputs + self.parameters:
            tensor.grad = None
        out = self.forward()
        out.backward(self._output_grad(out))
        return out

    def _output_grad(self, out: torch.Tensor) -> torch.Tensor:
        grad = getattr(self, "_grad", None)
        if grad is None or grad.shape != out.shape:
            generator = torch.Generator(device=out.device).manual_seed(1234)
            grad = torch.randn(out.shape, generator=generator, device=out.device, dtype=out.dtype)
            self._grad = grad
        return grad


def check_device(device: str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GnnioError("--device cuda: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); use --device cpu")
    return device


def _random(shape, settings: Settings, generator: torch.Generator, *, grad: bool = True, scale: float = 1.0) -> torch.Tensor:
    tensor = torch.randn(shape, generator=generator, dtype=torch.float32) * scale
    tensor = tensor.to(device=settings.device, dtype=settings.torch_dtype)
    return tensor.requires_grad_(grad)


def _structure_bytes(graph: Graph) -> int:
    return graph.csr_indptr.numel() * 8 + graph.csr_indices.numel() * graph.csr_indices.element_size()


# ----------------------------------------------------------------- ops only
def op_workload(graph: Graph, settings: Settings) -> Workload:
    """The layer's aggregation alone (no projections), on `settings.device`."""
    from gnnio_cli.ops.attention import agnn_attention, gat_attention, gatv2_attention, transformer_attention
    from gnnio_cli.ops.reduce import aggregate
    from gnnio_cli.ops.spmm import gcn_propagate

    graph = graph.to(settings.device)
    generator = torch.Generator().manual_seed(settings.seed)
    n_src, n_dst, width = graph.num_src_nodes, graph.num_dst_nodes, settings.features
    element = torch.empty((), dtype=settings.torch_dtype).element_size()
    node_bytes = (n_src + n_dst) * width * element
    layer, heads, head_width = settings.layer, settings.heads, settings.head_width
    floor = _structure_bytes(graph) + node_bytes
    # GAT's and the Transformer's 16-bit aggregation return fp32, as their layers take it under autocast (and as
    # PyG's layers return it there); their backward then takes the source pass first (see ops.attention_native)
    wide_out = torch.float32 if element == 2 else None
    wide_out_bytes = n_dst * width * (4 - element) if wide_out is not None else 0

    if layer == "gcn":
        x = _random((n_src, width), settings, generator)
        return Workload("gcn propagation", lambda: gcn_propagate(graph, x), [x], floor_bytes=floor + graph.num_edges * 4)
    if layer.startswith("sage-") or layer == "gin":
        reduction = "sum" if layer == "gin" else layer.split("-")[1]
        x = _random((n_src, width), settings, generator)
        return Workload(f"{reduction} aggregation", lambda: aggregate(graph, x, reduction), [x], floor_bytes=floor)
    if layer == "gat":
        x_src = _random((n_src, heads, head_width), settings, generator)
        alpha_src = _random((n_src, heads), settings, generator)
        alpha_dst = _random((n_dst, heads), settings, generator)
        return Workload(
            "gat attention",
            lambda: gat_attention(graph, x_src, alpha_src, alpha_dst, out_dtype=wide_out),
            [x_src, alpha_src, alpha_dst],
            floor_bytes=floor + (n_src + n_dst) * heads * element + wide_out_bytes,
        )
    if layer == "gatv2":
        x_src = _random((n_src, heads, head_width), settings, generator)
        x_dst = _random((n_dst, heads, head_width), settings, generator)
        att = _random((heads, head_width), settings, generator, scale=head_width**-0.5)
        return Workload(
            "gatv2 attention",
            lambda: gatv2_attention(graph, x_src, x_dst, att),
            [x_src, x_dst],
            [att],
            floor_bytes=floor + n_dst * width * element,
        )
    if layer == "transformer":
        query = _random((n_dst, heads, head_width), settings, generator)
        key = _random((n_src, heads, head_width), settings, generator)
        value = _random((n_src, heads, head_width), settings, generator)
        return Workload(
            "transformer attention",
            lambda: transformer_attention(graph, query, key, value, out_dtype=wide_out),
            [query, key, value],
            floor_bytes=floor + (n_src + n_dst) * width * element + wide_out_bytes,
        )
    # agnn
    x = _random((n_src, width), settings, generator)
    beta = torch.tensor(1.0, device=settings.device, requires_grad=True)
    return Workload(
        "agnn attention", lambda: agnn_attention(graph, x, x, beta), [x], [beta], floor_bytes=floor
    )


def spmm_yardstick(graph: Graph, settings: Settings) -> Workload:
    """cuSPARSE SpMM through torch.sparse CSR (unit values) at the same width: the bandwidth-bound yardstick.

    Its backward multiplies by an explicit transposed CSR (the CSC), which costs
    what the forward costs; cuSPARSE's transpose flag is several times slower.
    """
    if torch.device(settings.device).type == "cpu" and settings.dtype != "fp32":
        raise GnnioError(f"--against cusparse: torch.sparse has no {settings.dtype} CSR matmul on the CPU; use fp32 or a GPU")
    graph = graph.to(settings.device)
    generator = torch.Generator().manual_seed(settings.seed)
    x = _random((graph.num_src_nodes, settings.features), settings, generator)
    values = torch.ones(graph.num_edges, device=settings.device, dtype=settings.torch_dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse (CSR tensor support|invariant checks)")
        adjacency = _sparse_csr(graph.csr_indptr, graph.csr_indices, values, (graph.num_dst_nodes, graph.num_src_nodes))
        adjacency_t = _sparse_csr(graph.csc_indptr, graph.csc_indices, values, (graph.num_src_nodes, graph.num_dst_nodes))

    class _SpMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, features):
            return adjacency @ features

        @staticmethod
        def backward(ctx, grad):
            return adjacency_t @ grad

    element = x.element_size()
    floor = _structure_bytes(graph) + graph.num_edges * element + (graph.num_src_nodes + graph.num_dst_nodes) * settings.features * element
    return Workload("cuSPARSE SpMM (torch.sparse CSR)", lambda: _SpMM.apply(x), [x], floor_bytes=floor)


def _sparse_csr(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, size) -> torch.Tensor:
    """A torch.sparse CSR tensor (torch wants indptr and indices of one dtype)."""
    return torch.sparse_csr_tensor(indptr, indices.to(indptr.dtype), values, size=size)


# ------------------------------------------------------------ whole layers
def make_layer(settings: Settings, library, *, cached: bool = True) -> torch.nn.Module:
    """The layer named by `settings` from `library` (gnnio_cli.nn or torch_geometric.nn); GCNConv `cached`
    (a fixed graph's normalisation kept, as users of one graph set it)."""
    width, heads = settings.features, settings.heads
    layer = settings.layer
    if layer == "gcn":
        return library.GCNConv(width, width, cached=cached)
    if layer.startswith("sage-"):
        return library.SAGEConv(width, width, aggr=layer.split("-")[1])
    if layer == "gin":
        return library.GINConv(torch.nn.Linear(width, width))
    if layer == "gat":
        return library.GATConv(width, settings.head_width, heads=heads)
    if layer == "gatv2":
        return library.GATv2Conv(width, settings.head_width, heads=heads)
    if layer == "transformer":
        return library.TransformerConv(width, settings.head_width, heads=heads)
    return library.AGNNConv()


def layer_workload(graph: Graph, settings: Settings, library=None, *, module: Optional[torch.nn.Module] = None,
                   compiled: bool = False) -> Workload:
    """A whole layer (projections included) with seeded weights, fed `graph`.

    gnnio's layers take the Graph itself; other libraries get its edge_index.
    Pass `module` to reuse weights (e.g. PyG's layer loaded with gnnio's state).
    compiled: run the module under torch.compile, fed the edge_index (gnnio's layers too: a compiled
    layer takes its graph as a tensor), with fullgraph=True for gnnio's (a graph break is an error).
    """
    import gnnio_cli.nn as gnnio_nn

    library = library or gnnio_nn
    graph = graph.to(settings.device)
    if module is None:
        torch.manual_seed(settings.seed)
        module = make_layer(settings, library)
    module = module.to(device=settings.device, dtype=settings.torch_dtype)
    generator = torch.Generator().manual_seed(settings.seed + 1)
    x = _random((graph.num_nodes, settings.features), settings, generator)
    adjacency = graph if library is gnnio_nn and not compiled else graph.edge_index()
    call = torch.compile(module, fullgraph=library is gnnio_nn) if compiled else module
    element = x.element_size()
    floor = _structure_bytes(graph) + 2 * graph.num_nodes * settings.features * element
    return Workload(
        f"{settings.layer} layer", lambda: call(x, adjacency), [x], list(module.parameters()), floor_bytes=floor,
        module=module,
    )
