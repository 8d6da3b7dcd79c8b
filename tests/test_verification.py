"""Sampled verification: the float64 reference on sampled destinations' in-neighbourhoods is exactly the
whole graph's at those rows (outputs, input gradient, every parameter gradient), for every built-in model;
tolerances grow with the reduction length; a wrong kernel is still caught."""

from __future__ import annotations

import math

import pytest
import torch

from rgtune.data.neighbourhood import in_neighbourhood, sample_destinations
from rgtune.data.synthetic import random_graph
from rgtune.ir.registry import build_model
from rgtune.tuner.verification import REDUCTION_MARGIN, Verifier

MODELS = [("rgcn", {}, 1), ("rgcn", {"num_bases": 2}, 1), ("rgcn", {"num_blocks": 2}, 1), ("rgat", {}, 2),
          ("rgat", {"softmax": "relation"}, 2), ("hgt", {}, 2), ("film", {}, 1)]


@pytest.fixture(scope="module")
def graph():
    # a hub with many in-edges, nodes without in-edges, an empty relation
    g = random_graph((150, 250), num_relations=4, num_edges=2500, seed=3)
    return g


@pytest.mark.parametrize("model,options,heads", MODELS, ids=[f"{m}{o or ''}" for m, o, _ in MODELS])
def test_sampled_reference_equals_the_whole_graphs_rows(graph, model, options, heads):
    program = build_model(model, 8, 8, heads, options)
    sampled = Verifier(program, graph, training=True, mode="sampled", rows=20)
    sampled.case(seed=4)  # the kept inputs change rows between cases: the second case must be as exact
    case = sampled.case(seed=5)
    # the whole graph's gradients for the sampled dout: what the kernels compute on the whole graph
    from rgtune.tuner.verification import _reference
    from rgtune.ir.interpret import Interpreter

    got = _reference(Interpreter(program, graph), case.x.double(), case.params, case.dout.double())
    assert int((case.dout != 0).any(1).sum()) == 20  # dout only on the sampled rows
    err, which, _ = sampled.error(got, case)
    assert err < 1e-12, which
    assert case.coverage().sampled and case.coverage().rows == 20
    hood = case.hood
    assert hood is not None and int(torch.bincount(graph.dst, minlength=graph.num_nodes()).argmax()) in hood.dst


def test_a_wrong_row_outside_the_neighbourhood_is_caught(graph):
    program = build_model("rgcn", 8, 8)
    v = Verifier(program, graph, training=True, mode="sampled", rows=10)
    case = v.case(seed=1)
    from rgtune.tuner.verification import _reference
    from rgtune.ir.interpret import Interpreter

    got = _reference(Interpreter(program, graph), case.x.double(), case.params, case.dout.double())
    assert v.error(got, case)[0] < 1e-12
    outside = torch.ones(graph.num_nodes(), dtype=torch.bool)
    outside[case.hood.nodes] = False
    bad = dict(got)
    bad["input gradient"] = got["input gradient"].clone()
    bad["input gradient"][outside.nonzero()[0]] = 1.0  # a stray write where the gradient must be zero
    err, which, tol = v.error(bad, case)
    assert err > tol and which == "input gradient"
    bad = dict(got)
    bad["output"] = got["output"].clone()
    bad["output"][case.hood.dst[0]] += 1.0
    assert v.error(bad, case)[1] == "output"
    bad = dict(got)
    bad["output"] = got["output"][:-1]
    assert v.error(bad, case)[0] == math.inf
    bad = dict(got)
    bad["input gradient"] = got["input gradient"].float()  # the kernels' dtype: only checked rows become float64
    bad["input gradient"][outside.nonzero()[-1]] = float("nan")
    err, which, tol = v.error(bad, case)
    assert not err < tol and which == "input gradient"  # a NaN where the gradient must be zero fails too


def test_a_nan_fails_whichever_result_has_it(graph):
    program = build_model("rgcn", 8, 8)
    v = Verifier(program, graph, training=True, mode="full")
    case = v.case(seed=2)
    from rgtune.ir.interpret import Interpreter
    from rgtune.tuner.verification import _reference

    got = _reference(Interpreter(program, graph), case.x.double(), case.params, case.dout.double())
    for name in got:  # the first result (the output), one in the middle, the last
        bad = dict(got)
        bad[name] = got[name].clone()
        bad[name].view(-1)[0] = float("nan")
        err, which, tol = v.error(bad, case)
        assert not err < tol and which == name, (name, err, which)


