"""16-bit storage of the intermediates (``precision.edges``, ``precision.nodes``) in the generated CUDA, without a GPU.

* The kernels compute what the float64 interpreter does within the documented 16-bit tolerance (the
  verifier the tuner uses: 3 x (bfloat16) or 4 x (float16) the error of the same reference rounded to the type at every op): training
  programs of RGCN, RGAT (2 heads) and HGT (2 heads), in bfloat16 and float16, at the default schedule and
  at random training schedules (IR and every template's knobs: traversal and scatter mappings and vector
  widths, GEMM tiles and epilogue strategies, weight-gradient reductions), run on the CPU emulator of the
  generated CUDA as a layer runs them (the forward phase, then the backward phase on what it saved), every
  buffer poisoned with NaN first, on a small graph and an edge-case graph (an empty relation, isolated
  nodes, a source-only node type, a hub).
* Rows of 16-bit elements are read and written 2 or 4 at a time where the vector width says so.
* Every such program compiles with NVRTC within ptxas's launch limits (sm_90, and sm_80 where the code
  differs by architecture; :mod:`_nvrtc_ledger`).
* A float32 program's sources are what they were (no 16-bit definitions: its compiled kernels stay cached).
* On a GPU (``-m gpu``; skipped without one): the same training steps on real launches, and replayed as
  recorded CUDA graphs, on the two graphs and AIFB.

A sample by default (every model in bfloat16, RGCN in float16: the types differ in the conversions alone);
``RGTUNE_EXHAUSTIVE=1`` takes every model in both, 20 random schedules per graph on the emulator and 60
through NVRTC.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
import torch

from rgtune.codegen.cuda.backend import CudaBackend
from rgtune.codegen.cuda.generate import generate
from rgtune.codegen.training import learnable_grads
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.models import build_model
from rgtune.ir.passes.precision import lowest_storage
from rgtune.search_spaces.space import SearchSpace
from rgtune.tuner.verification import Verifier

from _nvrtc_ledger import ledger  # noqa: F401  (``ledger``: the module's compile ledger, a fixture)
from test_cuda_training import _needs_cxx

_OK, _WHY = CudaBackend.compile_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"NVRTC unavailable: {_WHY}")

MODELS = {"rgcn": 1, "rgat": 2, "hgt": 2}
DIMS = (13, 10)
TYPES = {"bf16": "bfloat16", "fp16": "float16"}


@pytest.fixture(scope="module")
def graphs() -> list[HeteroGraph]:
    small = random_graph((30, 20), num_relations=3, num_edges=200, seed=0, name="cuda16_small")
    edge_cases = random_graph((40, 30, 20), num_relations=5, num_edges=300, empty_relations=1, isolated_nodes=3,
                              source_only_ntypes=1, hub_in_degree=200, seed=7, name="cuda16_edge_cases")
    return [small, edge_cases]


def _space(model: str, g: HeteroGraph, precision: str, dims: tuple[int, int] = DIMS) -> SearchSpace:
    return SearchSpace(build_model(model, *dims, MODELS[model]), g, "cuda", mode="training", precision=precision)


def _emulated(kp: Any, config: dict[str, Any], g: HeteroGraph) -> Any:
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    return EmulatedProgram(kp, generate(kp, config).units, g)


def _on_the_gpu(kp: Any, config: dict[str, Any], g: HeteroGraph) -> Any:
    from rgtune.codegen.cuda.runtime import program_of

    return program_of(CudaBackend().build(kp, g, config))


def _checked_error(space: SearchSpace, g: HeteroGraph, cfg: dict[str, Any], verifier: Verifier,
                    make: Callable[..., Any] = _emulated, device: str = "cpu", fill: float | None = float("nan")) -> float:
    """``cfg``'s training program (``make``: on the emulator, or on a GPU) run as a layer runs it (forward, then
    backward on its saved values; every buffer ``fill`` first: NaN, or None for a GPU's recorded CUDA graphs)
    and checked against the reference under the 16-bit tolerance; its error."""
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    storage = lowest_storage(kp)
    assert storage != "float32", cfg  # the program really stores something in 16 bits
    case = verifier.case(seed=1)
    c = case.on(device)
    program = make(kp, point.config, g)
    out, saved = program.run_forward(c.x, c.params, fill=fill)
    assert {saved.buffers[n].dtype for n in kp.saved if n in kp.storage} <= {torch.bfloat16, torch.float16}
    dx, grads = program.run_backward(c.x, c.params, saved, c.dout, fill=fill)
    program.synchronize()
    got = {"output": out.cpu(), "input gradient": None if dx is None else dx.cpu(),
           **{f"gradient of {n}": t.cpu() for n, t in learnable_grads(kp, g, c.params, grads).items()}}
    err, which, tol = verifier.error(got, case, storage)
    assert err < tol, f"{space.program.name} on {g.name} in {storage}, {cfg}: {which} off by {err:.3g} (tolerance {tol:.3g})"
    assert tol < 0.25, f"a tolerance of {tol:.3g} would let a kernel bug through"
    return err


#: the default run: every model in bfloat16, RGCN in float16 (float16 differs in the conversions alone, which
#: every program with a 16-bit buffer has); the exhaustive run: every model in both, 20 random schedules per graph
_DEFAULT_RUN = [("rgcn", 1, "bf16"), ("rgat", 1, "bf16"), ("hgt", 1, "bf16"), ("rgcn", 1, "fp16")]
_EXHAUSTIVE_RUN = [pytest.param(m, 20, t, marks=pytest.mark.exhaustive) for m in sorted(MODELS) for t in sorted(TYPES)]


@pytest.mark.slow
@pytest.mark.parametrize("model,count,precision", _DEFAULT_RUN + _EXHAUSTIVE_RUN)
def test_16_bit_training_programs_on_the_emulator_match_the_reference(model: str, count: int, precision: str,
                                                                      graphs: list[HeteroGraph]) -> None:
    """The default schedule on the small graph, and ``count`` random training schedules on each graph."""
    _needs_cxx()
    rng = random.Random(f"cuda16-{model}-{precision}")
    worst = []
    for i, g in enumerate(graphs):
        space = _space(model, g, precision)
        verifier = Verifier(build_model(model, *DIMS, MODELS[model]), g, training=True)
        cfgs = ([{}] if i == 0 else []) + [space.sample(rng) for _ in range(count)]
        worst += [_checked_error(space, g, cfg, verifier) for cfg in cfgs]
    assert max(worst) > 1e-4  # rounded to 16 bits (float32 is within 1e-6 here)


@pytest.mark.slow
def test_16_bit_rows_move_two_and_four_at_a_time(graphs: list[HeteroGraph]) -> None:
    """At ``vector_width=4`` (an upper bound: an attention's score kernels stay 1 wide) on rows of 16 features,
    traversals and scatters read and write 16-bit rows 4 elements (8 bytes) at a time; the program still
    computes the reference's numbers."""
    _needs_cxx()
    g = graphs[0]
    stores = 0
    for model in ("rgcn", "rgat", "hgt"):
        space = _space(model, g, "bf16", dims=(16, 16))
        cfg: dict[str, Any] = {}
        for knob in (k.name for k in space.knobs if k.name.endswith(".vector_width")):
            if space.compile({**space.default(), **cfg, knob: 4}).valid:
                cfg[knob] = 4
        point = space.compile({**space.default(), **cfg})
        code = "\n".join(u.code for u in generate(point.kernels, point.config).units)
        assert "reinterpret_cast<const rg_16x4*>" in code, model  # a vector load of a 16-bit row
        stores += code.count("= rg_16x4{rg_to_bf16(")  # a vector store, each element rounded (RGCN's edge rows)
        _checked_error(space, g, cfg, Verifier(build_model(model, 16, 16, MODELS[model]), g, training=True))
    assert stores


@pytest.mark.slow
@pytest.mark.parametrize("model,count,precision",
                         [("rgcn", 2, "bf16"), ("rgat", 2, "bf16"), ("hgt", 2, "bf16"), ("rgcn", 2, "fp16")]
                         + [pytest.param(m, 60, t, marks=pytest.mark.exhaustive) for m in sorted(MODELS)
                            for t in sorted(TYPES)])
def test_16_bit_schedules_compile_with_nvrtc(model: str, count: int, precision: str, graphs: list[HeteroGraph],
                                             ledger) -> None:  # noqa: F811
    """The default and ``count`` random 16-bit training schedules compile within the launch limits."""
    space = _space(model, graphs[1], precision, dims=(16, 16))
    rng = random.Random(f"nvrtc16-{model}-{precision}")
    programs = []
    for cfg in [{}] + [space.sample(rng) for _ in range(count)]:
        point = space.compile({**space.default(), **cfg})
        assert lowest_storage(point.kernels) == TYPES[precision]
        programs.append(generate(point.kernels, point.config))
    problems = ledger.compile(f"{model} {precision}", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_gemms_multiply_on_the_tensor_cores(precision: str, graphs: list[HeteroGraph],
                                                    ledger) -> None:  # noqa: F811
    """A GEMM that reads or writes a 16-bit buffer multiplies with ``mma.m16n8k16`` where its tile splits into
    16x8 tiles per warp (the default's 64x32 over 4 warps; 16x16 over 2; 128x64 over 8, 16 tiles each) and on
    float32 FMAs where it does not (a K slice of 8); either way the training step matches the reference (on
    the emulator, whose product reads the warps' fragments as the PTX ISA lays them out), and it compiles for
    sm_80 and sm_90 (the instruction's first architecture and the GPUs rgtune runs on)."""
    from rgtune.codegen.cuda._gemm import mma_type
    from rgtune.ir.kernels import GemmKernel

    _needs_cxx()
    g = graphs[1]
    space = _space("rgcn", g, precision, dims=(16, 16))
    verifier = Verifier(build_model("rgcn", 16, 16, 1), g, training=True)
    programs = []
    for tiles, on in (({}, True), ({"gemm.tile_rows": 16, "gemm.tile_cols": 16, "gemm.threads": 64}, True),
                      ({"gemm.tile_rows": 128, "gemm.tile_cols": 64, "gemm.threads": 256}, True),
                      ({"gemm.tile_k": 8}, False)):
        point = space.compile({**space.default(), **tiles})
        gemms = [k for k in point.kernels.kernels if isinstance(k, GemmKernel)]
        low = [k.name for k in gemms if mma_type(k, point.kernels, space.schedule.kernel_schedule(k, point.config))]
        program = generate(point.kernels, point.config)
        on_cores = {u.kernel.name for u in program.units if "rg_mma_16816(d[p], a, b);" in u.code}
        assert on_cores == set(low) and bool(on_cores) == on, (tiles, on_cores, low)
        assert all(f"mma.sync.aligned.m16n8k16.row.col.f32.{'bf16' if precision == 'bf16' else 'f16'}" in u.code
                   for u in program.units if u.kernel.name in on_cores)
        _checked_error(space, g, tiles, verifier)
        programs.append(program)
    fp32 = _space("rgcn", g, "fp32", dims=(16, 16)).compile({})
    assert not any("rg_mma_16816" in u.code for u in generate(fp32.kernels, fp32.config).units)
    problems = ledger.compile(f"mma {precision}", programs)  # sm_90
    assert not problems, "\n".join(problems[:5])
    default = space.compile(space.default())
    assert CudaBackend().compile_only(default.kernels, default.config, archs=("sm_80",)).cubins


def test_a_float32_programs_sources_have_no_16_bit_code(graphs: list[HeteroGraph]) -> None:
    """The 16-bit definitions go only into a unit that reads or writes a 16-bit buffer: a float32 program's
    kernels are the same sources (and compiled kernels) as before mixed precision existed."""
    g = graphs[0]
    for model in MODELS:
        fp32 = _space(model, g, "fp32").compile({}).kernels
        bf16 = _space(model, g, "bf16").compile({}).kernels
        assert not any("rg_bf16" in u.code or "rg_16x" in u.code for u in generate(fp32, {}).units), model
        units = generate(bf16, {}).units
        low = {u.name for u in units if "typedef unsigned short rg_bf16" in u.code}
        assert low, model
        # each unit with the definitions names a 16-bit buffer in its signature, and only those have them
        for u in units:
            typed = any(a.ctype.replace("const ", "") == "rg_bf16*" for la in u.launches for a in la.args)
            assert typed == (u.name in low), (model, u.name)


@pytest.mark.gpu
@pytest.mark.skipif(not CudaBackend.available()[0], reason=f"needs a CUDA GPU with CuPy: {CudaBackend.available()[1]}")
@pytest.mark.parametrize("precision", sorted(TYPES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_16_bit_training_steps_on_a_gpu_match_the_reference(model: str, precision: str,
                                                             graphs: list[HeteroGraph]) -> None:
    """On a GPU: the default and 3 random 16-bit training schedules per graph (the two above and AIFB), launch by
    launch on NaN-poisoned buffers and replayed as recorded CUDA graphs (whose inputs include the saved 16-bit
    buffers)."""
    from rgtune.data import load_dataset

    rng = random.Random(f"gpu16-{model}-{precision}")
    for g in [*graphs, load_dataset("aifb")]:
        space = _space(model, g, precision)
        verifier = Verifier(build_model(model, *DIMS, MODELS[model]), g, training=True)
        for cfg in [{}] + [space.sample(rng) for _ in range(3)]:
            for fill in (float("nan"), None):
                _checked_error(space, g, cfg, verifier, _on_the_gpu, "cuda", fill)
