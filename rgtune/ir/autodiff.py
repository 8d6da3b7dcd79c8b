"""The adjoint of a program, in IR ops: a training program that computes the forward, then the gradients.

:func:`adjoint` takes a program (usually after the passes, so that their choices carry over to the
backward: compact pairs, reordered linears, aggregate-first) and returns a *training program*: the
forward ops, then, in reverse order, each op's adjoint, reading the output's gradient ``dout`` (an
extra input) and defining the input's gradient and one gradient param per param. Each op's rule is
its :meth:`OpRules.adjoint <rgtune.ir.op_rules.OpRules.adjoint>` (:mod:`rgtune.ir.op_rules`), which
emits ops through an :class:`AdjointBuilder`. The rules are the transposes the IR already has:

=====================  ==========================================================================
forward                adjoint (``g``: the gradient of the op's output)
=====================  ==========================================================================
gather(x, end)         aggregate(g) into the nodes at ``end`` (a sum over each node's edges)
gather_pair(x, side)   aggregate(g) from pairs into their nodes
expand(p) (pair row)   aggregate(g) from edges into their pair (compact accumulation: the weight
                       gradient of a pair-domain linear reads #pairs rows, not #edges)
aggregate(x)           gather(g) (edge <- node), expand(g) (edge <- pair), gather_pair(g) (pair <- node)
typed_linear(x, W, b)  dx = typed_linear(g, W^T); dW = weight_grad(x, g) per type; db = weight_grad(1, g)
param(p) (read)        dp = weight_grad(1, g): the rows of each type summed
inner(a, b)            da = g * b, db = g * a (summed over a broadcast)
add / sub / mul        the gradient, negated / multiplied by the other operand, summed over a broadcast
unary f(x)             g * f'(x) (f' written as a unary op of x: ``leaky_relu_grad`` ...)
scale(x, c)            scale(g, c)
reduce_sum(x)          broadcast(g) over the heads (features) it summed
broadcast(x)           reduce_sum(g) over the heads (features) it repeated
view(x)                view(g) with the heads of x
concat(a, b)           da = slice(g) of a's features, db = slice(g) of b's
edge_softmax(s) = a    a * (g - gather(aggregate(a * g))): the sum over each destination's in-edges; with
                       ``group="dst_rel"``, a * (g - expand(aggregate(a * g, to=dst_pair))): over each
                       destination pair's (one relation's in-edges), the group the softmax normalized
gated_residual(h, x)   dh = sigma g, dx = g - dh, dskip = weight_grad(1, <g, h - x> sigma')
fold (derived W)       none: a derived weight's gradient is a gradient param like any other; its
                       sources get theirs through the fold (torch, once per call)
=====================  ==========================================================================

Contributions to one value or param add up (a value read twice, a weight used twice).

Saved or recomputed: the backward reads forward values (the softmax, a GEMM's input, the scores).
Each is either *saved* (the forward's buffer, held from the forward to the backward: memory) or
*recomputed* in the backward from saved values (time). The knob ``autodiff.save`` chooses: ``all``
saves every value the backward reads; ``nodes`` saves node and pair values and recomputes edge values
(an |E|-row buffer per value is what a large graph cannot hold); ``input`` saves only the input and
recomputes the rest. A recomputed value is a copy of its forward op (and of the unsaved ops it reads)
at the start of the backward, so the passes' choices (compaction, fusion, layout) apply to it as to
the forward.

Example:
    >>> from rgtune.ir.models import build_model
    >>> t = adjoint(build_model("rgcn", 4, 3))
    >>> sorted(t.param_grads), t.input_grad.domain
    (['bias', 'root', 'weight'], 'node')
    >>> hgt = build_model("hgt", 8, 8, 2)
    >>> [len(saved_values(adjoint(hgt, save=s))) for s in SAVE.choices]  # values the backward reads saved
    [11, 6, 0]
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Mapping

from rgtune.ir.passes.base import KNOB_CACHE, Knob
from rgtune.ir.op_rules import rules_of, sums_features
from rgtune.ir.program import (EDGE, NODE, PARAM_OPS, Binary, FoldWeights, IRError, Op, Param, Program, ReduceSum, Scale,
                               Value, WeightGrad)

if TYPE_CHECKING:
    from rgtune.ir.plan import LoweringPlan

__all__ = ["AdjointBuilder", "plan_backward", "adjoint", "without_input_grad", "grad_name", "transposed_name", "SAVE", "REUSE", "training_knobs", "saved_values"]

#: which forward values the backward reads saved (see the module docstring)
SAVE = Knob("autodiff.save", ("all", "nodes", "input"), "all",
            "forward values the backward reads: all saved (memory), edge values recomputed (nodes), or everything "
            "recomputed from the input (input)")
#: a backward value with a reduction over features that several kernels read (RGAT's and HGT's
#: attention-score gradient, ``<dout, m>`` and what follows from it): recomputed inline in each
#: kernel that reads it, or stored once per row by a kernel of its own (lowering decides which
#: values qualify: :func:`rgtune.ir.lowering.shared_reductions`), or computed once per edge by one
#: traversal that writes every per-edge value of the same shape (:mod:`rgtune.ir.edge_stores`)
REUSE = Knob("autodiff.reuse", ("inline", "store", "fuse"), "inline",
             "backward values with a feature reduction read by several kernels: recomputed in each, stored once, "
             "or computed once in one traversal that stores every per-edge value of their shape")


def grad_name(param: str) -> str:
    """The name of ``param``'s gradient in a training program."""
    return f"grad_{param}"


