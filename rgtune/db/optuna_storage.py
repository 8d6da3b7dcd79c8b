"""Optuna's storage in the trial database: the one module of rgtune that reaches below Optuna's study API.

Optuna's studies live in the same SQL database as rgtune's trial history (its ``RDBStorage``
tables beside the ``rg_*`` ones). :func:`open_storage` opens that storage through Optuna's public
constructor; the tuner then uses Optuna's public API only (``create_study``, ``ask``/``tell``,
``add_trial``, ``get_all_study_names``...).

One operation has no public API: :func:`correct_finished_trials`. The end-of-run confirmation
(:mod:`rgtune.tuner.confirmation`) gives the trials of a confirmed schedule its confirmed median
and fails those of a schedule that failed re-verification, so that the study's best trial is the
schedule ``rgtune best`` returns. Optuna treats a finished trial as final: ``Study.tell`` skips it
and the storage's ``set_trial_state_values`` raises ``UpdateFinishedTrialError`` (its cache of
finished trials relies on that). The only public way around it, copying the study into a new one
with the corrected trials, would change the study's name under every worker that shares it. So
this module writes Optuna's ``trials`` and ``trial_values`` tables itself, with Optuna's own ORM
models (``optuna.storages._rdb.models``), which are private. That use is confined here, checked
against the Optuna versions it was verified with (:data:`VERIFIED_OPTUNA`, pyproject pins the same
range) and by :func:`check_private_models`, which ``tests/test_db.py`` runs: a new Optuna that
changes them fails there, loudly, before a study does.

Example:
    >>> check_private_models()   # the private models have what correct_finished_trials uses
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    import optuna

__all__ = ["VERIFIED_OPTUNA", "open_storage", "correct_finished_trials", "check_private_models"]

#: the Optuna versions ``[lower, upper)`` whose private models :func:`correct_finished_trials` was verified with;
#: pyproject's dependency is ``optuna>=lower,<upper`` (tests/test_db.py checks that the two agree)
VERIFIED_OPTUNA = ("5.0", "5.1")
#: what :func:`correct_finished_trials` reads of each private model
_USED = {"StudyModel": ("study_id", "study_name"), "TrialModel": ("trial_id", "number", "study_id", "state"),
         "TrialValueModel": ("trial_id", "objective", "value", "value_type", "value_to_stored_repr")}


def open_storage(url: str, engine_kwargs: Mapping[str, Any]) -> "optuna.storages.RDBStorage":
    """Optuna's storage on the database at ``url`` (it creates its tables on first use)."""
    import optuna

    return optuna.storages.RDBStorage(url, engine_kwargs=dict(engine_kwargs))


def correct_finished_trials(session: Session, study_name: str, values: Mapping[int, float],
                            failed: Iterable[int] = ()) -> None:
    """In ``session`` (a write transaction on the storage's database), give the finished trials of study
    ``study_name`` numbered as the keys of ``values`` those values, and make those numbered in ``failed``
    failed (their values dropped). See the module docstring for why this writes Optuna's tables."""
    from optuna.storages._rdb.models import StudyModel, TrialModel, TrialValueModel
    from optuna.trial import TrialState

    numbers = {*values, *failed}
    if not numbers:
        return
    ids = dict(session.execute(
        sa.select(TrialModel.number, TrialModel.trial_id)
        .join(StudyModel, TrialModel.study_id == StudyModel.study_id)
        .where(StudyModel.study_name == study_name, TrialModel.number.in_(numbers))).all())
    missing = sorted(numbers - set(ids))
    if missing:
        raise KeyError(f"Optuna study {study_name!r} has no trials numbered {missing}")
    for number, value in values.items():
        stored, kind = TrialValueModel.value_to_stored_repr(float(value))
        session.execute(sa.update(TrialValueModel)
                        .where(TrialValueModel.trial_id == ids[number], TrialValueModel.objective == 0)
                        .values(value=stored, value_type=kind))
    failed_ids = [ids[n] for n in failed]
    if failed_ids:
        session.execute(sa.delete(TrialValueModel).where(TrialValueModel.trial_id.in_(failed_ids)))
        session.execute(sa.update(TrialModel).where(TrialModel.trial_id.in_(failed_ids)).values(state=TrialState.FAIL))


def check_private_models() -> None:
    """Raise ``RuntimeError`` naming what is missing when Optuna's private models lack what
    :func:`correct_finished_trials` uses (a new Optuna changed them)."""
    import optuna

    try:
        from optuna.storages._rdb import models
    except ImportError as e:
        raise RuntimeError(_changed(optuna.__version__, f"optuna.storages._rdb.models cannot be imported ({e})")) from e
    for model, attributes in _USED.items():
        cls = getattr(models, model, None)
        lacking = [a for a in attributes if not hasattr(cls, a)]
        if cls is None or lacking:
            raise RuntimeError(_changed(optuna.__version__, f"{model} lacks {lacking or 'itself'}"))


def _changed(version: str, what: str) -> str:
    low, high = VERIFIED_OPTUNA
    return (f"Optuna {version}'s private storage models changed: {what}; rgtune corrects finished trials through "
            f"them and was verified with optuna>={low},<{high} (rgtune/db/optuna_storage.py)")
