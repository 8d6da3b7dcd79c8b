"""Which inner products go into which GEMM's epilogue (the ``fusion.epilogue`` decision).

An epilogue starts at an inner product of a GEMM's output row with something the GEMM's row
can load (a per-relation vector, or a node value gathered at the edge's other end, produced
earlier), and extends through single-use scalings (by a per-relation param or a constant).
Its last value is what the GEMM writes besides (or instead of) its output rows.
"""

from __future__ import annotations

from rgtune.ir.passes.fusion import epilogue_candidates
from rgtune.ir.program import Binary, Gather, Inner, ParamRead, Program, Scale, TypedLinear


def plan_epilogues(program: Program) -> dict[str, list[tuple[str, str]]]:
    """``{gemm output: [(inner product, epilogue result), ...]}``."""
    prod, users = program.producers(), program.users()
    order = {op.out.name: i for i, op in enumerate(program.ops)}
    order[program.x.name] = -1
    plan: dict[str, list[tuple[str, str]]] = {}
    for inner in epilogue_candidates(program):
        t, other = _split(inner, prod)
        if t is None:
            continue
        o = prod[other]
        if isinstance(o, Gather) and order.get(o.x.name, 10**9) >= order[t]:
            continue  # the gathered value is produced after the GEMM: no epilogue
        root = inner.out.name
        while len(users.get(root, [])) == 1:
            u = users[root][0]
            if isinstance(u, Scale) or (isinstance(u, Binary) and u.op == "mul" and u.out.dim == 1 and any(
                    isinstance(prod.get(w.name), ParamRead) for w in u.inputs() if w.name != root)):
                root = u.out.name
            else:
                break
        plan.setdefault(t, []).append((inner.out.name, root))
    return plan


def _split(inner: Inner, prod: dict) -> tuple[str | None, str]:
    for t, y in ((inner.a, inner.b), (inner.b, inner.a)):
        if isinstance(prod.get(t.name), TypedLinear) and isinstance(prod.get(y.name), (ParamRead, Gather)):
            return t.name, y.name
    return None, ""
