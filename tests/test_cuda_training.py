"""The CUDA backend on training programs: backward kernels generated, compiled with NVRTC and run.

* Compile sweeps (slow): every IR configuration of rgcn, rgat (2 heads) and hgt (2 heads; every 5th
  outside the exhaustive run) as a training program at the default schedule (where that default is
  invalid, the edge-parallel traversal), and random training schedules per model (20; 200 in the
  exhaustive run), to cubins within the launch limits ptxas reports: for sm_90, and for sm_80 where the
  code differs by architecture (every unit for both in the exhaustive run; :mod:`_nvrtc_ledger`).
  Identical units are compiled once; a summary is printed at the end.
* Structure: the scatter and weight-gradient knobs and their constraints; the code a schedule asks for
  (atomics only where asked, the host tables, the second pass); the host tables themselves.
* Emulated runs (:mod:`rgtune.codegen.cuda.emulate`): a training step as a layer runs it (the forward
  phase, then the backward phase on what it saved), its output, input gradient and every param gradient
  against the float64 reference executor (``run_training``), buffers poisoned with NaN, on small graphs
  with the edge cases (empty relations, isolated nodes, a hub destination and a hub source with more
  than 32 edges, one node type, feature sizes not multiples of 8, several heads): every IR configuration
  (the adjoint's knobs, ``autodiff.save`` and ``autodiff.reuse``, in turn) at the default schedule (slow),
  and random schedules that take every value of every scatter, weight-gradient and ``autodiff.*`` knob. The phases: two forwards, then their
  backwards in reverse order, for each ``autodiff.save``. A summary of the largest errors is printed at
  the end.
* On a GPU (``-m gpu``, skipped without one): the same checks on real launches, on AIFB and MUTAG
  too; a recorded training step, and recorded phases (two forwards, two backwards in reverse order)
  against their launches; ``run_training`` and the backward phase timed.

Tolerance: ``max|got - ref| / max|ref| < 1e-4`` per tensor. The weight gradients are sums over all
rows of a type, in another order than the reference's (and, with atomics, in no fixed order): the
rounding error of a float32 sum of ``n`` terms grows like ``sqrt(n)``, so the bound is multiplied by
``sqrt(n / 4096)`` where a graph's longest reduction (a relation's edges, a node type's nodes, a
node's degree) ``n`` is longer (:func:`tolerance`). The emulator's graphs stay below that.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rgtune.codegen.base import BackendError, BuiltProgram
from rgtune.codegen.cuda.backend import CudaBackend
from rgtune.codegen.cuda.generate import InvalidSchedule, generate
from rgtune.codegen.cuda.runtime import scatter_groups, weightgrad_tables
from rgtune.codegen.cuda.schedule import CUDA_SCHEDULE
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.codegen.schedule import kernel_schedule
from rgtune.codegen.training import learnable_grads, train_step
from rgtune.data.synthetic import random_graph
from rgtune.ir.bind import graph_arrays
from rgtune.ir.kernels import ReduceE, ScatterKernel, TraversalKernel, WeightGradKernel
from rgtune.ir.models import build_model
from rgtune.search_spaces import SearchSpace

from _matrix import sampled
from _nvrtc_ledger import Ledger, ledger, print_at_end  # noqa: F401  (``ledger``: a module fixture)

_OK, _WHY = CudaBackend.compile_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"NVRTC unavailable: {_WHY}")

#: the models and their heads
MODELS = {"rgcn": 1, "rgat": 2, "hgt": 2}
RANDOM_SCHEDULES = 200
#: random schedules per model on the emulator, before the ones added to take every knob value
EMULATED_RANDOM = 4
REL_TOL = 1e-4
#: the schedule knobs a training program adds (the backward templates')
TRAINING_KNOBS = [name for name in CUDA_SCHEDULE.knobs() if name.split(".")[0] in ("scatter", "weightgrad")]
#: and what random schedules must cover: those, and the adjoint's IR knobs (which forward values are saved;
#: a shared reduction of the backward stored or recomputed, where a model has one)
COVERED_KNOBS = [*TRAINING_KNOBS, "autodiff.save", "autodiff.reuse"]


def tolerance(graph: Any) -> float:
    """:data:`REL_TOL`, times ``sqrt(n / 4096)`` for a graph whose longest reduction ``n`` is longer."""
    longest = max(int(torch.bincount(graph.etype).max()), int(torch.diff(graph.node_offsets).max()),
                  int(torch.bincount(graph.dst).max()), int(torch.bincount(graph.src).max()))
    return REL_TOL * max(1.0, math.sqrt(longest / 4096))


def _space(model: str, graph: Any, dims: tuple[int, int] = (64, 64)) -> SearchSpace:
    return SearchSpace(build_model(model, dims[0], dims[1], MODELS[model]), graph, "cuda", mode="training")


def _valid_point(space: SearchSpace, cfg: dict[str, Any]):
    """``cfg`` compiled; where the default traversal mapping is invalid, the edge-parallel one."""
    point = space.compile(cfg)
    if not point.valid:
        point = space.compile({**cfg, "traversal.mapping": "edge_parallel"})
    assert point.valid, point.problems
    return point


# ----------------------------------------------------------------------------- compile sweeps
@dataclass
class _Errors:
    """The largest relative error seen per model and tensor kind (output, input gradient, param gradients)."""

    worst: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # -> (error, tolerance)
    runs: int = 0

    def add(self, model: str, errors: dict[str, float], tol: float) -> None:
        self.runs += 1
        for name, err in errors.items():
            kind = "param gradients" if name.startswith("grad ") else name
            if err >= self.worst.get((model, kind), (-1.0, tol))[0]:
                self.worst[(model, kind)] = (err, tol)

    def summary(self) -> list[str]:
        lines = [f"CUDA training: largest relative errors against the float64 reference ({self.runs} runs)"]
        for (model, kind), (err, tol) in sorted(self.worst.items()):
            lines.append(f"  {model:5s} {kind:16s} {err:.2e} (tolerance {tol:.0e})")
        return lines


@pytest.fixture(scope="module")
def errors(request: pytest.FixtureRequest):
    seen = _Errors()
    yield seen
    if seen.runs:
        print_at_end(request, seen.summary())


@pytest.fixture(scope="module")
def graph():
    """AIFB (the real workload of the knob space), or a synthetic graph with the same knobs."""
    try:
        from rgtune.data import load_dataset

        return load_dataset("aifb")
    except Exception:  # noqa: BLE001 - no dataset here: the knob space is the same on a synthetic graph
        return random_graph((50, 80, 30), num_relations=12, num_edges=800, seed=0)


#: the default run's stride through a model's IR configurations (prime, so that no knob's period hides a
#: value: every value of every knob is among them); HGT's training matrix is the big one
IR_STRIDE = {"rgat": 13, "hgt": 59}


@pytest.mark.slow
@pytest.mark.parametrize("model,every", sampled(sorted(MODELS), IR_STRIDE, 1))
def test_every_ir_configuration_compiles(model: str, every: int, graph, ledger: Ledger) -> None:
    """Every ``every``-th IR configuration's training program at the default schedule compiles
    (:data:`IR_STRIDE` in the default run, every one in the exhaustive run)."""
    space = _space(model, graph)
    programs = []
    for cfg in list(space.ir_configs())[::every]:
        point = _valid_point(space, cfg)
        programs.append(generate(point.kernels, point.config))
    assert programs
    problems = ledger.compile(f"{model} ir-configs", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 200 schedules' new units, each for sm_80 and sm_90: over 600 s on a shared 2-core machine
@pytest.mark.parametrize("model,count", sampled(sorted(MODELS), 8, RANDOM_SCHEDULES))
def test_random_training_schedules_compile(model: str, count: int, graph, ledger: Ledger) -> None:
    """``count`` random training schedules compile (the default run: the first 8 of the same draws)."""
    space = _space(model, graph)
    rng = random.Random(f"cuda-train-{model}")
    programs = []
    for _ in range(count):
        cfg = space.sample(rng)
        programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = ledger.compile(f"{model} random", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
def test_odd_sizes_compile(ledger: Ledger) -> None:
    """Guards the default-size sweeps never hit: feature sizes no tile divides, with several heads."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    programs = []
    for model, dims in (("hgt", (20, 12)), ("rgat", (12, 20)), ("rgcn", (20, 12))):
        space = _space(model, g, dims)
        rng = random.Random(model)
        for _ in range(4):
            cfg = space.sample(rng)
            programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = ledger.compile("odd sizes", programs)
    assert not problems, "\n".join(problems[:5])