def transposed_name(weight: str) -> str:
    """The name of a weight's transpose (a derived param the input's gradient reads)."""
    return f"{weight}__T"


class AdjointBuilder:
    """Builds a training program: the forward's ops, then each op's adjoint (its rules'
    :meth:`~rgtune.ir.op_rules.OpRules.adjoint`, last op first), which call the methods here to emit
    ops and add up gradients."""

    def __init__(self, program: Program) -> None:
        if program.is_training:
            raise IRError(f"program {program.name} already computes gradients")
        self.p = program
        self.ops: list[Op] = list(program.ops)
        self.params = dict(program.params)
        self.grads: dict[str, Value] = {}
        self.param_grads: dict[str, str] = {}
        self._counter = 0
        self.dout = Value("dout", NODE, program.output.heads, program.output.dim)

    # -------------------------------------------------------------- building
    def new(self, domain: str, heads: int, dim: int) -> Value:
        v = Value(f"%g{self._counter}", domain, heads, dim)
        self._counter += 1
        return v

    def emit(self, op_type: type, out_domain: str, heads: int, dim: int, **fields: object) -> Value:
        """A new op of ``op_type`` whose output is ``out_domain[heads x dim]``."""
        out = self.new(out_domain, heads, dim)
        self.ops.append(op_type(out=out, **fields))
        return out

    def accumulate(self, v: Value, g: Value) -> None:
        """Add ``g`` to the gradient of ``v`` (``g`` already in ``v``'s shape)."""
        assert (g.domain, g.heads, g.dim) == (v.domain, v.heads, v.dim), (v, g)
        old = self.grads.get(v.name)
        self.grads[v.name] = g if old is None else self.emit(Binary, v.domain, v.heads, v.dim, op="add", a=old, b=g)

    def reduce_to(self, g: Value, like: Value) -> Value:
        """``g`` summed over what ``like`` broadcast (features, then heads)."""
        if like.dim == 1 and g.dim > 1:
            g = self.emit(ReduceSum, g.domain, g.heads, 1, x=g, over="dim")
        if like.heads == 1 and g.heads > 1:
            g = self.emit(ReduceSum, g.domain, 1, g.dim, x=g, over="heads")
        return g

    def mul(self, a: Value, b: Value) -> Value:
        return self.emit(Binary, a.domain, max(a.heads, b.heads), max(a.dim, b.dim), op="mul", a=a, b=b)

    def scale(self, x: Value, c: float) -> Value:
        return self.emit(Scale, x.domain, x.heads, x.dim, x=x, scale=c)

    def param_grad(self, param: str, x: Value | None, dy: Value, by: str, per_head: bool = False,
                   end: Literal["src", "dst"] | None = None) -> None:
        """A contribution to ``param``'s gradient (the first defines it, later ones add to it)."""
        grad = grad_name(param)
        if param not in self.param_grads:
            p = self.params[param]
            self.params[grad] = Param(grad, p.by, p.shape, grad_of=param)
            self.param_grads[param] = grad
        first = not any(isinstance(op, WeightGrad) and op.out_param == grad for op in self.ops)
        self.ops.append(WeightGrad(out=dy, out_param=grad, param=param, x=x, dy=dy, by=by,  # type: ignore[arg-type]
                                   per_head=per_head, end=end, accumulate=not first))

    def transposed(self, weight: str) -> str:
        """The derived param ``weight``'s transpose (a fold), what an input's gradient multiplies by."""
        name = transposed_name(weight)
        if name not in self.params:
            p = self.params[weight]
            shape = (*p.shape[:-2], p.shape[-1], p.shape[-2])
            self.params[name] = Param(name, p.by, shape, derived=True)
            self.ops.append(FoldWeights(out=self.p.x, out_param=name, mode="transpose", a=weight))
        return name

    # -------------------------------------------------------------- the program
    def run(self) -> Program:
        self.grads[self.p.output.name] = self.dout
        for op in reversed(self.p.ops):
            if isinstance(op, FoldWeights):
                continue  # derived weights are leaves here (see the module docstring)
            g = self.grads.pop(op.out.name, None)
            if g is not None:
                rules_of(op).adjoint(op, g, self)
        dx = self.grads.get(self.p.x.name)
        if dx is None:  # the output does not depend on the input
            dx = self.scale(self.p.x, 0.0)
        return Program(self.p.name, self.p.x, self.params, self.ops, self.p.output, self.p.heads,
                       inputs=(self.dout,), input_grad=dx, param_grads=self.param_grads, forward_ops=len(self.p.ops))


