"""Tuned layers: the reference layers of :mod:`rgtune.models` whose forward runs generated kernels.

A tuned layer *is* its reference layer (``TunedRGCN`` subclasses :class:`~rgtune.models.RGCN`,
and so on): the same parameters, the same ``state_dict`` keys and shapes, the same call
(``layer(x)`` with a tensor in global node order or a dict per node type, answered in the same
form). Only ``_forward_flat`` differs.

What is generated and what is torch:

* **forward**: the kernels the backend generated for the chosen schedule
  (:meth:`BuiltProgram.run`; C/OpenMP on ``cpu``, CUDA C on ``cuda``, float32). Derived
  weights of a reordered program (``W_k W_att`` ...) are folded with torch ops inside the
  backend, once per call.
* **backward**: torch. A custom :class:`torch.autograd.Function` saves the input and the
  parameters; its backward re-runs the forward through the torch lowering of the *same*
  kernel program (:class:`~rgtune.codegen.reference.ReferenceExecutor`, with autograd on)
  and calls :func:`torch.autograd.grad`. Gradients are therefore those of the tuned program's
  own math (compaction, reordering and all), computed by torch; nothing of the backward is
  generated. The recomputation costs one torch forward per backward; no activation is kept
  between forward and backward beyond the input and the parameters.

With the ``reference`` backend the forward is the same torch executor, in any float dtype:
that is what :func:`torch.autograd.gradcheck` runs in float64. Second derivatives (double
backward) are not supported. Under ``torch.no_grad()`` the forward is the kernels alone.

``copy.deepcopy`` and ``torch.save`` of a tuned layer keep its schedule and rebuild the
kernels for the copy (compiled code itself is not copied; the compile cache makes this cheap).

Dtypes: the generated kernels (``cpu``, ``cuda``) compute in float32, so a layer on those
backends creates its parameters in float32 even under ``torch.set_default_dtype(torch.float64)``,
and its output is float32. Parameters or an input of another dtype are an error naming the
tensor and its dtype, before any kernel runs; nothing is cast behind the caller's back. The
``reference`` backend computes in the dtype of the layer (any float dtype; float64 for
:func:`torch.autograd.gradcheck`), and its parameters follow torch's default dtype.

Threads: one layer may be called from several threads at once. Its forward runs one call at a
time (the kernels of a layer share one workspace, so each backend's runtime holds a lock per
built program; a call already uses every core through OpenMP or the GPU, so running calls side
by side would gain little); its backward, the torch lowering, keeps its buffers per call and
runs concurrently. Results are the same as from calls made one after another.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.models import RGCN
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> layer = TunedRGCN(g, 4, 8, backend="reference")       # the default schedule
    >>> ref = RGCN(g, 4, 8)
    >>> ref.load_state_dict(layer.state_dict())                  # the same parameters
    <All keys matched successfully>
    >>> x = torch.randn(30, 4)
    >>> bool(torch.allclose(layer(x), ref(x), atol=1e-5))
    True
    >>> layer(x).sum().backward()                                # trains: torch backward
    >>> layer.weight.grad.shape
    torch.Size([3, 4, 8])
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rgtune.codegen.base import Backend, BuiltProgram, create
from rgtune.codegen.reference import ReferenceExecutor
from rgtune.data.graph import HeteroGraph
from rgtune.ir.kernels import KernelProgram, WeightKernel
from rgtune.ir.models import build_model
from rgtune.models import HGT, RGAT, RGCN, NodeInput, RelationalLayer
from rgtune.search_spaces import SearchSpace

__all__ = ["GraphMismatchError", "TunedLayer", "TunedRGCN", "TunedRGAT", "TunedHGT", "TUNED_CLASSES", "tuned_layer"]


class GraphMismatchError(ValueError):
    """A graph whose node or edge types differ from those a schedule was tuned for."""


class _Runner:
    """The compiled forward and the torch backward of one tuned layer (what the Function calls)."""

    def __init__(self, built: BuiltProgram, kp: KernelProgram, graph: HeteroGraph, names: Sequence[str]) -> None:
        self.built = built
        self.kp = kp
        self.graph = graph
        self.names = tuple(names)
        self._executor: ReferenceExecutor | None = None

    def _executor_on(self, device: torch.device) -> ReferenceExecutor:
        """The torch executor of the kernel program, its graph arrays on ``device`` (built on the
        first backward, so inference never pays for it)."""
        if self._executor is None:
            self._executor = ReferenceExecutor(self.kp, self.graph, device)
        self._executor = self._executor.to(device)
        return self._executor

    def forward(self, x: Tensor, params: Sequence[Tensor]) -> Tensor:
        with torch.no_grad():
            return self.built.run(x, dict(zip(self.names, params)))

    def vjp(self, x: Tensor, params: Sequence[Tensor], grad_out: Tensor,
            needs: Sequence[bool]) -> list[Tensor | None]:
        """Gradients w.r.t. ``(x, *params)`` (None where not needed), through the torch lowering."""
        ex = self._executor_on(x.device)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(bool(n)) for t, n in zip((x, *params), needs)]
            # the executor keeps no buffers between runs: no autograd graph outlives the call, and
            # backwards of one layer in several threads do not mix
            out = ex.run(leaves[0], dict(zip(self.names, leaves[1:])))
            wrt = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
        return [next(grads) if t.requires_grad else None for t in leaves]


class _KernelFunction(torch.autograd.Function):
    """Forward: generated kernels. Backward: torch, recomputing the forward (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, runner: _Runner, x: Tensor, *params: Tensor) -> Tensor:  # type: ignore[override]
        ctx.runner = runner
        ctx.save_for_backward(x, *params)
        return runner.forward(x, params)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, *params = ctx.saved_tensors
        grads = ctx.runner.vjp(x, params, grad_out.contiguous(), ctx.needs_input_grad[1:])
        return (None, *grads)


