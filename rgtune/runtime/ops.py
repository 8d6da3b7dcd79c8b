"""A layer's kernels as torch custom ops: what ``torch.compile`` sees of a :class:`~rgtune.runtime.module.Layer`.

Traced by ``torch.compile``, a layer's call is one opaque op (its generated kernels run as they run
eagerly), and its backward another, so a model of several layers compiles into one graph
(``fullgraph=True``) with no graph break: Dynamo traces the layer's Python (checks, the dict
input's concatenation) and puts the op where the kernels run. Eager calls do not go through these
ops (the layer's :class:`torch.autograd.Function` calls the runner directly, without the
dispatcher's overhead); both run the same programs and give the same numbers.

The ops (``torch.ops.rgtune.*``):

* ``forward(handle, x, params) -> out``: the inference program;
* ``forward_for_backward(handle, input_grad, x, params) -> (out, handed)``: the training program's
  forward phase and what its backward reads (:class:`~rgtune.codegen.base.Saved`): ``handed`` holds
  those saved tensors that are not views of the output, the input or a param (a custom op's outputs
  may alias neither its inputs nor each other); the views are rebuilt from a layout recorded per
  program (:class:`_Layout`);
* ``backward(handle, input_grad, needs, x, params, out, handed, grad_out) -> grads``: the backward
  phase: one gradient per ``(x, *params)``, empty where ``needs`` says none is wanted.

``handle`` numbers the runner (a layer's programs bound to a graph) in a registry of live runners;
a compiled graph keeps the numbers of the layers it traced (random numbers: see :func:`register`). A fake implementation gives each op's
output shapes for tracing: they depend on the graph and the program, not on values, and are learned
once per program by running it on zeros (the first trace of a layer runs its kernels once).

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.runtime.module import Layer
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> model = torch.nn.Sequential(Layer("rgcn", g, 4, 8, backend="cpu"), torch.nn.ReLU(),
    ...                             Layer("rgcn", g, 8, 3, backend="cpu"))
    >>> x = torch.randn(30, 4)
    >>> torch._dynamo.explain(model)(x).graph_break_count
    0
    >>> compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    >>> bool(torch.allclose(compiled(x), model(x), atol=1e-5))
    True
"""

from __future__ import annotations

import secrets
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

from rgtune.codegen.base import Saved

__all__ = ["register", "forward", "module_forward", "wants_grad"]

_RUNNERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def register(runner: Any) -> int:
    """A number for ``runner`` (held weakly: the runner lives as long as its layer keeps it).

    Random, not counted: a compiled graph holds the number as a constant, and torch.compile's on-disk
    caches key graphs by their text, so a number that another process gave to another program would
    let a cached graph of that program (its output shapes) run on this one."""
    handle = secrets.randbits(62)
    while handle in _RUNNERS:
        handle = secrets.randbits(62)
    _RUNNERS[handle] = runner
    return handle


def _runner(handle: int) -> Any:
    runner = _RUNNERS.get(handle)
    if runner is None:
        raise RuntimeError(f"rgtune: the kernels #{handle} that this compiled model calls are gone (their layer "
                           f"was deleted or rebuilt, e.g. copied or unpickled); compile the model again")
    return runner


@dataclass(frozen=True)
class _Ref:
    """Where one saved tensor comes from: ``source`` (``out``, ``x``, ``param`` or ``handed``) number
    ``index``, viewed with ``shape``/``stride``/``offset`` (None: the tensor itself)."""

    source: str
    index: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None


@dataclass(frozen=True)
class _Layout:
    """A program's output shape and, for a training program's forward phase, what it hands to the
    backward: the shapes and dtypes of ``handed`` and how each saved tensor is found (``refs``, in the
    order of ``buffers`` then ``params``; None: nothing is saved, the backward recomputes)."""

    out: tuple[int, ...]
    handed: tuple[tuple[tuple[int, ...], torch.dtype], ...] = ()
    refs: tuple[_Ref, ...] | None = None
    buffers: tuple[str, ...] = ()
    params: tuple[str, ...] = ()

    @property
    def reads_out(self) -> bool:
        return any(r.source == "out" for r in self.refs or ())


