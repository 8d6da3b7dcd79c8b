"""Runs an inter-operator :class:`Program` op by op with torch: what the IR means, in any float dtype.

Each op is executed as its definition says (a typed linear as one matmul per type, a gather by
index, an edge softmax per destination or destination pair, ...), on the graph's arrays in the program's layout, so a
program after any passes gives the same numbers as before them. It is the oracle of the adjoint
(:mod:`rgtune.ir.autodiff`): a training program's gradients against torch's autograd of the forward.
It is written for clarity, not speed (the generated kernels are the fast path).

Values are tensors ``(rows, heads, dim)``; params are full tensors, one slice per type (as the layers'
``state_dict`` holds them). Derived params (:class:`FoldWeights`) are computed with torch as the
backends do, so autograd flows from them to their sources.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> prog = build_model("rgcn", 4, 5)
    >>> params = random_params(prog, g, seed=0)
    >>> Interpreter(prog, g).run(torch.randn(30, 4, dtype=torch.float64), params).output.shape
    torch.Size([30, 5])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import CSR_DST, GraphArrays, graph_arrays, row_types
from rgtune.ir.folds import fold
from rgtune.ir.op_rules import rules_of
from rgtune.ir.program import (DST_PAIR, EDGE, PARAM_OPS, SRC_PAIR, FoldWeights, IRError, Param, Program, Value,
                               WeightGrad)

__all__ = ["Interpreter", "Run", "RunContext", "random_params", "param_full_shape"]


def param_full_shape(p: Param, arrays: GraphArrays) -> tuple[int, ...]:
    """A param's full tensor shape: one slice per node type or relation (or the slice itself)."""
    count = {"ntype": arrays.num_ntypes, "rel": arrays.num_rels}.get(p.by)
    return (count, *p.shape) if count is not None else p.shape


