"""Fusion: which computations share a kernel. Decisions are recorded for lowering.

Knobs:

* ``fusion.softmax`` (``none`` | ``aggregate`` | ``full``), where an edge softmax feeds an
  aggregation ``sum softmax(s) * m``: ``none`` materializes the score and the softmax and
  aggregates in a third traversal; ``aggregate`` materializes the score and fuses softmax
  with aggregation; ``full`` computes score, softmax (online) and aggregation in one
  destination-parallel traversal. Fused forms need edges grouped by destination. A softmax
  per (destination, relation) (``edge_softmax(..., per_relation=True)``) fuses the same way:
  CSR groups a destination's in-edges by relation, so each relation's run is normalized and
  added in turn.
* ``fusion.epilogue`` (``off`` | ``on``), where a per-row product with a GEMM's fresh output
  row exists (attention logits ``<W_r h, a_r>``, HGT's ``<k_e, q_dst>``): ``on`` computes it
  in the GEMM's epilogue, and the GEMM does not store rows nobody else reads.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from rgtune.ir.bind import CSR_DST
from rgtune.ir.passes.base import Constraint, Knob, Pass
from rgtune.ir.passes.layout import EDGE_ORDER
from rgtune.ir.program import EDGE, NODE, Aggregate, Binary, EdgeSoftmax, Gather, Inner, ParamRead, Program, TypedLinear

if TYPE_CHECKING:
    from rgtune.ir.plan import LoweringPlan

SOFTMAX = Knob("fusion.softmax", ("none", "aggregate", "full"), "none",
               "materialize score and softmax, fuse softmax into the aggregation, or fuse all")
EPILOGUE = Knob("fusion.epilogue", ("off", "on"), "off",
                "compute inner products with a GEMM's output row in the GEMM's epilogue")


def softmax_aggregations(program: Program) -> list[tuple[EdgeSoftmax, Aggregate]]:
    """``aggregate(softmax(s) * m)`` occurrences, the form the fused traversals compute."""
    users = program.users()
    found = []
    for op in program.ops:
        if not isinstance(op, EdgeSoftmax):
            continue
        for u in users.get(op.out.name, []):
            if isinstance(u, Binary) and u.op == "mul" and len(users.get(u.out.name, [])) == 1:
                agg = users[u.out.name][0]
                if isinstance(agg, Aggregate) and agg.reduce == "sum":
                    found.append((op, agg))
    return found


def epilogue_candidates(program: Program) -> list[Inner]:
    """Inner products of a GEMM's output row with something the GEMM row can load."""
    prod = program.producers()
    found = []
    for op in program.ops:
        if not isinstance(op, Inner):
            continue
        for t, y in ((op.a, op.b), (op.b, op.a)):
            lin, other = prod.get(t.name), prod.get(y.name)
            if not isinstance(lin, TypedLinear) or lin.out.domain == NODE:
                continue
            if isinstance(other, ParamRead) or (lin.out.domain == EDGE and isinstance(other, Gather)):
                found.append(op)
                break
    return found


class FusionPass(Pass):
    name = "fusion"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        return ([SOFTMAX] if softmax_aggregations(program) else []) + \
            ([EPILOGUE] if epilogue_candidates(program) else [])

    def constraints(self, program: Program, graph: Any) -> list[Constraint]:
        if not softmax_aggregations(program):
            return []

        def fused_needs_csr(cfg: Mapping[str, Any]) -> str | None:
            fusion, layout = cfg.get(SOFTMAX.name, SOFTMAX.default), cfg.get(EDGE_ORDER.name, EDGE_ORDER.default)
            if fusion != SOFTMAX.default and layout != CSR_DST:
                return (f"{SOFTMAX.name}={fusion} walks each destination's in-edges, which needs "
                        f"{EDGE_ORDER.name}={CSR_DST} (got {layout})")
            return None

        return [Constraint("fused_softmax_layout", "fused softmax needs edges grouped by destination", fused_needs_csr)]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        return program  # what fuses is lowering's to do (plan)

    def plan(self, plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
        return dataclasses.replace(plan, softmax_fusion=config.get(SOFTMAX.name, SOFTMAX.default),
                                   epilogue=config.get(EPILOGUE.name, EPILOGUE.default))
