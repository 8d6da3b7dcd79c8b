"""The cost model's ranking quality on the frozen history (``tests/data/costmodel_history.json.gz``).

The history is a few thousand ``ok`` trials of ``tune`` studies (RGCN, RGAT and HGT, inference and
training, CPU backend, 64 -> 64; ``experiments/frozen_history.py`` collected them, ``rgtune costmodel
--freeze`` wrote the file). Its times are fixed, so the metrics below are the same on every machine and
every run: a change of the features, the targets or the estimator that ranks worse fails here instead of
landing unseen inside the live figure's noise. Each held-out graph is ranked by a model trained on the
other graphs alone (``rgtune costmodel --eval --history ... --holdout D``); the big presets by a model of
the small graphs alone (``--train-max-edges``), what the tuner faces on a big graph it never measured.
The floors are the issue's goals where the model meets them, else the measured figures (BENCHMARKS.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rgtune.costmodel import CostModel, GraphLoader, evaluate_holdout
from rgtune.costmodel.evaluation import larger_than
from rgtune.costmodel.frozen import freeze, thaw
from rgtune.db import TrialDatabase

HISTORY = Path(__file__).resolve().parent / "data" / "costmodel_history.json.gz"
#: the small graphs' limit (edges): MUTAG's 148,100 are in, the BGS-sized preset's 672,884 are not
SMALL = 200_000

#: held-out graph -> (train on small graphs only, ordered-pair accuracy floor). AIFB (0.856) and the BGS-sized
#: graph (0.819) meet the issue's goals (0.85, 0.8); MUTAG (0.816) and the AM-sized graph (0.796) do not, and
#: their floors are a little under the measured figures (BENCHMARKS.md, "Cost model on a frozen history")
FLOORS = {
    "aifb": (False, 0.85),
    "mutag": (False, 0.80),
    "synthetic:bgs": (True, 0.80),
    "synthetic:am": (True, 0.78),
}


@pytest.fixture(scope="module")
def history() -> tuple[TrialDatabase, GraphLoader, dict[int, Any]]:
    return thaw(HISTORY), GraphLoader(), {}


def test_the_frozen_history_covers_the_models_modes_and_graph_sizes(history: tuple[Any, ...]) -> None:
    db, _, _ = history
    workloads = db.workloads(batches="")
    assert {w.model for w in workloads} == {"rgcn", "rgat", "hgt"} and {w.mode for w in workloads} == {
        "inference", "training"}
    assert set(FLOORS) <= {w.dataset for w in workloads}
    assert sum(w.num_ok for w in workloads) >= 2000


@pytest.mark.parametrize("holdout", sorted(FLOORS))
def test_a_held_out_graph_is_ranked_above_its_floor(history: tuple[Any, ...], holdout: str) -> None:
    db, graphs, rows = history
    small_only, floor = FLOORS[holdout]
    r = evaluate_holdout(db, holdout, cost_model=CostModel(), graphs=graphs, rows=rows,
                         exclude=larger_than(db, SMALL) if small_only else None)
    assert not graphs.missing(), f"graphs of the history not loadable here (set RGTUNE_DATA_DIR): {graphs.missing()}"
    shown = "; ".join(f"{w['model']} {w['schedules']} schedules opa={w['opa']:.3f}" for w in r.per_workload)
    assert r.metrics["opa"] >= floor, f"{holdout}: {r.last_line()} ({shown})"
    assert r.metrics["top5_error"] < 0.1, f"{holdout}: {r.last_line()} ({shown})"  # measured 0.00-0.05


def test_freeze_and_thaw_keep_every_trial(history: tuple[Any, ...], tmp_path: Path) -> None:
    """The file is what the database held: the same workloads, times and knobs, and it freezes to the same bytes."""
    db, _, _ = history
    again = tmp_path / "again.json.gz"
    assert freeze(db, again) == sum(w.num_ok for w in db.workloads(batches=""))
    assert again.read_bytes() == HISTORY.read_bytes()
    copy = thaw(again)
    for a, b in zip(db.workloads(batches=""), copy.workloads(batches="")):
        assert (a.model, a.dataset, a.graph_hash, a.mode, a.device_fingerprint) == \
            (b.model, b.dataset, b.graph_hash, b.mode, b.device_fingerprint)
        assert [(t.median_ms, t.knobs) for t in db.history(a)] == [(t.median_ms, t.knobs) for t in copy.history(b)]
