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

from typing import Any, Mapping

from rgtune.ir.passes.base import Constraint, Knob, Pass
from rgtune.ir.program import EDGE, NODE, Aggregate, Binary, EdgeSoftmax, Gather, Inner, ParamRead, Program, TypedLinear


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
        found = []
        if softmax_aggregations(program):
            found.append(Knob("fusion.softmax", ("none", "aggregate", "full"), "none",
                              "materialize score and softmax, fuse softmax into the aggregation, or fuse all"))
        if epilogue_candidates(program):
            found.append(Knob("fusion.epilogue", ("off", "on"), "off",
                              "compute inner products with a GEMM's output row in the GEMM's epilogue"))
        return found

    def constraints(self, program: Program, graph: Any) -> list[Constraint]:
        if not softmax_aggregations(program):
            return []

        def fused_needs_csr(cfg: Mapping[str, Any]) -> str | None:
            if cfg.get("fusion.softmax", "none") != "none" and cfg.get("layout.edges", "csr_dst") != "csr_dst":
                return (f"fusion.softmax={cfg['fusion.softmax']} walks each destination's in-edges, which needs "
                        f"layout.edges=csr_dst (got {cfg.get('layout.edges')})")
            return None

        return [Constraint("fused_softmax_layout", "fused softmax needs edges grouped by destination", fused_needs_csr)]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        ann = dict(program.annotations)
        ann["softmax_fusion"] = config.get("fusion.softmax", "none")
        ann["epilogue"] = config.get("fusion.epilogue", "off")
        return program.copy(annotations=ann)
