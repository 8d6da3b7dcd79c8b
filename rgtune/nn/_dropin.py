"""What the drop-in modules of :mod:`rgtune.nn.pyg` and :mod:`rgtune.nn.dgl` share (see :class:`DropIn`), and how
``rgtune.tune(model, *inputs)`` finds the workloads of a model's drop-ins (:func:`collect_workloads`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from rgtune.codegen.base import Backend, create
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.runtime import ops
from rgtune.runtime._lookup import shown_db, warn_once
from rgtune.runtime.load import select_schedule
from rgtune.runtime.module import Layer, _layer_dtypes, check_conversion, dtypes_in_words

__all__ = ["DropIn", "ModuleWorkload", "collect_workloads", "forget_schedules"]

#: graphs (one per set of edge tensors) a module keeps built
_GRAPHS_KEPT = 4
#: set while ``rgtune.tune`` runs a model on its example inputs (:func:`collect_workloads`): no warnings
_COLLECTING = False
#: backend instances by name (what a module's dtype checks read)
_BACKENDS: dict[str, Backend] = {}


class DropIn(torch.nn.Module):
    """What the drop-in modules share: the compiled layer, looked up once per backend as ``load_tuned`` does
    (kept out of the state dict: the module's parameters are the library's), run with the weights the module
    derives from its parameters (:meth:`_rgtune_params`), and rebuilt after a copy or a pickle."""

    model: str

    def _setup(self, in_dim: int, out_dim: int, heads: int, options: dict[str, Any], backend: str, db: Any,
               mode: str) -> None:
        self._sizes, self.options = (in_dim, out_dim, heads), options
        self.out_features = out_dim  # the kernels' output size (the compiled call's fake output)
        self.handle = ops.register(self)  # the compiled call's op finds the module by it
        self.backend, self.db, self.mode = backend, db, mode
        self._layer: Layer | None = None  # the last call's
        self._layers: dict[tuple[str, str], Layer] = {}  # per backend and options
        self._graphs: OrderedDict[tuple[Any, ...], tuple[Any, HeteroGraph]] = OrderedDict()

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's weights of the model's program, computed from this module's parameters (differentiably)."""
        raise NotImplementedError

    def _run(self, graph: HeteroGraph | Batch, x: Any, device: torch.device, options: dict[str, Any] | None = None,
             edge_weight: Tensor | None = None) -> Any:
        """The layer's output for ``x`` on ``graph`` (a graph, or a block's :class:`Batch`: the destinations'
        rows), with the weights of this module's parameters (``options``: the model's for this call, default
        :attr:`options`). A layer made by a batch is made for the batch seen as a graph (:meth:`Batch.as_graph`)."""
        options = self.options if options is None else options
        self._check_input_dtypes(x, device)
        if _COLLECTING:  # what rgtune.tune's forward hook reads
            self.__dict__.setdefault("_calls_seen", []).append((graph, options, device))
        layer = self._layer_for(graph.as_graph if isinstance(graph, Batch) else lambda: graph, device, options)
        for pname, value in self._rgtune_params(graph).items():
            layer._parameters[pname] = value  # type: ignore[assignment]  # a view of the module's parameters
        if edge_weight is not None:  # a program that reads the caller's per-edge weight (in the graph's edge order)
            return layer(x, graph=None if graph is layer.graph else graph, edge_weight=edge_weight)
        return layer(x, graph=None if graph is layer.graph else graph)

    def _backend_on(self, device: torch.device) -> Backend:
        """The backend a call on ``device`` runs (``"auto"``: cuda for a CUDA tensor, else cpu)."""
        name = self.backend if isinstance(self.backend, str) else self.backend.name
        if name == "auto":
            name = "cuda" if device.type == "cuda" else "cpu"
        if name not in _BACKENDS:
            _BACKENDS[name] = create(name)
        return _BACKENDS[name]

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> "DropIn":
        # .to(dtype), .double(), .half(), ...: a dtype the kernels cannot run is refused here, not at the first call
        first = next(iter(self.parameters()), None)
        if "backend" in self.__dict__ and first is not None and isinstance(self.backend, (str, Backend)):
            probe = fn(torch.zeros((), dtype=first.dtype, device=first.device))
            device = probe.device if isinstance(probe, Tensor) else first.device
            check_conversion(type(self).__name__, self._backend_on(device), fn, first)
        return super()._apply(fn, recurse)

    def _check_input_dtypes(self, x: Any, device: torch.device) -> None:
        """Node features in the module's dtype (under ``torch.autocast`` the layer casts a 16-bit input itself)."""
        first = next(iter(self.parameters()), None)
        if first is None or torch.is_autocast_enabled(device.type):
            return
        mine = first.dtype
        named = [(f"x[{k!r}]", v) for k, v in x.items()] if isinstance(x, Mapping) else [("x", x)]
        for what, t in named:
            if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != mine:
                backend = self._backend_on(t.device)
                module = f", or the module with .to({t.dtype})" if t.dtype in _layer_dtypes(backend) else ""
                raise ValueError(f"{type(self).__name__}: {what} has dtype {t.dtype}, but the module's parameters are "
                                 f"{mine}; convert {what} with .to({mine}){module} ({dtypes_in_words(backend)})")

    def _layer_for(self, graph: Callable[[], HeteroGraph], device: torch.device, options: dict[str, Any]) -> Layer:
        """The compiled layer of ``options`` (its schedule looked up once, for the first ``graph()``), on
        ``device``'s backend."""
        backend = self.backend if self.backend != "auto" else ("cuda" if device.type == "cuda" else "cpu")
        key = (backend, repr(sorted(options.items())))
        layer = self._layers.get(key)
        if layer is None:
            # the layer's own parameters are never used (the module's are): making them must not move the
            # caller's random numbers (a script's dropout masks stay the library's)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                layer = self._layers[key] = self._looked_up(graph(), backend, options)
        self.__dict__["_layer"] = layer  # not a submodule: the state dict is this module's parameters
        return layer

    def _looked_up(self, graph: HeteroGraph, backend: str, options: dict[str, Any]) -> Layer:
        """The layer of the best schedule recorded for ``graph`` (as ``load_tuned`` finds it). Its warnings come
        once per process per kind of workload (model, options, backend, mode, database), and name the call that
        records schedules for a script's own model, ``rgtune.tune(model, *inputs)``."""
        sel = select_schedule(self.model, graph, *self._sizes, self.db, backend, mode=self.mode, options=options)
        if _COLLECTING:  # rgtune.tune's run of the example inputs: its schedules are about to be tuned
            return sel.build()
        db = shown_db(self.db)
        to = f" (into {db})" if db is not None else " (give the module a database: db='results.db')"
        call = (f"call `rgtune.tune(model, *inputs, trials=50)` with your model (or this {type(self).__name__}) "
                f"and the inputs of one call{to}: it runs the model once and tunes the workload of each rgtune "
                "module it meets, which then finds its schedule by the graph's content")
        kind = (self.model, sel.options, sel.backend.name, self.mode, db)
        for message in sel.warnings:
            shown = message.replace(sel.hint, call).replace(f"{graph.name!r}", "this module's graph")
            warn_once((*kind, "missing" if sel.missing else "fit"), shown + f" (shown once for {self.model} on "
                      f"{sel.backend.name})")
        return sel.build()

    def compiled_call_runner(self, x: Tensor, graph_tensors: list[Tensor]) -> Any:
        """The runner of the graph of ``graph_tensors`` (found or built now, at run time), for the custom op
        that a call under ``torch.compile`` is (:func:`rgtune.runtime.ops.module_forward`)."""
        graph = self._graph_of_tensors(x, graph_tensors)
        layer = self._layer_for(lambda: graph, x.device, self.options)
        return layer._runner_for(None if graph is layer.graph else graph)

    def _graph_of_tensors(self, x: Tensor, graph_tensors: list[Tensor]) -> HeteroGraph:
        """The graph of a compiled call's tensors (a module that compiles as one op defines it)."""
        raise NotImplementedError(f"{type(self).__name__} does not compile as one op")

    def _kept(self, key: tuple[Any, ...], holds: Any, build: Callable[[], HeteroGraph]) -> HeteroGraph:
        """The graph of ``key`` built once while the same tensors (``holds``, compared by identity) come back."""
        kept = self._graphs.pop(key, None)
        if kept is None or len(kept[0]) != len(holds) or any(a is not b for a, b in zip(kept[0], holds)):
            kept = (holds, build())
        self._graphs[key] = kept
        while len(self._graphs) > _GRAPHS_KEPT:
            self._graphs.popitem(last=False)
        return kept[1]

    def __getstate__(self) -> dict[str, Any]:
        # the compiled layer and the graphs are rebuilt on the copy's first call (a compile-cache hit)
        state = dict(self.__dict__)
        state["_layer"], state["_layers"], state["_graphs"] = None, {}, OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.handle = ops.register(self)  # a copy is another module: its own number


