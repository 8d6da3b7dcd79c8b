"""Kernel schedule knobs: what a backend lets each kernel template choose, and what it refuses.

The kernel IR (:mod:`rgtune.ir.kernels`) says what a template computes and what it needs (a
traversal whose stage reads a destination's in-edges needs them grouped by destination). A
backend says how it can run each template: its :class:`TargetSchedule` declares, per template,
the schedule parameters (:class:`ScheduleParam`: choices, default, doc) and the constraints
(:class:`ScheduleConstraint`: a check of one kernel's values that names what is wrong), next to
the code generator that reads them. A target's knobs are ``"<template>.<param>"``
(``"gemm.tile_rows"``), shared by every kernel of that template in a program, so their names do
not depend on which kernels one IR configuration lowers to.

Backends register their target when they are imported (:func:`register_target`); the search
space asks :func:`target_schedule` by name. Several backends may share a target (the
``reference`` executor takes the ``cpu`` knobs, so its trials compare with the CPU's).

Example:
    >>> from rgtune.ir.kernels import MapKernel
    >>> t = TargetSchedule("toy", [TemplateSchedule(MapKernel, (ScheduleParam("chunk", (64, 256), 64, "rows"),))])
    >>> list(t.knobs())
    ['map.chunk']
    >>> t.kernel_schedule(MapKernel("map1"), {"map.chunk": 256})
    {'chunk': 256}
    >>> sorted(target_schedule("cpu").knobs())[:2]
    ['gemm.impl', 'gemm.tile_cols']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rgtune.ir.kernels import Kernel, KernelProgram, SoftmaxAggregate, TraversalKernel, template_name

__all__ = ["ScheduleParam", "ScheduleConstraint", "TemplateSchedule", "TargetSchedule", "register_target",
           "target_schedule", "targets", "kernel_schedule", "check_schedule", "TRAVERSAL_MAPPING", "MAPPING_CONSTRAINT"]


@dataclass(frozen=True)
class ScheduleParam:
    """A kernel schedule parameter of one target: its choices and its default."""

    name: str
    choices: tuple[Any, ...]
    default: Any
    doc: str


@dataclass(frozen=True)
class ScheduleConstraint:
    """A predicate over one kernel's schedule values; ``check`` returns the reason when violated."""

    name: str
    check: Callable[[Mapping[str, Any], Kernel], str | None]


@dataclass(frozen=True)
class TemplateSchedule:
    """What a target lets one kernel template choose (``params``) and what it refuses (``constraints``)."""

    template: type[Kernel]
    params: tuple[ScheduleParam, ...]
    constraints: tuple[ScheduleConstraint, ...] = ()

    @property
    def name(self) -> str:
        return template_name(self.template)


class TargetSchedule:
    """The schedule knobs of one target (``"cpu"``, ``"cuda"``), template by template."""

    def __init__(self, name: str, templates: Sequence[TemplateSchedule], storage: Sequence[str] = ("float32",)) -> None:
        self.name = name
        self.templates = tuple(templates)
        #: the buffer storage types the target's kernels read and write (:mod:`rgtune.ir.passes.precision`)
        self.storage = tuple(storage)
        self._by_template = {t.template: t for t in self.templates}

    def __repr__(self) -> str:
        return f"TargetSchedule({self.name!r}, {len(self.knobs())} knobs)"

    def knobs(self) -> dict[str, ScheduleParam]:
        """``"<template>.<param>" -> ScheduleParam``, in declaration order."""
        return {f"{t.name}.{p.name}": p for t in self.templates for p in t.params}

    def of(self, kernel: Kernel) -> TemplateSchedule | None:
        """What this target declares for ``kernel``'s template (None: nothing to schedule)."""
        return self._by_template.get(type(kernel))

    def kernel_schedule(self, kernel: Kernel, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """One kernel's schedule values: ``schedule``'s, its template's defaults where it says nothing."""
        declared = self.of(kernel)
        if declared is None:
            return {}
        return {p.name: schedule.get(f"{declared.name}.{p.name}", p.default) for p in declared.params}

    def check(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> list[str]:
        """Every violated constraint of ``kp``'s kernels under ``schedule``, as ``"<kernel>: <reason>"`` (and a
        buffer stored in a type the target's kernels do not handle, as ``"<buffer>: <reason>"``)."""
        problems = [f"{n}: stored as {t}; the {self.name} target's kernels store {' and '.join(self.storage)} only"
                    for n, t in kp.storage.items() if t not in self.storage]
        for k in kp.kernels:
            declared = self.of(k)
            if declared is None:
                continue
            values = self.kernel_schedule(k, schedule)
            for c in declared.constraints:
                why = c.check(values, k)
                if why:
                    problems.append(f"{k.name}: {why}")
        return problems


_TARGETS: dict[str, TargetSchedule] = {}


def register_target(schedule: TargetSchedule) -> None:
    """Make ``schedule`` the knobs of target ``schedule.name`` (a backend does this when imported)."""
    _TARGETS[schedule.name] = schedule


def targets() -> dict[str, TargetSchedule]:
    """Every registered target by name (the built-in backends are imported first)."""
    from rgtune.codegen.base import load_builtin_backends

    load_builtin_backends()
    return dict(_TARGETS)


def target_schedule(name: str) -> TargetSchedule:
    """The schedule knobs of target ``name``; an unknown target is an error that lists the known ones."""
    known = _TARGETS if name in _TARGETS else targets()
    if name not in known:
        raise ValueError(f"unknown target {name!r}; choose one of {sorted(known)}")
    return known[name]


def kernel_schedule(kernel: Kernel, schedule: Mapping[str, Any], target: str) -> dict[str, Any]:
    """:meth:`TargetSchedule.kernel_schedule` of the target called ``target``."""
    return target_schedule(target).kernel_schedule(kernel, schedule)


def check_schedule(kp: KernelProgram, schedule: Mapping[str, Any], target: str) -> list[str]:
    """:meth:`TargetSchedule.check` of the target called ``target``."""
    return target_schedule(target).check(kp, schedule)


# ------------------------------------------------------------------ shared by the C-family backends
def _mapping(s: Mapping[str, Any], k: Kernel) -> str | None:
    assert isinstance(k, TraversalKernel)
    if s.get("mapping") == "dst_parallel" and k.stage.needs_dst_grouping() and k.layout != "csr_dst":
        return f"dst_parallel needs edges grouped by destination (layout csr_dst), layout is {k.layout}"
    if s.get("mapping") == "edge_parallel" and isinstance(k.stage, SoftmaxAggregate):
        return "a fused softmax-aggregate is destination-parallel only"
    return None


#: how a traversal maps onto threads; both generated backends offer the two mappings
TRAVERSAL_MAPPING = ScheduleParam(
    "mapping", ("dst_parallel", "edge_parallel"), "dst_parallel",
    "destination-parallel (no atomics; edges grouped by destination) or edge-parallel (atomics)")
#: destination-parallel needs the edges grouped by destination; a fused online softmax is destination-parallel
MAPPING_CONSTRAINT = ScheduleConstraint("mapping", _mapping)
