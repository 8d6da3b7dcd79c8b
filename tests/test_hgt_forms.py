"""HGT's options for DGL's form (``bias=False, activation="none", skip="none"``: what ``rgtune.nn.dgl.HGTConv``
runs) through the backends: training programs on the CPU against the float64 reference over a sample of IR
configurations and random schedules, CUDA compiled with NVRTC and run on the emulator."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rgtune.ir.models import hgt
from rgtune.search_spaces import SearchSpace

from _matrix import sampled
from test_cpu_training import program_workload, runnable, verify
from test_rgcn_decomposition import _edge_cases

DGL_FORM = {"bias": False, "activation": "none", "skip": "none"}


@pytest.fixture(scope="module")
def cpu_backend():
    from rgtune.codegen.cpu import CpuBackend

    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    return CpuBackend()


@pytest.mark.parametrize("dims", [(12, 8), (8, 8)], ids=["in!=out", "in==out"])
def test_cpu_training_programs_of_dgls_form(dims: tuple[int, int], cpu_backend) -> None:
    """8 IR configurations spread over the shuffled list and 6 random schedules, on the edge-case graph
    (empty relations, a hub): output, input gradient and every gradient against the float64 reference."""
    w = program_workload(hgt(*dims, heads=2, **DGL_FORM), _edge_cases("hgt_forms_edge_cases", hub=200))
    configs = list(w.space.ir_configs())
    random.Random(3).shuffle(configs)
    cases = [("ir", w, runnable(w.space, c)) for c in configs[::max(1, len(configs) // 8)]]
    rng = random.Random(f"hgt-dgl-{dims}")
    cases += [("random", w, w.space.sample(rng)) for _ in range(6)]
    assert {c["autodiff.save"] for _, _, c in cases} >= {"all", "nodes"}
    verify(cpu_backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("model, stride", sampled(["hgt"], 48, 1))
def test_cuda_training_programs_of_dgls_form_compile_with_nvrtc(model: str, stride: int) -> None:
    """Every ``stride``-th IR configuration's training program of DGL's form at the default schedule, and 3 random
    ones (every configuration and 10 random ones under RGTUNE_EXHAUSTIVE=1; the default form's sweep covers the
    rest of the code)."""
    from _nvrtc_ledger import Ledger
    from test_cuda_training import _OK, _WHY, _valid_point

    from rgtune.codegen.cuda.generate import generate
    from rgtune.data.synthetic import random_graph

    if not _OK:
        pytest.skip(f"NVRTC unavailable: {_WHY}")
    graph = random_graph((50, 80, 30), num_relations=12, num_edges=800, seed=0)
    space = SearchSpace(hgt(16, 16, heads=2, **DGL_FORM), graph, "cuda", mode="training")
    configs = list(space.ir_configs())[::stride]
    programs = [generate((p := _valid_point(space, cfg)).kernels, p.config) for cfg in configs]
    rng = random.Random("cuda-hgt-dgl")
    for _ in range(3 if stride > 1 else 10):
        cfg = space.sample(rng)
        programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = Ledger().compile("hgt (DGL's form)", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("cfg", [{}, {"reorder.compose": "on", "fusion.softmax": "aggregate"}], ids=["default", "composed"])
def test_cuda_emulated_training_step_of_dgls_form(cfg: dict[str, Any]) -> None:
    """The generated CUDA on the CPU emulator (forward, then backward) against the float64 reference."""
    from test_cuda_training import _compare, _edge_case_graph, _inputs, _needs_cxx, _phased, tolerance

    from rgtune.codegen.cuda.emulate import EmulatedProgram
    from rgtune.codegen.cuda.generate import generate
    from rgtune.codegen.reference import ReferenceExecutor

    _needs_cxx()
    g = _edge_case_graph()
    space = SearchSpace(hgt(12, 8, heads=2, **DGL_FORM), g, "cuda", mode="training")
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    x, params, dout = _inputs(kp, g, 12, 8)
    ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
    program = EmulatedProgram(kp, generate(kp, point.config).units, g, "sm_90")
    _compare(_phased(program, x, params, dout), ref, f"hgt (DGL's form) {cfg}", tolerance(g))
