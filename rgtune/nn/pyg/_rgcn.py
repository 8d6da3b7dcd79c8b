"""PyG's ``RGCNConv`` on generated kernels."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.ir.registry import model_spec
from rgtune.runtime.module import init_param
from rgtune.nn.pyg._edge_type import _EdgeTypeConv

__all__ = ["RGCNConv"]


#: PyG's ``aggr`` of ``RGCNConv`` -> rgtune's RGCN option ``aggr``
_AGGRS = {"mean": "mean", "add": "sum", "sum": "sum"}


class RGCNConv(_EdgeTypeConv):
    r"""PyG's ``RGCNConv``: :math:`x'_i = x_i \Theta_{root} + b + \sum_r \frac{1}{|N_r(i)|}
    \sum_{j \in N_r(i)} x_j \Theta_r`, with ``num_bases`` (:math:`\Theta_r = \sum_b a_{rb} V_b`) or
    ``num_blocks`` (block-diagonal :math:`\Theta_r`), on generated kernels (see the module docstring).

    Args (PyG's):
        in_channels, out_channels: feature sizes; ``in_channels`` a pair ``(src, dst)`` for bipartite calls
            ``conv((x_src, x_dst), ...)``; with featureless input (``x=None`` or node indices) the number of
            nodes (of each side).
        num_relations: edge types ``0 .. num_relations - 1``.
        num_bases, num_blocks: the weight decompositions (at most one).
        aggr: ``"mean"`` (PyG's default) or ``"add"`` (the sum over each relation's in-neighbours).
        root_weight, bias: PyG's (``False`` leaves the term and its parameter out).
        is_sorted: accepted and ignored (edges are grouped by relation when the graph is built).

    Keyword-only (rgtune's):
        backend: ``"auto"`` (the kernels of the device the input is on: ``cuda`` or ``cpu``) or a name.
        db: the trial database the schedule is looked up in (None: the default schedule).
        mode: the schedule looked up: ``"training"`` (a training step's, default) or ``"inference"``.

    Call forms (PyG's): ``x`` ``(N, in)`` features, ``None`` (node ``j`` is row ``j`` of the weight tables),
    a long tensor of node ids (``weight[r, x[j]]``, ``root[x[i]]``), or a pair of those; ``edge_index`` a
    ``(2, E)`` tensor or a transposed sparse adjacency.

    Featureless input runs :func:`rgtune.ir.models.rgcn`'s ``featureless=True``: the kernels gather each
    node's table rows (all bases, or all relations' tables without bases, and its root row) and combine them
    per (source, relation) pair. Without bases the combination reads all ``R`` tables per pair (``R`` times
    the gather PyG does); with bases, ``B + 1`` rows.

    Bipartite calls with one ``in_channels`` read the sources' and destinations' rows as they are. Bipartite
    ``in_channels=(a, b)`` (an interim): the kernels' input is one row per node of width ``in_src + in_dst`` (a
    source's features, zeros for the destination part, and the other way round), with the weights padded by
    zero rows to match (derived in every call, gradients flow to PyG's). It costs ``in_dst`` extra inputs per
    message GEMM row, ``in_src`` per root row, and the root GEMM over the sources' rows (discarded).
    """

    model = "rgcn"
    bipartite_ok = True

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, num_relations: int,
                 num_bases: int | None = None, num_blocks: int | None = None, aggr: str = "mean",
                 root_weight: bool = True, is_sorted: bool = False, bias: bool = True, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        pair = isinstance(in_channels, (tuple, list))
        sides = tuple(in_channels) if pair else (in_channels, in_channels)
        if len(sides) != 2 or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in sides):
            raise ValueError(f"{name}: in_channels={in_channels!r}: a positive int, or a pair of them (sources, "
                             "destinations)")
        if aggr not in _AGGRS:
            raise ValueError(f"{name}: aggr={aggr!r} is not supported; rgtune's RGCN takes the mean (PyG's default, "
                             "aggr='mean') or the sum (aggr='add') over each relation's in-neighbours")
        if isinstance(num_relations, bool) or not isinstance(num_relations, int) or num_relations < 1:
            raise ValueError(f"{name}: num_relations must be a positive int, got {num_relations!r}")
        self.in_channels = tuple(in_channels) if pair else in_channels
        self.out_channels, self.num_relations = out_channels, num_relations
        self.num_bases, self.num_blocks = num_bases, num_blocks
        self.aggr, self.root_weight, self.use_bias = aggr, root_weight, bias
        self._pair_module = pair
        options = {k: v for k, v in (("num_bases", num_bases), ("num_blocks", num_blocks),
                                     ("aggr", None if _AGGRS[aggr] == "mean" else _AGGRS[aggr]),
                                     ("root_weight", None if root_weight else False),
                                     ("bias", None if bias else False)) if v is not None}
        a, b = sides
        blocks = num_blocks or 1
        if pair and num_blocks is not None and a % num_blocks:
            raise ValueError(f"{name}: num_blocks={num_blocks} must divide in_channels[0]={a}")
        self._dst_chunk = -(-b // blocks)  # the destinations' features per block of the padded input
        width = a + blocks * self._dst_chunk if pair else a
        spec = model_spec(self.model)
        try:  # PyG's parameters: the program of the source side's sizes has them (the root: the destinations')
            program = spec.build(a, out_channels, 1, spec.resolve(options))
            spec.build(width, out_channels, 1, spec.resolve(options))
        except ValueError as e:  # a bad decomposition for these sizes, said by the model's builder
            raise ValueError(f"{name}: {e}") from None
        self._setup(width, out_channels, 1, options, backend, db, mode)
        self._own = {}
        for pname, p in program.state_params().items():
            if pname == "root":
                p = dataclasses.replace(p, shape=(b, out_channels))
            elif pname == "bias":
                p = dataclasses.replace(p, shape=(out_channels,))
            self._own[pname] = p
            count = num_relations if p.by == "rel" else None
            self.register_parameter(pname, init_param(p, count, dtype=torch.float32, device=None))
        self.__dict__["_form"] = ("features", False)

    def reset_parameters(self) -> None:
        """Fresh parameters, initialized as PyG initializes them (glorot weights, zero bias)."""
        for pname, p in self._own.items():
            mine = getattr(self, pname)
            count = self.num_relations if p.by == "rel" else None
            with torch.no_grad():
                mine.copy_(init_param(p, count, dtype=mine.dtype, device=mine.device))

    # -- input forms ----------------------------------------------------------------------------------------
    def _sides(self) -> tuple[int, int]:
        return self.in_channels if isinstance(self.in_channels, tuple) else (self.in_channels, self.in_channels)

    def _rows(self, x: Any, side: int, what: str) -> int:
        if x is None:
            return self._sides()[side]
        if isinstance(x, Tensor) and not x.is_floating_point():
            if x.dim() != 1 or x.dtype == torch.bool:
                raise ValueError(f"{type(self).__name__}: {what} as node indices must be a 1-d integer tensor, got "
                                 f"shape {tuple(x.shape)} and dtype {x.dtype}")
            return int(x.size(0))
        if not isinstance(x, Tensor):
            raise ValueError(f"{type(self).__name__}: {what} must be node features, node indices or None, got "
                             f"{type(x).__name__}")
        want = self._sides()[side]
        if x.dim() != 2 or x.size(1) != want:
            raise ValueError(f"{type(self).__name__}: {what} must be (num_nodes, {want}), got {tuple(x.shape)}")
        return int(x.size(0))

    def _node_input(self, x_src: Any, x_dst: Any, pair: bool, num_src: int, num_dst: int
                    ) -> tuple[Tensor, dict[str, Any] | None]:
        name = type(self).__name__
        featureless = [v is None or not v.is_floating_point() for v in ((x_src, x_dst) if pair else (x_src,))]
        if any(featureless) and not all(featureless):
            raise ValueError(f"{name}: x mixes node features and node indices (or None) across the pair; give both "
                             "sides as features, or both as indices / None")
        if featureless[0]:
            return self._featureless_input(x_src, x_dst, pair, num_src, num_dst)
        if not pair and self._pair_module:
            raise ValueError(f"{name}: in_channels={self.in_channels!r} takes x as a pair (x_src, x_dst) of node "
                             "features; give a pair, or build the module with one in_channels")
        self.__dict__["_form"] = ("features", pair and self._pair_module)
        if not pair:
            return x_src, None
        if not self._pair_module:  # one size for both sides: the rows as they are, sources then destinations
            return torch.cat([x_src, x_dst]), None
        rows = torch.cat([x_src.new_zeros(num_src, self._width()).index_copy(1, self._positions(0), x_src),
                          x_dst.new_zeros(num_dst, self._width()).index_copy(1, self._positions(1), x_dst)])
        return rows, None

    def _width(self) -> int:
        return self._sizes[0]

    def _positions(self, side: int) -> Tensor:
        """Where the features of side 0 (sources) or 1 (destinations) sit in a bipartite call's input row: per
        block ``k``, the sources' block, then the destinations' chunk ``k`` (see the class docstring)."""
        a, b = self._sides()
        blocks = self.num_blocks or 1
        sa, cb = a // blocks, self._dst_chunk
        f = torch.arange(a if side == 0 else b)
        if side == 0:
            return (f // sa) * (sa + cb) + f % sa
        return (f // cb) * (sa + cb) + sa + f % cb

    def _featureless_input(self, x_src: Any, x_dst: Any, pair: bool, num_src: int, num_dst: int
                           ) -> tuple[Tensor, dict[str, Any]]:
        if self.num_blocks is not None:
            raise ValueError("Block-diagonal decomposition not supported for non-continuous input features.")
        device = self.weight.device
        a, b = self._sides()
        idx_src = torch.arange(a, device=device) if x_src is None else x_src.to(device).long()
        idx_dst = idx_src if not pair else (torch.arange(b, device=device) if x_dst is None
                                            else x_dst.to(device).long())
        for what, idx, count in (("x[0]" if pair else "x", idx_src, a), ("x[1]" if pair else "x", idx_dst, b)):
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= count):
                raise ValueError(f"{type(self).__name__}: {what} holds node indices outside 0 .. {count - 1} "
                                 f"(in_channels: the number of nodes)")
        tables = self.weight.transpose(0, 1)  # (nodes, K, out): every node's row of each table
        heads = [tables if x_src is None else tables.index_select(0, idx_src)]
        if self.root_weight:
            root = (self.root if (x_dst is None if pair else x_src is None) else
                    self.root.index_select(0, idx_dst)).unsqueeze(1)
            if pair:
                heads[0] = torch.cat([heads[0], heads[0].new_zeros(num_src, 1, self.out_channels)], 1)
                dst = torch.cat([root.new_zeros(num_dst, tables.size(1), self.out_channels), root], 1)
                rows = torch.cat([heads[0], dst])
            else:
                rows = torch.cat([heads[0], root], 1)
        else:
            rows = heads[0]
            if pair:
                rows = torch.cat([rows, rows.new_zeros(num_dst, *rows.shape[1:])])
        options = dict(self.options, featureless=True)
        if self.num_bases is None:
            options["num_relations"] = self.num_relations
        self.__dict__["_form"] = ("featureless", pair)
        return rows.reshape(rows.size(0), -1), options

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's parameters as rgtune's RGCN weights: as they are for one x; zero-padded to the bipartite input
        row (see the class docstring); for featureless input, the tables are the input, ``comp`` (the identity
        without bases) gets a zero column for the root's head, ``root_select`` picks the root's head."""
        form, pair = self.__dict__.get("_form", ("features", False))
        params: dict[str, Tensor] = {}
        bias = self._parameters.get("bias")
        if form == "featureless":
            comp = self.comp if self.num_bases is not None else torch.eye(
                self.num_relations, dtype=self.weight.dtype, device=self.weight.device)
            if self.root_weight:
                comp = torch.cat([comp, comp.new_zeros(comp.size(0), 1)], 1)
                select = torch.zeros(comp.size(1), dtype=comp.dtype, device=comp.device)
                select[-1] = 1
                params["root_select"] = select
            params["comp"] = comp
            if bias is not None:
                params["bias"] = bias.view(1, -1)
            return params
        for pname in self._own:
            params[pname] = getattr(self, pname)
        if bias is not None and not self.root_weight:
            params["bias"] = bias.view(1, -1)
        if pair:
            a, b = self._sides()
            blocks = self.num_blocks or 1
            w = params["weight"]
            if self.num_blocks is not None:  # (R, B, a/B, out/B): zero rows for the destinations' chunk
                params["weight"] = torch.cat([w, w.new_zeros(*w.shape[:2], self._dst_chunk, w.size(3))], 2)
            else:
                params["weight"] = w.new_zeros(w.size(0), self._width(), w.size(2)).index_copy(
                    1, self._positions(0).to(w.device), w)
            if self.root_weight:
                root = params["root"]
                params["root"] = root.new_zeros(self._width(), root.size(1)).index_copy(
                    0, self._positions(1).to(root.device), root)
            del blocks
        return params

    def __repr__(self) -> str:  # PyG's
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, num_relations={self.num_relations})"
