"""One layer, side by side: rgtune's tuned kernels, rgtune's torch lowering, the reference layer, PyG, DGL.

Every implementation gets the same graph, sizes, weights (copied; see :mod:`.baselines` for
where a library's math differs), input, thread count and device. Warm-up, then ``repeats``
rounds; each round times every implementation once, in a rotating order, so that drift of a
noisy machine spreads over all of them; the median is reported. Forward runs without autograd
(inference); forward+backward is one training step of the layer without the optimizer (Hector's
protocol): the forward, then the backward of ``sum(out * g)`` to the input and every parameter.
``memory=True`` also measures each implementation's peak memory in its own process
(:mod:`.memory`).

Implementations:

* ``rgtune``: :func:`rgtune.runtime.load_tuned`: the forward with the best inference schedule,
  forward+backward with the best training schedule (``mode="training"``: generated backward
  kernels on the buffers its forward saved, where the backend builds them);
* ``lowering``: rgtune's torch executor of the kernel IR (default schedule, float32, autograd);
* ``torch``: the model's plain torch layer of :mod:`rgtune.models`, where it has one (float32);
* ``pyg``, ``dgl``: the libraries' layers (:mod:`.baselines`: which exist for which model and options).

Each output is checked against what its math should give (float64: the model's program,
interpreted op by op; for a library whose math differs, the program of that math): ``error`` of
each :class:`Impl`. ``rgtune bench`` (:mod:`rgtune.cli.bench`) prints the table and writes a row to
BENCHMARKS.md (:mod:`.report`).

Example:
    >>> spec = "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3"
    >>> res = bench("rgcn", spec, in_dim=8, out_dim=8, backend="reference", db=None, impls=("rgtune", "torch"),
    ...             repeats=1, warmup=0)              # no database: rgtune runs the default schedule
    >>> [(i.key, i.error < 1e-5, len(i.times["fwd"])) for i in res.impls]
    [('rgtune', True, 1), ('torch', True, 1)]
"""

from __future__ import annotations

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

IMPLS = ("rgtune", "lowering", "torch", "pyg", "dgl")
MODES = ("fwd", "fwd+bwd")


# ---------------------------------------------------------------------- implementations
Layer = Callable[[Tensor], Tensor]


