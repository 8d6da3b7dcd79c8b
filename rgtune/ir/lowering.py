"""Lowering: inter-operator :class:`Program` -> :class:`KernelProgram`.

What becomes a buffer (is *materialized*): the input, every typed linear's output (a GEMM),
every aggregation, the values the fusion decisions keep (scores, softmax), GEMM epilogue
results, inputs of GEMMs, and the output. Everything else is an elementwise chain that is
inlined into the expression of the kernel that reads it; so an edge value computed per pair
and read per edge is recomputed per edge unless it is materialized -- except a pair value that
sums over heads (RGCN's basis combination, ``reorder.bases=transform``), which is materialized:
computed once per pair, read per edge. A view (:class:`~rgtune.ir.program.View`) is never a
buffer of its own: the value it views is materialized, and the view reads that buffer with its
own heads (a re-indexed :class:`~rgtune.ir.kernels.Load`).

Kernels come out in program order: one GEMM per typed linear (gathers fused into its input
index, epilogues into its output loop, a following pair -> node sum into an accumulating
store), one traversal per edge-materialized value, softmax or aggregation, one map per
other materialized node or pair value, one weight kernel per derived weight. Last, a final sum of
which one term is accumulated (an aggregation, a scatter, an accumulating GEMM) folds into that
accumulation (:mod:`rgtune.ir.addend`): two node buffers and a map less.

A training program (:func:`rgtune.ir.autodiff.adjoint`) lowers the same way, plus: an aggregation
into sources (or source pairs) becomes a :class:`ScatterKernel`, a weight gradient a
:class:`WeightGradKernel` (its ``dy`` materialized, its ``x`` read like a GEMM's input), and the
kernel program records the output's gradient (an input buffer), the input's gradient (a buffer),
the gradient params and where the forward's kernels end.
"""

from __future__ import annotations

from rgtune.ir.addend import accumulate_into_addends
from rgtune.ir.edge_stores import merge_edge_stores
from rgtune.ir.fusion_plan import plan_epilogues
from typing import Any

from rgtune.ir.kernels import (DST_NODE, NODE_ROWS, Acc, AggregateStage, BinaryE, Buffer, EdgeSoftmaxStage, EdgeStore,
                               Expr, GemmKernel, GraphLoad, KernelProgram, Load, MapKernel, ScatterKernel,
                               SoftmaxAggregate, TraversalKernel, WeightGradKernel, WeightKernel)
from rgtune.ir.op_rules import rules_of, sums_features, sums_heads
from rgtune.ir.passes.fusion import softmax_aggregations
from rgtune.ir.passes.precision import store_in
from rgtune.ir.plan import LoweringPlan
from rgtune.ir.program import (DST_PAIR, EDGE, NODE, SRC_PAIR, Aggregate, Binary, EdgeSoftmax, Expand, FoldWeights,
                               Gather, GatherPair, IRError, ParamRead, Program, TypedLinear, Value, View, WeightGrad)


class LoweringError(IRError):
    """The program has a form no kernel template covers."""


def lower(program: Program, plan: LoweringPlan | None = None) -> KernelProgram:
    """Lower a program (after the passes) to kernels as ``plan`` says (the passes' decisions: the
    layout, fusion; default: every knob at its default), then fold a final sum into an accumulating
    GEMM where it can (:mod:`rgtune.ir.addend`), and store the buffers ``plan.edge_storage`` and
    ``plan.node_storage`` choose in their types (:mod:`rgtune.ir.passes.precision`)."""
    plan = plan or LoweringPlan()
    return store_in(accumulate_into_addends(_Lowering(program, plan).run()), plan.edge_storage, plan.node_storage)


def shared_reductions(program: Program, materialized: set[str]) -> set[str]:
    """The backward's values worth a buffer (``autodiff.reuse=store``): each sums over features
    (itself or through what it inlines) and would be inlined into two or more kernels, which would
    each redo the sum. In program order, so that a value stored makes the later ones' counts exact."""
    prod, m = program.producers(), set(materialized)
    start = len(program.ops) if program.forward_ops is None else program.forward_ops

    def inlined(v: Value, seen: set[str]) -> set[str]:
        """The values a kernel writing or reading ``v`` computes inline (``v``'s own op included)."""
        op = prod.get(v.name)
        if op is None or v.name in seen:
            return seen
        seen.add(v.name)
        for w in op.inputs():
            if w.name not in m:
                inlined(w, seen)
        return seen

    chosen: set[str] = set()
    for op in program.ops[start:]:
        v = op.out.name
        if v in m or v not in prod or not rules_of(op).row_local:
            continue
        if not any(sums_features(prod.get(w)) for w in inlined(op.out, set())):
            continue
        readers = [r for r in m if r in prod and v in inlined(prod[r].out, set()) - {r}]
        if len(readers) >= 2:
            m.add(v)
            chosen.add(v)
    return chosen


