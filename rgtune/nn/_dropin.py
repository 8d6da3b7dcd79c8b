"""What the drop-in modules of :mod:`rgtune.nn.pyg` and :mod:`rgtune.nn.dgl` share (see :class:`DropIn`)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import Tensor

from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.runtime import ops
from rgtune.runtime.load import load_tuned
from rgtune.runtime.module import Layer

__all__ = ["DropIn"]

#: graphs (one per set of edge tensors) a module keeps built
_GRAPHS_KEPT = 4


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

    def _run(self, graph: HeteroGraph | Batch, x: Any, device: torch.device, options: dict[str, Any] | None = None) -> Any:
        """The layer's output for ``x`` on ``graph`` (a graph, or a block's :class:`Batch`: the destinations'
        rows), with the weights of this module's parameters (``options``: the model's for this call, default
        :attr:`options`). A layer made by a batch is made for the batch seen as a graph (:meth:`Batch.as_graph`)."""
        options = self.options if options is None else options
        layer = self._layer_for(graph.as_graph if isinstance(graph, Batch) else lambda: graph, device, options)
        for pname, value in self._rgtune_params(graph).items():
            layer._parameters[pname] = value  # type: ignore[assignment]  # a view of the module's parameters
        return layer(x, graph=None if graph is layer.graph else graph)

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
                layer = self._layers[key] = load_tuned(self.model, graph(), *self._sizes, db=self.db,
                                                       backend=backend, options=options, mode=self.mode)
        self.__dict__["_layer"] = layer  # not a submodule: the state dict is this module's parameters
        return layer

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