def training_knobs(program: Program) -> list[Knob]:
    """The knobs the adjoint adds to a program's (a training search space's): ``autodiff.reuse``
    only where the backward has a feature reduction read twice. Cached per program (every compile of a
    training point asks, and the answer needs the adjoint)."""
    key = ("training", str(program))
    if key not in KNOB_CACHE:
        backward = _backward_reads(adjoint(program))[1]
        users: dict[str, int] = {}
        for op in backward:
            for v in op.inputs():
                users[v.name] = users.get(v.name, 0) + 1
        shared = any(sums_features(op) and users.get(op.out.name, 0) >= 2 for op in backward)
        KNOB_CACHE[key] = [SAVE, REUSE] if shared else [SAVE]
    return list(KNOB_CACHE[key])


def adjoint(program: Program, save: str = SAVE.default, config: Mapping[str, Any] | None = None,
            input_grad: bool = True) -> Program:
    """The training program of ``program`` (see the module docstring); ``save`` (or ``config``'s
    ``autodiff.save``) chooses which forward values the backward reads saved. ``input_grad=False``: the
    params' gradients only (:func:`without_input_grad`), for an input that needs none (a first layer's
    features)."""
    if config is not None:
        save = config.get(SAVE.name, save)
    training = AdjointBuilder(program).run()
    if not input_grad:
        training = without_input_grad(training)
    return _recompute(training, SAVE.check(save))


