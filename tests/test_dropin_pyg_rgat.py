"""PyG's ``RGATConv`` options as options of the IR ``rgat`` model (``num_bases``, ``num_blocks``, ``score``,
``mod``) and :class:`rgtune.nn.pyg.RGATConv` on them.

* The IR: the defaults are the program they were; bad options are one-line errors naming the valid ones;
  the new pieces (``graph_const(kind=dst_degree)``, ``inc_positive``) appear where the option asks.
* Float64: the interpreter of each option's program, with a PyG module's parameters (mapped as the drop-in
  maps them), equals PyG's ``RGATConv`` in float64 on a graph with an isolated node, an empty relation and
  a destination of several relations: the output and the gradients of ``x`` and of every PyG parameter
  (relative error < 1e-10), for both softmaxes.
* Training: every distinct program after the passes (a sample per option), its adjoint for each
  ``autodiff.save``, against torch's autograd of the unoptimized forward.
* The CPU backend (float32 against the float64 reference executor, :mod:`test_cpu_training`'s tolerances):
  random training schedules of every option.
* CUDA: random training schedules of every option compile with NVRTC within ptxas' limits; training steps
  run on the emulator against the reference.
* The drop-in against PyG's module with the same state dict: repr, output, gradients of ``x`` and of every
  parameter, ``concat=False``, a sparse adjacency; the options it does not compute are errors naming them.

Relative error: ``max|a - b| / max|b|``.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import torch

from rgtune.codegen.cpu import CpuBackend
from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import from_pyg_homogeneous
from rgtune.ir.interpret import Interpreter
from rgtune.ir.models import rgat
from rgtune.ir.program import IRError, Program
from rgtune.search_spaces import SearchSpace
from test_autodiff import _check as check_adjoint
from test_autodiff import _distinct
from test_cpu_training import program_workload, verify
from _nvrtc_ledger import ledger  # noqa: F401  (the module's NVRTC compile ledger, a fixture)

pyg_nn = pytest.importorskip("torch_geometric.nn")

TOL = 1e-10
IN, OUT, HEADS, RELS = 8, 6, 2, 4
#: PyG's constructor options -> the IR options (the drop-in's mapping, written out here)
OPTIONS: list[dict[str, Any]] = [
    {"num_bases": 3}, {"num_blocks": 2}, {"attention_mode": "multiplicative-self-attention"},
    {"mod": "additive"}, {"mod": "scaled"}, {"mod": "f-additive"}, {"mod": "f-scaled"},
    {"num_bases": 2, "mod": "scaled", "attention_mode": "multiplicative-self-attention"},
    {"num_blocks": 2, "mod": "additive", "attention_mechanism": "within-relation"},
]
_IR_KEYS = {"num_bases": "num_bases", "num_blocks": "num_blocks", "mod": "mod"}


def ir_options(pyg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"attention": "mixed"}
    for k, v in pyg.items():
        if k in _IR_KEYS:
            out[_IR_KEYS[k]] = v
        elif k == "attention_mode":
            out["score"] = {"additive-self-attention": "additive", "multiplicative-self-attention": "multiplicative"}[v]
        elif k == "attention_mechanism":
            out["softmax"] = {"across-relation": "destination", "within-relation": "relation"}[v]
    return out


def _ids(o: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in o.items())


# ------------------------------------------------------------------ graphs


def pyg_graph(seed: int = 0, num_nodes: int = 24, num_edges: int = 90) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``edge_index``, ``edge_type``: node ``num_nodes - 1`` isolated, relation ``RELS - 1`` empty, node 0 a
    destination of every other relation; the edges in no particular order."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes - 1, (2, num_edges), generator=gen)
    et = torch.randint(0, RELS - 1, (num_edges,), generator=gen)
    hub = torch.stack([torch.arange(1, RELS), torch.zeros(RELS - 1, dtype=torch.long)])
    return torch.cat([ei, hub], 1), torch.cat([et, torch.arange(RELS - 1)]), num_nodes


@pytest.fixture(scope="module")
def graph() -> HeteroGraph:
    ei, et, n = pyg_graph()
    return from_pyg_homogeneous(ei, et, n, RELS, name="rgat_pyg_edges")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _pyg_module(options: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """PyG's module, float64, every parameter random (PyG leaves ``l2`` uninitialized)."""
    torch.manual_seed(seed)
    m = pyg_nn.RGATConv(IN, OUT, RELS, heads=HEADS, **options).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return m


def _program_params(m: torch.nn.Module, options: dict[str, Any]) -> dict[str, torch.Tensor]:
    """PyG's parameters as the IR program's (what the drop-in's ``_rgtune_params`` does)."""
    out = {"attn_dst": m.q, "attn_src": m.k}
    if options.get("num_bases") is not None:
        out.update(basis=m.basis, att=m.att)
    else:
        out["weight"] = m.weight
    if options.get("mod") == "additive":
        out["w"] = m.w.view(1, -1)
    elif options.get("mod") == "scaled":
        out.update(l1=m.l1, b1=m.b1.view(-1), l2=m.l2, b2=m.b2.view(-1))
    return out


