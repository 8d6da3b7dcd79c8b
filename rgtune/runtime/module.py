"""The generic layer: any model's program, on any backend, as a trainable ``torch.nn.Module``.

:class:`Layer` takes a model (a registered name with its options, see :mod:`rgtune.ir.registry`,
or a :class:`~rgtune.ir.program.Program`) and a graph. Its parameters are the program's
(:meth:`Program.state_params`: names, shapes per node type or relation, initialization), so its
``state_dict`` is the program's; the call is ``layer(x)`` with a tensor in global node order or a
dict per node type, answered in the same form. ``layer(x, graph=other)`` runs it on another graph
with the same node and edge types (a sampled subgraph, say): the same parameters and schedule,
the kernels built for that graph once and kept (the last few graphs).

What runs where:

* **forward without gradients** (``torch.no_grad()``, or nothing requires grad): the kernels of
  the *inference program* (:meth:`BuiltProgram.run`; C/OpenMP on ``cpu``, CUDA C on ``cuda``,
  float32). Derived weights of a reordered program (``W_k W_att`` ...) are folded with torch ops
  inside the backend, once per call.
* **forward with gradients**: the forward phase of the *training program* (the adjoint of the
  program, :mod:`rgtune.ir.autodiff`, lowered and generated like the forward): it computes the
  output and hands the buffers the backward reads (:attr:`KernelProgram.saved`: which ones is the
  knob ``autodiff.save``) to a custom :class:`torch.autograd.Function`, which keeps them until the
  backward, as autograd keeps its own activations.
* **backward**: the training program's backward phase, generated kernels reading the saved
  buffers and the output's gradient; they give the input's gradient and every param's. The
  gradients of derived weights go back to the learnable ones through the folds (torch autograd
  over the weights, not over the graph: :func:`rgtune.codegen.training.learnable_grads`). No
  forward is recomputed, apart from what ``autodiff.save`` chooses to recompute.

The training program is built on the first forward that needs gradients (a layer made with
``mode="training"`` builds it at once); :attr:`Layer.backward_kind` says how the backend runs
it. A backend that runs only whole training steps (no separate phases) runs the step in the
backward; one that builds no training program at all falls back to autograd through the torch
lowering of the inference program.

With the ``reference`` backend both programs run in the torch executor, in any float dtype:
that is what :func:`torch.autograd.gradcheck` runs in float64, checking the derived backward
against finite differences. Second derivatives (double backward) are not supported.

``copy.deepcopy`` and ``torch.save`` of a tuned layer keep its schedule and rebuild the
kernels for the copy (compiled code itself is not copied; the compile cache makes this cheap).

Dtypes: the generated kernels (``cpu``, ``cuda``) compute in float32, so a layer on those
backends creates its parameters in float32 even under ``torch.set_default_dtype(torch.float64)``,
and its output is float32. A layer made or converted (``layer.to(torch.bfloat16)``) in bfloat16 or
float16 takes and returns that dtype: its kernels read float32 copies of its parameters and input
(casts autograd records: the gradients arrive in the layer's dtype); which intermediates are stored in
16 bits is its schedule's ``precision.*`` knobs (``load_tuned(..., precision="bf16")``). Any other
``dtype`` is refused when the layer is made or converted (``.double()``, ``.to(torch.float64)``: a ``TypeError``
naming what runs). Parameters or an input of another dtype than the layer's
are an error naming the tensor and its dtype, before any kernel runs; nothing is cast behind the
caller's back, except under ``torch.autocast``: there a float32 layer runs like an op autocast
computes in its lower type: its input is taken in float32 (a float16 or bfloat16 one, what autocast's
earlier ops return, cast up), it runs the schedule of that type (:meth:`Layer.autocast_schedule`: the one
``load_tuned`` found tuned with that precision, else its own with its intermediates stored in that type)
and returns that type; its parameters and their gradients stay float32 (the ``cpu`` and ``cuda`` targets
store both 16-bit types; where a target stored none, the layer would run its own schedule in float32). The
``reference`` backend computes in the dtype of the layer (any float dtype; float64 for
:func:`torch.autograd.gradcheck`), and its parameters follow torch's default dtype.

Threads: one layer may be called from several threads at once. Its forward runs one call at a
time (the kernels of a layer share one workspace, so each backend's runtime holds a lock per
built program; a call already uses every core through OpenMP or the GPU, so running calls side
by side would gain little); what a forward saves for its backward is its own (fresh tensors), so
several forwards may precede their backwards. Results are the same as from calls made one after
another.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.torch_layers import RGCN
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> layer = Layer("rgcn", g, 4, 8, backend="reference")   # the default schedule
    >>> ref = RGCN(g, 4, 8)                                      # PyG's RGCNConv's math, in torch
    >>> ref.load_state_dict(layer.state_dict())                  # the same parameters
    <All keys matched successfully>
    >>> x = torch.randn(30, 4)
    >>> bool(torch.allclose(layer(x), ref(x), atol=1e-5))
    True
    >>> layer(x).sum().backward()                                # trains: the generated backward
    >>> layer.weight.grad.shape, layer.backward_kind
    (torch.Size([3, 4, 8]), 'generated')
    >>> from rgtune.data import HeteroGraph
    >>> sub = HeteroGraph({t: g.num_nodes(t) for t in g.ntypes},             # same types, a third of the edges
    ...                   {c: tuple(e[::3] for e in g.edges(c)) for c in g.canonical_etypes})
    >>> layer(torch.randn(30, 4), graph=sub).shape
    torch.Size([30, 8])
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rgtune.codegen.base import (Backend, BuiltProgram, CompiledProgram, ReferenceBackend, Saved, create,
                                 source_hash)
from rgtune.codegen.reference import ReferenceExecutor
from rgtune.codegen.training import gradient_receivers, learnable_grads
from rgtune.data.batch import Batch, BatchTypeError
from rgtune.data.graph import HeteroGraph
from rgtune.data.graph_layer import GraphLayer, NodeInput
from rgtune.ir.kernels import KernelProgram, WeightKernel
from rgtune.ir.passes.precision import STORAGE_KNOBS
from rgtune.ir.program import EDGE_WEIGHT, Param, Program, reads_edge_weight
from rgtune.ir.registry import model_spec
from rgtune.runtime import ops
from rgtune.search_spaces import MODES, Point, SearchSpace

__all__ = ["GraphMismatchError", "Layer", "init_param"]

#: graphs other than the bound one whose kernels a layer keeps built (``layer(x, graph=...)``)
_GRAPHS_KEPT = 4


class GraphMismatchError(ValueError):
    """A graph whose node or edge types differ from those a schedule was tuned for."""


#: which program of a schedule: (mode, for mini-batches, computes the input's gradient)
_Variant = tuple[str, bool, bool]


class _Programs:
    """A layer's kernel programs, each compiled once and shared by the runners of all its graphs and
    batches. Per mode, the whole-graph program is made with the layer (a bad schedule fails there); the
    others on first use by ``make_point(mode, destinations, input_grad)``: the mini-batch programs
    (:attr:`~rgtune.ir.plan.LoweringPlan.destinations`: node values that only the destinations need are
    computed for them alone) and the training programs of the params' gradients alone
    (:func:`~rgtune.ir.autodiff.without_input_grad`: an input that needs no gradient, e.g. a first
    layer's features). Such a program that the schedule cannot make (invalid) gives way to the one with
    the input's gradient."""

    def __init__(self, backend: Backend, points: Mapping[str, Point],
                 make_point: Callable[[str, bool, bool], Point]) -> None:
        self.backend = backend
        self._points: dict[_Variant, Point] = {(mode, False, True): p for mode, p in points.items()}
        self._make_point = make_point
        self._compiled: dict[_Variant, CompiledProgram] = {}
        self._lock = threading.Lock()

    def _variant(self, mode: str, destinations: bool, input_grad: bool) -> _Variant:
        """The variant that runs for the arguments (an invalid params-only program: the full one)."""
        key = (mode, destinations, input_grad or mode != "training")  # an inference program has no gradients
        if key not in self._points:
            self._points[key] = self._make_point(*key)
        if not self._points[key].valid:
            return self._variant(mode, destinations, True)
        return key

    def compiled(self, mode: str, destinations: bool,
                 input_grad: bool = True) -> tuple[_Variant, KernelProgram, CompiledProgram]:
        """The variant that runs for ``mode`` (for batches or not; with the input's gradient or not), its
        kernel program, compiled on first use."""
        with self._lock:
            key = self._variant(mode, destinations, input_grad)
            point = self._points[key]
            if key not in self._compiled:
                self._compiled[key] = self.backend.compile(point.kernels, point.config)
            return key, point.kernels, self._compiled[key]


class _Runner:
    """The built programs of one tuned layer and what the autograd Function calls.

    The inference program runs a forward that needs no gradient; the training program (built on
    the first forward that does, unless the layer was made for training) runs its forward phase,
    hands the saved buffers to the Function, and its backward phase runs the generated backward
    kernels on them. A backend that builds training programs without separate phases
    (:attr:`BuiltProgram.phased`) runs the whole step in the backward, recomputing the forward with
    its kernels; one that cannot build them at all leaves the backward to the torch lowering.
    """

    def __init__(self, programs: _Programs, graph: "HeteroGraph | Batch", names: Sequence[str], eager: str) -> None:
        self.backend = programs.backend
        self.graph = graph
        self.names = tuple(names)
        #: the programs compiled for the schedule, shared by the runners of every graph and batch of the layer
        self._programs = programs
        self._destinations = isinstance(graph, Batch)  # a batch runs the mini-batch programs
        self._built: dict[tuple[str, bool], tuple[KernelProgram, BuiltProgram]] = {}
        self._lock = threading.Lock()
        self._executor: ReferenceExecutor | None = None
        self._eager = eager
        #: this runner's number for the custom ops that torch.compile traces (:mod:`rgtune.runtime.ops`)
        self.handle = ops.register(self)
        #: (training, input_grad) -> the shapes a program returns, for the ops' fake implementations
        self.layouts: dict[tuple[bool, bool], Any] = {}
        self.compiled(self.runs(eager))  # compiled now; bound to a graph when a call needs it

    def for_graph(self, graph: "HeteroGraph | Batch") -> "_Runner":
        """The same schedule's programs bound to ``graph``: nothing is generated or compiled again, the
        compiled programs are bound to the graph's index arrays (what a new mini-batch costs)."""
        return _Runner(self._programs, graph, self.names, self._eager)

    def runs(self, mode: str) -> str:
        """The program that runs for ``mode``: the inference one for training on a backend that builds
        no training programs (its backward is the torch lowering's)."""
        return mode if mode == "inference" or self.backend.training != "none" else "inference"

    def compiled(self, mode: str, input_grad: bool = True) -> tuple[KernelProgram, CompiledProgram]:
        """The kernel program of ``mode`` for this runner's kind of graph, compiled (once per layer, on first
        use); ``input_grad=False``: a training program of the params' gradients alone (see :class:`_Programs`)."""
        return self._programs.compiled(mode, self._destinations, input_grad)[1:]

    def program(self, mode: str, input_grad: bool = True) -> tuple[KernelProgram, BuiltProgram]:
        """The kernel program of ``mode`` and its build for this runner's graph (compiled once per layer,
        bound once per graph, both on first use)."""
        (mode, _, input_grad), kp, compiled = self._programs.compiled(mode, self._destinations, input_grad)
        with self._lock:  # keyed by the variant that runs: a fallback shares the full program's binding
            if (mode, input_grad) not in self._built:
                self._built[(mode, input_grad)] = (kp, compiled.bind(self.graph))
            return self._built[(mode, input_grad)]

    @property
    def built(self) -> dict[tuple[str, bool], tuple[KernelProgram, BuiltProgram]]:
        """``(mode, input_grad)`` -> the kernel program and its build for this runner's graph."""
        return dict(self._built)

    def backward_kind(self) -> str:
        """How a backward runs: ``"generated"`` (the backward kernels on saved buffers), ``"recompute"``
        (the whole training step in the backward) or ``"torch"`` (the torch lowering)."""
        return _BACKWARD_KINDS[self.backend.training]

    def forward(self, x: Tensor, params: Sequence[Tensor]) -> Tensor:
        with torch.no_grad():
            return self.program("inference")[1].run(x, dict(zip(self.names, params)))

    def forward_for_backward(self, x: Tensor, params: Sequence[Tensor],
                             input_grad: bool = True) -> tuple[Tensor, Saved | None]:
        """The output and what the backward reads (None: the backward recomputes from ``x`` and the params);
        ``input_grad=False``: for a backward of the params' gradients alone."""
        if self.backward_kind() != "generated":
            return self.forward(x, params), None
        kp, built = self.program("training", input_grad)
        with torch.no_grad():
            return built.run_forward(x, dict(zip(self.names, params)))

    def gradients_produced(self, input_grad: bool) -> tuple[bool, ...]:
        """Which of ``(x, *params)`` the backward gives a gradient (with the input's when ``input_grad``)."""
        kp = self.program(self.runs("training"), input_grad)[0]
        receivers = gradient_receivers(kp)
        return (input_grad and kp.input_grad is not None, *(n in receivers for n in self.names))

    def backward(self, x: Tensor, params: Sequence[Tensor], saved: Saved | None, grad_out: Tensor,
                 needs: Sequence[bool]) -> list[Tensor | None]:
        """Gradients w.r.t. ``(x, *params)`` (None where not needed)."""
        kind = self.backward_kind()
        if kind == "torch":
            return self._torch_vjp(x, params, grad_out, needs)
        kp, built = self.program("training", needs[0])  # the forward's program (it ran with the same needs)
        named = dict(zip(self.names, params))
        with torch.no_grad():
            if kind == "generated":
                assert saved is not None
                dx, grads = built.run_backward(x, named, saved, grad_out)
            else:
                _, dx, grads = built.run_training(x, named, grad_out)
        grads = learnable_grads(kp, self.graph, named, grads)
        return [g if n else None for g, n in zip((dx, *(grads.get(k) for k in self.names)), needs)]

    def _torch_vjp(self, x: Tensor, params: Sequence[Tensor], grad_out: Tensor,
                   needs: Sequence[bool]) -> list[Tensor | None]:
        """Gradients through the torch lowering of the inference program, recomputing its forward (for
        backends that build no training programs)."""
        kp = self.program("inference")[0]
        if self._executor is None or self._executor.kp is not kp:
            self._executor = ReferenceExecutor(kp, self.graph, x.device)
        ex = self._executor = self._executor.to(x.device)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(bool(n)) for t, n in zip((x, *params), needs)]
            # the executor keeps no buffers between runs: no autograd graph outlives the call, and
            # backwards of one layer in several threads do not mix
            out = ex.run(leaves[0], dict(zip(self.names, leaves[1:])))
            wrt = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
        return [next(grads) if t.requires_grad else None for t in leaves]


