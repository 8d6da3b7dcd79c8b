"""Executes a :class:`KernelProgram` with torch ops: the oracle and the unoptimized baseline.

Each kernel template is executed as what it means, row-vectorized: a GEMM as one matmul per
type segment, a traversal as gathers, an edge softmax per destination and ``index_add``
into destinations, a map as an elementwise expression. It honours every IR decision that
changes *what* is computed (layout order of edge buffers, pair rows, edge -> pair lookup by
index or by binary search, epilogues, accumulating stores, derived weights) and runs in
any float dtype, float64 included; all ops are out-of-place, so autograd flows through it.

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

from typing import Mapping

import torch
import torch.nn.functional as F

from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import GraphArrays, graph_arrays
from rgtune.ir.kernels import (Acc, AggregateStage, BinaryE, ConcatE, EdgeSoftmaxStage, EdgeStore, Expr, GatedE,
                               GemmKernel, GraphLoad, InnerE, KernelProgram, Load, MapKernel, ParamLoad, ScaleE,
                               SoftmaxAggregate, TraversalKernel, UnaryE, WeightKernel)


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
    derived = {k.out for k in kp.kernels if isinstance(k, WeightKernel)}
    out = {}
    for name in kp.param_shapes:
        if name in derived:
            continue
        shape = param_full_shape(kp, name, arrays)
        fan_in = kp.param_shapes[name][-2] if len(kp.param_shapes[name]) >= 2 else 1
        out[name] = (torch.randn(shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5).to(dtype)
    return out


class ReferenceExecutor:
    """Runs ``kp`` on ``graph``: ``run(x, params) -> output (num_nodes, out_features)``."""

    def __init__(self, kp: KernelProgram, graph: HeteroGraph) -> None:
        self.kp = kp
        self.graph = graph
        self.a = graph_arrays(graph, kp.layout, kp.index_bits)
        self._pair_index = self._edge_to_pair_maps()

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
        kp, a = self.kp, self.a
        if x.shape != (a.num_nodes, kp.buffers[kp.input].width):
            raise ValueError(f"input must be ({a.num_nodes}, {kp.buffers[kp.input].width}), got {tuple(x.shape)}")
        self.dtype = x.dtype
        self.params = dict(params)
        self.bufs: dict[str, torch.Tensor] = {kp.input: x.reshape(a.num_nodes, 1, -1)}
        for name in kp.zero_init:
            b = kp.buffers[name]
            self.bufs[name] = x.new_zeros(a.rows(b.domain), b.heads, b.dim)
        for k in kp.kernels:
            if isinstance(k, WeightKernel):
                self.params[k.out] = self._weights(k)
            elif isinstance(k, GemmKernel):
                self._gemm(k)
            elif isinstance(k, TraversalKernel):
                self._traversal(k)
            elif isinstance(k, MapKernel):
                self.bufs[k.out] = self.eval(k.value, k.rows, a.rows(k.rows))
            else:  # pragma: no cover
                raise TypeError(f"no reference execution for {type(k).__name__}")
        out = self.bufs[kp.output]
        return out.reshape(a.num_nodes, -1)

    # ---------------------------------------------------------------- weights
    def _weights(self, k: WeightKernel) -> torch.Tensor:
        p, a = self.params, self.a
        if k.mode == "transpose":
            return p[k.a].transpose(-1, -2)
        if k.mode == "split_heads":  # (R, Din, H*D) -> (R, H, Din, D)
            w = p[k.a]
            shape = self.kp.param_shapes[k.out]
            return w.reshape(w.shape[0], shape[1], shape[0], shape[2]).permute(0, 2, 1, 3)
        if k.mode == "vec":  # (R, Din, H*D) . (R, H, D) -> (R, Din, H)
            w, vec = p[k.a], p[k.b]  # type: ignore[index]
            r, din, _ = w.shape
            h, d = vec.shape[1], vec.shape[2]
            return torch.einsum("rihd,rhd->rih", w.reshape(r, din, h, d), vec)
        end_ntype = (a.rel_src_ntype if k.end == "src" else a.rel_dst_ntype).long()
        b = p[k.b]  # type: ignore[index]  # (R, H, D, D)
        r, h, d, _ = b.shape
        if k.mode == "compose":  # A[nt(r)] (Din, H*D) then per-head B[r]
            wa = p[k.a][end_ntype]
            return torch.einsum("rihd,rhde->rihe", wa.reshape(r, -1, h, d), b).reshape(r, -1, h * d)
        if k.mode == "compose_bias":
            ba = p[k.a][end_ntype]
            return torch.einsum("rhd,rhde->rhe", ba.reshape(r, h, d), b).reshape(r, h * d)
        raise ValueError(f"unknown weight fold mode {k.mode!r}")

    # ---------------------------------------------------------------- gemm
    def _row_types(self, rows: str, by: str, end: str | None) -> torch.Tensor | None:
        a = self.a
        if by == "none":
            return None
        if rows == "node":
            return a.node_type.long()
        if rows == "edge":
            if by == "rel":
                return a.e_rel.long()
            return a.node_type.long()[(a.e_src if end == "src" else a.e_dst).long()]
        node, rel = (a.sp_node, a.sp_rel) if rows == "src_pair" else (a.dp_node, a.dp_rel)
        return rel.long() if by == "rel" else a.node_type.long()[node.long()]

    def _gemm(self, k: GemmKernel) -> None:
        a = self.a
        n = a.rows(k.rows)
        x = self.bufs[k.x]
        if k.x_via != "row":
            x = x[self._index(k.rows, k.x_via)]
        w = self.params[k.weight]
        types = self._row_types(k.rows, k.by, k.weight_end)
        x = x.reshape(n, k.in_heads, k.in_dim) if k.per_head else x.reshape(n, 1, -1)
        if types is None:
            y = self._matmul(x, w, k.per_head)
            if k.bias:
                y = y + self.params[k.bias].reshape(1, -1)
        else:
            y = x.new_zeros(n, k.out_heads * k.out_dim)
            for t in torch.unique(types).tolist():
                rows = (types == t).nonzero().squeeze(1)
                yt = self._matmul(x[rows], w[t], k.per_head)
                if k.bias:
                    yt = yt + self.params[k.bias][t].reshape(1, -1)
                y = y.index_copy(0, rows, yt)
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

    @staticmethod
    def _matmul(x: torch.Tensor, w: torch.Tensor, per_head: bool) -> torch.Tensor:
        if per_head:  # x (n, H, Din), w (H, Din, Dout)
            return torch.einsum("nhi,hio->nho", x, w).reshape(x.shape[0], -1)
        return x.reshape(x.shape[0], -1) @ w

    # ---------------------------------------------------------------- traversal
    def _traversal(self, k: TraversalKernel) -> None:
        a = self.a
        st = k.stage
        e = a.num_edges
        if isinstance(st, EdgeStore):
            self.bufs[st.out] = self.eval(st.value, "edge", e)
        elif isinstance(st, EdgeSoftmaxStage):
            self.bufs[st.out] = self._softmax(self.eval(st.score, "edge", e))
        elif isinstance(st, AggregateStage):
            msg = self.eval(st.message, "edge", e)
            self.bufs[st.out] = self.bufs[st.out].index_add(0, self._index("edge", st.out_via), msg)
        elif isinstance(st, SoftmaxAggregate):
            alpha = self._softmax(self.eval(st.score, "edge", e))
            msg = alpha * self.eval(st.message, "edge", e)
            self.bufs[st.out] = self.bufs[st.out].index_add(0, self._index("edge", st.out_via), msg)
        else:  # pragma: no cover
            raise TypeError(type(st))

    def _softmax(self, s: torch.Tensor) -> torch.Tensor:
        a = self.a
        dst = a.e_dst.long()
        idx = dst.view(-1, 1, 1).expand_as(s)
        m = s.new_full((a.num_nodes,) + tuple(s.shape[1:]), float("-inf"))
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
            node = {"node": None, "src_pair": a.sp_node, "dst_pair": a.dp_node}[rows]
            return a.node_type.long() if node is None else a.node_type.long()[node.long()]
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
            return buf if e.via == "row" else buf[self._index(rows, e.via)]
        if isinstance(e, ParamLoad):
            p = self.params[e.param]
            if e.via == "none":
                return p.reshape(1, e.heads, -1).expand(n, -1, -1)
            return p[self._index(rows, e.via)].reshape(n, e.heads, -1)
        if isinstance(e, GraphLoad):
            return getattr(self.a, e.kind).to(self.dtype).reshape(n, 1, 1)
        if isinstance(e, InnerE):
            return (ev(e.a) * ev(e.b)).sum(-1, keepdim=True)
        if isinstance(e, BinaryE):
            l, r = ev(e.a), ev(e.b)
            return l + r if e.op == "add" else l - r if e.op == "sub" else l * r
        if isinstance(e, UnaryE):
            v = ev(e.x)
            return {
                "leaky_relu": lambda: F.leaky_relu(v, e.alpha),
                "gelu": lambda: F.gelu(v),
                "exp": lambda: torch.exp(v),
                "sigmoid": lambda: torch.sigmoid(v),
                "relu": lambda: torch.relu(v),
                "neg": lambda: -v,
            }[e.op]()
        if isinstance(e, ScaleE):
            return ev(e.x) * e.scale
        if isinstance(e, GatedE):
            g = torch.sigmoid(ev(e.gate))
            return g * ev(e.h) + (1 - g) * ev(e.x)
        if isinstance(e, ConcatE):
            return torch.cat([ev(e.a), ev(e.b)], -1)
        raise TypeError(f"cannot evaluate {type(e).__name__}")
