"""Files that travel with a database or a data folder are read as data, never run as code: the saved
cost model (loaded only with this user's HMAC, else refit) and ogbn-mag's processed pickle (read by a
restricted unpickler)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import pickle
import random
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rgtune.costmodel import CostModel, GraphLoader, fit_on_history, model_path_for
from rgtune.costmodel import store
from rgtune.data import load_dataset
from rgtune.data import ogb_mag
from rgtune.data.errors import DatasetError
from rgtune.db import DeviceInfo, TrialDatabase
from rgtune.ir.models import build_model
from rgtune.search_spaces import SearchSpace

CONFIG_VARIABLE = "RGTUNE_CONFIG_DIR"
GRAPHS = [f"synthetic:custom,nodes={n},edges={e},ntypes=2,rels=3,seed=1" for n, e in ((200, 1500), (300, 2500))]
DEVICE = DeviceInfo(name="trust test cpu", backend="cpu", compiler="cc 1")
LOADED = GraphLoader()


class RunsCode:
    """A pickle that, when loaded, writes a marker file: what a hostile model file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def small_hgb(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(max_iter=20, max_leaf_nodes=8, random_state=seed)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> TrialDatabase:
    """Two graphs x 16 ok trials: enough for a cost model that is on."""
    db = TrialDatabase(f"sqlite:///{tmp_path_factory.mktemp('trust') / 'results.db'}")
    for i, name in enumerate(GRAPHS):
        g = load_dataset(name)
        LOADED.add(g)
        space = SearchSpace(build_model("rgcn", 8, 8, 1), g, "cpu")
        w = db.ensure_workload("rgcn", g, DEVICE, in_dim=8, out_dim=8, heads=1, backend="cpu")
        rng = random.Random(i)
        for cfg in [space.default()] + [space.sample(rng) for _ in range(15)]:
            t = db.start_trial(w, cfg)
            db.finish_trial(t, "ok", median_ms=1.0 + rng.random())
    return db


def _key(model: CostModel) -> dict[str, Any]:
    return {"device": DEVICE.name, "backend": "cpu", **model.params()}


def _forge(path: Path, payload: Any, key: dict[str, Any], hmac: str | None = None) -> None:
    """A model file as someone without this user's key can write it: every checked field right."""
    body = pickle.dumps(payload)
    header = {"magic": store.MAGIC, "format": store.FORMAT_VERSION, **store._versions(), "key": key,
              "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    if hmac is not None:
        header["hmac"] = hmac
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(header, sort_keys=True).encode() + b"\n" + body)


# ------------------------------------------------------------------ the saved cost model
@pytest.mark.parametrize("signature", ["none", "forged"])
def test_a_model_file_that_would_run_code_is_never_unpickled(history: TrialDatabase, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture,
                                                            signature: str) -> None:
    marker = tmp_path / "ran"
    path = model_path_for(history, DEVICE.name, "cpu")
    template = CostModel(small_hgb)
    _forge(path, {"model": RunsCode(marker), "rows": {}}, _key(template),
           hmac=None if signature == "none" else "0" * 64)
    with caplog.at_level(logging.WARNING, logger="rgtune.costmodel"):
        fit = fit_on_history(history, template, "cpu", DEVICE.name, graphs=LOADED)
    assert not marker.exists(), "the model file's code ran"
    assert not fit.loaded and fit.refit and fit.model.ready
    assert "this user" in fit.note
    assert f"not using {path}" in caplog.text and "retraining" in caplog.text and "this user" in caplog.text
    # refit from the history and saved with this user's signature: trusted from now on
    again = fit_on_history(history, CostModel(small_hgb), "cpu", DEVICE.name, graphs=LOADED)
    assert again.loaded and not again.refit


def test_another_users_model_is_refit_and_ones_own_is_reused(history: TrialDatabase, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_VARIABLE, str(tmp_path / "alice"))
    path = model_path_for(history, DEVICE.name, "cpu")
    path.unlink(missing_ok=True)
    fit_on_history(history, CostModel(small_hgb), "cpu", DEVICE.name, graphs=LOADED)  # alice saves hers
    assert fit_on_history(history, CostModel(small_hgb), "cpu", DEVICE.name, graphs=LOADED).loaded
    monkeypatch.setenv(CONFIG_VARIABLE, str(tmp_path / "bob"))  # bob got alice's results.db
    bobs = fit_on_history(history, CostModel(small_hgb), "cpu", DEVICE.name, graphs=LOADED)
    assert not bobs.loaded and "not saved by this user" in bobs.note
    assert fit_on_history(history, CostModel(small_hgb), "cpu", DEVICE.name, graphs=LOADED).loaded


def test_the_key_is_private_and_an_exposed_one_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rgtune import _signing as signing

    monkeypatch.setenv(CONFIG_VARIABLE, str(tmp_path / "config"))
    model = tmp_path / "m.rgcm"
    store.write_model(model, {"w": 1}, key={"backend": "cpu"})
    key = tmp_path / "config" / "costmodel.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert store.read_model(model, key={"backend": "cpu"}) == ({"w": 1}, "")
    key.chmod(0o644)
    monkeypatch.setattr(signing, "_keys", {})  # as in the next process
    payload, why = store.read_model(model, key={"backend": "cpu"})
    assert payload is None and str(key) in why and "read or written by others" in why


# ------------------------------------------------------------------ ogbn-mag's processed file
_NODES = {"author": 2, "field_of_study": 1, "institution": 1, "paper": 3}


def _csv_gz(path: Path, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))


