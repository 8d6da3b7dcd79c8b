"""Attention normalized per (destination, relation): ``edge_softmax(s, per_relation=True)`` (``group="dst_rel"``)
and ``rgat(softmax="relation")``, through every layer that handles an edge softmax.

* The IR: the option, its errors, the text (the default program is unchanged), what the group means.
* Float64 against DGL: the interpreter on the relation program equals ``HeteroGraphConv`` of ``GATConv`` s
  (:func:`rgtune.torch_layers.dgl.to_dgl_rgat`) on AIFB and MUTAG (64 -> 64, one head; 16 -> 16, four heads) and on
  a random graph with the edge cases (an empty relation, isolated nodes, a node type that is never a
  destination, destinations reached by several relations, a (destination, relation) group of over 32
  edges), relative error < 1e-10; the destination softmax does not (the check can fail).
* Every IR configuration (forward) after the passes and lowered (the reference executor) equals the
  interpreter of the unoptimized program, for the relation RGAT and for a per-relation attention whose
  messages ``reorder.aggregate_first`` sums per destination pair (the fused softmax into pair rows).
* Training: every distinct program after the passes, its adjoint for each ``autodiff.save``, against
  torch's autograd of the forward (:mod:`test_autodiff`'s check); training IR configurations
  (``autodiff.save`` and ``autodiff.reuse`` included; every 7th, all in the exhaustive run) lowered and run
  by the reference executor.
* The CPU backend (float32 against the float64 reference, :mod:`test_cpu_training`'s helpers): 10 IR
  configurations and 8 random training schedules on the edge-case graph (the first 4 on AIFB too); the fused forms (a
  forward's: a training program's backward reads the softmax, so it is never fused there).
* CUDA: every 23rd IR configuration's training program at the default schedule (all in the exhaustive run)
  and 8 random schedules compile
  with NVRTC within ptxas' launch limits (:mod:`_nvrtc_ledger`) for sm_90, and for sm_80 where
  the code differs by architecture (both for every unit in the exhaustive run); training steps and fused
  forwards of every softmax form run on the emulator against the reference.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from rgtune.codegen.cpu import CpuBackend
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.data import load_dataset
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.counts import count
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.kernels import EdgeSoftmaxStage, SoftmaxAggregate, TraversalKernel
from rgtune.ir.models import rgat
from rgtune.ir.pipeline import compile_program
from rgtune.ir.program import EDGE, EdgeSoftmax, IRError, Program, ProgramBuilder, Value
from rgtune.search_spaces import SearchSpace
from test_autodiff import _check as check_adjoint
from test_autodiff import _distinct, _lowered_equals_interpreter
from test_cpu_training import Workload, program_workload, rel_error, runnable, verify
from _nvrtc_ledger import ledger  # noqa: F401  (the module's NVRTC compile ledger, a fixture)

TOL = 1e-10


def relation_rgat(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    return rgat(in_dim, out_dim, heads, softmax="relation")


def attention_then_pairs(in_dim: int, out_dim: int, heads: int = 2) -> Program:
    """``h_i = sum_r sum_{j in N_r(i)} softmax_{N_r(i)}(<q_i, q_j>) x_j W_r`` with ``q = x W_q`` per head: the
    message is a per-relation linear of the source that nothing else reads, so ``reorder.aggregate_first``
    sums the softmax-weighted inputs per destination pair before it, and the fused softmax then adds into
    destination-pair rows (RGAT's messages feed its scores too: there it never applies)."""
    p = ProgramBuilder("attention_then_pairs", in_dim, heads)
    d = out_dim // heads
    q = p.linear(p.x, "q", out=(heads, d))
    score = p.inner(p.dst(q), p.src(q))
    message = p.typed_linear(p.src(p.x), "weight", out=(heads, d), by="rel")
    return p.finish(p.aggregate(p.mul(p.edge_softmax(score, per_relation=True), message)))


# ------------------------------------------------------------------ graphs


def edge_case_graph() -> HeteroGraph:
    """An empty relation, isolated nodes, a node type that is never a destination, destinations of several
    relations, and a hub whose group of one relation has over 32 in-edges (more than a warp's lanes)."""
    g = random_graph((40, 30, 20), num_relations=6, num_edges=600, empty_relations=1, isolated_nodes=2,
                     source_only_ntypes=1, hub_in_degree=60, degree_skew=1.0, src_skew=1.0, seed=5,
                     name="rel_softmax_edges")
    pairs = g.unique_pairs("dst")
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0
    assert g.stats.isolated_nodes > 0
    assert any(all(c[2] != t for c in g.canonical_etypes) for t in g.ntypes)
    assert int(torch.bincount(pairs.node, minlength=g.num_nodes()).max()) >= 3
    assert int(pairs.pair_count.max()) > 32
    return g


@pytest.fixture(scope="module")
def edges() -> HeteroGraph:
    return edge_case_graph()


@pytest.fixture(scope="module")
def aifb() -> HeteroGraph:
    return load_dataset("aifb")


@pytest.fixture(scope="module")
def mutag() -> HeteroGraph:
    return load_dataset("mutag")


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# ------------------------------------------------------------------ the IR


def test_the_destination_softmax_is_the_program_it_was() -> None:
    default = rgat(8, 8, 2)
    assert str(default) == str(rgat(8, 8, 2, softmax="destination"))
    assert "edge_softmax(%9) : edge[2x1]" in str(default) and "group" not in str(default)
    assert "edge_softmax(%9, group=dst_rel) : edge[2x1]" in str(relation_rgat(8, 8, 2))
    assert [op.group for op in relation_rgat(8, 8, 2).ops if isinstance(op, EdgeSoftmax)] == ["dst_rel"]


def test_bad_options_name_the_valid_ones() -> None:
    with pytest.raises(IRError, match=r"rgat: unknown softmax 'per_edge'; choose one of \['destination', 'relation'\]"):
        rgat(8, 8, 2, softmax="per_edge")
    s = Value("%0", EDGE, 1, 1)
    with pytest.raises(IRError, match=r"unknown group 'src'; choose one of \['dst', 'dst_rel'\]"):
        EdgeSoftmax(Value("%1", EDGE, 1, 1), s, "src")  # type: ignore[arg-type]


def test_a_relation_softmax_sums_to_one_per_destination_and_relation(edges: HeteroGraph) -> None:
    """What the group means: over each (destination, relation), the attention sums to 1."""
    b = ProgramBuilder("alpha", 3, 2)
    s = b.inner(b.src(b.typed_linear(b.x, "w", out=(2, 3), by="none")), b.dst(b.x))
    alpha = b.edge_softmax(s, per_relation=True)
    program = b.finish(b.aggregate(alpha))  # per destination: the number of relations reaching it, per head
    params = random_params(program, edges)
    out = Interpreter(program, edges).run(torch.randn(edges.num_nodes(), 3, dtype=torch.float64), params).output
    relations = torch.bincount(edges.unique_pairs("dst").node, minlength=edges.num_nodes()).double()
    assert torch.allclose(out, relations[:, None].expand(-1, 2), atol=1e-12)


# ------------------------------------------------------------------ float64 against DGL


def _against_dgl(graph: HeteroGraph, in_dim: int, out_dim: int, heads: int, softmax: str = "relation") -> float:
    from rgtune.torch_layers.dgl import to_dgl_rgat

    program = rgat(in_dim, out_dim, heads, softmax=softmax)
    state = random_params(program, graph, seed=3)
    x = torch.randn(graph.num_nodes(), in_dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ours = Interpreter(program, graph).run(x, state).output
    with torch.no_grad():
        theirs = to_dgl_rgat(graph, state, in_dim, out_dim, heads)(x)
    assert theirs.dtype == torch.float64 and theirs.shape == ours.shape
    return _rel_error(ours, theirs)


@pytest.mark.dgl
def test_the_relation_softmax_is_dgls_rgat_on_the_edge_cases(edges: HeteroGraph) -> None:
    pytest.importorskip("dgl")
    for in_dim, out_dim, heads in ((8, 8, 1), (6, 12, 3)):
        assert _against_dgl(edges, in_dim, out_dim, heads) < TOL
    assert _against_dgl(edges, 8, 8, 1, softmax="destination") > 1e-3  # the other softmax is not DGL's


@pytest.mark.dgl
@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["aifb", "mutag"])
@pytest.mark.parametrize("in_dim,out_dim,heads", [(64, 64, 1), (16, 16, 4)])
def test_the_relation_softmax_is_dgls_rgat_on_real_graphs(dataset: str, in_dim: int, out_dim: int, heads: int,
                                                          request: pytest.FixtureRequest) -> None:
    pytest.importorskip("dgl")
    assert _against_dgl(request.getfixturevalue(dataset), in_dim, out_dim, heads) < TOL


def test_the_dgl_fixture_refuses_a_state_of_other_sizes(edges: HeteroGraph) -> None:
    pytest.importorskip("dgl")
    from rgtune.torch_layers.dgl import to_dgl_rgat

    state = random_params(relation_rgat(8, 8, 2), edges)
    with pytest.raises(ValueError, match=r"state\['attn_src'\] has shape \(6, 2, 4\); expected \(6, 1, 8\)"):
        to_dgl_rgat(edges, state, 8, 8, 1)
    with pytest.raises(ValueError, match="out_dim=8 is not divisible by heads=3"):
        to_dgl_rgat(edges, state, 8, 8, 3)


# ------------------------------------------------------------------ every IR configuration, forward


@pytest.mark.parametrize("build,dims", [(relation_rgat, (6, 8, 2)), (attention_then_pairs, (5, 6, 2))])
def test_every_ir_configuration_computes_the_unoptimized_program(build: Any, dims: tuple[int, int, int],
                                                                 edges: HeteroGraph) -> None:
    """Each configuration after the passes (interpreter) and lowered (reference executor) against the
    interpreter of the program before them; the fused forms' stages keep the group."""
    before = build(*dims)
    params = random_params(before, edges, seed=1)
    x = torch.randn(edges.num_nodes(), dims[0], generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = Interpreter(before, edges).run(x, params).output
    space = SearchSpace(before, edges, "cpu")
    seen, interpreted, stages = set(), set(), set()
    for cfg in space.ir_configs():
        compiled = compile_program(before, cfg, edges, strict=False)
        after, kp = compiled.program, compiled.kernels
        if kp.describe() in seen:  # the same kernels (and so the same program after the passes)
            continue
        seen.add(kp.describe())
        assert _rel_error(ReferenceExecutor(kp, edges).run(x, params), expected) < TOL, cfg
        key = (tuple(map(str, after.ops)), compiled.plan.layout)  # what the interpreter reads
        if key not in interpreted:
            interpreted.add(key)
            assert _rel_error(Interpreter(after, edges, compiled.plan.layout).run(x, params).output, expected) < TOL, cfg
        for k in kp.kernels:
            if isinstance(k, TraversalKernel) and isinstance(k.stage, (EdgeSoftmaxStage, SoftmaxAggregate)):
                assert k.stage.group == "dst_rel" and "softmax_dst_rel(" in k.describe()
                stages.add((type(k.stage).__name__, getattr(k.stage, "out_via", None)))
    expected_stages = {("EdgeSoftmaxStage", None), ("SoftmaxAggregate", "dst")}
    if build is attention_then_pairs:
        expected_stages.add(("SoftmaxAggregate", "dst_pair"))
    assert stages == expected_stages
    assert len(seen) > 40


# ------------------------------------------------------------------ training


@pytest.mark.parametrize("heads,every", [(2, 1), (1, 4)])
def test_every_program_after_the_passes_has_the_gradients_of_autograd(heads: int, every: int,
                                                                      edges: HeteroGraph) -> None:
    """The interpreter's adjoint, for each ``autodiff.save``, against autograd of the unoptimized forward:
    every distinct program after the passes (every 4th with one head)."""
    before = relation_rgat(6, 4 * heads, heads)
    for after, layout in _distinct(before, edges)[::every]:
        check_adjoint(before, after, edges, layout)


@pytest.mark.slow
@pytest.mark.parametrize("build,dims,every", [
    (relation_rgat, (6, 8, 2), 17), (attention_then_pairs, (5, 6, 2), 17),
    pytest.param(relation_rgat, (6, 8, 2), 1, marks=pytest.mark.exhaustive),
    pytest.param(attention_then_pairs, (5, 6, 2), 1, marks=pytest.mark.exhaustive)])
def test_every_lowered_training_configuration_computes_the_gradients(build: Any, dims: tuple[int, int, int],
                                                                     every: int, edges: HeteroGraph) -> None:
    """Every ``every``-th training IR configuration (``autodiff.save`` and ``autodiff.reuse`` included: every
    value of every IR knob among them) lowered, run by the reference executor in float64: output, input
    gradient, every param's gradient (derived weights' through their folds) against the interpreter's
    adjoint of the unoptimized program (itself checked against autograd above). The exhaustive run takes
    all of them (2,520 for the RGAT; a stride of 17 takes every value of every knob, 15 and 18 do not)."""
    before = build(*dims)
    space = SearchSpace(before, edges, "cpu", mode="training")
    configs = list(space.ir_configs())[::every]
    for knob in space.ir_knobs:
        assert {c[knob.name] for c in configs} == set(knob.choices), knob.name
    assert {"autodiff.save", "autodiff.reuse"} <= {k.name for k in space.ir_knobs}
    assert _lowered_equals_interpreter(before, edges, configs) >= len(configs) // 3


def test_the_softmax_backward_sums_over_the_same_group() -> None:
    """``a * (g - expand(aggregate(a * g, to=dst_pair)))``: the backward's sum runs per destination pair."""
    from rgtune.ir.autodiff import adjoint

    text = str(adjoint(relation_rgat(8, 8, 2)))
    assert "aggregate(%g" in text and "to=dst_pair" in text and "expand(%g" in text
    destination = str(adjoint(rgat(8, 8, 2)))
    assert "dst_pair" not in destination and "expand(" not in destination


# ------------------------------------------------------------------ counts


def test_counts_see_how_a_kernel_finds_each_edges_group(edges: HeteroGraph) -> None:
    """Edge-parallel, an edge's group is its destination pair: with ``compact.pair_index=bsearch`` that is a
    binary search per edge, which the destination softmax does not do."""
    probes = {}
    for softmax in ("destination", "relation"):
        kp = compile_program(rgat(8, 8, 2, softmax=softmax), {"compact.src": "pair", "compact.pair_index": "bsearch",
                                                              "layout.edges": "coo_rel_src"}, edges).kernels
        softmax_kernel = [k for k in kp.kernels if isinstance(k, TraversalKernel) and
                          isinstance(k.stage, EdgeSoftmaxStage)]
        kp.kernels = softmax_kernel
        probes[softmax] = count(kp, edges, {"traversal.mapping": "edge_parallel"})["index_probes"]
    assert probes["destination"] == 0 and probes["relation"] > 0


# ------------------------------------------------------------------ generated code


def _sources(backend: str, program: Program, cfg: dict[str, Any], graph: HeteroGraph,
             mode: str = "training") -> dict[str, str]:
    space = SearchSpace(program, graph, backend, mode=mode)
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    if backend == "cpu":
        return CpuBackend().generate(point.kernels, point.config).sources
    from rgtune.codegen.cuda.generate import generate

    return {u.name: u.code for u in generate(point.kernels, point.config).units}


def test_the_generated_code_follows_the_group(edges: HeteroGraph) -> None:
    """Destination-parallel: one softmax per run of a relation's in-edges; edge-parallel: scratch per pair."""
    program = relation_rgat(8, 8, 2)
    cpu = _sources("cpu", program, {}, edges)["softmax1.c"]
    assert "while (g1 < e1 && e_rel[g1] == e_rel[g0]) ++g1;" in cpu and "e0; e < e1" not in cpu
    cpu = _sources("cpu", program, {"traversal.mapping": "edge_parallel"}, edges)["softmax1.c"]
    assert "i < num_dst_pairs * 2" in cpu and "const int64_t t = i_dp * 2;" in cpu and "e_dst" not in cpu
    fused = _sources("cpu", program, {"fusion.softmax": "full"}, edges, "inference")["aggregate1.c"]
    assert "softmax_dst_rel(" in fused and "for (int64_t e = g0; e < g1; ++e)" in fused
    cuda = _sources("cuda", program, {}, edges)["softmax1"]
    assert "if (e_rel[mid] <= r0) lo = mid + 1; else hi = mid;" in cuda and "rid = g0 + lane; rid < g1" in cuda
    cuda = _sources("cuda", program, {"traversal.mapping": "edge_parallel"}, edges)["softmax1"]
    assert "smax[(long)(e_dp[rid]) * 2 + ch]" in cuda and "per-destination-pair max" in cuda
    cuda = _sources("cuda", program, {"fusion.softmax": "full"}, edges, "inference")["aggregate1"]
    assert "online softmax per relation" in cuda and "const idx_t p = e_rel[rid];" in cuda
    pairs = _sources("cuda", attention_then_pairs(5, 6, 2), {"fusion.softmax": "full",
                                                              "reorder.aggregate_first": "on"}, edges, "inference")
    assert any("out[dst_pair] += softmax_dst_rel(" in code for code in pairs.values())


# ------------------------------------------------------------------ the CPU backend (float32)


DIMS = (13, 10, 2)  # feature sizes that are not multiples of 8, two heads


def _workload(program: Program, graph: HeteroGraph) -> Workload:
    return program_workload(program, graph)


@pytest.fixture(scope="module")
def backend() -> CpuBackend:
    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    return CpuBackend()


@pytest.mark.slow
def test_cpu_ir_configurations_match_the_reference(backend: CpuBackend, edges: HeteroGraph,
                                                   aifb: HeteroGraph) -> None:
    """A spread of 10 training IR configurations (every value of every IR knob among them), each on the
    edge-case graph and on AIFB, at the default schedule (edge-parallel where the layout asks for it)."""
    works = [_workload(relation_rgat(*DIMS), g) for g in (edges, aifb)]
    cfgs = list(works[0].space.ir_configs())
    random.Random(0).shuffle(cfgs)
    picked = cfgs[::len(cfgs) // 10]
    for knob in works[0].space.ir_knobs:
        assert {c[knob.name] for c in picked} == set(knob.choices), knob.name
    verify(backend, [("rgat-relation", w, runnable(w.space, c)) for c in picked for w in works])


@pytest.mark.slow
def test_cpu_random_training_schedules_match_the_reference(backend: CpuBackend, edges: HeteroGraph,
                                                           aifb: HeteroGraph) -> None:
    """8 random training schedules (IR and schedule knobs) on the edge-case graph, the first 4 on AIFB too;
    and the program whose fused softmax adds into destination pairs at a few."""
    w = _workload(relation_rgat(*DIMS), edges)
    rng = random.Random(31)
    cfgs = [w.space.sample(rng) for _ in range(8)]
    assert {c["traversal.mapping"] for c in cfgs} == {"dst_parallel", "edge_parallel"}
    on_aifb = _workload(relation_rgat(*DIMS), aifb)
    pairs = _workload(attention_then_pairs(5, 6, 2), edges)
    fused = {**pairs.space.default(), "reorder.aggregate_first": "on", "fusion.softmax": "full"}
    pair_cfgs = [fused, {**fused, "compact.src": "pair", "autodiff.save": "input", "traversal.chunk": 16},
                 {**fused, "fusion.softmax": "none", "layout.edges": "coo_rel_dst",
                  "traversal.mapping": "edge_parallel"}]
    verify(backend, [("rgat-relation", w, c) for c in cfgs] + [("rgat-relation", on_aifb, c) for c in cfgs[:4]]
           + [("attention-then-pairs", pairs, c) for c in pair_cfgs])


#: forward configurations: the fused forms (a training program never fuses: its backward reads the softmax)
FORWARD = [
    (relation_rgat, {"fusion.softmax": "full"}),
    (relation_rgat, {"fusion.softmax": "aggregate", "compact.src": "pair", "traversal.chunk": 16}),
    (relation_rgat, {"fusion.softmax": "full", "compact.dst": "pair", "compact.pair_index": "bsearch",
                     "layout.index_bits": 64, "fusion.epilogue": "on"}),
    (relation_rgat, {"layout.edges": "coo_rel_dst", "traversal.mapping": "edge_parallel"}),
    (attention_then_pairs, {"reorder.aggregate_first": "on", "fusion.softmax": "full"}),
    (attention_then_pairs, {"reorder.aggregate_first": "on", "fusion.softmax": "aggregate", "compact.src": "pair"}),
]


@pytest.mark.slow
def test_cpu_forward_fused_forms_match_the_reference(backend: CpuBackend, edges: HeteroGraph,
                                                     aifb: HeteroGraph) -> None:
    """The fused softmax-aggregate per relation, into destinations and into destination pairs, and the
    unfused softmax in both mappings: float32 forward runs against the float64 reference executor."""
    for graph in (edges, aifb):
        for build, cfg in FORWARD:
            program = build(*DIMS)
            space = SearchSpace(program, graph, "cpu")
            point = space.compile({**space.default(), **cfg})
            assert point.valid, point.problems
            kp = point.kernels
            params = init_params(kp, graph, dtype=torch.float64, seed=1)
            x = torch.randn(graph.num_nodes(), program.in_dim, generator=torch.Generator().manual_seed(2),
                            dtype=torch.float64)
            out = backend.build(kp, graph, point.config).run(x.float(), {k: v.float() for k, v in params.items()})
            assert rel_error(out, ReferenceExecutor(kp, graph).run(x, params)) < 1e-4, (graph.name, cfg)


# ------------------------------------------------------------------ CUDA: NVRTC and the emulator


def _cuda_space(program: Program, graph: HeteroGraph, mode: str = "training") -> SearchSpace:
    from rgtune.codegen.cuda.backend import CudaBackend

    ok, why = CudaBackend.compile_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")
    return SearchSpace(program, graph, "cuda", mode=mode)


def _compile(ledger: Any, group: str, programs: list[Any]) -> None:
    """Compiles the units of ``programs`` (:mod:`_nvrtc_ledger`: every unit for sm_90, the ones whose code
    differs by architecture, ``#if __CUDA_ARCH__`` for vector atomics, for sm_80 too; every unit for both
    in the exhaustive run). Asserts that each compiles within the launch limits ptxas reports."""
    problems = ledger.compile(group, programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("every", [35, pytest.param(1, marks=pytest.mark.exhaustive)])
def test_every_cuda_ir_configuration_compiles(ledger: Any, aifb: HeteroGraph, every: int) -> None:
    """Every ``every``-th of the 2,520 training IR configurations (all in the exhaustive run) at the default
    schedule (edge-parallel where the layout asks for it), for sm_90 (sm_80 compiles the same code: vector
    width 1 has no vector atomics); the exhaustive run compiles each of their distinct units for both. (A
    stride that takes every value of every knob: 35 does, 33 and 36 do not.)"""
    from rgtune.codegen.cuda.generate import generate
    from test_cuda_training import _valid_point

    space = _cuda_space(relation_rgat(64, 64, 2), aifb)
    configs = list(space.ir_configs())
    assert len(configs) == 2520
    picked = configs[::every]
    for knob in space.ir_knobs:
        assert {c[knob.name] for c in picked} == set(knob.choices), knob.name
    programs = [generate(p.kernels, p.config) for p in (_valid_point(space, c) for c in picked)]
    _compile(ledger, "rgat-relation ir-configs", programs)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_random_cuda_training_schedules_compile(ledger: Any, aifb: HeteroGraph) -> None:
    """8 random training schedules (IR and schedule knobs): every unit for sm_90, the ones with code by
    architecture (a scatter's vector atomics) for sm_80 too; every unit for both in the exhaustive run."""
    from rgtune.codegen.cuda.generate import generate

    space = _cuda_space(relation_rgat(64, 64, 2), aifb)
    rng = random.Random("cuda-rel-softmax")
    programs = [generate(space.compile(c).kernels, c) for c in (space.sample(rng) for _ in range(8))]
    assert any("__CUDA_ARCH__" in u.code for p in programs for u in p.units)
    _compile(ledger, "rgat-relation random", programs)


def _emulated(program: Program, graph: HeteroGraph, cfg: dict[str, Any], mode: str, arch: str) -> None:
    """``cfg``'s program on the emulator (a training step: the forward phase, then the backward phase on what
    it saved; buffers filled with NaN) against the float64 reference executor."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate
    from test_cuda_training import _compare, _inputs, _phased, _relative, tolerance

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator")
    space = _cuda_space(program, graph, mode)
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    x, params, dout = _inputs(kp, graph, program.in_dim, program.out_dim)
    emulated = EmulatedProgram(kp, generate(kp, point.config).units, graph, arch)
    ref = ReferenceExecutor(kp, graph)
    if mode == "training":
        _compare(_phased(emulated, x, params, dout), ref.run_training(x, params, dout), f"{program.name} {cfg}",
                 tolerance(graph))
    else:
        out = emulated.run(x, params, fill=float("nan"))
        assert not out.isnan().any() and _relative(out, ref.run(x, params)) < tolerance(graph), cfg


#: configurations on the emulator: every softmax form (dst-parallel runs, edge-parallel pair scratch, fused
#: online per relation into nodes and into pairs), pair lookups by search, 64-bit indices, vector lanes and
#: coarsening (a forward's: a training program's traversals also add one-feature rows, which no vector divides)
EMULATED = [
    (relation_rgat, "training", {}),
    (relation_rgat, "inference", {"fusion.softmax": "full", "compact.src": "pair", "traversal.vector_width": 2,
                                  "traversal.coarsening": 2}),
    (relation_rgat, "training", {"fusion.softmax": "aggregate", "compact.dst": "pair", "compact.pair_index": "bsearch",
                                 "autodiff.save": "input", "autodiff.reuse": "store", "traversal.coarsening": 2}),
    (relation_rgat, "training", {"layout.edges": "coo_rel_src", "traversal.mapping": "edge_parallel",
                                 "compact.src": "pair", "compact.pair_index": "bsearch", "layout.index_bits": 64,
                                 "autodiff.save": "nodes"}),
    (attention_then_pairs, "training", {"reorder.aggregate_first": "on", "fusion.softmax": "full",
                                        "traversal.threads": 64}),
    (attention_then_pairs, "inference", {"reorder.aggregate_first": "on", "fusion.softmax": "full",
                                         "traversal.vector_width": 4}),
]


@pytest.mark.slow
@pytest.mark.parametrize("build,mode,cfg", EMULATED,
                         ids=[f"{b.__name__}-{m}-{i}" for i, (b, m, _) in enumerate(EMULATED)])
def test_the_cuda_emulator_matches_the_reference(build: Any, mode: str, cfg: dict[str, Any],
                                                 edges: HeteroGraph) -> None:
    _emulated(build(12, 16, 2), edges, cfg, mode, arch=("sm_80", "sm_90")[len(cfg) % 2])
