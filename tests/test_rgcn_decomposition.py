"""RGCN with a decomposed relation weight (``rgcn(..., num_bases=B)``, ``rgcn(..., num_blocks=B)``), the
``reorder.bases`` knob and the ``view`` op, against PyG's ``RGCNConv`` and the float64 reference.

* The options: one-line errors naming the bad value; params named and shaped as PyG's (a state maps one
  to one), initialized as PyG's; no option is today's program.
* The float64 interpreter of the program after the passes of every IR configuration equals PyG's
  ``RGCNConv(num_bases=B)`` / ``RGCNConv(num_blocks=B)`` (relative error < 1e-10) on AIFB, MUTAG and a
  graph with an empty relation and isolated nodes (bases B in 1, 2, 30 capped at R; blocks B in 1, 2, 4).
* The knob: declared where bases are, with its constraint against ``reorder.aggregate_first``; what
  ``transform`` computes (one GEMM over the nodes with B * out columns, a combination per edge or per pair).
* Every IR configuration: the training program (the adjoint, interpreted) has torch autograd's gradients,
  and its kernels (the reference executor) compute what the interpreter does.
* The CPU backend in float32 (< 1e-4, the gradient tolerance of ``test_cpu_training``): a sample of IR
  configurations (forward and training) and 12 random training schedules, on AIFB and an edge-case graph.
* CUDA: every 4th IR configuration's training program at the default schedule and 5 random training schedules
  each with bases, with blocks and of the sum (every configuration and 10 each in the exhaustive run) compile with NVRTC (sm_80, sm_90, within ptxas' limits); a sample runs on
  the emulator and matches.

Relative error: ``max|a - b| / max|b|``.
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
from rgtune.ir.bind import graph_arrays
from rgtune.ir.counts import count
from rgtune.ir.interpret import Interpreter, param_full_shape, random_params
from rgtune.ir.kernels import GemmKernel, Load, MapKernel, TraversalKernel, WeightKernel
from rgtune.ir.models import build_model, rgcn
from rgtune.ir.pipeline import compile_program
from rgtune.ir.program import IRError, Program
from rgtune.search_spaces import SearchSpace

# helpers of the existing suites (tests/ is on sys.path under pytest)
from _matrix import sampled
from test_autodiff import _check, _derived_tensor, _distinct, param_grads_through_folds
from test_cpu_training import Workload, program_workload, rel_error, runnable, verify

TOL = 1e-10
#: the options the float64 checks cover (``num_bases=30`` is capped at the graph's relations)
OPTIONS = [{"num_bases": 1}, {"num_bases": 2}, {"num_bases": 30}, {"num_blocks": 1}, {"num_blocks": 2},
           {"num_blocks": 4}]


# ----------------------------------------------------------------------------- graphs
def _edge_cases(name: str = "decomposition_edge_cases", hub: int = 0) -> HeteroGraph:
    """An empty relation, isolated nodes, a node type that is never a destination, skewed sources."""
    g = random_graph((60, 50, 40), num_relations=6, num_edges=900, empty_relations=1, isolated_nodes=3,
                     source_only_ntypes=1, hub_in_degree=hub, src_skew=1.2, seed=7, name=name)
    assert int(torch.bincount(g.etype, minlength=g.num_rels).min()) == 0
    return g


@pytest.fixture(scope="module")
def graphs() -> dict[str, HeteroGraph]:
    return {"aifb": load_dataset("aifb"), "mutag": load_dataset("mutag"), "edge cases": _edge_cases()}


def _capped(option: dict[str, int], graph: HeteroGraph) -> dict[str, int]:
    return {k: min(v, graph.num_rels) if k == "num_bases" else v for k, v in option.items()}


# ----------------------------------------------------------------------------- the options
def test_options_are_checked_with_one_line_errors() -> None:
    cases = [({"num_bases": 2, "num_blocks": 2}, r"num_bases=2 and num_blocks=2 exclude each other"),
             ({"num_bases": 0}, r"num_bases=0 is not valid; it must be a positive integer"),
             ({"num_bases": 2.0}, r"num_bases=2.0 is not valid"),
             ({"num_bases": True}, r"num_bases=True is not valid"),
             ({"num_blocks": -1}, r"num_blocks=-1 is not valid"),
             ({"num_blocks": 3}, r"num_blocks=3 must divide in_dim=8 and out_dim=6; valid: \[1, 2\]")]
    for kw, message in cases:
        with pytest.raises(IRError, match=message) as info:
            rgcn(8, 6, **kw)
        assert "\n" not in str(info.value)


def test_no_option_is_todays_program() -> None:
    assert str(rgcn(4, 3)) == str(build_model("rgcn", 4, 3)) == "\n".join([
        "program rgcn(x: node[1x4])",
        "  param weight: rel[4x3]",
        "  param root: none[4x3]",
        "  param bias: none[3]",
        "  %0 = gather(x, end=src) : edge[1x4]",
        "  %1 = typed_linear(%0, weight, by=rel) : edge[1x3]",
        "  %2 = graph_const(kind=inv_dst_rel_degree) : edge[1x1]",
        "  %3 = mul(%1, %2) : edge[1x3]",
        "  %4 = typed_linear(x, root, bias, by=none) : node[1x3]",
        "  %5 = aggregate(%3, to=node, reduce=sum) : node[1x3]",
        "  %6 = add(%4, %5) : node[1x3]",
        "  return %6"])


@pytest.mark.pyg
@pytest.mark.parametrize("option", [{"num_bases": 3}, {"num_blocks": 4}, {}])
def test_params_are_named_shaped_and_initialized_as_pygs(option: dict[str, int]) -> None:
    from torch_geometric.nn import RGCNConv

    g = _edge_cases()
    program = rgcn(8, 12, **option)
    conv = RGCNConv(8, 12, g.num_rels, aggr="mean", **option)
    arrays = graph_arrays(g)
    ours = {name: param_full_shape(p, arrays) for name, p in program.state_params().items()}
    assert ours == {name: tuple(p.shape) for name, p in conv.named_parameters()}
    # PyG: glorot(weight), glorot(comp), glorot(root), zeros(bias)
    assert {name: p.init for name, p in program.state_params().items()} == \
        {name: "zeros" if name == "bias" else "glorot" for name in ours}


def test_a_view_regroups_features_and_checks_its_heads() -> None:
    from rgtune.ir.program import ProgramBuilder

    p = ProgramBuilder("views", 12)
    v = p.view(p.x, heads=3)
    assert (v.domain, v.heads, v.dim) == ("node", 3, 4)
    back = p.view(v, heads=2)
    assert (back.heads, back.dim) == (2, 6)
    with pytest.raises(IRError, match=r"12 features do not split into heads=5; valid heads: \[1, 2, 3, 4, 6, 12\]"):
        p.view(p.x, heads=5)
    program = p.finish(p.view(back, heads=1))
    x = torch.randn(4, 12, dtype=torch.float64)
    g = random_graph((4,), num_relations=1, num_edges=3, seed=0)
    run = Interpreter(program, g).run(x, {})
    assert torch.equal(run.values[v.name], x.reshape(4, 3, 4)) and torch.equal(run.output, x)
    kp = compile_program(program, {}, g).kernels  # views of views read the input buffer: nothing to compute
    assert kp.kernels == [] and kp.output == kp.input
    assert torch.equal(ReferenceExecutor(kp, g).run(x, {}), x)


# ----------------------------------------------------------------------------- equal to PyG
def _pyg_output(graph: HeteroGraph, state: dict[str, torch.Tensor], x: torch.Tensor, **option: int) -> torch.Tensor:
    from rgtune.torch_layers.pyg import to_pyg_rgcn_state

    conv = to_pyg_rgcn_state(graph, state, x.shape[1], state["root"].shape[1], **option)
    return conv(x, torch.stack([graph.src, graph.dst]), graph.etype).detach()


@pytest.mark.pyg
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("name", ["aifb", "mutag", "edge cases"])
def test_every_configuration_equals_pyg(name: str, option: dict[str, int], graphs: dict[str, HeteroGraph]) -> None:
    """The program after the passes of every IR configuration, in float64: each distinct program once (on the
    datasets, each distinct sequence of ops once: the edge layout, which only orders the edges, in its default)."""
    pytest.importorskip("torch_geometric")
    graph = graphs[name]
    option = _capped(option, graph)
    program = rgcn(16, 12, **option)
    state = random_params(program, graph, seed=3)
    x = torch.randn(graph.num_nodes(), 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = _pyg_output(graph, state, x, **option)
    assert float(expected.abs().max()) > 0
    distinct = _distinct(program, graph)
    assert len(distinct) == (9 if "num_blocks" in option else 15)  # (reorder x compact) programs x 3 layouts
    if name != "edge cases":
        distinct = list({tuple(map(str, p.ops)): (p, layout) for p, layout in distinct if layout == "csr_dst"}.values())
    for after, layout in distinct:
        assert rel_error(Interpreter(after, graph, layout).run(x, state).output, expected) < TOL, str(after)


# ----------------------------------------------------------------------------- the knob
def _kernels(option: dict[str, int], config: dict[str, Any], training: bool = False):
    g = _edge_cases()
    return compile_program(rgcn(8, 6, **option), config, g, training=training).kernels


def test_reorder_bases_is_declared_where_bases_are_with_its_constraint() -> None:
    g = _edge_cases()
    space = SearchSpace(rgcn(8, 6, num_bases=3), g, "cpu")
    knob = space.knob("reorder.bases")
    assert knob.choices == ("fold", "transform") and knob.default == "fold"
    assert [c.name for c in space.constraints] == ["bases_transform_aggregate_first"]
    bad = {**space.default(), "reorder.bases": "transform", "reorder.aggregate_first": "on"}
    assert any("reorder.bases=transform" in why for why in space.check(bad))
    configs = list(space.ir_configs())
    assert {(c["reorder.bases"], c["reorder.aggregate_first"]) for c in configs} == \
        {("fold", "off"), ("fold", "on"), ("transform", "off")}
    for option in ({}, {"num_blocks": 2}):
        assert "reorder.bases" not in {k.name for k in SearchSpace(rgcn(8, 6, **option), g, "cpu").ir_knobs}


def test_fold_and_transform_kernels() -> None:
    """``fold``: W_r folded from the bases, a GEMM per relation over edges. ``transform``: the bases side
    by side (a data-movement fold), one GEMM over the nodes with B * out columns, the combination inline
    per edge, or once per pair in a map over the pairs (``compact.src=pair``)."""
    option = {"num_bases": 3}
    fold = _kernels(option, {})
    assert [k.mode for k in fold.kernels if isinstance(k, WeightKernel)] == ["bases"]
    assert [(k.rows, k.by, k.out_heads * k.out_dim) for k in fold.kernels if isinstance(k, GemmKernel)] == \
        [("edge", "rel", 6), ("node", "none", 6)]
    transform = _kernels(option, {"reorder.bases": "transform"})
    assert [k.mode for k in transform.kernels if isinstance(k, WeightKernel)] == ["join_heads"]
    gemms = [(k.rows, k.by, k.out_heads, k.out_dim) for k in transform.kernels if isinstance(k, GemmKernel)]
    assert gemms == [("node", "none", 3, 6), ("node", "none", 1, 6)]
    (agg,) = [k for k in transform.kernels if isinstance(k, TraversalKernel)]
    assert "sum_heads(" in agg.describe() and "comp[rel]" in agg.describe()
    # the fold's work on weights: per relation, B scaled (8, 6) bases summed; the bases side by side move data
    g = _edge_cases()
    assert (count(fold, g)["weight_flops"], count(transform, g)["weight_flops"]) == (2 * g.num_rels * 3 * 8 * 6, 0)
    assert count(transform, g)["gemm_rows"]["gemm1"] == g.num_nodes()
    pairs = _kernels(option, {"reorder.bases": "transform", "compact.src": "pair"})
    (combine,) = [k for k in pairs.kernels if isinstance(k, MapKernel) and k.rows == "src_pair"]
    assert "sum_heads(" in combine.describe() and pairs.buffers[combine.out].width == 6
    (agg,) = [k for k in pairs.kernels if isinstance(k, TraversalKernel)]
    assert f"{combine.out}@src_pair" in agg.describe() and "sum_heads" not in agg.describe()


def test_blocks_read_the_input_through_a_view_without_a_copy() -> None:
    """The block-diagonal linear is a per-head linear whose heads are the input's feature blocks: its GEMM
    reads the input buffer itself, with 4 heads of 2 features (no kernel copies it); the blocks' outputs
    are read back as one row of 6 features."""
    for config in ({}, {"reorder.aggregate_first": "on"}, {"compact.src": "pair"}):
        kp = _kernels({"num_blocks": 2}, config, training=True)
        forward = kp.kernels[:kp.forward_kernels]
        per_head = [k for k in forward if isinstance(k, GemmKernel) and k.per_head]
        assert [(k.in_heads, k.in_dim, k.out_heads, k.out_dim) for k in per_head] == [(2, 4, 2, 3)]
        if config.get("reorder.aggregate_first") != "on":
            assert per_head[0].x == kp.input
        loads = [e for k in kp.kernels if isinstance(k, (TraversalKernel, MapKernel))
                 for ex in (k.stage.exprs() if isinstance(k, TraversalKernel) else (k.value,))
                 for e in ex.walk() if isinstance(e, Load)]
        regrouped = {(e.buffer, e.heads, e.dim) for e in loads
                     if (e.heads, e.dim) != (kp.buffers[e.buffer].heads, kp.buffers[e.buffer].dim)}
        assert regrouped and all(h * d == kp.buffers[b].width for b, h, d in regrouped)
        assert ("x", 2, 4) in regrouped or config.get("reorder.aggregate_first") != "on"
        # no kernel copies a buffer row for row (what a view that moved data would be)
        assert not any(isinstance(k, MapKernel) and isinstance(k.value, Load) and k.value.via == "row"
                       for k in kp.kernels)


# ----------------------------------------------------------------------------- autodiff
def _lowered_matches_interpreter(before: Program, graph: HeteroGraph, configs: list[dict[str, Any]]) -> int:
    """Each distinct lowered training program (reference executor, float64) against the interpreted adjoint of
    the program before the passes; learnable gradients through the folds (the model itself has one)."""
    gen = torch.Generator().manual_seed(0)
    params = random_params(before, graph, seed=0)
    x = torch.randn(graph.num_nodes(), before.in_dim, generator=gen, dtype=torch.float64)
    dout = torch.randn(graph.num_nodes(), before.out_dim, generator=gen, dtype=torch.float64)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    run = Interpreter(adjoint(before), graph).run(x, leaves, dout)
    expected = param_grads_through_folds(run, leaves)
    seen = set()
    for cfg in configs:
        kp = compile_program(before, cfg, graph, strict=False, training=True).kernels
        if kp.describe() in seen:
            continue
        seen.add(kp.describe())
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        out, dx, grads = ReferenceExecutor(kp, graph).run_training(x, leaves, dout)
        got = {k: g for k, g in grads.items() if k in leaves}
        derived = {k: g for k, g in grads.items() if k not in leaves}
        if derived:
            back = torch.autograd.grad([_derived_tensor(kp, k, leaves, graph) for k in derived], list(leaves.values()),
                                       list(derived.values()), allow_unused=True)
            for k, g in zip(leaves, back):
                if g is not None:
                    got[k] = got[k] + g if k in got else g
        assert rel_error(out, run.output.detach()) < TOL, cfg
        assert rel_error(dx, run.input_grad.detach()) < 1e-9, cfg
        assert set(got) == set(expected) == set(params), cfg
        for k, g in expected.items():
            assert rel_error(got[k], g.detach()) < 1e-9, (k, cfg)
    return len(seen)


@pytest.mark.parametrize("option", [{"num_bases": 3}, {"num_blocks": 4}, {"aggr": "sum"}],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_every_configuration_has_the_gradients_of_autograd(option: dict[str, int]) -> None:
    """The adjoint of the program after the passes of every IR configuration (``autodiff.save`` each way)
    against autograd of the program before them, then every training configuration's kernels."""
    graph = _edge_cases()
    before = rgcn(8, 8, **option)
    for after, layout in _distinct(before, graph):
        _check(before, after, graph, layout)
    configs = list(SearchSpace(before, graph, "cpu", mode="training").ir_configs())
    assert _lowered_matches_interpreter(before, graph, configs) >= len(configs) // 3


