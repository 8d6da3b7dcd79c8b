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
    Args (PyG's): in_channels (an int), out_channels, num_relations; ``nn``, ``act`` and ``aggr`` at PyG's
    defaults (``None``, ReLU, ``"mean"``). Keyword-only (rgtune's): backend, db, mode. Call:
    ``conv(x, edge_index, edge_type)``, as :class:`RGCNConv`.
    """

    model = "film"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int = 1, nn: Any = None,
                 act: Any = "relu", aggr: str = "mean", *, backend: str = "auto", db: Any = "results.db",
                 mode: str = "training", **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: rgtune's FiLMConv takes node features of one "
                             "size (an int); the bipartite (tuple) form is not supported")
        relu = act == "relu" or isinstance(act, torch.nn.ReLU)
        for what, ok, want in (("nn", nn is None, "None (linear FiLM weights)"), ("act", relu, "ReLU"),
                               ("aggr", aggr == "mean", "'mean'")):
            if not ok:
                raise ValueError(f"{name}: {what}={locals()[what]!r} is not supported; rgtune's FiLM computes PyG's "
                                 f"default, {what}={want}")
        if kwargs:
            raise ValueError(f"{name}: arguments {sorted(kwargs)} are not supported")
        from torch_geometric.nn import FiLMConv as PyGFiLMConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGFiLMConv(in_channels, out_channels, num_relations)
        for child in ("lins", "films", "lin_skip", "film_skip"):
            self.add_module(child, getattr(pyg, child))
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self._setup(in_channels, out_channels, 1, {}, backend, db, mode)

    def reset_parameters(self) -> None:
        for module in (*self.lins, *self.films, self.lin_skip, self.film_skip):
            module.reset_parameters()

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's FiLM weights from PyG's linears (``W^T``; ``films[r]`` and ``film_skip`` hold ``[beta | gamma]``,
        beta first), relation ``r`` PyG's ``lins[r]``."""
        out = self.out_channels
        films_w = torch.stack([f.weight for f in self.films])  # (R, 2 out, in)
        films_b = torch.stack([f.bias for f in self.films])  # (R, 2 out)
        skip = self.film_skip.weight  # (2 out, in)
        return {"lins": torch.stack([lin.weight for lin in self.lins]).transpose(1, 2),
                "films_beta": films_w[:, :out].transpose(1, 2), "films_gamma": films_w[:, out:].transpose(1, 2),
                "films_beta_bias": films_b[:, :out], "films_gamma_bias": films_b[:, out:],
                "lin_skip": self.lin_skip.weight.T, "film_skip_beta": skip[:out].T, "film_skip_gamma": skip[out:].T}

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}"
