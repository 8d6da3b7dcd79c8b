"""The model registry, model options and the generic layer.

A model is a name, a builder of its IR program and the builder's options; everything that names a
model goes through :mod:`rgtune.ir.registry`. The acceptance test registers a model that exists only
here, tunes it, loads the best schedule and trains it, with nothing else in the package changed.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rgtune
from rgtune.data import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.db import TrialDatabase
from rgtune.ir.program import IRError, ProgramBuilder
from rgtune.ir.registry import (ModelOptionError, Option, UnknownModelError, list_models, model_spec, parse_key,
                                register_model, unregister_model)
from rgtune.runtime import GraphMismatchError, Layer, load_tuned

ROOT = Path(__file__).resolve().parents[1]
SPEC = "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3,seed=5"


def gated_mean(in_dim: int, out_dim: int, heads: int = 1, *, gate: bool = True, scale: float = 1.0):
    """A model that exists only in this test: ``h'_i = sum_r mean_j sigmoid-gated (h_j W_r)``, plus a root."""
    p = ProgramBuilder("gated_mean", in_dim, heads)
    msg = p.typed_linear(p.src(p.x), "weight", out=(1, out_dim), by="rel")
    if gate:
        msg = p.mul(msg, p.gelu(p.param("gate", like=msg, dim=out_dim)))
    msg = p.scale(p.mul(msg, p.inv_dst_rel_degree()), scale)
    return p.finish(p.add(p.linear(p.x, "root", out=(1, out_dim), bias="bias"), p.aggregate(msg)))


@pytest.fixture
def registered():
    spec = register_model("gated_mean", gated_mean)
    yield spec
    unregister_model("gated_mean")


# ---------------------------------------------------------------------- the acceptance test
@pytest.mark.slow
def test_a_model_defined_in_a_test_is_tuned_loaded_and_trained(registered, tmp_path):
    db = str(tmp_path / "results.db")
    summary = rgtune.tune("gated_mean", SPEC, options={"scale": 0.5}, hidden=8, trials=5, db=db, backend="cpu",
                          mode="training", seed=0, progress=False, confirm_top=0, cost_model=False)
    assert summary.measured == 5 and summary.best_ms is not None
    layer = load_tuned("gated_mean", SPEC, 8, 8, db=db, backend="cpu", mode="training", options={"scale": 0.5})
    assert layer.provenance["source"] == "database" and layer.provenance["options"] == "scale=0.5"
    assert isinstance(layer, Layer) and set(layer.state_dict()) == {"weight", "gate", "root", "bias"}
    assert layer.backward_kind == "generated"
    x = torch.randn(layer.graph.num_nodes(), 8)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    loss = layer(x).square().mean()
    loss.backward()
    opt.step()
    assert all(not torch.equal(before[k], v) for k, v in layer.state_dict().items())
    # the same model with other options is another workload: nothing recorded for it
    with TrialDatabase(db) as database:
        (w,) = database.workloads(model="gated_mean")
        assert w.options == "scale=0.5" and w.num_ok == 5


def test_the_worker_rebuilds_a_model_it_has_never_seen(registered):
    """The measurement worker is a fresh (spawned) process that receives the workload pickled: it imports
    the builder by the path the parent's registry recorded (the user's own command made the workload)."""
    assert registered.source == f"{__name__}:gated_mean"
    from rgtune.tuner.workload import Workload

    w = Workload("gated_mean", SPEC, 4, 4, 1, "reference", options={"gate": False})
    assert w.model_source == registered.source
    code = (f"import pickle, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "w = pickle.loads(sys.stdin.buffer.read()); print(sorted(w.program().state_params()))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(w), capture_output=True, cwd=ROOT,
                         check=True)
    assert out.stdout.decode().strip() == "['bias', 'root', 'weight']"


# ---------------------------------------------------------------------- options
def test_options_come_from_the_builder_and_are_checked(registered):
    assert [(o.name, o.type, o.default) for o in registered.options] == [("gate", bool, True), ("scale", float, 1.0)]
    assert registered.key({"gate": "false", "scale": "1"}) == "gate=False"
    assert registered.key({}) == "" and registered.key("scale=2") == "scale=2.0"
    assert parse_key("gate=False,scale=2.0") == {"gate": "False", "scale": "2.0"}
    with pytest.raises(ModelOptionError, match=r"has no option 'gates'; its options: gate \(bool, default True\), "
                                               r"scale \(float, default 1.0\)"):
        registered.resolve({"gates": True})
    with pytest.raises(ModelOptionError, match=r"option scale='big' is not a float"):
        registered.resolve({"scale": "big"})
    with pytest.raises(ModelOptionError, match=r"option gate='maybe' is not a bool"):
        registered.resolve({"gate": "maybe"})
    choice = Option("norm", str, "destination", ("destination", "relation"))
    with pytest.raises(ModelOptionError, match=r"norm='sum' is not valid; choose one of \['destination', 'relation'\]"):
        choice.check("sum", "m")


def test_unknown_models_and_names(registered):
    assert list_models()[:3] == ["rgcn", "rgat", "hgt"] and "gated_mean" in list_models()
    with pytest.raises(UnknownModelError, match=r"unknown model 'gcn'; choose one of \['rgcn', 'rgat', 'hgt'"):
        model_spec("gcn")
    with pytest.raises(UnknownModelError, match=r"cannot import 'no_such_module:f'"):
        model_spec("no_such_module:f")
    assert model_spec("RGCN").name == "rgcn"
    with pytest.raises(IRError, match="already registered"):
        register_model("rgcn", gated_mean)
    with pytest.raises(IRError, match="non-empty string without spaces"):
        register_model("a b", gated_mean)