def test_largest_outside_reads_every_block():
    from rgtune.tuner.verification import _largest_outside

    got = torch.zeros(10, 3)
    got[7, 2] = -5.0
    got[2, 0] = 9.0
    assert _largest_outside(got, torch.tensor([2]), block=3) == 5.0
    assert _largest_outside(got, torch.tensor([2, 7]), block=4) == 0.0
    assert _largest_outside(torch.zeros(0, 3), torch.tensor([], dtype=torch.long)) == 0.0


def test_a_case_counts_what_it_holds(graph):
    program = build_model("rgcn", 8, 8)
    sampled = Verifier(program, graph, training=True, mode="sampled", rows=10).case(seed=0)
    inputs = (sampled.x.numel() + sampled.dout.numel() + sum(p.numel() for p in sampled.params.values())) * 4
    expected = sum(e.value.numel() * 8 for e in sampled.expected.values())
    assert inputs + expected <= sampled.resident_bytes() < inputs + expected + 8 * graph.num_nodes()
    whole = Verifier(program, graph, training=True, mode="full").case(seed=0)
    # checked whole, the comparison copies the largest result to float64 too
    largest = max(e.value.numel() * 8 for e in whole.expected.values())
    assert whole.resident_bytes() > largest * 2


def test_tolerance_grows_with_the_longest_reduction():
    # one hub with 20,000 in-edges: its float32 sum may be sqrt(20000) units of rounding off
    n = 20_001
    from rgtune.data.graph import HeteroGraph

    g = HeteroGraph({"n": n}, {("n", "r", "n"): (torch.arange(1, n), torch.zeros(n - 1, dtype=torch.int64))})
    v = Verifier(build_model("rgcn", 4, 4), g, training=False, mode="full")
    case = v.case(seed=0)
    assert case.tolerances["output"] >= REDUCTION_MARGIN * math.sqrt(n - 1) * 2.0 ** -24 > 1e-4


def test_sample_covers_every_relation_and_sourceless_nodes(graph):
    d = sample_destinations(graph, 30, seed=2)
    assert 25 <= d.numel() <= 40
    deg = torch.bincount(graph.dst, minlength=graph.num_nodes())
    if bool((deg == 0).any()):
        assert bool((deg[d] == 0).any())
    hood = in_neighbourhood(graph, d)
    rels = {r for r in range(graph.num_rels) if graph.num_edges(graph.canonical_etypes[r])}
    assert {r for r in range(hood.graph.num_rels) if hood.graph.num_edges(hood.graph.canonical_etypes[r])} == rels
    with pytest.raises(ValueError, match="count must be at least 1"):
        sample_destinations(graph, 0)
    with pytest.raises(ValueError, match=r"destination ids must be in \[0, 400\)"):
        in_neighbourhood(graph, torch.tensor([400]))


def test_auto_samples_only_big_graphs(graph):
    program = build_model("rgcn", 4, 4)
    assert not Verifier(program, graph, training=False).sampled
    assert Verifier(program, graph, training=False, mode="sampled").sampled
    with pytest.raises(ValueError, match="unknown verification mode 'some'.*'auto', 'full', 'sampled'"):
        Verifier(program, graph, training=False, mode="some")


def test_the_float32_reference_runs_only_for_a_result_over_its_tolerance(graph):
    from rgtune.ir.interpret import Interpreter
    from rgtune.tuner.verification import _reference

    program = build_model("rgcn", 8, 8)
    v = Verifier(program, graph, training=False, mode="full")
    case = v.case(seed=2)
    got = _reference(Interpreter(program, graph), case.x, case.params, None)
    calls = []
    own = case.float32_reference
    case.float32_reference = lambda: calls.append(own())
    assert v.error(got, case)[0] < 1e-12 and calls == []  # correct: no second reference run
    off = {"output": got["output"] * (1 + 3e-4)}
    err, which, tol = v.error(off, case)
    assert calls == [None] and case.float32_reference is None and err > tol  # ran once; still wrong
    v.error(off, case)
    assert len(calls) == 1  # never twice for one case
