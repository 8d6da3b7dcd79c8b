"""Training programs on the CPU backend: generated forward and backward kernels against the float64 reference.

A case compiles a model's training program (``SearchSpace(..., mode="training")``), runs
``built.run_training(x, params, dout)`` in float32 and compares the output, the input's gradient and
the gradients with ``ReferenceExecutor.run_training`` in float64:

* every IR configuration of RGCN, RGAT (2 heads) and HGT (2 heads) (``autodiff.save`` included: which
  forward values the backward reads saved), schedule knobs at their defaults (``edge_parallel``
  traversals where a layout forbids ``dst_parallel``), at 13 -> 10 features (not multiples of 8), each
  configuration once, the three graphs in turn: AIFB, an edge-case graph (a relation without edges, isolated nodes, a node
  type that is never a destination, a hub with over 20,000 in-edges, skewed sources) and on a graph
  with one node type; 4 heads at 12 -> 12 on a spread of configurations;
* the two phases (``run_forward`` then ``run_backward``) for each ``autodiff.save``: two forwards in
  flight, their backwards in reverse order, saved tensors fresh and left as they were;
* 200 random training schedules per model (``space.sample``: IR knobs and every template's schedule
  knobs) on a synthetic graph, the first few of them on AIFB too;
* every value of the backward templates' knobs (``scatter.*``, ``weightgrad.*``), compared with the
  program's own reference gradient by gradient (derived weights' included), and run twice: the
  race-free choices (``scatter.mapping=owner``, ``weightgrad.reduce=split``) give identical bits.

All configurations of a model compute the same function, so the matrix shares one float64 reference
per (model, sizes, graph) (that premise: ``test_reference_is_configuration_independent``) and compares
*learnable* params' gradients: a derived weight's gradient (linear operator reordering composes
weights) goes back through its fold in float64 (:func:`rgtune.codegen.training.learnable_grads`), as a
training step does. Each distinct kernel is compiled once per session, all up front and in parallel,
and programs with identical sources run once per graph.

Tolerance (``max|a - b| / max|b|``): 1e-4 for the output and the input's gradient; for a param's
gradient ``1e-4 * max(1, sqrt(L / 10,000))``, ``L`` the longest reduction feeding it: the most rows of
one type that one of its weight-gradient kernels sums (``|E_r|`` for a relation's weight on edge rows,
the nodes of a type for a node-typed one). A float32 sum of ``L`` rounded terms of mixed sign is off by
about ``sqrt(L)`` roundings of the terms' size, while the largest gradient entry, the scale the error is
measured against, stays near the size of a partial sum: the relative error grows with ``sqrt(L)`` and
a gradient summed over 20,000 edges of one relation may show 1.4x the error one summed over 10,000
may. (Seen: at most ~3e-5, on the edge-case graph's hub relation.)
"""

from __future__ import annotations

import math
import random
import resource
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from rgtune.codegen.base import BackendError, Saved
from rgtune.codegen.cpu import CpuBackend
from rgtune.codegen.cpu import compiler as cc
from rgtune.codegen.cpu.schedule import CPU_SCHEDULE
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.codegen.training import learnable_grads, train_step
from rgtune.data import load_dataset
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.bind import graph_arrays, row_types
from rgtune.ir.kernels import KernelProgram, ScatterKernel, WeightGradKernel
from rgtune.ir.models import build_model
from rgtune.ir.program import Program
from rgtune.search_spaces.space import SearchSpace

from _matrix import sampled

pytestmark = pytest.mark.skipif(not CpuBackend.available()[0], reason=f"cpu backend: {CpuBackend.available()[1]}")

TOL = 1e-4
MODELS = {"rgcn": 1, "rgat": 2, "hgt": 2}
DIMS = (13, 10)  # feature sizes that are not multiples of 8 (vector tails in every template)
BACKWARD_KNOBS = [k for k in CPU_SCHEDULE.knobs() if k.split(".")[0] in ("scatter", "weightgrad")]


# ------------------------------------------------------------------ graphs


@pytest.fixture(scope="session")
def aifb() -> HeteroGraph:
    return load_dataset("aifb")


