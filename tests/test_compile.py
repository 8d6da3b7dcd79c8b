"""torch.compile of models made of rgtune layers: one graph with no break (the kernels are custom ops,
:mod:`rgtune.runtime.ops`), the eager outputs and gradients, the layers' kernels doing the work."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch

from rgtune.data.synthetic import random_graph
from rgtune.runtime.module import Layer

GRAPH = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)


class TwoLayers(torch.nn.Module):
    """A 2-layer model as users write one: layer, ReLU (per node type for dict inputs), layer."""

    def __init__(self, model: str, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.first = Layer(model, GRAPH, 4, 8, backend="cpu", mode="training", config=config)
        self.second = Layer(model, GRAPH, 8, 3, backend="cpu", mode="training")

    def forward(self, x: Any) -> Any:
        h = self.first(x)
        h = {t: torch.relu(v) for t, v in h.items()} if isinstance(h, dict) else torch.relu(h)
        return self.second(h)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()  # the tests compile the same forward for other layers: no recompile limit
    yield
    torch._dynamo.reset()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_a_two_layer_model_traces_into_one_graph_with_no_break(model: str) -> None:
    m = TwoLayers(model)
    x = torch.randn(30, 4, requires_grad=True)
    explained = torch._dynamo.explain(m)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    with torch.no_grad():
        explained = torch._dynamo.explain(m)(x.detach())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    xs = {t: torch.randn(GRAPH.num_nodes(t), 4) for t in GRAPH.ntypes}  # a dict per node type
    explained = torch._dynamo.explain(m)(xs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("input_grad", [True, False], ids=["input-grad", "features"])
@pytest.mark.parametrize("model,config", [("rgcn", None), ("rgat", None), ("hgt", None),
                                          ("hgt", {"reorder.compose": "on"})],  # derived weights: folds in the backward
                         ids=["rgcn", "rgat", "hgt", "hgt-compose"])
def test_compiled_training_gives_the_eager_outputs_and_gradients(model: str, config: dict[str, Any] | None,
                                                                 input_grad: bool) -> None:
    torch.manual_seed(0)
    m = TwoLayers(model, config)
    x = torch.randn(30, 4, requires_grad=input_grad)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.square().sum().backward()
    got, got_dx = _grads(m), x.grad
    m.zero_grad(set_to_none=True)
    x.grad = None
    want = m(x)
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    expected = _grads(m)
    assert {n for n, g in got.items() if g is None} == {n for n, g in expected.items() if g is None}  # HGT's unused skip
    for name, g in expected.items():
        if g is not None:
            torch.testing.assert_close(got[name], g, msg=lambda m: f"{name}: {m}")
    if input_grad:
        torch.testing.assert_close(got_dx, x.grad)
    with torch.no_grad():  # the inference program, through its own op
        torch.testing.assert_close(compiled(x), m(x))


def test_the_compiled_graph_calls_each_layers_kernels_once() -> None:
    ops_called: list[str] = []

    def counting(gm: torch.fx.GraphModule, example: Any) -> Any:
        ops_called.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "rgtune" in str(n.target))
        return gm.forward

    m = TwoLayers("rgcn")
    compiled = torch.compile(m, fullgraph=True, backend=counting)
    compiled(torch.randn(30, 4, requires_grad=True))
    assert ops_called == ["rgtune.forward_for_backward.default"] * 2
    ops_called.clear()
    with torch.no_grad():
        compiled(torch.randn(30, 4))
    assert ops_called == ["rgtune.forward.default"] * 2


def test_inductor_compiles_the_model_and_its_backward() -> None:
    torch.manual_seed(0)
    m = TwoLayers("hgt")
    x = torch.randn(30, 4, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True)
    compiled(x).sum().backward()
    got = _grads(m)
    m.zero_grad(set_to_none=True)
    m(x).sum().backward()
    for name, g in _grads(m).items():
        if g is not None:
            torch.testing.assert_close(got[name], g)


def test_a_compiled_call_to_a_layer_that_is_gone_names_the_remedy() -> None:
    with pytest.raises(RuntimeError, match="compile the model again"):
        torch.ops.rgtune.forward(-1, torch.randn(30, 4), [torch.randn(3, 4, 8)])


def test_runner_numbers_differ_between_layers_and_are_not_counted() -> None:
    # torch.compile's disk caches key graphs by their text: a counted number would repeat in the next process
    numbers = {Layer("rgcn", GRAPH, 4, 8, backend="cpu")._runner.handle for _ in range(3)}
    assert len(numbers) == 3 and max(numbers) > 1000


# ---------------------------------------------------------------------------- drop-in modules
class _PyGTwoLayers(torch.nn.Module):
    """A PyG user's 2-layer model, its import line changed to rgtune's."""

    def __init__(self, conv: str, **kwargs: Any) -> None:
        import rgtune.nn.pyg as nn

        super().__init__()
        heads = kwargs.get("heads", 1)
        self.first = getattr(nn, conv)(8, 16, 3, db=None, **kwargs)
        self.second = getattr(nn, conv)(16 * heads, 4, 3, db=None)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x, edge_index, edge_type)), edge_index, edge_type)


@pytest.mark.filterwarnings("ignore::rgtune.runtime._lookup.TunedScheduleWarning")
@pytest.mark.parametrize("conv, kwargs", [("RGCNConv", {"num_bases": 2}), ("RGATConv", {"heads": 2}), ("FiLMConv", {})])
def test_a_pyg_model_of_drop_ins_compiles_with_no_break_and_gives_the_eager_numbers(conv: str, kwargs: dict[str, Any],
                                                                                    monkeypatch) -> None:
    import rgtune.nn.pyg._edge_type as edge_type_form  # where the homogeneous convs build their graphs
    from rgtune.runtime import ops

    torch.manual_seed(0)
    m = _PyGTwoLayers(conv, **kwargs)
    gen = torch.Generator().manual_seed(1)
    x, edge_index, edge_type = torch.randn(30, 8), torch.randint(0, 30, (2, 120), generator=gen), \
        torch.randint(0, 3, (120,), generator=gen)
    explained = torch._dynamo.explain(m)(x, edge_index, edge_type)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    builds = []
    build = edge_type_form.from_pyg_homogeneous

    def counted(*args: Any, **kw: Any) -> Any:
        builds.append(args)
        return build(*args, **kw)

    monkeypatch.setattr(edge_type_form, "from_pyg_homogeneous", counted)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        m.zero_grad(set_to_none=True)
        out = compiled(x, edge_index, edge_type)
        out.square().sum().backward()
    assert builds == []  # the graph of these tensors was built once (by explain's run) and found again
    got = _grads(m)
    m.zero_grad(set_to_none=True)
    want = m(x, edge_index, edge_type)
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for name, g in _grads(m).items():
        torch.testing.assert_close(got[name], g, msg=lambda msg: f"{name}: {msg}")
    assert not ops._SAVED  # every forward's state went with its backward
    compiled(x, edge_index, edge_type)  # a forward whose output is dropped without a backward
    assert not ops._SAVED  # its state went with its autograd graph


@pytest.mark.filterwarnings("ignore::rgtune.runtime._lookup.TunedScheduleWarning")
def test_a_pyg_hgt_model_compiles_with_no_break_and_gives_the_eager_numbers() -> None:
    from rgtune.nn.pyg import HGTConv
    from rgtune.runtime import ops

    metadata = (["paper", "author"], [("author", "writes", "paper"), ("paper", "cites", "paper"),
                                      ("paper", "rev_writes", "author")])  # PyG's order, not sorted
    gen = torch.Generator().manual_seed(2)
    x = {"paper": torch.randn(20, 8, generator=gen), "author": torch.randn(12, 8, generator=gen)}
    edges = {("author", "writes", "paper"): torch.stack([torch.randint(0, 12, (40,), generator=gen),
                                                         torch.randint(0, 20, (40,), generator=gen)]),
             ("paper", "cites", "paper"): torch.randint(0, 20, (2, 30), generator=gen)}  # one relation without edges

    class TwoHGT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = HGTConv(8, 8, metadata, heads=2, db=None), HGTConv(8, 4, metadata, db=None)

        def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
            h = {t: torch.relu(v) for t, v in self.first(x_dict, edge_index_dict).items()}
            return self.second(h, edge_index_dict)

    torch.manual_seed(0)
    m = TwoHGT()
    explained = torch._dynamo.explain(m)(x, edges)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    out = compiled(x, edges)
    sum(v.square().sum() for v in out.values()).backward()
    got = _grads(m)
    m.zero_grad(set_to_none=True)
    want = m(x, edges)
    sum(v.square().sum() for v in want.values()).backward()
    assert set(out) == set(want)
    for t in want:
        torch.testing.assert_close(out[t], want[t])
    for name, g in _grads(m).items():
        if g is not None:
            torch.testing.assert_close(got[name], g, msg=lambda msg: f"{name}: {msg}")
    assert not ops._SAVED