@dataclass
class Impl:
    """One implementation under test: ``forward(x)``, its parameters, its check; ``train`` and
    ``train_params`` where a training step runs another module (rgtune's training schedule)."""

    key: str
    name: str
    forward: Layer | None
    params: list[Tensor] = field(default_factory=list)
    train: Layer | None = None
    train_params: list[Tensor] | None = None
    error: float | None = None  # max |out - expected| / max |expected|
    math: str = "same math"
    problem: str | None = None  # why it could not run
    rows: Tensor | None = None
    times: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    peak_mb: dict[str, float | None] = field(default_factory=dict)  # mode -> peak MB (:mod:`.memory`)

    def step(self, mode: str) -> tuple[Layer, list[Tensor]]:
        """What runs in ``mode``: the module's forward and the parameters it trains."""
        if mode != "fwd" and self.train is not None:
            return self.train, self.train_params if self.train_params is not None else self.params
        assert self.forward is not None
        return self.forward, self.params

    def median_ms(self, mode: str) -> float | None:
        t = self.times[mode]
        return statistics.median(t) * 1e3 if t else None


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
                config: Mapping[str, Any] | None = None, options: str = "") -> tuple[list[Impl], Tensor, str]:
    """Every implementation with the same weights and input; also the input and rgtune's schedules
    (a label). ``check=False`` leaves the float64 checks out (:mod:`.memory` measures without them);
    ``config``: rgtune runs this schedule (both modes) instead of the database's; ``options``: the
    model's (canonical text)."""
    from rgtune.ir.registry import parse_key
    from rgtune.runtime import Layer as TunedModule

    device = torch.device("cuda" if backend.target == "cuda" else "cpu")
    torch.manual_seed(seed)
    # the weights every implementation gets: the program's parameters at their declared init
    ref = TunedModule(model, graph, in_dim, out_dim, heads, options=parse_key(options), backend="reference",
                      dtype=torch.float32).to(device)
    prepare_weights(ref)  # what a library's layer needs of them (e.g. PyG's RGATConv: shared attention)
    x = torch.randn(graph.num_nodes(), in_dim, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    expected = oracle(ref)(x.double().cpu()) if check else None

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
        if impl.forward is not None and expected is not None:
            impl.error = _check(impl, x, expected)
    for lib in ("pyg", "dgl"):
        if lib in impls:
            out.append(_library_impl(lib, ref, x, check))
    return out, x, schedule


def _rgtune_impl(model: str, graph: Any, in_dim: int, out_dim: int, heads: int, backend: Any, db: Any,
                 ref: torch.nn.Module, config: Mapping[str, Any] | None = None, options: str = "") -> tuple[Impl, str]:
    """The tuned layer: the best inference schedule for the forward, the best training schedule for
    the training step (each a :func:`~rgtune.runtime.load_tuned` layer with ``ref``'s weights), or
    ``config`` for both."""
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
    schedule = f"{_trial(fwd)}; training {_trial(train)}, {_saved_label(train)}"
    impl = Impl("rgtune", f"rgtune tuned ({fwd.backend}, {_trial(fwd)})", fwd, list(fwd.parameters()),
                train=train, train_params=list(train.parameters()))
    return impl, schedule


def _trial(layer: Any) -> str:
    prov = layer.provenance
    return f"trial {prov['trial_id']}" if prov.get("trial_id") is not None else str(prov.get("source"))


def _saved_label(layer: Any) -> str:
    """What the training schedule trades: which forward values it saves (``autodiff.save``) and the
    bytes its forward hands to its backward, or that the backward is the torch lowering's."""
    from rgtune.ir.counts import count

    if layer.backward_kind == "torch":
        return f"backward by the torch lowering ({layer.backend} builds no backward kernels)"
    save = layer.training_config.get("autodiff.save", "all")
    saved_mb = count(layer.kernels, layer.graph)["saved_bytes"] / 1e6
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
    return Impl("torch", f"rgtune.models.{type(plain).__name__} (torch)", plain, list(plain.parameters()))


def _check(impl: Impl, x: Tensor, expected: Tensor) -> float | None:
    try:
        with torch.no_grad():
            return _rel_err(impl.forward(x), expected)  # type: ignore[misc]
    except Exception as e:  # noqa: BLE001 - reported in the table, the others still run
        impl.problem, impl.forward = f"{type(e).__name__}: {e}", None
        return None


def _library_impl(lib: str, ref: Any, x: Tensor, check: bool = True) -> Impl:
    label = {"pyg": "PyG", "dgl": "DGL"}[lib]
    try:
        builder = BUILDERS[lib].get(ref.model)
        if builder is None:
            raise Unavailable(f"{label} has no layer of this model")
        b = builder(ref)
    except Exception as e:  # noqa: BLE001 - a missing or broken library is a row, not a crash
        return Impl(lib, label, None, problem=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    impl = Impl(lib, b.name, b.run, list(b.module.parameters()), math=b.note, rows=b.rows)
    if check:
        impl.error = _check(impl, x, b.expected(x.double().cpu()))
    return impl


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


def time_impls(impls: list[Impl], x: Tensor, out_dim: int, repeats: int, warmup: int) -> None:
    """Fill ``impl.times``: warm-up, then ``repeats`` interleaved rounds with a rotating order."""
    grad = upstream_grad(x.shape[0], out_dim, x.device)
    runnable = [i for i in impls if i.forward is not None]
    for mode in MODES:
        for impl in list(runnable):
            try:
                for _ in range(warmup):
                    _once(impl, mode, x, grad)
            except Exception as e:  # noqa: BLE001
                impl.problem = f"{mode}: {type(e).__name__}: {e}"
                runnable.remove(impl)
        for r in range(repeats):
            order = runnable[r % len(runnable):] + runnable[:r % len(runnable)] if runnable else []
            for impl in order:
                impl.times[mode].append(_once(impl, mode, x, grad))


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
          db: str | None = "results.db", impls: Sequence[str] = IMPLS, repeats: int = 20, warmup: int = 3,
          threads: int | None = None, seed: int = 0, tune_trials: int = 0, data_dir: str | None = None,
          memory: bool = False, command: str = "", options: Mapping[str, Any] | str | None = None) -> BenchResult:
    """Time one layer side by side (see the module docstring); ``tune_trials`` > 0 tunes that many trials
    first, per mode (inference, training), when this device has no record of the workload in that
    mode (``db=None``: no database, the default schedules). ``memory``: also each implementation's
    peak memory per mode, each in its own process (:func:`rgtune.bench.memory.peak_memory`).
    ``command`` is recorded with the result; ``options``: the model's."""
    from rgtune.data import load_dataset
    from rgtune.runtime._lookup import check_model, resolve_backend
    from rgtune.runtime.load import select_schedule

    model, opts = check_model(model, options)

    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"unknown implementations {unknown}; choose from {list(IMPLS)}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # a tuning worker (spawned) then matches this process
    threads = torch.get_num_threads()
    graph = load_dataset(dataset, root=data_dir)
    be = resolve_backend(backend)
    if tune_trials > 0 and db is not None:
        for mode in ("inference", "training"):
            sel = select_schedule(model, graph, in_dim, out_dim, heads, db, be, mode=mode, options=opts)
            if sel.missing is not None or not sel.provenance.get("same_device", False):
                _tune(model, dataset, in_dim, out_dim, heads, be.name, db, tune_trials, seed, data_dir, mode, opts)
    built, x, schedule = build_impls(model, graph, in_dim, out_dim, heads, be, db, impls, seed, options=opts)
    time_impls(built, x, out_dim, repeats, warmup)
    if memory:
        from rgtune.bench.memory import peak_memory

        for impl in built:
            if impl.forward is None:
                continue
            for mode in MODES:
                impl.peak_mb[mode] = peak_memory(model, dataset, impl.key, mode, in_dim=in_dim, out_dim=out_dim,
                                                 heads=heads, backend=be.name, db=db, seed=seed, threads=threads,
                                                 data_dir=data_dir, options=opts)
    return BenchResult(model, graph.name, in_dim, out_dim, heads, be.name, schedule, threads, repeats, built,
                       machine_info(threads), versions(), command, datetime.now(UTC).strftime("%Y-%m-%d"), opts)


def _tune(model: str, dataset: str, in_dim: int, out_dim: int, heads: int, backend: str, db: str, trials: int,
          seed: int, data_dir: str | None, mode: str, options: str = "") -> None:
    from rgtune.db import TrialDatabase
    from rgtune.tuner.measure import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    print(f"bench: tuning {model} on {dataset} for {mode} ({trials} trials, backend {backend}) ...", file=sys.stderr)
    s = Tuner(Workload(model, dataset, in_dim, out_dim, heads, backend, data_dir, mode=mode, options=options),
              TrialDatabase(db), TuneOptions(trials=trials, seed=seed, progress=False)).run()
    best = f"{s.best_ms:.4g} ms" if s.best_ms is not None else "none"
    print(f"bench: tuned {s.trials_run} trials, best {best}", file=sys.stderr)