# ----------------------------------------------------------------------------- knobs
def test_training_knobs_follow_the_forward_knobs_with_their_defaults() -> None:
    knobs = list(CUDA_SCHEDULE.knobs())
    assert knobs[:knobs.index("map.threads") + 1] == [k for k in knobs if k.split(".")[0] in
                                                      ("gemm", "traversal", "map")]
    assert TRAINING_KNOBS == knobs[knobs.index("map.threads") + 1:]
    defaults = {name: p.default for name, p in CUDA_SCHEDULE.knobs().items() if name in TRAINING_KNOBS}
    assert defaults == {"scatter.mapping": "src_parallel", "scatter.threads": 128, "scatter.vector_width": 1,
                        "scatter.coarsening": 1, "weightgrad.reduction": "atomic", "weightgrad.chunk_rows": 512,
                        "weightgrad.tile_m": 32, "weightgrad.tile_n": 64, "weightgrad.tile_r": 16,
                        "weightgrad.threads": 128}
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    inference = SearchSpace(build_model("hgt", 8, 8, 2), g, "cuda")
    assert not {k.name for k in inference.schedule_knobs} & set(TRAINING_KNOBS)
    assert set(TRAINING_KNOBS) <= {k.name for k in _space("hgt", g, (8, 8)).schedule_knobs}


