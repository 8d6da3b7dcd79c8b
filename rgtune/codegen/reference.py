"""Executes a :class:`KernelProgram` with torch ops: the oracle and the unoptimized baseline.

Each kernel template is executed as what it means, row-vectorized: a GEMM as one matmul per
type segment, a traversal as gathers, an edge softmax per destination (or pair) and ``index_add``
into destinations, a map as an elementwise expression. It honours every IR decision that
changes *what* is computed (layout order of edge buffers, pair rows, edge -> pair lookup by
index or by binary search, epilogues, accumulating stores, derived weights) and runs in
any float dtype, float64 included; all ops are out-of-place, so autograd flows through it.
Every buffer takes the dtype of the input ``x``, never torch's default dtype. Each run keeps
its buffers in its own shallow copy of the executor, so one executor can run in several threads
at once (a tuned layer's backward) and holds no buffer after a run.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> kp = compile_program(build_model("rgcn", 4, 5), {"compact.src": "pair"}).kernels
    >>> params = init_params(kp, g, dtype=torch.float64, seed=0)
    >>> ReferenceExecutor(kp, g).run(torch.randn(30, 4, dtype=torch.float64), params).shape
    torch.Size([30, 5])
"""

from __future__ import annotations

import copy
import math
from typing import Mapping, Sequence

import torch

from rgtune.codegen.base import Saved
from rgtune.data.graph import HeteroGraph
from rgtune.codegen.weights import fold_weights
from rgtune.ir.bind import GraphArrays, concrete_device, graph_arrays, row_types
from rgtune.ir.op_rules import unary
from rgtune.ir.program import EDGE_WEIGHT
from rgtune.ir.kernels import (NODE_ROWS, Acc, AggregateStage, AggregateStores, BinaryE, BroadcastE, ConcatE,
                               EdgeSoftmaxStage, EdgeStore, EdgeStores, Expr, GatedE, GemmKernel, GraphLoad, InnerE,
                               Kernel, KernelProgram, Load, MapKernel, ParamLoad, ReduceE, ScaleE, ScatterKernel, SliceE,
                               SoftmaxAggregate, Stage, TraversalKernel, UnaryE, WeightGradKernel, WeightKernel)


def param_full_shape(kp: KernelProgram, name: str, arrays: GraphArrays) -> tuple[int, ...]:
    """The full shape of a param: one slice per node type / relation, or the slice itself."""
    by = kp.param_by[name]
    count = {"ntype": arrays.num_ntypes, "rel": arrays.num_rels}.get(by)
    return (count,) + kp.param_shapes[name] if count is not None else kp.param_shapes[name]


