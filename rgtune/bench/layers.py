"""One layer, side by side: rgtune's tuned kernels, rgtune's torch lowering, the plain torch layer, PyG, DGL.

Every implementation gets the same graph, sizes, weights (copied; see :mod:`.baselines` for
where a library's math differs), input, thread count and device: each is derived from the seed
again in the implementation's own process. Each implementation runs alone in a process of its own
(:mod:`.isolated`), one after another, never two at once: the child loads the graph, builds the
implementation, times it, measures its peak memory and checks its output, and hands the result
back as JSON. So one implementation that runs out of memory or time is a row ("OOM", "> N s"),
not the end of the benchmark, and no implementation's memory (or the float64 reference's) weighs
on another's. Timing: warm-up, then ``repeats`` runs of one implementation in a block, per mode;
the median is reported. (The rounds are no longer interleaved across implementations in a
rotating order, as they were when all ran in one process: drift of a noisy machine now falls on
whichever implementation runs at the time.) Forward runs without autograd (inference);
forward+backward is one training step of the layer without the optimizer (Hector's protocol): the
forward, then the backward of ``sum(out * g)`` to the input and every parameter.

Implementations:

* ``rgtune``: :func:`rgtune.runtime.load_tuned`: the forward with the best inference schedule,
  forward+backward with the best training schedule (``mode="training"``: generated backward
  kernels on the buffers its forward saved, where the backend builds them);
* ``lowering``: rgtune's torch executor of the kernel IR (default schedule, float32, autograd);
* ``torch``: the model's plain torch layer of :mod:`rgtune.torch_layers`, where it has one (float32);
* ``pyg``, ``dgl``: the libraries' layers (:mod:`.baselines`: which exist for which model and options).

Each forward output is checked against what its math should give (float64: the model's program,
interpreted op by op; for a library whose math differs, the program of that math): ``error`` of
each :class:`Impl`. On a graph with more than ``sample_above`` edges
(:data:`rgtune.tuner.verification.SAMPLE_ABOVE_EDGES` by default) the float64 reference of the whole
graph would cost more than the layers it checks, so the check covers ``check_rows`` sampled
destination rows exactly (:func:`rgtune.data.neighbourhood.sample_destinations`), the reference
running on their in-neighbourhood (:func:`rgtune.data.neighbourhood.in_neighbourhood`); ``checked``
of each :class:`Impl` says which. rgtune's implementation also hands back the counts of the kernel
programs its modes run (the inference program; the training program, forward and backward kernels),
so that its row carries their floor on the device and the share of it reached (:meth:`Impl.floor`,
:mod:`rgtune.ir.roofline`; the peak is :attr:`BenchResult.peak`). ``rgtune bench``
(:mod:`rgtune.cli.bench`) prints the table and writes a row to BENCHMARKS.md (:mod:`.report`).

Example:
    >>> spec = "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3"
    >>> res = bench("rgcn", spec, in_dim=8, out_dim=8, backend="reference", db=None, impls=("rgtune", "torch"),
    ...             repeats=1, warmup=0)              # no database: rgtune runs the default schedule
    >>> [(i.key, i.status, i.error < 1e-5, len(i.times["fwd"]), i.checked["rows"]) for i in res.impls]
    [('rgtune', 'ok', True, 1, 200), ('torch', 'ok', True, 1, 200)]
"""

from __future__ import annotations

import copy
import functools
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from rgtune.bench.baselines import BUILDERS, Unavailable, oracle, prepare_weights, torch_layer
from rgtune.codegen.base import ReferenceBackend
from rgtune.db import DEFAULT_URL
from rgtune.ir.roofline import DevicePeak, floor_ms, fraction_of_floor
from rgtune.tuner.memory import is_out_of_memory

IMPLS = ("rgtune", "lowering", "torch", "pyg", "dgl")
#: an implementation's name where its process gave none (it ran out of memory or time)
LABELS = {"rgtune": "rgtune tuned", "lowering": "rgtune torch lowering", "torch": "plain torch layer", "pyg": "PyG",
          "dgl": "DGL"}
MODES = ("fwd", "fwd+bwd")


# ---------------------------------------------------------------------- implementations
Layer = Callable[[Tensor], Tensor]