def test_vector_width_is_an_upper_bound() -> None:
    """One knob per template for kernels of several sizes: each traversal and scatter uses the widest vector
    (at most the knob) its size allows; an attention's single-score kernels no longer hold its message rows at
    width 1 (a constraint did: every ``traversal.vector_width`` > 1 was invalid for RGAT and HGT)."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = _space("rgat", g, (12, 12))
    point = space.compile({**space.default(), "compact.src": "pair", "reorder.fold_attention": "on",
                           "scatter.vector_width": 4, "traversal.vector_width": 4})
    assert point.valid, point.problems
    units = generate(point.kernels, point.config).units
    width = lambda u: re.search(r"vector_width=(\d)", u.code).group(1)  # noqa: E731
    assert {u.kernel.message.dim: width(u) for u in units if isinstance(u.kernel, ScatterKernel)} == \
        {12: "4", 6: "2", 1: "1"}
    traversals = {width(u) + ("/" + str(u.kernel.stage.feature_dim())) for u in units
                  if isinstance(u.kernel, TraversalKernel)}
    assert {"4/12", "2/6", "1/1"} <= traversals, traversals  # messages (per head 6), scores
    for model in ("rgat", "hgt"):
        inference = SearchSpace(build_model(model, 12, 12, MODELS[model]), g, "cuda")
        assert inference.compile({**inference.default(), "traversal.vector_width": 4}).valid, model


def test_invalid_training_schedules_are_refused_before_compiling() -> None:
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    kp = _space("hgt", g, (12, 12)).compile({}).kernels
    with pytest.raises(InvalidSchedule, match=r"weight_grad\d+: 128 outputs per thread > 64 \(register pressure\)"):
        generate(kp, {"weightgrad.tile_m": 64, "weightgrad.tile_n": 64, "weightgrad.threads": 32})
    wg = next(k for k in kp.kernels if isinstance(k, WeightGradKernel) and k.x is not None)
    bias = next(k for k in kp.kernels if isinstance(k, WeightGradKernel) and k.x is None)
    tight = {"weightgrad.tile_m": 16, "weightgrad.tile_n": 16, "weightgrad.threads": 256, "weightgrad.tile_r": 32,
             "weightgrad.chunk_rows": 128}
    checks = CUDA_SCHEDULE.of(wg).constraints
    for k, expect in ((wg, None), (bias, None)):
        s = kernel_schedule(k, tight, "cuda")
        assert [c.check(s, k) for c in checks] == [expect]
    # the declared limits: more outputs per thread than registers allow, fewer outputs than threads
    s = {**kernel_schedule(wg, {}, "cuda"), "tile_m": 64, "tile_n": 64, "threads": 32}
    assert "register pressure" in checks[0].check(s, wg)
    s = {**kernel_schedule(wg, {}, "cuda"), "tile_m": 8, "tile_n": 8, "threads": 256}
    assert "fewer outputs" in checks[0].check(s, wg)
    assert checks[0].check(s, bias) is None  # a column sum has no tile


# ----------------------------------------------------------------------------- structure
def _training_kernels(model: str, cfg: dict[str, Any], dims: tuple[int, int] = (64, 64)):
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = _space(model, g, dims)
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    return point.kernels


def _units_of(kp, cfg: dict[str, Any], kind: type) -> list[Any]:
    return [u for u in generate(kp, cfg).units if isinstance(u.kernel, kind)]


def test_scatter_code_follows_its_mapping() -> None:
    kp = _training_kernels("rgat", {"compact.src": "pair", "reorder.fold_attention": "on"})
    kinds = {(u.kernel.rows, u.kernel.out_via) for u in _units_of(kp, {}, ScatterKernel)}
    assert kinds == {("edge", "src_pair"), ("src_pair", "pair_node")}
    for u in _units_of(kp, {}, ScatterKernel):  # src_parallel: a warp per target over host-grouped rows
        assert not re.search(r"\batomic\w*\(", u.code) and "group_perm[i]" in u.code
        assert [a.cname for a in u.launches[0].args if a.kind == "table"] == ["group_perm", "group_off"]
        assert u.launches[0].grid.domain == {"src_pair": "src_pair", "pair_node": "node"}[u.kernel.out_via]
    cfg = {"scatter.mapping": "edge_parallel", "scatter.coarsening": 2}
    for u in _units_of(kp, cfg, ScatterKernel):
        assert "atomicAdd(&out[" in u.code and "group_perm" not in u.code
        assert u.launches[0].grid.domain == u.kernel.rows
    vector, = _units_of(_training_kernels("rgcn", {}), {**cfg, "scatter.vector_width": 4}, ScatterKernel)
    assert "atomicAdd(reinterpret_cast<float4*>" in vector.code  # on sm_90; scalar atomics below it


def test_weight_gradient_code_follows_its_reduction() -> None:
    kp = _training_kernels("hgt", {})
    atomic = _units_of(kp, {}, WeightGradKernel)
    two_pass = _units_of(kp, {"weightgrad.reduction": "two_pass", "weightgrad.tile_m": 64}, WeightGradKernel)
    for a, b in zip(atomic, two_pass):
        assert a.functions == ("weightgrad",) and not a.temps and "atomicAdd(&grad[" in a.code
        assert b.functions == ("weightgrad", "weightgrad_reduce") and [t.name for t in b.temps] == ["partials"]
        assert not re.search(r"\batomic\w*\(", b.code)
        assert [x.cname for x in b.launches[1].args if x.kind == "table"] == ["type_chunk_off"]
    # what only the host reads (the chunk size) and what a column sum ignores (the tile) leave the code alone
    sums = [k for k in kp.kernels if isinstance(k, WeightGradKernel) and k.x is None]
    products = [k for k in kp.kernels if isinstance(k, WeightGradKernel) and k.x is not None]
    for k, cfg in ((sums[0], {"weightgrad.tile_m": 16, "weightgrad.chunk_rows": 2048}),
                   (products[0], {"weightgrad.chunk_rows": 2048})):
        before, after = (next(u for u in generate(kp, c).units if u.kernel is k) for c in ({}, cfg))
        assert before.key == after.key and before.launches[0].grid != after.launches[0].grid
    per_head = next(u for u in atomic if u.kernel.per_head)
    assert per_head.launches[0].grid.col_blocks == 2 * 1 * 1  # 2 heads, one 32x64 tile of each 32x32 slice


def test_sums_over_features_are_warp_reductions_and_vector_loads_stay_outside_them() -> None:
    """A backward traversal's ``sum_dim`` is reduced by the warp like an inner product; a load both inside
    and outside it is vector-loaded outside only (inside, it is read at every feature)."""
    from rgtune.codegen.cuda._expr import Emitter, RowIndex
    from rgtune.codegen.cuda._lanes import chunk
    from rgtune.ir.kernels import BinaryE, Load

    dout = Load(1, 16, "in0", "dst")
    e = BinaryE(1, 16, "mul", dout, ReduceE(1, 1, BinaryE(1, 16, "mul", dout, Load(1, 16, "in1", "row")), "dim"))
    em = Emitter({"in0": (1, 16), "in1": (1, 16)}, {}, RowIndex("edge", 32, "direct"))
    lines, values = chunk(em, [e], 16, 2, _training_kernels("rgcn", {}, (16, 16)), "")
    text = "\n".join(lines)
    assert "const float2 L0 = *reinterpret_cast<const float2*>(&in0[(long)(e_dst[rid]) * 16 + d0]);" in text
    assert "in0[(long)(e_dst[rid]) * 16 + k1]" in text  # inside the sum: indexed by its own variable
    assert values[0][1].startswith("(L0.y * ")
    hgt = _training_kernels("hgt", {}, (16, 16))
    traversal = [u for u in generate(hgt, {}).units if isinstance(u.kernel, TraversalKernel)
                 and any(isinstance(x, ReduceE) for ex in u.kernel.stage.exprs() for x in ex.walk())]
    assert traversal and all("sum_dim" in u.code and "warp reduction" in u.code for u in traversal)


# ----------------------------------------------------------------------------- host tables
def _edge_case_graph():
    """Empty relation, isolated nodes, a hub destination (in-degree 45) and a hub source (out-degree 53)."""
    return random_graph((7, 10, 5), num_relations=5, num_edges=90, seed=1, empty_relations=1, isolated_nodes=1,
                        hub_in_degree=40, src_skew=1.5)


def _one_type_graph():
    return random_graph((16,), num_relations=3, num_edges=70, seed=2, isolated_nodes=1)


@pytest.mark.parametrize("layout", ["csr_dst", "coo_rel_dst", "coo_rel_src"])
def test_scatter_groups_list_every_row_once_under_its_target(layout: str) -> None:
    a = graph_arrays(_edge_case_graph(), layout, 32)
    for rows, via, target, count in (("edge", "src", a.e_src, a.num_nodes), ("edge", "src_pair", a.e_sp,
                                                                            a.rows("src_pair")),
                                     ("src_pair", "pair_node", a.sp_node, a.num_nodes)):
        perm, off = scatter_groups(ScatterKernel("s", out="g", out_via=via, rows=rows), a)
        assert off.numel() == count + 1 and int(off[-1]) == target.numel()
        assert torch.equal(torch.sort(perm).values, torch.arange(target.numel()))
        for v in range(count):
            group = perm[off[v]:off[v + 1]]
            assert bool((target[group].long() == v).all()) and bool((torch.diff(group) > 0).all())
        assert scatter_groups(ScatterKernel("t", out="h", out_via=via, rows=rows), a)[0] is perm  # once per graph


def test_weight_gradient_chunks_cover_every_row_of_each_type_once() -> None:
    from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch
    from rgtune.codegen.cuda.runtime import gemm_segments

    a = graph_arrays(_edge_case_graph(), "coo_rel_src", 64)
    for rows, by, chunk in (("edge", "rel", 8), ("node", "ntype", 3), ("src_pair", "rel", 4), ("edge", "none", 16)):
        k = WeightGradKernel("wg", rows=rows, by=by)
        unit = KernelUnit(k, "", "", (Launch("weightgrad", Grid("chunks", rows, tile_rows=chunk), 32, ()),))
        tables, counts = weightgrad_tables(unit, a)
        row0, end, ctype = (tables[n].long() for n in ("chunk_row0", "chunk_row_end", "chunk_type"))
        off = tables["type_chunk_off"].long()
        assert counts == {"chunks": row0.numel(), "types": off.numel() - 1}
        assert bool(((end - row0) >= 1).all()) and bool(((end - row0) <= chunk).all())
        assert bool((torch.diff(ctype) >= 0).all()) and torch.equal(off[1:] - off[:-1],
                                                                    torch.bincount(ctype, minlength=off.numel() - 1))
        seg_off, seg_type = gemm_segments(k, a)
        covered = torch.cat([torch.arange(int(r), int(e)) for r, e in zip(row0, end)]) if row0.numel() else row0
        assert torch.equal(torch.sort(covered).values, torch.arange(a.rows(rows)))
        counts_of = torch.diff(seg_off)
        assert torch.equal(torch.repeat_interleave(seg_type, counts_of)[covered], torch.repeat_interleave(
            ctype, end - row0))  # each row's chunk has the row's type


# ----------------------------------------------------------------------------- emulated runs
def _needs_cxx() -> None:
    from rgtune.codegen.cuda.emulate import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")


def _inputs(kp, g, din: int, dout_width: int, seed: int = 1):
    params = init_params(kp, g, dtype=torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(g.num_nodes(), din, dtype=torch.float64, generator=gen)
    dout = torch.randn(g.num_nodes(), dout_width, dtype=torch.float64, generator=gen)
    return x, params, dout


def _relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item() if ref.numel() else 0.0


def _compare(result, ref, where: str, tol: float) -> dict[str, float]:
    """Relative errors of a run's output, input gradient and every param gradient; asserts them."""
    out, dx, grads = result
    assert set(grads) == set(ref[2]), where
    tensors = {"output": (out, ref[0]), "input gradient": (dx, ref[1]),
               **{f"grad {k}": (grads[k], ref[2][k]) for k in ref[2]}}
    errs = {}
    for name, (got, expect) in tensors.items():
        assert got.shape == expect.shape, f"{where}: {name} {tuple(got.shape)} != {tuple(expect.shape)}"
        assert not got.isnan().any(), f"{where}: {name} has elements never written (buffers were NaN)"
        errs[name] = _relative(got, expect)
    worst = max(errs, key=errs.__getitem__)
    assert errs[worst] < tol, f"{where}: {worst} relative error {errs[worst]:.2e} >= {tol:.0e}"
    return errs


