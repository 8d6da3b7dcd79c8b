"""The adjoint program (rgtune.ir.autodiff) against torch's autograd, on every IR configuration.

The training program of a model after the passes, run by the IR interpreter in float64, must give
the input's gradient and every parameter's gradient that autograd gives for the model before the
passes (the semantic model), and that autograd gives for the reference layers of rgtune.torch_layers.
"""

from __future__ import annotations

import pytest
import torch

from rgtune.data.synthetic import random_graph
from rgtune.ir.autodiff import SAVE, adjoint
from rgtune.ir.interpret import Interpreter, Run, random_params
from rgtune.ir.models import build_model
from rgtune.ir.bind import CSR_DST
from rgtune.ir.pipeline import apply_passes
from rgtune.ir.plan import plan_lowering
from rgtune.search_spaces import SearchSpace

SIZES = {"rgcn": [(8, 6, 1)], "rgat": [(8, 6, 2), (5, 4, 1)], "hgt": [(8, 8, 2), (6, 4, 1)]}


def _graph(seed: int = 0):
    return random_graph((20, 15, 10), num_relations=5, num_edges=220, seed=seed)


def param_grads_through_folds(run: Run, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each learnable param's gradient: its own, plus what flows back through the derived weights
    (folds computed with torch on ``params``, which require grad)."""
    grads = {k: g for k, g in run.param_grads.items() if k in params}
    derived = [k for k in run.param_grads if k not in params]
    if derived:
        leaves = list(params)
        back = torch.autograd.grad([run.params[k] for k in derived], [params[k] for k in leaves],
                                   [run.param_grads[k] for k in derived], allow_unused=True)
        for k, g in zip(leaves, back):
            if g is not None:
                grads[k] = grads[k] + g if k in grads else g
    return grads


def _autograd(program, graph, x, params, dout):
    x = x.clone().requires_grad_(True)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    out = Interpreter(program, graph).run(x, leaves).output
    grads = torch.autograd.grad(out, [x, *leaves.values()], dout, allow_unused=True)
    return out.detach(), grads[0], dict(zip(leaves, grads[1:]))


def _distinct(before, graph):
    """``(program, layout)`` after the passes of every IR configuration, each once: what the interpreter reads
    (the ops and the edge layout of the lowering plan; fusion and other lowering choices do not change the math)."""
    seen = {}
    for cfg in SearchSpace(before, graph, "cpu").ir_configs():
        after, layout = apply_passes(before, cfg, graph), plan_lowering(cfg).layout
        seen.setdefault((tuple(map(str, after.ops)), layout), (after, layout))
    assert seen
    return list(seen.values())


#: the last semantic model's inputs and autograd results: the loops check every configuration of one model in turn
_last_reference: list = [None]


def _reference(program_before, graph, seed):
    """``x, params, dout`` drawn for ``seed`` and autograd's ``out, dx, dparams`` of the model before the passes."""
    last = _last_reference[0]
    if last is None or last[0] is not program_before or last[1] is not graph or last[2] != seed:
        gen = torch.Generator().manual_seed(seed)
        params = random_params(program_before, graph, seed=seed)
        x = torch.randn(graph.num_nodes(), program_before.in_dim, generator=gen, dtype=torch.float64)
        dout = torch.randn(graph.num_nodes(), program_before.out_dim, generator=gen, dtype=torch.float64)
        last = _last_reference[0] = (program_before, graph, seed, (x, params, dout),
                                     _autograd(program_before, graph, x, params, dout))
    return last[3], last[4]


def _check(program_before, program_after, graph, layout=CSR_DST, seed=0):
    (x, params, dout), (out, dx, dparams) = _reference(program_before, graph, seed)
    programs = {str(t): t for t in (adjoint(program_after, save=s) for s in SAVE.choices)}  # saved or recomputed
    for training in programs.values():
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        run = Interpreter(training, graph, layout).run(x, leaves, dout)
        assert torch.allclose(run.output, out, rtol=1e-10, atol=1e-12)
        assert torch.allclose(run.input_grad, dx, rtol=1e-9, atol=1e-11)
        got = param_grads_through_folds(run, leaves)
        assert set(got) == {k for k, g in dparams.items() if g is not None}
        for k, g in got.items():
            assert torch.allclose(g, dparams[k], rtol=1e-9, atol=1e-11), (k, (g - dparams[k]).abs().max())


@pytest.mark.parametrize("model", sorted(SIZES))
def test_every_ir_configuration_has_the_gradients_of_autograd(model):
    graph = _graph()
    for in_dim, out_dim, heads in SIZES[model]:
        before = build_model(model, in_dim, out_dim, heads)
        for after, layout in _distinct(before, graph):
            _check(before, after, graph, layout)


@pytest.mark.parametrize("model", sorted(SIZES))
def test_the_training_program_equals_autograd_of_the_reference_layer(model):
    from rgtune.torch_layers import HGT, RGAT, RGCN

    graph = _graph(1)
    in_dim, out_dim, heads = SIZES[model][0]
    cls = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}[model]
    layer = cls(graph, in_dim, out_dim, **({} if model == "rgcn" else {"heads": heads})).double()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    x = torch.randn(graph.num_nodes(), in_dim, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(graph.num_nodes(), out_dim, generator=gen, dtype=torch.float64)
    out = layer(x)
    expected = torch.autograd.grad(out, [x, *layer.parameters()], dout)
    names = [n for n, _ in layer.named_parameters()]

    training = adjoint(build_model(model, in_dim, out_dim, heads))
    params = {n: p.detach().clone().requires_grad_(True) for n, p in layer.named_parameters()}
    run = Interpreter(training, graph).run(x.detach(), params, dout)
    assert torch.allclose(run.output, out.detach(), rtol=1e-10, atol=1e-12)
    assert torch.allclose(run.input_grad, expected[0], rtol=1e-9, atol=1e-11)
    got = param_grads_through_folds(run, params)
    for name, g in zip(names, expected[1:]):
        assert torch.allclose(got[name], g, rtol=1e-9, atol=1e-11), name


def test_edge_cases_empty_relations_isolated_nodes_one_node_type():
    from rgtune.data.graph import HeteroGraph

    # a relation without edges, nodes without edges, one node type
    g = HeteroGraph({"a": 12}, {("a", "r0", "a"): (torch.tensor([0, 1, 2, 2, 5]), torch.tensor([1, 2, 0, 3, 3])),
                                ("a", "r1", "a"): (torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)),
                                ("a", "r2", "a"): (torch.tensor([3, 4, 4]), torch.tensor([0, 0, 5]))}, name="edge-cases")
    for model, sizes in SIZES.items():
        for in_dim, out_dim, heads in sizes:
            before = build_model(model, in_dim, out_dim, heads)
            for after, layout in _distinct(before, g):
                _check(before, after, g, layout)


