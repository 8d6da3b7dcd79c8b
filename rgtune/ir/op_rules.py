"""Each op's rules in one place: how it is interpreted, differentiated, lowered and counted.

The parts of the compiler ask an op's :class:`OpRules` (:func:`rules_of`, a registry keyed by the
op's type, as TVM keeps per-op attributes) instead of testing its type:

* :meth:`OpRules.interpret`: what the op computes, in torch, on the rows of its operands
  (:class:`~rgtune.ir.interpret.Interpreter`, the float64 oracle);
* :meth:`OpRules.adjoint`: the op's contribution to its operands' gradients, in IR ops
  (:func:`~rgtune.ir.autodiff.adjoint` calls it for every op, last to first, with the gradient of
  its output);
* :meth:`OpRules.inline`: the op's expression inside the kernel that reads its value
  (:mod:`rgtune.ir.lowering`); ``None`` means only a kernel template computes it (a GEMM, a
  traversal), so its value is always a buffer;
* :meth:`OpRules.flops` and :meth:`OpRules.summed`: what it costs: the FLOPs of the op as written
  (:func:`rgtune.ir.counts.program_flops`), and how many features and heads one output element
  sums (a value that sums is worth a buffer rather than being recomputed in every reader);
* :attr:`OpRules.row_local`: row ``i`` of the output depends on row ``i`` of the inputs only (an
  elementwise op, a typed linear): such an op can run per unique (node, relation) pair
  (:mod:`rgtune.ir.passes.compact`), and :meth:`OpRules.depends_on` says on what its row depends.

Adding an op is one module: its :class:`~rgtune.ir.program.Op` dataclass, an :class:`OpRules`
subclass, and :func:`register_op`; README's "Extending it" walks through one (``concat``'s adjoint,
which needed a :class:`~rgtune.ir.program.Slice`). The kernel templates' own ops (typed linear,
aggregation, edge softmax, weight folds and gradients) have rules too; lowering maps them to their
kernels itself.

Example: an op that exists only here, ``softsign(x) = x / (1 + |x|)``, written with the kernel IR's
expressions (so every code generator runs it as it is).

    >>> import dataclasses, torch
    >>> from rgtune.ir.kernels import BinaryE, UnaryE
    >>> from rgtune.ir.program import Op, ProgramBuilder, Value
    >>> @dataclasses.dataclass(frozen=True)
    ... class Square(Op):
    ...     x: Value
    >>> class SquareRules(OpRules):
    ...     row_local = True
    ...     def interpret(self, op, run): return run.value(op.x) ** 2
    ...     def adjoint(self, op, g, ad): ad.accumulate(op.x, ad.mul(g, ad.scale(op.x, 2.0)))
    ...     def inline(self, op, ctx): return BinaryE(op.out.heads, op.out.dim, "mul", ctx.expr(op.x), ctx.expr(op.x))
    ...     def flops(self, op, rows): return rows(op.out.domain) * op.out.heads * op.out.dim
    >>> register_op(Square, SquareRules(), "square")
    >>> b = ProgramBuilder("sq", 4)
    >>> print(b.finish(b.op(Square, b.x.domain, 1, 4, x=b.x)).ops[0])
    %0 = square(x) : node[1x4]
    >>> unregister_op(Square)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from rgtune.ir.kernels import (BinaryE, BroadcastE, ConcatE, Expr, GatedE, GraphLoad, InnerE, ParamLoad, ReduceE,
                               ScaleE, SliceE, UnaryE)
from rgtune.ir.program import (DST_PAIR, EDGE, EDGE_WEIGHT, NODE, SRC_PAIR, Aggregate, Binary, Broadcast, Concat,
                               EdgeSoftmax, Expand, FoldWeights, Gather, GatedResidual, GatherPair, GraphConst, Inner, IRError, Op,
                               ParamRead, ReduceSum, Scale, Slice, TypedLinear, Unary, Value, View, WeightGrad,
                               register_opname, unregister_opname)

if TYPE_CHECKING:
    from rgtune.ir.autodiff import AdjointBuilder
    from rgtune.ir.interpret import RunContext
    from rgtune.ir.lowering import ExprContext

__all__ = ["OpRules", "register_op", "unregister_op", "rules_of", "sums_features", "sums_heads", "unary"]

#: rows of a domain (``node``, ``edge``, ``src_pair``, ``dst_pair``) on the graph being counted
Rows = Callable[[str], int]


class OpRules:
    """The rules of one op type (see the module docstring). Every method has the op as its first
    argument; a rule an op does not have raises an :class:`IRError` naming it."""

    #: row i of the output is computed from row i of the inputs alone (see the module docstring)
    row_local: ClassVar[bool] = False

    def interpret(self, op: Any, run: "RunContext") -> torch.Tensor:
        """The op's value ``(rows, heads, dim)`` (a param op: the param's tensor)."""
        raise IRError(f"the interpreter does not know {type(op).__name__}")

    def adjoint(self, op: Any, g: Value, ad: "AdjointBuilder") -> None:
        """Add the op's contribution to its operands' (and params') gradients, given ``g``, its output's."""
        raise IRError(f"no adjoint rule for {type(op).__name__}")

    def inline(self, op: Any, ctx: "ExprContext") -> Expr | None:
        """The op's expression in a kernel that reads its value; None: a kernel template computes it."""
        return None

    def flops(self, op: Any, rows: Rows) -> int:
        """Floating-point operations of the op as written (multiply-adds count two)."""
        return 0

    def summed(self, op: Any) -> tuple[int, int]:
        """How many features and how many heads one output element sums (``(1, 1)``: none)."""
        return 1, 1

    def depends_on(self, op: Any, inputs: list[frozenset[str]]) -> frozenset[str]:
        """For an edge value: which of ``src``, ``dst``, ``rel``, ``edge`` its row depends on, given its
        inputs'. A row-local op depends on what its inputs do; anything else on the whole edge."""
        return frozenset().union(*inputs) if self.row_local else frozenset({"edge"})

    def keeps_zero(self, op: Any, zero: Callable[[Value], bool]) -> bool:
        """For a node value: whether it is zero at every row where the node values ``zero`` says are zero
        are (lowering's question: the rows past a mini-batch's destinations, where the output's gradient
        is zero, need no computing when each op keeps them zero). No, unless the op says so."""
        return False


_RULES: dict[type, OpRules] = {}


def register_op(op_type: type[Op], rules: OpRules, name: str) -> None:
    """Make ``rules`` the rules of ``op_type``, printed as ``name``."""
    if not (isinstance(op_type, type) and issubclass(op_type, Op)):
        raise IRError(f"register_op: {op_type!r} is not an Op subclass")
    if not isinstance(rules, OpRules):
        raise IRError(f"register_op: the rules of {op_type.__name__} must be an OpRules, got {type(rules).__name__}")
    _RULES[op_type] = rules
    register_opname(op_type, name)


def unregister_op(op_type: type[Op]) -> None:
    _RULES.pop(op_type, None)
    unregister_opname(op_type)


def rules_of(op: Op) -> OpRules:
    """The rules of ``op``'s type."""
    rules = _RULES.get(type(op))
    if rules is None:
        raise IRError(f"op {type(op).__name__} has no rules; register them with rgtune.ir.op_rules.register_op")
    return rules


def _elements(v: Value, rows: Rows) -> int:
    return rows(v.domain) * v.heads * v.dim


def sums_features(op: Op | None) -> bool:
    """Whether ``op`` sums over more than one feature (an inner product, or a sum of a wider value): what
    makes a value costly to recompute in every kernel that reads it (``autodiff.reuse``)."""
    return op is not None and rules_of(op).summed(op)[0] > 1


def sums_heads(op: Op | None) -> bool:
    """Whether ``op`` sums over more than one head (RGCN's basis combination, ``reorder.bases=transform``)."""
    return op is not None and rules_of(op).summed(op)[1] > 1


# ------------------------------------------------------------------ reads of nodes, pairs, params, the graph
class _GatherRules(OpRules):
    def interpret(self, op: Gather, run: "RunContext") -> torch.Tensor:
        a = run.arrays
        return run.value(op.x)[(a.e_src if op.end == "src" else a.e_dst).long()]

    def adjoint(self, op: Gather, g: Value, ad: "AdjointBuilder") -> None:  # a sum over each node's edges
        ad.accumulate(op.x, ad.emit(Aggregate, NODE, g.heads, g.dim, x=g, to=NODE, reduce="sum",
                                    end=None if op.end == "dst" else op.end))

    def inline(self, op: Gather, ctx: "ExprContext") -> Expr:
        return ctx.load(op.x, op.end, op.out.heads, op.out.dim)

    def depends_on(self, op: Gather, inputs: list[frozenset[str]]) -> frozenset[str]:
        return frozenset({op.end})


class _GatherPairRules(OpRules):
    def interpret(self, op: GatherPair, run: "RunContext") -> torch.Tensor:
        a = run.arrays
        return run.value(op.x)[(a.sp_node if op.side == "src" else a.dp_node).long()]

    def adjoint(self, op: GatherPair, g: Value, ad: "AdjointBuilder") -> None:  # pairs summed into their nodes
        ad.accumulate(op.x, ad.emit(Aggregate, NODE, g.heads, g.dim, x=g, to=NODE, reduce="sum",
                                    end=None if op.side == "dst" else op.side))

    def inline(self, op: GatherPair, ctx: "ExprContext") -> Expr:
        return ctx.load(op.x, "pair_node" if ctx.pair_side is None else ctx.pair_side, op.out.heads, op.out.dim)


class _ExpandRules(OpRules):
    def interpret(self, op: Expand, run: "RunContext") -> torch.Tensor:
        return run.value(op.x)[run.edge_to_pair(op.x.domain)]

    def adjoint(self, op: Expand, g: Value, ad: "AdjointBuilder") -> None:
        # edges summed into their pair: a pair-domain linear's weight gradient reads #pairs rows, not #edges
        side = "src" if op.x.domain == SRC_PAIR else "dst"
        ad.accumulate(op.x, ad.emit(Aggregate, op.x.domain, g.heads, g.dim, x=g, to=op.x.domain, reduce="sum",
                                    end=None if side == "dst" else side))

    def inline(self, op: Expand, ctx: "ExprContext") -> Expr:
        return ctx.pair_expr(op.x, "src" if op.x.domain == SRC_PAIR else "dst")


class _ParamReadRules(OpRules):
    def interpret(self, op: ParamRead, run: "RunContext") -> torch.Tensor:
        types = run.row_types(op.domain, op.by, op.end)
        p = run.param(op.param)
        rows = p[types] if types is not None else p.expand(run.arrays.rows(op.domain), *p.shape)
        return rows.reshape(rows.shape[0], op.out.heads, op.out.dim)

    def adjoint(self, op: ParamRead, g: Value, ad: "AdjointBuilder") -> None:  # the rows of each type summed
        ad.param_grad(op.param, None, g, op.by, end=op.end)

    def inline(self, op: ParamRead, ctx: "ExprContext") -> Expr:
        return ParamLoad(op.out.heads, op.out.dim, op.param, ctx.param_via(op))

    def depends_on(self, op: ParamRead, inputs: list[frozenset[str]]) -> frozenset[str]:
        if op.by == "rel":
            return frozenset({"rel"})
        return frozenset({op.end} if op.by == "ntype" and op.end else set())


class _GraphConstRules(OpRules):
    def interpret(self, op: GraphConst, run: "RunContext") -> torch.Tensor:
        if op.kind == EDGE_WEIGHT:  # the caller's, beside the params
            return run.arrays.edge_weight(run.params.get(EDGE_WEIGHT), run.dtype).reshape(-1, 1, 1)
        return run.arrays.graph_constant(op.kind, run.dtype).reshape(-1, 1, 1)

    def adjoint(self, op: GraphConst, g: Value, ad: "AdjointBuilder") -> None:
        pass  # a constant of the graph

    def inline(self, op: GraphConst, ctx: "ExprContext") -> Expr:
        return GraphLoad(op.out.heads, op.out.dim, op.kind)

    def depends_on(self, op: GraphConst, inputs: list[frozenset[str]]) -> frozenset[str]:
        return frozenset({"edge"}) if op.kind == EDGE_WEIGHT else frozenset({"dst", "rel"})


# ------------------------------------------------------------------ elementwise
class _InnerRules(OpRules):
    row_local = True

    def interpret(self, op: Inner, run: "RunContext") -> torch.Tensor:
        return (run.value(op.a) * run.value(op.b)).sum(-1, keepdim=True)

    def adjoint(self, op: Inner, g: Value, ad: "AdjointBuilder") -> None:
        ad.accumulate(op.a, ad.reduce_to(ad.mul(g, op.b), op.a))
        ad.accumulate(op.b, ad.reduce_to(ad.mul(g, op.a), op.b))

    def inline(self, op: Inner, ctx: "ExprContext") -> Expr:
        return InnerE(op.out.heads, 1, ctx.expr(op.a), ctx.expr(op.b))

    def flops(self, op: Inner, rows: Rows) -> int:
        return 2 * rows(op.out.domain) * op.out.heads * op.a.dim

    def summed(self, op: Inner) -> tuple[int, int]:
        return op.a.dim, 1

    def keeps_zero(self, op: Inner, zero: Callable[[Value], bool]) -> bool:
        return zero(op.a) or zero(op.b)


_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


class _BinaryRules(OpRules):
    row_local = True

    def interpret(self, op: Binary, run: "RunContext") -> torch.Tensor:
        return _BINARY[op.op](run.value(op.a), run.value(op.b))

    def adjoint(self, op: Binary, g: Value, ad: "AdjointBuilder") -> None:
        if op.op == "add":
            ad.accumulate(op.a, ad.reduce_to(g, op.a))
            ad.accumulate(op.b, ad.reduce_to(g, op.b))
        elif op.op == "sub":
            ad.accumulate(op.a, ad.reduce_to(g, op.a))
            neg = ad.emit(Unary, g.domain, g.heads, g.dim, op="neg", x=g)
            ad.accumulate(op.b, ad.reduce_to(neg, op.b))
        elif op.op == "mul":
            if op.a.name == op.b.name:  # x * x
                ad.accumulate(op.a, ad.reduce_to(ad.mul(g, ad.scale(op.a, 2.0)), op.a))
                return
            ad.accumulate(op.a, ad.reduce_to(ad.mul(g, op.b), op.a))
            ad.accumulate(op.b, ad.reduce_to(ad.mul(g, op.a), op.b))
        else:
            raise IRError(f"no adjoint rule for the binary op {op.op!r}")

    def inline(self, op: Binary, ctx: "ExprContext") -> Expr:
        return BinaryE(op.out.heads, op.out.dim, op.op, ctx.expr(op.a), ctx.expr(op.b))

    def flops(self, op: Binary, rows: Rows) -> int:
        return _elements(op.out, rows)

    def keeps_zero(self, op: Binary, zero: Callable[[Value], bool]) -> bool:
        return (zero(op.a) or zero(op.b)) if op.op == "mul" else (zero(op.a) and zero(op.b))


#: the derivative of a unary op, as a unary op of the same input
_UNARY_GRAD = {"leaky_relu": "leaky_relu_grad", "gelu": "gelu_grad", "sigmoid": "sigmoid_grad", "relu": "relu_grad"}


class _UnaryRules(OpRules):
    row_local = True

    def interpret(self, op: Unary, run: "RunContext") -> torch.Tensor:
        return unary(op.op, run.value(op.x), op.alpha)

    def adjoint(self, op: Unary, g: Value, ad: "AdjointBuilder") -> None:
        x = op.x
        if op.op == "neg":
            ad.accumulate(x, ad.emit(Unary, g.domain, g.heads, g.dim, op="neg", x=g))
            return
        if op.op == "inc_positive":  # derivative 1 on both sides of 0
            ad.accumulate(x, g)
            return
        if op.op == "exp":  # d exp(x) = exp(x): the output itself
            ad.accumulate(x, ad.mul(g, op.out))
            return
        if op.op not in _UNARY_GRAD:
            raise IRError(f"no adjoint rule for the unary op {op.op!r}")
        slope = ad.emit(Unary, x.domain, x.heads, x.dim, op=_UNARY_GRAD[op.op], x=x, alpha=op.alpha)
        ad.accumulate(x, ad.mul(g, slope))

    def inline(self, op: Unary, ctx: "ExprContext") -> Expr:
        return UnaryE(op.out.heads, op.out.dim, op.op, ctx.expr(op.x), op.alpha)

    def flops(self, op: Unary, rows: Rows) -> int:
        return _elements(op.out, rows)

    def keeps_zero(self, op: Unary, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x) and op.op in ("neg", "relu", "leaky_relu", "gelu", "inc_positive")  # f(0) = 0


class _ScaleRules(OpRules):
    row_local = True

    def interpret(self, op: Scale, run: "RunContext") -> torch.Tensor:
        return run.value(op.x) * op.scale

    def adjoint(self, op: Scale, g: Value, ad: "AdjointBuilder") -> None:
        ad.accumulate(op.x, ad.scale(g, op.scale))

    def inline(self, op: Scale, ctx: "ExprContext") -> Expr:
        return ScaleE(op.out.heads, op.out.dim, ctx.expr(op.x), op.scale)

    def flops(self, op: Scale, rows: Rows) -> int:
        return _elements(op.out, rows)

    def keeps_zero(self, op: Scale, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x)


class _ReduceSumRules(OpRules):
    row_local = True

    def interpret(self, op: ReduceSum, run: "RunContext") -> torch.Tensor:
        return run.value(op.x).sum(1 if op.over == "heads" else 2, keepdim=True)

    def adjoint(self, op: ReduceSum, g: Value, ad: "AdjointBuilder") -> None:  # g repeated over what was summed
        ad.accumulate(op.x, ad.emit(Broadcast, op.x.domain, op.x.heads, op.x.dim, x=g))

    def inline(self, op: ReduceSum, ctx: "ExprContext") -> Expr:
        return ReduceE(op.out.heads, op.out.dim, ctx.expr(op.x), op.over)

    def flops(self, op: ReduceSum, rows: Rows) -> int:
        return _elements(op.x, rows)

    def summed(self, op: ReduceSum) -> tuple[int, int]:
        return (op.x.dim, 1) if op.over == "dim" else (1, op.x.heads)

    def keeps_zero(self, op: ReduceSum, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x)


class _BroadcastRules(OpRules):
    def interpret(self, op: Broadcast, run: "RunContext") -> torch.Tensor:
        x = run.value(op.x)
        return x.expand(x.shape[0], op.out.heads, op.out.dim)

    def adjoint(self, op: Broadcast, g: Value, ad: "AdjointBuilder") -> None:
        ad.accumulate(op.x, ad.reduce_to(g, op.x))

    def inline(self, op: Broadcast, ctx: "ExprContext") -> Expr:
        return BroadcastE(op.out.heads, op.out.dim, ctx.expr(op.x))

    def keeps_zero(self, op: Broadcast, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x)


class _ViewRules(OpRules):
    def interpret(self, op: View, run: "RunContext") -> torch.Tensor:
        return run.value(op.x).reshape(-1, op.out.heads, op.out.dim)

    def adjoint(self, op: View, g: Value, ad: "AdjointBuilder") -> None:  # the same features grouped back
        ad.accumulate(op.x, ad.emit(View, op.x.domain, op.x.heads, op.x.dim, x=g))

    def inline(self, op: View, ctx: "ExprContext") -> Expr:
        # the viewed buffer's row, its features regrouped into this value's heads
        return ctx.load(op.out, ctx.via(op.out.domain))

    def keeps_zero(self, op: View, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x)


class _ConcatRules(OpRules):
    row_local = True

    def interpret(self, op: Concat, run: "RunContext") -> torch.Tensor:
        return torch.cat([run.value(op.a), run.value(op.b)], dim=-1)

    def adjoint(self, op: Concat, g: Value, ad: "AdjointBuilder") -> None:
        # each operand's gradient is its own features of g: a slice per operand
        for v, start in ((op.a, 0), (op.b, op.a.dim)):
            ad.accumulate(v, ad.emit(Slice, v.domain, v.heads, v.dim, x=g, start=start))

    def inline(self, op: Concat, ctx: "ExprContext") -> Expr:
        return ConcatE(op.out.heads, op.out.dim, ctx.expr(op.a), ctx.expr(op.b))

    def keeps_zero(self, op: Concat, zero: Callable[[Value], bool]) -> bool:
        return zero(op.a) and zero(op.b)


class _SliceRules(OpRules):
    row_local = True

    def interpret(self, op: Slice, run: "RunContext") -> torch.Tensor:
        return run.value(op.x)[..., op.start:op.start + op.out.dim]

    def adjoint(self, op: Slice, g: Value, ad: "AdjointBuilder") -> None:
        raise IRError(f"{op}: a slice is the adjoint of a concat; a forward slice has no adjoint yet (it would "
                      "scatter g into zeros: an op of its own)")

    def inline(self, op: Slice, ctx: "ExprContext") -> Expr:
        return SliceE(op.out.heads, op.out.dim, ctx.expr(op.x), op.start)

    def keeps_zero(self, op: Slice, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x)


class _GatedResidualRules(OpRules):
    def interpret(self, op: GatedResidual, run: "RunContext") -> torch.Tensor:
        gate = torch.sigmoid(run.param(op.skip)[run.arrays.node_type.long()]).reshape(-1, 1, 1)
        h, x = run.value(op.h), run.value(op.x)
        return gate * h + (1 - gate) * x.reshape(h.shape)

    def adjoint(self, op: GatedResidual, g: Value, ad: "AdjointBuilder") -> None:
        h, x = op.h, op.x
        if (h.heads, h.dim) != (x.heads, x.dim):
            raise IRError(f"{op}: the adjoint of a gated residual needs h and x of one shape")
        s = ad.emit(ParamRead, NODE, 1, 1, param=op.skip, by="ntype", domain=NODE)
        gate = ad.emit(Unary, NODE, 1, 1, op="sigmoid", x=s)
        dh = ad.mul(g, gate)
        ad.accumulate(h, dh)
        ad.accumulate(x, ad.emit(Binary, NODE, g.heads, g.dim, op="sub", a=g, b=dh))
        diff = ad.emit(Binary, NODE, h.heads, h.dim, op="sub", a=h, b=x)
        dgate = ad.reduce_to(ad.mul(g, diff), s)
        slope = ad.emit(Unary, NODE, 1, 1, op="sigmoid_grad", x=s)
        ad.param_grad(op.skip, None, ad.mul(dgate, slope), "ntype")

    def inline(self, op: GatedResidual, ctx: "ExprContext") -> Expr:
        return GatedE(op.out.heads, op.out.dim, ParamLoad(1, 1, op.skip, "ntype"), ctx.expr(op.h), ctx.expr(op.x))

    def flops(self, op: GatedResidual, rows: Rows) -> int:
        return 4 * _elements(op.out, rows)

    def keeps_zero(self, op: GatedResidual, zero: Callable[[Value], bool]) -> bool:
        return zero(op.h) and zero(op.x)


# ------------------------------------------------------------------ the kernel templates' ops
class _TypedLinearRules(OpRules):
    row_local = True

    def interpret(self, op: TypedLinear, run: "RunContext") -> torch.Tensor:
        x = run.value(op.x)
        w, b = run.param(op.weight), run.param(op.bias) if op.bias else None
        types = run.row_types(op.x.domain, op.by, op.end)
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

    def adjoint(self, op: TypedLinear, g: Value, ad: "AdjointBuilder") -> None:
        x = op.x
        dx = ad.emit(TypedLinear, x.domain, x.heads, x.dim, x=g, weight=ad.transposed(op.weight), bias=None, by=op.by,
                     per_head=op.per_head, end=op.end)
        ad.accumulate(x, dx)
        ad.param_grad(op.weight, x, g, op.by, op.per_head, op.end)
        if op.bias:
            ad.param_grad(op.bias, None, g, op.by, end=op.end)

    def flops(self, op: TypedLinear, rows: Rows) -> int:
        inputs = op.x.dim if op.per_head else op.x.heads * op.x.dim  # per head: one (I, O) matrix each
        return rows(op.out.domain) * op.out.heads * op.out.dim * (2 * inputs + (1 if op.bias else 0))

    def depends_on(self, op: TypedLinear, inputs: list[frozenset[str]]) -> frozenset[str]:
        keys = super().depends_on(op, inputs)
        return keys | {"rel"} if op.by == "rel" else keys

    def keeps_zero(self, op: TypedLinear, zero: Callable[[Value], bool]) -> bool:
        return zero(op.x) and not op.bias


class _AggregateRules(OpRules):
    def interpret(self, op: Aggregate, run: "RunContext") -> torch.Tensor:
        x = run.value(op.x)
        if op.x.domain == EDGE and op.to in (SRC_PAIR, DST_PAIR):
            index, n = run.edge_to_pair(op.to), run.arrays.rows(op.to)
        elif op.to == NODE:
            index, n = run.group(op.x.domain, op.side)
        else:
            raise IRError(f"{op}: cannot aggregate {op.x.domain} rows into {op.to}")
        out = torch.zeros((n, *x.shape[1:]), dtype=x.dtype).index_add(0, index, x)
        if op.reduce == "mean":
            count = torch.zeros(n, dtype=x.dtype).index_add(0, index, torch.ones_like(index, dtype=x.dtype))
            out = out / count.clamp(min=1).reshape(-1, 1, 1)
        return out

    def adjoint(self, op: Aggregate, g: Value, ad: "AdjointBuilder") -> None:
        x = op.x
        if op.reduce != "sum":
            if not (x.domain == EDGE and op.to == NODE and op.side == "dst"):
                raise IRError(f"{op}: the adjoint of a mean covers edges into destinations only")
            inv = ad.emit(GraphConst, EDGE, 1, 1, kind="inv_dst_degree", domain=EDGE)
            back = ad.emit(Gather, EDGE, g.heads, g.dim, x=g, end="dst")
            ad.accumulate(x, ad.mul(back, inv))
            return
        if x.domain == EDGE and op.to == NODE:
            back = ad.emit(Gather, EDGE, g.heads, g.dim, x=g, end=op.side)
        elif x.domain == EDGE:  # into pairs
            back = ad.emit(Expand, EDGE, g.heads, g.dim, x=g)
        else:  # pairs into their nodes
            back = ad.emit(GatherPair, x.domain, g.heads, g.dim, x=g, side="src" if x.domain == SRC_PAIR else "dst")
        ad.accumulate(x, back)

    def flops(self, op: Aggregate, rows: Rows) -> int:
        return _elements(op.x, rows)

    def keeps_zero(self, op: Aggregate, zero: Callable[[Value], bool]) -> bool:
        return op.to == NODE and op.side == "dst"  # edges reach destinations only


class _EdgeSoftmaxRules(OpRules):
    def interpret(self, op: EdgeSoftmax, run: "RunContext") -> torch.Tensor:
        s = run.value(op.x)
        if op.group == "dst":
            index, n = run.arrays.e_dst.long(), run.arrays.num_nodes
        else:  # a destination pair's edges: the in-edges of one relation
            index, n = run.edge_to_pair(DST_PAIR), run.arrays.rows(DST_PAIR)
        idx = index.reshape(-1, 1, 1).expand_as(s)
        top = torch.full((n, *s.shape[1:]), float("-inf"), dtype=s.dtype).scatter_reduce(0, idx, s, "amax")
        e = torch.exp(s - top[index])
        total = torch.zeros((n, *s.shape[1:]), dtype=s.dtype).index_add(0, index, e)
        return e / total[index]

    def adjoint(self, op: EdgeSoftmax, g: Value, ad: "AdjointBuilder") -> None:
        a = op.out
        weighted = ad.mul(a, g)
        if op.group == "dst":
            per_dst = ad.emit(Aggregate, NODE, g.heads, g.dim, x=weighted, to=NODE, reduce="sum")
            back = ad.emit(Gather, EDGE, g.heads, g.dim, x=per_dst, end="dst")
        else:  # the sum runs over the softmax's own group: the edges of one destination pair
            per_pair = ad.emit(Aggregate, DST_PAIR, g.heads, g.dim, x=weighted, to=DST_PAIR, reduce="sum")
            back = ad.emit(Expand, EDGE, g.heads, g.dim, x=per_pair)
        diff = ad.emit(Binary, EDGE, g.heads, g.dim, op="sub", a=g, b=back)
        ad.accumulate(op.x, ad.mul(a, diff))

    def flops(self, op: EdgeSoftmax, rows: Rows) -> int:
        return 5 * _elements(op.x, rows)  # the max, the shift, the exp (as one), the sum, the division


class _FoldWeightsRules(OpRules):
    def interpret(self, op: FoldWeights, run: "RunContext") -> torch.Tensor:
        return run.fold(op)

    def adjoint(self, op: FoldWeights, g: Value, ad: "AdjointBuilder") -> None:
        pass  # a derived weight is a leaf of the adjoint: its sources' gradients come through the fold


class _WeightGradRules(OpRules):
    def interpret(self, op: WeightGrad, run: "RunContext") -> torch.Tensor:
        g = run.weight_grad(op)
        return run.param(op.out_param) + g if op.accumulate else g

    def flops(self, op: WeightGrad, rows: Rows) -> int:
        if op.x is None:  # the rows of dy summed per type
            return _elements(op.dy, rows)
        inputs = op.x.dim if op.per_head else op.x.heads * op.x.dim  # per head: one (I, O) matrix each
        return rows(op.dy.domain) * 2 * inputs * op.dy.heads * op.dy.dim


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
    if op == "inc_positive":
        return torch.where(x > 0, x + 1, x)
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


for _op, _rules, _name in (
        (Gather, _GatherRules(), "gather"), (GatherPair, _GatherPairRules(), "gather_pair"),
        (Expand, _ExpandRules(), "expand"), (ParamRead, _ParamReadRules(), "param"),
        (GraphConst, _GraphConstRules(), "graph_const"), (Inner, _InnerRules(), "inner"),
        (Binary, _BinaryRules(), "binary"), (Unary, _UnaryRules(), "unary"), (Scale, _ScaleRules(), "scale"),
        (ReduceSum, _ReduceSumRules(), "reduce_sum"), (Broadcast, _BroadcastRules(), "broadcast"),
        (View, _ViewRules(), "view"), (Concat, _ConcatRules(), "concat"), (Slice, _SliceRules(), "slice"),
        (GatedResidual, _GatedResidualRules(), "gated_residual"), (TypedLinear, _TypedLinearRules(), "typed_linear"),
        (Aggregate, _AggregateRules(), "aggregate"), (EdgeSoftmax, _EdgeSoftmaxRules(), "edge_softmax"),
        (FoldWeights, _FoldWeightsRules(), "fold"), (WeightGrad, _WeightGradRules(), "weight_grad")):
    register_op(_op, _rules, _name)
