"""FiLM (Brockschmidt, ICML 2020) in the IR (:func:`rgtune.ir.models.film`) against PyG's ``FiLMConv``.

* The model: one head only; params named after PyG's and declared as PyG's ``Linear`` starts them.
* Semantics (float64, ``max|a - b| / max|b| < 1e-10``): the interpreter's output equals ``FiLMConv``'s
  (weights copied by :func:`rgtune.torch_layers.pyg.to_pyg_film`) on AIFB, MUTAG and an edge-case graph (a
  relation without edges, isolated nodes, a node type that is never a destination, a hub destination) at
  64 -> 64 and 13 -> 10; the training program's input and param gradients equal PyG's through autograd
  (the edge-case graph, AIFB).
* The IR knobs: the passes find FiLM's per-(destination, relation) linears (``compact.dst``) and its
  per-(source, relation) message (``compact.src``), and the FLOPs drop by the GEMM rows they save; on a
  small edge-case graph every IR configuration's kernels (forward) equal the interpreter, every distinct
  program after the passes has autograd's gradients (each ``autodiff.save``), and every training
  configuration's kernels compute what the interpreter does.
* The CPU backend (float32 against the float64 reference, the tolerances of ``test_cpu_training``): a
  sample of IR configurations and 20 random training schedules (forward, input gradient, every param
  gradient) on AIFB and the edge-case graph.
* The CUDA backend: every IR configuration's training program at the default schedule and 20 random
  training schedules compile with NVRTC (sm_80, sm_90); a sample runs on the CPU emulator and matches.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from rgtune.codegen.reference import ReferenceExecutor
from rgtune.data import load_dataset
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.autodiff import adjoint
from rgtune.ir.counts import count
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.kernels import GemmKernel
from rgtune.ir.models import film
from rgtune.ir.pipeline import compile_program, discover_knobs
from rgtune.ir.program import DST_PAIR, SRC_PAIR, IRError
from rgtune.search_spaces import SearchSpace

TOL64 = 1e-10
DIMS = [(64, 64), (13, 10)]


# ------------------------------------------------------------------ graphs and helpers


@pytest.fixture(scope="module")
def aifb() -> HeteroGraph:
    return load_dataset("aifb")


@pytest.fixture(scope="module")
def mutag() -> HeteroGraph:
    return load_dataset("mutag")


def edge_graph() -> HeteroGraph:
    """A relation without edges, isolated nodes, a node type that is never a destination, a hub destination
    (over 2,000 in-edges), skewed sources."""
    g = random_graph((60, 50, 40), num_relations=6, num_edges=900, empty_relations=1, isolated_nodes=3,
                     source_only_ntypes=1, hub_in_degree=2_000, src_skew=1.2, seed=4, name="film_edge_cases")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0
    assert int((g.in_degrees == 0).sum()) > 0 and int(g.in_degrees.max()) >= 2_000
    return g


@pytest.fixture(scope="module")
def edges() -> HeteroGraph:
    return edge_graph()


@pytest.fixture(scope="module")
def small() -> HeteroGraph:
    """The edge cases without the hub, small enough to interpret every IR configuration's training program."""
    g = random_graph((20, 15, 10), num_relations=5, num_edges=220, empty_relations=1, isolated_nodes=2,
                     source_only_ntypes=1, seed=2, name="film_small")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0 and int((g.in_degrees == 0).sum()) > 0
    return g


@pytest.fixture(scope="module")
def pyg() -> Any:
    return pytest.importorskip("torch_geometric")


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """``max|ours - theirs| / max|theirs|``."""
    ours, theirs = ours.detach(), theirs.detach()
    assert ours.shape == theirs.shape, (tuple(ours.shape), tuple(theirs.shape))
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300))


