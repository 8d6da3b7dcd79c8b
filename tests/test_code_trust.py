"""Model paths read from an export folder or a database row are data: no module is imported for them
unless this process registered the model, this user signed the export, or the caller says
``trust_code``. Two planted export folders (one naming ``os:system``, one shipping a module beside
itself) and planted database rows are refused and run nothing (each test checks a marker file);
a user's own export of a model registered in their own module loads as before; the opt-in imports
the planted module, which is what it means.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from rgtune.costmodel import CostModel, GraphLoader, evaluate_holdout, fit_on_history
from rgtune.data import load_dataset
from rgtune.db import DeviceInfo, TrialDatabase
from rgtune.ir.registry import UntrustedModelError, unregister_model
from rgtune.ir.models import build_model
from rgtune.runtime import export, load_exported
from rgtune.runtime.export import SCHEDULE_FILE, SIGNATURE_FILE
from rgtune.search_spaces import SearchSpace

ROOT = Path(__file__).resolve().parents[1]
SPEC = "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3,seed=4"
OTHER = "synthetic:custom,nodes=300,edges=2500,ntypes=2,rels=3,seed=4"

#: a module that, when imported, writes a marker file (what a hostile module shipped in a folder would
#: do) and then offers a real builder, so that with the opt-in the load goes through
PLANTED_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("ran")
from rgtune.ir.models import rgcn as f
"""

#: a user's own model, registered when its module is imported (the README's "a model in your own code")
USER_MODULE = """
import rgtune
from rgtune.ir.program import ProgramBuilder


def mean_conv(in_dim, out_dim, heads=1, *, scale: float = 1.0):
    p = ProgramBuilder("mean_conv", in_dim)
    msg = p.typed_linear(p.src(p.x), "weight", out=(1, out_dim), by="rel")
    return p.finish(p.aggregate(p.scale(p.mul(msg, p.inv_dst_rel_degree()), scale)))


rgtune.register_model("user_mean_conv", mean_conv)
"""


def _exported(folder: Path, model: str = "rgcn") -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no database: the default schedule
        return export(folder, model, load_dataset(SPEC), 8, 8, db=None, backend="reference", allow_default=True)


def _plant(folder: Path, model: str, source: str | None) -> None:
    """Make the export name another model, as a hand-edited or hostile ``schedule.json`` would."""
    path = folder / SCHEDULE_FILE
    s = json.loads(path.read_text())
    s["model"], s["model_source"] = model, source
    path.write_text(json.dumps(s))


def _load_in_fresh_process(folder: Path, cwd: Path, *, trust: bool = False, env: dict[str, str] | None = None
                           ) -> subprocess.CompletedProcess[str]:
    """``load_exported`` as a script or notebook started in ``cwd`` runs it (``cwd`` is on sys.path)."""
    code = (f"from rgtune.runtime import load_exported; "
            f"layer = load_exported({str(folder)!r}, {SPEC!r}, trust_code={trust}); print('loaded', layer.model)")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1]


# ------------------------------------------------------------------ planted export folders
@pytest.mark.parametrize("named", ["model_source", "model"])
def test_an_export_naming_os_system_is_refused_and_nothing_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     named: str) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setattr(os, "system", lambda *a: marker.write_text(f"os.system{a}"))  # were it called
    folder = _exported(tmp_path / "planted")
    _plant(folder, "planted" if named == "model_source" else "os:system", "os:system")
    with pytest.raises(UntrustedModelError) as e:
        load_exported(folder, SPEC)
    msg = str(e.value)
    assert "\n" not in msg and f"export folder {folder}" in msg and "'os:system'" in msg
    assert "Register the model first" in msg and "trust_code=True" in msg
    assert not marker.exists(), "the export's model path was called"


def test_a_module_shipped_in_the_folder_is_not_imported_without_the_opt_in(tmp_path: Path) -> None:
    folder = _exported(tmp_path / "shared")
    marker = tmp_path / "ran"
    (folder / "evilmod.py").write_text(PLANTED_MODULE.format(marker=str(marker)))
    _plant(folder, "evilmod:f", "evilmod:f")
    refused = _load_in_fresh_process(Path("."), cwd=folder)  # loaded from inside the folder: it is on sys.path
    assert refused.returncode == 1 and not marker.exists(), "the folder's module ran"
    line = _error_line(refused.stderr)
    assert line.startswith("rgtune.ir.registry.UntrustedModelError: export folder . names model 'evilmod:f' from "
                           "'evilmod:f', which is not registered in this process"), refused.stderr
    # the opt-in means exactly this: the module's code runs (and its builder is then used)
    trusted = _load_in_fresh_process(Path("."), cwd=folder, trust=True)
    assert trusted.returncode == 0, trusted.stderr
    assert marker.read_text() == "ran" and trusted.stdout.strip() == "loaded evilmod:f"


def test_a_planted_model_name_that_is_registered_here_imports_nothing(tmp_path: Path) -> None:
    """A registered name wins over the path the file gives: nothing is imported for it."""
    folder = _exported(tmp_path / "rgcn")
    marker = tmp_path / "ran"
    (folder / "evilmod.py").write_text(PLANTED_MODULE.format(marker=str(marker)))
    _plant(folder, "rgcn", "evilmod:f")
    done = _load_in_fresh_process(Path("."), cwd=folder)
    assert done.returncode == 0 and done.stdout.strip() == "loaded rgcn" and not marker.exists()