@pytest.fixture(scope="session")
def edge_graph() -> HeteroGraph:
    g = random_graph((300, 200, 100), num_relations=6, num_edges=3000, empty_relations=1, isolated_nodes=3,
                     source_only_ntypes=1, hub_in_degree=20_000, src_skew=1.2, seed=7, name="train_edge_cases")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0
    assert int(g.in_degrees.max()) > 20_000
    return g


@pytest.fixture(scope="session")
def one_type() -> HeteroGraph:
    g = random_graph((500,), num_relations=4, num_edges=2000, isolated_nodes=5, seed=3, name="train_one_type")
    assert len(g.ntypes) == 1
    return g


@pytest.fixture(scope="session")
def synthetic() -> HeteroGraph:
    return random_graph((60, 50, 40), num_relations=5, num_edges=900, empty_relations=1, isolated_nodes=2,
                        degree_skew=1.0, seed=11, name="train_synthetic")


@pytest.fixture(scope="session")
def backend() -> CpuBackend:
    return CpuBackend()


# ------------------------------------------------------------------ workloads and the reference


@dataclass
class Workload:
    """A model's training program at some sizes on a graph: inputs, params and the float64 reference
    (output, input gradient, learnable params' gradients)."""

    space: SearchSpace
    graph: HeteroGraph
    x: torch.Tensor
    dout: torch.Tensor
    params: dict[str, torch.Tensor]
    ref: tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]

    def params64(self) -> dict[str, torch.Tensor]:
        return {k: v.double() for k, v in self.params.items()}


_WORKLOADS: dict[tuple[str, tuple[int, int, int], str], Workload] = {}


def workload(model: str, dims: tuple[int, int, int], graph: HeteroGraph) -> Workload:
    key = (model, dims, graph.name)
    if key not in _WORKLOADS:
        _WORKLOADS[key] = program_workload(build_model(model, *dims), graph)
    return _WORKLOADS[key]


def program_workload(program: Program, graph: HeteroGraph, mode: str = "training") -> Workload:
    """``program``'s search space on ``graph``, float32 inputs and params (fixed seeds), and (training mode)
    the float64 reference of its default configuration."""
    space = SearchSpace(program, graph, "cpu", mode=mode)
    kp = space.compile(space.default()).kernels
    params = init_params(kp, graph, seed=1)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(graph.num_nodes(), program.in_dim, generator=gen)
    dout = torch.randn(graph.num_nodes(), program.out_dim, generator=gen)
    w = Workload(space, graph, x, dout, params, None)  # type: ignore[arg-type]
    if mode == "training":
        w.ref = own_reference(kp, w, learnable=True)
    return w


