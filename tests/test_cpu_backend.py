"""The CPU backend: generated C/OpenMP kernels against the float64 reference, compile cache, errors.

The matrix (each case: float32 run vs float64 reference, max|out - ref| / max|ref| < 1e-4):

* every IR configuration of every model (``space.ir_configs()``, kernel parameters at their
  defaults; where the default mapping is invalid for the layout, ``edge_parallel``) at
  in = out = 64, 2 heads, on AIFB and on an edge-case graph (HGT's every 3rd outside the
  exhaustive run, ``RGTUNE_EXHAUSTIVE=1``);
* 200 random schedules per model (``space.sample``) at 64/64, 1 head, on the edge-case
  graph, the first 60 of them also on MUTAG (the default run: the first 60 and 20 of them);
* heads 4 and odd sizes (7 -> 10 with 2 heads, 5 -> 12 with 4 heads) on a spread of
  configurations (every n-th IR configuration, 8 in all, and 6 random schedules), on AIFB
  and the edge-case graph.

The edge-case graph has a relation without edges, isolated nodes, a node type that is never a
destination and a hub with more than 10,000 in-edges. All configurations of a model compute
the same function, so each (model, sizes, graph) has one reference output (from a compact
configuration, the cheapest to execute); ``test_reference_is_configuration_independent``
checks that premise. Kernel libraries are content-addressed and shared between programs:
each distinct kernel is compiled once per session, all of them up front, in parallel; and
configurations that give the same program (identical sources and manifest) run once per graph.
"""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from rgtune.codegen.base import BackendError, CompileError, available_backends, create
from rgtune.codegen.cpu import CpuBackend
from rgtune.codegen.cpu import compiler as cc
from rgtune.codegen.cpu.generate import GeneratedProgram, KernelSource
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.data import load_dataset
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.models import build_model
from rgtune.search_spaces.space import SearchSpace

from _matrix import sampled

pytestmark = pytest.mark.skipif(not CpuBackend.available()[0], reason=f"cpu backend: {CpuBackend.available()[1]}")

TOL = 1e-4
MODELS = ("rgcn", "rgat", "hgt")


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def aifb() -> HeteroGraph:
    return load_dataset("aifb")


@pytest.fixture(scope="session")
def mutag() -> HeteroGraph:
    return load_dataset("mutag")


@pytest.fixture(scope="session")
def edge_graph() -> HeteroGraph:
    g = random_graph((400, 300, 200), num_relations=8, num_edges=3000, empty_relations=1, isolated_nodes=3,
                     source_only_ntypes=1, hub_in_degree=10_500, seed=7, name="edge_cases")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0
    assert int(g.in_degrees.max()) > 10_000
    return g


@pytest.fixture(scope="session")
def backend() -> CpuBackend:
    return CpuBackend()


@dataclass
class Workload:
    """A model at some sizes on a graph: its space, inputs, params and the float64 reference output."""

    space: SearchSpace
    graph: HeteroGraph
    x: torch.Tensor
    params: dict[str, torch.Tensor]
    ref: torch.Tensor


_WORKLOADS: dict[tuple[str, tuple[int, int, int], str], Workload] = {}


def workload(model: str, dims: tuple[int, int, int], graph: HeteroGraph) -> Workload:
    if model == "rgcn":  # no attention heads
        dims = (*dims[:2], 1)
    key = (model, dims, graph.name)
    if key not in _WORKLOADS:
        space = SearchSpace(build_model(model, *dims), graph, "cpu")
        kp = space.compile(space.default()).kernels
        params = init_params(kp, graph, seed=1)
        x = torch.randn(graph.num_nodes(), dims[0], generator=torch.Generator().manual_seed(2))
        cheap = {**space.default(), **{k.name: "pair" for k in space.ir_knobs if k.name in ("compact.src", "compact.dst")}}
        point = space.compile(cheap) if space.compile(cheap).valid else space.compile(space.default())
        ref = ReferenceExecutor(point.kernels, graph).run(x.double(), {k: v.double() for k, v in params.items()})
        _WORKLOADS[key] = Workload(space, graph, x, params, ref)
    return _WORKLOADS[key]