def _hand_over(out: Tensor, saved: Saved | None, x: Tensor, params: Sequence[Tensor]) -> tuple[_Layout, list[Tensor]]:
    """The layout of ``saved`` and the tensors to hand over (those that view no other one)."""
    if saved is None:
        return _Layout(tuple(out.shape)), []
    bases: list[tuple[str, int, Tensor]] = [("out", 0, out), ("x", 0, x), *(("param", i, p) for i, p in enumerate(params))]
    handed: list[Tensor] = []
    refs = []
    for t in (*saved.buffers.values(), *saved.params.values()):
        ref = None
        for source, index, base in bases:
            if t.numel() and base.numel() and t.dtype == base.dtype \
                    and t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
                same = (t.shape, t.stride(), t.storage_offset()) == (base.shape, base.stride(), base.storage_offset())
                ref = _Ref(source, index, None if same else (tuple(t.shape), tuple(t.stride()), t.storage_offset()))
                break
        if ref is None:
            ref = _Ref("handed", len(handed), None)
            bases.append(("handed", len(handed), t))
            handed.append(t)
        refs.append(ref)
    layout = _Layout(tuple(out.shape), tuple((tuple(t.shape), t.dtype) for t in handed), tuple(refs),
                     tuple(saved.buffers), tuple(saved.params))
    return layout, handed


def _take_over(layout: _Layout, out: Tensor | None, x: Tensor, params: Sequence[Tensor],
               handed: Sequence[Tensor]) -> Saved | None:
    """The :class:`Saved` that :func:`_hand_over` took apart."""
    if layout.refs is None:
        return None
    tensors = []
    for r in layout.refs:
        base = {"out": lambda: out, "x": lambda: x, "param": lambda: params[r.index],
                "handed": lambda: handed[r.index]}[r.source]()
        assert base is not None, "the output is saved but was not handed to the backward"
        tensors.append(base if r.view is None else base.as_strided(*r.view))
    nb = len(layout.buffers)
    return Saved(dict(zip(layout.buffers, tensors[:nb])), dict(zip(layout.params, tensors[nb:])))


def _layout(handle: int, training: bool, input_grad: bool, x: Tensor, params: Sequence[Tensor]) -> _Layout:
    """The layout of a program, learned by running it once on zeros (real tensors, outside any tracing
    mode) the first time a trace asks for it."""
    runner = _runner(handle)
    key = (training, input_grad)
    if key not in runner.layouts:
        with _disable_current_modes(), torch.no_grad():
            x0 = torch.zeros([int(s) for s in x.shape], dtype=x.dtype, device=x.device)
            p0 = [torch.zeros([int(s) for s in p.shape], dtype=p.dtype, device=p.device) for p in params]
            if training:
                _forward_for_backward(handle, input_grad, x0, p0)  # records the layout
            else:
                runner.layouts[key] = _Layout(tuple(runner.forward(x0, p0).shape))
    return runner.layouts[key]


@torch.library.custom_op("rgtune::forward", mutates_args=())
def _forward(handle: int, x: Tensor, params: list[Tensor]) -> Tensor:
    return _runner(handle).forward(x, params)


@_forward.register_fake
def _(handle: int, x: Tensor, params: list[Tensor]) -> Tensor:
    return x.new_empty(_layout(handle, False, True, x, params).out)


