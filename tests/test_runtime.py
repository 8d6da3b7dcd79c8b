"""rgtune.runtime: load_tuned, tuned layers (state_dict, autograd), export / load_exported, the bench script."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from rgtune.codegen.base import available_backends, create
from rgtune.data import HeteroGraph, load_dataset
from rgtune.ir.models import build_model
from rgtune.torch_layers import HGT, RGAT, RGCN, RelationalLayer
from rgtune.cli import main as cli_main
from rgtune.runtime import (GraphMismatchError, Layer, NoTunedScheduleError, TunedScheduleWarning, export,
                            load_exported, load_tuned)
from rgtune.search_spaces import SearchSpace
from rgtune.db import TrialDatabase

GRAPH = "synthetic:custom,nodes=120,edges=700,ntypes=2,rels=3,seed=2"
OTHER_CONTENT = "synthetic:custom,nodes=120,edges=900,ntypes=2,rels=3,seed=2"  # same types, other edges
OTHER_TYPES = "synthetic:custom,nodes=120,edges=700,ntypes=3,rels=4,seed=2"
CPU = available_backends().get("cpu", (False, ""))[0]
FAST_BACKEND = "cpu" if CPU else "reference"
REFERENCE = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}
MODELS = ("rgcn", "rgat", "hgt")


def _heads(model: str) -> int:
    return 1 if model == "rgcn" else 2


def _reference(model: str, g: HeteroGraph, i: int, o: int, heads: int = 1) -> RelationalLayer:
    kwargs = {} if model == "rgcn" else {"heads": heads}
    return REFERENCE[model](g, i, o, **kwargs)


def _quiet_layer(model: str, g: HeteroGraph, i: int = 8, o: int = 8, backend: str = "reference", **kw: Any) -> Layer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        return load_tuned(model, g, i, o, _heads(model), db=None, backend=backend, **kw)


@pytest.fixture(scope="module")
def graph() -> HeteroGraph:
    return load_dataset(GRAPH)


@pytest.fixture(scope="module")
def tiny() -> HeteroGraph:
    """Small enough for gradcheck in float64."""
    from rgtune.data.synthetic import random_graph

    return random_graph((4, 5), num_relations=3, num_edges=16, seed=3, name="tiny")


def _record(db: TrialDatabase, model: str, g: HeteroGraph, config: dict[str, Any], ms: float, *,
            backend: str = "reference", device: dict[str, Any] | None = None, size: tuple[int, int] = (8, 8)) -> int:
    """A verified trial, as the tuner would record it (device: this machine's, unless given)."""
    info = device or create(backend).device_info()
    w = db.ensure_workload(model, g, info, in_dim=size[0], out_dim=size[1], heads=_heads(model), backend=backend)
    t = db.start_trial(w, config)
    db.finish_trial(t, "ok", median_ms=ms, times_ms=[ms], max_error=1e-7)
    return t


def _non_default(model: str, g: HeteroGraph, target: str = "cpu") -> dict[str, Any]:
    """A valid configuration that differs from the default in an IR knob."""
    space = SearchSpace(build_model(model, 8, 8, _heads(model)), g, target)
    default = space.default()
    for cfg in space.ir_configs():
        if cfg != default and space.compile(cfg).valid:
            return cfg
    raise AssertionError("no non-default configuration")


# ---------------------------------------------------------------------- load_tuned
def test_without_a_record_the_default_schedule_and_a_warning_with_the_tune_command(tmp_path, graph):
    db = tmp_path / "results.db"
    with pytest.warns(TunedScheduleWarning) as caught:
        layer = load_tuned("rgcn", graph, 8, 8, db=str(db), backend="reference")
    text = str(caught[0].message)
    assert f"tune --model rgcn --dataset {GRAPH} --hidden 8 --backend reference --db {db}" in text
    assert "no database at" in text and not db.exists()  # looking up never creates a database
    assert layer.provenance["source"] == "default"
    assert layer.config == SearchSpace(build_model("rgcn", 8, 8), graph, "cpu").default()

    TrialDatabase(str(db)).close()  # an empty database: the same, with another reason
    with pytest.warns(TunedScheduleWarning, match="has no verified trial"):
        load_tuned("rgcn", graph, 8, 8, db=str(db), backend="reference")


def test_different_in_and_out_sizes_name_the_tune_command_with_both_sizes(graph):
    with pytest.warns(TunedScheduleWarning, match=r"tune --model rgat --dataset \S+ --in-dim 8 --out-dim 4 --heads 2"):
        load_tuned("rgat", graph, 8, 4, 2, db=None, backend="reference")


def test_the_best_record_of_this_device_is_used_without_warning(tmp_path, graph):
    db = TrialDatabase(str(tmp_path / "r.db"))
    chosen = _non_default("hgt", graph)
    _record(db, "hgt", graph, SearchSpace(build_model("hgt", 8, 8, 2), graph, "cpu").default(), 2.0)
    best = _record(db, "hgt", graph, chosen, 1.0)
    _record(db, "hgt", graph, chosen, 0.1, device={"backend": "reference", "device": "a faster machine elsewhere"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)
        layer = load_tuned("hgt", graph, 8, 8, 2, db=db, backend="reference")
    assert layer.config == chosen and layer.provenance["trial_id"] == best
    assert layer.provenance["same_device"] and f"trial {best}" in repr(layer)


def test_a_record_of_another_device_is_used_with_a_warning(tmp_path, graph):
    db = TrialDatabase(str(tmp_path / "r.db"))
    tid = _record(db, "rgcn", graph, _non_default("rgcn", graph), 1.0,
                  device={"backend": "reference", "device": "another machine"})
    with pytest.warns(TunedScheduleWarning, match="another device.*to tune here, run `tune --model rgcn"):
        layer = load_tuned("rgcn", graph, 8, 8, db=db, backend="reference")
    assert layer.provenance["trial_id"] == tid and not layer.provenance["same_device"]


def test_a_graph_given_by_name_and_bad_arguments(graph):
    layer = _quiet_layer("rgcn", GRAPH)  # type: ignore[arg-type]
    assert layer.graph.content_hash == graph.content_hash
    with pytest.raises(ValueError, match="unknown model"):
        load_tuned("gcn", graph, db=None, backend="reference")
    with pytest.raises(ValueError, match="heads=1"):
        Layer("rgcn", graph, 8, 8, 2)


# ---------------------------------------------------------------------- the module
@pytest.mark.parametrize("model", MODELS)
def test_state_dict_moves_between_reference_and_tuned_layers(model, graph):
    torch.manual_seed(0)
    ref = _reference(model, graph, 8, 8, _heads(model))
    tuned = _quiet_layer(model, graph, backend=FAST_BACKEND)
    assert isinstance(tuned, Layer) and tuned.model == model
    assert set(tuned.state_dict()) == set(ref.state_dict())
    assert {k: v.shape for k, v in tuned.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    tuned.load_state_dict(ref.state_dict())
    x = torch.randn(graph.num_nodes(), 8)
    torch.testing.assert_close(tuned(x), ref(x), rtol=1e-4, atol=1e-5)
    back = _reference(model, graph, 8, 8, _heads(model))
    back.load_state_dict(tuned.state_dict())
    torch.testing.assert_close(back(x), ref(x))


@pytest.mark.parametrize("model", MODELS)
def test_dict_input_gives_a_dict_with_the_tensor_outputs(model, graph):
    layer = _quiet_layer(model, graph, backend=FAST_BACKEND)
    x = torch.randn(graph.num_nodes(), 8)
    flat = layer(x)
    per_type = layer(graph.split_nodes(x))
    assert isinstance(per_type, dict) and set(per_type) == set(graph.ntypes)
    torch.testing.assert_close(graph.flatten_nodes(per_type), flat)


@pytest.mark.parametrize("model", MODELS)
def test_gradcheck_float64_through_the_kernel_function(model, tiny):
    layer = _quiet_layer(model, tiny, 3, 4 if model != "hgt" else 4).double()
    names = [n for n, _ in layer.named_parameters()]
    x = torch.randn(tiny.num_nodes(), 3, dtype=torch.float64, requires_grad=True)

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    params = tuple(p.detach().clone().requires_grad_(True) for p in layer.parameters())
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


@pytest.mark.skipif(not CPU, reason="the cpu backend cannot run here")
@pytest.mark.parametrize("model", MODELS)
def test_cpu_float32_gradients_match_float64(model, graph):
    torch.manual_seed(1)
    tuned = _quiet_layer(model, graph, backend="cpu")
    ref = _reference(model, graph, 8, 8, _heads(model)).double()
    ref.load_state_dict({k: v.double() for k, v in tuned.state_dict().items()})
    x = torch.randn(graph.num_nodes(), 8)
    g = torch.randn(graph.num_nodes(), 8)
    x32, x64 = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    tuned(x32).backward(g)
    ref(x64).backward(g.double())
    by_name = dict(ref.named_parameters())
    for name, p32 in tuned.named_parameters():
        p64 = by_name[name]
        if p64.grad is None:
            assert p32.grad is None, name
            continue
        err = float((p32.grad.double() - p64.grad).abs().max() / p64.grad.abs().max().clamp_min(1e-12))
        assert err < 1e-4, (name, err)
    assert float((x32.grad.double() - x64.grad).abs().max() / x64.grad.abs().max()) < 1e-4


def test_a_training_step_decreases_the_loss(graph):
    torch.manual_seed(0)
    layer = _quiet_layer("rgcn", graph, 8, 4, backend=FAST_BACKEND)
    x = torch.randn(graph.num_nodes(), 8)
    y = torch.randint(0, 4, (graph.num_nodes(),))
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(layer(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_inference_keeps_no_autograd_graph(graph):
    layer = _quiet_layer("rgcn", graph, backend=FAST_BACKEND)
    with torch.no_grad():
        out = layer(torch.randn(graph.num_nodes(), 8))
    assert out.grad_fn is None
    assert layer(torch.randn(graph.num_nodes(), 8)).grad_fn is not None


def test_deepcopy_and_torch_save_rebuild_the_kernels(tmp_path, graph):
    import copy

    layer = _quiet_layer("rgat", graph, backend=FAST_BACKEND)
    x = torch.randn(graph.num_nodes(), 8)
    twin = copy.deepcopy(layer)
    assert twin._runner is not layer._runner and twin.config == layer.config
    torch.testing.assert_close(twin(x), layer(x))
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    torch.testing.assert_close(loaded(x), layer(x))


# ---------------------------------------------------------------------- errors before any kernel runs
def test_wrong_shape_dtype_device_are_clear_errors(graph):
    layer = _quiet_layer("hgt", graph, backend=FAST_BACKEND)
    n = graph.num_nodes()
    with pytest.raises(ValueError, match="x has 119 rows but the graph has 120 nodes"):
        layer(torch.randn(n - 1, 8))
    with pytest.raises(ValueError, match="wrong feature size: expected in_dim=8, got 7"):
        layer(torch.randn(n, 7))
    with pytest.raises(ValueError, match="dtype torch.float64, expected torch.float32"):
        layer(torch.randn(n, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="is on meta, expected cpu"):
        layer(torch.randn(n, 8, device="meta"))
    with pytest.raises(ValueError, match="missing node type"):
        layer({graph.ntypes[0]: torch.randn(graph.num_nodes(graph.ntypes[0]), 8)})


@pytest.mark.skipif(not CPU, reason="the cpu backend cannot run here")
def test_float64_on_the_cpu_backend_says_to_use_reference(graph):
    layer = _quiet_layer("rgcn", graph, backend="cpu")
    with pytest.raises(TypeError, match="float32.*backend='reference'"):
        layer.double()  # refused where the conversion is asked
    with pytest.raises(ValueError, match="float32.*backend='reference'"):
        layer(torch.randn(graph.num_nodes(), 8, dtype=torch.float64))


# ---------------------------------------------------------------------- export
@pytest.fixture
def exported(tmp_path, graph) -> tuple[Path, Path, int]:
    """A database with one verified trial and its export (``--backend`` the fast one)."""
    db_path = tmp_path / "results.db"
    db = TrialDatabase(str(db_path))
    tid = _record(db, "hgt", graph, _non_default("hgt", graph), 1.5, backend=FAST_BACKEND)
    db.close()
    out = tmp_path / "tuned_hgt"
    rc = cli_main(["export", "--model", "hgt", "--dataset", GRAPH, "--hidden", "8", "--heads", "2",
                   "--backend", FAST_BACKEND, "--db", str(db_path), "-o", str(out)])
    assert rc == 0
    return out, db_path, tid


def test_export_folder_contents(exported, graph):
    out, _, tid = exported
    schedule = json.loads((out / "schedule.json").read_text())
    prov = json.loads((out / "provenance.json").read_text())
    assert schedule["format"] == "rgtune-export" and schedule["model"] == "hgt" and schedule["heads"] == 2
    assert schedule["graph"]["content_hash"] == graph.content_hash and schedule["backend"] == FAST_BACKEND
    assert prov["trial_id"] == tid and prov["median_ms"] == 1.5 and prov["rgtune_version"]
    assert prov["exported_on"]["device_info"]["backend"] == FAST_BACKEND and prov["exported_at"]
    for name, meta in schedule["sources"].items():
        assert (out / meta["path"]).read_text()
    readme = (out / "README.txt").read_text()
    assert "load_exported('tuned_hgt', graph)" in readme and str(out.parent) not in readme
    assert (out / "kernel_program.txt").read_text().startswith("kernels hgt")


def test_exported_folder_loads_in_a_fresh_process_without_a_database(tmp_path, exported, graph):
    out, db_path, tid = exported
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)
        here = load_exported(out, graph)
    assert here.provenance["trial_id"] == tid and here.config == json.loads((out / "schedule.json").read_text())["config"]
    torch.manual_seed(0)
    here.reset_parameters()
    x = torch.randn(graph.num_nodes(), 8)
    torch.save({"state": here.state_dict(), "x": x}, tmp_path / "inputs.pt")
    db_path.unlink()
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = textwrap.dedent(f"""
        import warnings, torch
        from rgtune.runtime import TunedScheduleWarning, load_exported
        warnings.simplefilter("error", TunedScheduleWarning)  # on the machine that tuned it: nothing to warn
        layer = load_exported({str(out)!r}, {GRAPH!r})
        saved = torch.load({str(tmp_path / 'inputs.pt')!r})
        layer.load_state_dict(saved["state"])
        torch.save(layer(saved["x"]), "out.pt")
        print(layer.provenance["trial_id"], layer.source_hash)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tid), here.source_hash]
    torch.testing.assert_close(torch.load(work / "out.pt"), here(x))
    assert sorted(p.name for p in work.iterdir()) == ["out.pt"]  # no database was created


def test_load_exported_refuses_other_types_and_warns_on_other_content(exported):
    out, _, _ = exported
    with pytest.raises(GraphMismatchError, match="types differ.*unexpected"):
        load_exported(out, OTHER_TYPES)
    with pytest.warns(TunedScheduleWarning, match="same types but other content"):
        layer = load_exported(out, OTHER_CONTENT)
    assert layer(torch.randn(layer.num_nodes, 8)).shape == (layer.num_nodes, 8)


def test_load_exported_warns_when_regenerated_sources_differ(exported, graph):
    out, _, _ = exported
    path = out / "schedule.json"
    schedule = json.loads(path.read_text())
    path.write_text(json.dumps({**schedule, "source_hash": "0" * 16}))
    with pytest.warns(TunedScheduleWarning, match="regenerated kernel sources differ"):
        load_exported(out, graph)


def test_export_needs_a_record_unless_defaults_are_allowed(tmp_path, graph, capsys):
    with pytest.raises(NoTunedScheduleError, match="tune --model rgat"):
        export(tmp_path / "x", "rgat", graph, 8, 8, 2, db=None, backend="reference")
    assert cli_main(["export", "--model", "rgat", "--dataset", GRAPH, "--hidden", "8", "--db", str(tmp_path / "no.db"),
                     "--backend", "reference", "-o", str(tmp_path / "x")]) == 1
    assert "--allow-default" in capsys.readouterr().err
    with pytest.warns(TunedScheduleWarning):
        out = export(tmp_path / "x", "rgat", graph, 8, 8, 2, db=None, backend="reference", allow_default=True)
    assert json.loads((out / "provenance.json").read_text())["schedule"] == "default"
    with pytest.raises(FileExistsError, match="overwrite"):
        export(tmp_path / "x", "rgat", graph, 8, 8, 2, db=None, backend="reference", allow_default=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an rgtune export"):
        export(tmp_path / "full", "rgat", graph, 8, 8, 2, db=None, backend="reference", allow_default=True)


@pytest.mark.slow
def test_a_module_exported_for_aifb_does_not_load_onto_mutag(tmp_path):
    aifb, mutag = load_dataset("aifb"), load_dataset("mutag")
    with pytest.warns(TunedScheduleWarning):
        out = export(tmp_path / "aifb_rgcn", "rgcn", aifb, 16, 16, db=None, backend="reference", allow_default=True)
    with pytest.raises(GraphMismatchError, match="tuned for graph 'aifb'"):
        load_exported(out, mutag)


@pytest.mark.slow
def test_load_tuned_finds_what_the_tuner_recorded(tmp_path, graph):
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.workload import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    db = TrialDatabase(str(tmp_path / "results.db"))
    s = Tuner(Workload("rgat", GRAPH, 8, 8, 2, FAST_BACKEND), db,
              TuneOptions(trials=3, seed=0, progress=False,
                          measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0))).run()
    assert s.best_trial_id is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)  # the worker's device fingerprint is this process's
        layer = load_tuned("rgat", graph, 8, 8, 2, db=db, backend=FAST_BACKEND)
    assert layer.provenance["trial_id"] == s.best_trial_id and layer.config == s.best_knobs


# ---------------------------------------------------------------------- bench
def test_bench_prints_a_table_and_replaces_its_rows(tmp_path, capsys):
    from rgtune.bench import BEGIN, END
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nhand-written text that must survive\n")
    base = ["--dataset", GRAPH, "--hidden", "8", "--backend", "reference", "--db", str(tmp_path / "none.db"),
            "--repeats", "1", "--warmup", "0", "--threads", "1", "--output", str(md),
            "--impls", "rgtune,lowering"]  # a process each: the libraries' rows are tested in test_bench
    for model in ("rgcn", "rgcn", "hgt"):
        assert cli_main(["bench", "--model", model, *base]) == 0
    out = capsys.readouterr().out
    assert "rgtune tuned (reference, default)" in out and "rgtune torch lowering" in out
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written text that must survive\n")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    rows = [ln for ln in text.splitlines() if ln.startswith("| rgcn |") or ln.startswith("| hgt |")]
    assert len(rows) == 4  # one main and one environment row per (model, dataset, sizes, backend)
    assert "`rgtune bench --model hgt" in text


def test_bench_writes_no_file_unless_asked(tmp_path, monkeypatch, capsys):
    """`rgtune bench` prints; only --write (or --output) updates a markdown file: a tracked BENCHMARKS.md in
    the working directory stays byte-identical otherwise."""
    from rgtune.cli.bench import _portable
    monkeypatch.chdir(tmp_path)
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    base = ["bench", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--backend", "reference", "--db",
            str(tmp_path / "none.db"), "--repeats", "1", "--warmup", "0", "--threads", "1", "--impls", "rgtune"]
    assert cli_main(base) == 0
    assert md.read_text() == "# Benchmarks\n" and "wrote the row" not in capsys.readouterr().out
    assert cli_main([*base, "--write"]) == 0
    assert md.read_text() != "# Benchmarks\n" and "wrote the row to BENCHMARKS.md" in capsys.readouterr().out
    assert _portable(["--write", "--model", "rgcn"]) == ["--model", "rgcn"]
    assert _portable(["--model", "rgcn", "--write", "x.md", "--hidden", "8"]) == ["--model", "rgcn", "--hidden", "8"]
    assert _portable(["--model", "rgcn", "--write"]) == ["--model", "rgcn"]


def test_bench_keeps_rows_written_before_the_memory_column(tmp_path):
    from rgtune.bench.report import _MAIN_HEADER, _MAIN_HEADER_V1, BEGIN, END, _md_row, write_benchmarks
    from rgtune.bench.layers import BenchResult, Impl
    md = tmp_path / "BENCHMARKS.md"
    old_row = ["hgt", "aifb", "64→64", "cuda", "trial 3", "1 / 2 / 3 / 4 / –", "5 / 6 / 7 / 8 / –", "16", "2026-11-24"]
    md.write_text(f"intro\n\n{BEGIN}\n{_md_row(_MAIN_HEADER_V1)}\n|---|\n{_md_row(old_row)}\n{END}\n")
    impl = Impl("rgtune", "rgtune tuned", None)
    impl.times = {"fwd": [1e-3], "fwd+bwd": [2e-3]}
    impl.peak_mb = {"fwd": 10.0, "fwd+bwd": 20.0}
    res = BenchResult("rgcn", "aifb", 64, 64, 1, "cpu", "default", 2, 1, [impl], {"cpu": "x", "cores": 2, "threads": 2},
                      {}, "rgtune bench", "2026-11-26")
    write_benchmarks(md, res)
    lines = md.read_text().splitlines()
    assert _md_row(_MAIN_HEADER) in lines and _md_row(_MAIN_HEADER_V1) not in lines
    old = next(ln for ln in lines if ln.startswith("| hgt | aifb |"))
    assert old == _md_row(old_row[:7] + ["– / – / – / – / –", "– / –"] + old_row[7:])  # kept: no memory, no floor
    new = next(ln for ln in lines if ln.startswith("| rgcn | aifb |"))
    assert "| 20 / – / – / – / – |" in new