#: an implementation's outcome: it ran; its process went over the memory limit (or the kernel's OOM
#: killer or an allocation error stopped it); over the time limit; it failed otherwise
STATUSES = ("ok", "oom", "timeout", "failed")


@dataclass
class Impl:
    """One implementation under test: ``forward(x)``, its parameters, its check; ``train`` and
    ``train_params`` where a training step runs another module (rgtune's training schedule).

    In the parent process (:func:`bench`) only the results are filled in: ``status`` (one of
    :data:`STATUSES`), ``times``, ``peak_mb``, ``error``, ``checked`` and ``counts``; ``limit_s`` is the time
    limit a ``timeout`` ran into."""

    key: str
    name: str
    forward: Layer | None
    params: list[Tensor] = field(default_factory=list)
    train: Layer | None = None
    train_params: list[Tensor] | None = None
    error: float | None = None  # max |out - expected| / max |expected| over the checked rows
    math: str = "same math"
    problem: str | None = None  # why it could not run
    rows: Tensor | None = None
    times: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    peak_mb: dict[str, float | None] = field(default_factory=dict)  # mode -> peak MB above graph and input
    status: str = "ok"
    limit_s: float | None = None
    #: what the check covered: ``{"rows": n}`` (every row) or ``{"sampled": True, "rows": n, "nodes": ...,
    #: "edges": ...}`` (sampled destination rows and their in-neighbourhood)
    checked: dict[str, Any] | None = None
    #: ``expectation(layer)``: what this implementation should compute with ``layer``'s weights on
    #: ``layer``'s graph (float64 ``x -> out``) and the global ids of those rows (None: every node)
    expectation: Callable[[Any], tuple[Callable[[Tensor], Tensor], Tensor | None]] | None = None
    #: mode -> the ``bytes_min`` and ``flops`` of the kernel program that runs in it (rgtune's schedules only:
    #: the floor of :mod:`rgtune.ir.roofline`); a mode without generated kernels has none
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: mode -> what the tuner recorded for the schedule that runs in it (rgtune's, from the database only):
    #: ``trial``, ``median_ms`` (the study's time), ``kernel_ms`` and ``call_ms`` (None: not recorded)
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)

    def versus_recorded(self, mode: str) -> float | None:
        """This benchmark's median over the tuner's recorded time of the layer as called for the same schedule
        (the study's time where the trial recorded no call); None where either is missing.

        Example:
            >>> impl = Impl("rgtune", "rgtune tuned", None, recorded={"fwd": {"trial": 3, "median_ms": 0.09,
            ...                                                                "kernel_ms": 0.09, "call_ms": 0.4}})
            >>> impl.times["fwd"] = [0.0005]                            # 0.5 ms here
            >>> impl.versus_recorded("fwd")
            1.25
        """
        rec, measured = self.recorded.get(mode), self.median_ms(mode)
        recorded = None if rec is None else rec.get("call_ms") or rec.get("median_ms")
        return measured / recorded if measured and recorded else None

    def step(self, mode: str) -> tuple[Layer, list[Tensor]]:
        """What runs in ``mode``: the module's forward and the parameters it trains."""
        if mode != "fwd" and self.train is not None:
            return self.train, self.train_params if self.train_params is not None else self.params
        assert self.forward is not None
        return self.forward, self.params

    def median_ms(self, mode: str) -> float | None:
        t = self.times[mode]
        return statistics.median(t) * 1e3 if t else None

    def floor(self, mode: str, peak: DevicePeak | None) -> tuple[float, str, float | None] | None:
        """``(floor ms, "memory" or "compute", floor / median time)`` of ``mode`` on ``peak``'s device (the
        fraction None where the mode has no time); None without counts or a peak.

        Example:
            >>> impl = Impl("rgtune", "rgtune tuned", None, counts={"fwd": {"bytes_min": 10**9, "flops": 10**6}})
            >>> impl.times["fwd"] = [0.004, 0.005, 0.006]             # seconds: median 5 ms
            >>> impl.floor("fwd", DevicePeak("a CPU", 1e12, 1e12, "given"))  # 1 GB at 1 TB/s: 1 ms
            (1.0, 'memory', 0.2)
            >>> impl.floor("fwd+bwd", DevicePeak("a CPU", 1e12, 1e12, "given")) is None
            True
        """
        counts, measured = self.counts.get(mode), self.median_ms(mode)
        if counts is None or peak is None:
            return None
        ms, bound = floor_ms(counts, peak)
        return ms, bound, fraction_of_floor(ms, measured) if measured else None


