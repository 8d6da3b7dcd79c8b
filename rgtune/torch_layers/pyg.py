"""PyG's ``RGCNConv``, ``HGTConv`` and ``FiLMConv`` with rgtune's weights copied in.

The parameter mapping is the one documented in :class:`~rgtune.torch_layers.RGCN` and
:class:`~rgtune.torch_layers.HGT`; with it, PyG's layers compute the same numbers as ours (the tests
check it, the benchmarks rely on it). The returned module has the layer's dtype and device.
:func:`to_pyg_rgcn_state` does the same for a state (name -> tensor) of the RGCN program with a
weight decomposition (``num_bases`` or ``num_blocks``, :func:`rgtune.ir.models.rgcn`). FiLM has no
reference layer: :func:`to_pyg_film` maps the state of the IR model :func:`rgtune.ir.models.film`.

Example (needs ``torch_geometric``):
    >>> import torch
    >>> from rgtune.data import HeteroGraph
    >>> from rgtune.torch_layers import RGCN
    >>> g = HeteroGraph({"a": 3}, {("a", "r", "a"): ([0, 1, 2], [1, 2, 0])})
    >>> layer = RGCN(g, 4, 4).double()
    >>> conv = to_pyg_rgcn(layer)
    >>> x = torch.randn(3, 4, dtype=torch.float64)
    >>> torch.allclose(conv(x, torch.stack([g.src, g.dst]), g.etype), layer(x))
    True
"""

from __future__ import annotations

from typing import Mapping

import torch

from rgtune.data.graph import HeteroGraph
from rgtune.torch_layers.hgt import HGT
from rgtune.torch_layers.rgcn import RGCN

__all__ = ["to_pyg_rgcn", "to_pyg_rgcn_state", "to_pyg_hgt", "to_pyg_film"]


