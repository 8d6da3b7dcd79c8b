"""Linear operator reordering: the same math with the linear operators associated differently.

Knobs (each declared only where its pattern occurs):

* ``reorder.attention_side`` (``src`` | ``dst``): ``<k_src W_r, q_dst>`` becomes
  ``<k_src, q_dst W_r^T>`` per head, moving the per-relation matrix to the destination side
  (fewer rows when there are fewer unique (dst, rel) than (src, rel) pairs).
* ``reorder.compose`` (``off`` | ``on``): ``(x W_ntype) W_r`` on gathered rows becomes
  ``x (W_ntype W_r)`` with the product (and the bias ``b W_r``) computed once per call, per
  relation and per head (HGT's ``K W_att`` and ``V W_msg``).
* ``reorder.fold_attention`` (``off`` | ``on``): ``<h W_r, a_r> = h (W_r a_r)`` per head (RGAT):
  the attention logit needs no ``h W_r`` row.
* ``reorder.bases`` (``fold`` | ``transform``), where a per-relation linear of gathered node rows
  has a basis-decomposed weight ``W_r = sum_b comp[r, b] V_b`` (RGCN's ``num_bases``): ``fold``
  derives every ``W_r`` once per call (``R * B * Din * Dout`` multiply-adds on weights) and
  multiplies the rows relation by relation (one GEMM per relation, over edges or unique pairs);
  ``transform`` multiplies every node by all the bases at once, ``h [V_1 ... V_B]`` (one GEMM over
  the nodes with ``B * Dout`` columns), and each edge (or pair) combines the ``B`` slices of its
  node's row with ``comp[r]``: ``h W_r = sum_b comp[r, b] (h V_b)``. Fewer relations and more
  edges favour ``fold``; many relations, many bases and few nodes, ``transform``. ``transform``
  leaves no per-relation linear for ``reorder.aggregate_first`` to reorder (a constraint says so).
* ``reorder.aggregate_first`` (``off`` | ``on``): ``sum_e s_e (X_e W_r)`` becomes
  ``sum_{(dst, r)} (sum_{e in (dst, r)} s_e X_e) W_r``: aggregate, then transform once per
  unique (destination, relation) pair (RGCN's aggregate-then-transform; HGT's messages).

Patterns are matched on the program as it stands when the pass runs; where an earlier
rewrite removed a later one's pattern, the later knob has no effect.
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.ir.passes.base import Constraint, Knob, Pass
from rgtune.ir.program import (DST_PAIR, EDGE, NODE, Aggregate, Binary, FoldWeights, Gather, Inner, Param,
                               ParamRead, Program, ReduceSum, Rewriter, TypedLinear, Value)


class ReorderPass(Pass):
    name = "reorder"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        found = []
        if _attention_side_matches(program):
            found.append(Knob("reorder.attention_side", ("src", "dst"), "src",
                              "side of <k W, q> that the per-relation matrix W multiplies"))
        if _compose_matches(program):
            found.append(Knob("reorder.compose", ("off", "on"), "off",
                              "fold a node-type linear into the per-relation linear after the gather"))
        if _fold_attention_matches(program):
            found.append(Knob("reorder.fold_attention", ("off", "on"), "off",
                              "fold attention vectors into the weights: <h W, a> = h (W a)"))
        if _bases_matches(program):
            found.append(Knob("reorder.bases", ("fold", "transform"), "fold",
                              "combine the bases into per-relation weights first, or transform every node by all "
                              "bases and combine per edge"))
        if _aggregate_first_matches(program):
            found.append(Knob("reorder.aggregate_first", ("off", "on"), "off",
                              "aggregate per (destination, relation) first, then apply the per-relation linear"))
        return found

    def constraints(self, program: Program, graph: Any) -> list[Constraint]:
        if not (_bases_matches(program) and _aggregate_first_matches(program)):
            return []
        return [Constraint("bases_transform_aggregate_first",
                           "reorder.bases=transform removes the per-relation linear that reorder.aggregate_first moves",
                           _bases_transform_without_aggregate_first)]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        if config.get("reorder.attention_side") == "dst":
            program = _move_attention_to_dst(program)
        if config.get("reorder.compose") == "on":
            program = _compose(program)
        if config.get("reorder.fold_attention") == "on":
            program = _fold_attention(program)
        if config.get("reorder.bases") == "transform":
            program = _transform_by_bases(program)
        if config.get("reorder.aggregate_first") == "on":
            program = _aggregate_first(program)
        return program


# ------------------------------------------------------------------- attention side
def _attention_side_candidates(program: Program) -> list[tuple[Inner, TypedLinear, Gather]]:
    prod, users = program.producers(), program.users()
    found = []
    for op in program.ops:
        if not isinstance(op, Inner):
            continue
        for lin_v, other_v in ((op.a, op.b), (op.b, op.a)):
            lin, other = prod.get(lin_v.name), prod.get(other_v.name)
            if (isinstance(lin, TypedLinear) and lin.by == "rel" and lin.per_head and lin.bias is None
                    and lin.out.domain == EDGE and isinstance(prod.get(lin.x.name), Gather)
                    and prod[lin.x.name].end == "src" and isinstance(other, Gather) and other.end == "dst"
                    and len(users[lin_v.name]) == 1):
                found.append((op, lin, other))
                break
    return found


def _attention_side_matches(program: Program) -> bool:
    return bool(_attention_side_candidates(program))


def _move_attention_to_dst(program: Program) -> Program:
    targets = {inner.out.name: (lin, q) for inner, lin, q in _attention_side_candidates(program)}
    rw = Rewriter(program)
    for op in program.ops:
        if op.out.name in targets and isinstance(op, Inner):
            lin, q = targets[op.out.name]
            wt = rw.add_fold(FoldWeights(out=op.out, out_param=f"{lin.weight}__T", mode="transpose", a=lin.weight),
                             _derived(program.params[lin.weight], f"{lin.weight}__T"))
            q_side = rw.add(TypedLinear, EDGE, lin.out.heads, lin.out.dim, x=rw.get(q.out), weight=wt, bias=None,
                            by="rel", per_head=True)
            new = rw.add(Inner, op.out.domain, op.out.heads, 1, a=rw.get(lin.x), b=q_side)
            rw.alias(op.out, new)
        else:
            rw.emit(op)
    return rw.finish()


# ------------------------------------------------------------------------- compose
def _compose_candidates(program: Program) -> list[tuple[TypedLinear, Gather, TypedLinear]]:
    prod = program.producers()
    found = []
    for op in program.ops:
        if not (isinstance(op, TypedLinear) and op.by == "rel" and op.per_head and op.bias is None):
            continue
        g = prod.get(op.x.name)
        if not isinstance(g, Gather):
            continue
        inner = prod.get(g.x.name)
        if isinstance(inner, TypedLinear) and inner.by == "ntype" and not inner.per_head and inner.x.heads == 1:
            found.append((op, g, inner))
    return found


def _compose_matches(program: Program) -> bool:
    return bool(_compose_candidates(program))


def _compose(program: Program) -> Program:
    targets = {lin.out.name: (g, node_lin) for lin, g, node_lin in _compose_candidates(program)}
    rw = Rewriter(program)
    for op in program.ops:
        if op.out.name in targets and isinstance(op, TypedLinear):
            g, node_lin = targets[op.out.name]
            heads_dim = op.out.heads * op.out.dim
            w = rw.add_fold(FoldWeights(out=op.out, out_param=f"{node_lin.weight}__{op.weight}", mode="compose",
                                        a=node_lin.weight, b=op.weight, end=g.end),
                            Param(f"{node_lin.weight}__{op.weight}", "rel", (node_lin.x.dim, heads_dim), derived=True))
            b = None
            if node_lin.bias:
                b = rw.add_fold(FoldWeights(out=op.out, out_param=f"{node_lin.bias}__{op.weight}", mode="compose_bias",
                                            a=node_lin.bias, b=op.weight, end=g.end),
                                Param(f"{node_lin.bias}__{op.weight}", "rel", (heads_dim,), derived=True))
            gathered = rw.add(Gather, EDGE, 1, node_lin.x.dim, x=rw.get(node_lin.x), end=g.end)
            new = rw.add(TypedLinear, op.out.domain, op.out.heads, op.out.dim, x=gathered, weight=w, bias=b, by="rel")
            rw.alias(op.out, new)
        else:
            rw.emit(op)
    return rw.finish()


# --------------------------------------------------------------- fold attention
def _fold_attention_candidates(program: Program) -> list[tuple[Inner, TypedLinear, ParamRead]]:
    prod = program.producers()
    found = []
    for op in program.ops:
        if not isinstance(op, Inner):
            continue
        for lin_v, vec_v in ((op.a, op.b), (op.b, op.a)):
            lin, vec = prod.get(lin_v.name), prod.get(vec_v.name)
            if (isinstance(lin, TypedLinear) and lin.by == "rel" and not lin.per_head and lin.bias is None
                    and isinstance(vec, ParamRead) and vec.by == "rel"):
                found.append((op, lin, vec))
                break
    return found


def _fold_attention_matches(program: Program) -> bool:
    return bool(_fold_attention_candidates(program))


def _fold_attention(program: Program) -> Program:
    targets = {inner.out.name: (lin, vec) for inner, lin, vec in _fold_attention_candidates(program)}
    rw = Rewriter(program)
    for op in program.ops:
        if op.out.name in targets:
            lin, vec = targets[op.out.name]
            name = f"{lin.weight}__{vec.param}"
            w = rw.add_fold(FoldWeights(out=op.out, out_param=name, mode="vec", a=lin.weight, b=vec.param),
                            Param(name, "rel", (lin.x.heads * lin.x.dim, lin.out.heads), derived=True))
            new = rw.add(TypedLinear, op.out.domain, lin.out.heads, 1, x=rw.get(lin.x), weight=w, bias=None, by="rel")
            rw.alias(op.out, new)
        else:
            rw.emit(op)
    return rw.finish()


# ------------------------------------------------------------------------- bases
def _bases_candidates(program: Program) -> list[tuple[TypedLinear, Gather, FoldWeights]]:
    """Per-relation linears of gathered node rows whose weight is a combination of bases."""
    prod = program.producers()
    folds = {op.out_param: op for op in program.ops if isinstance(op, FoldWeights) and op.mode == "bases"}
    found = []
    for op in program.ops:
        if not (isinstance(op, TypedLinear) and op.by == "rel" and not op.per_head and op.bias is None
                and op.weight in folds and op.x.heads == 1 and op.out.heads == 1):
            continue
        g = prod.get(op.x.name)
        if isinstance(g, Gather) and g.x.domain == NODE:
            found.append((op, g, folds[op.weight]))
    return found


def _bases_matches(program: Program) -> bool:
    return bool(_bases_candidates(program))


def _bases_transform_without_aggregate_first(cfg: Mapping[str, Any]) -> str | None:
    if cfg.get("reorder.bases") == "transform" and cfg.get("reorder.aggregate_first") == "on":
        return ("reorder.bases=transform combines the bases per edge after one GEMM over the nodes: no per-relation "
                "linear is left for reorder.aggregate_first=on to move after the aggregation; choose "
                "reorder.aggregate_first=off or reorder.bases=fold")
    return None


def _transform_by_bases(program: Program) -> Program:
    """``gather(x) W_r`` with ``W_r = sum_b comp[r, b] V_b`` becomes ``sum_b comp[r, b] gather(x [V_1 ... V_B])_b``."""
    targets = {lin.out.name: (g, fold) for lin, g, fold in _bases_candidates(program)}
    rw = Rewriter(program)
    transformed: dict[tuple[str, str], Value] = {}  # (node value, bases) -> the node value times every basis
    for op in program.ops:
        if op.out.name not in targets or not isinstance(op, TypedLinear):
            rw.emit(op)
            continue
        g, fold = targets[op.out.name]
        num_bases, din, dout = program.params[fold.a].shape
        key = (g.x.name, fold.a)
        if key not in transformed:
            joined = rw.add_fold(FoldWeights(out=op.out, out_param=f"{fold.a}__joined", mode="join_heads", a=fold.a),
                                 Param(f"{fold.a}__joined", program.params[fold.a].by, (din, num_bases * dout),
                                       derived=True))
            transformed[key] = rw.add(TypedLinear, NODE, num_bases, dout, x=rw.get(g.x), weight=joined, bias=None,
                                      by=program.params[fold.a].by)
        slices = rw.add(Gather, EDGE, num_bases, dout, x=transformed[key], end=g.end)
        comp = rw.add(ParamRead, EDGE, num_bases, 1, param=fold.b, by="rel", domain=EDGE)
        weighted = rw.add(Binary, EDGE, num_bases, dout, op="mul", a=slices, b=comp)
        rw.alias(op.out, rw.add(ReduceSum, EDGE, 1, dout, x=weighted, over="heads"))
    return rw.finish()


# --------------------------------------------------------------- aggregate first
def _aggregate_first_candidates(program: Program) -> list[tuple[Aggregate, TypedLinear, Value | None]]:
    prod, users = program.producers(), program.users()
    found = []
    for op in program.ops:
        if not (isinstance(op, Aggregate) and op.to == NODE and op.reduce == "sum" and op.x.domain == EDGE):
            continue
        m = prod.get(op.x.name)
        lin, scale = None, None
        if isinstance(m, TypedLinear):
            lin = m
        elif isinstance(m, Binary) and m.op == "mul" and len(users[m.out.name]) == 1:
            for a, b in ((m.a, m.b), (m.b, m.a)):
                cand = prod.get(a.name)
                if isinstance(cand, TypedLinear) and b.dim == 1:
                    lin, scale = cand, b
                    break
        if lin is None or lin.by != "rel" or lin.bias is not None or len(users[lin.out.name]) != 1:
            continue
        if scale is not None and scale.heads > 1 and not lin.per_head and lin.x.heads != 1:
            continue
        found.append((op, lin, scale))
    return found


def _aggregate_first_matches(program: Program) -> bool:
    return bool(_aggregate_first_candidates(program))


def _aggregate_first(program: Program) -> Program:
    targets = {agg.out.name: (lin, scale) for agg, lin, scale in _aggregate_first_candidates(program)}
    rw = Rewriter(program)
    for op in program.ops:
        if op.out.name not in targets:
            rw.emit(op)
            continue
        lin, scale = targets[op.out.name]
        x = rw.get(lin.x)
        weight, per_head = lin.weight, lin.per_head
        if scale is not None:
            s = rw.get(scale)
            heads = max(x.heads, s.heads)
            x = rw.add(Binary, EDGE, heads, x.dim, op="mul", a=x, b=s)
            if heads > 1 and not lin.per_head:
                # each head of the scaled input meets its own column block of W: split W by heads
                weight = rw.add_fold(FoldWeights(out=op.out, out_param=f"{lin.weight}__heads", mode="split_heads",
                                                 a=lin.weight, b=None),
                                     Param(f"{lin.weight}__heads", "rel", (heads, lin.x.dim, lin.out.dim), derived=True))
                per_head = True
        pairs = rw.add(Aggregate, DST_PAIR, x.heads, x.dim, x=x, to=DST_PAIR, reduce="sum")
        transformed = rw.add(TypedLinear, DST_PAIR, lin.out.heads, lin.out.dim, x=pairs, weight=weight, bias=None,
                             by="rel", per_head=per_head)
        new = rw.add(Aggregate, NODE, lin.out.heads, lin.out.dim, x=transformed, to=NODE, reduce="sum")
        rw.alias(op.out, new)
    return rw.finish()


def _derived(p: Param, name: str) -> Param:
    return Param(name, p.by, p.shape, derived=True)

