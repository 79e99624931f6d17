"""SAGEConv (GraphSAGE) and GINConv: neighbourhood reduction plus a root term, as PyG 2.8."""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.adjacency import EdgesInput
from gnnio_cli.nn.base import REDUCTIONS, ConvBase, NodeFeatures, Size, aggregate_neighbours, split_pair
from gnnio_cli.nn.linear import Linear, reset_module


class SAGEConv(ConvBase):
    """out = lin_l(aggr_{s -> t} x_src[s]) + lin_r(x_dst[t]), as PyG 2.8's SAGEConv.

    in_channels: int, or (source width, target width) for bipartite inputs; -1 is lazy.
    aggr:        "mean" (default), "sum"/"add", "max" or "min"; empty rows give 0.
    normalize:   L2-normalise each output row.
    root_weight: add lin_r(x_dst) (lin_r has no bias).
    project:     first map sources through relu(lin(x_src)) (lin has a bias).
    bias:        bias of lin_l.

    forward(x [N, F] or (x_src [Ns, F_s], x_dst [Nd, F_d] or None), edge_index, size=None) -> [Nd, F_out].
    A sparse adj_t's values weight the messages, as PyG's sparse matmul does.
    """

    def __init__(
        self,
        in_channels: Union[int, tuple[int, int]],
        out_channels: int,
        aggr: Optional[str] = "mean",
        normalize: bool = False,
        root_weight: bool = True,
        project: bool = False,
        bias: bool = True,
        **kwargs,
    ):
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.normalize = normalize
        self.root_weight = root_weight
        self.project = project
        super().__init__(aggr, **kwargs)
        if self.aggr not in REDUCTIONS:
            raise GnnioError(f"SAGEConv: aggr must be one of {', '.join(REDUCTIONS)}, got {self.aggr!r}")
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        if self.project:
            if widths[0] <= 0:
                raise GnnioError("SAGEConv: project=True needs a known source width, got in_channels=-1")
            self.lin = Linear(widths[0], widths[0], bias=True)
        self.lin_l = Linear(widths[0], out_channels, bias=bias)
        if self.root_weight:
            self.lin_r = Linear(widths[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def forward(self, x: NodeFeatures, edge_index: EdgesInput, size: Size = None) -> Tensor:
        x_src, x_dst = split_pair(x)
        if self.project:
            x_src = self.lin(x_src).relu()
        adjacency = self.adjacency(edge_index, x_src, x_dst, size)
        out = self.lin_l(aggregate_neighbours(adjacency, x_src, REDUCTIONS[self.aggr]))
        if self.root_weight and x_dst is not None:
            out = out + self.lin_r(x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"


class GINConv(ConvBase):
    """out = nn((1 + eps) * x_dst[t] + sum_{s -> t} x_src[s]), as PyG 2.8's GINConv.

    nn:        the module applied after aggregation (re-initialised by reset_parameters, as PyG).
    eps:       initial epsilon; train_eps makes it a parameter, else a buffer.

    forward(x [N, F] or (x_src, x_dst or None), edge_index, size=None) -> nn's output.
    """

    def __init__(self, nn: Callable, eps: float = 0.0, train_eps: bool = False, **kwargs):
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        if self.aggr not in REDUCTIONS:
            raise GnnioError(f"GINConv: aggr must be one of {', '.join(REDUCTIONS)}, got {self.aggr!r}")
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x: NodeFeatures, edge_index: EdgesInput, size: Size = None) -> Tensor:
        x_src, x_dst = split_pair(x)
        adjacency = self.adjacency(edge_index, x_src, x_dst, size)
        out = aggregate_neighbours(adjacency, x_src, REDUCTIONS[self.aggr])
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"