def _like(conv: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Module:
    # before the copy: a float32 PyG module would round float64 weights
    p = next(layer.parameters())
    return conv.to(device=p.device, dtype=p.dtype)


def to_pyg_rgcn(layer: RGCN) -> torch.nn.Module:
    """``torch_geometric.nn.RGCNConv(aggr="mean")`` computing ``layer``; call it as ``conv(x, edge_index, edge_type)``."""
    from torch_geometric.nn import RGCNConv

    conv = _like(RGCNConv(layer.in_dim, layer.out_dim, layer.num_rels, aggr="mean"), layer)
    with torch.no_grad():
        conv.weight.copy_(layer.weight)
        conv.root.copy_(layer.root)
        conv.bias.copy_(layer.bias)
    return conv


def to_pyg_rgcn_state(graph: HeteroGraph, state: Mapping[str, torch.Tensor], in_dim: int, out_dim: int,
                      num_bases: int | None = None, num_blocks: int | None = None) -> torch.nn.Module:
    """``torch_geometric.nn.RGCNConv(in_dim, out_dim, R, num_bases=..., num_blocks=..., aggr="mean")`` with the
    params of an rgtune RGCN state (name -> tensor; the program of ``rgtune.ir.models.rgcn`` with the same
    options) copied in: the names and shapes are PyG's (``weight``, ``comp`` with bases, ``root``, ``bias``),
    so the copy is one to one. ``R`` is ``graph.num_rels``; relation ``r`` is ``graph.canonical_etypes[r]``
    (call the module as ``conv(x, edge_index, edge_type)`` with ``edge_type = graph.etype``). The module has
    the dtype and device of ``state["weight"]``."""
    from torch_geometric.nn import RGCNConv

    conv = RGCNConv(in_dim, out_dim, graph.num_rels, num_bases=num_bases, num_blocks=num_blocks, aggr="mean")
    ref = state["weight"]
    conv = conv.to(device=ref.device, dtype=ref.dtype)  # before the copy: float32 would round float64 weights
    own = dict(conv.named_parameters())
    if set(own) != set(state):
        raise KeyError(f"RGCNConv(num_bases={num_bases}, num_blocks={num_blocks}) has params {sorted(own)}, "
                       f"the state has {sorted(state)}")
    with torch.no_grad():
        for name, p in own.items():
            if tuple(p.shape) != tuple(state[name].shape):
                raise ValueError(f"param {name!r}: PyG's shape is {tuple(p.shape)}, "
                                 f"the state's {tuple(state[name].shape)}")
            p.copy_(state[name])
    return conv


def to_pyg_hgt(layer: HGT) -> torch.nn.Module:
    """``torch_geometric.nn.HGTConv`` computing ``layer``; call it as ``conv(x_dict, edge_index_dict)``."""
    from torch_geometric.nn import HGTConv

    g = layer.graph
    conv = _like(HGTConv(layer.in_dim, layer.out_dim, (g.ntypes, g.canonical_etypes), heads=layer.heads), layer)
    R, H = layer.num_rels, layer.heads
    with torch.no_grad():
        for t, nt in enumerate(g.ntypes):
            kqv = conv.kqv_lin.lins[nt]
            kqv.weight.copy_(torch.cat([layer.k_weight[t].T, layer.q_weight[t].T, layer.v_weight[t].T], 0))
            kqv.bias.copy_(torch.cat([layer.k_bias[t], layer.q_bias[t], layer.v_bias[t]]))
            conv.out_lin.lins[nt].weight.copy_(layer.a_weight[t].T)
            conv.out_lin.lins[nt].bias.copy_(layer.a_bias[t])
            conv.skip[nt].copy_(layer.skip[t].view(1))
        for r, cet in enumerate(g.canonical_etypes):
            if conv.edge_types_map[cet] != r:  # PyG numbers relations itself; the copy assumes the same order
                raise RuntimeError(f"PyG numbers relation {cet} as {conv.edge_types_map[cet]}, rgtune as {r}")
            conv.p_rel["__".join(cet)].copy_(layer.mu[r].view(1, H))
            for h in range(H):
                conv.k_rel.weight[h * R + r].copy_(layer.w_att[r, h])  # head-major type index
                conv.v_rel.weight[h * R + r].copy_(layer.w_msg[r, h])
    return conv


def to_pyg_film(graph: HeteroGraph, state: Mapping[str, torch.Tensor], in_dim: int, out_dim: int) -> torch.nn.Module:
    """``torch_geometric.nn.FiLMConv(in_dim, out_dim, graph.num_rels)`` (act ReLU, aggr mean) computing the IR
    model :func:`rgtune.ir.models.film` with the params ``state``; call it as ``conv(x, edge_index, edge_type)``
    with ``edge_index = [graph.src, graph.dst]`` and ``edge_type = graph.etype``.

    PyG's linears hold ``W^T`` (``(out, in)``); ``films[r]`` and ``film_skip`` hold ``[beta | gamma]``
    stacked, in that order (``forward`` splits beta first).
    """
    from torch_geometric.nn import FiLMConv

    ref = state["lins"]
    if graph.num_rels < 1 or tuple(ref.shape) != (graph.num_rels, in_dim, out_dim):
        raise ValueError(f"state['lins'] has shape {tuple(ref.shape)}; a film layer of {in_dim} -> {out_dim} on "
                         f"{graph.name} ({graph.num_rels} relations) has ({graph.num_rels}, {in_dim}, {out_dim})")
    # before the copy: a float32 PyG module would round float64 weights
    conv = FiLMConv(in_dim, out_dim, graph.num_rels).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        for r in range(graph.num_rels):
            conv.lins[r].weight.copy_(state["lins"][r].T)
            conv.films[r].weight.copy_(torch.cat([state["films_beta"][r].T, state["films_gamma"][r].T], 0))
            conv.films[r].bias.copy_(torch.cat([state["films_beta_bias"][r], state["films_gamma_bias"][r]]))
        conv.lin_skip.weight.copy_(state["lin_skip"].T)
        conv.film_skip.weight.copy_(torch.cat([state["film_skip_beta"].T, state["film_skip_gamma"].T], 0))
    return conv