def random_params(program: Program, graph: HeteroGraph, dtype: torch.dtype = torch.float64,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for the learnable params of ``program`` (scaled by the fan-in), for tests."""
    arrays = graph_arrays(graph, CSR_DST, 64)  # for the counts of types only (the layout the Interpreter reads first)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in program.state_params().items():
        fan_in = p.shape[-2] if len(p.shape) >= 2 else 1
        out[name] = (torch.randn(param_full_shape(p, arrays), generator=gen, dtype=torch.float64) / fan_in ** 0.5).to(dtype)
    return out


@dataclass
class Run:
    """What a run computed: every value, every param (given, derived and gradient), the output."""

    values: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    output: torch.Tensor  # (num_nodes, out_features)
    input_grad: torch.Tensor | None = None  # (num_nodes, in_features), a training program's
    param_grads: dict[str, torch.Tensor] = field(default_factory=dict)  # param -> its gradient


class Interpreter:
    """Runs ``program`` on ``graph``: ``run(x, params, dout=None)`` (see the module docstring). Per-edge
    values are in the order of ``layout`` (a :class:`~rgtune.ir.plan.LoweringPlan`'s), as the kernels of
    that layout store them; node values, and so the results, do not depend on it. Each op computes as its
    rules say (:meth:`OpRules.interpret <rgtune.ir.op_rules.OpRules.interpret>`)."""

    def __init__(self, program: Program, graph: HeteroGraph, layout: str = CSR_DST) -> None:
        self.p = program
        self.a = graph_arrays(graph, layout, 64)
        self._edge_to_pair = {SRC_PAIR: self.a.e_sp.long(), DST_PAIR: self.a.e_dp.long()}

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor | None = None,
            round_to: torch.dtype | None = None) -> Run:
        """``x`` ``(num_nodes, in_features)``; ``dout`` ``(num_nodes, out_features)``: the output's gradient,
        which a training program reads. ``round_to``: the input, the params and every op's result are rounded
        to this dtype (and back to ``x``'s): the program as if each value were stored in it (a GEMM's operands
        included), what a 16-bit program's tolerance is derived from (:mod:`rgtune.tuner.verification`); under
        autograd the gradients are rounded too."""
        p, a = self.p, self.a
        if round_to is not None:
            x = x.to(round_to).to(x.dtype)
            params = {k: v.to(round_to).to(v.dtype) for k, v in params.items()}
        values = {p.x.name: x.reshape(a.num_nodes, p.x.heads, p.x.dim)}
        if p.inputs:
            if dout is None:
                raise IRError(f"program {p.name} is a training program: it needs dout, the output's gradient")
            (grad_in,) = p.inputs
            values[grad_in.name] = dout.reshape(a.num_nodes, grad_in.heads, grad_in.dim)
        ctx = RunContext(self, values, dict(params))
        for op in p.ops:
            out = rules_of(op).interpret(op, ctx)
            if round_to is not None and not isinstance(op, PARAM_OPS):
                out = out.to(round_to).to(out.dtype)
            if isinstance(op, PARAM_OPS):
                ctx.params[op.out_param] = out
            else:
                values[op.out.name] = out
        out = values[p.output.name].reshape(a.num_nodes, -1)
        dx = values[p.input_grad.name].reshape(a.num_nodes, -1) if p.input_grad is not None else None
        return Run(values, ctx.params, out, dx, {k: ctx.params[g] for k, g in p.param_grads.items()})


@dataclass
class RunContext:
    """What an op's rule reads while the interpreter runs: the values and params so far, the graph's
    arrays, and the row bookkeeping of types, pairs and groups."""

    interpreter: Interpreter
    values: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]

    @property
    def arrays(self) -> GraphArrays:
        return self.interpreter.a

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.values.values())).dtype

    def value(self, v: Value) -> torch.Tensor:
        return self.values[v.name]

    def param(self, name: str) -> torch.Tensor:
        return self.params[name]

    def row_types(self, rows: str, by: str, end: str | None) -> torch.Tensor | None:
        """The weight slice of every row (:func:`rgtune.ir.bind.row_types`)."""
        return row_types(self.arrays, rows, by, end)

    def edge_to_pair(self, domain: str) -> torch.Tensor:
        """Every edge's row in ``domain`` (``src_pair`` or ``dst_pair``)."""
        return self.interpreter._edge_to_pair[domain]

    def group(self, rows: str, end: str) -> tuple[torch.Tensor, int]:
        """For each row of ``rows``, the node an aggregation on ``end`` sums it into, and the node count."""
        a = self.arrays
        if rows == EDGE:
            return (a.e_src if end == "src" else a.e_dst).long(), a.num_nodes
        if rows == SRC_PAIR:
            return a.sp_node.long(), a.num_nodes
        if rows == DST_PAIR:
            return a.dp_node.long(), a.num_nodes
        raise IRError(f"nothing to aggregate a {rows} value into")

    def fold(self, op: FoldWeights) -> torch.Tensor:
        """A derived weight, folded with torch as the backends fold it."""
        a = self.arrays
        end_ntype = None
        if op.mode in ("compose", "compose_bias"):
            end_ntype = (a.rel_src_ntype if op.end == "src" else a.rel_dst_ntype).long()
        return fold(op.mode, self.params[op.a], self.params[op.b] if op.b else None, end_ntype,
                    self.interpreter.p.params[op.out_param].shape)

    def weight_grad(self, op: WeightGrad) -> torch.Tensor:
        """One contribution to a param's gradient: per type, the rows' ``x^T dy`` (or ``dy`` summed)."""
        dy = self.values[op.dy.name]
        shape = param_full_shape(self.interpreter.p.params[op.param], self.arrays)
        types = self.row_types(op.dy.domain, op.by, op.end)
        count = shape[0] if types is not None else 1
        out = dy.new_zeros(count, *(shape[1:] if types is not None else shape))
        segments = [(0, slice(0, dy.shape[0]))] if types is None else \
            [(int(t), (types == t).nonzero().flatten()) for t in torch.unique(types)]
        for t, rows in segments:
            d = dy[rows]
            if op.x is None:  # a bias, an attention vector, a gate: the rows of dy summed per type
                g = d.sum(0)
            elif op.per_head:  # x (n, H, I), dy (n, H, O) -> (H, I, O)
                g = torch.einsum("nhi,nho->hio", self.values[op.x.name][rows], d)
            else:  # (H*I, heads*O)
                xr = self.values[op.x.name][rows]
                g = xr.reshape(xr.shape[0], -1).T @ d.reshape(d.shape[0], -1)
            out[t] = g.reshape(out.shape[1:])
        return out.reshape(shape)