def emulated_training_step(space: Any, g: Any, cfg: dict[str, Any], dims: tuple[int, int], where: str,
                           arch: str = "sm_90") -> tuple[dict[str, float], float]:
    """``cfg`` (over the space's defaults): its training program on the emulator, forward phase then backward
    phase with buffers poisoned with NaN, against the float64 reference; the relative errors (each asserted
    under the graph's tolerance) and that tolerance."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    x, params, dout = _inputs(kp, g, dims[0], dims[1])
    ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
    program = EmulatedProgram(kp, generate(kp, point.config).units, g, arch)
    tol = tolerance(g)
    return _compare(_phased(program, x, params, dout), ref, where, tol), tol


def _emulate(model: str, g: Any, cfg: dict[str, Any], errors: _Errors, dims: tuple[int, int] = (12, 12),
             arch: str = "sm_90") -> dict[str, float]:
    """``cfg``'s training program on the emulator against the reference; the errors."""
    errs, tol = emulated_training_step(_space(model, g, dims), g, cfg, dims,
                                       f"{model} heads={MODELS[model]} dims={dims} on {g.name} with {cfg}", arch)
    errors.add(model, errs, tol)
    return errs


def _phased(program: Any, x: torch.Tensor, params: dict[str, torch.Tensor], dout: torch.Tensor,
            fill: float = float("nan")) -> tuple[Any, ...]:
    """A training step as a layer runs it: the forward phase, then the backward phase on what it saved."""
    out, saved = program.run_forward(x, params, fill=fill)
    dx, grads = program.run_backward(x, params, saved, dout, fill=fill)
    return out, dx, grads