def init_params(kp: KernelProgram, graph: HeteroGraph, dtype: torch.dtype = torch.float32,
                seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for the learnable params of ``kp`` (for tests and benchmarks)."""
    arrays = graph_arrays(graph, kp.layout, kp.index_bits)
    gen = torch.Generator().manual_seed(seed)
    derived = {k.out for k in kp.kernels if isinstance(k, WeightKernel)} | set(kp.param_grads.values())
    out = {}
    for name in kp.param_shapes:
        if name in derived:
            continue
        shape = param_full_shape(kp, name, arrays)
        fan_in = kp.param_shapes[name][-2] if len(kp.param_shapes[name]) >= 2 else 1
        out[name] = (torch.randn(shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5).to(dtype)
    return out


class ReferenceExecutor:
    """Runs ``kp`` on ``graph``: ``run(x, params) -> output (rows, out_features)``: every node's, or a
    destinations program's (:attr:`~rgtune.ir.plan.LoweringPlan.destinations`) the destinations'."""

    def __init__(self, kp: KernelProgram, graph: HeteroGraph, device: torch.device | str = "cpu") -> None:
        self.kp = kp
        self.graph = graph
        self.a = graph_arrays(graph, kp.layout, kp.index_bits).to(device)
        self._pair_index = self._edge_to_pair_maps()

    @property
    def device(self) -> torch.device:
        """Where the graph's arrays live: inputs and params must be there too."""
        return self.a.node_type.device

    def to(self, device: torch.device | str) -> "ReferenceExecutor":
        """This executor with its graph arrays on ``device`` (``self`` when already there)."""
        return self if self.device == concrete_device(device) else ReferenceExecutor(self.kp, self.graph, device)

    def _edge_to_pair_maps(self) -> dict[str, torch.Tensor]:
        a = self.a
        if self.kp.pair_index == "direct":
            return {"src_pair": a.e_sp.long(), "dst_pair": a.e_dp.long()}
        # binary search of (rel, node) among the pairs, which are sorted by relation then node
        n = max(a.num_nodes, 1)
        found = {}
        for via, node, pnode, prel, end in (("src_pair", a.e_src, a.sp_node, a.sp_rel, "src"),
                                            ("dst_pair", a.e_dst, a.dp_node, a.dp_rel, "dst")):
            keys = prel.long() * n + pnode.long()
            found[via] = torch.searchsorted(keys, a.e_rel.long() * n + node.long())
        return found

    # ---------------------------------------------------------------- running
    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The output ``(rows, out_features)`` (the class docstring), in the dtype of ``x``."""
        kp, a = self.kp, self.a
        if x.shape != (a.num_nodes, kp.buffers[kp.input].width):
            raise ValueError(f"input must be ({a.num_nodes}, {kp.buffers[kp.input].width}), got {tuple(x.shape)}")
        # this run's buffers live in a shallow copy: concurrent runs never see each other's
        return copy.copy(self)._run(x, params)

    def run_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                     dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """A training program's ``(output, input gradient, {param: gradient})`` for the output's gradient ``dout``.
        A derived param's gradient is among them (its sources get theirs through the fold: see
        :mod:`rgtune.ir.autodiff`). The two phases one after the other (:meth:`run_forward`)."""
        out, saved = self.run_forward(x, params)
        dx, grads = self.run_backward(x, params, saved, dout)
        return out, dx, grads

    def run_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Saved]:
        """A training program's forward phase: the output, and the buffers and derived params its
        backward reads (:attr:`KernelProgram.saved`)."""
        kp = self._training()
        run = copy.copy(self)
        run._start(x, params, None, {})
        out = run._kernels(kp.kernels[:kp.forward_kernels])
        return out, Saved({b: run.bufs[b] for b in kp.saved}, {p: run.params[p] for p in kp.saved_params})

    def run_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved,
                     dout: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """A training program's backward phase: the input's gradient (None: the program computes the params'
        only) and ``{param: gradient}``."""
        kp, a = self._training(), self.a
        run = copy.copy(self)
        run._start(x, {**params, **saved.params}, dout, saved.buffers)
        run._kernels(kp.kernels[kp.forward_kernels:])
        grads = {p: run.params[g] for p, g in kp.param_grads.items()}
        dx = None  # explicit widths: a graph without nodes has no -1 to infer
        if kp.input_grad is not None:
            dx = run.bufs[kp.input_grad].reshape(a.num_nodes, kp.buffers[kp.input_grad].width)
        return dx, grads

    def _training(self) -> KernelProgram:
        if not self.kp.is_training:
            raise ValueError(f"kernel program {self.kp.name} computes no gradients (lower an adjoint program)")
        return self.kp

    def _run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self._start(x, params, None, {})
        return self._kernels(self.kp.kernels)

    def _start(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor | None,
               given: Mapping[str, torch.Tensor]) -> None:
        """This run's buffers: the input, ``dout``, the ``given`` (saved) ones, the zeroed ones."""
        kp, a = self.kp, self.a
        self.dtype = x.dtype
        self.params = dict(params)
        self.bufs: dict[str, torch.Tensor] = {kp.input: x.reshape(a.num_nodes, 1, x.shape[-1]), **given}
        if dout is not None:
            b = kp.buffers[kp.dout]  # type: ignore[index]
            self.bufs[kp.dout] = dout.reshape(a.rows(b.domain), b.heads, b.dim)  # type: ignore[index]
        for name in kp.zero_init - set(given):
            b = kp.buffers[name]
            self.bufs[name] = x.new_zeros(a.rows(b.domain), b.heads, b.dim)

    def _kernels(self, kernels: Sequence[Kernel]) -> torch.Tensor:
        """Run ``kernels`` in order; the output buffer (as far as they computed it)."""
        a = self.a
        for k in kernels:
            if isinstance(k, WeightKernel):
                self.params[k.out] = fold_weights(k, self.params, self.a, self.kp.param_shapes)
            elif isinstance(k, GemmKernel):
                self._gemm(k)
            elif isinstance(k, TraversalKernel):
                self._traversal(k)
            elif isinstance(k, MapKernel):
                self.bufs[k.out] = self.eval(k.value, k.rows, a.rows(k.rows))
            elif isinstance(k, ScatterKernel):
                msg = self.eval(k.message, k.rows, a.rows(k.rows))
                self.bufs[k.out] = self.bufs[k.out].index_add(0, self._index(k.rows, k.out_via), msg)
            elif isinstance(k, WeightGradKernel):
                self._weight_grad(k)
            else:  # pragma: no cover
                raise TypeError(f"no reference execution for {type(k).__name__}")
        out = self.bufs.get(self.kp.output)
        if out is None:
            return None  # type: ignore[return-value]
        return out.reshape(out.shape[0], math.prod(out.shape[1:]))  # no -1: a graph may have no nodes

    # ---------------------------------------------------------------- gemm
    def _segments(self, rows: str, by: str, end: str | None) -> tuple[torch.Tensor | None, list[tuple[int, int, int]]]:
        """Rows grouped by weight type: ``(permutation or None, [(type, start, stop), ...])``."""
        a = self.a
        if by == "none":
            return None, [(0, 0, a.rows(rows))]
        if rows in NODE_ROWS and by == "ntype":  # rows in runs of one type (a batch: destinations, then sources)
            bounds, run_type, n = a.node_offsets.tolist(), a.node_run_type.tolist(), a.rows(rows)
            return None, [(t, s, min(e, n)) for t, s, e in zip(run_type, bounds[:-1], bounds[1:]) if min(e, n) > s]
        elif rows == "edge" and by == "rel":
            perm, offsets = a.e_rel_order.long(), a.rel_offsets
        elif rows in ("src_pair", "dst_pair") and by == "rel":
            perm, offsets = None, a.sp_offsets if rows == "src_pair" else a.dp_offsets
        else:  # rows typed by the node type of one end: sort them by it
            types = row_types(self.a, rows, by, end)
            assert types is not None
            perm = torch.sort(types, stable=True).indices
            counts = torch.bincount(types, minlength=a.num_ntypes)
            offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        bounds = offsets.tolist()
        return perm, [(t, bounds[t], bounds[t + 1]) for t in range(len(bounds) - 1) if bounds[t + 1] > bounds[t]]

    def _gemm(self, k: GemmKernel) -> None:
        a = self.a
        n = a.rows(k.rows)
        x = self.bufs[k.x]
        x = x[:n] if k.x_via == "row" else x[self._index(k.rows, k.x_via)]  # node rows: the first n
        w = self.params[k.weight]
        x = x.reshape(n, k.in_heads, k.in_dim) if k.per_head else x.reshape(n, 1, k.in_heads * k.in_dim)
        perm, segments = self._segments(k.rows, k.by, k.weight_end)
        xs = x if perm is None else x[perm]
        parts = []
        for t, start, stop in segments:
            wt = w if k.by == "none" else w[t]
            yt = self._matmul(xs[start:stop], wt, k.per_head)
            if k.bias:
                b = self.params[k.bias]
                yt = yt + (b if k.by == "none" else b[t]).reshape(1, -1)
            parts.append(yt)
        y = torch.cat(parts, 0) if parts else x.new_zeros(0, k.out_heads * k.out_dim)
        if perm is not None:
            y = y.new_empty(y.shape).index_copy(0, perm, y)
        y = y.reshape(n, k.out_heads, k.out_dim)
        for out, expr in k.epilogue:
            self.bufs[out] = self.eval(expr, k.rows, n, acc=y)
        if k.out is None:
            return
        if k.accumulate:
            target = self._index(k.rows, k.out_via)
            self.bufs[k.out] = self.bufs[k.out].index_add(0, target, y)
        else:
            self.bufs[k.out] = y

    def _weight_grad(self, k: WeightGradKernel) -> None:
        a = self.a
        n = a.rows(k.rows)
        dy = self.bufs[k.dy][:n].reshape(n, k.out_heads, k.out_dim)
        x = None
        if k.x is not None:
            x = self.bufs[k.x][:n] if k.x_via == "row" else self.bufs[k.x][self._index(k.rows, k.x_via)]
            x = x.reshape(n, k.in_heads, k.in_dim) if k.per_head else x.reshape(n, k.in_heads * k.in_dim)
        slice_shape = self.kp.param_shapes[k.param]
        count = 1 if k.by == "none" else {"ntype": a.num_ntypes, "rel": a.num_rels}[k.by]
        grad = dy.new_zeros(count, *slice_shape)
        perm, segments = self._segments(k.rows, k.by, k.weight_end)
        dys = dy if perm is None else dy[perm]
        xs = x if x is None or perm is None else x[perm]
        for t, start, stop in segments:
            d = dys[start:stop]
            if xs is None:
                g = d.sum(0)
            elif k.per_head:  # (n, H, I) x (n, H, O) -> (H, I, O)
                g = torch.einsum("nhi,nho->hio", xs[start:stop], d)
            else:
                g = xs[start:stop].T @ d.reshape(d.shape[0], math.prod(d.shape[1:]))
            grad[t] += g.reshape(slice_shape)  # a batch's node rows: a type's destinations and sources apart
        grad = grad.reshape(slice_shape) if k.by == "none" else grad
        self.params[k.grad] = self.params[k.grad] + grad if k.accumulate else grad

    @staticmethod
    def _matmul(x: torch.Tensor, w: torch.Tensor, per_head: bool) -> torch.Tensor:
        if per_head:  # x (n, H, Din), w (H, Din, Dout)
            return torch.einsum("nhi,hio->nho", x, w).reshape(x.shape[0], w.shape[0] * w.shape[2])
        return x.reshape(x.shape[0], w.shape[0]) @ w

    # ---------------------------------------------------------------- traversal
    def _traversal(self, k: TraversalKernel) -> None:
        self._stage(k.stage)

    def _stage(self, st: Stage) -> None:
        e = self.a.num_edges
        if isinstance(st, AggregateStores):  # the sum over every destination, then the stores that read it
            self._stage(st.total)
            self._stage(EdgeStores(st.stores))
        elif isinstance(st, EdgeStore):
            self.bufs[st.out] = self.eval(st.value, "edge", e)
        elif isinstance(st, EdgeStores):
            for one in st.stores:
                self.bufs[one.out] = self.eval(one.value, "edge", e)
        elif isinstance(st, EdgeSoftmaxStage):
            self.bufs[st.out] = self._softmax(self.eval(st.score, "edge", e), st.group)
        elif isinstance(st, AggregateStage):
            msg = self.eval(st.message, "edge", e)
            self.bufs[st.out] = self.bufs[st.out].index_add(0, self._index("edge", st.out_via), msg)
        elif isinstance(st, SoftmaxAggregate):
            alpha = self._softmax(self.eval(st.score, "edge", e), st.group)
            msg = alpha * self.eval(st.message, "edge", e)
            self.bufs[st.out] = self.bufs[st.out].index_add(0, self._index("edge", st.out_via), msg)
        else:  # pragma: no cover
            raise TypeError(type(st))

    def _softmax(self, s: torch.Tensor, group: str) -> torch.Tensor:
        """Softmax of the edge scores ``s`` over each destination's in-edges (``group="dst"``) or each
        destination pair's (``"dst_rel"``; the pair found as the program finds it: by index or search)."""
        a = self.a
        if group == "dst":
            dst, n = a.e_dst.long(), a.num_nodes
        else:
            dst, n = self._index("edge", "dst_pair"), a.rows("dst_pair")
        idx = dst.view(-1, 1, 1).expand_as(s)
        m = s.new_full((n,) + tuple(s.shape[1:]), float("-inf"))
        m = m.scatter_reduce(0, idx, s, reduce="amax", include_self=True)
        ex = torch.exp(s - m[dst])
        den = s.new_zeros(m.shape).index_add(0, dst, ex)
        return ex / den[dst]

    # ---------------------------------------------------------------- expressions
    def _index(self, rows: str, via: str) -> torch.Tensor:
        a = self.a
        if via in ("src_pair", "dst_pair"):
            return self._pair_index[via]
        table = {
            ("edge", "src"): a.e_src, ("edge", "dst"): a.e_dst, ("edge", "rel"): a.e_rel,
            ("src_pair", "pair_node"): a.sp_node, ("dst_pair", "pair_node"): a.dp_node,
            ("src_pair", "rel"): a.sp_rel, ("dst_pair", "rel"): a.dp_rel,
        }
        if (rows, via) in table:
            return table[(rows, via)].long()
        if via == "ntype":
            if rows in NODE_ROWS:
                return a.node_type.long()[:a.rows(rows)]
            node = {"src_pair": a.sp_node, "dst_pair": a.dp_node}[rows]
            return a.node_type.long()[node.long()]
        if via in ("src_ntype", "dst_ntype"):
            return a.node_type.long()[(a.e_src if via == "src_ntype" else a.e_dst).long()]
        raise ValueError(f"no index {via!r} on {rows} rows")

    def eval(self, e: Expr, rows: str, n: int, acc: torch.Tensor | None = None) -> torch.Tensor:
        """``e`` for every row: a ``(n, heads, dim)`` tensor (``dim``/``heads`` of 1 broadcast)."""
        ev = lambda c: self.eval(c, rows, n, acc)  # noqa: E731
        if isinstance(e, Acc):
            assert acc is not None
            return acc
        if isinstance(e, Load):
            buf = self.bufs[e.buffer]
            if e.guard:  # a destinations' buffer read at any row: zero past them
                index = torch.arange(n, device=buf.device) if e.via == "row" else self._index(rows, e.via)
                inside = index < buf.shape[0]
                rows_of = buf.new_zeros((index.shape[0],) + tuple(buf.shape[1:]))
                rows_of[inside] = buf[index[inside]]
            else:  # a node buffer read at the destinations' rows: its first rows
                rows_of = buf[:n] if e.via == "row" else buf[self._index(rows, e.via)]
            if tuple(rows_of.shape[1:]) != (e.heads, e.dim):  # a view: the row's features in other heads
                rows_of = rows_of.reshape(rows_of.shape[0], e.heads, e.dim)
            return rows_of
        if isinstance(e, ParamLoad):
            p = self.params[e.param]
            if e.via == "none":
                return p.reshape(1, e.heads, e.dim).expand(n, -1, -1)
            return p[self._index(rows, e.via)].reshape(n, e.heads, e.dim)
        if isinstance(e, GraphLoad):
            if e.kind == EDGE_WEIGHT:  # the caller's, beside the params
                return self.a.edge_weight(self.params.get(EDGE_WEIGHT), self.dtype).reshape(n, 1, 1)
            return self.a.graph_constant(e.kind, self.dtype).reshape(n, 1, 1)
        if isinstance(e, InnerE):
            return (ev(e.a) * ev(e.b)).sum(-1, keepdim=True)
        if isinstance(e, BinaryE):
            l, r = ev(e.a), ev(e.b)
            return l + r if e.op == "add" else l - r if e.op == "sub" else l * r
        if isinstance(e, UnaryE):
            return unary(e.op, ev(e.x), e.alpha)
        if isinstance(e, ReduceE):
            return ev(e.x).sum(1 if e.over == "heads" else 2, keepdim=True)
        if isinstance(e, BroadcastE):
            x = ev(e.x)
            return x.expand(x.shape[0], e.heads, e.dim)
        if isinstance(e, ScaleE):
            return ev(e.x) * e.scale
        if isinstance(e, GatedE):
            g = torch.sigmoid(ev(e.gate))
            return g * ev(e.h) + (1 - g) * ev(e.x)
        if isinstance(e, ConcatE):
            return torch.cat([ev(e.a), ev(e.b)], -1)
        if isinstance(e, SliceE):
            return ev(e.x)[..., e.start:e.start + e.dim]
        raise TypeError(f"cannot evaluate {type(e).__name__}")