def own_reference(kp: KernelProgram, w: Workload,
                  learnable: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``kp``'s float64 reference; with ``learnable``, derived weights' gradients sent back through the folds."""
    p64 = w.params64()
    out, dx, grads = ReferenceExecutor(kp, w.graph).run_training(w.x.double(), p64, w.dout.double())
    return out, dx, learnable_grads(kp, w.graph, p64, grads) if learnable else grads


def runnable(space: SearchSpace, cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg``, with the traversal mapping switched to edge_parallel when the layout forbids dst_parallel."""
    if space.compile(cfg).valid:
        return cfg
    fixed = {**cfg, "traversal.mapping": "edge_parallel"}
    assert space.compile(fixed).valid, space.compile(fixed).problems
    return fixed


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|."""
    o, r = out.detach().double().numpy(), ref.detach().numpy()
    return float(np.abs(o - r).max(initial=0.0) / max(float(np.abs(r).max(initial=0.0)), 1e-30))


def reduction_lengths(kp: KernelProgram, graph: HeteroGraph, learnable: bool) -> dict[str, int]:
    """Param -> the most rows of one type a weight-gradient kernel of it sums (a derived weight's count
    for the params it is folded from, when ``learnable``)."""
    a = graph_arrays(graph, kp.layout, kp.index_bits)
    by_grad = {g: p for p, g in kp.param_grads.items()}
    out: dict[str, int] = {}
    for k in kp.kernels:
        if isinstance(k, WeightGradKernel):
            types = row_types(a, k.rows, k.by, k.weight_end)
            n = a.rows(k.rows) if types is None else int(np.bincount(types.numpy()).max(initial=0))
            p = by_grad[k.grad]
            # a derived weight (``a__b``: a composed with b) counts for the params it is folded from
            for name in p.split("__") if learnable else [p]:
                out[name] = max(out.get(name, 0), n)
    return out


def grad_tol(length: int) -> float:
    """The tolerance of a gradient whose longest reduction sums ``length`` rows (see the module docstring)."""
    return TOL * max(1.0, math.sqrt(length / 10_000))


def compare(kp: KernelProgram, w: Workload, got: Any, ref: Any, learnable: bool) -> list[tuple[str, float, float]]:
    """``(what, error, tolerance)`` of the output, the input's gradient and every gradient of ``ref``."""
    out, dx, grads = got
    if learnable:
        grads = learnable_grads(kp, w.graph, w.params64(), {k: g.double() for k, g in grads.items()})
    assert set(grads) == set(ref[2]), (sorted(grads), sorted(ref[2]))
    lengths = reduction_lengths(kp, w.graph, learnable)
    rows = [("output", rel_error(out, ref[0]), TOL), ("input grad", rel_error(dx, ref[1]), TOL)]
    return rows + [(f"grad {p}", rel_error(g, ref[2][p]), grad_tol(lengths.get(p, 0))) for p, g in grads.items()]


def check_result(kp: KernelProgram, w: Workload, got: Any, ref: Any, learnable: bool) -> float:
    """The worst error / tolerance ratio; raises when some error exceeds its tolerance."""
    out, dx, grads = got
    n = w.graph.num_nodes()
    assert out.dtype == dx.dtype == torch.float32 and out.shape == ref[0].shape and dx.shape == (n, w.x.shape[1])
    assert all(g.dtype == torch.float32 for g in grads.values())
    rows = compare(kp, w, got, ref, learnable)
    bad = [f"{what}: {err:.2e} > {tol:.1e}" for what, err, tol in rows if not err < tol]
    assert not bad, "; ".join(bad)
    return max(err / tol for _, err, tol in rows)


Case = tuple[str, Workload, dict[str, Any]]


def verify(backend: CpuBackend, cases: list[Case]) -> dict[str, Any]:
    """Compile every distinct kernel of ``cases`` (in parallel), then run each distinct program (cases with
    the same sources are one program per graph) against its workload's shared reference."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    programs, texts, seen = [], [], set()
    for label, w, cfg in cases:
        point = w.space.compile(cfg)
        assert point.valid, (label, point.problems)
        gen = backend.generate(point.kernels, cfg)
        key = (id(w), tuple(sorted(gen.sources.items())))
        if key in seen:
            continue
        seen.add(key)
        programs.append((label, w, cfg, point.kernels))
        texts += [s.text for s in gen.kernels]
    libs = cc.compile_libraries(texts)
    t1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    failures, worst = [], 0.0
    for label, w, cfg, kp in programs:
        try:
            got = backend.build(kp, w.graph, cfg).run_training(w.x, w.params, w.dout)
            worst = max(worst, check_result(kp, w, got, w.ref, learnable=True))
        except Exception as exc:  # noqa: BLE001 - reported below with the configuration
            failures.append(f"{label} {w.graph.name}: {type(exc).__name__}: {exc}\n    {cfg}")
    stats = {"cases": len(cases), "programs": len(programs), "kernels": len(set(texts)),
             "compiled": len({lib.key for lib in libs if not lib.cache_hit}), "compile_s": round(t1 - t0, 1),
             "compiler_cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 1),
             "run_s": round(time.perf_counter() - t1, 1), "worst_error_over_tolerance": round(worst, 3)}
    print(f"verify: {stats}")
    assert not failures, f"{len(failures)} of {len(programs)} programs fail:\n" + "\n".join(failures[:5])
    return stats


def _dims(model: str, heads: int | None = None, dims: tuple[int, int] = DIMS) -> tuple[int, int, int]:
    return (*dims, MODELS[model] if heads is None or model == "rgcn" else heads)


# ------------------------------------------------------------------ the matrix


#: shards of a model's IR configurations (one test each: a test stays within the suite's per-test timeout)
SHARDS = {"rgcn": 1, "rgat": 2, "hgt": 6}
#: the default run's sample: this many IR configurations per model, spread over the shuffled order
SAMPLE = 10


def _matrix(model: str, aifb: HeteroGraph, edge_graph: HeteroGraph, one_type: HeteroGraph,
            sample: int | None = None) -> list:
    """Every IR configuration once, on one of the three graphs in turn, in a shuffled order (the
    configurations come ordered by their knobs: in that order a graph would see one value of the
    fastest-varying knob alone); with ``sample``, about that many of them, spread evenly."""
    graphs = [workload(model, _dims(model), g) for g in (aifb, edge_graph, one_type)]
    cfgs = list(graphs[0].space.ir_configs())
    random.Random(0).shuffle(cfgs)
    picked = range(0, len(cfgs), max(1, len(cfgs) // sample) if sample else 1)
    return [(model, graphs[i % 3], runnable(graphs[i % 3].space, cfgs[i])) for i in picked]


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("model,shard", [(m, i) for m in sorted(MODELS) for i in range(SHARDS[m])])
def test_every_ir_configuration_matches_reference(model: str, shard: int, backend: CpuBackend, aifb: HeteroGraph,
                                                  edge_graph: HeteroGraph, one_type: HeteroGraph) -> None:
    """Every IR configuration (``autodiff.save`` included) once over the model's shards (see :func:`_matrix`)."""
    cases = _matrix(model, aifb, edge_graph, one_type)
    # this shard's share: every SHARDS[model]-th triple of the shuffled order (a triple: one case per graph)
    cases = [c for j, c in enumerate(cases) if (j // 3) % SHARDS[model] == shard]
    for g in (aifb, edge_graph, one_type):
        mine = [c for _, cw, c in cases if cw.graph is g]
        assert {c["autodiff.save"] for c in mine} == {"all", "nodes", "input"}, g.name
    stats = verify(backend, cases)
    assert stats["programs"] >= len(cases) // 6  # configurations differ: most are programs of their own


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_sample_of_ir_configurations_matches_reference(model: str, backend: CpuBackend, aifb: HeteroGraph,
                                                         edge_graph: HeteroGraph, one_type: HeteroGraph) -> None:
    """:data:`SAMPLE` IR configurations of the shuffled matrix, spread evenly (the exhaustive test
    above takes all of them)."""
    cases = _matrix(model, aifb, edge_graph, one_type, SAMPLE)
    assert {c["autodiff.save"] for _, _, c in cases} == {"all", "nodes", "input"}
    verify(backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["rgat", "hgt"])
def test_four_heads_match_reference(model: str, backend: CpuBackend, edge_graph: HeteroGraph,
                                    one_type: HeteroGraph) -> None:
    cases = []
    for g in (edge_graph, one_type):
        w = workload(model, _dims(model, 4, (12, 12)), g)
        cfgs = list(w.space.ir_configs())
        rng = random.Random(4)
        picked = [runnable(w.space, c) for c in cfgs[:: max(1, len(cfgs) // 8)]] + [w.space.sample(rng) for _ in range(4)]
        cases += [(model, w, c) for c in picked]
    verify(backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["rgat", "hgt"])
def test_shared_backward_reductions_stored_once_match_reference(model: str, backend: CpuBackend,
                                                                edge_graph: HeteroGraph, aifb: HeteroGraph) -> None:
    """``autodiff.reuse=store``: the attention-score gradient (a feature reduction that several backward
    kernels read) gets a buffer of its own and is computed once; the numbers stay those of the reference,
    for every ``autodiff.save`` and with the fusions that move the forward's scores around."""
    cases = []
    for g in (edge_graph, aifb):
        w = workload(model, _dims(model), g)
        inline = w.space.compile({**w.space.default(), "autodiff.reuse": "inline"}).kernels
        stored = w.space.compile({**w.space.default(), "autodiff.reuse": "store"}).kernels
        assert len(stored.buffers) > len(inline.buffers) and len(stored.kernels) > len(inline.kernels)
        for save in ("all", "nodes", "input"):
            for extra in ({}, {"fusion.softmax": "full", "fusion.epilogue": "on"}):
                cases.append((model, w, runnable(w.space, {**w.space.default(), **extra, "autodiff.save": save,
                                                            "autodiff.reuse": "store"})))
    verify(backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("model,count", sampled(sorted(MODELS), 5, 200))
def test_random_training_schedules_match_reference(model: str, count: int, backend: CpuBackend,
                                                   synthetic: HeteroGraph, aifb: HeteroGraph) -> None:
    """``count`` random training schedules (IR and schedule knobs) on a synthetic graph, the first 4 on
    AIFB too (200: exhaustive; the default run takes the first 5 of the same draws)."""
    w = workload(model, _dims(model), synthetic)
    rng = random.Random(2024)
    configs = [w.space.sample(rng) for _ in range(count)]
    cases = [(model, w, c) for c in configs] + [(model, workload(model, _dims(model), aifb), c) for c in configs[:4]]
    verify(backend, cases)
    if count >= 200:
        for knob in BACKWARD_KNOBS:  # the random draws reach every value of the backward templates' knobs
            assert {c[knob] for c in configs} == set(CPU_SCHEDULE.knobs()[knob].choices), knob


def test_small_graph_quick(backend: CpuBackend) -> None:
    """A fast smoke test of all three models (the slow tests cover the matrix)."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0, name="train_small")
    for model in MODELS:
        w = workload(model, (8, 8, MODELS[model]), g)
        verify(backend, [(model, w, runnable(w.space, c)) for c in list(w.space.ir_configs())[:6]])


def test_reference_is_configuration_independent(edge_graph: HeteroGraph) -> None:
    """The premise of sharing one reference per workload: each configuration's own reference, its derived
    weights' gradients sent back through the folds, agrees."""
    for model in MODELS:
        w = workload(model, _dims(model), edge_graph)
        cfgs = random.Random(5).sample(list(w.space.ir_configs()), 3)
        if "reorder.compose" in w.space.default():
            cfgs.append({**w.space.default(), "reorder.compose": "on"})
        for cfg in cfgs:
            kp = w.space.compile(runnable(w.space, cfg)).kernels
            out, dx, grads = own_reference(kp, w, learnable=True)
            assert rel_error(out, w.ref[0]) < 1e-10 and rel_error(dx, w.ref[1]) < 1e-10, (model, cfg)
            assert set(grads) == set(w.ref[2])
            for p, g in grads.items():
                assert rel_error(g, w.ref[2][p]) < 1e-10, (model, p, cfg)


# ------------------------------------------------------------------ the backward templates' knobs


def _knob_points(model: str, w: Workload) -> list[dict[str, Any]]:
    """Each value of each backward knob, the others at their defaults, on two IR configurations: the
    default and one with compact pairs and folded weights (scatters into pairs, pairs into nodes,
    weight gradients over pair rows, derived weights' gradients)."""
    base = [w.space.default()]
    compact = {**w.space.default(), **{k.name: "pair" for k in w.space.ir_knobs if k.name in ("compact.src", "compact.dst")}}
    if "reorder.compose" in compact:
        compact["reorder.compose"] = "on"
    if w.space.check(compact) == []:
        base.append(compact)
    points = []
    for cfg in base:
        for knob in BACKWARD_KNOBS:
            points += [{**cfg, knob: v} for v in CPU_SCHEDULE.knobs()[knob].choices]
    return points


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_backward_knob_value_matches_its_own_reference(model: str, backend: CpuBackend,
                                                             edge_graph: HeteroGraph) -> None:
    """Every gradient of ``kp.param_grads`` (derived weights' too) against the program's own float64 reference,
    for each value of each scatter / weight-gradient knob; and the race-free choices are deterministic."""
    w = workload(model, _dims(model), edge_graph)
    points = _knob_points(model, w)
    cc.compile_libraries([s.text for cfg in points for s in backend.generate(w.space.compile(cfg).kernels, cfg).kernels])
    refs: dict[str, Any] = {}
    for cfg in points:
        kp = w.space.compile(cfg).kernels
        assert {ScatterKernel, WeightGradKernel} <= {type(k) for k in kp.kernels}
        ref = refs.setdefault(kp.describe(), own_reference(kp, w))
        built = backend.build(kp, w.graph, cfg)
        first = built.run_training(w.x, w.params, w.dout)
        check_result(kp, w, first, ref, learnable=False)
        if cfg.get("scatter.mapping", "owner") == "owner" and cfg.get("weightgrad.reduce", "split") == "split":
            again = built.run_training(w.x, w.params, w.dout)
            assert all(torch.equal(a, b) for a, b in zip(first[2].values(), again[2].values())), cfg
            assert torch.equal(first[1], again[1]), cfg


def test_sources_show_the_backward_knobs(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("rgat", 8, 8, 2), g, "cpu", mode="training")
    cfg = space.default()
    owner = backend.generate(space.compile(cfg).kernels, cfg).sources
    assert "scatter_perm[i]" in owner["scatter1.c"] and "omp atomic" not in owner["scatter1.c"]
    assert "reduction: each type's group partials" in owner["weight_grad3.c"]
    atomic = {**cfg, "scatter.mapping": "atomic", "weightgrad.reduce": "atomic", "weightgrad.chunk_rows": 64}
    srcs = backend.generate(space.compile(atomic).kernels, atomic).sources
    assert "#pragma omp atomic" in srcs["scatter1.c"] and "#pragma omp atomic" in srcs["weight_grad3.c"]
    assert "chunk_rows=64" in srcs["weight_grad3.c"]
    blas = {**cfg, "weightgrad.impl": "blas"}
    srcs = backend.generate(space.compile(blas).kernels, blas).sources
    assert not any(name.startswith("weight_grad") for name in srcs)
    assert "weight_grad3: torch (weightgrad.impl=blas" in srcs["program.txt"]
    assert '"weightgrad.impl": "blas"' in srcs["program.txt"]
    built = backend.build(space.compile(blas).kernels, g, blas)
    assert "BLAS" in built.info["placement"]["weight_grad3"]


def test_identical_weight_gradients_share_one_source(backend: CpuBackend) -> None:
    """Canonical names: HGT's k/q/v weight gradients (same shapes, same rows) are one source, compiled once."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("hgt", 8, 8, 2), g, "cpu", mode="training")
    gen = backend.generate(space.compile(space.default()).kernels, space.default())
    texts = [s.text for s in gen.kernels if s.kernel.startswith("weight_grad")]
    assert len(set(texts)) < len(texts)


# ------------------------------------------------------------------ running


def test_training_run_checks_inputs_and_returns_fresh_tensors(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0, name="train_small")
    w = workload("rgat", (8, 8, 2), g)
    kp = w.space.compile(w.space.default()).kernels
    built = backend.build(kp, g, w.space.default())
    out, dx, grads = built.run_training(w.x, w.params, w.dout)
    assert set(grads) == set(kp.param_grads)
    for p, t in grads.items():
        assert t.shape == w.params[p].shape and t.dtype == torch.float32, p
    kept = (out.clone(), dx.clone(), {p: t.clone() for p, t in grads.items()})
    out2, dx2, grads2 = built.run_training(w.x * 2, w.params, w.dout)
    ptrs = {t.data_ptr() for t in (out, dx, *grads.values())}
    assert not ptrs & {t.data_ptr() for t in (out2, dx2, *grads2.values())}  # never a workspace alias
    assert torch.equal(out, kept[0]) and torch.equal(dx, kept[1])
    assert all(torch.equal(grads[p], kept[2][p]) for p in grads)
    grads["weight"].fill_(1e9)  # the caller owns them: scribbling on one changes no later call
    assert torch.equal(built.run_training(w.x, w.params, w.dout)[2]["weight"], kept[2]["weight"])
    # the forward alone (a training program's run) is the training run's output
    assert torch.equal(built.run(w.x, w.params), kept[0])
    # extra tensors named like gradient params are ignored, not read
    assert torch.equal(built.run_training(w.x, {**w.params, "grad_weight": torch.ones(1)}, w.dout)[0], kept[0])
    with pytest.raises(TypeError, match="dout has dtype torch.float64"):
        built.run_training(w.x, w.params, w.dout.double())
    with pytest.raises(ValueError, match="dout must have shape"):
        built.run_training(w.x, w.params, w.dout[:3])
    with pytest.raises(KeyError, match="attn_src"):
        built.run_training(w.x, {k: v for k, v in w.params.items() if k != "attn_src"}, w.dout)
    forward = SearchSpace(build_model("rgat", 8, 8, 2), g, "cpu")
    fwd = backend.build(forward.compile(forward.default()).kernels, g, forward.default())
    assert fwd.train_fn is None
    with pytest.raises(BackendError, match="computes no gradients"):
        fwd.run_training(w.x, w.params, w.dout)


def test_train_step_sends_derived_gradients_through_the_folds(backend: CpuBackend) -> None:
    """rgtune.codegen.training.train_step on a CPU build with composed weights: one gradient per learnable
    param, those of the float64 reference."""
    g = random_graph((30, 20), num_relations=4, num_edges=300, seed=1, name="train_step")
    w = workload("hgt", (8, 8, 2), g)
    cfg = {**w.space.default(), "reorder.compose": "on"}
    kp = w.space.compile(cfg).kernels
    assert any("__" in p for p in kp.param_grads)  # a derived weight's gradient among them
    out, dx, grads = train_step(backend.build(kp, g, cfg), kp, g, w.x, w.params, w.dout)
    assert set(grads) == set(w.params)
    for p, t in grads.items():
        assert rel_error(t, w.ref[2][p]) < TOL, p


# ------------------------------------------------------------------ the two phases


@pytest.mark.parametrize("model", sorted(MODELS))
def test_phases_match_reference_and_saved_buffers_are_independent(model: str, backend: CpuBackend,
                                                                   edge_graph: HeteroGraph) -> None:
    """For each ``autodiff.save``: two forwards, then their backwards in reverse order (as two layers'
    steps in flight), each against its own float64 reference; the saved tensors are fresh (no workspace,
    no other forward's), the backward leaves them as they were, and ``run_training`` composes the phases."""
    assert CpuBackend.training == "phases"
    w = workload(model, _dims(model), edge_graph)
    for save in ("all", "nodes", "input"):
        cfg = runnable(w.space, {**w.space.default(), "autodiff.save": save})
        kp = w.space.compile(cfg).kernels
        built = backend.build(kp, edge_graph, cfg)
        assert built.phased
        runtime = built.run_fn.__self__  # type: ignore[attr-defined]
        inputs = [(w.x, w.dout), (w.x.flip(0).contiguous() * 0.5, w.dout * -2)]
        phases = [built.run_forward(x, w.params) for x, _ in inputs]
        for (_, saved1), (_, saved2) in [phases]:
            assert set(saved1.buffers) == set(kp.saved) and set(saved1.params) == set(kp.saved_params)
            ptrs1 = {t.data_ptr() for t in saved1.buffers.values()}
            assert not ptrs1 & {t.data_ptr() for t in saved2.buffers.values()}
            assert not ptrs1 & {t.data_ptr() for t in runtime.workspace.values()}
        kept = [{b: t.clone() for b, t in s.buffers.items()} for _, s in phases]
        for i in (1, 0):
            (x, dout), (out, saved) = inputs[i], phases[i]
            dx, grads = built.run_backward(x, w.params, saved, dout)
            assert all(torch.equal(saved.buffers[b], kept[i][b]) for b in kp.saved), (save, i)
            case = Workload(w.space, edge_graph, x, dout, w.params, None)  # type: ignore[arg-type]
            check_result(kp, case, (out, dx, grads), own_reference(kp, case), learnable=False)
        out, dx, grads = built.run_training(w.x, w.params, w.dout)
        assert torch.equal(out, phases[0][0])
        check_result(kp, w, (out, dx, grads), own_reference(kp, w), learnable=False)


def test_backward_checks_what_was_saved(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0, name="train_small")
    w = workload("hgt", (8, 8, 2), g)
    cfg = {**w.space.default(), "autodiff.save": "all"}
    kp = w.space.compile(cfg).kernels
    assert kp.saved
    built = backend.build(kp, g, cfg)
    _, saved = built.run_forward(w.x, w.params)
    name = kp.saved[0]
    with pytest.raises(KeyError, match=name):
        built.run_backward(w.x, w.params, Saved({}, saved.params), w.dout)
    bad = Saved({**saved.buffers, name: saved.buffers[name].double()}, saved.params)
    with pytest.raises(TypeError, match=f"saved buffer '{name}' has dtype torch.float64"):
        built.run_backward(w.x, w.params, bad, w.dout)
    with pytest.raises(TypeError, match="Saved of run_forward"):
        built.run_backward(w.x, w.params, saved.buffers, w.dout)  # type: ignore[arg-type]