def runnable(space: SearchSpace, cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg``, with the traversal mapping switched to edge_parallel when the layout forbids dst_parallel."""
    if space.compile(cfg).valid:
        return cfg
    fixed = {**cfg, "traversal.mapping": "edge_parallel"}
    assert space.compile(fixed).valid, space.compile(fixed).problems
    return fixed


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| (numpy: single-threaded, cheaper than torch for one reduction)."""
    o, r = out.detach().numpy().astype(np.float64), ref.detach().numpy()
    return float(np.abs(o - r).max(initial=0.0) / max(float(np.abs(r).max(initial=0.0)), 1e-30))


def _cpu(r: Any) -> float:
    return float(r.ru_utime + r.ru_stime)


def verify(backend: CpuBackend, cases: list[tuple[str, Workload, dict[str, Any]]]) -> dict[str, Any]:
    """Compile every distinct kernel of ``cases`` (in parallel), then run each distinct program (cases
    whose sources and manifest coincide are one program) against its workload's reference."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = resource.getrusage(resource.RUSAGE_SELF)
    programs, texts, seen = [], [], set()
    for label, w, cfg in cases:
        kp = w.space.compile(cfg).kernels
        gen = backend.generate(kp, cfg)
        key = (id(w), tuple(sorted(gen.sources.items())))  # same sources and manifest: the same program
        if key in seen:
            continue
        seen.add(key)
        programs.append((label, w, cfg, kp))
        texts += [s.text for s in gen.kernels]
    libs = cc.compile_libraries(texts)
    t1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    failures = []
    for label, w, cfg, kp in programs:
        try:
            out = backend.build(kp, w.graph, cfg).run(w.x, w.params)
            err: Any = rel_error(out, w.ref)
        except Exception as exc:  # noqa: BLE001 - reported below with the configuration
            err = f"{type(exc).__name__}: {exc}"
        if not (isinstance(err, float) and err < TOL):
            failures.append(f"{label} {w.graph.name}: {err}\n    {cfg}")
    compiled = len({lib.key for lib in libs if not lib.cache_hit})
    stats = {"cases": len(cases), "programs": len(programs), "kernels": len(set(texts)), "compiled": compiled,
             "compile_s": round(t1 - t0, 1), "run_s": round(time.perf_counter() - t1, 1),
             "compiler_cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 1),
             "python_cpu_s": round(_cpu(resource.getrusage(resource.RUSAGE_SELF)) - _cpu(s0), 1)}
    print(f"verify: {stats}")
    assert not failures, f"{len(failures)} of {len(programs)} programs fail:\n" + "\n".join(failures[:5])
    return stats


# ------------------------------------------------------------------ the matrix


#: the default run's stride through a model's IR configurations (prime: every value of every knob is among
#: them); HGT's 960 configurations are the big matrix
IR_STRIDE = {"rgat": 7, "hgt": 23}


@pytest.mark.slow
@pytest.mark.parametrize("model,every", sampled(MODELS, IR_STRIDE, 1))
def test_every_ir_configuration_matches_reference(model: str, every: int, backend: CpuBackend, aifb: HeteroGraph,
                                                  edge_graph: HeteroGraph) -> None:
    cases = []
    for g in (aifb, edge_graph):
        w = workload(model, (64, 64, 2), g)
        cases += [(model, w, runnable(w.space, cfg)) for cfg in list(w.space.ir_configs())[::every]]
    stats = verify(backend, cases)
    assert stats["cases"] == 2 * len(list(workload(model, (64, 64, 2), aifb).space.ir_configs())[::every])


@pytest.mark.slow
@pytest.mark.parametrize("model,count", sampled(MODELS, 16, 200))
def test_random_schedules_match_reference(model: str, count: int, backend: CpuBackend, mutag: HeteroGraph,
                                          edge_graph: HeteroGraph) -> None:
    """``count`` random schedules on the edge-case graph (200 in the exhaustive run, the first 16 of the
    same draws in the default run); the first ``count // 3`` of them on MUTAG too (3x AIFB's size)."""
    rng = random.Random(1234)
    configs = [workload(model, (64, 64, 1), edge_graph).space.sample(rng) for _ in range(count)]
    cases = [(model, workload(model, (64, 64, 1), edge_graph), c) for c in configs]
    cases += [(model, workload(model, (64, 64, 1), mutag), c) for c in configs[:count // 3]]
    verify(backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dims", [(64, 64, 4), (7, 10, 2), (5, 12, 4)], ids=["h4", "odd7-10h2", "odd5-12h4"])
def test_heads_and_odd_sizes_match_reference(model: str, dims: tuple[int, int, int], backend: CpuBackend,
                                             aifb: HeteroGraph, edge_graph: HeteroGraph) -> None:
    cases = []
    for g in (aifb, edge_graph):
        w = workload(model, dims, g)
        cfgs = list(w.space.ir_configs())
        rng = random.Random(99)
        picked = cfgs[:: max(1, len(cfgs) // 8)] + [w.space.sample(rng) for _ in range(6)]
        cases += [(model, w, runnable(w.space, c)) for c in picked]
    verify(backend, cases)


def test_reference_is_configuration_independent(edge_graph: HeteroGraph) -> None:
    """The premise of sharing one reference per workload: every configuration's own reference agrees."""
    for model in MODELS:
        w = workload(model, (7, 10, 2), edge_graph)
        cfgs = list(w.space.ir_configs())
        for cfg in random.Random(5).sample(cfgs, 4):
            kp = w.space.compile(cfg).kernels
            own = ReferenceExecutor(kp, edge_graph).run(w.x.double(), {k: v.double() for k, v in w.params.items()})
            assert rel_error(own, w.ref) < 1e-10, (model, cfg)


def test_small_graph_quick(backend: CpuBackend) -> None:
    """A fast smoke test of all three models (the slow tests cover the matrix)."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    for model in MODELS:
        w = workload(model, (8, 8, 2), g)
        verify(backend, [(model, w, runnable(w.space, c)) for c in list(w.space.ir_configs())[:8]])


# ------------------------------------------------------------------ compile cache and errors


def test_compile_cold_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, edge_graph: HeteroGraph) -> None:
    """HGT (the largest program): compiled cold once, then every build finds its units in the cache, in
    this process and in a fresh one (another graph), the compiler identity included. Counted by the
    build's cache facts, not timed: a busy machine's clock says nothing about the cache."""
    space = SearchSpace(build_model("hgt", 64, 64, 2), edge_graph, "cpu")
    cfg = space.default()
    kp = space.compile(cfg).kernels
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    cold = CpuBackend().build(kp, edge_graph, cfg)
    assert not cold.cache_hit and cold.info["compiled"] > 0
    warm = [CpuBackend().build(kp, edge_graph, cfg) for _ in range(2)]
    assert all(b.cache_hit and b.info["compiled"] == 0 for b in warm), [b.info for b in warm]
    script = textwrap.dedent(f"""
        from rgtune.codegen.cpu import CpuBackend
        from rgtune.data.synthetic import random_graph
        from rgtune.ir.models import build_model
        from rgtune.search_spaces.space import SearchSpace
        g = random_graph((50, 40), num_relations=4, num_edges=400, seed=0)
        space = SearchSpace(build_model("hgt", 64, 64, 2), g, "cpu")
        cfg = {cfg!r}
        kp = space.compile(cfg).kernels
        b = CpuBackend().build(kp, g, cfg)
        print(b.cache_hit, b.info["compiled"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert out.stdout.split() == ["True", "0"], out.stdout + out.stderr


def test_compile_error_names_the_source_and_has_the_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError) as info:
        cc.compile_library("int rg_broken(void) { return undeclared_name; }\n")
    err = info.value
    assert err.source_path and os.path.exists(err.source_path) and err.source_path in str(err)
    assert "undeclared_name" in err.log and "undeclared_name" in str(err)
    # through the backend: a generated source that does not compile
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("rgcn", 8, 8), g, "cpu")
    kp = space.compile(space.default()).kernels
    real = CpuBackend.generate

    def broken(self: CpuBackend, kp: Any, schedule: Any) -> GeneratedProgram:
        gen = real(self, kp, schedule)
        bad = KernelSource(**{**gen.kernels[0].__dict__, "text": gen.kernels[0].text + "\nthis is not C;\n"})
        return GeneratedProgram([bad, *gen.kernels[1:]], gen.manifest, gen.acc_regs)

    monkeypatch.setattr(CpuBackend, "generate", broken)
    with pytest.raises(CompileError, match=r"\.c"):
        CpuBackend().build(kp, g, space.default())


def test_missing_compiler_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    ok, why = CpuBackend.available()
    assert not ok and "/nonexistent/cc" in why and "apt-get install gcc" in why and "CC" in why
    assert available_backends()["cpu"] == (False, why)
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("rgcn", 8, 8), g, "cpu")
    with pytest.raises(BackendError, match="apt-get install gcc"):
        CpuBackend().build(space.compile(space.default()).kernels, g, space.default())


def test_invalid_schedule_is_never_compiled(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("rgat", 8, 8), g, "cpu")
    cfg = {**space.default(), "layout.edges": "coo_rel_src", "traversal.mapping": "dst_parallel"}
    with pytest.raises(BackendError, match="dst_parallel needs edges grouped by destination"):
        backend.build(space.compile(cfg).kernels, g, cfg)


# ------------------------------------------------------------------ running


def test_inputs_are_checked_and_outputs_never_alias(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    w = workload("rgat", (8, 8, 2), g)
    built = backend.build(w.space.compile(w.space.default()).kernels, g, w.space.default())
    a = built.run(w.x, w.params)
    a_copy = a.clone()
    b = built.run(w.x * 2, w.params)
    assert a.data_ptr() != b.data_ptr() and torch.equal(a, a_copy)
    assert built.run(w.x.t().contiguous().t(), w.params).shape == a.shape  # non-contiguous input is fine
    with pytest.raises(TypeError, match="float32"):
        built.run(w.x.double(), w.params)
    with pytest.raises(ValueError, match="shape"):
        built.run(w.x[:5], w.params)
    with pytest.raises(ValueError, match="meta"):
        built.run(w.x.to("meta"), w.params)
    with pytest.raises(ValueError, match="param 'weight'"):
        built.run(w.x, {**w.params, "weight": w.params["weight"][:1]})
    with pytest.raises(KeyError, match="attn_src"):
        built.run(w.x, {k: v for k, v in w.params.items() if k != "attn_src"})


def test_sources_are_readable_and_info_is_recorded(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("hgt", 8, 8, 2), g, "cpu")
    cfg = {**space.default(), "layout.index_bits": 64, "gemm.impl": "blas", "fusion.softmax": "full"}
    built = backend.build(space.compile(cfg).kernels, g, cfg)
    manifest = built.sources["program.txt"]
    assert "kernels hgt" in manifest and "gemm1.c: rg_gemm_finish(b0=x" in manifest
    agg = built.sources["aggregate1.c"]
    assert "typedef int64_t idx_t;" in agg and "#pragma omp parallel" in agg and "softmax_dst" in agg
    assert "void rg_gemm_finish(const rg_ctx* c)" in built.sources["gemm1.c"]
    assert built.info["flags"].startswith("-O3 -march=native -fopenmp -fPIC -shared")
    assert built.info["threads"] == torch.get_num_threads()
    assert "BLAS" in built.info["placement"]["gemm1"]
    assert len(built.source_hash) == 16


def test_distinct_configurations_share_identical_kernels(backend: CpuBackend) -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model("hgt", 8, 8, 2), g, "cpu")
    texts: dict[str, int] = {}
    configs = list(space.ir_configs())
    for cfg in configs:
        for s in backend.generate(space.compile(cfg).kernels, runnable(space, cfg)).kernels:
            texts[s.text] = texts.get(s.text, 0) + 1
    assert len(texts) < sum(texts.values()) / 4  # kernels repeat across configurations


def test_rgtune_compile_convenience() -> None:
    import rgtune

    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    layer = rgtune.compile("hgt", g, {"compact.src": "pair", "fusion.softmax": "full"}, in_dim=8, out_dim=8, heads=2)
    params = layer.init_params(seed=3)
    x = torch.randn(g.num_nodes(), 8)
    ref = ReferenceExecutor(layer.kernels, g).run(x.double(), {k: v.double() for k, v in params.items()})
    assert rel_error(layer(x, params), ref) < TOL
    with pytest.raises(BackendError, match="invalid schedule"):
        rgtune.compile("rgat", g, {"layout.edges": "coo_rel_dst", "fusion.softmax": "full"}, in_dim=8, out_dim=8)
    assert create("cpu").name == "cpu"
    light = subprocess.run([sys.executable, "-c", "import sys, rgtune; print('rgtune.codegen' in sys.modules)"],
                           capture_output=True, text=True)
    assert light.stdout.strip() == "False"
