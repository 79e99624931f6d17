"""SAGEConv (GraphSAGE) and GINConv: neighbourhood reduction plus a root term, as PyG 2.8."""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.base import (
    ConvBase,
    aggregate_neighbours,
    nodes_back,
    nodes_first,
    reversed_pair_reason,
    split_pair,
    static_sparse_reason,
)
from gnnio_cli.nn.linear import Linear, reset_module
from gnnio_cli.nn.message_passing import PYG, Edges, NodeFeatures, Size

REDUCTIONS = ("sum", "mean", "max", "min")


class _ReduceConv(ConvBase):
    """What SAGEConv and GINConv share: forward's signature, which calls gnnio reduces, the reduction itself."""

    def forward(self, x: NodeFeatures, edge_index: Edges, size: Size = None) -> Tensor:
        if torch.jit.is_scripting():
            return self._pyg_forward(x, edge_index, size)
        else:
            return self._forward(x, edge_index, size)

    def _reason(self, x: NodeFeatures, edge_index: Edges) -> Optional[str]:
        reason = self._pyg_reason(REDUCTIONS, edge_index) or reversed_pair_reason(self, x)
        x_src = x if isinstance(x, Tensor) else x[0]
        return reason or static_sparse_reason(x_src, self.node_dim, edge_index)

    def _neighbours(self, x_src: Tensor, x_dst: Optional[Tensor], edge_index: Edges, size: Size) -> Tensor:
        """The reduction of source features over each target's in-edges, nodes along node_dim."""
        node_dim = self.node_dim
        num_dst = None if x_dst is None else x_dst.shape[node_dim]
        adjacency = self.adjacency(edge_index, x_src.shape[node_dim], num_dst, x_src.device, size)
        return nodes_back(aggregate_neighbours(adjacency, nodes_first(x_src, node_dim), self.reduction()), node_dim)


class SAGEConv(_ReduceConv, pyg_name="SAGEConv"):
    """out = lin_l(aggr_{s -> t} x_src[s]) + lin_r(x_dst[t]), as PyG 2.8's SAGEConv.

    in_channels: int, or (source width, target width) for bipartite inputs; -1 is lazy.
    aggr:        "mean" (default), "sum"/"add", "max" or "min" run on gnnio's ops (empty rows give 0);
                 every other PyG aggregation (a name such as "lstm" or "std", an Aggregation
                 object, a list with aggr_kwargs) runs PyG's code (see gnnio_cli.nn.message_passing).
    normalize:   L2-normalise each output row.
    root_weight: add lin_r(x_dst) (lin_r has no bias).
    project:     first map sources through relu(lin(x_src)) (lin has a bias).
    bias:        bias of lin_l.

    forward(x [N, F] (or a static graph's [B, N, F]) or (x_src [Ns, F_s], x_dst [Nd, F_d] or None),
    edge_index, size=None) -> [Nd, F_out]. A torch sparse adj_t's values weight the messages,
    as PyG's sparse matmul does.
    """

    def __init__(
        self,
        in_channels: Union[int, tuple[int, int]],
        out_channels: int,
        aggr="mean",
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
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        if aggr == "lstm":  # PyG sizes its LSTM aggregation from the source width
            kwargs.setdefault("aggr_kwargs", {})
            kwargs["aggr_kwargs"].setdefault("in_channels", widths[0])
            kwargs["aggr_kwargs"].setdefault("out_channels", widths[0])
        super().__init__(aggr, **kwargs)
        if self.project:
            if widths[0] <= 0:
                raise GnnioError("SAGEConv: project=True needs a known source width, got in_channels=-1")
            self.lin = Linear(widths[0], widths[0], bias=True)
        aggregated_width = widths[0]
        if PYG is not None and isinstance(self.aggr_module, PYG.multi_aggregation):
            aggregated_width = self.aggr_module.get_out_channels(widths[0])
        self.lin_l = Linear(aggregated_width, out_channels, bias=bias)
        if self.root_weight:
            self.lin_r = Linear(widths[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def _forward(self, x: NodeFeatures, edge_index: Edges, size: Size) -> Tensor:
        reason = self._reason(x, edge_index)
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, size)
        self._ran("gnnio")
        x_src, x_dst = split_pair(x)
        if self.project:
            x_src = self.lin(x_src).relu()
        out = self.lin_l(self._neighbours(x_src, x_dst, edge_index, size))
        if self.root_weight and x_dst is not None:
            out = out + self.lin_r(x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"


class GINConv(_ReduceConv, pyg_name="GINConv"):
    """out = nn((1 + eps) * x_dst[t] + sum_{s -> t} x_src[s]), as PyG 2.8's GINConv.

    nn:        the module applied after aggregation (re-initialised by reset_parameters, as PyG).
    eps:       initial epsilon; train_eps makes it a parameter, else a buffer.
    aggr:      as SAGEConv's (default "add").

    forward(x [N, F] (or [B, N, F]) or (x_src, x_dst or None), edge_index, size=None) -> nn's output.
    """

    def __init__(self, nn: Callable, eps: float = 0.0, train_eps: bool = False, **kwargs):
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def _forward(self, x: NodeFeatures, edge_index: Edges, size: Size) -> Tensor:
        reason = self._reason(x, edge_index)
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, size)
        self._ran("gnnio")
        x_src, x_dst = split_pair(x)
        out = self._neighbours(x_src, x_dst, edge_index, size)
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"