def without_input_grad(program: Program) -> Program:
    """Training program ``program`` without the input's gradient: the backward ops that feed no param's
    gradient go (in RGCN's backward, the transposed GEMMs and the scatter back to the sources), with the
    derived params only they defined; the forward stays as it is.

    Example:
        >>> from rgtune.ir.models import build_model
        >>> full = adjoint(build_model("rgcn", 4, 3))
        >>> params_only = without_input_grad(full)
        >>> params_only.input_grad is None, sorted(params_only.param_grads) == sorted(full.param_grads)
        (True, True)
        >>> len(params_only.ops) < len(full.ops)
        True
    """
    split = program.forward_ops
    if split is None:
        raise IRError(f"program {program.name} is not a training program (it has no backward)")
    values: set[str] = set()
    params: set[str] = set()
    kept: list[Op] = []
    for op in reversed(program.ops[split:]):
        if isinstance(op, WeightGrad):
            needed = True
        elif isinstance(op, FoldWeights):
            needed = op.out_param in params
        else:
            needed = op.out.name in values
        if needed:
            kept.append(op)
            values.update(v.name for v in op.inputs())
            params.update(op.params())
    dropped = {op.out_param for op in program.ops[split:] if isinstance(op, FoldWeights)} - params
    return program.copy(ops=program.ops[:split] + kept[::-1], input_grad=None,
                        params={k: p for k, p in program.params.items() if k not in dropped})


def plan_backward(plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
    """``plan`` with the adjoint's decision for lowering: where the backward's shared reductions live
    (``autodiff.reuse``)."""
    return dataclasses.replace(plan, reuse=REUSE.check(config.get(REUSE.name, REUSE.default)))


def _backward_reads(program: Program) -> tuple[list[Op], list[Op], set[str]]:
    """The forward ops, the backward ops, and the forward values the backward reads."""
    split = program.forward_ops
    if split is None:
        raise IRError(f"program {program.name} is not a training program (it has no backward)")
    forward, backward = program.ops[:split], program.ops[split:]
    defined = {op.out.name for op in forward if not isinstance(op, PARAM_OPS)}
    read = {v.name for op in backward for v in op.inputs() if v.name in defined}
    return forward, backward, read


def saved_values(program: Program) -> set[str]:
    """The forward values a training program's backward reads (the input excluded): what the
    forward hands to the backward."""
    return _backward_reads(program)[2]


def _keeps(v: Value, save: str) -> bool:
    return save == "all" or (save == "nodes" and v.domain != EDGE)


def _recompute(program: Program, save: str) -> Program:
    """``program`` whose backward recomputes the forward values ``save`` does not keep."""
    forward, backward, read = _backward_reads(program)
    producers = {op.out.name: op for op in forward if not isinstance(op, PARAM_OPS)}
    values = {op.out.name: op.out for op in forward if not isinstance(op, PARAM_OPS)}
    if all(_keeps(values[n], save) for n in read):
        return program
    copies: dict[str, Value] = {}
    recomputed: list[Op] = []

    def copy_of(v: Value) -> Value:
        """``v`` as the backward reads it: saved (itself, the input) or a recomputed copy."""
        if v.name not in producers or _keeps(v, save):
            return v
        if v.name not in copies:
            op = producers[v.name]
            inputs = {f: copy_of(getattr(op, f)) for f in _value_fields(op)}
            out = Value(f"%r{v.name.lstrip('%')}", v.domain, v.heads, v.dim)
            recomputed.append(op.replace(out=out, **inputs))
            copies[v.name] = out
        return copies[v.name]

    rewritten = []
    for op in backward:
        inputs = {f: copy_of(getattr(op, f)) for f in _value_fields(op)}
        rewritten.append(op.replace(**inputs) if inputs else op)
    return program.copy(ops=forward + recomputed + rewritten)


def _value_fields(op: Op) -> list[str]:
    return [f.name for f in dataclasses.fields(op) if f.name != "out" and isinstance(getattr(op, f.name), Value)]
