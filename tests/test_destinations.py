"""Programs for mini-batches (``LoweringPlan.destinations``): on a sampled block, each backend's output at the
destinations, input gradient and parameter gradients equal the float64 interpreter's, on the block and on a
whole graph (every node a destination), in inference and training, over a sample of every model's IR
configurations and random schedules (all of them with ``RGTUNE_EXHAUSTIVE=1``).

The interpreter computes every node's value; a destinations program computes the destinations' output
alone, so its output is compared with the interpreter's first ``num_dst_nodes`` rows, and the output's
gradient it is given (the destinations') is the interpreter's with zeros past them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from rgtune.codegen.base import create
from rgtune.data.sampling import NeighborSampler
from rgtune.data.synthetic import random_graph
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.kernels import DST_NODE
from rgtune.ir.registry import build_model
from rgtune.search_spaces import MODES, SearchSpace

from _matrix import sampled

MODELS = {"rgcn": 1, "rgat": 2, "hgt": 2, "film": 1}
GRAPH = random_graph((60, 90, 30), num_relations=5, num_edges=1500, seed=3)
BLOCK = NeighborSampler(GRAPH, [4]).sample({GRAPH.ntypes[1]: torch.arange(20), GRAPH.ntypes[0]: torch.tensor([3, 1])},
                                           torch.Generator().manual_seed(0)).blocks[0]


def _configs(space: SearchSpace, stride: int) -> list[dict[str, Any]]:
    """Every ``stride``-th IR configuration (schedule at its defaults) and random schedules: two, or with
    every configuration (``stride`` 1) twelve."""
    rng = random.Random(0)
    return list(space.ir_configs())[::stride] + [space.sample(rng) for _ in range(12 if stride == 1 else 2)]


def _check(backend: str, model: str, mode: str, cfg: dict[str, Any], graph: Any, input_grad: bool = True,
           destinations: bool = True) -> None:
    """``input_grad=False``: the training program of the params' gradients alone, checked against the
    interpreter of the program with the input's gradient (the oracle does not prune)."""
    target = "cuda" if backend == "emulator" else "cpu"
    space = SearchSpace(build_model(model, 8, 8, MODELS[model]), GRAPH, target, mode, destinations, input_grad)
    point = space.compile(cfg)
    if not point.valid:
        return
    kp = point.kernels
    full = point if input_grad else SearchSpace(space.program, GRAPH, target, mode, destinations).compile(cfg)
    program = full.compiled.program
    torch.manual_seed(0)
    params = random_params(program, GRAPH)
    n_dst = getattr(graph, "num_dst_nodes", graph.num_nodes())
    x = torch.randn(graph.num_nodes(), 8, dtype=torch.float64)
    dout = torch.randn(n_dst, 8, dtype=torch.float64)
    padded = torch.cat([dout, dout.new_zeros(graph.num_nodes() - n_dst, 8)])
    want = Interpreter(program, graph, point.compiled.plan.layout).run(x, params, padded if mode == "training" else None)
    p32 = {k: v.float() for k, v in params.items()}
    if backend == "emulator":
        from rgtune.codegen.cuda.emulate import EmulatedProgram
        from rgtune.codegen.cuda.generate import generate

        built: Any = EmulatedProgram(kp, generate(kp, point.config).units, graph, "sm_90")
        kw: dict[str, Any] = {"fill": float("nan")}  # a row never written shows as NaN
    else:
        built, kw = create(backend).compile(kp, point.config).bind(graph), {}
    where = f"{model} {mode} on {graph.name} with {cfg}"
    if mode == "inference":
        got = {"output": built.run(x.float(), p32, **kw)}
    else:
        out, saved = built.run_forward(x.float(), p32, **kw)
        dx, grads = built.run_backward(x.float(), p32, saved, dout.float(), **kw)
        got = {"output": out, "input gradient": dx, **grads}
        assert sorted(grads) == sorted(want.param_grads), where
        for name, g in grads.items():
            assert torch.allclose(g.double(), want.param_grads[name], atol=1e-4), f"{where}: {name}"
        if input_grad:
            assert torch.allclose(dx.double(), want.input_grad, atol=1e-4), f"{where}: input gradient"
        else:
            assert dx is None and kp.input_grad is None, where
    assert got["output"].shape[0] == n_dst, where
    assert torch.allclose(got["output"].double(), want.output[:n_dst], atol=1e-4), f"{where}: output"


