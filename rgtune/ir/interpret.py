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
import torch.nn.functional as F

from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import GraphArrays, graph_arrays, row_types
from rgtune.ir.folds import fold
from rgtune.ir.program import (DST_PAIR, EDGE, NODE, SRC_PAIR, Aggregate, Binary, Broadcast, Concat, EdgeSoftmax,
                               Expand, FoldWeights, Gather, GatedResidual, GatherPair, GraphConst, Inner, IRError, Op,
                               Param, ParamRead, Program, ReduceSum, Scale, TypedLinear, Unary, View, WeightGrad)

__all__ = ["Interpreter", "Run", "random_params", "param_full_shape", "unary"]


def param_full_shape(p: Param, arrays: GraphArrays) -> tuple[int, ...]:
    """A param's full tensor shape: one slice per node type or relation (or the slice itself)."""
    count = {"ntype": arrays.num_ntypes, "rel": arrays.num_rels}.get(p.by)
    return (count, *p.shape) if count is not None else p.shape


def random_params(program: Program, graph: HeteroGraph, dtype: torch.dtype = torch.float64,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for the learnable params of ``program`` (scaled by the fan-in), for tests."""
    arrays = graph_arrays(graph, program.annotations.get("layout", "csr_dst"))
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
    """Runs ``program`` on ``graph``: ``run(x, params, dout=None)`` (see the module docstring)."""

    def __init__(self, program: Program, graph: HeteroGraph) -> None:
        self.p = program
        self.a = graph_arrays(graph, program.annotations.get("layout", "csr_dst"), 64)
        self._edge_to_pair = {SRC_PAIR: self.a.e_sp.long(), DST_PAIR: self.a.e_dp.long()}

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor | None = None) -> Run:
        """``x`` ``(num_nodes, in_features)``; ``dout`` ``(num_nodes, out_features)``: the output's gradient,
        which a training program reads."""
        p, a = self.p, self.a
        values = {p.x.name: x.reshape(a.num_nodes, p.x.heads, p.x.dim)}
        if p.inputs:
            if dout is None:
                raise IRError(f"program {p.name} is a training program: it needs dout, the output's gradient")
            (grad_in,) = p.inputs
            values[grad_in.name] = dout.reshape(a.num_nodes, grad_in.heads, grad_in.dim)
        prm = dict(params)
        for op in p.ops:
            if isinstance(op, FoldWeights):
                prm[op.out_param] = self._fold(op, prm)
            elif isinstance(op, WeightGrad):
                g = self._weight_grad(op, values, prm)
                prm[op.out_param] = prm[op.out_param] + g if op.accumulate else g
            else:
                values[op.out.name] = self._op(op, values, prm)
        out = values[p.output.name].reshape(a.num_nodes, -1)
        dx = values[p.input_grad.name].reshape(a.num_nodes, -1) if p.input_grad is not None else None
        return Run(values, prm, out, dx, {k: prm[g] for k, g in p.param_grads.items()})

    # ---------------------------------------------------------------- ops
    def _op(self, op: Op, v: dict[str, torch.Tensor], prm: dict[str, torch.Tensor]) -> torch.Tensor:
        a = self.a
        if isinstance(op, Gather):
            return v[op.x.name][(a.e_src if op.end == "src" else a.e_dst).long()]
        if isinstance(op, GatherPair):
            return v[op.x.name][(a.sp_node if op.side == "src" else a.dp_node).long()]
        if isinstance(op, Expand):
            return v[op.x.name][self._edge_to_pair[op.x.domain]]
        if isinstance(op, TypedLinear):
            return self._typed_linear(op, v[op.x.name], prm)
        if isinstance(op, ParamRead):
            return self._param_rows(op, prm)
        if isinstance(op, GraphConst):
            return a.graph_constant(op.kind, self._dtype(v)).reshape(-1, 1, 1)
        if isinstance(op, Inner):
            return (v[op.a.name] * v[op.b.name]).sum(-1, keepdim=True)
        if isinstance(op, Binary):
            x, y = v[op.a.name], v[op.b.name]
            return {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[op.op](x, y)
        if isinstance(op, Unary):
            return unary(op.op, v[op.x.name], op.alpha)
        if isinstance(op, Scale):
            return v[op.x.name] * op.scale
        if isinstance(op, ReduceSum):
            return v[op.x.name].sum(1 if op.over == "heads" else 2, keepdim=True)
        if isinstance(op, Broadcast):
            x = v[op.x.name]
            return x.expand(x.shape[0], op.out.heads, op.out.dim)
        if isinstance(op, View):
            return v[op.x.name].reshape(-1, op.out.heads, op.out.dim)
        if isinstance(op, EdgeSoftmax):
            return self._edge_softmax(v[op.x.name], op.group)
        if isinstance(op, Aggregate):
            return self._aggregate(op, v[op.x.name])
        if isinstance(op, Concat):
            return torch.cat([v[op.a.name], v[op.b.name]], dim=-1)
        if isinstance(op, GatedResidual):
            gate = torch.sigmoid(prm[op.skip][a.node_type.long()]).reshape(-1, 1, 1)
            h, x = v[op.h.name], v[op.x.name]
            return gate * h + (1 - gate) * x.reshape(h.shape)
        raise IRError(f"the interpreter does not know {type(op).__name__}")

    @staticmethod
    def _dtype(v: Mapping[str, torch.Tensor]) -> torch.dtype:
        return next(iter(v.values())).dtype

    def _types(self, rows: str, by: str, end: str | None) -> torch.Tensor | None:
        return row_types(self.a, rows, by, end)

    def _segments(self, types: torch.Tensor | None, n: int) -> list[tuple[int, torch.Tensor | slice]]:
        """The rows of each type: ``(type, rows)`` (one segment of every row when there are no types)."""
        if types is None:
            return [(0, slice(0, n))]
        return [(int(t), (types == t).nonzero().flatten()) for t in torch.unique(types)]

    def _typed_linear(self, op: TypedLinear, x: torch.Tensor, prm: Mapping[str, torch.Tensor]) -> torch.Tensor:
        w, b = prm[op.weight], prm[op.bias] if op.bias else None
        types = self._types(op.x.domain, op.by, op.end)
        n, width = x.shape[0], op.out.heads * op.out.dim

        def linear(xt: torch.Tensor, t: int) -> torch.Tensor:
            wt = w[t] if types is not None else w
            if op.per_head:  # x (n, H, I) with wt (H, I, O)
                yt = torch.einsum("nhi,hio->nho", xt, wt).reshape(-1, width)
            else:  # x (n, H*I) with wt (H*I, heads*O)
                yt = xt.reshape(-1, wt.shape[0]) @ wt
            return yt + (b[t] if types is not None else b) if b is not None else yt

        if types is None:
            return linear(x, 0).reshape(n, op.out.heads, op.out.dim)
        # rows sorted by type, one slice per type, put back in order: one gather and one scatter, so that
        # autograd's backward is linear in the rows too (an in-place write per type costs a full-size
        # gradient per type, which dominates on a graph with a hundred relations)
        order = torch.argsort(types, stable=True)
        counts = torch.bincount(types, minlength=w.shape[0]).tolist()
        parts = [linear(xt, t) for t, xt in enumerate(x[order].split(counts)) if counts[t]]
        y = torch.cat(parts) if parts else x.new_zeros(0, width)
        return y[torch.argsort(order)].reshape(n, op.out.heads, op.out.dim)

    def _param_rows(self, op: ParamRead, prm: Mapping[str, torch.Tensor]) -> torch.Tensor:
        types = self._types(op.domain, op.by, op.end)
        p = prm[op.param]
        rows = p[types] if types is not None else p.expand(self.a.rows(op.domain), *p.shape)
        return rows.reshape(rows.shape[0], op.out.heads, op.out.dim)

    def _edge_softmax(self, s: torch.Tensor, group: str) -> torch.Tensor:
        """Softmax of ``s`` over each group of edges: a destination's (``dst``), or a destination pair's
        (``dst_rel``: the in-edges of one relation)."""
        if group == "dst":
            index, n = self.a.e_dst.long(), self.a.num_nodes
        else:
            index, n = self._edge_to_pair[DST_PAIR], self.a.rows(DST_PAIR)
        idx = index.reshape(-1, 1, 1).expand_as(s)
        top = torch.full((n, *s.shape[1:]), float("-inf"), dtype=s.dtype).scatter_reduce(0, idx, s, "amax")
        e = torch.exp(s - top[index])
        total = torch.zeros((n, *s.shape[1:]), dtype=s.dtype).index_add(0, index, e)
        return e / total[index]

    def _group(self, rows: str, end: str) -> tuple[torch.Tensor, int]:
        """For each row of ``rows``, the row of what an aggregation on ``end`` sums it into."""
        a = self.a
        if rows == EDGE:
            return (a.e_src if end == "src" else a.e_dst).long(), a.num_nodes
        if rows == SRC_PAIR:
            return a.sp_node.long(), a.num_nodes
        if rows == DST_PAIR:
            return a.dp_node.long(), a.num_nodes
        raise IRError(f"nothing to aggregate a {rows} value into")

    def _aggregate(self, op: Aggregate, x: torch.Tensor) -> torch.Tensor:
        a = self.a
        if op.x.domain == EDGE and op.to in (SRC_PAIR, DST_PAIR):
            index, n = self._edge_to_pair[op.to], a.rows(op.to)
        elif op.to == NODE:
            index, n = self._group(op.x.domain, op.side)
        else:
            raise IRError(f"{op}: cannot aggregate {op.x.domain} rows into {op.to}")
        out = torch.zeros((n, *x.shape[1:]), dtype=x.dtype).index_add(0, index, x)
        if op.reduce == "mean":
            count = torch.zeros(n, dtype=x.dtype).index_add(0, index, torch.ones_like(index, dtype=x.dtype))
            out = out / count.clamp(min=1).reshape(-1, 1, 1)
        return out

    def _fold(self, op: FoldWeights, prm: Mapping[str, torch.Tensor]) -> torch.Tensor:
        a = self.a
        end_ntype = None
        if op.mode in ("compose", "compose_bias"):
            end_ntype = (a.rel_src_ntype if op.end == "src" else a.rel_dst_ntype).long()
        return fold(op.mode, prm[op.a], prm[op.b] if op.b else None, end_ntype, self.p.params[op.out_param].shape)

    def _weight_grad(self, op: WeightGrad, v: Mapping[str, torch.Tensor], prm: Mapping[str, torch.Tensor]) -> torch.Tensor:
        dy = v[op.dy.name]
        shape = param_full_shape(self.p.params[op.param], self.a)
        types = self._types(op.dy.domain, op.by, op.end)
        n = dy.shape[0]
        count = shape[0] if types is not None else 1
        out = dy.new_zeros(count, *(shape[1:] if types is not None else shape))
        for t, rows in self._segments(types, n):
            d = dy[rows]
            if op.x is None:  # a bias, an attention vector, a gate: the rows of dy summed per type
                g = d.sum(0)
            elif op.per_head:  # x (n, H, I), dy (n, H, O) -> (H, I, O)
                g = torch.einsum("nhi,nho->hio", v[op.x.name][rows], d)
            else:  # (H*I, heads*O)
                xr = v[op.x.name][rows]
                g = xr.reshape(xr.shape[0], -1).T @ d.reshape(d.shape[0], -1)
            out[t] = g.reshape(out.shape[1:])
        return out.reshape(shape)


def unary(op: str, x: torch.Tensor, alpha: float = 0.0) -> torch.Tensor:
    """The elementwise op ``op`` of the IR (and of the kernel IR's expressions) on ``x``."""
    if op == "leaky_relu":
        return F.leaky_relu(x, alpha)
    if op == "gelu":
        return F.gelu(x)
    if op == "exp":
        return torch.exp(x)
    if op == "sigmoid":
        return torch.sigmoid(x)
    if op == "relu":
        return torch.relu(x)
    if op == "neg":
        return -x
    if op == "leaky_relu_grad":
        return torch.where(x > 0, torch.ones_like(x), torch.full_like(x, alpha))
    if op == "relu_grad":
        return (x > 0).to(x.dtype)
    if op == "sigmoid_grad":
        s = torch.sigmoid(x)
        return s * (1 - s)
    if op == "gelu_grad":  # d/dx x Phi(x) = Phi(x) + x phi(x), with erf's Phi
        cdf = 0.5 * (1 + torch.erf(x / 2 ** 0.5))
        pdf = torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5
        return cdf + x * pdf
    raise IRError(f"unknown unary op {op!r}")
