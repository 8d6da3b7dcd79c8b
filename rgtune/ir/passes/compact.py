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

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from rgtune.ir.op_rules import rules_of
from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import EDGE, PAIR_OF_SIDE, Expand, Gather, GatherPair, Op, ParamRead, Program, Rewriter, Value

if TYPE_CHECKING:
    from rgtune.ir.plan import LoweringPlan

#: where a side's values are materialized (``compact.src``, ``compact.dst``)
EDGE_OR_PAIR = ("edge", "pair")
PAIR_INDEX = Knob("compact.pair_index", ("direct", "bsearch"), "direct",
                  "edge -> pair row by an index array, or by binary search in the relation's block")


def side_knob(side: str) -> Knob:
    """``compact.<side>``: where the values that depend on (``side`` node, relation) are materialized."""
    return Knob(f"compact.{side}", EDGE_OR_PAIR, EDGE_OR_PAIR[0],
                f"materialize values that depend on ({side}, relation) per edge or per unique pair")


def edge_keys(program: Program) -> dict[str, frozenset[str]]:
    """For each edge value, what it depends on among ``src``, ``dst``, ``rel`` and ``edge``."""
    prod = program.producers()
    keys: dict[str, frozenset[str]] = {}
    for op in program.ops:
        if op.out.domain != EDGE or op.out.name not in prod:
            continue
        inputs = [keys.get(v.name, frozenset({"edge"})) for v in op.inputs()]
        k = rules_of(op).depends_on(op, inputs)
        keys[op.out.name] = k
    return keys


def compactable(program: Program, side: str) -> set[str]:
    """Edge values computed from (``side`` node, relation) alone that contain a computation."""
    keys = edge_keys(program)
    prod = program.producers()
    movable: set[str] = set()
    for op in program.ops:
        if not rules_of(op).row_local or op.out.domain != EDGE:
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
        found = [side_knob(s) for s in ("src", "dst") if compactable(program, s)]
        if found:
            names = tuple(k.name for k in found)
            found.append(dataclasses.replace(PAIR_INDEX, active_if=lambda cfg: _any_pair(cfg, names)))
        return found

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        for side in ("src", "dst"):
            if config.get(side_knob(side).name) == "pair":
                program = _to_pairs(program, side)
        return program

    def plan(self, plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
        if not _any_pair(config, tuple(side_knob(s).name for s in ("src", "dst"))):
            return plan  # no pair is read from an edge: the index is not used
        return dataclasses.replace(plan, pair_index=config.get(PAIR_INDEX.name, PAIR_INDEX.default))


def _any_pair(config: Mapping[str, Any], knobs: tuple[str, ...]) -> bool:
    return any(config.get(k) == "pair" for k in knobs)


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
