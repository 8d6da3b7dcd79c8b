"""Tuned layers train through the generated backward: the training program's forward phase saves what
its backward phase reads; the gradients are autograd's of the reference layer; load_tuned(mode=...)
finds training schedules (or falls back to the inference one, with a warning)."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import torch

from rgtune.codegen.base import available_backends, create
from rgtune.data import HeteroGraph, load_dataset
from rgtune.data.synthetic import random_graph
from rgtune.db import TrialDatabase
from rgtune.ir.autodiff import SAVE
from rgtune.torch_layers import HGT, RGAT, RGCN
from rgtune.runtime import Layer, TunedScheduleWarning, export, load_exported, load_tuned
from _matrix import sampled

GRAPH = "synthetic:custom,nodes=120,edges=700,ntypes=2,rels=3,seed=2"
REFERENCE = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}
TRAINING_BACKENDS = [name for name, (ok, _) in available_backends().items()
                     if ok and name in ("reference", "cpu") and create(name).training != "none"]


def _heads(model: str) -> int:
    return 1 if model == "rgcn" else 2


@pytest.fixture(scope="module")
def graph() -> HeteroGraph:
    return load_dataset(GRAPH)


def _reference_grads(model: str, g: HeteroGraph, state: dict[str, torch.Tensor], x: torch.Tensor,
                     dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    ref = REFERENCE[model](g, x.shape[1], dout.shape[1], **({} if model == "rgcn" else {"heads": _heads(model)}))
    ref = ref.double()
    ref.load_state_dict({k: v.double() for k, v in state.items()})
    x64 = x.double().requires_grad_(True)
    out = ref(x64)
    out.backward(dout.double())
    return out.detach(), x64.grad, {n: p.grad for n, p in ref.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("backend", TRAINING_BACKENDS)
@pytest.mark.parametrize("model", sorted(REFERENCE))
def test_a_training_layer_gives_autograds_gradients_for_every_save_choice(model, backend, graph):
    torch.manual_seed(0)
    x = torch.randn(graph.num_nodes(), 8)
    dout = torch.randn(graph.num_nodes(), 8)
    for save in SAVE.choices:
        config = {"autodiff.save": save, "reorder.compose": "on"} if model == "hgt" else {"autodiff.save": save}
        layer = Layer(model, graph, 8, 8, _heads(model), config=config, backend=backend, mode="training")
        assert layer.backward_kind == "generated" and layer.mode == "training"
        assert layer.training_config["autodiff.save"] == save and layer.config == layer.training_config
        xg = x.clone().requires_grad_(True)
        out = layer(xg)
        out.backward(dout)
        want_out, want_dx, want = _reference_grads(model, graph, layer.state_dict(), x, dout)
        assert _rel(out.detach(), want_out) < 1e-5
        assert _rel(xg.grad, want_dx) < 1e-4, save
        for name, p in layer.named_parameters():
            assert p.grad is not None, (save, name)
            assert _rel(p.grad, want[name]) < 1e-4, (save, name, _rel(p.grad, want[name]))


def test_what_a_forward_saves_is_its_own_several_forwards_then_their_backwards(graph):
    """Two forwards before the backward (a layer used twice, gradient accumulation): each backward
    reads what its own forward saved."""
    torch.manual_seed(1)
    layer = Layer("hgt", graph, 8, 8, 2, backend="reference", mode="training")
    ref = HGT(graph, 8, 8, heads=2)
    ref.load_state_dict(layer.state_dict())
    x1, x2 = torch.randn(graph.num_nodes(), 8), torch.randn(graph.num_nodes(), 8)
    loss = (layer(x1) * layer(x2)).sum()
    loss.backward()
    (ref(x1) * ref(x2)).sum().backward()
    theirs = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-4, atol=1e-5), name


def test_retain_graph_runs_the_backward_twice(graph):
    layer = Layer("rgat", graph, 8, 8, 2, backend="reference")
    out = layer(torch.randn(graph.num_nodes(), 8)).sum()
    out.backward(retain_graph=True)
    first = [p.grad.clone() for p in layer.parameters()]
    out.backward()
    for a, p in zip(first, layer.parameters()):
        assert torch.allclose(p.grad, 2 * a, rtol=1e-5, atol=1e-6)


def test_an_inference_layer_trains_with_the_default_backward_knobs(graph):
    layer = Layer("hgt", graph, 8, 8, 2, backend="reference", config={"reorder.compose": "on"})
    assert layer.mode == "inference" and "autodiff.save" not in layer.config
    assert layer.training_config["reorder.compose"] == "on"
    assert layer.training_config["autodiff.save"] == SAVE.default
    assert set(layer.schedule()) == {"mode", "inference", "training", "provenance"}
    assert "mode='inference'" in repr(layer)


def test_gradcheck_float64_of_a_recomputing_training_schedule():
    g = random_graph((4, 5), num_relations=3, num_edges=16, seed=3, name="tiny")
    layer = Layer("hgt", g, 3, 4, 2, backend="reference", mode="training",
                        config={"autodiff.save": "nodes", "reorder.compose": "on"}).double()
    names = [n for n, _ in layer.named_parameters()]
    x = torch.randn(g.num_nodes(), 3, dtype=torch.float64, requires_grad=True)

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    params = tuple(p.detach().clone().requires_grad_(True) for p in layer.parameters())
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


def test_an_unknown_knob_or_mode_is_an_error(graph):
    with pytest.raises(ValueError, match="unknown knob 'autodiff.saved'"):
        Layer("rgcn", graph, 8, 8, config={"autodiff.saved": "all"}, backend="reference")
    with pytest.raises(ValueError, match="unknown mode 'train'"):
        Layer("rgcn", graph, 8, 8, backend="reference", mode="train")


# ---------------------------------------------------------------------- load_tuned(mode="training")
def _record(db: TrialDatabase, g: HeteroGraph, config: dict[str, Any], ms: float, mode: str) -> int:
    w = db.ensure_workload("rgat", g, create("reference").device_info(), in_dim=8, out_dim=8, heads=2,
                           backend="reference", mode=mode)
    t = db.start_trial(w, config)
    db.finish_trial(t, "ok", median_ms=ms, times_ms=[ms], max_error=1e-7)
    return t


def _load(db: TrialDatabase | None, g: HeteroGraph, mode: str) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TunedScheduleWarning)
        layer = load_tuned("rgat", g, 8, 8, 2, db=db, backend="reference", mode=mode)
    return layer, [str(w.message) for w in caught]


def test_load_tuned_training_uses_the_training_record_then_the_inference_one(tmp_path, graph):
    db = TrialDatabase(str(tmp_path / "r.db"))
    layer, said = _load(db, graph, "training")  # nothing recorded: the default, and the tune command
    assert layer.provenance["source"] == "default" and layer.mode == "training"
    assert any("no tuned training schedule" in m and "--mode training" in m for m in said)

    inference = _record(db, graph, {"compact.src": "pair"}, 1.0, "inference")
    layer, said = _load(db, graph, "training")  # the tuned forward, default backward knobs
    assert layer.provenance["trial_id"] == inference and layer.provenance["backward"] == "default knobs"
    assert layer.training_config["compact.src"] == "pair"
    assert layer.training_config["autodiff.save"] == SAVE.default
    assert any("best inference schedule" in m and "--mode training" in m for m in said)

    training = _record(db, graph, {"compact.src": "pair", "autodiff.save": "nodes"}, 3.0, "training")
    layer, said = _load(db, graph, "training")
    assert not said and layer.provenance["trial_id"] == training and layer.provenance["mode"] == "training"
    assert layer.training_config["autodiff.save"] == "nodes"
    layer, said = _load(db, graph, "inference")  # the modes' records do not mix
    assert layer.provenance["trial_id"] == inference and not said


def test_an_exported_training_schedule_loads_as_a_training_layer(tmp_path, graph):
    db = TrialDatabase(str(tmp_path / "r.db"))
    _record(db, graph, {"autodiff.save": "input"}, 2.0, "training")
    out = export(tmp_path / "exp", "rgat", graph, 8, 8, 2, db=db, backend="reference", mode="training")
    layer = load_exported(out, graph)
    assert layer.mode == "training" and layer.training_config["autodiff.save"] == "input"
    x = torch.randn(graph.num_nodes(), 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.backward_kind == "generated"


# ------------------------------------------------------------------ one schedule, two programs
@pytest.mark.parametrize("model,draws", sampled(["rgcn", "rgat", "hgt", "film"], 40, 200))
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_every_valid_point_of_a_training_space_builds_a_layer(model: str, draws: int, target: str) -> None:
    """A layer trained with a schedule also runs its inference program (a forward without gradients), so a
    training point is valid only if the inference program of its knobs is too; every valid one builds a
    layer (both programs: on the cpu target with the torch executor, which has its knobs; on cuda, the
    layer's checks of both programs, which need no GPU). AIFB, as where the gap was found."""
    from rgtune.ir.registry import build_model
    from rgtune.runtime.module import _compiled, _configs
    from rgtune.search_spaces import MODES, SearchSpace

    aifb = load_dataset("aifb")
    heads = 1 if model in ("rgcn", "film") else 2
    program = build_model(model, 16, 16, heads)
    spaces = {m: SearchSpace(program, aifb, target, mode=m) for m in MODES}
    rng = random.Random(f"{model}/{target}")
    valid = 0
    for _ in range(draws):
        point = spaces["training"].compile(spaces["training"].sample(rng))
        if not point.valid:
            assert all("inference program" not in p or "what a layer runs without gradients" in p
                       for p in point.problems)
            continue
        valid += 1
        inference, training = _configs(spaces, point.config)
        for mode, config in (("inference", inference), ("training", training)):
            _compiled(spaces[mode], config, f"{model} {mode}")  # raises on an invalid program
        if target == "cpu" and valid <= 5:  # and the layer itself, on the torch executor (no compiler)
            Layer(model, aifb, 16, 16, heads, config=point.config, mode="training", backend="reference")
    assert valid > draws // 4