def state(graph: HeteroGraph, in_dim: int, out_dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 params of ``film(in_dim, out_dim)`` (every bias non-zero)."""
    return random_params(film(in_dim, out_dim), graph, seed=seed)


def features(graph: HeteroGraph, dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(graph.num_nodes(), dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def run_pyg(graph: HeteroGraph, params: dict[str, torch.Tensor], x: torch.Tensor, out_dim: int) -> tuple:
    """PyG's FiLMConv with ``params``: the module and its output on ``x``."""
    from rgtune.torch_layers.pyg import to_pyg_film

    conv = to_pyg_film(graph, params, x.shape[1], out_dim)
    return conv, conv(x, torch.stack([graph.src, graph.dst]), graph.etype)


def pyg_grads(conv: torch.nn.Module, out_dim: int) -> dict[str, torch.Tensor]:
    """The gradients autograd left in ``conv``, named and shaped as the IR's params (the inverse of
    :func:`~rgtune.torch_layers.pyg.to_pyg_film`'s copy)."""
    def grad(p: torch.Tensor) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)  # a relation without edges may leave none

    lins = torch.stack([grad(lin.weight).T for lin in conv.lins])
    films = torch.stack([grad(f.weight).T for f in conv.films])  # (R, in, 2 out): [beta | gamma]
    biases = torch.stack([grad(f.bias) for f in conv.films])
    skip = grad(conv.film_skip.weight).T
    return {"lins": lins, "films_beta": films[..., :out_dim], "films_gamma": films[..., out_dim:],
            "films_beta_bias": biases[:, :out_dim], "films_gamma_bias": biases[:, out_dim:],
            "lin_skip": grad(conv.lin_skip.weight).T, "film_skip_beta": skip[:, :out_dim],
            "film_skip_gamma": skip[:, out_dim:]}


# ------------------------------------------------------------------ the model


def test_film_has_one_head_and_pyg_names_its_params() -> None:
    with pytest.raises(IRError, match=r"heads=2.*heads=1"):
        film(8, 8, heads=2)
    p = film(13, 10)
    assert set(p.state_params()) == {"lins", "films_beta", "films_gamma", "films_beta_bias", "films_gamma_bias",
                                     "lin_skip", "film_skip_beta", "film_skip_gamma"}
    assert p.params["lins"].by == "rel" and p.params["lins"].shape == (13, 10)
    assert p.params["films_beta_bias"].shape == (10,) and p.params["lin_skip"].by == "none"


@pytest.mark.pyg
def test_params_start_as_pygs_linear(pyg: Any) -> None:
    """Every weight and bias of ``FiLMConv`` starts U(-1/sqrt(in), 1/sqrt(in)) (PyG's ``Linear`` default:
    kaiming_uniform with a = sqrt(5) for the weight, ``uniform(in, bias)`` for the bias); the program
    declares exactly that for each of its params."""
    in_dim, out_dim = 48, 40
    torch.manual_seed(0)
    conv = pyg.nn.FiLMConv(in_dim, out_dim, 3)
    bound = in_dim ** -0.5
    for name, t in conv.named_parameters():
        t = t.detach()
        assert float(t.abs().max()) <= bound, name
        assert float(t.abs().max()) > 0.9 * bound and abs(float(t.mean())) < 0.2 * bound, name  # spread: uniform
    for name, p in film(in_dim, out_dim).state_params().items():
        assert (p.init, p.fan_in) == ("uniform", in_dim), name


# ------------------------------------------------------------------ semantics: PyG's FiLMConv


@pytest.mark.pyg
@pytest.mark.parametrize("in_dim,out_dim", DIMS)
@pytest.mark.parametrize("graph_name", ["aifb", "mutag", "edges"])
def test_interpreter_equals_pyg(pyg: Any, graph_name: str, in_dim: int, out_dim: int,
                                request: pytest.FixtureRequest) -> None:
    graph = request.getfixturevalue(graph_name)
    params, x = state(graph, in_dim, out_dim), features(graph, in_dim)
    ours = Interpreter(film(in_dim, out_dim), graph).run(x, params).output
    _, theirs = run_pyg(graph, params, x, out_dim)
    assert float(theirs.detach().abs().max()) > 0.1  # not a vanishing output
    assert rel_err(ours, theirs) < TOL64


@pytest.mark.pyg
@pytest.mark.parametrize("graph_name,in_dim,out_dim", [("edges", 64, 64), ("edges", 13, 10), ("aifb", 13, 10)])
def test_training_program_has_pygs_gradients(pyg: Any, graph_name: str, in_dim: int, out_dim: int,
                                             request: pytest.FixtureRequest) -> None:
    """The adjoint's input and param gradients, interpreted in float64, against autograd through FiLMConv."""
    graph = request.getfixturevalue(graph_name)
    params, x = state(graph, in_dim, out_dim, seed=3), features(graph, in_dim, seed=4)
    dout = features(graph, out_dim, seed=5)
    conv, out = run_pyg(graph, params, x.requires_grad_(True), out_dim)
    (dx,) = torch.autograd.grad(out, [x], dout, retain_graph=True)
    out.backward(dout)
    expected = pyg_grads(conv, out_dim)
    run = Interpreter(adjoint(film(in_dim, out_dim)), graph).run(x.detach(), params, dout)
    assert rel_err(run.output, out) < TOL64
    assert rel_err(run.input_grad, dx) < TOL64
    assert set(run.param_grads) == set(expected)
    for name, g in expected.items():
        assert rel_err(run.param_grads[name], g) < TOL64, name


