"""Tuning a graph that is not a dataset: ``rgtune.tune(model, graph)`` with a HeteroGraph, a PyG HeteroData or
a DGL graph, ``tune --graph FILE``; the worker loads it by content, ``load_tuned`` finds its schedules by
content, and a graph file never runs code."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import rgtune
from rgtune.cli import main
from rgtune.data import as_hetero_graph, load_dataset, save_graph_file, to_pyg
from rgtune.data.errors import DatasetError, DatasetNotFoundError
from rgtune.data.stored import load_graph_file, load_stored, store_graph
from rgtune.data.synthetic import random_graph
from rgtune.db import TrialDatabase
from rgtune.runtime import load_tuned
from rgtune.runtime._lookup import TunedScheduleWarning

FAST = dict(trials=2, seed=0, progress=False, confirm_top=0, cost_model=False, backend="reference")


@pytest.fixture
def graph():
    return random_graph((40, 70), num_relations=3, num_edges=500, seed=4)


def _measure():
    from rgtune.tuner.measure import MeasureOptions

    return MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=60.0)


def test_a_graph_object_is_tuned_and_its_schedule_found_by_content(tmp_path, graph):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    s = rgtune.tune("rgcn", graph, hidden=8, db=db, measure=_measure(), **FAST)
    assert s.measured == 2 and s.best_trial_id is not None
    (w,) = TrialDatabase(db).workloads()
    assert w.graph_hash == graph.content_hash and w.dataset == graph.name
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)  # this graph, this device: no warning
        layer = load_tuned("rgcn", graph, 8, 8, db=db, backend="reference")
    assert layer.provenance["trial_id"] == s.best_trial_id


def test_a_pyg_heterodata_is_tuned_and_looked_up_as_the_same_graph(tmp_path, graph):
    data = to_pyg(graph)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    s = rgtune.tune("rgcn", data, in_dim=8, out_dim=4, db=db, measure=_measure(), **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)
        layer = load_tuned("rgcn", data, 8, 4, db=db, backend="reference")  # the HeteroData itself
    assert layer.graph.content_hash == as_hetero_graph(data).content_hash
    assert layer.provenance["trial_id"] == s.best_trial_id and (layer.in_dim, layer.out_dim) == (8, 4)


def test_tune_graph_file_from_the_command_line(tmp_path, graph, capsys):
    path = tmp_path / "mine.pt"
    save_graph_file(graph, path)
    db = tmp_path / "r.db"
    assert main(["tune", "--model", "rgcn", "--graph", str(path), "--hidden", "8", "--backend", "reference",
                 "--trials", "1", "--confirm", "0", "--quiet", "--cost-model", "off", "--db", str(db)]) == 0
    (w,) = TrialDatabase(str(db)).workloads()
    assert w.graph_hash == graph.content_hash
    assert main(["tune", "--model", "rgcn", "--graph", str(path), "--dataset", "aifb", "--db", str(db)]) == 2
    assert "--dataset NAME or --graph FILE (one of them)" in capsys.readouterr().err


def test_a_stored_graph_is_checked_against_its_hash(tmp_path, graph):
    name = store_graph(graph)
    assert load_dataset(name).content_hash == graph.content_hash  # in this user's cache: what a worker reads
    assert store_graph(graph, tmp_path) == name and load_stored(name, tmp_path).content_hash == graph.content_hash
    other = random_graph((5, 5), num_relations=1, num_edges=9, seed=1)
    store_graph(other, tmp_path)
    os.replace(tmp_path / "graphs" / f"{other.content_hash}.pt", tmp_path / "graphs" / f"{graph.content_hash}.pt")
    with pytest.raises(DatasetError, match="does not hold the graph"):
        load_stored(name, tmp_path)
    with pytest.raises(DatasetNotFoundError, match="no stored graph"):
        load_stored("graph:" + "0" * 16, tmp_path)


class _Planted:
    """An object whose unpickling would run code."""

    def __reduce__(self):
        return (os.system, ("touch planted_marker",))


def test_a_graph_file_with_code_in_it_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": _Planted()}, path)
    with pytest.raises(DatasetError, match="is not a graph saved by rgtune.data.save_graph_file"):
        load_graph_file(path)
    assert not (tmp_path / "planted_marker").exists()


def test_a_user_graph_without_a_record_names_the_python_call_that_tunes_it(graph):
    with pytest.warns(TunedScheduleWarning, match=r"rgtune\.tune\('rgat', graph, in_dim=8, out_dim=4, heads=2"):
        load_tuned("rgat", graph, 8, 4, 2, db=None, backend="reference")
    with pytest.raises(TypeError, match="expected a rgtune HeteroGraph, a PyG HeteroData or a DGL graph"):
        rgtune.tune("rgcn", 42, **FAST)