# ------------------------------------------------------------------ a user's own export
def test_ones_own_export_of_a_model_registered_elsewhere_loads_and_a_foreign_one_needs_the_opt_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "code"
    code.mkdir()
    module = f"user_models_{random.randrange(10**9)}"
    (code / f"{module}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(code))
    __import__(module)  # the user's process registers the model by importing their module
    try:
        folder = _exported(tmp_path / "mine", "user_mean_conv")
    finally:
        unregister_model("user_mean_conv")
    schedule = json.loads((folder / SCHEDULE_FILE).read_text())
    assert schedule["model_source"] == f"{module}:mean_conv" and (folder / SIGNATURE_FILE).is_file()
    env = {"PYTHONPATH": str(code)}
    # the same user, a fresh process that never imported the module: the signature lets it import
    mine = _load_in_fresh_process(folder, cwd=tmp_path, env=env)
    assert mine.returncode == 0 and mine.stdout.strip() == "loaded user_mean_conv", mine.stderr
    # another user (another key) got the folder: refused, unless they opt in
    other = {**env, "RGTUNE_CONFIG_DIR": str(tmp_path / "colleague")}
    theirs = _load_in_fresh_process(folder, cwd=tmp_path, env=other)
    assert theirs.returncode == 1 and "UntrustedModelError" in _error_line(theirs.stderr)
    assert _load_in_fresh_process(folder, cwd=tmp_path, env=other, trust=True).returncode == 0
    # an edited copy no longer carries this user's signature
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    s = json.loads((edited / SCHEDULE_FILE).read_text())
    s["in_dim"] = 8
    (edited / SCHEDULE_FILE).write_text(json.dumps(s, indent=1))
    assert "UntrustedModelError" in _error_line(_load_in_fresh_process(edited, cwd=tmp_path, env=env).stderr)


# ------------------------------------------------------------------ database rows
DEVICE = DeviceInfo(name="code trust test cpu", backend="cpu", compiler="cc 1")


@pytest.fixture
def shared_db(tmp_path: Path) -> TrialDatabase:
    """A database as a colleague might share it: real rgcn history on two graphs, and rows whose model
    (and backend) name code: ``os:system`` and a module that sits on this process's path."""
    db = TrialDatabase(f"sqlite:///{tmp_path / 'shared.db'}")
    for i, name in enumerate((SPEC, OTHER)):
        g = load_dataset(name)
        space = SearchSpace(build_model("rgcn", 8, 8, 1), g, "cpu")
        rng = random.Random(i)
        rows = [("rgcn", "cpu"), ("os:system", "cpu"), ("evilmod_row:f", "cpu"), ("rgcn", "evilmod_row:Backend")]
        for model, backend in rows:
            w = db.ensure_workload(model, g, DEVICE, in_dim=8, out_dim=8, heads=1, backend=backend)
            for cfg in [space.default()] + [space.sample(rng) for _ in range(11)]:
                t = db.start_trial(w, cfg)
                db.finish_trial(t, "ok", median_ms=1.0 + rng.random())
    return db


def test_database_rows_naming_code_are_learnt_without_importing_it(shared_db: TrialDatabase, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    marker, called = tmp_path / "ran", tmp_path / "called"
    monkeypatch.setattr(os, "system", lambda *a: called.write_text(f"os.system{a}"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "evilmod_row.py").write_text(PLANTED_MODULE.format(marker=str(marker)) + "Backend = f\n")
    monkeypatch.syspath_prepend(str(code))
    graphs = GraphLoader()
    with caplog.at_level(logging.WARNING, logger="rgtune.costmodel"):
        fit = fit_on_history(shared_db, CostModel(), "cpu", DEVICE.name, path=None, graphs=graphs)
        holdout = evaluate_holdout(shared_db, SPEC, model="rgcn", backend="cpu", graphs=graphs)
    assert not marker.exists() and not called.exists(), "a database row's model or backend path was imported"
    assert "evilmod_row" not in sys.modules
    assert fit.samples and holdout.n_train > 0
    for model in ("os:system", "evilmod_row:f"):
        assert f"names model {model!r}" in caplog.text and "trust_code=True (--trust-code)" in caplog.text
    # the opt-in (tune/rgtune costmodel --trust-code) means exactly this: the rows' paths are imported and
    # called, os.system included
    fit_on_history(shared_db, CostModel(), "cpu", DEVICE.name, path=None, graphs=graphs, trust_code=True)
    assert marker.read_text() == "ran" and called.read_text() == "os.system(8, 8, 1)"
    unregister_model("evilmod_row:f"), unregister_model("os:system")


def test_the_costmodel_command_refuses_row_code_unless_told(shared_db: TrialDatabase, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = tmp_path / "code"
    code.mkdir()
    (code / "evilmod_row.py").write_text(PLANTED_MODULE.format(marker=str(marker)))
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "rgtune.cli", "costmodel", "--db", shared_db.url]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert plain.returncode == 0, plain.stderr
    assert not marker.exists() and "names model 'evilmod_row:f'" in plain.stderr
    trusted = subprocess.run(cmd + ["--trust-code"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert trusted.returncode == 0 and marker.exists(), trusted.stderr