def test_a_training_program_reads_dout_and_names_every_gradient():
    training = adjoint(build_model("hgt", 8, 8, 2))
    text = str(training)
    assert text.splitlines()[0] == "program hgt(x: node[1x8], dout: node[1x8])"
    assert "return" in text and "dx=" in text and "dk_weight=grad_k_weight" in text
    assert set(training.param_grads) == set(build_model("hgt", 8, 8, 2).state_params())
    assert training.state_params() == build_model("hgt", 8, 8, 2).state_params()


def _lowered_equals_interpreter(before, graph, configs, seed=0):
    from rgtune.codegen.reference import ReferenceExecutor
    from rgtune.ir.pipeline import compile_program

    gen = torch.Generator().manual_seed(seed)
    params = random_params(before, graph, seed=seed)
    x = torch.randn(graph.num_nodes(), before.in_dim, generator=gen, dtype=torch.float64)
    dout = torch.randn(graph.num_nodes(), before.out_dim, generator=gen, dtype=torch.float64)
    run = Interpreter(adjoint(before), graph).run(x, params, dout)
    expected = param_grads_through_folds(run, {k: v.requires_grad_(False) for k, v in params.items()})
    seen = set()
    for cfg in configs:
        compiled = compile_program(before, cfg, graph, strict=False, training=True)
        kp = compiled.kernels
        if kp.describe() in seen:
            continue
        seen.add(kp.describe())
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        out, dx, grads = ReferenceExecutor(kp, graph).run_training(x, leaves, dout)
        derived = {k: g for k, g in grads.items() if k not in leaves}
        got = {k: g for k, g in grads.items() if k in leaves}
        if derived:  # through the folds, as the runtime does it
            back = torch.autograd.grad([_derived_tensor(kp, k, leaves, graph) for k in derived], list(leaves.values()),
                                       list(derived.values()), allow_unused=True)
            for k, g in zip(leaves, back):
                if g is not None:
                    got[k] = got[k] + g if k in got else g
        assert torch.allclose(out, run.output, rtol=1e-10, atol=1e-12), cfg
        assert torch.allclose(dx, run.input_grad, rtol=1e-9, atol=1e-11), cfg
        for k, g in expected.items():
            assert torch.allclose(got[k], g, rtol=1e-9, atol=1e-11), (k, cfg)
    return len(seen)