@pytest.mark.parametrize("model,stride", sampled(MODELS, {"rgcn": 5, "rgat": 71, "hgt": 251, "film": 13}, 1))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_batch_program_gives_the_destinations_what_the_interpreter_does(backend: str, model: str, stride: int,
                                                                          mode: str) -> None:
    space = SearchSpace(build_model(model, 8, 8, MODELS[model]), GRAPH, "cpu", mode, destinations=True)
    for cfg in _configs(space, stride):
        _check(backend, model, mode, cfg, BLOCK)


@pytest.mark.parametrize("model,stride", sampled(MODELS, {"rgcn": 9, "rgat": 97, "hgt": 401, "film": 26}, 1))
@pytest.mark.parametrize("mode", MODES)
def test_a_batch_program_on_the_cuda_emulator(model: str, stride: int, mode: str) -> None:
    from rgtune.codegen.cuda.emulate import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")
    space = SearchSpace(build_model(model, 8, 8, MODELS[model]), GRAPH, "cuda", mode, destinations=True)
    for cfg in list(space.ir_configs())[::stride]:
        _check("emulator", model, mode, cfg, BLOCK)


@pytest.mark.parametrize("model", ["rgcn", "hgt"])
def test_a_batch_program_on_a_whole_graph_is_the_whole_graph_program(model: str) -> None:
    """Every node is a destination: the guarded loads read everything, the output is every node's."""
    space = SearchSpace(build_model(model, 8, 8, MODELS[model]), GRAPH, "cpu", "training", destinations=True)
    for cfg in _configs(space, 1000):
        _check("cpu", model, "training", cfg, GRAPH)


def test_the_destinations_rows_are_what_only_destinations_need() -> None:
    """RGCN's training program: the output, its root term and the output's gradient are the destinations'
    rows, the input and its gradient every node's; a whole-graph program has no destinations' rows."""
    program = build_model("rgcn", 8, 8)
    kp = SearchSpace(program, GRAPH, "cpu", "training", destinations=True).compile({}).kernels
    rows = {name: b.domain for name, b in kp.buffers.items()}
    assert rows[kp.output] == rows[kp.dout] == DST_NODE
    assert rows[kp.input] == rows[kp.input_grad] == "node"
    whole = SearchSpace(program, GRAPH, "cpu", "training").compile({}).kernels
    assert DST_NODE not in {b.domain for b in whole.buffers.values()}


@pytest.mark.parametrize("model,stride", sampled(MODELS, {"rgcn": 5, "rgat": 71, "hgt": 251, "film": 13}, 1))
@pytest.mark.parametrize("backend", ["reference", "emulator"])  # the CPU's: tests/test_minibatch.py, through a layer
def test_a_program_of_the_params_gradients_alone_gives_the_interpreters(backend: str, model: str, stride: int) -> None:
    # what a layer runs when its input needs no gradient, on a batch and on a whole graph
    if backend == "emulator":
        from rgtune.codegen.cuda.emulate import find_cxx

        if find_cxx() is None:
            pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")
    space = SearchSpace(build_model(model, 8, 8, MODELS[model]), GRAPH, "cuda" if backend == "emulator" else "cpu",
                        "training", destinations=True, input_grad=False)
    configs = _configs(space, stride)
    if backend != "reference" and stride > 1:  # compiled code: an IR configuration and a random schedule
        configs = configs[-2:]
    for cfg in configs:
        _check(backend, model, "training", cfg, BLOCK, input_grad=False)
        _check(backend, model, "training", cfg, GRAPH, input_grad=False, destinations=False)