@dataclass
class BenchResult:
    model: str
    dataset: str
    in_dim: int
    out_dim: int
    heads: int
    backend: str
    schedule: str
    threads: int
    repeats: int
    impls: list[Impl]
    machine: dict[str, Any]
    versions: dict[str, str]
    command: str
    date: str
    options: str = ""  # the model's options, canonical text
    memory_limit_gb: float | None = None  # each implementation's, None: none
    impl_timeout_s: float | None = None  # each implementation's
    peak: DevicePeak | None = None  # the device's bandwidth and FLOP rate: rgtune's floor (None: not known)
    peak_note: str | None = None  # where ``peak`` is not the device's own (no GPU visible, an unknown one)

    @property
    def sizes(self) -> str:
        return f"{self.in_dim}→{self.out_dim}" + (f" h{self.heads}" if self.heads != 1 else "")

    @property
    def named_model(self) -> str:
        """The model with its options: ``rgcn(num_bases=30)``."""
        return f"{self.model}({self.options})" if self.options else self.model


def _rel_err(out: Tensor, expected: Tensor) -> float:
    out, expected = out.detach().double().cpu(), expected.detach().double().cpu()
    if out.shape != expected.shape:
        return float("inf")
    return float((out - expected).abs().max()) / (float(expected.abs().max()) or 1.0)


def build_impls(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, db: Any,
                impls: Sequence[str], seed: int = 0, check: bool = True,
                config: Mapping[str, Any] | None = None, options: str = "",
                x: Tensor | None = None, ref: Any = None) -> tuple[list[Impl], Tensor, str]:
    """:func:`build_with_reference` without the reference layer."""
    impls, x, schedule, _ = build_with_reference(model, graph, in_dim, out_dim, heads, backend, db, impls, seed, check,
                                                 config, options, x, ref)
    return impls, x, schedule


def build_with_reference(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, db: Any,
                         impls: Sequence[str], seed: int = 0, check: bool = True,
                         config: Mapping[str, Any] | None = None, options: str = "",
                         x: Tensor | None = None, ref: Any = None) -> tuple[list[Impl], Tensor, str, Any]:
    """Every implementation with the same weights and input; also the input and rgtune's schedules
    (a label). ``check``: also check each output on the whole graph (:func:`check_impl` checks
    later, or on sampled rows); ``config``: rgtune runs this schedule (both modes) instead of the
    database's; ``options``: the model's (canonical text); ``x``: the input, when the caller made it
    already (:func:`bench_input`); ``ref``: the reference layer, when the caller made it already
    (:func:`detached_reference`). Each :class:`Impl` keeps its ``expectation``; the last value is the
    reference layer whose weights they all got (what :func:`check_impl` takes)."""
    if ref is None:
        ref = reference_layer(model, graph, in_dim, out_dim, heads, backend, seed, options)
    x = bench_input(graph, in_dim, seed, ref_device(ref)) if x is None else x

    out: list[Impl] = []
    schedule = "not run"
    if "rgtune" in impls:
        impl, schedule = _rgtune_impl(model, graph, in_dim, out_dim, heads, backend, db, ref, config, options)
        out.append(impl)
    if "lowering" in impls:
        out.append(_lowering_impl(ref))
    if "torch" in impls:
        out.append(_torch_impl(ref))
    for impl in out:
        impl.expectation = _program_expectation
    for lib in ("pyg", "dgl"):
        if lib in impls:
            out.append(_library_impl(lib, ref))
    if check:
        for impl in out:
            if impl.forward is not None:
                check_impl(impl, ref, x, sample_above=None)
    return out, x, schedule, ref