# ----------------------------------------------------------------------------- the CPU backend
_WORKLOADS: dict[tuple, Workload] = {}


def _workload(option: dict[str, int], graph: HeteroGraph, mode: str = "training") -> Workload:
    """The model with ``option`` at 13 -> 10 features (bases) or 12 -> 10 (blocks: 2 blocks of 6 -> 5), not
    multiples of 8, on ``graph``: inputs, params and the float64 reference of the default configuration."""
    key = (tuple(option.items()), graph.name, mode)
    if key not in _WORKLOADS:
        dims = (12, 10) if "num_blocks" in option else (13, 10)
        _WORKLOADS[key] = program_workload(rgcn(*dims, **option), graph, mode)
    return _WORKLOADS[key]


@pytest.fixture(scope="module")
def cpu_backend():
    from rgtune.codegen.cpu import CpuBackend

    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    return CpuBackend()


@pytest.fixture(scope="module")
def cpu_graphs(graphs: dict[str, HeteroGraph]) -> list[HeteroGraph]:
    return [graphs["aifb"], _edge_cases("decomposition_cpu_edge_cases", hub=600)]


CPU_OPTIONS = [{"num_bases": 3}, {"num_blocks": 2}]


@pytest.mark.slow
@pytest.mark.parametrize("option", CPU_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_cpu_a_sample_of_ir_configurations(option: dict[str, int], cpu_backend, cpu_graphs) -> None:
    """Training programs (output, input gradient, every learnable gradient) of 8 IR configurations spread
    over the shuffled list, on AIFB and the edge-case graph; and the forward programs of 4 of them."""
    cases = []
    for g in cpu_graphs:
        w = _workload(option, g)
        configs = list(w.space.ir_configs())
        random.Random(1).shuffle(configs)
        cases += [("sample", w, runnable(w.space, c)) for c in configs[::max(1, len(configs) // 8)]]
    saves = {c["autodiff.save"] for _, _, c in cases}
    assert saves == {"all", "nodes", "input"}
    verify(cpu_backend, cases)
    if "num_bases" in option:
        assert {c["reorder.bases"] for _, _, c in cases} == {"fold", "transform"}
    for g in cpu_graphs:  # forward programs
        w = _workload(option, g, mode="inference")
        configs = list(w.space.ir_configs())
        random.Random(2).shuffle(configs)
        for cfg in configs[:4]:
            cfg = runnable(w.space, cfg)
            kp = w.space.compile(cfg).kernels
            ref = ReferenceExecutor(kp, g).run(w.x.double(), {k: v.double() for k, v in w.params.items()})
            out = cpu_backend.build(kp, g, cfg).run(w.x, w.params)
            assert rel_error(out, ref) < 1e-4, cfg


@pytest.mark.slow
@pytest.mark.parametrize("option", CPU_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_cpu_random_training_schedules(option: dict[str, int], cpu_backend, cpu_graphs) -> None:
    """12 random training schedules (IR and schedule knobs), each on AIFB and on the edge-case graph."""
    base = _workload(option, cpu_graphs[0])
    rng = random.Random(2026)
    configs = [base.space.sample(rng) for _ in range(12)]
    cases = [("random", _workload(option, g), c) for c in configs for g in cpu_graphs]
    verify(cpu_backend, cases)


# ----------------------------------------------------------------------------- CUDA
def _cuda_space(option: dict[str, int], graph: HeteroGraph, dims: tuple[int, int] = (16, 16)) -> SearchSpace:
    return SearchSpace(rgcn(*dims, **option), graph, "cuda", mode="training")


@pytest.mark.slow
@pytest.mark.parametrize("model, stride", sampled(["rgcn"], 4, 1))
def test_cuda_training_programs_compile_with_nvrtc(model: str, stride: int) -> None:
    """Every ``stride``-th IR configuration's training program at the default schedule (the edge-parallel
    traversal where the layout forbids the default), bases, blocks and the sum (DGL's RelGraphConv without
    norm), and 5 random training schedules of each (every configuration and 10 of each under
    RGTUNE_EXHAUSTIVE=1); each distinct unit compiled once."""
    from _nvrtc_ledger import Ledger
    from test_cuda_training import _OK, _WHY, _valid_point

    from rgtune.codegen.cuda.generate import generate

    if not _OK:
        pytest.skip(f"NVRTC unavailable: {_WHY}")
    graph = random_graph((50, 80, 30), num_relations=12, num_edges=800, seed=0)
    ledger = Ledger()
    for option in ({"num_bases": 4}, {"num_blocks": 4}, {"aggr": "sum"}):
        space = _cuda_space(option, graph)
        programs = []
        for cfg in list(space.ir_configs())[::stride]:
            point = _valid_point(space, cfg)
            programs.append(generate(point.kernels, point.config))
        rng = random.Random(f"cuda-rgcn-{option}")
        for _ in range(5 if stride > 1 else 10):
            cfg = space.sample(rng)
            programs.append(generate(space.compile(cfg).kernels, cfg))
        problems = ledger.compile(f"rgcn {option}", programs)
        assert not problems, "\n".join(problems[:5])
    print("\n".join(ledger.summary()))


EMULATED = [({"num_bases": 3}, {}), ({"num_bases": 3}, {"reorder.bases": "transform"}),
            ({"num_bases": 3}, {"reorder.bases": "transform", "compact.src": "pair", "compact.pair_index": "bsearch",
                                "scatter.mapping": "edge_parallel", "autodiff.save": "input"}),
            ({"num_bases": 3}, {"reorder.aggregate_first": "on", "weightgrad.reduction": "two_pass"}),
            ({"num_blocks": 4}, {}), ({"num_blocks": 4}, {"reorder.aggregate_first": "on"}),
            ({"num_blocks": 4}, {"compact.src": "pair", "layout.edges": "coo_rel_src",
                                 "traversal.mapping": "edge_parallel", "autodiff.save": "nodes"}),
            ({"aggr": "sum"}, {}), ({"aggr": "sum"}, {"reorder.aggregate_first": "on", "compact.src": "pair"})]


@pytest.mark.parametrize("option,cfg", EMULATED)
def test_cuda_emulated_training_step(option: dict[str, int], cfg: dict[str, Any]) -> None:
    """The generated CUDA run on the CPU emulator (forward phase, then backward phase, buffers poisoned with
    NaN) against the float64 reference: output, input gradient, every gradient."""
    from test_cuda_training import _edge_case_graph, _needs_cxx, emulated_training_step

    _needs_cxx()
    g = _edge_case_graph()
    emulated_training_step(_cuda_space(option, g, (12, 12)), g, cfg, (12, 12), f"rgcn {option} {cfg}")
