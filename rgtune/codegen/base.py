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
from typing import Any, Callable, ClassVar, Literal, Mapping

import torch

from rgtune.codegen.schedule import TargetSchedule, register_target
from rgtune.data.batch import Batch
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


def source_hash(sources: Mapping[str, str]) -> str:
    """The hash of a program's generated files (name -> text): what identifies the code a schedule makes."""
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    return h.hexdigest()[:16]


#: what a training program's run returns: the output, the input's gradient (None for a program of the params'
#: gradients only: :func:`rgtune.ir.autodiff.without_input_grad`), and param -> its gradient (a derived
#: param's too: its sources' come through the fold, see :mod:`rgtune.ir.autodiff`)
TrainingResult = tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]


@dataclass
class Saved:
    """What a training program's forward phase hands to its backward phase: the buffers the backward
    reads (:attr:`KernelProgram.saved`, fresh tensors owned by the caller, never a workspace) and the
    derived params the forward folded (:attr:`KernelProgram.saved_params`)."""

    buffers: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        """The memory held from the forward to the backward (each tensor once)."""
        seen: dict[int, int] = {}
        for t in (*self.buffers.values(), *self.params.values()):
            seen[id(t)] = t.numel() * t.element_size()
        return sum(seen.values())


#: a training program's forward phase: ``(output, what the backward reads)``
ForwardPhase = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], tuple[torch.Tensor, Saved]]
#: a training program's backward phase ``(x, params, saved, dout) -> (input gradient, {param: gradient})``
BackwardPhase = Callable[[torch.Tensor, Mapping[str, torch.Tensor], Saved, torch.Tensor],
                         tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class BuiltProgram:
    """A kernel program compiled for one graph and schedule.

    ``run_fn(x, params)`` computes the output. A training program (:attr:`KernelProgram.is_training`)
    runs in two phases, as a layer in a model trains: ``forward_fn(x, params) -> (output, saved)``
    (its forward kernels), later ``backward_fn(x, params, saved, dout) -> (input gradient, gradients)``
    (its backward kernels, reading the saved buffers). ``train_fn(x, params, dout)`` is one whole step
    (:data:`TrainingResult`); when a backend gives only that, :meth:`run_training` uses it."""

    backend: str
    sources: dict[str, str]  # file name -> generated source text
    compile_seconds: float
    cache_hit: bool
    run_fn: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)
    train_fn: Callable[[torch.Tensor, Mapping[str, torch.Tensor], torch.Tensor], TrainingResult] | None = None
    forward_fn: ForwardPhase | None = None
    backward_fn: BackwardPhase | None = None

    @property
    def source_hash(self) -> str:
        return source_hash(self.sources)

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The layer's output for input ``x`` (global node order) and learnable ``params``."""
        return self.run_fn(x, params)

    @property
    def phased(self) -> bool:
        """Whether the training program's forward and backward run apart (:meth:`run_forward`)."""
        return self.forward_fn is not None and self.backward_fn is not None

    def run_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor) -> TrainingResult:
        """A training program's output and gradients for the output's gradient ``dout``: one step,
        the two phases one after the other where the backend runs them apart."""
        if self.phased:
            out, saved = self.run_forward(x, params)
            dx, grads = self.run_backward(x, params, saved, dout)
            return out, dx, grads
        if self.train_fn is None:
            raise BackendError(f"this {self.backend} program computes no gradients (build a training program)")
        return self.train_fn(x, params, dout)

    def run_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Saved]:
        """A training program's forward phase: the output and what the backward phase reads."""
        if self.forward_fn is None:
            raise BackendError(f"this {self.backend} program has no separate forward phase (a training program's)")
        return self.forward_fn(x, params)

    def run_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved,
                     dout: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """A training program's backward phase: the input's gradient (None: a program of the params' only)
        and every param's (derived ones included), from the forward phase's ``saved`` and the output's gradient ``dout``."""
        if self.backward_fn is None:
            raise BackendError(f"this {self.backend} program has no separate backward phase (a training program's)")
        return self.backward_fn(x, params, saved, dout)