def _processed_mag(root: Path, graph_extra: Any = None) -> Path:
    """An ogbn-mag folder with only OGB's processed file (written as OGB writes it) and the split."""
    folder = root / "ogbn_mag"
    (folder / "processed").mkdir(parents=True)
    (folder / f"RELEASE_v{ogb_mag._ogb_version()}.txt").write_text("fake\n")
    graph = {
        "edge_index_dict": {("author", "writes", "paper"): np.array([[0, 1, 1], [0, 1, 2]], dtype=np.int64),
                            ("paper", "cites", "paper"): np.array([[1], [0]], dtype=np.int64)},
        "edge_feat_dict": None,
        "node_feat_dict": {"paper": np.arange(6, dtype=np.float32).reshape(3, 2)},
        "num_nodes_dict": dict(_NODES),
        "node_year": {"paper": np.array([[2019], [2019], [2020]], dtype=np.int64)},
        "edge_reltype": {},
    }
    if graph_extra is not None:
        graph["extra"] = graph_extra
    labels = {"paper": np.array([[7], [8], [9]], dtype=np.int64)}
    torch.save({"graph": graph, "labels": labels}, folder / "processed" / "data_processed", pickle_protocol=4)
    split = folder / "split" / "time"
    types_ = sorted(_NODES)
    _csv_gz(split / "nodetype-has-split.csv.gz", [",".join(types_), ",".join(str(t == "paper") for t in types_)])
    for name, ids in (("train", [0, 1]), ("valid", [2]), ("test", [2])):
        _csv_gz(split / "paper" / f"{name}.csv.gz", [str(i) for i in ids])
    return folder


def test_ogbn_mag_reads_the_processed_file_ogb_writes(tmp_path: Path) -> None:
    _processed_mag(tmp_path)
    g = load_dataset("ogbn-mag", root=tmp_path)
    assert {t: g.num_nodes(t) for t in g.ntypes} == _NODES
    assert g.edges(("author", "writes", "paper"))[1].tolist() == [0, 1, 2]
    assert g.features["paper"][2].tolist() == [4.0, 5.0]
    assert g.task.train_idx.tolist() == [0, 1] and g.task.train_labels.tolist() == [7, 8]
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ


@pytest.mark.parametrize("planted", ["code", "object array"])
def test_a_tampered_ogbn_mag_file_fails_clearly_and_runs_nothing(tmp_path: Path, planted: str) -> None:
    marker = tmp_path / "ran"
    extra = RunsCode(marker) if planted == "code" else np.array([RunsCode(marker)], dtype=object)
    folder = _processed_mag(tmp_path, graph_extra=extra)
    with pytest.raises(DatasetError) as e:
        load_dataset("ogbn-mag", root=tmp_path)
    assert not marker.exists(), "the data file's code ran"
    msg = str(e.value)
    assert str(folder / "processed" / "data_processed") in msg and "tampered" in msg and "Delete it" in msg
    assert "'builtins.exec'" in msg