class _Lowering:
    def __init__(self, program: Program, plan: LoweringPlan) -> None:
        self.p, self.plan = program, plan
        self.layout = plan.layout
        self.prod = program.producers()
        self.users = program.users()
        self.epilogues = plan_epilogues(program) if plan.epilogue == "on" else {}
        self.epilogue_roots = {root for chains in self.epilogues.values() for _, root in chains}
        self.accumulate_into: dict[str, Value] = {}
        self.fused_softmax: dict[str, EdgeSoftmax] = {}  # aggregate name -> its fused softmax
        self.materialized: set[str] = set()
        self.stored: set[str] = set()
        self.view_root: dict[str, Value] = {}  # a view -> the value whose buffer it reads
        for op in program.ops:
            if isinstance(op, View):
                self.view_root[op.out.name] = self.view_root.get(op.x.name, op.x)

    # ------------------------------------------------------------------ planning
    def _plan(self) -> None:
        p, prod = self.p, self.prod
        m = {p.x.name, p.output.name, *(v.name for v in p.inputs)}
        if p.input_grad is not None:
            m.add(p.input_grad.name)
        for op in p.ops:
            if isinstance(op, (TypedLinear, Aggregate)):
                m.add(op.out.name)
        m |= self.epilogue_roots
        fusable = {agg.out.name: sm for sm, agg in softmax_aggregations(p)}
        for op in p.ops:
            if isinstance(op, EdgeSoftmax):
                pattern_aggs = [a for a, sm in fusable.items() if sm is op]
                if self.plan.softmax_fusion == "none" or not pattern_aggs or len(self.users[op.out.name]) != 1:
                    m.add(op.out.name)
                else:
                    self.fused_softmax[pattern_aggs[0]] = op
                if self.plan.softmax_fusion in ("none", "aggregate"):
                    m.add(op.x.name)
            if isinstance(op, Aggregate) and op.x.domain in (SRC_PAIR, DST_PAIR):
                lin = prod.get(op.x.name)
                if isinstance(lin, TypedLinear) and len(self.users[op.x.name]) == 1:
                    self.accumulate_into[lin.out.name] = op.out  # the GEMM stores into the pairs' nodes
                elif not p.is_training:
                    raise LoweringError(f"{op}: a pair -> node sum must directly follow a typed linear")
        # a GEMM's input is a buffer (or a gathered buffer); so is anything gathered
        for op in p.ops:
            if isinstance(op, WeightGrad):
                m.add(op.dy.name)
                if op.x is not None:
                    src = prod.get(op.x.name)
                    m.add(src.x.name if isinstance(src, (Gather, GatherPair)) else op.x.name)
            elif isinstance(op, TypedLinear):
                src = prod.get(op.x.name)
                if isinstance(src, (Gather, GatherPair)):
                    m.add(src.x.name)
                else:
                    m.add(op.x.name)
            elif isinstance(op, (Gather, GatherPair)):
                m.add(op.x.name)
        # a pair value that sums over heads (reorder.bases=transform's combination of the bases), read per
        # edge: computed once per pair rather than once per edge that reads it
        for op in p.ops:
            if isinstance(op, Expand) and op.x.name not in m and self._sums_heads(op.x, m):
                m.add(op.x.name)
        # a view reads the buffer of what it views (no data moves): that value is the buffer
        m = {self.view_root[v].name if v in self.view_root else v for v in m} | \
            {root.name for root in self.view_root.values()}
        if self.plan.reuse == "store":
            m |= shared_reductions(p, m)
        self.materialized = m
        epilogue_inners = {inner for chains in self.epilogues.values() for inner, _ in chains}
        epilogue_only = {t for t in self.epilogues
                         if all(u.out.name in epilogue_inners for u in self.users.get(t, [])) and t != p.output.name}
        self.stored = {v for v in m if v not in epilogue_only and v not in self.accumulate_into}
        self.dst_rows = self._destination_rows()

    def _destination_rows(self) -> set[str]:
        """The node values computed for the destinations' rows alone (:data:`~rgtune.ir.kernels.DST_NODE`).

        A layer's output is needed at its destinations, the first ``num_dst_nodes`` rows (a whole graph's
        every node; a mini-batch's destinations), and so is every node value that only feeds it there (a
        root term, a query, the softmax's aggregation): those are computed for these rows alone. A value is
        needed at every row when it is the input or its gradient, when something reads it at sources (a
        gather or scatter at the ``src`` end, a source pair), or when a kernel computed at every row reads
        it. The last need is waived for a value that is zero past the destinations (the output's gradient,
        an aggregation at destinations, and what ops that keep zeros make of them: ``keeps_zero``): an
        expression reads it there as zero (a guarded load), so it too is computed for the destinations
        alone; a GEMM's input cannot be read guarded, so a GEMM over every row makes its input every row's.
        """
        p = self.p
        if not self.plan.destinations:
            return set()
        zero: set[str] = {v.name for v in p.inputs}  # the output's gradient: zero past the destinations
        for op in p.ops:
            if not isinstance(op, (FoldWeights, WeightGrad)) and op.out.domain == NODE and \
                    rules_of(op).keeps_zero(op, lambda w: w.name in zero):
                zero.add(op.out.name)
        plain: set[str] = {p.x.name} | ({p.input_grad.name} if p.input_grad is not None else set())
        guarded: set[str] = set()
        everywhere: set[str] = set()  # computed at every row

        def at_rows(v: Value, all_rows: bool, gemm: bool) -> None:
            """``v`` is read at every row (or the destinations'), by a GEMM's input (unguardable) or not."""
            if v.domain == NODE and all_rows:
                (plain if gemm else guarded).add(root(v))

        def root(v: Value) -> str:
            return self.view_root.get(v.name, v).name

        def computed_everywhere(v: Value) -> bool:
            return root(v) in plain or (root(v) in guarded and root(v) not in zero)

        everywhere |= {root(op.out) for op in p.ops  # scatters: their targets are sources
                       if isinstance(op, Aggregate) and op.out.domain == NODE and op.side == "src"}
        before = -1
        while before != len(plain) + len(guarded) + len(everywhere):  # until nothing changes (sets only grow)
            before = len(plain) + len(guarded) + len(everywhere)
            for op in reversed(p.ops):
                if isinstance(op, FoldWeights):
                    continue
                if isinstance(op, WeightGrad):  # at the rows of dy; x read as a GEMM reads its input
                    if op.x is not None:
                        all_rows = op.dy.domain == NODE and (root(op.dy) in everywhere or computed_everywhere(op.dy))
                        self._read_input(op.x, all_rows, at_rows)
                    continue
                out = op.out
                if out.domain == NODE and computed_everywhere(out):
                    everywhere.add(root(out))
                all_rows = out.domain == NODE and root(out) in everywhere
                if isinstance(op, TypedLinear):
                    self._read_input(op.x, all_rows, at_rows)
                    continue
                for v in op.inputs():
                    if isinstance(op, (Gather, GatherPair)):
                        end = op.end if isinstance(op, Gather) else op.side
                        at_rows(v, end == "src", gemm=False)
                    elif out.domain == NODE:
                        at_rows(v, all_rows, gemm=False)
        everywhere |= {root(v) for v in (p.x, p.input_grad) if v is not None}
        rows = {root(v) for v in p.values() if v.domain == NODE and root(v) not in everywhere}
        for v in p.inputs:
            if root(v) in everywhere:
                raise LoweringError(f"the output's gradient {v.name} is read at every node by a GEMM; it is given "
                                    "for the destinations alone")
        return rows  # a view's rows are those of the value it views (row_domain)

    def _read_input(self, x: Value, all_rows: bool, at_rows: Any) -> None:
        """A GEMM's input ``x`` read at its rows: a node value by row, or what a gather reads at its end."""
        src = self.prod.get(x.name)
        if x.name not in self.stored and isinstance(src, (Gather, GatherPair)):
            end = src.end if isinstance(src, Gather) else src.side
            at_rows(src.x, end == "src", gemm=True)
        else:
            at_rows(x, all_rows, gemm=True)

    def row_domain(self, v: Value) -> str:
        """The rows a node value is computed and stored for (:data:`DST_NODE` or every node); others' own."""
        name = self.view_root.get(v.name, v).name
        return DST_NODE if v.domain == NODE and name in self.dst_rows else v.domain

    def _sums_heads(self, v: Value, materialized: set[str]) -> bool:
        """Whether computing ``v`` inline sums over heads (through the values it inlines)."""
        op = self.prod.get(v.name)
        if op is None:
            return False
        return sums_heads(op) or any(self._sums_heads(w, materialized) for w in op.inputs()
                                     if w.name not in materialized)

    # ------------------------------------------------------------------ buffers
    def buf_name(self, v: Value) -> str:
        """The buffer holding ``v`` (a view's is the buffer of the value it views)."""
        return self.view_root.get(v.name, v).name.replace("%", "v")

    def _buffers(self) -> dict[str, Buffer]:
        out = {}
        for v in self.p.values():
            if v.name in self.stored:
                out[self.buf_name(v)] = Buffer(self.buf_name(v), self.row_domain(v), v.heads, v.dim)
        return out

    # ------------------------------------------------------------------ expressions
    def expr(self, v: Value, row: str, pair_side: str | None = None, acc: str | None = None,
             define: bool = False) -> Expr:
        """The expression of ``v`` in a kernel over ``row`` rows.

        ``pair_side``: evaluating a pair value inside an edge kernel (through ``expand``);
        ``acc``: inside the epilogue of the GEMM producing ``acc``; ``define``: expand ``v``'s
        own op even though ``v`` is materialized (the kernel that writes it).
        """
        if acc is not None and v.name == acc:
            return Acc(v.heads, v.dim)
        if v.name in self.stored and not define:
            return self.load(v, self._via(v.domain, row, pair_side), row)
        op = self.prod.get(v.name)
        if op is None:
            raise LoweringError(f"value {v.name} is not materialized and has no producer")
        e = rules_of(op).inline(op, ExprContext(self, row, pair_side, acc))
        if e is None:
            raise LoweringError(f"{op}: cannot be inlined into a {row} kernel; it must be materialized")
        return e

    def load(self, v: Value, via: str, row: str, heads: int | None = None, dim: int | None = None) -> Load:
        """``v``'s buffer read through ``via`` from a ``row`` kernel; guarded where the buffer holds the
        destinations alone and the row read may be any node (:meth:`_destination_rows`)."""
        guard = self.row_domain(v) == DST_NODE and (via in ("src", "src_pair", "src_ntype") or
                                                    (via == "row" and row == NODE) or
                                                    (via == "pair_node" and row == SRC_PAIR))
        return Load(v.heads if heads is None else heads, v.dim if dim is None else dim, self.buf_name(v), via, guard)

    @staticmethod
    def _via(domain: str, row: str, pair_side: str | None) -> str:
        if pair_side is not None:
            if domain in (SRC_PAIR, DST_PAIR):
                return f"{pair_side}_pair"
            raise LoweringError(f"a {domain} value read inside a pair expression")
        if domain == row or (domain == NODE and row in NODE_ROWS):
            return "row"
        if row == EDGE and domain in (SRC_PAIR, DST_PAIR):
            return "src_pair" if domain == SRC_PAIR else "dst_pair"
        raise LoweringError(f"a {domain} buffer cannot be read from {row} rows without a gather")

    @staticmethod
    def _param_via(op: ParamRead, row: str, pair_side: str | None) -> str:
        if op.by == "none":
            return "none"
        if op.by == "rel":
            if row in NODE_ROWS:
                raise LoweringError(f"{op}: a per-relation param read on node rows")
            return "rel"
        if pair_side is not None:
            return f"{pair_side}_ntype"
        if row == EDGE:
            if op.end is None:
                raise LoweringError(f"{op}: a per-node-type param on edges must say which end")
            return f"{op.end}_ntype"
        return "ntype"

    # ------------------------------------------------------------------ kernels
    def run(self) -> KernelProgram:
        self._plan()
        kernels = []
        zero_init: set[str] = set()
        names: dict[str, int] = {}

        def kname(base: str) -> str:
            names[base] = names.get(base, 0) + 1
            return f"{base}{names[base]}"

        forward_ops = self.p.forward_ops
        forward_kernels = None
        for i, op in enumerate(self.p.ops):
            if i == forward_ops:
                forward_kernels = len(kernels)
            if isinstance(op, FoldWeights):
                kernels.append(WeightKernel(kname("fold"), op.out_param, op.mode, op.a, op.b, op.end))
                continue
            if isinstance(op, WeightGrad):
                kernels.append(self._weight_grad(op, kname("weight_grad")))
                continue
            name = op.out.name
            if name not in self.materialized or name == self.p.x.name:
                continue
            if isinstance(op, TypedLinear):
                kernels.append(self._gemm(op, kname("gemm")))
                if name in self.accumulate_into:
                    zero_init.add(self.buf_name(self.accumulate_into[name]))
            elif isinstance(op, Aggregate):
                accumulated = any(v.name == name for v in self.accumulate_into.values())
                if accumulated:
                    continue  # by the GEMM that produced op.x
                if op.x.domain in (SRC_PAIR, DST_PAIR):  # pairs into their nodes (a training program's)
                    kernels.append(ScatterKernel(kname("scatter"), self.buf_name(op.out), "pair_node",
                                                 self.expr(op.x, op.x.domain), self.layout, rows=op.x.domain))
                elif op.side == "src":
                    kernels.append(ScatterKernel(kname("scatter"), self.buf_name(op.out),
                                                 "src" if op.to == NODE else "src_pair", self.expr(op.x, EDGE),
                                                 self.layout))
                else:
                    kernels.append(self._aggregate(op, kname("aggregate")))
                zero_init.add(self.buf_name(op.out))
            elif name in self.epilogue_roots:
                continue  # written by its GEMM's epilogue
            elif isinstance(op, EdgeSoftmax):
                kernels.append(TraversalKernel(kname("softmax"), EdgeSoftmaxStage(self.buf_name(op.out),
                                                                                  self.expr(op.x, EDGE), op.group),
                                               self.layout))
            elif op.out.domain == EDGE:
                kernels.append(TraversalKernel(kname("edge_map"), EdgeStore(self.buf_name(op.out),
                                                                            self.expr(op.out, EDGE, define=True)),
                                               self.layout))
            else:
                rows = self.row_domain(op.out)
                kernels.append(MapKernel(kname("map"), rows, self.buf_name(op.out),
                                         self.expr(op.out, rows, define=True)))
        params = self.p.params
        buffers = self._buffers()
        if self.plan.reuse == "fuse":
            kernels, forward_kernels = merge_edge_stores(
                kernels, forward_kernels, {n: (b.heads, b.dim) for n, b in buffers.items()})
        return KernelProgram(
            name=self.p.name,
            buffers=buffers,
            kernels=kernels,
            input=self.buf_name(self.p.x),
            output=self.buf_name(self.p.output),
            param_shapes={k: q.shape for k, q in params.items()},
            param_by={k: q.by for k, q in params.items()},
            layout=self.plan.layout,
            index_bits=self.plan.index_bits,
            pair_index=self.plan.pair_index,
            zero_init=zero_init,
            dout=self.buf_name(self.p.inputs[0]) if self.p.inputs else None,
            input_grad=self.buf_name(self.p.input_grad) if self.p.input_grad is not None else None,
            param_grads=dict(self.p.param_grads),
            forward_kernels=forward_kernels,
        )

    def _gemm(self, op: TypedLinear, name: str) -> GemmKernel:
        (x, x_via), xin = self._gathered(op.x), op.x
        out, out_via, accumulate = None, "row", False
        if op.out.name in self.accumulate_into:
            out, out_via, accumulate = self.buf_name(self.accumulate_into[op.out.name]), "pair_node", True
        elif op.out.name in self.stored:
            out = self.buf_name(op.out)
        rows = self.row_domain(op.out)
        epilogue = [(self.buf_name(self.prod[r].out), self.expr(self.prod[r].out, rows, acc=op.out.name,
                                                                define=True))
                    for _, r in self.epilogues.get(op.out.name, [])]
        return GemmKernel(
            name, rows=rows, x=self.buf_name(x), x_via=x_via, weight=op.weight, bias=op.bias, by=op.by,
            weight_end=op.end, per_head=op.per_head, in_heads=xin.heads, in_dim=xin.dim, out_heads=op.out.heads,
            out_dim=op.out.dim, out=out, out_via=out_via, accumulate=accumulate, epilogue=epilogue)

    def _gathered(self, x: Value) -> tuple[Value, str]:
        """A GEMM's input as ``(buffer value, via)``: the value itself, or what a gather reads."""
        src = self.prod.get(x.name)
        if x.name in self.stored or x.name in self.view_root:
            return x, "row"
        if isinstance(src, Gather):
            return src.x, src.end
        if isinstance(src, GatherPair):
            return src.x, "pair_node"
        raise LoweringError(f"{x.name} is neither a buffer nor a gathered buffer")  # pragma: no cover

    def _weight_grad(self, op: WeightGrad, name: str) -> WeightGradKernel:
        x, x_via = self._gathered(op.x) if op.x is not None else (None, "row")
        dy = op.dy
        return WeightGradKernel(
            name, rows=self.row_domain(dy), x=self.buf_name(x) if x is not None else None, x_via=x_via,
            dy=self.buf_name(dy),
            grad=op.out_param, param=op.param, by=op.by, weight_end=op.end, per_head=op.per_head,
            in_heads=op.x.heads if op.x is not None else 1, in_dim=op.x.dim if op.x is not None else 1,
            out_heads=dy.heads, out_dim=dy.dim, accumulate=op.accumulate)

    def _aggregate(self, op: Aggregate, name: str) -> TraversalKernel:
        out_via = "dst" if op.to == NODE else "dst_pair"
        if op.to not in (NODE, DST_PAIR):
            raise LoweringError(f"{op}: edges aggregate to nodes or destination pairs, not {op.to}")
        sm = self.fused_softmax.get(op.out.name)
        if sm is not None:
            mul = self.prod[op.x.name]
            assert isinstance(mul, Binary)
            message = mul.b if mul.a.name == sm.out.name else mul.a
            stage = SoftmaxAggregate(self.buf_name(op.out), out_via, self.expr(sm.x, EDGE), self.expr(message, EDGE),
                                     sm.group)
        else:
            msg = self.expr(op.x, EDGE)
            if op.reduce == "mean":
                msg = BinaryE(msg.heads, msg.dim, "mul", msg, GraphLoad(1, 1, "inv_dst_degree"))
            stage = AggregateStage(self.buf_name(op.out), out_via, msg)
        return TraversalKernel(name, stage, self.layout)