#: how a backend runs a training program (:attr:`Backend.training`)
TRAINING_SUPPORT = ("phases", "step", "none")
TrainingSupport = Literal["phases", "step", "none"]


class CompiledProgram(ABC):
    """A kernel program generated and compiled for one schedule, for any graph of its node and edge types.

    Nothing here depends on a graph (the kernels read sizes and index arrays at run time), so a layer
    compiles once and :meth:`bind` s the result to each graph or mini-batch it meets: binding is what
    a new batch costs (its index arrays and the kernels' tables over them), never code generation.
    """

    sources: dict[str, str]
    compile_seconds: float
    cache_hit: bool

    @abstractmethod
    def bind(self, graph: "HeteroGraph | Batch") -> BuiltProgram:
        """The program bound to ``graph`` (a :class:`HeteroGraph` or a :class:`~rgtune.data.batch.Batch`)."""


class Backend(ABC):
    """A code generator + compiler + runner for one kind of device: what every backend declares.

    Everything the rest of rgtune needs to know of a backend is a class attribute here, declared
    once by the backend and read directly (never probed with ``getattr``, never told by its name):

    * ``name``: how the database, the CLI and :func:`create` name it;
    * ``target``: whose schedule knobs it runs (:func:`rgtune.codegen.schedule.target_schedule`);
    * ``device_type``: the torch device type its inputs, params and results live on (``"cpu"`` or
      ``"cuda"``): a layer, the tuner and the bench put tensors there;
    * ``dtypes``: the floating types its kernels compute in (the first is the layer's default);
    * ``training``: how it runs a training program: ``"phases"`` (the forward and the backward
      apart: :meth:`BuiltProgram.run_forward` / :meth:`BuiltProgram.run_backward`, what a layer's
      backward runs on saved buffers), ``"step"`` (whole training steps only:
      :meth:`BuiltProgram.run_training`) or ``"none"`` (inference programs only; a layer's backward
      is torch's autograd through the torch lowering);
    * ``generates_sources``: whether :meth:`generate` returns the source files without building;
    * ``times_on_device``: whether :meth:`time_runs` times runs on the device (events) rather than
      the tuner timing them on the host.

    Example:
        >>> be = create("reference")
        >>> be.device_type, be.training, be.generates_sources, torch.float64 in be.dtypes
        ('cpu', 'phases', False, True)
    """

    name: ClassVar[str]
    target: ClassVar[str]
    device_type: ClassVar[str] = "cpu"
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    training: ClassVar[TrainingSupport] = "none"
    generates_sources: ClassVar[bool] = False
    times_on_device: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.training not in TRAINING_SUPPORT:
            raise TypeError(f"backend {cls.__name__}: training={cls.training!r}; choose one of {list(TRAINING_SUPPORT)}")
        if not cls.dtypes:
            raise TypeError(f"backend {cls.__name__}: dtypes is empty; declare the dtypes its kernels compute in")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can build and run here, and if not, why."""
        return True, ""

    @abstractmethod
    def compile(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> CompiledProgram:
        """Generate and compile ``kp`` with ``schedule``, for any graph (:class:`CompiledProgram`)."""

    def build(self, kp: KernelProgram, graph: "HeteroGraph | Batch", schedule: Mapping[str, Any]) -> BuiltProgram:
        """Generate, compile and bind ``kp`` for ``graph`` with ``schedule``."""
        return self.compile(kp, schedule).bind(graph)

    def generate(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> Any:
        """The generated program of ``kp`` (its ``sources``: file name -> text) without compiling it; only
        where :attr:`generates_sources`."""
        raise BackendError(f"backend {self.name!r} generates no source files")

    def time_runs(self, built: BuiltProgram, x: torch.Tensor, params: Mapping[str, torch.Tensor], warmup: int,
                  repeats: int) -> list[float]:
        """Seconds per run, timed on the device after ``warmup`` runs; only where :attr:`times_on_device`."""
        raise BackendError(f"backend {self.name!r} does not time on the device; the tuner times it on the host")

    def device_info(self) -> dict[str, Any]:
        """What a timing is only comparable on: device name, architecture, driver, compiler."""
        return {"backend": self.name}

    def synchronize(self) -> None:
        """Wait for queued work (GPU backends); timing calls it."""


class ReferenceBackend(Backend):
    """The torch executor of the kernel IR (the oracle; the "unoptimized" baseline)."""

    name = "reference"
    target = "cpu"
    #: the torch executor runs in any float dtype (float64 for gradcheck; float32 first: the layer's default)
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    training = "phases"

    def compile(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> CompiledProgram:
        return _ReferenceProgram(self.name, kp)

    def device_info(self) -> dict[str, Any]:
        import platform

        return {"backend": self.name, "device": platform.processor() or platform.machine(),
                "torch": torch.__version__}


_BACKENDS: dict[str, Callable[[], Backend]] = {"reference": ReferenceBackend}
#: plugins (``"package.module:Class"``) that :func:`create` imported in this process
_LOADED_PLUGINS: set[str] = set()


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


#: what a layer loaded with ``backend="auto"`` runs on: the first of these that can run here
AUTO_ORDER = ("cuda", "cpu", "reference")


def auto_backend() -> str:
    """What ``--backend auto`` means: ``cuda`` where a GPU is usable, else ``cpu``."""
    return "cuda" if available_backends().get("cuda", (False, ""))[0] else "cpu"


def backend_target(name: str, *, trust_code: bool = False) -> str:
    """The target whose schedule knobs backend ``name`` runs (``cpu`` for ``reference``). Creating one
    needs no device. A plugin (``"package.module:Class"``) that this process has not loaded is imported
    only with ``trust_code`` (a name the user gave, not one read from a database row); otherwise, or
    when it fails to load, the target is told by the name (``cuda...`` or else ``cpu``)."""
    load_builtin_backends()
    if name in _BACKENDS or name in _LOADED_PLUGINS or trust_code:
        try:
            return str(create(name).target)
        except Exception:  # noqa: BLE001 - a plugin that does not load: its trials can only be told by name
            pass
    return "cuda" if name.rpartition(":")[2].lower().startswith("cuda") or name.startswith("cuda") else "cpu"


def create(name: str) -> Backend:
    """The backend called ``name`` (``reference``, ``cpu``, ``cuda``), or ``"package.module:Class"``
    for a backend defined elsewhere (a plugin; the tests' fault-injecting backends)."""
    load_builtin_backends()
    if ":" in name:
        import importlib

        module, _, cls = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as e:
            raise BackendError(f"cannot load backend {name!r}: {e}") from None
        _LOADED_PLUGINS.add(name)  # loaded on the caller's word: backend_target may create it again
        return factory()
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}")
    return _BACKENDS[name]()


class _ReferenceProgram(CompiledProgram):
    """The kernel IR itself: the torch executor runs it on whatever graph it is bound to."""

    def __init__(self, backend: str, kp: KernelProgram) -> None:
        self.backend, self.kp = backend, kp
        self.sources, self.compile_seconds, self.cache_hit = {"kernels.txt": kp.describe()}, 0.0, True

    def bind(self, graph: "HeteroGraph | Batch") -> BuiltProgram:
        from rgtune.codegen.reference import ReferenceExecutor

        ex = ReferenceExecutor(self.kp, graph)
        training = self.kp.is_training
        return BuiltProgram(self.backend, self.sources, 0.0, True, ex.run,
                            train_fn=ex.run_training if training else None,
                            forward_fn=ex.run_forward if training else None,
                            backward_fn=ex.run_backward if training else None)
