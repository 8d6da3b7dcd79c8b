"""The cost model's ranking quality on the frozen history (``tests/data/costmodel_history.json.gz``).

The history is a few thousand ``ok`` trials of ``tune`` studies (RGCN, RGAT and HGT, inference and
training, CPU backend, 64 -> 64; ``experiments/frozen_history.py`` collected them, ``rgtune costmodel
--freeze`` wrote the file). Its times are fixed, so the metrics below are the same on every machine and
every run: a change of the features, the targets or the estimator that ranks worse fails here instead of
landing unseen inside the live figure's noise. Each held-out graph is ranked by a model trained on the
other graphs alone (``rgtune costmodel --eval --history ... --holdout D``); the big presets by a model of
the small graphs alone (``--train-max-edges``), what the tuner faces on a big graph it never measured.
The floors are the issue's goals where the model meets them, else the measured figures (BENCHMARKS.md).

``tests/data/costmodel_history_batches.json.gz`` holds sampler studies (``tune --batches``, training, random
schedules, ``experiments/frozen_history.py collect --part batches``): each graph's sampler workload is ranked
by a model trained on everything else, whole graphs and the other graphs' samplers (``rgtune costmodel --eval
--batches``); the whole-graph holdouts above are trained on whole-graph workloads alone, as they were frozen.
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
BATCHES_HISTORY = HISTORY.with_name("costmodel_history_batches.json.gz")
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


#: held-out graph -> ordered-pair accuracy floor of its sampler workloads (measured 0.788, 0.813, 0.805, 0.762:
#: BENCHMARKS.md, "Cost model on a frozen history"); the samplers' are `experiments/frozen_history.py`'s BATCHES
BATCH_FLOORS = {"aifb": 0.76, "mutag": 0.78, "synthetic:am": 0.78, "synthetic:ogbn-mag,reverse=1": 0.73}


@pytest.fixture(scope="module")
def history() -> tuple[TrialDatabase, GraphLoader, dict[int, Any]]:
    db = thaw(HISTORY)
    thaw(BATCHES_HISTORY, db)  # after the whole-graph history: its trial ids stay those of HISTORY alone
    return db, GraphLoader(), {}


def _sampler(w: Any) -> bool:
    return bool(w.batches)


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
    big = larger_than(db, SMALL)
    r = evaluate_holdout(db, holdout, cost_model=CostModel(), graphs=graphs, rows=rows,
                         exclude=(lambda w: _sampler(w) or big(w)) if small_only else _sampler)
    assert not graphs.missing(), f"graphs of the history not loadable here (set RGTUNE_DATA_DIR): {graphs.missing()}"
    shown = "; ".join(f"{w['model']} {w['schedules']} schedules opa={w['opa']:.3f}" for w in r.per_workload)
    assert r.metrics["opa"] >= floor, f"{holdout}: {r.last_line()} ({shown})"
    assert r.metrics["top5_error"] < 0.1, f"{holdout}: {r.last_line()} ({shown})"  # measured 0.00-0.05


def test_each_graphs_sampler_workloads_are_ranked_above_their_floor(history: tuple[Any, ...]) -> None:
    """One test for the four graphs: each one's evaluation needs every other graph's sampler rows (the big graphs'
    batches drawn), which one worker then draws once."""
    db, graphs, rows = history
    missed = []
    for holdout, floor in sorted(BATCH_FLOORS.items()):
        (sampler,) = {w.batches for w in db.workloads(dataset=holdout) if w.batches}
        r = evaluate_holdout(db, holdout, cost_model=CostModel(), graphs=graphs, rows=rows, batches=sampler)
        assert not graphs.missing(), f"graphs of the history not loadable here (set RGTUNE_DATA_DIR): {graphs.missing()}"
        assert len(r.per_workload) == 3 and all(w["schedules"] >= 20 for w in r.per_workload)
        shown = "; ".join(f"{w['model']} {w['schedules']} schedules opa={w['opa']:.3f}" for w in r.per_workload)
        # top-5 error measured 0-0.007
        if r.metrics["opa"] < floor or r.metrics["top5_error"] >= 0.1:
            missed.append(f"{holdout} [{sampler}] (floor {floor}): {r.last_line()} ({shown})")
    assert not missed, "\n".join(missed)


def test_freeze_and_thaw_keep_every_trial(tmp_path: Path) -> None:
    """The file is what the database held: the same workloads, times and knobs, and it freezes to the same bytes."""
    db = thaw(HISTORY)
    again = tmp_path / "again.json.gz"
    assert freeze(db, again) == sum(w.num_ok for w in db.workloads(batches=""))
    assert again.read_bytes() == HISTORY.read_bytes()
    copy = thaw(again)
    for a, b in zip(db.workloads(batches=""), copy.workloads(batches="")):
        assert (a.model, a.dataset, a.graph_hash, a.mode, a.device_fingerprint) == \
            (b.model, b.dataset, b.graph_hash, b.mode, b.device_fingerprint)
        assert [(t.median_ms, t.knobs) for t in db.history(a)] == [(t.median_ms, t.knobs) for t in copy.history(b)]


def test_a_sampler_workload_is_frozen_with_its_sampler_and_a_whole_graph_history_stays_version_1() -> None:
    import gzip
    import io
    import json

    from rgtune.data.synthetic import random_graph
    from rgtune.db import DeviceInfo
    from rgtune.db.trial_result import TrialResult

    db = TrialDatabase("sqlite://")
    g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
    dev = DeviceInfo(name="cpu0", backend="cpu")
    whole = db.ensure_workload("rgcn", g, dev, in_dim=8, out_dim=8)
    db.record_result(db.start_trial(whole, {"layout.edges": "coo"}), TrialResult("ok", median=2e-3))

    def frozen() -> tuple[dict, TrialDatabase]:
        buffer = io.BytesIO()
        freeze(db, buffer)
        return json.loads(gzip.decompress(buffer.getvalue())), thaw(io.BytesIO(buffer.getvalue()))

    payload, _ = frozen()
    assert payload["format_version"] == 1 and "batches" not in payload["workloads"][0]
    sampler = "neighbor:fanout=4x3,batch_size=16"
    batches = db.ensure_workload("rgcn", g, dev, in_dim=8, out_dim=8, batches=sampler)
    db.record_result(db.start_trial(batches, {"layout.edges": "csr_dst"}), TrialResult("ok", median=3e-3))
    payload, copy = frozen()
    assert payload["format_version"] == 2
    assert [(w.batches, [(t.median_ms, t.knobs) for t in copy.history(w)]) for w in copy.workloads()] == [
        ("", [(2.0, {"layout.edges": "coo"})]), (sampler, [(3.0, {"layout.edges": "csr_dst"})])]
