"""``rgtune plot``: a workload's tuning as a PNG, the knobs' importances it shows, and its errors."""

from __future__ import annotations

import builtins
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rgtune.cli import main
from rgtune.cli.plot import knob_importances
from rgtune.db import TrialDatabase

from test_db import CPU, _StubGraph


def _tuned(path: Path, trials: int = 24) -> str:
    """A database with a tuned workload: knob ``tile`` decides the time, ``order`` is noise."""
    url = f"sqlite:///{path}"
    db = TrialDatabase(url)
    w = db.ensure_workload("hgt", _StubGraph(), CPU, in_dim=16, out_dim=16)
    rng = random.Random(0)
    for i in range(trials):
        knobs = {"tile": rng.choice([16, 32, 64]), "order": rng.choice(["a", "b"])}
        tid = db.start_trial(w, knobs, optuna_trial=i)
        db.finish_trial(tid, "ok", median_ms=knobs["tile"] / 16 + rng.random() * 0.01, max_error=1e-7)
    db.ensure_workload("hgt", _StubGraph(), CPU, in_dim=16, out_dim=16, mode="training")  # another, empty
    db.close()
    return url


def test_the_knob_that_decides_the_time_is_the_most_important() -> None:
    rng = random.Random(1)
    trials = []
    for _ in range(30):
        knobs = {"tile": rng.choice([16, 32, 64]), "order": rng.choice(["a", "b"]), "fixed": 1}
        trials.append(SimpleNamespace(knobs=knobs, median_ms=knobs["tile"] + rng.random()))
    importances = knob_importances(trials)
    assert list(importances)[0] == "tile" and importances["tile"] > 0.9
    assert "fixed" not in importances  # one value: nothing to attribute
    assert knob_importances(trials[:3]) == {}


def test_plot_writes_a_png_of_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _tuned(tmp_path / "r.db")
    out = tmp_path / "tuning.png"
    assert main(["plot", "--model", "hgt", "--mode", "inference", "--db", url, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # three panels drawn, not an empty canvas


def test_plot_names_what_is_ambiguous_or_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = _tuned(tmp_path / "r.db")
    assert main(["plot", "--model", "hgt", "--db", url, "-o", str(tmp_path / "x.png")]) != 0
    assert "2 workloads match" in capsys.readouterr().err  # inference and training: --mode tells them apart
    assert main(["plot", "--model", "hgt", "--mode", "training", "--db", url]) != 0
    assert "no measured trial" in capsys.readouterr().err
    assert main(["plot", "--model", "rgcn", "--db", url]) != 0
    assert "no workload matches" in capsys.readouterr().err
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["plot", "--model", "hgt", "--mode", "inference", "--db", url]) != 0
    assert "pip install 'rgtune[plot]'" in capsys.readouterr().err