@torch.library.custom_op("rgtune::forward_for_backward", mutates_args=())
def _forward_for_backward(handle: int, input_grad: bool, x: Tensor, params: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    runner = _runner(handle)
    if runner.backward_kind() == "torch":
        raise NotImplementedError(f"rgtune: the {runner.backend.name} backend builds no training programs; its layers "
                                  f"train through torch autograd, which torch.compile cannot trace inside an op")
    out, saved = runner.forward_for_backward(x, params, input_grad)
    runner.layouts[(True, input_grad)], handed = _hand_over(out, saved, x, params)
    return out, handed


@_forward_for_backward.register_fake
def _(handle: int, input_grad: bool, x: Tensor, params: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    layout = _layout(handle, True, input_grad, x, params)
    return x.new_empty(layout.out), [x.new_empty(shape, dtype=dtype) for shape, dtype in layout.handed]


@torch.library.custom_op("rgtune::backward", mutates_args=())
def _backward(handle: int, input_grad: bool, needs: list[bool], x: Tensor, params: list[Tensor], out: Optional[Tensor],
              handed: list[Tensor], grad_out: Tensor) -> list[Tensor]:
    runner = _runner(handle)
    saved = _take_over(runner.layouts[(True, input_grad)], out, x, params, handed)
    grads = runner.backward(x, params, saved, grad_out.contiguous(), needs)
    # one tensor per input: empty where none is wanted or the program gives none
    return [g if n and g is not None else t.new_empty(0) for g, t, n in zip(grads, (x, *params), needs)]


@_backward.register_fake
def _(handle: int, input_grad: bool, needs: list[bool], x: Tensor, params: list[Tensor], out: Optional[Tensor],
      handed: list[Tensor], grad_out: Tensor) -> list[Tensor]:
    # a param the program does not read gets None, as autograd gives it: an empty tensor here
    produced = _runner(handle).gradients_produced(input_grad)
    return [torch.empty_like(t) if n and p else t.new_empty(0) for t, n, p in zip((x, *params), needs, produced)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, list[Tensor]]) -> None:
    handle, input_grad, x, params = inputs
    out, handed = output
    layout = _runner(handle).layouts[(True, input_grad)]
    ctx.handle, ctx.input_grad, ctx.num_params, ctx.num_handed = handle, input_grad, len(params), len(handed)
    ctx.needs = [x.requires_grad, *(p.requires_grad for p in params)]
    # the output is kept for the backward only where a saved buffer is a view of it
    ctx.save_for_backward(x, *params, *handed, out if layout.reads_out else None)


def _backward_formula(ctx: Any, grad_out: Tensor, grad_handed: list[Tensor]) -> tuple[Any, ...]:
    x, *rest = ctx.saved_tensors
    params, handed, out = rest[:ctx.num_params], rest[ctx.num_params:ctx.num_params + ctx.num_handed], rest[-1]
    grads = _backward(ctx.handle, ctx.input_grad, ctx.needs, x, list(params), out, list(handed), grad_out)
    dx, *dparams = [g if n and g.shape == t.shape else None for g, t, n in zip(grads, (x, *params), ctx.needs)]
    return None, None, dx, dparams


_forward_for_backward.register_autograd(_backward_formula, setup_context=_setup_context)


def wants_grad(x: Tensor, params: Sequence[Tensor]) -> bool:
    """Whether a call records for a backward: the training program runs, else the inference program."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))


def forward(runner: Any, x: Tensor, params: Sequence[Tensor]) -> Tensor:
    """The layer's output through the ops: the inference program, or the training program where a
    gradient is wanted (what :meth:`Layer._run` does eagerly)."""
    if wants_grad(x, params):
        return _forward_for_backward(runner.handle, x.requires_grad, x, list(params))[0]
    return _forward(runner.handle, x, list(params))


# ---------------------------------------------------------------------------------------------- drop-in modules
# A drop-in module (rgtune.nn) finds the graph of its call's edge tensors by their identity, which a trace
# cannot do, and the shapes of what its forward saves depend on that graph's values (its pairs), which a fake
# implementation cannot know. So a drop-in's whole call is one op whose implementation finds the graph at run
# time, and what its forward saves waits in a table under a ticket (a one-element tensor the backward takes);
# the entry goes when the ticket is freed (after the backward, or with an autograd graph never run back).
_SAVED: dict[int, tuple[Any, Any]] = {}


def _drop_ticket(key: int) -> None:
    _SAVED.pop(key, None)


@torch.library.custom_op("rgtune::module_forward", mutates_args=())
def _module_forward(handle: int, train: bool, x: Tensor, graph_tensors: list[Tensor], names: str,
                    params: list[Tensor]) -> tuple[Tensor, Tensor]:
    runner = _runner(handle).compiled_call_runner(x, graph_tensors)
    named = dict(zip(names.split(","), params))
    ordered = [named[n] for n in runner.names]
    ticket = torch.zeros(1, dtype=torch.int64)
    if not train:
        return runner.forward(x, ordered), ticket
    out, saved = runner.forward_for_backward(x, ordered, input_grad=x.requires_grad)
    key = secrets.randbits(62)
    _SAVED[key] = (runner, saved)
    ticket[0] = key
    weakref.finalize(ticket, _drop_ticket, key)
    return out, ticket


@_module_forward.register_fake
def _(handle: int, train: bool, x: Tensor, graph_tensors: list[Tensor], names: str,
      params: list[Tensor]) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.size(0), _runner(handle).out_features), torch.empty(1, dtype=torch.int64)


@torch.library.custom_op("rgtune::module_backward", mutates_args=())
def _module_backward(ticket: Tensor, needs: list[bool], x: Tensor, names: str, params: list[Tensor],
                     grad_out: Tensor) -> list[Tensor]:
    key = int(ticket[0])
    if key not in _SAVED:
        raise RuntimeError("rgtune: this backward's forward state is gone (a second backward through the same "
                           "graph needs retain_graph, which a drop-in module under torch.compile does not support)")
    runner, saved = _SAVED.pop(key)
    names_ = names.split(",")
    named = dict(zip(names_, params))
    position = {n: i for i, n in enumerate(names_)}
    ordered = [named[n] for n in runner.names]
    wanted = [needs[0], *(needs[1 + position[n]] for n in runner.names)]
    dx, *grads = runner.backward(x, ordered, saved, grad_out.contiguous(), wanted)
    by_name = dict(zip(runner.names, grads))
    # one tensor per input: a wanted gradient the program does not give is zero (the fake cannot know which)
    out = [dx if needs[0] and dx is not None else (torch.zeros_like(x) if needs[0] else x.new_empty(0))]
    for n, p, need in zip(names_, params, needs[1:]):
        g = by_name.get(n)
        out.append((g if g is not None else torch.zeros_like(p)) if need else p.new_empty(0))
    return out


@_module_backward.register_fake
def _(ticket: Tensor, needs: list[bool], x: Tensor, names: str, params: list[Tensor],
      grad_out: Tensor) -> list[Tensor]:
    return [torch.empty_like(t) if n else t.new_empty(0) for t, n in zip((x, *params), needs)]


def _module_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    handle, train, x, graph_tensors, names, params = inputs
    ctx.names, ctx.num_params, ctx.num_graph_tensors = names, len(params), len(graph_tensors)
    ctx.needs = [x.requires_grad, *(p.requires_grad for p in params)]
    ctx.save_for_backward(output[1], x, *params)


def _module_backward_formula(ctx: Any, grad_out: Tensor, _grad_ticket: Tensor) -> tuple[Any, ...]:
    ticket, x, *params = ctx.saved_tensors
    grads = _module_backward(ticket, ctx.needs, x, ctx.names, list(params), grad_out)
    dx, *dparams = [g if n else None for g, n in zip(grads, ctx.needs)]
    return None, None, dx, [None] * ctx.num_graph_tensors, None, dparams


_module_forward.register_autograd(_module_backward_formula, setup_context=_module_setup)


def module_forward(module: Any, x: Tensor, graph_tensors: Sequence[Tensor], params: dict[str, Tensor]) -> Tensor:
    """A drop-in module's call as one op (see above): ``graph_tensors`` define the graph (found at run time by
    ``module.compiled_call_runner``), ``params`` are rgtune's weights derived from the module's (traced)."""
    names = list(params)  # rgtune's param names (no commas): one string, since an op takes no list of them
    values = [params[n] for n in names]
    return _module_forward(module.handle, wants_grad(x, values), x, list(graph_tensors), ",".join(names), values)[0]
