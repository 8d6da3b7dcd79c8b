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
A layer's kernels keep a scratch workspace: do not call one layer from two threads at once.

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
            try:
                out = ex.run(leaves[0], dict(zip(self.names, leaves[1:])))
                wrt = [t for t in leaves if t.requires_grad]
                grads = iter(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
            finally:
                # The executor keeps its last buffers; drop them so no autograd graph outlives the call.
                ex.bufs, ex.params = {}, {}
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
        if self.model == "rgcn":
            if heads != 1:
                raise ValueError(f"{type(self).__name__}: RGCN has no attention heads; expected heads=1, got {heads!r}")
            super().__init__(graph, in_dim, out_dim, device=device, dtype=dtype)  # type: ignore[call-arg]
        else:
            super().__init__(graph, in_dim, out_dim, heads=heads, device=device, dtype=dtype)  # type: ignore[call-arg]
        self._backend = create(backend) if isinstance(backend, str) else backend
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
        name, dtype, device = type(self).__name__, self._param_dtype(), self._device()
        allowed = _float_dtypes(self._backend)
        if dtype not in allowed:
            hint = " (use backend='reference' for float64, e.g. for gradcheck)" if dtype == torch.float64 else ""
            raise TypeError(f"{name}: the {self.backend} backend computes in {', '.join(map(str, allowed))}, "
                            f"but the layer's parameters are {dtype}; convert with .float(){hint}")
        want = "cuda" if self._backend.target == "cuda" else "cpu"
        if device.type != want:
            raise ValueError(f"{name}: the layer's parameters are on {device}, but the {self.backend} backend "
                             f"runs on {want} tensors; move the layer with .to({want!r})")

    def _check_tensor(self, x: Tensor, rows: int, what: str) -> None:
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