# ------------------------------------------------------------------ the IR knobs


def test_passes_find_the_destination_and_source_pairs(aifb: HeteroGraph) -> None:
    """beta and gamma depend on (destination, relation) only: ``compact.dst=pair`` computes their two linears
    once per unique pair, the message ``h_src W_r`` once per (source, relation) pair with ``compact.src``;
    the FLOPs drop by exactly the GEMM rows saved (AIFB: 48,810 edges, 24,299 pairs on either side)."""
    program = film(64, 64)
    names = {k.name for k in discover_knobs(program, aifb)}
    assert {"compact.dst", "compact.src", "compact.pair_index"} <= names
    assert not any(n.startswith(("reorder.", "fusion.")) for n in names)  # no pattern of theirs: relu between
    flops = {}
    for src in ("edge", "pair"):
        for dst in ("edge", "pair"):
            kp = compile_program(program, {"compact.src": src, "compact.dst": dst}, aifb).kernels
            rows = {k.weight: k.rows for k in kp.kernels if isinstance(k, GemmKernel)}
            assert rows["films_beta"] == rows["films_gamma"] == (DST_PAIR if dst == "pair" else "edge")
            assert rows["lins"] == (SRC_PAIR if src == "pair" else "edge")
            flops[src, dst] = count(kp, aifb)["flops"]
    gemm_row = 2 * 64 * 64  # one output row of a 64 -> 64 linear: 2 flops per multiply-add
    edges = aifb.num_edges()
    saved_dst = 2 * (edges - aifb.unique_pairs("dst").num_pairs) * gemm_row  # two linears: beta, gamma
    saved_src = (edges - aifb.unique_pairs("src").num_pairs) * gemm_row
    assert saved_dst > 0.25 * flops["edge", "edge"]
    assert flops["edge", "edge"] - flops["edge", "pair"] == saved_dst
    assert flops["edge", "edge"] - flops["pair", "edge"] == saved_src
    assert flops["edge", "edge"] - flops["pair", "pair"] == saved_src + saved_dst


def test_every_ir_configuration_forward_equals_the_interpreter(small: HeteroGraph) -> None:
    """Every IR configuration's kernels (the float64 reference executor) against the program's meaning."""
    program = film(13, 10)
    params, x = state(small, 13, 10), features(small, 13)
    expected = Interpreter(program, small).run(x, params).output
    seen = set()
    for cfg in SearchSpace(program, small, "cpu").ir_configs():
        kp = compile_program(program, cfg, small).kernels
        if kp.describe() not in seen:
            seen.add(kp.describe())
            assert rel_err(ReferenceExecutor(kp, small).run(x, params), expected) < TOL64, cfg
    assert len(seen) >= 20


def test_every_ir_configuration_has_the_gradients_of_autograd(small: HeteroGraph) -> None:
    """Every distinct program after the passes: its adjoint (each ``autodiff.save``) interpreted against
    autograd through the program before the passes."""
    from test_autodiff import _check, _distinct

    before = film(8, 6)
    programs = _distinct(before, small)
    assert len(programs) >= 12  # 3 layouts x compact src x compact dst
    for after, layout in programs:
        _check(before, after, small, layout)


def test_every_lowered_training_configuration_computes_what_the_interpreter_does(small: HeteroGraph) -> None:
    from test_autodiff import _lowered_equals_interpreter

    before = film(8, 6)
    configs = list(SearchSpace(before, small, "cpu", mode="training").ir_configs())
    assert {c["autodiff.save"] for c in configs} == {"all", "nodes", "input"}
    assert _lowered_equals_interpreter(before, small, configs) > len(configs) // 2


# ------------------------------------------------------------------ the CPU backend


def _cpu_workload(graph: HeteroGraph, dims: tuple[int, int]) -> Any:
    """``test_cpu_training``'s workload (float32 inputs, the float64 reference) for ``film(*dims)``."""
    from test_cpu_training import program_workload

    return program_workload(film(*dims), graph)


@pytest.fixture(scope="module")
def cpu_backend() -> Any:
    from rgtune.codegen.cpu import CpuBackend

    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    return CpuBackend()


