"""The caller's per-edge weight (``ProgramBuilder.edge_weight``, kind ``edge_weight`` of ``graph_const``) and its
first user, RGCN's ``aggr="weighted"`` (DGL's ``RelGraphConv(g, feat, etypes, norm)``: each message times the
edge's ``norm``).

* The IR: the op, its printing, what its rows depend on (the edge itself: never moved to a pair), no gradient.
* Semantics in float64: the interpreter of ``rgcn(aggr="weighted")`` equals the formula ``h_i W_0 + b + sum_e
  w_e h_j W_r`` (every layout), and its adjoint's input and param gradients equal autograd's of the formula.
* Every IR configuration's kernels (the float64 reference executor) and every distinct program's adjoint.
* The CPU backend: random training schedules (forward, input gradient, every param gradient) in float32 against
  the float64 formula; the same through :class:`~rgtune.runtime.Layer` with ``edge_weight=`` (a tensor, an
  ``(E, 1)`` column, a dict per relation), on the whole graph and on a mini-batch block.
* The CUDA backend: random training schedules compile with NVRTC and run on the CPU emulator (phased, buffers
  poisoned with NaN) against the formula.
* The tuner's verifier draws positive weights for such a program and verifies a schedule on them.
* Errors: no weight for a program that reads one (naming ``edge_weight``), a weight of the wrong length
  (naming both lengths), a weight for a program that reads none.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from rgtune.codegen.reference import ReferenceExecutor
from rgtune.codegen.training import learnable_grads
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.autodiff import adjoint
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.models import rgcn
from rgtune.ir.op_rules import rules_of
from rgtune.ir.pipeline import compile_program
from rgtune.ir.program import EDGE_WEIGHT, GraphConst, ProgramBuilder, reads_edge_weight
from rgtune.runtime.module import Layer
from rgtune.search_spaces import SearchSpace

TOL64 = 1e-10
TOL32 = 2e-4


@pytest.fixture(scope="module")
def small() -> HeteroGraph:
    """A relation without edges, isolated nodes, a node type that is never a destination."""
    g = random_graph((20, 15, 10), num_relations=5, num_edges=220, empty_relations=1, isolated_nodes=2,
                     source_only_ntypes=1, seed=2, name="weighted_small")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0 and int((g.in_degrees == 0).sum()) > 0
    return g


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.detach().double(), theirs.detach().double()
    assert ours.shape == theirs.shape, (tuple(ours.shape), tuple(theirs.shape))
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300))


def weights(n: int, seed: int = 5) -> torch.Tensor:
    """Positive, far from 1 (a forgotten weight shows)."""
    return 0.1 + 3.0 * torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def formula(src: torch.Tensor, dst: torch.Tensor, rel: torch.Tensor, x: torch.Tensor, params: dict[str, Any],
            w: torch.Tensor, rows: int) -> torch.Tensor:
    """``h_i W_0 + b + sum_{e: j -> i} w_e h_j W_r`` for the first ``rows`` nodes (any dtype)."""
    msg = torch.einsum("ei,eio->eo", x[src], params["weight"][rel]) * w.reshape(-1, 1).to(x.dtype)
    agg = torch.zeros(rows, msg.shape[1], dtype=x.dtype).index_add(0, dst, msg)
    return agg + x[:rows] @ params["root"] + params["bias"]


def oracle(g: HeteroGraph, x: torch.Tensor, params: dict[str, torch.Tensor], w: torch.Tensor, dout: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The formula's output and autograd's gradients, in float64."""
    leaves = {k: v.detach().double().requires_grad_(True) for k, v in params.items()}
    xx = x.detach().double().requires_grad_(True)
    out = formula(g.src, g.dst, g.etype, xx, leaves, w.double(), g.num_nodes())
    grads = torch.autograd.grad(out, [xx, *leaves.values()], dout.double())
    return out.detach(), grads[0], dict(zip(leaves, grads[1:]))


def inputs(g: HeteroGraph, din: int, dout: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g.num_nodes(), din, generator=gen, dtype=torch.float64)
    d = torch.randn(g.num_nodes(), dout, generator=gen, dtype=torch.float64)
    return x, d


# ------------------------------------------------------------------ the IR