def _covered(space: SearchSpace) -> list[str]:
    """The knobs of :data:`COVERED_KNOBS` this space has."""
    have = {k.name for k in space.knobs}
    return [name for name in COVERED_KNOBS if name in have]


def _covering_schedules(space: SearchSpace, rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` random valid schedules, then more (copies of them with one knob changed) until every value of
    every scatter and weight-gradient knob that the program allows is taken by one."""
    cfgs = [space.sample(rng) for _ in range(n)]
    for name in _covered(space):
        for value in space.knob(name).choices:
            if any(c[name] == value for c in cfgs):
                continue
            for base in rng.sample(cfgs, len(cfgs)):
                if space.compile({**base, name: value}).valid:
                    cfgs.append({**base, name: value})
                    break
    return cfgs


def test_emulated_training_step_at_the_default_schedule(errors: _Errors) -> None:
    _needs_cxx()
    g = _edge_case_graph()
    for model in MODELS:
        _emulate(model, g, {}, errors)


@pytest.mark.parametrize("model,cfg,graph_kind,dims", [
    ("rgcn", {"scatter.mapping": "edge_parallel", "weightgrad.reduction": "two_pass"}, "one type", (20, 12)),
    ("rgat", {"compact.src": "pair", "scatter.vector_width": 2, "weightgrad.tile_m": 16, "weightgrad.tile_n": 16,
              "weightgrad.threads": 64}, "one type", (12, 20)),
    ("hgt", {"reorder.compose": "on", "compact.dst": "pair", "weightgrad.reduction": "two_pass",
             "weightgrad.chunk_rows": 128, "scatter.coarsening": 4, "scatter.threads": 32}, "edge cases", (16, 16)),
    # the messages' traversals 4 wide beside the scores' 1, the fused softmax backward included
    ("rgat", {"traversal.vector_width": 4, "autodiff.reuse": "fuse"}, "edge cases", (16, 16)),
    ("hgt", {"traversal.vector_width": 4, "traversal.mapping": "edge_parallel", "autodiff.reuse": "fuse"},
     "edge cases", (16, 16)),
])
def test_emulated_training_step_on_edge_cases(model: str, cfg: dict[str, Any], graph_kind: str,
                                              dims: tuple[int, int], errors: _Errors) -> None:
    _needs_cxx()
    g = _one_type_graph() if graph_kind == "one type" else _edge_case_graph()
    _emulate(model, g, cfg, errors, dims)


def test_emulated_learnable_gradients_through_the_folds(errors: _Errors) -> None:
    """What the tuner times (``train_step``): derived weights' gradients sent back through their folds."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    _needs_cxx()
    g = _edge_case_graph()
    space = _space("hgt", g, (8, 8))
    point = space.compile({**space.default(), "reorder.compose": "on", "reorder.attention_side": "dst"})
    kp = point.kernels
    x, params, dout = _inputs(kp, g, 8, 8)
    program = EmulatedProgram(kp, generate(kp, point.config).units, g)
    built = BuiltProgram("cuda-emulated", {}, 0.0, True, program.run, train_fn=program.run_training)
    out, dx, grads = train_step(built, kp, g, x, params, dout)
    r_out, r_dx, r_grads = ReferenceExecutor(kp, g).run_training(x, params, dout)
    expected = learnable_grads(kp, g, params, r_grads)
    assert any(name not in params for name in r_grads) and set(grads) == set(expected) == set(params)
    _compare((out, dx, grads), (r_out, r_dx, expected), "hgt compose", REL_TOL)
    # and the forward alone, from the same program: run() of a training program runs its forward kernels
    assert _relative(program.run(x, params), r_out) < REL_TOL


def test_a_forward_program_has_no_training_step() -> None:
    from rgtune.codegen.cuda.emulate import EmulatedProgram
    from rgtune.ir.pipeline import compile_program

    _needs_cxx()
    g = _one_type_graph()
    kp = compile_program(build_model("rgcn", 8, 8)).kernels
    program = EmulatedProgram(kp, generate(kp, {}).units, g)
    with pytest.raises(BackendError, match="computes no gradients"):
        program.run_training(torch.zeros(16, 8), init_params(kp, g), torch.zeros(16, 8))


@pytest.mark.parametrize("save", ["all", "nodes", "input"])
@pytest.mark.parametrize("model,cfg", [("rgcn", {}), ("rgat", {"compact.src": "pair"}),
                                       ("hgt", {"reorder.compose": "on"})])
def test_emulated_phases_hold_their_saved_values_apart(model: str, cfg: dict[str, Any], save: str,
                                                       errors: _Errors) -> None:
    """Two forwards, then their backwards in reverse order (as two layers of a model, or two micro-batches):
    each backward reads its own forward's saved values, whatever ``autodiff.save`` saves; the whole step
    (``run_training``, one pass) and the built program's ``run_training`` (the phases) agree."""
    from rgtune.codegen.cuda.backend import built_program
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    _needs_cxx()
    g = _edge_case_graph()
    space = _space(model, g, (12, 12))
    point = space.compile({**space.default(), **cfg, "autodiff.save": save})
    assert point.valid, point.problems
    kp = point.kernels
    ref = ReferenceExecutor(kp, g)
    program = EmulatedProgram(kp, generate(kp, point.config).units, g)
    cases = [_inputs(kp, g, 12, 12, seed) for seed in (1, 5)]
    forwards = [program.run_forward(x, params, fill=float("nan")) for x, params, _ in cases]
    for saved_values in (f[1] for f in forwards):
        assert set(saved_values.buffers) == set(kp.saved) and set(saved_values.params) == set(kp.saved_params)
    tol = tolerance(g)
    for (x, params, dout), (out, saved) in reversed(list(zip(cases, forwards))):
        before = {b: t.clone() for b, t in saved.buffers.items()}
        dx, grads = program.run_backward(x, params, saved, dout, fill=float("nan"))
        where = f"{model} {cfg} save={save}"
        errors.add(model, _compare((out, dx, grads), ref.run_training(x, params, dout), where, tol), tol)
        assert all(torch.equal(before[b], saved.buffers[b]) for b in before), f"{where}: the backward wrote a saved value"
    x, params, dout = cases[0]
    step = program.run_training(x, params, dout, fill=float("nan"))
    built = built_program("cuda-emulated", kp, program, {}, 0.0, True)
    assert built.phased
    for result in (step, built.run_training(x, params, dout)):
        _compare(result, ref.run_training(x, params, dout), f"{model} {cfg} save={save} (one step)", tol)


def test_emulated_forward_program_runs_as_before() -> None:
    """A forward program has no phases: ``run`` is its whole program (and the training entry points refuse)."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram
    from rgtune.ir.pipeline import compile_program

    _needs_cxx()
    g = _one_type_graph()
    kp = compile_program(build_model("rgat", 8, 8, 2)).kernels
    program = EmulatedProgram(kp, generate(kp, {}).units, g)
    x, params = torch.randn(16, 8, dtype=torch.float64), init_params(kp, g, dtype=torch.float64)
    assert _relative(program.run(x, params, fill=float("nan")), ReferenceExecutor(kp, g).run(x, params)) < REL_TOL
    with pytest.raises(BackendError, match="computes no gradients"):
        program.run_forward(x, params)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # hgt has 960 forward IR configurations: about 0.4 s each on the emulator, more when cold
@pytest.mark.parametrize("model,every", sampled(sorted(MODELS), {"hgt": 73, "rgat": 53}, 1))
def test_every_ir_configuration_on_the_emulator(model: str, every: int, errors: _Errors) -> None:
    """Every ``every``-th IR configuration's training program at the default schedule, on the edge-case
    graph: combinations of the forward's IR knobs, each with one ``autodiff.save`` in turn (all three
    tripled the run; each value meets every other knob's values, and the phase tests take each on every
    model). The default run takes every 13th of RGAT's and every 19th of HGT's; the exhaustive run all."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    _needs_cxx()
    g = _edge_case_graph()
    space = _space(model, g, (12, 12))
    tol = tolerance(g)
    count = 0
    for cfg in _save_in_turn(space)[::every]:
        point = _valid_point(space, cfg)
        kp = point.kernels
        x, params, dout = _inputs(kp, g, 12, 12)
        ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
        result = _phased(EmulatedProgram(kp, generate(kp, point.config).units, g), x, params, dout)
        errors.add(model, _compare(result, ref, f"{model} with {point.config}", tol), tol)
        count += 1
    adjoint_knobs = [k for k in space.ir_knobs if k.name.startswith("autodiff.")]
    forward_configs = len(list(space.ir_configs())) // math.prod(len(k.choices) for k in adjoint_knobs)
    assert count == len(range(0, forward_configs, every))


def _save_in_turn(space: SearchSpace) -> list[dict[str, Any]]:
    """Every IR configuration of the forward's knobs, each with one combination of the adjoint's knobs
    (``autodiff.save``, and ``autodiff.reuse`` where the model has it) in turn: the n-th configuration takes
    the n-th combination, cyclically, so consecutive ones cover every combination."""
    adjoint = [k for k in space.ir_knobs if k.name.startswith("autodiff.")]
    combos = list(itertools.product(*(k.choices for k in adjoint)))
    forward: dict[tuple[Any, ...], dict[str, Any]] = {}
    for cfg in space.ir_configs():
        forward.setdefault(tuple(sorted((k, v) for k, v in cfg.items() if not k.startswith("autodiff."))), cfg)
    return [{**cfg, **dict(zip((k.name for k in adjoint), combos[i % len(combos)]))}
            for i, cfg in enumerate(forward.values())]


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_random_training_schedules_on_the_emulator(model: str, errors: _Errors) -> None:
    """Random schedules, and copies of them that take every value of every scatter and weight-gradient knob:
    sizes a float4 divides (16 features, 8 per head) on the edge-case graph, on sm_80 and sm_90."""
    _needs_cxx()
    g = _edge_case_graph()
    space = _space(model, g, (16, 16))
    cfgs = _covering_schedules(space, random.Random(f"emulated-{model}"), EMULATED_RANDOM)
    for name in _covered(space):  # every value a model's kernels allow (a bias-free rgcn's too)
        taken = {c[name] for c in cfgs}
        assert taken == set(space.knob(name).choices), (name, taken)
    for i, cfg in enumerate(cfgs):
        _emulate(model, g, cfg, errors, (16, 16), arch=("sm_80", "sm_90")[i % 2])


# ----------------------------------------------------------------------------- on a GPU
_GPU_OK, _GPU_WHY = CudaBackend.available()
needs_gpu = pytest.mark.skipif(not _GPU_OK, reason=f"needs a CUDA GPU with CuPy: {_GPU_WHY}")

#: IR knobs + schedules that together take both scatter mappings, both reductions and the vector widths
GPU_CONFIGS: dict[str, list[dict[str, Any]]] = {
    "rgcn": [{}, {"scatter.mapping": "edge_parallel", "scatter.vector_width": 4, "weightgrad.reduction": "two_pass",
                  "compact.src": "pair", "layout.edges": "coo_rel_src", "traversal.mapping": "edge_parallel"},
             {"reorder.aggregate_first": "on", "weightgrad.tile_m": 64, "weightgrad.chunk_rows": 2048,
              "scatter.coarsening": 4}],
    "rgat": [{}, {"compact.src": "pair", "compact.dst": "pair", "scatter.vector_width": 2,
                  "weightgrad.reduction": "two_pass", "weightgrad.chunk_rows": 128},
             {"fusion.softmax": "full", "scatter.mapping": "edge_parallel", "weightgrad.threads": 256,
              "weightgrad.tile_r": 32, "autodiff.reuse": "fuse"}],
    "hgt": [{}, {"reorder.compose": "on", "weightgrad.reduction": "two_pass", "scatter.mapping": "edge_parallel",
                 "scatter.vector_width": 4, "autodiff.reuse": "fuse"},
            {"compact.src": "pair", "reorder.attention_side": "dst", "compact.dst": "pair",
             "weightgrad.tile_m": 16, "weightgrad.tile_n": 32, "weightgrad.threads": 64, "scatter.threads": 256}],
}


def _gpu_graphs() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("aifb", "mutag"):
        try:
            from rgtune.data import load_dataset

            out[name] = load_dataset(name)
        except Exception as e:  # noqa: BLE001 - recorded as a skip
            out[name] = e
    out["edge_cases"] = random_graph((60, 90, 50), num_relations=7, num_edges=900, seed=1, empty_relations=2,
                                     isolated_nodes=3, hub_in_degree=300, degree_skew=1.0, src_skew=1.5)
    out["one_type"] = random_graph((200,), num_relations=4, num_edges=1500, seed=3, isolated_nodes=2)
    return out


@pytest.fixture(scope="module")
def gpu_graphs() -> dict[str, Any]:
    return _gpu_graphs()


def _gpu_graph(graphs: dict[str, Any], name: str) -> Any:
    g = graphs[name]
    if isinstance(g, Exception):
        pytest.skip(f"dataset {name} not available: {str(g).splitlines()[0]}")
    return g


def _gpu_check(g: Any, model: str, cfg: dict[str, Any], errors: _Errors, dims: tuple[int, int] = (64, 64)):
    """``cfg``'s training step on the GPU (its two phases launch by launch, NaN-poisoned buffers) against the
    reference."""
    from rgtune.codegen.cuda.runtime import program_of

    space = _space(model, g, dims)
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    x, params, dout = _inputs(kp, g, dims[0], dims[1])
    ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
    built = CudaBackend().build(kp, g, point.config)
    assert built.phased and CudaBackend.training == "phases"
    program = program_of(built)
    dev = {k: v.float().cuda() for k, v in params.items()}
    result = _phased(program, x.float().cuda(), dev, dout.float().cuda())
    program.synchronize()
    tol = tolerance(g)
    errors.add(model, _compare(result, ref, f"{model} on {getattr(g, 'name', '?')} with {cfg}", tol), tol)
    return built, kp, x, params, dout, ref


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("graph_name", ["aifb", "mutag", "edge_cases", "one_type"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_gpu_training_step_matches_the_reference(gpu_graphs, model: str, graph_name: str, errors: _Errors) -> None:
    g = _gpu_graph(gpu_graphs, graph_name)
    for cfg in GPU_CONFIGS[model]:
        _gpu_check(g, model, cfg, errors)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", sorted(MODELS))
def test_gpu_random_training_schedules(gpu_graphs, model: str, errors: _Errors) -> None:
    g = gpu_graphs["aifb"] if not isinstance(gpu_graphs["aifb"], Exception) else gpu_graphs["edge_cases"]
    space = _space(model, g)
    for cfg in _covering_schedules(space, random.Random(f"gpu-train-{model}"), 2):
        _gpu_check(g, model, cfg, errors)


@pytest.mark.gpu
@needs_gpu
def test_gpu_recorded_training_step_computes_what_the_launches_compute(gpu_graphs) -> None:
    """A training step replayed from its CUDA graph against launches: new inputs and output gradients each
    step, params changed in place, new param tensors; the forward's own recording next to it."""
    from rgtune.codegen.cuda.runtime import program_of

    g = gpu_graphs["edge_cases"]
    for model, cfg in (("hgt", {"reorder.compose": "on"}), ("rgat", {"weightgrad.reduction": "two_pass"}),
                       ("rgcn", {"scatter.mapping": "edge_parallel"})):
        space = _space(model, g, (32, 32))
        point = space.compile({**space.default(), **cfg})
        program = program_of(CudaBackend().build(point.kernels, g, point.config))
        params = {k: v.cuda() for k, v in init_params(point.kernels, g, seed=3).items()}
        kept = []
        for step in range(3):
            if step == 1:
                for t in params.values():
                    t.mul_(1.5)
            if step == 2:
                params = {k: v * 0.5 for k, v in params.items()}
            x, dout = torch.randn(g.num_nodes(), 32, device="cuda"), torch.randn(g.num_nodes(), 32, device="cuda")
            replayed = program.run_training(x, params, dout)
            launched = program.run_training(x, params, dout, fill=float("nan"))
            forward = program.run(x, params)  # the forward's recording, beside the training step's
            program.synchronize()
            assert program.graph_failure is None and program._captured_training is not None, program.graph_failure
            assert _relative(forward, launched[0].double().cpu()) < 1e-5
            kept.append((replayed, launched))
        for replayed, launched in kept:  # a later replay leaves what an earlier one returned alone
            for a, b in [(replayed[0], launched[0]), (replayed[1], launched[1]),
                         *((replayed[2][k], launched[2][k]) for k in launched[2])]:
                assert _relative(a, b.double().cpu()) < 1e-5, model


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("save", ["all", "nodes", "input"])
def test_gpu_recorded_phases_hold_their_saved_values_apart(gpu_graphs, save: str) -> None:
    """Two forwards replayed from the forward phase's CUDA graph, then their backwards in reverse order
    replayed from the backward's: each against its launched twin and the reference; the saved values are
    the caller's (a later replay leaves them alone)."""
    from rgtune.codegen.cuda.runtime import program_of

    g = gpu_graphs["edge_cases"]
    for model, cfg in (("hgt", {"reorder.compose": "on"}), ("rgat", {"weightgrad.reduction": "two_pass"}),
                       ("rgcn", {"scatter.mapping": "edge_parallel"})):
        space = _space(model, g, (32, 32))
        point = space.compile({**space.default(), **cfg, "autodiff.save": save})
        kp = point.kernels
        built = CudaBackend().build(kp, g, point.config)
        program = program_of(built)
        params = init_params(kp, g, dtype=torch.float64, seed=3)
        dev = {k: v.float().cuda() for k, v in params.items()}
        cases = [(torch.randn(g.num_nodes(), 32, dtype=torch.float64),
                  torch.randn(g.num_nodes(), 32, dtype=torch.float64)) for _ in range(2)]
        forwards = [built.run_forward(x.float().cuda(), dev) for x, _ in cases]
        kept = [{b: t.clone() for b, t in saved.buffers.items()} for _, saved in forwards]
        for (x, dout), (out, saved), before in reversed(list(zip(cases, forwards, kept))):
            dx, grads = built.run_backward(x.float().cuda(), dev, saved, dout.float().cuda())
            launched = _phased(program, x.float().cuda(), dev, dout.float().cuda())
            program.synchronize()
            assert program.graph_failure is None and program._captured_backward is not None, program.graph_failure
            ref = ReferenceExecutor(kp, g).run_training(x, params, dout)
            _compare((out, dx, grads), ref, f"{model} {cfg} save={save} (replayed)", tolerance(g))
            for a, b in [(out, launched[0]), (dx, launched[1]), *((grads[k], launched[2][k]) for k in grads)]:
                assert _relative(a, b.double().cpu()) < 1e-5, model
            assert all(torch.equal(before[b], saved.buffers[b]) for b in before), model


@pytest.mark.gpu
@needs_gpu
def test_gpu_training_step_timing(gpu_graphs, request: pytest.FixtureRequest) -> None:
    """``run_training`` (both phases, replayed graphs) and the backward phase timed with CUDA events next to
    the training program's forward alone, per model, on
    AIFB at 64 -> 64, for the default schedule and its deterministic variants; printed at the end."""
    from rgtune.codegen.cuda.runtime import time_cuda

    g = gpu_graphs["aifb"] if not isinstance(gpu_graphs["aifb"], Exception) else gpu_graphs["edge_cases"]
    lines = [f"CUDA training step on {g.name} (64 -> 64), median ms by CUDA events ({torch.cuda.get_device_name()})"]
    for model in sorted(MODELS):
        for cfg in ({}, {"weightgrad.reduction": "two_pass"}, {"scatter.mapping": "edge_parallel"}):
            space = _space(model, g)
            point = space.compile({**space.default(), **cfg})
            built = CudaBackend().build(point.kernels, g, point.config)
            params = {k: v.cuda() for k, v in init_params(point.kernels, g).items()}
            x, dout = torch.randn(g.num_nodes(), 64, device="cuda"), torch.randn(g.num_nodes(), 64, device="cuda")
            step = time_cuda(lambda: built.run_training(x, params, dout), warmup=3, repeat=20)
            forward = time_cuda(lambda: built.run(x, params), warmup=3, repeat=20)
            _, saved = built.run_forward(x, params)
            backward = time_cuda(lambda: built.run_backward(x, params, saved, dout), warmup=3, repeat=20)
            assert 0 < step["min_ms"] <= step["median_ms"] and forward["median_ms"] > 0
            lines.append(f"  {model:5s} {str(cfg):45s} step {step['median_ms']:.3f} ms (backward phase "
                         f"{backward['median_ms']:.3f} ms), inference forward {forward['median_ms']:.3f} ms")
    print_at_end(request, lines)