class ExprContext:
    """What an op's :meth:`~rgtune.ir.op_rules.OpRules.inline` rule builds its expression with: its
    operands' expressions in the same kernel, the buffer a value lives in, and how a row of the
    kernel reaches a row of another domain."""

    def __init__(self, lowering: _Lowering, row: str, pair_side: str | None, acc: str | None) -> None:
        self._l, self.row, self.pair_side, self._acc = lowering, row, pair_side, acc

    def expr(self, v: Value) -> Expr:
        """``v``'s expression in this kernel (a load where it is a buffer, else its op inlined)."""
        return self._l.expr(v, self.row, self.pair_side, self._acc)

    def pair_expr(self, v: Value, side: str) -> Expr:
        """A pair value's expression read from an edge row, through the edge's pair on ``side``."""
        return self._l.expr(v, self.row, side, self._acc)

    def buffer(self, v: Value) -> str:
        """The buffer holding ``v`` (a view's is the buffer of the value it views)."""
        return self._l.buf_name(v)

    def load(self, v: Value, via: str, heads: int | None = None, dim: int | None = None) -> Load:
        """A read of ``v``'s buffer through ``via`` (in ``heads x dim``, default ``v``'s), guarded where the
        buffer holds the destinations' rows alone and this kernel's row may reach any node."""
        return self._l.load(v, via, self.row, heads, dim)

    def via(self, domain: str) -> str:
        """How a row of this kernel reads the row of a ``domain`` buffer."""
        return self._l._via(domain, self.row, self.pair_side)

    def param_via(self, op: ParamRead) -> str:
        """How a row of this kernel reads a per-type param's slice."""
        return self._l._param_via(op, self.row, self.pair_side)