def _float_dtypes(backend: Backend) -> tuple[torch.dtype, ...]:
    """The dtypes a backend computes in: the torch executor any float, generated kernels float32."""
    declared = getattr(backend, "dtypes", None)
    if declared:
        return tuple(declared)
    return (torch.float16, torch.bfloat16, torch.float32, torch.float64) if backend.name == "reference" else (torch.float32,)


def _default_param_dtype(backend: Backend) -> torch.dtype:
    """torch's default dtype where the backend computes in it, else the backend's own (float32
    for generated kernels): a layer never starts with parameters its kernels cannot read."""
    allowed = _float_dtypes(backend)
    default = torch.get_default_dtype()
    return default if default in allowed else allowed[0]


class TunedLayer(RelationalLayer):
    """Base of :class:`TunedRGCN`, :class:`TunedRGAT` and :class:`TunedHGT` (see the module docstring).

    Args:
        graph: the graph the layer is bound to (and the kernels are built for).
        in_dim, out_dim, heads: sizes (``heads`` must be 1 for RGCN).
        config: the schedule, ``knob -> value`` (missing knobs take their defaults); ``None``:
            the default schedule.
        backend: a backend name (``"cpu"``, ``"cuda"``, ``"reference"``, ``"pkg.mod:Class"``) or a
            :class:`~rgtune.codegen.base.Backend`.
        provenance: where the schedule came from (kept as :attr:`provenance`; see
            :func:`rgtune.runtime.load_tuned`).
        device, dtype: as for the reference layer (the ``cpu`` backend needs CPU float32).
            ``dtype=None``: torch's default dtype where the backend computes in it, else the
            backend's (float32 for ``cpu`` and ``cuda``, also under a float64 default dtype).

    Dtypes: the ``cpu`` and ``cuda`` backends compute in float32: the input must be float32
    (a float64 input is a ``ValueError`` that says to convert it), the parameters too
    (``TypeError`` naming the parameter; ``.float()`` converts the layer), and the output is
    float32. The ``reference`` backend runs in the layer's dtype (any float dtype).

    Threads: a layer may be called from several threads at once; its forwards run one at a
    time (one workspace per layer, guarded by a lock), its backwards side by side, and every
    result equals that of the same calls made one after another.

    Attributes:
        config: the full schedule in use; ``kernels``: its :class:`KernelProgram`;
        backend: the backend's name; ``sources`` / ``source_hash``: the generated code;
        provenance: a dict (``source`` is ``"database"``, ``"default"`` or ``"export"``, ...).
    """

    model: ClassVar[str]

    def __init__(
        self,
        graph: HeteroGraph,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        *,
        config: Mapping[str, Any] | None = None,
        backend: str | Backend = "reference",
        provenance: Mapping[str, Any] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        be = create(backend) if isinstance(backend, str) else backend
        if dtype is None:
            dtype = _default_param_dtype(be)
        if self.model == "rgcn":
            if heads != 1:
                raise ValueError(f"{type(self).__name__}: RGCN has no attention heads; expected heads=1, got {heads!r}")
            super().__init__(graph, in_dim, out_dim, device=device, dtype=dtype)  # type: ignore[call-arg]
        else:
            super().__init__(graph, in_dim, out_dim, heads=heads, device=device, dtype=dtype)  # type: ignore[call-arg]
        self._backend = be
        self._backend_spec = backend if isinstance(backend, str) else self._backend.name  # for unpickling
        space = SearchSpace(build_model(self.model, in_dim, out_dim, heads), graph, self._backend.target)
        point = space.compile({**space.default(), **dict(config or {})})
        if not point.valid:
            raise ValueError(f"{type(self).__name__}: the schedule is invalid for this workload: " + "; ".join(point.problems))
        self.config: dict[str, Any] = dict(point.config)
        self.kernels: KernelProgram = point.kernels
        self.provenance: dict[str, Any] = dict(provenance or {"source": "explicit" if config else "default"})
        self._param_names = self._kernel_param_names(point.kernels)
        built = self._backend.build(point.kernels, graph, point.config)
        self._runner = _Runner(built, point.kernels, graph, self._param_names)

    # ------------------------------------------------------------------ copies and pickles
    def __getstate__(self) -> dict[str, Any]:
        # Compiled code does not pickle: copy.deepcopy and torch.save keep the schedule, the
        # kernels are rebuilt from it when the copy is made or loaded (a compile-cache hit).
        state = dict(self.__dict__)
        state["_runner"] = None
        state["_backend"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._backend = create(self._backend_spec)
        built = self._backend.build(self.kernels, self.graph, self.config)
        self._runner = _Runner(built, self.kernels, self.graph, self._param_names)

    # ------------------------------------------------------------------ what was built
    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def sources(self) -> dict[str, str]:
        """Generated source files, name -> text (the ``reference`` backend: the kernel IR as text)."""
        return dict(self._runner.built.sources)

    @property
    def source_hash(self) -> str:
        return self._runner.built.source_hash

    def _kernel_param_names(self, kp: KernelProgram) -> list[str]:
        derived = {k.out for k in kp.kernels if isinstance(k, WeightKernel)}
        needed = [n for n in kp.param_shapes if n not in derived]
        mine = dict(self.named_parameters())
        missing = [n for n in needed if n not in mine]
        if missing:  # the IR and the reference layer disagree on parameter names: a bug, say which
            raise RuntimeError(f"{type(self).__name__}: the kernel program needs params {missing} "
                               f"that the layer does not have ({sorted(mine)})")
        return needed

    # ------------------------------------------------------------------ checks before any kernel runs
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_runnable(self) -> None:
        name, device = type(self).__name__, self._device()
        self._check_param_dtypes()
        want = "cuda" if self._backend.target == "cuda" else "cpu"
        if device.type != want:
            raise ValueError(f"{name}: the layer's parameters are on {device}, but the {self.backend} backend "
                             f"runs on {want} tensors; move the layer with .to({want!r})")

    def _check_param_dtypes(self) -> None:
        """Every parameter in one dtype, one the backend computes in (else a TypeError naming it)."""
        name, allowed = type(self).__name__, _float_dtypes(self._backend)
        first, dtype = next(iter(self.named_parameters()))[0], self._param_dtype()
        for pname, p in self.named_parameters():
            if p.dtype not in allowed:
                hint = " (use backend='reference' for float64, e.g. for gradcheck)" if p.dtype == torch.float64 else ""
                raise TypeError(f"{name}: parameter {pname!r} is {p.dtype}, but the {self.backend} backend computes "
                                f"in {', '.join(map(str, allowed))}; convert the layer with .float(){hint}")
            if p.dtype != dtype:
                raise TypeError(f"{name}: parameter {pname!r} is {p.dtype}, but {first!r} is {dtype}; a layer's "
                                f"parameters share one dtype (convert the layer with .to({dtype}))")

    def _check_tensor(self, x: Tensor, rows: int, what: str) -> None:
        allowed = _float_dtypes(self._backend)
        if isinstance(x, Tensor) and x.is_floating_point() and x.dtype not in allowed:
            # the reference layer's advice (convert the layer to the input's dtype) cannot work here
            raise ValueError(f"{type(self).__name__}: {what} has dtype {x.dtype}, expected {self._param_dtype()} "
                             f"(the {self.backend} backend computes in {', '.join(map(str, allowed))}; "
                             f"convert the input with .to({self._param_dtype()}))")
        super()._check_tensor(x, rows, what)
        device = self._device()
        if x.device != device:
            raise ValueError(f"{type(self).__name__}: {what} is on {x.device}, expected {device} "
                             f"(the layer's device); move it with .to({str(device)!r})")

    def forward(self, x: NodeInput) -> NodeInput:
        """As the reference layer's forward; runs the generated kernels (see the module docstring)."""
        self._check_runnable()
        return super().forward(x)

    def _forward_flat(self, x: Tensor) -> Tensor:
        params = [self._parameters[n] for n in self._param_names]
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            return _KernelFunction.apply(self._runner, x, *params)
        return self._runner.forward(x, params)  # inference: no autograd bookkeeping at all

    def extra_repr(self) -> str:
        src = self.provenance.get("source", "?")
        where = f"trial {self.provenance['trial_id']}" if self.provenance.get("trial_id") is not None else src
        return f"{super().extra_repr()}, backend={self.backend!r}, schedule={where}"


class TunedRGCN(TunedLayer, RGCN):
    """:class:`~rgtune.models.RGCN` computed by generated kernels (see :class:`TunedLayer`)."""

    model = "rgcn"


class TunedRGAT(TunedLayer, RGAT):
    """:class:`~rgtune.models.RGAT` computed by generated kernels (see :class:`TunedLayer`)."""

    model = "rgat"


class TunedHGT(TunedLayer, HGT):
    """:class:`~rgtune.models.HGT` computed by generated kernels (see :class:`TunedLayer`)."""

    model = "hgt"


TUNED_CLASSES: dict[str, type[TunedLayer]] = {"rgcn": TunedRGCN, "rgat": TunedRGAT, "hgt": TunedHGT}


def tuned_layer(model: str, graph: HeteroGraph, in_dim: int, out_dim: int, heads: int = 1, **kwargs: Any) -> TunedLayer:
    """The tuned layer class of ``model`` (``rgcn``, ``rgat``, ``hgt``), constructed with ``kwargs``."""
    key = model.lower()
    if key not in TUNED_CLASSES:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(TUNED_CLASSES)}")
    return TUNED_CLASSES[key](graph, in_dim, out_dim, heads, **kwargs)
