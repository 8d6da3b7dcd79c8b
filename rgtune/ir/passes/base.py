"""What a pass is: a rewrite of a :class:`Program` that owns its knobs and their constraints.

A pass declares, for a given program and graph, the knobs that matter there
(:meth:`Pass.knobs`; a knob whose pattern does not occur is not declared), the constraints
between knob values (:meth:`Pass.constraints`), applies a configuration (:meth:`Pass.apply`:
a rewrite of the program), and records what lowering must do differently in the
:class:`~rgtune.ir.plan.LoweringPlan` (:meth:`Pass.plan`: the layout, fusion choices; a frozen
dataclass whose fields are the knobs'). The tuner never names a knob: it collects them from the
registered passes and kernel templates (:mod:`rgtune.search_spaces`).

Example: a pass with one knob, registered for every program.

    >>> class Noop(Pass):
    ...     name = "noop"
    ...     def knobs(self, program, graph):
    ...         return [Knob("noop.level", (0, 1), 0, "does nothing")]
    ...     def apply(self, program, config, graph):
    ...         return program
    >>> register_pass(Noop())
    >>> "noop" in [p.name for p in registered_passes()]
    True
    >>> unregister_pass("noop")
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from rgtune.ir.program import IRError, Program

if TYPE_CHECKING:  # the graph is only read
    from rgtune.data.graph import HeteroGraph
    from rgtune.ir.plan import LoweringPlan

__all__ = ["Knob", "Constraint", "Pass", "KnobError", "register_pass", "unregister_pass", "registered_passes", "create"]


class KnobError(IRError):
    """An unknown knob, or a value outside its choices (a usage error: the CLI exits with 2)."""


@dataclass(frozen=True)
class Knob:
    """One decision a pass exposes: a name ``<pass>.<what>``, its choices and default.

    ``active_if`` says when the knob matters given the other knob values (a conditional
    knob: ``compact.pair_index`` only when something is compact).
    """

    name: str
    choices: tuple[Any, ...]
    default: Any
    doc: str
    active_if: Callable[[Mapping[str, Any]], bool] | None = None

    def __post_init__(self) -> None:
        if self.default not in self.choices:
            raise ValueError(f"knob {self.name}: default {self.default!r} not among {self.choices}")

    def is_active(self, config: Mapping[str, Any]) -> bool:
        return self.active_if is None or bool(self.active_if(config))

    def check(self, value: Any) -> Any:
        if value in self.choices:
            return value
        # values from the command line arrive as strings
        for c in self.choices:
            if str(c) == str(value):
                return c
        raise KnobError(f"knob {self.name}: {value!r} is not a valid value; choose one of {list(self.choices)}")


@dataclass(frozen=True)
class Constraint:
    """A rule between knob values; ``check`` returns the reason a configuration breaks it."""

    name: str
    doc: str
    check: Callable[[Mapping[str, Any]], str | None]


class Pass(ABC):
    """A program rewrite that owns its knobs. Subclasses set ``name``."""

    name: ClassVar[str]

    @abstractmethod
    def knobs(self, program: Program, graph: "HeteroGraph | None") -> list[Knob]:
        """The knobs that matter for ``program`` (on ``graph``, when given)."""

    def constraints(self, program: Program, graph: "HeteroGraph | None") -> list[Constraint]:
        return []

    @abstractmethod
    def apply(self, program: Program, config: Mapping[str, Any], graph: "HeteroGraph | None") -> Program:
        """Rewrite ``program``; ``config`` holds a value for every knob (defaults filled in)."""

    def plan(self, plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
        """``plan`` with this pass's decisions for lowering (``dataclasses.replace``); unchanged by default."""
        return plan


_REGISTRY: list[Pass] = []


def register_pass(p: Pass, before: str | None = None) -> None:
    """Add a pass to the pipeline (at the end, or before the pass named ``before``)."""
    if any(q.name == p.name for q in _REGISTRY):
        raise ValueError(f"a pass named {p.name!r} is already registered")
    _pipeline_changed()
    if before is None:
        _REGISTRY.append(p)
        return
    names = [q.name for q in _REGISTRY]
    if before not in names:
        raise ValueError(f"no pass named {before!r}; registered: {names}")
    _REGISTRY.insert(names.index(before), p)


def unregister_pass(name: str) -> None:
    _pipeline_changed()
    _REGISTRY[:] = [q for q in _REGISTRY if q.name != name]


#: knob discovery results per (program, pipeline, graph); any change to the pipeline clears it
KNOB_CACHE: dict[tuple, list[Knob]] = {}


def _pipeline_changed() -> None:
    KNOB_CACHE.clear()


def registered_passes() -> list[Pass]:
    """The pipeline, in order."""
    return list(_REGISTRY)


def create(name: str) -> Pass:
    """The registered pass called ``name``."""
    for p in _REGISTRY:
        if p.name == name:
            return p
    raise KeyError(f"no pass named {name!r}; registered: {[q.name for q in _REGISTRY]}")
