"""Compact materialization: compute an edge value once per unique (node, relation) pair.

An edge value that depends only on its source node and relation (``W_r h_src``) is the same
for every edge sharing that (src, rel) pair. Computed per pair, the GEMM that makes it has
#pairs rows instead of #edges; its readers go through the edge -> pair map. The same holds
on the destination side.

Knobs:

* ``compact.src``, ``compact.dst`` (``edge`` | ``pair``): where the values that depend only
  on (src, rel) (resp. (dst, rel)) are materialized. Declared only when such values exist.
* ``compact.pair_index`` (``direct`` | ``bsearch``): how a reader finds its pair's row: an
  index array of one entry per edge, or a binary search for the node inside the relation's
  block of pairs (no per-edge array to read). Active only when some side is ``pair``.
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import (EDGE, PAIR_OF_SIDE, Binary, Concat, Expand, Gather, GatherPair, GraphConst, Inner,
                               Op, ParamRead, Program, ReduceSum, Rewriter, Scale, TypedLinear, Unary, Value)

_COMPUTE = (TypedLinear, Inner, Binary, Unary, Scale, Concat, ReduceSum)


def edge_keys(program: Program) -> dict[str, frozenset[str]]:
    """For each edge value, what it depends on among ``src``, ``dst``, ``rel`` and ``edge``."""
    prod = program.producers()
    keys: dict[str, frozenset[str]] = {}
    for op in program.ops:
        if op.out.domain != EDGE or op.out.name not in prod:
            continue
        if isinstance(op, Gather):
            k = frozenset({op.end})
        elif isinstance(op, ParamRead):
            k = frozenset({"rel"} if op.by == "rel" else ({op.end} if op.by == "ntype" and op.end else set()))
        elif isinstance(op, GraphConst):
            k = frozenset({"dst", "rel"})
        elif isinstance(op, _COMPUTE):
            k = frozenset().union(*(keys.get(v.name, frozenset({"edge"})) for v in op.inputs()))
            if isinstance(op, TypedLinear) and op.by == "rel":
                k |= {"rel"}
        else:  # edge softmax and anything new: depends on the whole edge
            k = frozenset({"edge"})
        keys[op.out.name] = k
    return keys


def compactable(program: Program, side: str) -> set[str]:
    """Edge values computed from (``side`` node, relation) alone that contain a computation."""
    keys = edge_keys(program)
    prod = program.producers()
    movable: set[str] = set()
    for op in program.ops:
        if not isinstance(op, _COMPUTE) or op.out.domain != EDGE:
            continue
        k = keys[op.out.name]
        if side not in k or not k <= {side, "rel"}:
            continue
        ok = True
        for v in op.inputs():
            p = prod.get(v.name)
            if v.name in movable or (isinstance(p, Gather) and p.end == side) or \
                    (isinstance(p, ParamRead) and (p.by == "rel" or (p.by == "ntype" and p.end == side))):
                continue
            ok = False
        if ok:
            movable.add(op.out.name)
    return movable


class CompactPass(Pass):
    name = "compact"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        sides = [s for s in ("src", "dst") if compactable(program, s)]
        found = [Knob(f"compact.{s}", ("edge", "pair"), "edge",
                      f"materialize values that depend on ({s}, relation) per edge or per unique pair") for s in sides]
        if sides:
            names = [f"compact.{s}" for s in sides]
            found.append(Knob("compact.pair_index", ("direct", "bsearch"), "direct",
                              "edge -> pair row by an index array, or by binary search in the relation's block",
                              active_if=lambda cfg, names=tuple(names): any(cfg.get(n) == "pair" for n in names)))
        return found

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        for side in ("src", "dst"):
            if config.get(f"compact.{side}") == "pair":
                program = _to_pairs(program, side)
        if any(config.get(f"compact.{s}") == "pair" for s in ("src", "dst")):
            program = program.copy(annotations={**program.annotations,
                                                "pair_index": config.get("compact.pair_index", "direct")})
        return program


def _to_pairs(program: Program, side: str) -> Program:
    moving = compactable(program, side)
    if not moving:
        return program
    pair_domain = PAIR_OF_SIDE[side]
    prod = program.producers()
    rw = Rewriter(program)
    pair_of: dict[str, Value] = {}  # old value name -> its pair-domain version
    expanded: dict[str, Value] = {}

    def pair_operand(v: Value) -> Value:
        if v.name in pair_of:
            return pair_of[v.name]
        p = prod[v.name]
        if isinstance(p, Gather):
            new = rw.add(GatherPair, pair_domain, v.heads, v.dim, x=rw.get(p.x), side=side)
        elif isinstance(p, ParamRead):
            new = rw.add(ParamRead, pair_domain, v.heads, v.dim, param=p.param, by=p.by, domain=pair_domain,
                         end=None)
        else:  # pragma: no cover - compactable() admits nothing else
            raise AssertionError(p)
        pair_of[v.name] = new
        return new

    def edge_operand(v: Value) -> Value:
        if v.name not in moving:
            return rw.get(v)
        if v.name not in expanded:
            expanded[v.name] = rw.add(Expand, EDGE, v.heads, v.dim, x=pair_of[v.name])
        return expanded[v.name]

    for op in program.ops:
        if op.out.name in moving:
            fields = {f: pair_operand(getattr(op, f)) for f in _value_fields(op)}
            new_op = op.replace(**fields)
            out = rw.new(pair_domain, op.out.heads, op.out.dim)
            rw.ops.append(new_op.replace(out=out))
            pair_of[op.out.name] = out
        else:
            fields = {f: edge_operand(getattr(op, f)) for f in _value_fields(op)}
            rw.emit(op, **fields)
    return rw.finish()


def _value_fields(op: Op) -> list[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(op) if f.name != "out" and isinstance(getattr(op, f.name), Value)]