class _KernelFunction(torch.autograd.Function):
    """Forward: the training program's forward phase. Backward: its backward phase on what the forward
    saved (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, runner: _Runner, x: Tensor, *params: Tensor) -> Tensor:  # type: ignore[override]
        ctx.runner = runner
        # an input that needs no gradient (features, not embeddings): the program of the params' gradients
        out, saved = runner.forward_for_backward(x, params, input_grad=ctx.needs_input_grad[1])
        ctx.num_params = len(params)
        ctx.buffer_names = list(saved.buffers) if saved is not None else None
        ctx.param_names = list(saved.params) if saved is not None else []
        handed = [*saved.buffers.values(), *saved.params.values()] if saved is not None else []
        # through save_for_backward: autograd frees them with the graph (or keeps them for retain_graph)
        ctx.save_for_backward(x, *params, *handed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        with torch.autocast(grad_out.device.type, enabled=False):  # a backward called under autocast: fp32 folds
            return _KernelFunction._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, *rest = ctx.saved_tensors
        params, handed = rest[:ctx.num_params], rest[ctx.num_params:]
        saved = None
        if ctx.buffer_names is not None:
            nb = len(ctx.buffer_names)
            saved = Saved(dict(zip(ctx.buffer_names, handed[:nb])), dict(zip(ctx.param_names, handed[nb:])))
        grads = ctx.runner.backward(x, params, saved, grad_out.contiguous(), ctx.needs_input_grad[1:])
        return (None, *grads)


#: the dtypes ``torch.autocast`` computes in: an input in one is cast to the layer's dtype under autocast
_AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)
#: the storage type (``precision.*`` knobs) of the schedule a float32 layer runs under autocast in each dtype
_AUTOCAST_STORAGE = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _layer_dtypes(backend: Backend) -> tuple[torch.dtype, ...]:
    """The dtypes a layer on ``backend`` may have: the backend's, and on a float32 backend bfloat16 and float16
    (parameters and input converted to float32 copies for the kernels, the output converted back)."""
    return tuple(backend.dtypes) + (_AUTOCAST_DTYPES if torch.float32 in backend.dtypes else ())


def _graph_device(graph: Any) -> torch.device | None:
    """The device of a PyG ``HeteroData``'s or a DGL graph's edges (a rgtune graph's are on the CPU)."""
    device = getattr(graph, "device", None)  # a DGL graph
    if isinstance(device, torch.device):
        return device
    for store in getattr(graph, "edge_stores", ()):  # a PyG HeteroData (or Data)
        for value in store.values():
            if isinstance(value, Tensor):
                return value.device
    return None


def auto_layer_backend(device: torch.device | str | None, graph: Any) -> str:
    """What ``backend="auto"`` is for a layer on ``device`` (None: the graph's): ``cuda`` for a CUDA device,
    else ``cpu`` (``reference`` where the cpu backend cannot run here, e.g. without a C compiler)."""
    from rgtune.codegen.base import BackendError, available_backends

    where = torch.device(device) if device is not None else _graph_device(graph)
    usable = available_backends()
    if where is not None and where.type == "cuda":
        ok, why = usable.get("cuda", (False, "not registered"))
        if not ok:
            raise BackendError(f"Layer: the layer is on {where}, but the cuda backend cannot run here: {why}")
        return "cuda"
    return "cpu" if usable.get("cpu", (False, ""))[0] else ReferenceBackend.name


def layer_graph(graph: Any, who: str = "Layer") -> HeteroGraph:
    """A layer's graph: a :class:`HeteroGraph`, a PyG ``HeteroData`` or a DGL graph (converted, as ``tune`` and
    ``load_tuned`` convert them), or a dataset name (loaded)."""
    if isinstance(graph, HeteroGraph):
        return graph
    from rgtune.runtime._lookup import resolve_graph

    try:
        return resolve_graph(graph)
    except TypeError as e:
        raise TypeError(f"{who}: {e}") from None


def dtypes_in_words(backend: Backend) -> str:
    """What a layer on ``backend`` may be in, as error messages say it (true of the backend's declared dtypes).

    Example:
        >>> print(dtypes_in_words(create("cpu")))  # doctest: +NORMALIZE_WHITESPACE
        the cpu backend computes in torch.float32 (a layer in torch.float16 or torch.bfloat16 runs its kernels on
        float32 copies of its parameters and input; 16-bit storage of the intermediates is a schedule's precision.*
        knobs, load_tuned(..., precision='bf16') or tune --precision bf16); float64 runs on backend='reference'
    """
    computes = ", ".join(map(str, backend.dtypes))
    half = [str(d) for d in _layer_dtypes(backend) if d not in backend.dtypes]
    text = f"the {backend.name} backend computes in {computes}"
    if half:
        text += (f" (a layer in {' or '.join(half)} runs its kernels on float32 copies of its parameters and input; "
                 "16-bit storage of the intermediates is a schedule's precision.* knobs, "
                 "load_tuned(..., precision='bf16') or tune --precision bf16)")
    if torch.float64 not in backend.dtypes:
        text += "; float64 runs on backend='reference'"
    return text


def check_conversion(who: str, backend: Backend, fn: Callable[[Tensor], Tensor], like: Tensor) -> None:
    """Refuse a conversion (``module.to(dtype)``, ``.double()``, ``.half()``, ...; ``fn`` is what
    :meth:`torch.nn.Module._apply` applies) to a dtype ``backend`` cannot run, before any tensor is converted
    (``like``: one of the module's parameters)."""
    probe = fn(torch.zeros((), dtype=like.dtype, device=like.device))
    if isinstance(probe, Tensor) and probe.is_floating_point() and probe.dtype not in _layer_dtypes(backend):
        raise TypeError(f"{who}: cannot convert to {probe.dtype}: {dtypes_in_words(backend)}")


#: how a layer's backward runs, by how its backend runs training programs (:attr:`Backend.training`)
_BACKWARD_KINDS = {"phases": "generated", "step": "recompute", "none": "torch"}


def _default_param_dtype(backend: Backend) -> torch.dtype:
    """torch's default dtype where the backend computes in it, else the backend's own (float32
    for generated kernels): a layer never starts with parameters its kernels cannot read."""
    default = torch.get_default_dtype()
    return default if default in backend.dtypes else backend.dtypes[0]


def _configs(spaces: Mapping[str, SearchSpace], given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The inference and training configs of a layer given ``given``: the knobs of both spaces come
    from it (a knob neither has is an error), the rest take their defaults."""
    training = spaces["training"].resolve(given)  # the training space has every knob: unknown ones fail here
    inference_knobs = {k.name for k in spaces["inference"].knobs}
    inference = spaces["inference"].resolve({k: v for k, v in given.items() if k in inference_knobs})
    return inference, training


def _compiled(space: SearchSpace, config: Mapping[str, Any], who: str) -> Point:
    point = space.compile(config)
    if not point.valid:
        raise ValueError(f"{who}: the {space.mode} schedule is invalid for this workload: " + "; ".join(point.problems))
    return point


def init_param(p: Param, count: int | None, *, dtype: torch.dtype, device: torch.device | str | None) -> torch.nn.Parameter:
    """A fresh parameter for ``p``: one slice per type (``count`` of them; None: one for all),
    initialized as the program declares (``glorot``: uniform in ``±sqrt(6 / (fan_in + fan_out))``
    over the last two dims of the full tensor, as PyG's ``glorot``; ``zeros``; ``ones``; ``uniform``:
    in ``±1 / sqrt(p.fan_in)``, torch's ``Linear``)."""
    t = torch.empty(((count,) if count is not None else ()) + tuple(p.shape), dtype=dtype, device=device)
    with torch.no_grad():
        if p.init == "zeros":
            t.zero_()
        elif p.init == "ones":
            t.fill_(1.0)
        elif p.init == "uniform":
            bound = 1.0 / math.sqrt(p.fan_in or 1)
            t.uniform_(-bound, bound)
        else:
            fans = t.shape[-2:] if t.dim() >= 2 else (t.numel(), 1) if t.dim() == 1 else (1, 1)
            bound = math.sqrt(6.0 / (int(fans[0]) + int(fans[1])))
            t.uniform_(-bound, bound)
    return torch.nn.Parameter(t)


class Layer(GraphLayer):
    """A model's program as a trainable module, on generated kernels (see the module docstring).

    Args:
        model: a registered model's name (``"rgcn"``, ``"hgt"``, a name given to
            :func:`rgtune.register_model`, or ``"package.module:builder"``), or a
            :class:`~rgtune.ir.program.Program` (its sizes are the layer's).
        graph: the graph the layer is bound to (its node and edge types fix the parameters' shapes;
            the kernels are built for it; ``layer(x, graph=g)`` runs on another graph of those types): a
            :class:`HeteroGraph`, a PyG ``HeteroData`` or a DGL graph (converted, as ``rgtune.tune`` and
            ``load_tuned`` convert them), or a dataset name.
        in_dim, out_dim, heads: sizes (for a program: taken from it).
        options: the model's options (``{"num_bases": 30}``); see the model's registration.
        config: the schedule, ``knob -> value`` (missing knobs take their defaults); ``None``:
            the default schedule. Knobs of the backward (``autodiff.*``, ``scatter.*``,
            ``weightgrad.*``) shape the training program only.
        backend: ``"auto"`` (the default: ``cuda`` for a layer on a CUDA ``device``, or, without ``device``,
            for a graph whose edges are on a CUDA device; else ``cpu``, or ``reference`` where no C compiler
            runs here), a backend name (``"cpu"``, ``"cuda"``, ``"reference"``: plain torch, any float dtype,
            ``"pkg.mod:Class"``) or a :class:`~rgtune.codegen.base.Backend`.
        provenance: where the schedule came from (kept as :attr:`provenance`; see
            :func:`rgtune.runtime.load_tuned`).
        mode: what the schedule was tuned for: ``"inference"`` (the forward; the training program
            is built on the first forward that needs gradients, with the backward's knobs at their
            defaults) or ``"training"`` (the training step; its program is built at once).
        device, dtype: of the parameters (the ``cpu`` backend needs CPU float32).
            ``dtype=None``: torch's default dtype where the backend computes in it, else the
            backend's (float32 for ``cpu`` and ``cuda``, also under a float64 default dtype).

    Dtypes: the ``cpu`` and ``cuda`` backends compute in float32: a layer there is float32, or bfloat16 or
    float16 (its kernels read float32 copies); a conversion to another dtype (``.double()``,
    ``.to(torch.float64)``) is a ``TypeError`` where it is asked, naming what runs. An input of another dtype
    than the layer's is a ``ValueError`` naming the tensor. The ``reference`` backend runs in the layer's
    dtype (any float dtype).

    Threads: a layer may be called from several threads at once; its forwards run one at a
    time (one workspace per layer, guarded by a lock), its backwards side by side, and every
    result equals that of the same calls made one after another.

    Attributes:
        model: the model's name; options: its options (all, defaults included); program: the
        model's program (before the passes); mode: ``"inference"`` or ``"training"``; config: the
        full schedule of that mode; inference_config / training_config: the schedules of the
        inference program (a forward without gradients) and of the training program; kernels:
        the mode's :class:`KernelProgram`; backward_kind: how a backward runs; schedule(): all of
        it as a dict; backend: the backend's name; ``sources`` / ``source_hash``: the generated
        code; provenance: a dict (``source`` is ``"database"``, ``"default"`` or ``"export"``, ...).
    """

    def __init__(
        self,
        model: str | Program,
        graph: HeteroGraph,
        in_dim: int | None = None,
        out_dim: int | None = None,
        heads: int | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        backend: str | Backend = "auto",
        provenance: Mapping[str, Any] | None = None,
        mode: str = "inference",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        autocast_config: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        program, name, resolved = _program(model, in_dim, out_dim, heads, options)
        if backend == "auto":  # the best backend for where the layer lives, as load_tuned and the drop-ins pick
            backend = auto_layer_backend(device, graph)
            device = create(backend).device_type if device is None else device
        graph = layer_graph(graph, type(self).__name__)
        super().__init__(graph, program.in_dim, program.out_dim, heads=program.heads)
        self.model, self.options, self.program = name, resolved, program
        be = create(backend) if isinstance(backend, str) else backend
        if dtype is None:
            dtype = _default_param_dtype(be)
        elif dtype not in _layer_dtypes(be):  # refused now, not at the first call
            raise TypeError(f"{type(self).__name__}: dtype={dtype} is not one the {be.name} backend runs "
                            f"({', '.join(map(str, _layer_dtypes(be)))}); under torch.autocast a float32 layer takes "
                            "half-precision inputs")
        counts = {"rel": graph.num_rels, "ntype": graph.num_ntypes, "none": None}
        for pname, p in program.state_params().items():
            self.register_parameter(pname, init_param(p, counts[p.by], dtype=dtype, device=device))
        self._backend = be
        self._backend_spec = backend if isinstance(backend, str) else self._backend.name  # for unpickling
        if mode not in MODES:
            raise ValueError(f"{type(self).__name__}: unknown mode {mode!r}; choose one of {list(MODES)}")
        self.mode = mode
        spaces = self._spaces(graph)
        self.inference_config, self.training_config = _configs(spaces, dict(config or {}))
        self.autocast_configs: dict[str, dict[str, dict[str, Any]]] = {}
        for storage, given in (autocast_config or {}).items():
            if storage not in _AUTOCAST_STORAGE.values():
                raise ValueError(f"{type(self).__name__}: autocast_config has a schedule for {storage!r}; its keys are "
                                 f"the 16-bit storage types, {sorted(_AUTOCAST_STORAGE.values())}")
            inference, training = _configs(spaces, dict(given))
            self.autocast_configs[storage] = {"inference": inference, "training": training}
        self.provenance: dict[str, Any] = dict(provenance or {"source": "explicit" if config else "default"})
        self._start_runner()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> "Layer":
        # .to(dtype), .double(), .half(), ...: a dtype the backend cannot run is refused here, not at the first call
        backend, first = self.__dict__.get("_backend"), next(iter(self._parameters.values()), None)
        if backend is not None and first is not None:
            check_conversion(type(self).__name__, backend, fn, first)
        return super()._apply(fn, recurse)

    def reset_parameters(self) -> None:
        """Initialize every parameter as the program declares (see :func:`init_param`)."""
        counts = {"rel": self.graph.num_rels, "ntype": self.graph.num_ntypes, "none": None}
        for pname, p in self.program.state_params().items():
            mine = self._parameters[pname]
            assert mine is not None
            with torch.no_grad():
                mine.copy_(init_param(p, counts[p.by], dtype=mine.dtype, device=mine.device))

    # ------------------------------------------------------------------ copies and pickles
    def __getstate__(self) -> dict[str, Any]:
        # Compiled code does not pickle: copy.deepcopy and torch.save keep the schedule, the
        # kernels are rebuilt from it when the copy is made or loaded (a compile-cache hit).
        state = dict(self.__dict__)
        state["_runner"] = None
        state["_backend"] = None
        state["_other_graphs"] = None
        state["_last_batch"] = None
        state["_autocast_runners"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._backend = create(self._backend_spec)
        self._start_runner()

    def _spaces(self, graph: HeteroGraph) -> dict[str, SearchSpace]:
        # a schedule given to a layer may store intermediates in 16 bits (precision.edges): it is the user's choice
        return {m: SearchSpace(self.program, graph, self._backend.target, mode=m, precision="any") for m in MODES}

    def _start_runner(self) -> None:
        """Compile both programs (a bad schedule fails here), build the one of the layer's mode now and
        the other when first needed."""
        self._runner = self._new_runner(self.graph, eager=self.mode)
        # keyed by (graph, the storage of an autocast call's schedule; None: the layer's own)
        self._other_graphs: OrderedDict[tuple[int, str | None], tuple[HeteroGraph, _Runner]] | None = OrderedDict()
        self._last_batch: tuple[Batch, str | None, _Runner] | None = None  # the batch just bound (bind, then the call)
        self._autocast_runners: dict[str, _Runner | None] = {}  # by storage type; None: none (built on first use)

    def _new_runner(self, graph: HeteroGraph, eager: str, configs: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> _Runner:
        """The runner of the layer's own graph: both programs compiled (the schedule checked on it);
        ``configs``: other schedules than the layer's (by mode)."""
        spaces, name = self._spaces(graph), type(self).__name__
        configs = configs or {"inference": self.inference_config, "training": self.training_config}
        points = {m: _compiled(spaces[m], configs[m], name) for m in MODES}
        self._param_names = self._kernel_param_names(points["inference"].kernels)  # the learnable ones

        def variant_point(mode: str, destinations: bool, input_grad: bool) -> Point:
            space = SearchSpace(self.program, graph, self._backend.target, mode, destinations, input_grad, "any")
            if not input_grad:  # may be invalid: the layer then runs the program with the input's gradient
                return space.compile(configs[mode])
            return _compiled(space, configs[mode], f"{name} (on mini-batches)")

        names = [*self._param_names, *([EDGE_WEIGHT] if reads_edge_weight(self.program) else [])]
        return _Runner(_Programs(self._backend, points, variant_point), graph, names, eager=eager)

    def autocast_schedule(self, dtype: torch.dtype) -> dict[str, dict[str, Any]] | None:
        """The schedules (by mode) a call under ``torch.autocast(dtype=dtype)`` runs, None where it runs the
        layer's own in float32 (a layer not in float32, a dtype autocast does not compute in, or a target
        that stores no such type). They are the ones given for that type (``autocast_config``;
        :func:`~rgtune.runtime.load.load_tuned` finds those tuned with ``--precision bf16`` or ``fp16``),
        else the layer's own with every ``precision.*`` knob at that type: the same program, its
        intermediates stored in 16 bits, its sums still float32.

        Example:
            >>> from rgtune.data.synthetic import random_graph
            >>> layer = Layer("rgcn", random_graph((10, 20), 3, 100, seed=0), 4, 8, backend="reference")
            >>> layer.autocast_schedule(torch.bfloat16)["training"]["precision.edges"]
            'bfloat16'
            >>> layer.autocast_schedule(torch.float64) is None
            True
        """
        storage = _AUTOCAST_STORAGE.get(dtype)
        if storage is None or self._param_dtype() != torch.float32:
            return None
        if storage in self.autocast_configs:
            return {m: dict(c) for m, c in self.autocast_configs[storage].items()}
        spaces = self._spaces(self.graph)
        out = {"inference": dict(self.inference_config), "training": dict(self.training_config)}
        for mode, config in out.items():
            for knob in (spaces[mode].knob(k.name) for k in STORAGE_KNOBS if k.name in config):
                if storage not in knob.choices:
                    return None  # this target stores no such type
                config[knob.name] = storage
        return out

    def _autocast_runner(self, dtype: torch.dtype) -> "tuple[str, _Runner] | None":
        """(storage, runner) of the schedules :meth:`autocast_schedule` names, built on first use; None: none."""
        storage = _AUTOCAST_STORAGE.get(dtype)
        if storage is None:
            return None
        runners = self._autocast_runners
        if storage not in runners:
            configs = self.autocast_schedule(dtype)
            runners[storage] = None if configs is None else self._new_runner(self.graph, self.mode, configs)
        runner = runners[storage]
        return None if runner is None else (storage, runner)

    def _runner_for(self, graph: "HeteroGraph | Batch | None", autocast: "tuple[str, _Runner] | None" = None
                    ) -> _Runner:
        """The runner of ``graph`` (None or the bound graph: the layer's own): the same schedule's compiled
        programs bound to that graph; a graph's binding is kept for the last few graphs, a batch's is not
        (a batch is used once: its forward and its backward share the runner the call made). ``autocast``:
        (storage, runner) of the schedule an autocast call runs instead of the layer's own."""
        storage, base = autocast if autocast is not None else (None, self._runner)
        if graph is None or graph is self.graph:
            return base
        if not isinstance(graph, (HeteroGraph, Batch)):
            raise TypeError(f"{type(self).__name__}: graph must be a rgtune HeteroGraph or Batch, got "
                            f"{type(graph).__name__}")
        self._check_types(graph)
        if isinstance(graph, Batch):
            last = self._last_batch
            if last is None or last[0] is not graph or last[1] != storage:
                last = self._last_batch = (graph, storage, base.for_graph(graph))
            return last[2]
        cache = self._other_graphs
        if cache is None:
            cache = self._other_graphs = OrderedDict()
        key = (id(graph), storage)
        kept = cache.pop(key, None)
        runner = kept[1] if kept is not None and kept[0] is graph else base.for_graph(graph)
        cache[key] = (graph, runner)
        while len(cache) > _GRAPHS_KEPT:
            cache.popitem(last=False)
        return runner

    def bind(self, graph: "HeteroGraph | Batch", mode: str | None = None, input_grad: bool = True) -> None:
        """Bind the layer's compiled kernels to ``graph`` (a graph of its types, or a mini-batch's
        :class:`~rgtune.data.batch.Batch`) now, rather than in the first call on it: build its index
        arrays and the kernels' tables over them. The next call with that graph or batch finds them;
        a loader may bind the next batch while the current one trains. ``mode``: the program to bind,
        ``"training"`` (what a call with gradients runs) or ``"inference"``; default the layer's mode.
        ``input_grad=False``: the call's input will need no gradient (a first layer's features), so bind
        the training program of the params' gradients alone, what that call runs."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"{type(self).__name__}.bind: unknown mode {mode!r}; choose one of {list(MODES)}")
        runner = self._runner_for(graph)
        runner.program(runner.runs(mode or self.mode), input_grad)

    def _check_types(self, graph: "HeteroGraph | Batch") -> None:
        """``graph`` has the layer's node and edge types (a batch's may be empty, never other ones)."""
        if (graph.ntypes, graph.canonical_etypes) == (self.graph.ntypes, self.graph.canonical_etypes):
            return
        missing = [t for t in (*self.graph.ntypes, *self.graph.canonical_etypes)
                   if t not in (*graph.ntypes, *graph.canonical_etypes)]
        extra = [t for t in (*graph.ntypes, *graph.canonical_etypes)
                 if t not in (*self.graph.ntypes, *self.graph.canonical_etypes)]
        what = f"missing {missing[:3]}" if missing else f"unknown {extra[:3]}" if extra else "in another order"
        error = BatchTypeError if isinstance(graph, Batch) else GraphMismatchError
        raise error(f"{type(self).__name__}: {type(graph).__name__.lower()} {graph.name!r} has other node or edge "
                    f"types than {self.graph.name!r}, the graph the layer's parameters were made for ({what})")

    # ------------------------------------------------------------------ what was built
    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def config(self) -> dict[str, Any]:
        """The full schedule of the layer's mode (every knob of its search space)."""
        return self.training_config if self.mode == "training" else self.inference_config

    @property
    def kernels(self) -> KernelProgram:
        """The kernel program of the layer's mode (a training program's holds the forward's kernels; on
        a backend that builds no training programs, the inference program)."""
        return self._runner.compiled(self._runner.runs(self.mode))[0]

    @property
    def sources(self) -> dict[str, str]:
        """Generated source files of the layer's mode, name -> text (``reference``: the kernel IR as text)."""
        return dict(self._runner.compiled(self._runner.runs(self.mode))[1].sources)

    @property
    def source_hash(self) -> str:
        return source_hash(self.sources)

    @property
    def backward_kind(self) -> str:
        """How the layer's backward runs: ``"generated"`` (the training program's backward kernels on the
        buffers its forward saved), ``"recompute"`` (the backend runs whole training steps only: the
        step runs in the backward) or ``"torch"`` (the backend builds no training programs: the torch
        lowering's autograd). It is what the backend declares (:attr:`Backend.training`)."""
        return self._runner.backward_kind()

    def schedule(self) -> dict[str, Any]:
        """Which schedule the layer runs: its mode, both configs and where they came from."""
        return {"mode": self.mode, "inference": dict(self.inference_config), "training": dict(self.training_config),
                "provenance": dict(self.provenance)}

    def _kernel_param_names(self, kp: KernelProgram) -> list[str]:
        derived = {k.out for k in kp.kernels if isinstance(k, WeightKernel)}
        needed = [n for n in kp.param_shapes if n not in derived]
        mine = dict(self.named_parameters())
        missing = [n for n in needed if n not in mine]
        if missing:  # the kernels read a param the program does not declare: a bug, say which
            raise RuntimeError(f"{type(self).__name__}: the kernel program needs params {missing} "
                               f"that the layer does not have ({sorted(mine)})")
        return needed

    # ------------------------------------------------------------------ checks before any kernel runs
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_runnable(self) -> None:
        name, device = type(self).__name__, self._device()
        self._check_param_dtypes()
        want = self._backend.device_type
        if device.type != want:
            raise ValueError(f"{name}: the layer's parameters are on {device}, but the {self.backend} backend "
                             f"runs on {want} tensors; move the layer with .to({want!r}), or make it with "
                             f"device={device.type!r} (backend='auto' picks that device's backend)")

    def _check_param_dtypes(self) -> None:
        """Every parameter in one dtype, one the backend runs (else a TypeError naming it)."""
        name, allowed = type(self).__name__, _layer_dtypes(self._backend)
        first, dtype = next(iter(self.named_parameters()))[0], self._param_dtype()
        for pname, p in self.named_parameters():
            if p.dtype not in allowed:
                hint = " (use backend='reference' for float64, e.g. for gradcheck)" if p.dtype == torch.float64 else ""
                half = [str(d) for d in allowed if d not in self._backend.dtypes]
                also = f" (or to {' or '.join(half)}: run through float32 copies)" if half else ""
                raise TypeError(f"{name}: parameter {pname!r} is {p.dtype}, but the {self.backend} backend computes "
                                f"in {', '.join(map(str, self._backend.dtypes))}; convert the layer with .float()"
                                f"{also}{hint}")
            if p.dtype != dtype:
                raise TypeError(f"{name}: parameter {pname!r} is {p.dtype}, but {first!r} is {dtype}; a layer's "
                                f"parameters share one dtype (convert the layer with .to({dtype}))")

    def _check_tensor(self, x: Tensor, rows: int, what: str) -> None:
        allowed, mine = _layer_dtypes(self._backend), self._param_dtype()
        if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != mine:
            # the layer may be converted to the input's dtype only where the backend runs that dtype
            layer = f", or the layer with .to({x.dtype})" if x.dtype in allowed else ""
            raise ValueError(f"{type(self).__name__}: {what} has dtype {x.dtype}, expected {mine} (the layer's dtype); "
                             f"convert the input with .to({mine}){layer} ({dtypes_in_words(self._backend)})")
        if isinstance(x, Tensor) and x.dim() == 2 and x.size(0) != rows:  # in the caller's words: x, x['paper']
            block, ntype = what.startswith("block "), what.split("node type ", 1)[1] if "node type " in what else None
            nodes = ("source nodes" if block else "nodes") + (f" of type {ntype}" if ntype else "")
            given = f"{'x' if ntype is None else f'x[{ntype}]'} has {x.size(0)} row{'' if x.size(0) == 1 else 's'}"
            raise ValueError(f"{type(self).__name__}: {given} but the {'block' if block else 'graph'} has {rows} {nodes}")
        super()._check_tensor(x, rows, what)
        device = self._device()
        if x.device != device:
            raise ValueError(f"{type(self).__name__}: {what} is on {x.device}, expected {device} "
                             f"(the layer's device); move it with .to({str(device)!r})")

    def forward(self, x: NodeInput, graph: "HeteroGraph | Batch | None" = None, *,
                edge_weight: Tensor | Mapping[Any, Tensor] | None = None) -> NodeInput:
        """``x``: ``(num_nodes, in_dim)`` in global node order, or ``{ntype: (n_t, in_dim)}``, of the bound
        graph or of ``graph`` (same node and edge types). Returns the output in the same form; runs the
        generated kernels (see the module docstring).

        With a :class:`~rgtune.data.batch.Batch` (a mini-batch's block), ``x`` is its source nodes' input,
        ``{ntype: (num_src[t], in_dim)}`` (each type's destinations first) or one tensor in the batch's
        global order, and the output is its destinations': ``{ntype: (num_dst[t], out_dim)}`` or
        ``(num_dst_nodes, out_dim)``.

        ``edge_weight``: for a program that reads the caller's per-edge weight (``ProgramBuilder.edge_weight``,
        e.g. ``rgcn`` with ``aggr="weighted"``), one value per edge of the graph or batch the call runs on:
        ``(num_edges,)`` or ``(num_edges, 1)`` in its edge order (relation by relation, each relation's edges in
        their order: :attr:`HeteroGraph.src`'s), or ``{canonical edge type: (edges of it,)}``. It gets no
        gradient (a constant of the call, as DGL's ``norm``)."""
        device = self._device().type
        if torch.is_autocast_enabled(device):
            low = torch.get_autocast_dtype(device)
            # the kernels compute in the layer's dtype: what runs around them (weight folds) must too
            with torch.autocast(device, enabled=False):
                autocast = self._autocast_runner(low)
                if autocast is None:  # the layer's own schedule, in its dtype
                    return self.forward(self._autocast_input(x), graph, edge_weight=edge_weight)
                # like an op autocast runs in its lower type: the 16-bit schedule, the output in that type
                return self._forward(self._autocast_input(x), graph, autocast, low, edge_weight)
        return self._forward(x, graph, edge_weight=edge_weight)

    def _forward(self, x: NodeInput, graph: "HeteroGraph | Batch | None",
                 autocast: "tuple[str, _Runner] | None" = None, out_dtype: torch.dtype | None = None,
                 edge_weight: Tensor | Mapping[Any, Tensor] | None = None) -> NodeInput:
        self._check_runnable()
        runner = self._runner_for(graph, autocast)
        weight = _edge_weight_input(self, runner, edge_weight)
        if not isinstance(runner.graph, Batch):
            flat, as_dict = self._to_flat(x, runner.graph)
            return self._from_flat(self._run(runner, flat, out_dtype, weight), as_dict, runner.graph)
        batch = runner.graph
        if isinstance(x, Mapping):
            for t, v in x.items():
                if t in batch.num_src:
                    self._check_tensor(v, batch.num_src[t], f"block input for node type {t!r}")
            flat = batch.flatten_src(x)
        else:
            self._check_tensor(x, batch.num_nodes(), "block input")
            flat = x
        out = self._run(runner, flat, out_dtype, weight)  # a batch's program computes the destinations' rows alone
        return batch.split_dst(out) if isinstance(x, Mapping) else out

    def _forward_flat(self, x: Tensor) -> Tensor:
        return self._run(self._runner, x)

    def _autocast_input(self, x: NodeInput) -> NodeInput:
        """Under ``torch.autocast`` (on the layer's device type), a half-precision input (what autocast's
        earlier ops return) is cast to the layer's dtype, as autocast casts the inputs of the ops it runs in
        float32, and the output is in the layer's dtype; outside autocast a dtype mismatch is an error."""
        dtype = self._param_dtype()

        def cast(t: Any) -> Any:
            return t.to(dtype) if isinstance(t, Tensor) and t.dtype in _AUTOCAST_DTYPES and t.dtype != dtype else t

        return {k: cast(v) for k, v in x.items()} if isinstance(x, Mapping) else cast(x)

    def _run(self, runner: _Runner, x: Tensor, out_dtype: torch.dtype | None = None,
             edge_weight: Tensor | None = None) -> Tensor:
        params = [self._parameters[n] for n in self._param_names]
        if edge_weight is not None:  # the caller's per-edge weight travels last, as params[EDGE_WEIGHT]
            params.append(edge_weight)
        if out_dtype is not None:  # an autocast call: float32 in, the autocast type out (gradients back as they came)
            return self._run_float32(runner, x, params).to(out_dtype)
        half = x.dtype if x.dtype in _AUTOCAST_DTYPES and x.dtype not in self._backend.dtypes else None
        if half is not None:
            # a layer in bfloat16 or float16 on a float32 backend: the kernels read float32 copies (casts autograd
            # records, so the gradients come back in the layer's dtype) and the output is the layer's dtype
            out = self._run_float32(runner, x.float(), [p.float() for p in params])
            return out.to(half)
        return self._run_float32(runner, x, params)

    @staticmethod
    def _run_float32(runner: _Runner, x: Tensor, params: list[Tensor]) -> Tensor:
        if torch.compiler.is_compiling():  # traced: the kernels as custom ops, one graph with no break
            return ops.forward(runner, x, params)
        if ops.wants_grad(x, params):
            return _KernelFunction.apply(runner, x, *params)
        return runner.forward(x, params)  # no gradient: the inference program, nothing saved

    def extra_repr(self) -> str:
        src = self.provenance.get("source", "?")
        where = f"trial {self.provenance['trial_id']}" if self.provenance.get("trial_id") is not None else src
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return (f"model={self.model!r}{', ' + opts if opts else ''}, {super().extra_repr()}, backend={self.backend!r}, "
                f"mode={self.mode!r}, schedule={where}")


def _edge_weight_input(layer: Layer, runner: _Runner, weight: Tensor | Mapping[Any, Tensor] | None
                       ) -> Tensor | None:
    """The call's ``edge_weight`` as one ``(E,)`` tensor in the edge order of the runner's graph or batch, in the
    layer's dtype, detached (no gradient); None for a program that reads none (then giving one is an error)."""
    name, graph = type(layer).__name__, runner.graph
    # the bound graph's counts as Python ints (no tensor read: torch.compile traces this without a break)
    bounds = layer.rel_offsets if graph is layer.graph else [int(v) for v in graph.rel_offsets]
    edges = bounds[-1]
    if EDGE_WEIGHT not in runner.names:
        if weight is not None:
            raise ValueError(f"{name}: edge_weight was given, but model {layer.model!r} with options "
                             f"{layer.options} reads no per-edge weight (rgcn reads one with aggr='weighted')")
        return None
    if weight is None:
        raise ValueError(f"{name}: model {layer.model!r} reads a per-edge weight: call it with edge_weight=w, w of "
                         f"shape ({edges},) or ({edges}, 1) (one per edge of "
                         f"{type(graph).__name__.lower()} {graph.name!r})")
    if isinstance(weight, Mapping):
        unknown = [k for k in weight if tuple(k) not in graph.canonical_etypes]
        if unknown:
            raise ValueError(f"{name}: edge_weight has edge types {unknown} that the graph does not have; its "
                             f"canonical edge types: {graph.canonical_etypes}")
        parts = []
        for r, cet in enumerate(graph.canonical_etypes):
            n = bounds[r + 1] - bounds[r]
            w = next((v for k, v in weight.items() if tuple(k) == cet), None)
            if w is None:
                if n:
                    raise ValueError(f"{name}: edge_weight has no entry for edge type {cet} ({n} edges)")
                continue
            w = w.reshape(-1) if w.dim() == 2 and w.shape[1] == 1 else w
            if w.dim() != 1 or w.shape[0] != n:
                raise ValueError(f"{name}: edge_weight of edge type {cet} has shape {tuple(w.shape)}, but the "
                                 f"edge type has {n} edges")
            parts.append(w)
        weight = torch.cat(parts) if parts else torch.zeros(0, device=layer._device())
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        raise TypeError(f"{name}: edge_weight must be a floating-point tensor, got "
                        f"{weight.dtype if isinstance(weight, Tensor) else type(weight).__name__}")
    w = weight.reshape(-1) if weight.dim() == 2 and weight.shape[1] == 1 else weight
    if w.dim() != 1 or w.shape[0] != edges:
        got = f"{w.shape[0]} values" if w.dim() == 1 else f"shape {tuple(weight.shape)}"
        raise ValueError(f"{name}: edge_weight has {got}, but {type(graph).__name__.lower()} {graph.name!r} has "
                         f"{edges} edges (one weight per edge: ({edges},) or "
                         f"({edges}, 1))")
    dtype = layer._param_dtype()  # a 16-bit layer's kernels read float32: its weights are not rounded to 16 bits
    return w.detach().to(device=layer._device(), dtype=torch.float32 if dtype in _AUTOCAST_DTYPES else dtype)


def _program(model: str | Program, in_dim: int | None, out_dim: int | None, heads: int | None,
             options: Mapping[str, Any] | None) -> tuple[Program, str, dict[str, Any]]:
    """The layer's program, the model's name and its options (all of them)."""
    if isinstance(model, Program):
        if options:
            raise ValueError(f"Layer: options {dict(options)} are for a model name; a program has its options built in")
        for what, given, own in (("in_dim", in_dim, model.in_dim), ("out_dim", out_dim, model.out_dim),
                                 ("heads", heads, model.heads)):
            if given is not None and given != own:
                raise ValueError(f"Layer: {what}={given} differs from the program's {what}={own}")
        return model, model.name, {}
    if not isinstance(model, str):
        raise TypeError(f"Layer: model must be a model name or a Program, got {type(model).__name__}")
    if in_dim is None or out_dim is None:
        raise ValueError(f"Layer: model {model!r} needs in_dim and out_dim")
    spec = model_spec(model)
    resolved = spec.resolve(options)
    try:
        return spec.build(in_dim, out_dim, 1 if heads is None else heads, resolved), spec.name, resolved
    except ValueError as e:  # IRError: a bad size for this model, said by its builder
        raise ValueError(f"Layer: {e}") from None