def _derived_tensor(kp, name, leaves, graph):
    """A derived param of ``kp`` computed from ``leaves`` with the backends' fold (differentiable)."""
    from rgtune.codegen.weights import fold_weights
    from rgtune.ir.bind import graph_arrays
    from rgtune.ir.kernels import WeightKernel

    folds = {k.out: k for k in kp.kernels if isinstance(k, WeightKernel)}
    params = dict(leaves)
    arrays = graph_arrays(graph, kp.layout, kp.index_bits)
    for k in kp.kernels:  # in program order: a fold may read an earlier one
        if isinstance(k, WeightKernel):
            params[k.out] = fold_weights(k, params, arrays, kp.param_shapes)
    assert name in folds
    return params[name]


def _lowered_configs(model: str, graph, size: int, every: int) -> int:
    in_dim, out_dim, heads = SIZES[model][size]
    before = build_model(model, in_dim, out_dim, heads)
    configs = list(SearchSpace(before, graph, "cpu", mode="training").ir_configs())
    assert {c["autodiff.save"] for c in configs} == set(SAVE.choices)
    return _lowered_equals_interpreter(before, graph, configs[::every])


#: configurations checked in the default run: every one of RGCN's first size, every 9th of RGAT's, every 59th
#: of HGT's 2,880 (the exhaustive test below checks all of every size)
EVERY = {"rgcn": 1, "rgat": 9, "hgt": 59}


@pytest.mark.parametrize("model", sorted(SIZES))
def test_the_lowered_training_program_computes_what_the_interpreter_does(model):
    """IR configurations (forward and backward knobs, :data:`EVERY`) of each model's first sizes; every
    7th of the other sizes'."""
    graph = _graph(2)
    assert _lowered_configs(model, graph, 0, EVERY[model]) > 1
    for size in range(1, len(SIZES[model])):
        assert _lowered_configs(model, graph, size, 7 * EVERY[model]) >= 1


@pytest.mark.slow
@pytest.mark.exhaustive  # 2 minutes on 2 cores; the test above takes an even sample of the same matrix
@pytest.mark.parametrize("model", ["rgat", "hgt"])
def test_the_lowered_training_program_computes_what_the_interpreter_does_for_every_configuration(model):
    graph = _graph(2)
    for size in range(len(SIZES[model])):
        assert _lowered_configs(model, graph, size, 1) > 1


def test_what_the_forward_hands_to_the_backward_follows_autodiff_save():
    """``all`` saves edge buffers, ``nodes`` none (the backward recomputes them), ``input`` nothing
    at all; the handed-over memory shrinks in that order, and the gradients stay those of autograd
    (the test above runs the phases apart: ReferenceExecutor.run_training is forward, then backward)."""
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.ir.pipeline import compile_program

    graph = _graph(3)
    before = build_model("hgt", 8, 8, 2)
    held = {}
    for save in SAVE.choices:
        kp = compile_program(before, {"autodiff.save": save}, graph, training=True).kernels
        domains = {kp.buffers[b].domain for b in kp.saved}
        if save == "all":
            assert "edge" in domains
        elif save == "nodes":
            assert domains and "edge" not in domains
        else:
            assert set(kp.saved) <= {kp.output}, kp.saved
        params = init_params(kp, graph, dtype=torch.float64)
        x = torch.randn(graph.num_nodes(), 8, dtype=torch.float64)
        out, saved = ReferenceExecutor(kp, graph).run_forward(x, params)
        assert set(saved.buffers) == set(kp.saved)
        held[save] = saved.nbytes
    assert held["all"] > held["nodes"] > held["input"]
