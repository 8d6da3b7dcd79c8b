"""PyG's ``FiLMConv`` on generated kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.nn.pyg._edge_type import _EdgeTypeConv

__all__ = ["FiLMConv"]


class FiLMConv(_EdgeTypeConv):
    r"""PyG's ``FiLMConv`` (GNN-FiLM): :math:`x'_i = \sigma(\gamma_i \odot W_{skip} x_i + \beta_i) +
    \sum_r \frac{1}{|N_r(i)|} \sum_{j \in N_r(i)} \sigma(\gamma_{r,i} \odot W_r x_j + \beta_{r,i})` with
    ``[beta | gamma]`` of the destination from ``films[r]`` (``film_skip``), on generated kernels.

    Its parameters are PyG's own modules (``lins``, ``films``, ``lin_skip``, ``film_skip``, made by PyG's
    constructor); rgtune's FiLM weights (:func:`rgtune.ir.models.film`) are derived from them in every call.
    Args (PyG's): in_channels (an int, or a pair ``(src, dst)`` for ``conv((x_src, x_dst), ...)``), out_channels,
    num_relations; ``nn``, ``act`` and ``aggr`` at PyG's
    defaults (``None``, ReLU, ``"mean"``). Keyword-only (rgtune's): backend, db, mode. Call:
    ``conv(x, edge_index, edge_type)``, as :class:`RGCNConv` (``edge_index`` also a transposed sparse adjacency).

    Bipartite calls with one ``in_channels`` read the rows as they are. Bipartite ``in_channels=(a, b)``
    (an interim): the kernels' input is one row per node of width ``in_src + in_dst`` (a
    source's features then zeros, a destination's zeros then its features) and the weights are padded with
    zero rows to match (derived in every call; gradients flow to PyG's). It costs ``in_dst`` extra inputs per
    message GEMM row, ``in_src`` per skip/FiLM row, and the skip over the sources' rows (discarded).
    """

    bipartite_ok = True

    model = "film"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int = 1, nn: Any = None,
                 act: Any = "relu", aggr: str = "mean", *, backend: str = "auto", db: Any = "results.db",
                 mode: str = "training", **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        pair = isinstance(in_channels, (tuple, list))
        sides = tuple(in_channels) if pair else (in_channels, in_channels)
        if len(sides) != 2 or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in sides):
            raise ValueError(f"{name}: in_channels={in_channels!r}: a positive int, or a pair of them (sources, "
                             "destinations)")
        relu = act == "relu" or isinstance(act, torch.nn.ReLU)
        for what, ok, want in (("nn", nn is None, "None (linear FiLM weights)"), ("act", relu, "ReLU"),
                               ("aggr", aggr == "mean", "'mean'")):
            if not ok:
                raise ValueError(f"{name}: {what}={locals()[what]!r} is not supported; rgtune's FiLM computes PyG's "
                                 f"default, {what}={want}")
        if kwargs:
            raise ValueError(f"{name}: arguments {sorted(kwargs)} are not supported")
        from torch_geometric.nn import FiLMConv as PyGFiLMConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGFiLMConv(sides if pair else in_channels, out_channels, num_relations)
        for child in ("lins", "films", "lin_skip", "film_skip"):
            self.add_module(child, getattr(pyg, child))
        self.in_channels = sides if pair else in_channels
        self.out_channels, self.num_relations = out_channels, num_relations
        self._pair_module = pair
        self._setup(sum(sides) if pair else in_channels, out_channels, 1, {}, backend, db, mode)
        self.__dict__["_pair_call"] = False

    def reset_parameters(self) -> None:
        for module in (*self.lins, *self.films, self.lin_skip, self.film_skip):
            module.reset_parameters()

    def _node_input(self, x_src: Any, x_dst: Any, pair: bool, num_src: int, num_dst: int
                    ) -> tuple[Tensor, dict[str, Any] | None]:
        """One x as it is; a pair as one row per node of width ``in_src + in_dst`` (a source's features then
        zeros, a destination's zeros then its features), the weights padded to match (an interim: see the class
        docstring)."""
        if not pair and self._pair_module:
            raise ValueError(f"{type(self).__name__}: in_channels={self.in_channels!r} takes x as a pair (x_src, "
                             "x_dst); give a pair, or build the module with one in_channels")
        self.__dict__["_pair_call"] = pair and self._pair_module
        if not pair:
            return x_src, None
        if not self._pair_module:  # one size for both sides: the rows as they are, sources then destinations
            return torch.cat([x_src, x_dst]), None
        a, b = self.in_channels
        return torch.cat([torch.cat([x_src, x_src.new_zeros(num_src, b)], 1),
                          torch.cat([x_dst.new_zeros(num_dst, a), x_dst], 1)]), None

    def _rows(self, x: Any, side: int, what: str) -> int:
        want = self.in_channels[side] if isinstance(self.in_channels, tuple) else self.in_channels
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 2 or x.size(1) != want:
            got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__}: {what} must be a (num_nodes, {want}) tensor of node features, "
                             f"got {got}")
        return int(x.size(0))

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's FiLM weights from PyG's linears (``W^T``; ``films[r]`` and ``film_skip`` hold ``[beta | gamma]``,
        beta first), relation ``r`` PyG's ``lins[r]``; for a pair, zero rows where the other side's features are."""
        out = self.out_channels
        films_w = torch.stack([f.weight for f in self.films])  # (R, 2 out, in)
        films_b = torch.stack([f.bias for f in self.films])  # (R, 2 out)
        skip = self.film_skip.weight  # (2 out, in)
        params = {"lins": torch.stack([lin.weight for lin in self.lins]).transpose(1, 2),
                  "films_beta": films_w[:, :out].transpose(1, 2), "films_gamma": films_w[:, out:].transpose(1, 2),
                  "films_beta_bias": films_b[:, :out], "films_gamma_bias": films_b[:, out:],
                  "lin_skip": self.lin_skip.weight.T, "film_skip_beta": skip[:out].T, "film_skip_gamma": skip[out:].T}
        if self.__dict__.get("_pair_call"):
            a, b = self.in_channels
            for pname, w in params.items():
                if pname.endswith("_bias"):
                    continue
                pad = w.new_zeros(*w.shape[:-2], b if pname == "lins" else a, w.size(-1))
                params[pname] = torch.cat([w, pad] if pname == "lins" else [pad, w], -2)
        return params

    def __repr__(self) -> str:  # PyG's
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, num_relations={self.num_relations})"
