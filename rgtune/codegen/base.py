"""The one interface every code generator implements, and the ``create("name")`` factory.

A :class:`Backend` turns a :class:`~rgtune.ir.kernels.KernelProgram` plus a schedule (the
template parameter values, ``"gemm.tile_rows" -> 32``) into a :class:`BuiltProgram` bound to a
graph: generated sources, compiled, callable as ``built.run(x, params)``. Backends read the
kernel IR only; none imports another. Each backend runs the schedule knobs of its ``target``,
which the backend that owns them declares (:mod:`rgtune.codegen.schedule`) and registers with
itself (:func:`register_backend`).

Example:
    >>> "reference" in available_backends()
    True
    >>> create("reference").name
    'reference'
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import torch

from rgtune.codegen.schedule import TargetSchedule, register_target
from rgtune.data.graph import HeteroGraph
from rgtune.ir.kernels import KernelProgram


class BackendError(RuntimeError):
    """A backend cannot build or run here (missing compiler, no GPU, ...)."""


class CompileError(BackendError):
    """Generated code did not compile; the message names the source file and has the log."""

    def __init__(self, message: str, source_path: str | None = None, log: str = "") -> None:
        super().__init__(message)
        self.source_path = source_path
        self.log = log


#: what a training program's run returns: the output, the input's gradient, and param -> its gradient
#: (a derived param's too: its sources' come through the fold, see :mod:`rgtune.ir.autodiff`)
TrainingResult = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


@dataclass
class BuiltProgram:
    """A kernel program compiled for one graph and schedule.

    ``run_fn(x, params)`` computes the output; a training program's (:attr:`KernelProgram.is_training`)
    ``train_fn(x, params, dout)`` also the gradients (:data:`TrainingResult`)."""

    backend: str
    sources: dict[str, str]  # file name -> generated source text
    compile_seconds: float
    cache_hit: bool
    run_fn: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)
    train_fn: Callable[[torch.Tensor, Mapping[str, torch.Tensor], torch.Tensor], TrainingResult] | None = None

    @property
    def source_hash(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.sources):
            h.update(name.encode() + b"\0" + self.sources[name].encode() + b"\0")
        return h.hexdigest()[:16]

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The layer's output for input ``x`` (global node order) and learnable ``params``."""
        return self.run_fn(x, params)

    def run_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor) -> TrainingResult:
        """A training program's output and gradients for the output's gradient ``dout``."""
        if self.train_fn is None:
            raise BackendError(f"this {self.backend} program computes no gradients (build a training program)")
        return self.train_fn(x, params, dout)


class Backend(ABC):
    """A code generator + compiler + runner for one kind of device."""

    name: ClassVar[str]
    #: the target whose schedule knobs this backend runs (:func:`rgtune.codegen.schedule.target_schedule`)
    target: ClassVar[str]

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can build and run here, and if not, why."""
        return True, ""

    @abstractmethod
    def build(self, kp: KernelProgram, graph: HeteroGraph, schedule: Mapping[str, Any]) -> BuiltProgram:
        """Generate, compile and bind ``kp`` for ``graph`` with ``schedule``."""

    def device_info(self) -> dict[str, Any]:
        """What a timing is only comparable on: device name, architecture, driver, compiler."""
        return {"backend": self.name}

    def synchronize(self) -> None:
        """Wait for queued work (GPU backends); timing calls it."""


class ReferenceBackend(Backend):
    """The torch executor of the kernel IR (the oracle; the "unoptimized" baseline)."""

    name = "reference"
    target = "cpu"

    def build(self, kp: KernelProgram, graph: HeteroGraph, schedule: Mapping[str, Any]) -> BuiltProgram:
        from rgtune.codegen.reference import ReferenceExecutor

        ex = ReferenceExecutor(kp, graph)
        return BuiltProgram(self.name, {"kernels.txt": kp.describe()}, 0.0, True, ex.run,
                            train_fn=ex.run_training if kp.is_training else None)

    def device_info(self) -> dict[str, Any]:
        import platform

        return {"backend": self.name, "device": platform.processor() or platform.machine(),
                "torch": torch.__version__}


_BACKENDS: dict[str, Callable[[], Backend]] = {"reference": ReferenceBackend}


def register_backend(name: str, factory: Callable[[], Backend], schedule: TargetSchedule | None = None) -> None:
    """Make ``create(name)`` call ``factory``; ``schedule``: the knobs of a target the backend brings."""
    if schedule is not None:
        register_target(schedule)
    _BACKENDS[name] = factory


def load_builtin_backends() -> None:
    """Import the built-in backends (each registers itself and its target's knobs)."""
    # imported lazily so that a missing optional dependency of one backend never breaks another
    for module in ("rgtune.codegen.cpu", "rgtune.codegen.cuda"):
        try:
            __import__(module)
        except ImportError:  # pragma: no cover - the module itself is part of the package
            pass


def available_backends() -> dict[str, tuple[bool, str]]:
    """Every registered backend -> (usable here, reason if not)."""
    load_builtin_backends()
    out = {}
    for name, factory in _BACKENDS.items():
        cls = factory if isinstance(factory, type) else type(factory())
        out[name] = cls.available() if hasattr(cls, "available") else (True, "")
    return out


def auto_backend() -> str:
    """What ``--backend auto`` means: ``cuda`` where a GPU is usable, else ``cpu``."""
    return "cuda" if available_backends().get("cuda", (False, ""))[0] else "cpu"


def backend_target(name: str) -> str:
    """The target whose schedule knobs backend ``name`` runs (``cpu`` for ``reference``); ``cpu`` for a
    backend that cannot be created here (a plugin that fails to load). Creating one needs no device."""
    try:
        return str(create(name).target)
    except Exception:  # noqa: BLE001 - a plugin that does not load: its trials can only be CPU ones
        return "cuda" if name.startswith("cuda") else "cpu"


def create(name: str) -> Backend:
    """The backend called ``name`` (``reference``, ``cpu``, ``cuda``), or ``"package.module:Class"``
    for a backend defined elsewhere (a plugin; the tests' fault-injecting backends)."""
    load_builtin_backends()
    if ":" in name:
        import importlib

        module, _, cls = name.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)()
        except (ImportError, AttributeError) as e:
            raise BackendError(f"cannot load backend {name!r}: {e}") from None
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}")
    return _BACKENDS[name]()