def reference_layer(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, seed: int = 0,
                    options: str = "") -> Any:
    """The weights every implementation gets: the program's parameters at their declared init (seeded),
    in a reference-backend layer, made to fit every library (:func:`~rgtune.bench.baselines.prepare_weights`)."""
    from rgtune.ir.registry import parse_key
    from rgtune.runtime import Layer as TunedModule

    device = torch.device(backend.device_type)
    torch.manual_seed(seed)
    ref = TunedModule(model, graph, in_dim, out_dim, heads, options=parse_key(options),  # the torch executor
                      dtype=torch.float32, backend=ReferenceBackend.name).to(device)
    prepare_weights(ref)  # what a library's layer needs of them (e.g. PyG's RGATConv: shared attention)
    return ref


def detached_reference(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, seed: int = 0,
                       options: str = "") -> Any:
    """:func:`reference_layer` built on a shallow copy of ``graph`` (the same edges, caches of its own),
    then pointed at ``graph``: what it derived to build its kernels (layouts, pairs, bound index arrays)
    stays its own, so an implementation built afterwards on ``graph`` pays for whatever it derives
    itself. The memory measurement builds it before its baseline: the weights' source is not the
    implementation's memory."""
    ref = reference_layer(model, copy.copy(graph), in_dim, out_dim, heads, backend, seed, options)
    ref.graph = graph  # what the libraries' builders and the check read; the copy's runner is never run here
    return ref


def ref_device(ref: Any) -> torch.device:
    """Where the reference layer's weights (and so every implementation) live."""
    return next(ref.parameters()).device


def bench_input(graph: Any, in_dim: int, seed: int, device: torch.device) -> Tensor:
    """The input every implementation gets (seeded: the same in every process)."""
    return torch.randn(graph.num_nodes(), in_dim, generator=torch.Generator().manual_seed(seed + 1)).to(device)


def _program_expectation(layer: Any) -> tuple[Callable[[Tensor], Tensor], Tensor | None]:
    """rgtune's own implementations compute the model's program: every row."""
    return oracle(layer), None