# ------------------------------------------------------------------ the IR


def test_the_defaults_are_the_program_they_were() -> None:
    base = str(rgat(8, 8, 2, attention="mixed"))
    assert base == str(rgat(8, 8, 2, attention="mixed", num_bases=None, num_blocks=None, score="additive", mod=None))
    assert "leaky_relu" in base and "dst_degree" not in base and "inc_positive" not in base


def test_the_options_are_in_the_program() -> None:
    assert "fold_bases(basis, att)" in str(rgat(8, 8, 2, attention="mixed", num_bases=3))
    assert "per_head=True" in str(rgat(8, 8, 2, attention="mixed", num_blocks=4))
    mult = str(rgat(8, 8, 2, attention="mixed", score="multiplicative"))
    assert "leaky_relu" not in mult and "= mul(%4, %5) : edge[2x1]" in mult
    assert "inc_positive(" in str(rgat(8, 8, 2, mod="f-additive"))
    for mod in ("scaled", "f-scaled"):
        assert "graph_const(kind=dst_degree)" in str(rgat(8, 8, 2, mod=mod))
    scaled = rgat(8, 8, 2, mod="scaled")
    assert {k: p.shape for k, p in scaled.params.items() if k in ("l1", "b1", "l2", "b2")} == {
        "l1": (1, 4), "b1": (4,), "l2": (4, 4), "b2": (4,)}
    assert rgat(8, 8, 2, mod="additive").params["w"].shape == (1, 4)


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(IRError, match=r"rgat: unknown score 'dot'; choose one of \['additive', 'multiplicative'\]"):
        rgat(8, 8, 2, score="dot")  # type: ignore[arg-type]
    with pytest.raises(IRError, match=r"rgat: unknown mod 'scale'; choose one of \[None, 'additive', 'scaled'"):
        rgat(8, 8, 2, mod="scale")  # type: ignore[arg-type]
    with pytest.raises(IRError, match=r"rgat: num_bases=2 and num_blocks=2 exclude each other"):
        rgat(8, 8, 2, num_bases=2, num_blocks=2)
    with pytest.raises(IRError, match=r"rgat: num_blocks=3 must divide in_dim=8 and out_dim=8"):
        rgat(8, 8, 2, num_blocks=3)


# ------------------------------------------------------------------ float64 against PyG


@pytest.mark.parametrize("options", OPTIONS + [{"attention_mechanism": "within-relation", "mod": "f-scaled"}],
                         ids=_ids)
