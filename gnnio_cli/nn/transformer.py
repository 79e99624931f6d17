"""TransformerConv (graph transformer, Shi et al.) and AGNNConv (Thekumparampil et al.), as PyG 2.8."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio_cli.errors import GnnioError
from gnnio_cli.nn.adjacency import with_self_loops
from gnnio_cli.nn.base import (
    ConvBase,
    EdgeFeaturesForward,
    registered_children,
    returned_edges,
    reversed_pair_reason,
    split_pair,
)
from gnnio_cli.nn.linear import Linear, project_shared
from gnnio_cli.nn.message_passing import AttentionOutput, Edges, NodeFeatures
from gnnio_cli.nn import graph_ops


class TransformerConv(EdgeFeaturesForward, ConvBase, pyg_name="TransformerConv"):
    """Scaled dot-product attention over each target's in-edges, as PyG 2.8's TransformerConv.

    in_channels:  int, or (source, target) widths; -1 is lazy.
    out_channels: width per head C; heads H; concat heads ([N, H*C]) or average them ([N, C]).
    beta:         gate the skip connection: out = beta * skip + (1 - beta) * attention,
                  beta = sigmoid(lin_beta([attention, skip, attention - skip])) (needs root_weight).
    dropout:      on attention weights, training only.
    edge_dim:     width of edge features, projected by lin_edge and added to keys and values.
    root_weight:  add lin_skip(x_dst).

    forward(x or (x_src, x_dst), edge_index, edge_attr=None, return_attention_weights=None).
    With return_attention_weights a bool (even False, as PyG): (out, (edge_index, alpha [E, H])),
    alpha taken before dropout; edge_index is the input as given (a sparse adj_t included).
    No self-loops are added. ``_alpha`` is None after a call, as PyG leaves it.
    Runs PyG's code (see gnnio_cli.nn.message_passing) for what PyG fails on or broadcasts oddly:
    features not [N, F], x_dst None, edge_attr without edge_dim or 1-D, and for
    flow="target_to_source" with a pair of features.
    """

    def __init__(
        self,
        in_channels: Union[int, tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: Optional[int] = None,
        bias: bool = True,
        root_weight: bool = True,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.beta = beta and root_weight
        self.root_weight = root_weight
        self.concat = concat
        self.dropout = dropout
        self.edge_dim = edge_dim
        self._alpha = None
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        width = heads * out_channels
        self.lin_key = Linear(widths[0], width, bias=bias)
        self.lin_query = Linear(widths[1], width, bias=bias)
        self.lin_value = Linear(widths[0], width, bias=bias)
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, width, bias=False)
        else:
            self.register_parameter("lin_edge", None)
        skip_width = width if concat else out_channels
        self.lin_skip = Linear(widths[1], skip_width, bias=bias)
        if self.beta:
            self.lin_beta = Linear(3 * skip_width, 1, bias=False)
        else:
            self.register_parameter("lin_beta", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_key.reset_parameters()
        self.lin_query.reset_parameters()
        self.lin_value.reset_parameters()
        if self.edge_dim:
            self.lin_edge.reset_parameters()
        self.lin_skip.reset_parameters()
        if self.beta:
            self.lin_beta.reset_parameters()

    def _forward(self, x, edge_index, edge_attr, return_attention_weights) -> AttentionOutput:
        reason = self._reason(x, edge_index, edge_attr)
        if reason is not None:
            return self._run_pyg(reason, x, edge_index, edge_attr, return_attention_weights)
        self._ran("gnnio")
        heads, channels = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        skip = None
        if x_src is x_dst:
            names = ("lin_query", "lin_key", "lin_value") + (("lin_skip",) if self.root_weight else ())
            query, key, value, *rest = project_shared(x_src, *registered_children(self, *names))
            skip = rest[0] if rest else None
        else:
            query, key, value = self.lin_query(x_dst), self.lin_key(x_src), self.lin_value(x_src)
        query, key, value = (t.view(-1, heads, channels) for t in (query, key, value))
        adjacency = self.adjacency(edge_index, x_src.shape[0], x_dst.shape[0], x_src.device)
        if edge_attr is None and adjacency.values is not None and adjacency.values.dim() == 2:
            edge_attr = adjacency.values
        edge_features = None
        if self.lin_edge is not None:
            edge_features = self.lin_edge(edge_attr).view(-1, heads, channels)
        wants_attention = isinstance(return_attention_weights, bool)
        if self.root_weight and skip is None:
            skip = self.lin_skip(x_dst)
        # A plain skip connection on concatenated heads is added by the attention op as it stores each row
        # (one pass over the output fewer); a gated or head-averaged one afterwards, as PyG does.
        fused_skip = skip is not None and self.lin_beta is None and self.concat
        result = graph_ops.transformer_attention(
            adjacency.graph,
            query,
            key,
            value,
            edge_features,
            dropout=self.dropout,
            training=self.training,
            return_attention=wants_attention,
            residual=skip.view(-1, heads, channels) if fused_skip else None,
            out_dtype=_autocast_output_dtype(query),
        )
        out, alpha = result if wants_attention else (result, None)
        out = self._finish(out, skip, fused_skip)
        if wants_attention:
            return out, (returned_edges(edge_index, adjacency, changed=False), alpha)
        return out

    def _finish(self, out: Tensor, skip: Optional[Tensor], fused_skip: bool) -> Tensor:
        """The attention op's rows [N, H, C] -> the output: heads concatenated or averaged, the skip
        connection (gated with beta) unless the op added it (fused_skip)."""
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if skip is not None and not fused_skip:
            if self.lin_beta is not None:
                gate = self.lin_beta(torch.cat([out, skip, out - skip], dim=-1)).sigmoid()
                out = gate * skip + (1 - gate) * out
            else:
                out = out + skip
        return out

    def _reason(self, x: NodeFeatures, edge_index: Edges, edge_attr: Optional[Tensor]) -> Optional[str]:
        """Why this call runs PyG's code (None: gnnio's ops run it)."""
        reason = self._pyg_reason(("sum",), edge_index)
        if reason is not None:
            return reason
        x_src, x_dst = split_pair(x)
        if x_dst is None or x_src.dim() != 2 or x_dst.dim() != 2:
            return "node features that are not a pair of [N, F] tensors"
        if isinstance(edge_index, Tensor) and edge_index.layout == torch.sparse_csc:
            raise GnnioError("TransformerConv: PyG 2.8 takes no sparse CSC adjacency here; convert it with .to_sparse_csr()")
        values = edge_index.values() if isinstance(edge_index, Tensor) and edge_index.is_sparse else None
        features = edge_attr if edge_attr is not None else values if values is not None and values.dim() == 2 else None
        if (features is None) != (self.lin_edge is None) or (features is not None and features.dim() != 2):
            return "edge_attr without edge_dim, edge_dim without edge_attr, or edge_attr not [E, edge_dim]"
        return reversed_pair_reason(self, x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


def _autocast_output_dtype(rows: Tensor) -> Optional[torch.dtype]:
    """torch.float32 for 16-bit rows under CUDA autocast, else None (the rows' dtype). CUDA autocast runs the
    softmax's exp in fp32, so PyG's weighted messages, output and attention weights come out in fp32; the
    attention op accumulates in fp32 and returns that output as it is (out_dtype)."""
    if rows.is_cuda and rows.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled("cuda"):
        return torch.float32
    return None


class AGNNConv(ConvBase, pyg_name="AGNNConv"):
    """Attention by scaled cosine similarity, as PyG 2.8's AGNNConv.

    requires_grad:  beta (the temperature, initially 1) is a parameter; else a buffer of 1.
    add_self_loops: drop existing loops and add one per node.

    forward(x [N, F], edge_index) -> [N, F]:
    out[t] = sum_{s -> t} softmax_s(beta * cos(x[s], x[t])) * x[s].
    Runs PyG's code (see gnnio_cli.nn.message_passing) for features that are not [N, F].
    """

    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True, **kwargs):
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        self.requires_grad = requires_grad
        self.add_self_loops = add_self_loops
        if requires_grad:
            self.beta = Parameter(torch.empty(1))
        else:
            self.register_buffer("beta", torch.ones(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.requires_grad:
            self.beta.data.fill_(1)

    def forward(self, x: Tensor, edge_index: Edges) -> Tensor:
        if torch.jit.is_scripting():
            return self._pyg_forward(x, edge_index)
        else:
            return self._forward(x, edge_index)

    def _forward(self, x: Tensor, edge_index: Edges) -> Tensor:
        reason = self._pyg_reason(("sum",), edge_index)
        if reason is None and x.dim() != 2:
            reason = f"node features of shape {tuple(x.shape)}"
        if reason is not None:
            return self._run_pyg(reason, x, edge_index)
        if isinstance(edge_index, Tensor) and edge_index.layout == torch.sparse_csc:
            raise GnnioError("AGNNConv: PyG 2.8 takes no sparse CSC adjacency here; convert it with .to_sparse_csr()")
        self._ran("gnnio")
        adjacency = self.adjacency(edge_index, x.shape[0], x.shape[0], x.device)
        if self.add_self_loops:
            adjacency, _ = with_self_loops(adjacency, x.shape[0])
        return graph_ops.agnn_attention(adjacency.graph, x, x, self.beta, training=self.training)