def test_a_model_named_by_its_import_path(tmp_path):
    """``package.module:builder`` needs no registration: the path is the name."""
    name = f"{__name__}:gated_mean"
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    layer = Layer(name, g, 4, 4, options={"gate": False})
    assert layer.model == name and set(layer.state_dict()) == {"weight", "root", "bias"}
    unregister_model(name)


def test_builtin_options_and_heads():
    with pytest.raises(IRError, match="expected heads=1, got 2"):
        model_spec("rgcn").build(8, 8, 2)
    with pytest.raises(IRError, match="in_dim must be a positive int"):
        model_spec("hgt").build(0, 8)


# ---------------------------------------------------------------------- the generic layer
def test_the_layer_creates_the_programs_params_as_declared():
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    layer = Layer("hgt", g, 8, 8, heads=2)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes["k_weight"] == (2, 8, 8) and shapes["w_att"] == (3, 2, 4, 4) and shapes["skip"] == (2,)
    assert torch.equal(layer.mu, torch.ones(3, 2)) and torch.equal(layer.skip, torch.ones(2))
    assert torch.equal(layer.k_bias, torch.zeros(2, 8)) and layer.k_weight.abs().max() <= (6 / 16) ** 0.5
    layer.reset_parameters()
    assert torch.equal(layer.mu, torch.ones(3, 2))


def test_a_layer_from_a_program_and_from_a_name_agree():
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    by_name = Layer("rgat", g, 8, 8, heads=2)
    by_program = Layer(model_spec("rgat").build(8, 8, 2), g)
    by_program.load_state_dict(by_name.state_dict())
    x = torch.randn(30, 8)
    torch.testing.assert_close(by_program(x), by_name(x))
    with pytest.raises(ValueError, match="in_dim=4 differs from the program's in_dim=8"):
        Layer(model_spec("rgat").build(8, 8, 2), g, in_dim=4)


def test_the_graph_may_change_per_call():
    """One set of parameters, a graph per call (a sampled subgraph): the same numbers as a layer bound
    to that graph; a graph of other types is refused."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    sub = HeteroGraph({t: g.num_nodes(t) for t in g.ntypes},
                      {c: tuple(e[::2] for e in g.edges(c)) for c in g.canonical_etypes})
    layer = Layer("hgt", g, 8, 8, heads=2, backend="cpu")
    bound = Layer("hgt", sub, 8, 8, heads=2, backend="cpu")
    bound.load_state_dict(layer.state_dict())
    x = torch.randn(30, 8, requires_grad=True)
    out = layer(x, graph=sub)
    torch.testing.assert_close(out, bound(x))
    out.sum().backward()
    assert x.grad is not None and layer.k_weight.grad is not None
    other = random_graph((10, 20), num_relations=2, num_edges=100, seed=0)
    with pytest.raises(GraphMismatchError, match="other node or edge types"):
        layer(torch.randn(30, 8), graph=other)


# ---------------------------------------------------------------------- the CLI and the database
def test_the_cli_takes_model_options(tmp_path, registered):
    from rgtune.cli import main

    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(SystemExit):
        main(["show", "--model", "nope", "--dataset", SPEC])
    assert main(["show", "--model", "rgcn", "--dataset", SPEC, "--hidden", "8"]) == 0
    rc = main(["best", "--model", "rgcn", "--model-opt", "num_bases=3", "--db", db])
    assert rc != 0  # rgcn has no such option (yet): a one-line error naming the valid ones


def test_no_model_name_outside_the_model_definitions_and_fixtures():
    """rgcn, rgat and hgt are named in code only where they are defined (the IR builders), in the
    fixtures that pin them to PyG and DGL (rgtune/torch_layers, the bench's baselines) and in the drop-in
    modules that are PyG's and DGL's conv modules (rgtune/nn/pyg/, rgtune/nn/dgl.py); docstrings (their
    examples) may use them."""
    import ast

    allowed = {"rgtune/ir/models.py", "rgtune/bench/baselines.py", "rgtune/nn/dgl.py",
               *(f"rgtune/nn/pyg/{p.name}" for p in (ROOT / "rgtune/nn/pyg").glob("*.py"))}
    names = {"rgcn", "rgat", "hgt"}
    offenders = []
    for path in sorted((ROOT / "rgtune").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed or rel.startswith("rgtune/torch_layers/"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                words = set(re.findall(r"[a-z]+", node.value.lower()))
                if node.value.lower() in names or (words & names and len(node.value) < 40):
                    offenders.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_exports_keep_loading_and_carry_the_options(tmp_path):
    """An export names the model's options; one written before options existed (no ``options`` key) loads
    as the model without them."""
    import json
    import warnings

    from rgtune.runtime import export, load_exported

    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = export(tmp_path / "bases", "rgcn", g, 8, 8, db=None, backend="reference", options={"num_bases": 2},
                     allow_default=True)
        plain = export(tmp_path / "plain", "rgcn", g, 8, 8, db=None, backend="reference", allow_default=True)
    schedule = json.loads((out / "schedule.json").read_text())
    assert schedule["options"] == "num_bases=2" and schedule["model_source"] == "rgtune.ir.models:rgcn"
    assert "options={'num_bases': '2'}" in (out / "README.txt").read_text()
    layer = load_exported(out, g)
    assert layer.options["num_bases"] == 2 and set(layer.state_dict()) == {"weight", "comp", "root", "bias"}
    old = json.loads((plain / "schedule.json").read_text())
    del old["options"], old["model_source"]  # as written before model options
    (plain / "schedule.json").write_text(json.dumps(old))
    from rgtune.ir.registry import model_spec
    defaults = model_spec("rgcn").resolve({})  # every option at its default
    assert load_exported(plain, g).options == defaults and defaults["num_bases"] is None and defaults["aggr"] == "mean"
