"""The model options that the drop-ins run (the libraries' forms of a model) through the backends: HGT's for
DGL's ``HGTConv`` (``bias=False, activation="none", skip="none"``), RGAT's for PyG's multi-head ``RGATConv``
(``attention="mixed"``, both softmaxes). Training programs on the CPU against the float64 reference over a
sample of IR configurations and random schedules; CUDA compiled with NVRTC and run on the emulator."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rgtune.ir.program import Program
from rgtune.ir.registry import model_spec
from rgtune.search_spaces import SearchSpace

from _matrix import sampled
from test_cpu_training import program_workload, runnable, verify
from test_rgcn_decomposition import _edge_cases, cpu_backend  # noqa: F401  (a module fixture)

#: (model, options): the forms the drop-ins run
FORMS = [("hgt", {"bias": False, "activation": "none", "skip": "none"}), ("rgat", {"attention": "mixed"}),
         ("rgat", {"attention": "mixed", "softmax": "relation"})]
FORM_IDS = ["hgt-dgl", "rgat-mixed", "rgat-mixed-relation"]


def _program(model: str, options: dict[str, Any], in_dim: int, out_dim: int) -> Program:
    return model_spec(model).build(in_dim, out_dim, 2, options)


@pytest.mark.parametrize("model, options, dims", [(*FORMS[0], (12, 8)), (*FORMS[0], (8, 8)), (*FORMS[1], (12, 8)),
                                                  (*FORMS[2], (8, 8))],  # HGT's skip depends on the sizes
                         ids=["hgt-dgl-projected", "hgt-dgl-same-size", "rgat-mixed", "rgat-mixed-relation"])
def test_cpu_training_programs(model: str, options: dict[str, Any], dims: tuple[int, int], cpu_backend) -> None:
    """8 IR configurations spread over the shuffled list and 3 random schedules, on the edge-case graph
    (empty relations, a hub): output, input gradient and every gradient against the float64 reference."""
    w = program_workload(_program(model, options, *dims), _edge_cases("library_forms_edge_cases", hub=200))
    configs = list(w.space.ir_configs())
    random.Random(3).shuffle(configs)
    cases = [("ir", w, runnable(w.space, c)) for c in configs[::max(1, len(configs) // 8)]]
    rng = random.Random(f"{model}-{options}-{dims}")
    cases += [("random", w, w.space.sample(rng)) for _ in range(3)]
    assert len({c["autodiff.save"] for _, _, c in cases}) >= 2  # what the backward reads saved varies
    verify(cpu_backend, cases)


@pytest.mark.slow
@pytest.mark.parametrize("form, stride", sampled(FORM_IDS, {"hgt-dgl": 97, "rgat-mixed": 17, "rgat-mixed-relation": 17}, 1))
def test_cuda_training_programs_compile_with_nvrtc(form: str, stride: int) -> None:
    """Every ``stride``-th IR configuration's training program at the default schedule, and 3 random ones (every
    configuration and 10 random ones under RGTUNE_EXHAUSTIVE=1; the default forms' sweeps cover the rest of the
    code)."""
    from _nvrtc_ledger import Ledger
    from test_cuda_training import _OK, _WHY, _valid_point

    from rgtune.codegen.cuda.generate import generate
    from rgtune.data.synthetic import random_graph

    if not _OK:
        pytest.skip(f"NVRTC unavailable: {_WHY}")
    graph = random_graph((50, 80, 30), num_relations=12, num_edges=800, seed=0)
    model, options = FORMS[FORM_IDS.index(form)]
    space = SearchSpace(_program(model, options, 16, 16), graph, "cuda", mode="training")
    configs = list(space.ir_configs())[::stride]
    programs = [generate((p := _valid_point(space, cfg)).kernels, p.config) for cfg in configs]
    rng = random.Random(f"cuda-{form}")
    for _ in range(3 if stride > 1 else 10):
        cfg = space.sample(rng)
        programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = Ledger().compile(form, programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("model, options, cfg", [
    (*FORMS[0], {}), (*FORMS[0], {"reorder.compose": "on", "fusion.softmax": "aggregate"}),
    (*FORMS[1], {}), (*FORMS[2], {"compact.src": "pair", "fusion.softmax": "aggregate"})],
    ids=["hgt-dgl", "hgt-dgl-composed", "rgat-mixed", "rgat-mixed-relation-pairs"])
def test_cuda_emulated_training_step(model: str, options: dict[str, Any], cfg: dict[str, Any]) -> None:
    """The generated CUDA on the CPU emulator (forward, then backward) against the float64 reference."""
    from test_cuda_training import _edge_case_graph, _needs_cxx, emulated_training_step

    _needs_cxx()
    g = _edge_case_graph()
    space = SearchSpace(_program(model, options, 12, 8), g, "cuda", mode="training")
    emulated_training_step(space, g, cfg, (12, 8), f"{model} {options} {cfg}")
