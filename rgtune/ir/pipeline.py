"""Run the pass pipeline: discover knobs, check a configuration, apply passes, lower.

Example:
    >>> from rgtune.ir.models import build_model
    >>> prog = build_model("rgcn", 8, 8)
    >>> sorted(k.name for k in discover_knobs(prog))  # doctest: +NORMALIZE_WHITESPACE
    ['compact.pair_index', 'compact.src', 'layout.edges', 'layout.index_bits', 'precision.edges',
     'precision.nodes', 'reorder.aggregate_first']
    >>> kp = compile_program(prog, {"reorder.aggregate_first": "on"}).kernels
    >>> print(kp.describe().splitlines()[0])
    kernels rgcn: layout=csr_dst index_bits=32 pair_index=direct
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from rgtune.ir.kernels import KernelProgram
from rgtune.ir.lowering import lower
from rgtune.ir.plan import LoweringPlan, plan_lowering
from rgtune.ir.passes import Constraint, Knob, KnobError, Pass, registered_passes
from rgtune.ir.passes.base import KNOB_CACHE
from rgtune.ir.program import Program

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph

#: above this many configurations of earlier passes, discovery samples instead of enumerating
_MAX_PREFIX_CONFIGS = 256


@dataclass
class Compiled:
    """A program after the passes of one configuration, what they decided for lowering, and its kernels."""

    config: dict[str, Any]
    program: Program
    kernels: KernelProgram
    plan: LoweringPlan


def discover_knobs(program: Program, graph: "HeteroGraph | None" = None,
                   passes: list[Pass] | None = None) -> list[Knob]:
    """Every knob of every pass that matters for ``program`` under some configuration.

    A pass's patterns may appear only after an earlier pass rewrote the program (HGT's
    attention moved to the destination side becomes compactable there), so each pass is
    asked about the program as every configuration of the earlier passes leaves it.
    """
    passes = registered_passes() if passes is None else passes
    key = (str(program), tuple(p.name for p in passes), graph.content_hash if graph is not None else None,
           graph.num_nodes() + graph.num_edges() if graph is not None else None)
    if key not in KNOB_CACHE:
        KNOB_CACHE[key] = _discover(program, graph, passes)
    return list(KNOB_CACHE[key])



def _discover(program: Program, graph: "HeteroGraph | None", passes: list[Pass]) -> list[Knob]:
    knobs: dict[str, Knob] = {}
    programs = [program]
    for p in passes:
        found: dict[str, Knob] = {}
        for prog in programs:
            for k in p.knobs(prog, graph):
                found.setdefault(k.name, k)
        knobs.update(found)
        if not found:
            continue
        configs = list(itertools.islice(itertools.product(*(k.choices for k in found.values())), _MAX_PREFIX_CONFIGS))
        next_programs = []
        for prog in programs:
            for values in configs:
                cfg = dict(zip(found, values))
                next_programs.append(p.apply(prog, cfg, graph))
        programs = _dedupe(next_programs)
    return list(knobs.values())


def _dedupe(programs: list[Program]) -> list[Program]:
    seen: dict[str, Program] = {}
    for p in programs:
        seen.setdefault(str(p), p)
    return list(seen.values())


def discover_constraints(program: Program, graph: "HeteroGraph | None" = None) -> list[Constraint]:
    out: dict[str, Constraint] = {}
    for p in registered_passes():
        for c in p.constraints(program, graph):
            out.setdefault(c.name, c)
    return list(out.values())


def resolve_config(knobs: list[Knob], config: Mapping[str, Any], strict: bool = True) -> dict[str, Any]:
    """Defaults filled in; values checked. With ``strict``, a knob not in ``knobs`` is an error."""
    by_name = {k.name: k for k in knobs}
    out = {k.name: k.default for k in knobs}
    for name, value in config.items():
        if name not in by_name:
            if strict:
                raise KnobError(f"unknown knob {name!r} for this program; valid knobs: {sorted(by_name)}")
            out[name] = value
            continue
        out[name] = by_name[name].check(value)
    return out


def check_constraints(constraints: list[Constraint], config: Mapping[str, Any]) -> list[str]:
    return [why for c in constraints if (why := c.check(config))]


def apply_passes(program: Program, config: Mapping[str, Any], graph: "HeteroGraph | None" = None) -> Program:
    for p in registered_passes():
        program = p.apply(program, config, graph)
    return program


def compile_program(program: Program, config: Mapping[str, Any] | None = None,
                    graph: "HeteroGraph | None" = None, strict: bool = True, training: bool = False) -> Compiled:
    """Apply the passes with ``config`` (IR knobs; others ignored unless ``strict``) and lower; with
    ``training``, lower the adjoint of the program after the passes (:func:`rgtune.ir.autodiff.adjoint`;
    its knob ``autodiff.save`` joins the IR knobs)."""
    knobs = discover_knobs(program, graph)
    if training:
        from rgtune.ir.autodiff import training_knobs

        knobs = knobs + training_knobs(program)
    ir_names = {k.name for k in knobs}
    ir_config = {k: v for k, v in (config or {}).items() if k in ir_names or (strict and "." in k and
                                                                               k.split(".")[0] in _pass_names())}
    full = resolve_config(knobs, ir_config, strict=strict)
    problems = check_constraints(discover_constraints(program, graph), full)
    if problems:
        raise KnobError("; ".join(problems))
    after = apply_passes(program, full, graph)
    if training:
        from rgtune.ir.autodiff import adjoint

        after = adjoint(after, config=full)
    plan = plan_lowering(full, training)
    return Compiled(full, after, lower(after, plan), plan)


def _pass_names() -> set[str]:
    return {p.name for p in registered_passes()}