def test_the_interpreter_is_pygs_rgat_with_its_gradients(options: dict[str, Any]) -> None:
    ei, et, n = pyg_graph(seed=1)
    graph = from_pyg_homogeneous(ei, et, n, RELS, name="rgat_pyg_f64")
    m = _pyg_module(options, seed=2)
    x = torch.randn(n, IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    dout = torch.randn(n, HEADS * OUT, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    theirs = m(x, ei, et) - (m.bias if m.bias is not None else 0)
    program = rgat(IN, HEADS * OUT, HEADS, **ir_options(options))
    ours = Interpreter(program, graph).run(x, _program_params(m, options)).output.reshape(n, -1)
    assert _rel(ours, theirs) < TOL
    names = [k for k, p in m.named_parameters() if k != "bias"]
    g_theirs = torch.autograd.grad(theirs, [x, *[m.get_parameter(k) for k in names]], dout, allow_unused=True)
    g_ours = torch.autograd.grad(ours, [x, *[m.get_parameter(k) for k in names]], dout, allow_unused=True)
    for k, a, b in zip(["x", *names], g_ours, g_theirs):
        if b is None or not b.abs().max() > 0:  # a parameter this option does not read (PyG keeps them all)
            assert a is None or not a.abs().max() > 0, k
            continue
        assert _rel(a, b) < TOL, k


# ------------------------------------------------------------------ training: the adjoint


@pytest.mark.parametrize("options", OPTIONS, ids=_ids)
def test_every_program_after_the_passes_has_autograds_gradients(options: dict[str, Any], graph: HeteroGraph) -> None:
    before = rgat(6, 8, 2, **ir_options(options))
    distinct = _distinct(before, graph)
    for after, layout in random.Random(_ids(options)).sample(distinct, min(6, len(distinct))):
        check_adjoint(before, after, graph, layout)


# ------------------------------------------------------------------ the CPU backend


@pytest.fixture(scope="module")
def backend() -> CpuBackend:
    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    return CpuBackend()


@pytest.mark.slow
def test_cpu_random_training_schedules_match_the_reference(backend: CpuBackend, graph: HeteroGraph) -> None:
    """3 random training schedules (IR and schedule knobs) per option, the default one too, float32 against the
    float64 reference executor: output, input gradient and every parameter's gradient."""
    cases = []
    for i, options in enumerate(OPTIONS):
        w = program_workload(rgat(14, 10, 2, **ir_options(options)), graph)  # not multiples of 8
        rng = random.Random(f"rgat-cpu-{i}")
        cfgs = [w.space.default()] + [w.space.sample(rng) for _ in range(3)]
        cases += [(_ids(options), w, c) for c in cfgs]
    verify(backend, cases)


# ------------------------------------------------------------------ CUDA: NVRTC and the emulator


def _cuda_space(program: Program, graph: HeteroGraph, mode: str = "training") -> SearchSpace:
    from rgtune.codegen.cuda.backend import CudaBackend

    ok, why = CudaBackend.compile_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")
    return SearchSpace(program, graph, "cuda", mode=mode)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_random_cuda_training_schedules_compile(ledger: Any, graph: HeteroGraph) -> None:
    """2 random training schedules per option and its default, every unit for sm_90 (and sm_80 where the code
    differs by architecture), within ptxas' launch limits."""
    from rgtune.codegen.cuda.generate import generate

    programs = []
    for i, options in enumerate(OPTIONS):
        space = _cuda_space(rgat(64, 64, 2, **ir_options(options)), graph)
        rng = random.Random(f"rgat-cuda-{i}")
        for c in [space.default()] + [space.sample(rng) for _ in range(2)]:
            point = space.compile(c)
            assert point.valid, point.problems
            programs.append(generate(point.kernels, c))
    problems = ledger.compile("rgat pyg options", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTIONS, ids=_ids)
def test_the_cuda_emulator_matches_the_reference(options: dict[str, Any], graph: HeteroGraph) -> None:
    """A training step (forward, then backward on what it saved) of a random schedule on the emulator."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate
    from rgtune.codegen.reference import ReferenceExecutor
    from test_cuda_training import _compare, _inputs, _phased, tolerance

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator")
    program = rgat(12, 16, 2, **ir_options(options))
    space = _cuda_space(program, graph)
    cfg = space.sample(random.Random(f"rgat-emu-{_ids(options)}"))
    point = space.compile(cfg)
    assert point.valid, point.problems
    kp = point.kernels
    x, params, dout = _inputs(kp, graph, program.in_dim, program.out_dim)
    emulated = EmulatedProgram(kp, generate(kp, point.config).units, graph, ("sm_80", "sm_90")[len(cfg) % 2])
    _compare(_phased(emulated, x, params, dout), ReferenceExecutor(kp, graph).run_training(x, params, dout),
             f"rgat {options} {cfg}", tolerance(graph))


# ------------------------------------------------------------------ the drop-in against PyG's module


def _pair(options: dict[str, Any], **extra: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    from rgtune.nn.pyg import RGATConv

    torch.manual_seed(5)
    ours = RGATConv(IN, OUT, RELS, heads=HEADS, db=None, **options, **extra)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    theirs = pyg_nn.RGATConv(IN, OUT, RELS, heads=HEADS, **options, **extra)
    theirs.load_state_dict(ours.state_dict())
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("options", OPTIONS + [{"concat": False, "mod": "scaled"}, {"bias": False}], ids=_ids)
def test_the_dropin_is_pygs_module(options: dict[str, Any]) -> None:
    ours, theirs = _pair(options)
    assert repr(ours) == repr(theirs) == f"RGATConv({IN}, {OUT}, heads={HEADS})"
    ei, et, n = pyg_graph(seed=6)
    x = torch.randn(n, IN, generator=torch.Generator().manual_seed(7))
    dout = torch.randn(n, HEADS * OUT if options.get("concat", True) else OUT)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no database: the default schedule, said once
        a = ours(xs[0], ei, et)
    b = theirs(xs[1], ei, et)
    assert a.shape == b.shape and _rel(a, b) < 1e-5
    (a * dout).sum().backward()
    (b * dout).sum().backward()
    assert _rel(xs[0].grad, xs[1].grad) < 1e-5
    for (k, p), q in zip(ours.named_parameters(), theirs.parameters()):
        if q.grad is None or not q.grad.abs().max() > 0:
            assert p.grad is None or not p.grad.abs().max() > 0, k
        else:
            assert _rel(p.grad, q.grad) < 1e-4, k


def test_the_dropin_reads_a_sparse_adjacency() -> None:
    ours, theirs = _pair({"num_bases": 2})
    ei, et, n = pyg_graph(seed=8)
    first = torch.unique(ei[0] * n + ei[1], return_inverse=True)[1]  # one edge per pair: coalesce would sum them
    keep = torch.zeros(first.max() + 1, dtype=torch.long).scatter_(0, first.flip(0), torch.arange(first.numel()).flip(0))
    ei, et = ei[:, keep], et[keep]
    x = torch.randn(n, IN)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), et, (n, n)).coalesce()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ours(x, adj_t)
    b = theirs(x, ei, et)
    assert _rel(a, b) < 1e-5


def test_what_the_dropin_does_not_compute_is_an_error_naming_it() -> None:
    from rgtune.nn.pyg import RGATConv

    with pytest.raises(ValueError, match=r"negative_slope=0.1 is not supported"):
        RGATConv(IN, OUT, RELS, negative_slope=0.1, db=None)
    with pytest.raises(ValueError, match=r"attention_mode='dot'; choose one of"):
        RGATConv(IN, OUT, RELS, attention_mode="dot", db=None)
