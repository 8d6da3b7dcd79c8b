"""Training a cost model on a database's history, through the saved model when it is still good.

:func:`fit_on_history` reads the ``ok`` trials of one device and backend, reuses the rows
(and, when the history did not change, the fitted regressor) of the saved model, fits what
is new, and saves the result. A saved model that cannot be trusted (see
:mod:`rgtune.costmodel.store`) is ignored and overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rgtune.costmodel.features import WorkloadContext
from rgtune.costmodel.history import GraphLoader, Sample, load_samples, matching_workloads
from rgtune.costmodel.model import CostModel
from rgtune.costmodel.store import default_model_path, read_model, write_model

if TYPE_CHECKING:
    from rgtune.db import TrialDatabase, WorkloadRecord

log = logging.getLogger("rgtune.costmodel")


@dataclass
class HistoryFit:
    """What :func:`fit_on_history` did."""

    model: CostModel
    samples: list[Sample]
    rows: dict[int, dict[str, float]]  # trial id -> feature row (the cache that is saved)
    path: Path | None
    loaded: bool = False  # the saved model was trusted
    refit: bool = True  # the regressor was fit now (not reused from the file)
    note: str = ""  # why a saved model was not used
    contexts: dict[int, WorkloadContext] = field(default_factory=dict)


def model_path_for(db: "TrialDatabase", device: str, backend: str) -> Path | None:
    """Where the model of this database, device (its name) and backend is saved; None for in-memory databases."""
    from rgtune.db.engine import engine_sqlite_file

    url = db.engine.url
    if url.get_backend_name() == "sqlite":
        f = engine_sqlite_file(url)  # also for a database opened read-only (``rgtune costmodel``)
        return None if f is None else default_model_path(f, db.name, device, backend)
    return default_model_path(None, db.name, device, backend)


def fit_on_history(db: "TrialDatabase", template: CostModel, backend: str, device: str, *,
                   path: Path | None | str = "auto", graphs: GraphLoader | None = None,
                   current: "WorkloadRecord | None" = None,
                   exclude: Callable[["WorkloadRecord"], bool] | None = None,
                   contexts: dict[int, WorkloadContext] | None = None, rows: dict[int, dict[str, float]] | None = None,
                   save: bool = True, trust_code: bool = False) -> HistoryFit:
    """Fit ``template``'s settings on every ``ok`` trial of one device (by name) and backend.

    ``path="auto"`` is :func:`model_path_for`; None neither reads nor writes a file. With an
    ``exclude`` filter (holdout evaluation) nothing is read from or written to disk. The models
    the history names are imported only with ``trust_code`` (:mod:`.history`).
    """
    graphs = graphs or GraphLoader()
    contexts = {} if contexts is None else contexts
    if path == "auto":
        path = None if exclude is not None else model_path_for(db, device, backend)
    path = None if path is None else Path(path)
    key = _file_key(device, backend, template, trust_code)
    model, loaded, note = template, False, ""
    rows = dict(rows or {})
    if path is not None:
        payload, note = read_model(path, key)
        if payload is not None:
            try:
                model, loaded = CostModel.from_state(payload["model"]), True
                rows = {**dict(payload["rows"]), **rows}
            except (KeyError, TypeError, AttributeError) as e:
                note = f"the saved model is incomplete ({type(e).__name__})"
        if note and note != "no saved model":
            log.warning("cost model: not using %s: %s; retraining", path, note)
    workloads = matching_workloads(db, backend, device, exclude)
    samples = load_samples(db, workloads, graphs, rows, contexts, trust_code)
    wanted = {s.trial_id for s in samples}
    rows = {k: v for k, v in rows.items() if k in wanted}  # trials that left the history leave the cache
    cur = None if current is None else f"w{current.id}"
    ids = tuple(sorted(s.trial_id for s in samples if s.trial_id is not None))
    refit = not (loaded and model.regressor is not None and model.trained_on == ids)
    if refit:
        model.fit(samples, current=cur)
    else:
        model.status = model._enough(samples, cur)[1]
    if save and path is not None and (refit or not loaded):
        try:
            write_model(path, {"model": model.state(), "rows": rows}, key)
        except OSError as e:  # a read-only folder: the model still works, it is just not kept
            log.warning("cost model: cannot save %s (%s)", path, e.strerror or e)
    return HistoryFit(model, samples, rows, path, loaded, refit, note, contexts)


def save_history_rows(db: "TrialDatabase", model: CostModel, backend: str, device: str,
                      path: Path | None, graphs: GraphLoader, rows: dict[int, dict[str, float]],
                      contexts: dict[int, WorkloadContext], trust_code: bool = False) -> None:
    """Save ``model`` with the rows of every ``ok`` trial now in the history (no fit: the next
    start refits when the history grew, and then only the new trials' rows are computed)."""
    if path is None:
        return
    samples = load_samples(db, matching_workloads(db, backend, device), graphs, rows, contexts, trust_code)
    wanted = {s.trial_id for s in samples}
    key = _file_key(device, backend, model, trust_code)
    try:
        write_model(path, {"model": model.state(), "rows": {k: v for k, v in rows.items() if k in wanted}}, key)
    except OSError as e:
        log.warning("cost model: cannot save %s (%s)", path, e.strerror or e)


def _file_key(device: str, backend: str, model: CostModel, trust_code: bool) -> dict[str, Any]:
    """What a saved model and its cached rows were made for. Trusting code is part of it: rows computed without
    the models a history names (not imported) have no counts, and a run that imports them must not reuse those."""
    return {"device": device, "backend": backend, **model.params(), **({"trust_code": True} if trust_code else {})}