def test_the_op_reads_the_callers_weight_per_edge() -> None:
    b = ProgramBuilder("w", 4)
    v = b.edge_weight()
    assert (v.domain, v.heads, v.dim) == ("edge", 1, 1)
    prog = b.finish(b.aggregate(b.mul(b.typed_linear(b.src(b.x), "weight", out=(1, 3)), v)))
    assert "graph_const(kind=edge_weight)" in str(prog) and reads_edge_weight(prog)
    op = next(o for o in prog.ops if isinstance(o, GraphConst))
    assert rules_of(op).depends_on(op, []) == frozenset({"edge"})  # its own edge: no pair shares it
    assert not reads_edge_weight(rgcn(4, 3)) and reads_edge_weight(rgcn(4, 3, aggr="weighted"))
    assert reads_edge_weight(rgcn(6, 3, aggr="weighted", featureless=True, num_relations=1))
    assert EDGE_WEIGHT not in adjoint(rgcn(4, 3, aggr="weighted")).param_grads  # no gradient to the weight


@pytest.mark.parametrize("layout", ["csr_dst", "coo_rel_dst", "coo_rel_src"])
def test_interpreter_equals_the_formula(small: HeteroGraph, layout: str) -> None:
    prog = rgcn(6, 5, aggr="weighted")
    params = random_params(prog, small, seed=1)
    x, _ = inputs(small, 6, 5)
    w = weights(small.num_edges())
    out = Interpreter(prog, small, layout).run(x, {**params, EDGE_WEIGHT: w}).output
    assert rel_err(out, formula(small.src, small.dst, small.etype, x, params, w, small.num_nodes())) < TOL64
    assert rel_err(out, Interpreter(prog, small, layout).run(x, {**params, EDGE_WEIGHT: 2 * w}).output) > 0.01


def test_adjoint_has_the_formulas_gradients(small: HeteroGraph) -> None:
    prog = rgcn(6, 5, aggr="weighted")
    params = random_params(prog, small, seed=2)
    x, dout = inputs(small, 6, 5, seed=3)
    w = weights(small.num_edges(), seed=4)
    run = Interpreter(adjoint(prog), small).run(x, {**params, EDGE_WEIGHT: w}, dout)
    out, dx, grads = oracle(small, x, params, w, dout)
    assert rel_err(run.output, out) < TOL64 and rel_err(run.input_grad, dx) < TOL64
    assert set(run.param_grads) == set(grads)
    for name, g in grads.items():
        assert rel_err(run.param_grads[name], g) < TOL64, name


def test_every_ir_configuration_equals_the_interpreter(small: HeteroGraph) -> None:
    """Forward kernels of every IR configuration, and every training configuration's kernels, in float64."""
    prog = rgcn(6, 5, aggr="weighted")
    params = random_params(prog, small, seed=1)
    x, dout = inputs(small, 6, 5)
    w = weights(small.num_edges())
    given = {**params, EDGE_WEIGHT: w}
    out, dx, grads = oracle(small, x, params, w, dout)
    seen = set()
    for cfg in SearchSpace(prog, small, "cpu").ir_configs():
        kp = compile_program(prog, cfg, small).kernels
        if kp.describe() not in seen:
            seen.add(kp.describe())
            assert rel_err(ReferenceExecutor(kp, small).run(x, given), out) < TOL64, cfg
    training = 0
    for cfg in SearchSpace(prog, small, "cpu", mode="training").ir_configs():
        point = SearchSpace(prog, small, "cpu", mode="training").compile(cfg)
        if not point.valid:
            continue
        kp = point.kernels
        o, d, g = ReferenceExecutor(kp, small).run_training(x, given, dout)
        g = learnable_grads(kp, small, params, g)
        assert rel_err(o, out) < TOL64 and rel_err(d, dx) < TOL64, cfg
        for name, want in grads.items():
            assert rel_err(g[name], want) < TOL64, (name, cfg)
        training += 1
    assert len(seen) >= 2 and training >= 2


# ------------------------------------------------------------------ the CPU backend


@pytest.fixture(scope="module")
def cpu_backend() -> Any:
    from rgtune.codegen.cpu import CpuBackend

    ok, why = CpuBackend.available()
    if not ok:
        pytest.fail(f"cpu backend unavailable: {why}")  # an oracle never skips silently
    return CpuBackend()