@dataclass(frozen=True)
class ModuleWorkload:
    """A workload an rgtune module of a model ran on: what its schedule lookup searches the database for."""

    model: str
    graph: HeteroGraph
    in_dim: int
    out_dim: int
    heads: int
    options: str  # the model's options, canonical text
    backend: str
    mode: str
    db: Any

    @property
    def key(self) -> tuple[Any, ...]:
        db = self.db if isinstance(self.db, (str, type(None))) else id(self.db)
        return (self.model, self.graph.content_hash, self.in_dim, self.out_dim, self.heads, self.options,
                self.backend, self.mode, db)


def collect_workloads(model: torch.nn.Module, inputs: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None
                      ) -> tuple[list[ModuleWorkload], list[DropIn]]:
    """Run ``model(*inputs, **kwargs)`` once (without gradients) with a forward hook on every rgtune module in
    it, and return the distinct workloads they ran (in the order first met) and the modules met."""
    global _COLLECTING
    from rgtune.runtime._lookup import check_model

    found: dict[tuple[Any, ...], ModuleWorkload] = {}
    met: list[DropIn] = []

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        assert isinstance(module, DropIn)
        calls = module.__dict__.pop("_calls_seen", [])
        if calls and module not in met:
            met.append(module)
        for graph, options, device in calls:
            g = graph.as_graph() if isinstance(graph, Batch) else graph
            _, opts = check_model(module.model, options)
            w = ModuleWorkload(module.model, g, *module._sizes, opts, module._backend_on(device).name, module.mode,
                               module.db)
            found.setdefault(w.key, w)

    dropins = [m for m in model.modules() if isinstance(m, DropIn)]
    if not dropins:
        raise TypeError(f"rgtune.tune: {type(model).__name__} holds no rgtune module (rgtune.nn.pyg or rgtune.nn.dgl) "
                        "to tune; for a model of rgtune's own, call rgtune.tune('rgcn', graph, ...)")
    handles = [m.register_forward_hook(hook) for m in dropins]
    _COLLECTING = True
    try:
        with torch.no_grad():
            model(*inputs, **dict(kwargs or {}))
    finally:
        _COLLECTING = False
        for h in handles:
            h.remove()
        for m in dropins:
            m.__dict__.pop("_calls_seen", None)
    return list(found.values()), met


def forget_schedules(modules: Sequence[DropIn]) -> None:
    """Drop the modules' looked-up layers: their next call looks its schedule up again (one just tuned)."""
    for m in modules:
        m._layers.clear()
        m.__dict__["_layer"] = None