def _rgtune_impl(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, db: Any,
                 ref: torch.nn.Module, config: Mapping[str, Any] | None = None, options: str = "") -> tuple[Impl, str]:
    """The tuned layer: the best inference schedule for the forward, the best training schedule for
    the training step (each a :func:`~rgtune.runtime.load_tuned` layer with ``ref``'s weights), or
    ``config`` for both."""
    from rgtune.ir.counts import count
    from rgtune.ir.registry import parse_key
    from rgtune.runtime import Layer as TunedModule
    from rgtune.runtime import load_tuned

    device = next(ref.parameters()).device
    opts = parse_key(options)
    layers = {}
    for mode in ("inference", "training"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if config is not None:
                layers[mode] = TunedModule(model, graph, in_dim, out_dim, heads, options=opts, config=config,
                                           backend=backend, mode=mode).to(device)
            else:
                layers[mode] = load_tuned(model, graph, in_dim, out_dim, heads, db=db, backend=backend, mode=mode,
                                          options=opts).to(device)
        for w in caught:
            print(f"bench: warning: {w.message}", file=sys.stderr)
        layers[mode].load_state_dict(ref.state_dict())
    fwd, train = layers["inference"], layers["training"]
    counts = {"fwd": count(fwd.kernels, fwd.graph, fwd.config)}
    if train.backward_kind != "torch":  # else the step is torch autograd's: no kernel program counts it
        counts["fwd+bwd"] = count(train.kernels, train.graph, train.config)
    schedule = f"{_trial(fwd)}; training {_trial(train)}, {_saved_label(train, counts.get('fwd+bwd'))}"
    impl = Impl("rgtune", f"rgtune tuned ({fwd.backend}, {_trial(fwd)})", fwd, list(fwd.parameters()),
                train=train, train_params=list(train.parameters()),
                counts={m: {k: c[k] for k in ("bytes_min", "flops")} for m, c in counts.items()},
                recorded={m: _recorded(layer) for m, layer in (("fwd", fwd), ("fwd+bwd", train))
                          if layer.provenance.get("trial_id") is not None})
    return impl, schedule


def _recorded(layer: Any) -> dict[str, Any]:
    """What the tuner recorded for ``layer``'s schedule (its provenance from the database)."""
    prov = layer.provenance
    return {"trial": prov["trial_id"], **{k: prov.get(k) for k in ("median_ms", "kernel_ms", "call_ms")}}


def _trial(layer: Any) -> str:
    prov = layer.provenance
    return f"trial {prov['trial_id']}" if prov.get("trial_id") is not None else str(prov.get("source"))


def _saved_label(layer: Any, counts: Mapping[str, Any] | None) -> str:
    """What the training schedule trades: which forward values it saves (``autodiff.save``) and the
    bytes its forward hands to its backward (``counts``: its training program's), or that the backward
    is the torch lowering's."""
    if layer.backward_kind == "torch" or counts is None:
        return f"backward by the torch lowering ({layer.backend} builds no backward kernels)"
    save = layer.training_config.get("autodiff.save", "all")
    saved_mb = counts["saved_bytes"] / 1e6
    return f"save={save} ({saved_mb:.3g} MB saved), backward {layer.backward_kind}"


def _lowering_impl(ref: Any) -> Impl:
    """rgtune's torch executor of the default schedule's kernel IR (a copy of ``ref``: its own parameters)."""
    import copy

    low = copy.deepcopy(ref)
    return Impl("lowering", "rgtune torch lowering (default schedule)", low, list(low.parameters()))


def _torch_impl(ref: Any) -> Impl:
    try:
        plain = torch_layer(ref)
    except Unavailable as e:
        return Impl("torch", "plain torch layer", None, problem=str(e))
    return Impl("torch", f"rgtune.torch_layers.{type(plain).__name__} (torch)", plain, list(plain.parameters()))


def _library_impl(lib: str, ref: Any) -> Impl:
    label = {"pyg": "PyG", "dgl": "DGL"}[lib]
    try:
        builder = BUILDERS[lib].get(ref.model)
        if builder is None:
            raise Unavailable(f"{label} has no layer of this model")
        b = builder(ref)
    except Exception as e:  # noqa: BLE001 - a missing or broken library is a row, not a crash
        if is_out_of_memory(e):
            raise  # the process's outcome (:mod:`.isolated`), not this library's
        return Impl(lib, label, None, problem=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")

    def expectation(layer: Any) -> tuple[Callable[[Tensor], Tensor], Tensor | None]:
        # the library's math on ``layer``'s graph: its builder says what that is (and which rows)
        other = b if layer is ref else builder(layer)
        return other.expected, other.rows

    return Impl(lib, b.name, b.run, list(b.module.parameters()), math=b.note, rows=b.rows, expectation=expectation)


# ---------------------------------------------------------------------- checks
def check_impl(impl: Impl, ref: Any, x: Tensor, *, sample_above: int | None = None, rows: int = 512,
               seed: int = 0) -> None:
    """Fill ``impl.error`` and ``impl.checked``: its forward output against its float64 expectation
    (:attr:`Impl.expectation` with ``ref``'s weights), on every row, or, on a graph with more than
    ``sample_above`` edges (None: never), on ``rows`` sampled destinations (see the module docstring).
    An implementation whose forward raises gets ``problem`` and no forward."""
    assert impl.expectation is not None and impl.forward is not None
    graph = ref.graph
    try:
        with torch.no_grad():
            out = impl.forward(x)
        if sample_above is None or graph.num_edges() <= sample_above:
            expected, _ = impl.expectation(ref)
            impl.error = _rel_err(out, expected(x.double().cpu()))
            impl.checked = {"rows": int(out.shape[0])}
            return
        impl.error, impl.checked = sampled_error(out, impl.rows, impl.expectation, ref, x, rows, seed)
    except Exception as e:  # noqa: BLE001 - reported in the table, the others still run
        if is_out_of_memory(e):
            raise
        impl.problem, impl.forward = f"{type(e).__name__}: {e}", None


def sampled_error(out: Tensor, out_rows: Tensor | None, expectation: Callable[[Any], tuple[Callable, Tensor | None]],
                  ref: Any, x: Tensor, rows: int = 512, seed: int = 0) -> tuple[float, dict[str, Any]]:
    """The relative error of ``out`` (the whole graph's output, its rows the global ids ``out_rows``; None:
    every node) on about ``rows`` sampled destinations, against ``expectation`` evaluated on their
    in-neighbourhood (a reference layer on that subgraph with ``ref``'s weights), and what was checked.

    Example:
        >>> from rgtune.data.synthetic import random_graph
        >>> from rgtune.runtime import Layer
        >>> g = random_graph((300, 300), num_relations=3, num_edges=3000, seed=0)
        >>> ref, x = Layer("rgcn", g, 4, 4, backend="reference"), torch.randn(600, 4)
        >>> out = oracle(ref)(x.double()).float()
        >>> err, checked = sampled_error(out, None, _program_expectation, ref, x, rows=32)
        >>> err < 1e-6, checked["rows"], checked["sampled"]
        (True, 32, True)
    """
    from rgtune.data.neighbourhood import in_neighbourhood, sample_destinations
    from rgtune.runtime import Layer as TunedModule

    graph = ref.graph
    hood = in_neighbourhood(graph, sample_destinations(graph, rows, seed=seed))
    # the same weights on the subgraph: it keeps every node type and relation, so they fit unchanged
    local = TunedModule(ref.model, hood.graph, ref.in_dim, ref.out_dim, ref.heads, options=ref.options,
                        dtype=torch.float32, backend=ReferenceBackend.name)  # the torch executor
    local.load_state_dict({k: v.detach().cpu() for k, v in ref.state_dict().items()})
    expected_fn, local_rows = expectation(local)
    # rows first, then float64 on the host: never a float64 copy of the whole graph's input or output
    expected = expected_fn(x.detach()[hood.nodes.to(x.device)].double().cpu())
    at_out, in_out = _positions(hood.dst, out_rows)
    at_exp, in_exp = _positions(hood.rows, local_rows)
    both = in_out & in_exp  # a destination a library leaves out of its output is not checked
    got = out.detach()[at_out[both].to(out.device)].double().cpu()
    err = _rel_err(got, expected[at_exp[both]]) if bool(both.any()) else 0.0
    return err, {"sampled": True, **hood.describe(), "rows": int(both.sum())}


def _positions(ids: Tensor, rows: Tensor | None) -> tuple[Tensor, Tensor]:
    """Where each of ``ids`` is among ``rows`` (None: row i is id i), and whether it is there at all."""
    if rows is None:
        return ids, torch.ones(ids.numel(), dtype=torch.bool)
    rows = rows.cpu()
    order = torch.argsort(rows)
    at = torch.searchsorted(rows[order], ids).clamp(max=max(rows.numel() - 1, 0))
    found = rows[order][at] == ids if rows.numel() else torch.zeros(ids.numel(), dtype=torch.bool)
    return order[at], found


# ---------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(impl: Impl, mode: str, x: Tensor, grad: Tensor) -> None:
    """One forward (``fwd``, no autograd) or one training step without the optimizer (``fwd+bwd``:
    the gradients of ``sum(out * grad)`` w.r.t. ``x`` and every parameter)."""
    fn, params = impl.step(mode)
    for p in params:
        p.grad = None
    if mode == "fwd":
        with torch.no_grad():
            fn(x)
        return
    xg = x.detach().requires_grad_()
    g = grad if impl.rows is None else grad[impl.rows.to(grad.device)]
    fn(xg).backward(g)


def _once(impl: Impl, mode: str, x: Tensor, grad: Tensor) -> float:
    _sync(x.device)
    t0 = time.perf_counter()
    run_once(impl, mode, x, grad)
    _sync(x.device)
    return time.perf_counter() - t0


def upstream_grad(num_nodes: int, out_dim: int, device: torch.device) -> Tensor:
    """The output's gradient every implementation's training step gets (fixed seed)."""
    return torch.randn(num_nodes, out_dim, generator=torch.Generator().manual_seed(7)).to(device)


def time_impl(impl: Impl, mode: str, x: Tensor, grad: Tensor, repeats: int, warmup: int) -> None:
    """Fill ``impl.times[mode]``: ``warmup`` untimed runs, then ``repeats`` timed ones in a block (an
    implementation runs alone in its process: nothing to interleave with). A run that raises sets
    ``impl.problem`` and leaves the mode's times empty."""
    try:
        for _ in range(warmup):
            _once(impl, mode, x, grad)
        impl.times[mode] = [_once(impl, mode, x, grad) for _ in range(repeats)]
    except Exception as e:  # noqa: BLE001 - an allocation error is re-raised by the caller's check
        impl.times[mode] = []
        impl.problem = f"{mode}: {type(e).__name__}: {e}"
        if is_out_of_memory(e):
            raise


# ---------------------------------------------------------------------- environment
def machine_info(threads: int) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "threads": threads}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@functools.cache
def versions() -> dict[str, str]:
    import rgtune

    out = {"rgtune": rgtune.__version__, "torch": torch.__version__, "python": platform.python_version()}
    for mod, key in (("torch_geometric", "pyg"), ("dgl", "dgl")):
        try:
            out[key] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: say so
            out[key] = "n/a"
    return out


# ---------------------------------------------------------------------- one benchmark
def bench(model: str, dataset: str, *, in_dim: int = 64, out_dim: int = 64, heads: int = 1, backend: str = "auto",
          db: str | None = DEFAULT_URL, impls: Sequence[str] = IMPLS, repeats: int = 20, warmup: int = 3,
          threads: int | None = None, seed: int = 0, tune_trials: int = 0, data_dir: str | None = None,
          memory: bool = True, command: str = "", options: Mapping[str, Any] | str | None = None,
          impl_timeout: float | None = None, memory_limit_gb: float | None = None,
          sample_above: int | None = None, check_rows: int = 512, peak: str = "auto") -> BenchResult:
    """Time one layer side by side (see the module docstring), each implementation in a watched process of its
    own (:func:`rgtune.bench.isolated.run_impl`); ``tune_trials`` > 0 tunes that many trials first, per mode
    (inference, training), when this device has no record of the workload in that mode (``db=None``: no
    database, the default schedules). Every implementation's peak memory per mode comes with its run
    (``memory`` is kept for callers that still pass it; it changes nothing). ``impl_timeout``: seconds per
    implementation (default :data:`~rgtune.bench.isolated.DEFAULT_TIMEOUT_S`); ``memory_limit_gb``: its
    resident set's limit (default :func:`~rgtune.bench.isolated.default_memory_limit_gb`); ``sample_above``:
    check sampled rows on graphs with more edges (default
    :data:`~rgtune.tuner.verification.SAMPLE_ABOVE_EDGES`), ``check_rows`` of them. ``command`` is recorded
    with the result; ``options``: the model's. ``peak``: the device whose bandwidth and FLOP rate give
    rgtune's floor (:func:`rgtune.ir.roofline.device_peak`; ``auto``: the backend's, a CPU measured by this
    process with the benchmark's threads after the implementations ran)."""
    from rgtune.bench.isolated import DEFAULT_TIMEOUT_S, default_memory_limit_gb, run_impl
    from rgtune.ir.roofline import cpu_overrides, device_peak, peak_names
    from rgtune.runtime._lookup import check_model, resolve_backend
    from rgtune.tuner.verification import SAMPLE_ABOVE_EDGES

    model, opts = check_model(model, options)

    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"unknown implementations {unknown}; choose from {list(IMPLS)}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    impl_timeout = DEFAULT_TIMEOUT_S if impl_timeout is None else impl_timeout
    if impl_timeout <= 0:
        raise ValueError(f"impl_timeout must be > 0 seconds, got {impl_timeout}")
    if memory_limit_gb is not None and memory_limit_gb <= 0:
        raise ValueError(f"memory_limit_gb must be > 0 (or None: a share of the available memory), got "
                         f"{memory_limit_gb}")
    if check_rows < 1:
        raise ValueError(f"check_rows must be at least 1 sampled destination, got {check_rows}")
    if peak != "auto" and peak.strip().lower() not in peak_names():  # now, not after the implementations ran
        raise ValueError(f"unknown device peak {peak!r}; choose from auto, {', '.join(peak_names())}")
    cpu_overrides()  # a bad figure in the environment: now too
    if threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and the processes it starts
    threads = torch.get_num_threads()
    be = resolve_backend(backend)
    if tune_trials > 0 and db is not None:
        _tune_missing(model, dataset, in_dim, out_dim, heads, be, db, tune_trials, seed, data_dir, opts)
    limit = default_memory_limit_gb() if memory_limit_gb is None else memory_limit_gb
    args = {"model": model, "dataset": dataset, "in_dim": in_dim, "out_dim": out_dim, "heads": heads,
            "backend": be.name, "db": db, "seed": seed, "threads": threads, "data_dir": data_dir, "options": opts,
            "repeats": repeats, "warmup": warmup, "check_rows": check_rows,
            "sample_above": SAMPLE_ABOVE_EDGES if sample_above is None else sample_above}
    built, schedule, name = [], "not run", None
    for key in (k for k in IMPLS if k in impls):  # one at a time: two would time and crowd each other
        print(f"bench: {key} in its own process ...", file=sys.stderr, flush=True)
        out = run_impl({**args, "impl": key}, timeout=impl_timeout, memory_limit_gb=limit)
        impl = impl_of(key, out.status, out.result, out.message, impl_timeout)
        built.append(impl)
        if out.result is not None:
            name = out.result.get("dataset", name)
            if key == "rgtune" and out.status == "ok":
                schedule = out.result.get("schedule", schedule)
    # measured here, now that no implementation runs: with the benchmark's threads, on a quiet machine
    device, note = device_peak(be.device_type, peak) if any(i.counts for i in built) else (None, None)
    return BenchResult(model, name or dataset, in_dim, out_dim, heads, be.name, schedule, threads, repeats, built,
                       machine_info(threads), versions(), command, datetime.now(UTC).strftime("%Y-%m-%d"), opts,
                       memory_limit_gb=limit, impl_timeout_s=impl_timeout, peak=device, peak_note=note)


def impl_of(key: str, status: str, result: Mapping[str, Any] | None, message: str, limit_s: float) -> Impl:
    """The parent's :class:`Impl` of a child's outcome (:class:`rgtune.bench.isolated.Outcome`)."""
    r = dict(result or {})
    impl = Impl(key, r.get("name", LABELS[key]), None, math=r.get("math", "same math"), problem=r.get("problem"),
                status=status, error=r.get("error"), checked=r.get("checked"))
    impl.times = {m: list(r.get("times", {}).get(m, [])) for m in MODES}
    impl.peak_mb = dict(r.get("peak_mb", {}))
    impl.counts = {m: dict(c) for m, c in r.get("counts", {}).items()}
    impl.recorded = {m: dict(c) for m, c in r.get("recorded", {}).items()}
    if status != "ok":
        impl.problem = message or impl.problem
        impl.limit_s = limit_s if status == "timeout" else None
    return impl


def _tune_missing(model: str, dataset: str, in_dim: int, out_dim: int, heads: int, be: Any, db: str, trials: int,
                  seed: int, data_dir: str | None, options: str) -> None:
    """Tune each mode this device has no record of (the graph is loaded here only for the lookup)."""
    from rgtune.data import load_dataset
    from rgtune.runtime.load import select_schedule

    graph = load_dataset(dataset, root=data_dir)
    todo = []
    for mode in ("inference", "training"):
        sel = select_schedule(model, graph, in_dim, out_dim, heads, db, be, mode=mode, options=options)
        if sel.missing is not None or not sel.provenance.get("same_device", False):
            todo.append(mode)
    del graph  # the children load their own: this process holds no graph while they run
    for mode in todo:
        _tune(model, dataset, in_dim, out_dim, heads, be.name, db, trials, seed, data_dir, mode, options)


def _tune(model: str, dataset: str, in_dim: int, out_dim: int, heads: int, backend: str, db: str, trials: int,
          seed: int, data_dir: str | None, mode: str, options: str = "") -> None:
    from rgtune.db import TrialDatabase
    from rgtune.tuner.workload import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    print(f"bench: tuning {model} on {dataset} for {mode} ({trials} trials, backend {backend}) ...", file=sys.stderr)
    s = Tuner(Workload(model, dataset, in_dim, out_dim, heads, backend, data_dir, mode=mode, options=options),
              TrialDatabase(db), TuneOptions(trials=trials, seed=seed, progress=False)).run()
    best = f"{s.best_ms:.4g} ms" if s.best_ms is not None else "none"
    print(f"bench: tuned {s.trials_run} trials, best {best}", file=sys.stderr)