@pytest.mark.slow
def test_cpu_training_matches_reference(cpu_backend: Any, aifb: HeteroGraph, edges: HeteroGraph) -> None:
    """Every 13th IR configuration (of the shuffled list, ``autodiff.save`` included) on each graph, and 12
    random training schedules on the edge-case graph, the first 4 on AIFB too; at 13 -> 10 features."""
    from test_cpu_training import runnable, verify

    work = {g.name: _cpu_workload(g, (13, 10)) for g in (aifb, edges)}
    cases = []
    for w in work.values():
        cfgs = list(w.space.ir_configs())
        random.Random(0).shuffle(cfgs)
        cases += [("film", w, runnable(w.space, c)) for c in cfgs[::13]]
    assert {c["autodiff.save"] for _, _, c in cases} == {"all", "nodes", "input"}
    rng = random.Random(31)
    schedules = [work[edges.name].space.sample(rng) for _ in range(12)]
    cases += [("film", work[edges.name], c) for c in schedules] + [("film", work[aifb.name], c) for c in schedules[:4]]
    stats = verify(cpu_backend, cases)
    assert stats["programs"] >= 30


# ------------------------------------------------------------------ the CUDA backend


@pytest.fixture(scope="module")
def nvrtc_ok() -> None:
    from rgtune.codegen.cuda.backend import CudaBackend

    ok, why = CudaBackend.compile_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")


@pytest.mark.slow
@pytest.mark.parametrize("every,draws", [(5, 10), pytest.param(1, 20, marks=pytest.mark.exhaustive)])
def test_cuda_training_programs_compile(nvrtc_ok: None, aifb: HeteroGraph, every: int, draws: int) -> None:
    """Every ``every``-th IR configuration's training program (all in the exhaustive run) at the default
    schedule (edge-parallel traversals where a layout forbids the default), then ``draws`` random training
    schedules, at 64 -> 64 on AIFB."""
    from _nvrtc_ledger import Ledger
    from test_cuda_training import _valid_point

    from rgtune.codegen.cuda.generate import generate

    ledger = Ledger()
    space = SearchSpace(film(64, 64), aifb, "cuda", mode="training")
    configs = list(space.ir_configs())[::every]
    for knob in space.ir_knobs:
        assert {c[knob.name] for c in configs} == set(knob.choices), knob.name
    points = [_valid_point(space, c) for c in configs]
    rng = random.Random("film-cuda")
    points += [space.compile(space.sample(rng)) for _ in range(draws)]
    problems = ledger.compile("film", [generate(p.kernels, p.config) for p in points])
    print("\n".join(ledger.summary()))
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
def test_cuda_emulator_matches_reference(nvrtc_ok: None) -> None:
    """Every 14th IR configuration (the forward's knobs, each with one ``autodiff.save`` in turn) at the default
    schedule, and random schedules that take every value of every scatter, weight-gradient and
    ``autodiff.save`` knob, on ``test_cuda_training``'s edge-case graph: the emulated training step
    (forward phase, then backward phase, buffers poisoned with NaN) against the reference."""
    from test_cuda_training import (_compare, _covered, _covering_schedules, _edge_case_graph, _inputs,
                                    _needs_cxx, _phased, _save_in_turn, _valid_point, tolerance)

    from rgtune.codegen.cuda.emulate import EmulatedProgram
    from rgtune.codegen.cuda.generate import generate

    _needs_cxx()
    g = _edge_case_graph()
    tol = tolerance(g)
    worst: dict[str, float] = {}
    for dims, cfgs in (((12, 12), None), ((16, 16), 3)):
        space = SearchSpace(film(*dims), g, "cuda", mode="training")
        if cfgs is None:
            chosen = _save_in_turn(space)[::14]
        else:
            chosen = _covering_schedules(space, random.Random("film-emulated"), cfgs)
            for name in _covered(space):
                assert {c[name] for c in chosen} == set(space.knob(name).choices), name
        for i, cfg in enumerate(chosen):
            point = _valid_point(space, cfg)
            kp = point.kernels
            x, params, dout = _inputs(kp, g, *dims)
            ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
            program = EmulatedProgram(kp, generate(kp, point.config).units, g, ("sm_80", "sm_90")[i % 2])
            errs = _compare(_phased(program, x, params, dout), ref, f"film {dims} {point.config}", tol)
            for k, e in errs.items():
                worst[k] = max(worst.get(k, 0.0), e)
    print("film on the emulator, largest relative errors:", {k: f"{e:.1e}" for k, e in worst.items()})