def _check_step(result: tuple[Any, ...], kp: Any, g: HeteroGraph, params32: dict[str, torch.Tensor],
                expected: tuple[Any, ...], what: str) -> None:
    out, dx, grads = result
    grads = learnable_grads(kp, g, params32, grads)
    want_out, want_dx, want_grads = expected
    assert rel_err(out, want_out) < TOL32, what
    assert rel_err(dx, want_dx) < TOL32, what
    for name, want in want_grads.items():
        assert rel_err(grads[name], want) < TOL32, (name, what)


def test_cpu_random_training_schedules_match_the_formula(cpu_backend: Any, small: HeteroGraph) -> None:
    prog = rgcn(12, 8, aggr="weighted", num_bases=2)
    space = SearchSpace(prog, small, "cpu", mode="training")
    rng = random.Random("edge-weight-cpu")
    params = random_params(prog, small, seed=6)
    x, dout = inputs(small, 12, 8, seed=7)
    w = weights(small.num_edges(), seed=8)
    from rgtune.ir.folds import fold

    # the bases and their coefficients get their gradients through the fold: autograd of the same formula
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    xx = x.clone().requires_grad_(True)
    folded = fold("bases", leaves["weight"], leaves["comp"], None, (12, 8))
    o = formula(small.src, small.dst, small.etype, xx, {**leaves, "weight": folded}, w, small.num_nodes())
    dx, *back = torch.autograd.grad(o, [xx, *leaves.values()], dout)
    out, grads = o.detach(), dict(zip(leaves, back))
    inference = SearchSpace(prog, small, "cpu")
    forward_knobs = {k.name for k in inference.knobs}
    ran = 0
    for _ in range(6):
        point = space.compile(space.sample(rng))
        if not point.valid:
            continue
        built = cpu_backend.build(point.kernels, small, point.config)
        p32 = {k: v.float() for k, v in params.items()}
        result = built.run_training(x.float(), {**p32, EDGE_WEIGHT: w.float()}, dout.float())
        _check_step(result, point.kernels, small, p32, (out, dx, grads), str(point.config))
        fp = inference.compile(inference.resolve({k: v for k, v in point.config.items() if k in forward_knobs}))
        if fp.valid:
            forward = cpu_backend.build(fp.kernels, small, fp.config).run(x.float(), {**p32, EDGE_WEIGHT: w.float()})
            assert rel_err(forward, out) < TOL32, fp.config
        ran += 1
    assert ran >= 3


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_layer_takes_the_weight_with_each_call(small: HeteroGraph, backend: str) -> None:
    """A tensor, an ``(E, 1)`` column, a dict per canonical edge type: the same output; the gradients of the
    input and of every parameter are the formula's; none goes to the weight."""
    torch.manual_seed(0)
    layer = Layer("rgcn", small, 6, 5, options={"aggr": "weighted"}, backend=backend)
    params = {k: v.detach().double() for k, v in layer.state_dict().items()}
    x, dout = inputs(small, 6, 5, seed=9)
    w = weights(small.num_edges(), seed=10)
    out, dx, grads = oracle(small, x, params, w, dout)
    xx = x.float().requires_grad_(True)
    wf = w.float().requires_grad_(True)
    got = layer(xx, edge_weight=wf)
    got.backward(dout.float())
    assert rel_err(got, out) < TOL32 and rel_err(xx.grad, dx) < TOL32
    for name, want in grads.items():
        assert rel_err(layer.get_parameter(name).grad, want) < TOL32, name
    assert wf.grad is None  # a constant of the call
    bounds = small.rel_offsets.tolist()
    per_rel = {c: w.float()[a:b] for c, a, b in zip(small.canonical_etypes, bounds[:-1], bounds[1:])}
    with torch.no_grad():
        assert rel_err(layer(x.float(), edge_weight=w.float().reshape(-1, 1)), out) < TOL32
        assert rel_err(layer(x.float(), edge_weight=per_rel), out) < TOL32
        offsets = small.node_offsets.tolist()
        by_type = layer({t: x.float()[a:b] for t, a, b in zip(small.ntypes, offsets[:-1], offsets[1:])},
                        edge_weight=w.float())
        assert rel_err(torch.cat([by_type[t] for t in small.ntypes]), out) < TOL32


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_layer_on_a_mini_batch_block(small: HeteroGraph, backend: str) -> None:
    """A block (destinations first): the weight is the block's, one per block edge in its edge order; the output
    and every gradient are the formula's on the block."""
    gen = torch.Generator().manual_seed(3)
    num_src = {t: small.num_nodes(t) for t in small.ntypes}
    num_dst = {t: max(1, small.num_nodes(t) // 2) for t in small.ntypes}
    edges = {}
    for c in small.canonical_etypes:
        n = int(torch.randint(0, 12, (1,), generator=gen))
        edges[c] = (torch.randint(0, num_src[c[0]], (n,), generator=gen),
                    torch.randint(0, num_dst[c[2]], (n,), generator=gen))
    batch = Batch(small.ntypes, small.canonical_etypes, num_src=num_src, num_dst=num_dst, edges=edges)
    torch.manual_seed(1)
    layer = Layer("rgcn", small, 6, 5, options={"aggr": "weighted"}, backend=backend)
    params = {k: v.detach().double() for k, v in layer.state_dict().items()}
    x = torch.randn(batch.num_nodes(), 6, generator=gen, dtype=torch.float64)
    dout = torch.randn(batch.num_dst_nodes, 5, generator=gen, dtype=torch.float64)
    w = weights(batch.num_edges(), seed=11)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    xx = x.clone().requires_grad_(True)
    want = formula(batch.src, batch.dst, batch.etype, xx, leaves, w, batch.num_dst_nodes)
    want_grads = torch.autograd.grad(want, [xx, *leaves.values()], dout)
    x32 = x.float().requires_grad_(True)
    got = layer(x32, graph=batch, edge_weight=w.float())
    got.backward(dout.float())
    assert rel_err(got, want) < TOL32 and rel_err(x32.grad, want_grads[0]) < TOL32
    for name, g in zip(leaves, want_grads[1:]):
        assert rel_err(layer.get_parameter(name).grad, g) < TOL32, name
    with pytest.raises(ValueError, match=rf"edge_weight has {small.num_edges()} values, but batch .* has "
                                         rf"{batch.num_edges()} edges"):
        layer(x.float(), graph=batch, edge_weight=w.float().new_ones(small.num_edges()))


def test_errors_name_the_weight(small: HeteroGraph) -> None:
    layer = Layer("rgcn", small, 6, 5, options={"aggr": "weighted"}, backend="cpu")
    x = torch.randn(small.num_nodes(), 6)
    e = small.num_edges()
    with pytest.raises(ValueError, match=rf"reads a per-edge weight: call it with edge_weight=w.*\({e},\)"):
        layer(x)
    with pytest.raises(ValueError, match=rf"edge_weight has {e - 1} values, but .* has {e} edges"):
        layer(x, edge_weight=torch.rand(e - 1))
    with pytest.raises(ValueError, match=rf"edge_weight has shape \({e}, 2\)"):
        layer(x, edge_weight=torch.rand(e, 2))
    with pytest.raises(ValueError, match="edge_weight has edge types"):
        layer(x, edge_weight={("no", "such", "type"): torch.rand(3)})
    with pytest.raises(ValueError, match="reads no per-edge weight"):
        Layer("rgcn", small, 6, 5, backend="reference")(x, edge_weight=torch.rand(e))
    kp = layer.kernels
    built = ReferenceExecutor(kp, small)
    with pytest.raises(ValueError, match="reads edge_weight, a per-edge weight given with every call"):
        built.run(x, {k: v.detach() for k, v in layer.state_dict().items()})


# ------------------------------------------------------------------ the tuner's verification


def test_verifier_draws_positive_weights_and_verifies_on_them(cpu_backend: Any, small: HeteroGraph) -> None:
    from rgtune.tuner.verification import Verifier

    prog = rgcn(6, 5, aggr="weighted")
    for mode in ("full", "sampled"):
        verifier = Verifier(prog, small, training=True, mode=mode, rows=8)
        other = verifier.case(1).params[EDGE_WEIGHT].clone()
        case = verifier.case(0)  # (a sampled case's inputs hold until the next case)
        w = case.params[EDGE_WEIGHT]
        assert w.shape == (small.num_edges(),) and float(w.min()) > 0 and float(w.std()) > 0.1
        assert not torch.equal(w, other)
        assert "gradient of edge_weight" not in case.expected
        space = SearchSpace(prog, small, "cpu", mode="training")
        point = space.compile(space.resolve({}))
        built = cpu_backend.build(point.kernels, small, point.config)
        p32 = {k: v.float() for k, v in case.params.items()}
        out, dx, grads = built.run_training(case.x.float(), p32, case.dout.float())
        grads = learnable_grads(point.kernels, small, {k: v for k, v in p32.items() if k != EDGE_WEIGHT}, grads)
        got = {"output": out, "input gradient": dx, **{f"gradient of {n}": g for n, g in grads.items()}}
        err, name, tol = verifier.error(got, case)
        assert err < tol, (mode, name, err, tol)
        # the same kernels with the weights left out (all ones) fail the check: they are verified on them
        wrong = built.run_training(case.x.float(), {**p32, EDGE_WEIGHT: torch.ones_like(p32[EDGE_WEIGHT])},
                                   case.dout.float())
        err, _, tol = verifier.error({"output": wrong[0], **{k: v for k, v in got.items() if k != "output"}}, case)
        assert err > tol


# ------------------------------------------------------------------ the CUDA backend


@pytest.fixture(scope="module")
def nvrtc_ok() -> None:
    from rgtune.codegen.cuda.backend import CudaBackend

    ok, why = CudaBackend.compile_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")


@pytest.mark.slow
def test_cuda_random_schedules_compile_and_emulate(nvrtc_ok: None, small: HeteroGraph) -> None:
    """Random training schedules: compiled by NVRTC, and run on the CPU emulator (forward phase, then the
    backward phase on what it saved, buffers poisoned with NaN) against the float64 formula."""
    from _nvrtc_ledger import Ledger

    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate

    prog = rgcn(8, 8, aggr="weighted")
    space = SearchSpace(prog, small, "cuda", mode="training")
    rng = random.Random("edge-weight-cuda")
    points = [space.compile(space.resolve({}))]
    points += [p for p in (space.compile(space.sample(rng)) for _ in range(8)) if p.valid]
    generated = [generate(p.kernels, p.config) for p in points]
    assert any("G_edge_weight" in u.code for u in generated[0].units)
    problems = Ledger().compile("rgcn-weighted", generated)
    assert not problems, "\n".join(problems[:5])
    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")
    params = random_params(prog, small, seed=12)
    x, dout = inputs(small, 8, 8, seed=13)
    w = weights(small.num_edges(), seed=14)
    expected = oracle(small, x, params, w, dout)
    p32 = {k: v.float() for k, v in params.items()}
    for i, (point, gen) in enumerate(list(zip(points, generated))[:4]):
        program = EmulatedProgram(point.kernels, gen.units, small, ("sm_80", "sm_90")[i % 2])
        given = {**p32, EDGE_WEIGHT: w.float()}
        out, saved = program.run_forward(x.float(), given, fill=float("nan"))
        dx, grads = program.run_backward(x.float(), given, saved, dout.float(), fill=float("nan"))
        _check_step((out, dx, grads), point.kernels, small, p32, expected, str(point.config))


def test_counts_read_the_weight_once_per_edge(small: HeteroGraph) -> None:
    """The kernels' bytes count the weight's float32 per edge (what the cost model's features see); the FLOPs are
    those of the sum's program with one multiply per message element more."""
    from rgtune.ir.counts import count

    weighted = compile_program(rgcn(6, 5, aggr="weighted"), {}, small).kernels
    plain = compile_program(rgcn(6, 5, aggr="sum"), {}, small).kernels
    w, p = count(weighted, small), count(plain, small)
    assert w["bytes_min"] - p["bytes_min"] == 4 * small.num_edges()
    assert w["bytes_gathered"] - p["bytes_gathered"] == 4 * small.num_edges()
    assert w["flops"] - p["flops"] == 5 * small.num_edges()


def test_layer_compiles_with_its_weight_as_one_graph(small: HeteroGraph) -> None:
    """``torch.compile(fullgraph=True)`` of a weighted layer: no break, the eager output and gradients."""
    layer = Layer("rgcn", small, 6, 5, options={"aggr": "weighted"}, backend="cpu")
    x = torch.randn(small.num_nodes(), 6, requires_grad=True)
    w = weights(small.num_edges()).float()
    eager = layer(x, edge_weight=w)
    (dx,) = torch.autograd.grad(eager.sum(), [x])
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(x, edge_weight=w)
    assert rel_err(out, eager) < 1e-6
    (cdx,) = torch.autograd.grad(out.sum(), [x])
    assert rel_err(cdx, dx) < 1e-6
