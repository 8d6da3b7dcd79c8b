"""Private helpers of :mod:`rgtune.db`: the joined trial query, filters, argument checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import sqlalchemy as sa

from rgtune.db.schema import Device, Graph, Schedule, Trial, Workload
from rgtune.db.records import TrialRecord, WorkloadRecord
from rgtune.db.trial_result import FINAL_STATUSES, TrialDetails, TrialStatus

__all__ = [
    "WorkloadRef",
    "StatusArg",
    "FILTER_COLUMNS",
    "trial_select",
    "filtered",
    "with_status",
    "trial_record",
    "rowcount",
    "workload_id_of",
    "status_of",
    "final_status",
    "checked_name",
    "positive_int",
    "clip_error",
]

WorkloadRef = int | WorkloadRecord
StatusArg = str | Iterable[str] | None

_MAX_ERROR_CHARS = 16_000  # compiler logs can be megabytes; keep the head and the tail


# ---------------------------------------------------------------------- query helpers
def trial_select() -> sa.Select:
    return (
        sa.select(Trial, Workload, Graph, Device, Schedule)
        .join(Workload, Trial.workload_id == Workload.id)
        .join(Graph, Workload.graph_id == Graph.id)
        .join(Device, Workload.device_id == Device.id)
        .join(Schedule, Trial.schedule_id == Schedule.id)
    )


FILTER_COLUMNS: dict[str, Any] = {
    "model": Workload.model,
    "dataset": Graph.name,
    "graph_hash": Graph.content_hash,
    "device": Device.name,
    "backend": Workload.backend,
    "mode": Workload.mode,
    "options": Workload.options,
    "batches": Workload.batches,
    "precision": Workload.precision,
    "in_dim": Workload.in_dim,
    "out_dim": Workload.out_dim,
    "heads": Workload.heads,
    "study_name": Workload.study_name,
}


def filtered(q: sa.Select, workload: WorkloadRef | None, filters: Mapping[str, Any]) -> sa.Select:
    unknown = sorted(set(filters) - set(FILTER_COLUMNS))
    if unknown:
        raise TypeError(f"unknown filter(s) {unknown}; known: {sorted(FILTER_COLUMNS)}")
    if workload is not None:
        q = q.where(Workload.id == workload_id_of(workload))
    for key, value in filters.items():
        if value is None:
            continue
        q = q.where(FILTER_COLUMNS[key] == (model_key(value) if key == "model" else value))
    return q


def with_status(q: sa.Select, status: StatusArg) -> sa.Select:
    if status is None:
        return q
    wanted = [status] if isinstance(status, str) else list(status)
    return q.where(Trial.status.in_([status_of(s).value for s in wanted]))


def trial_record(t: Trial, w: Workload, g: Graph, d: Device, sch: Schedule) -> TrialRecord:
    return TrialRecord(
        id=t.id,
        workload_id=w.id,
        model=w.model,
        dataset=g.name,
        device=d.name,
        backend=w.backend,
        mode=w.mode,
        options=w.options,
        batches=w.batches,
        precision=w.precision,
        in_dim=w.in_dim,
        out_dim=w.out_dim,
        heads=w.heads,
        study_name=w.study_name,
        schedule_id=sch.id,
        schedule_hash=sch.hash,
        knobs=dict(sch.knobs),
        optuna_trial=t.optuna_trial,
        status=t.status,
        median_ms=t.median_ms,
        times_ms=list(t.times_ms) if t.times_ms is not None else None,
        compile_s=t.compile_s,
        max_error=t.max_error,
        predicted_ms=t.predicted_ms,
        source_hash=t.source_hash,
        rgtune_version=t.rgtune_version,
        error=t.error,
        worker=t.worker,
        started_at=t.started_at,
        finished_at=t.finished_at,
        heartbeat_at=t.heartbeat_at,
        confirmation_id=t.confirmation_id,
        peak_bytes=t.peak_bytes,
        details=TrialDetails.from_json(t.details) if t.details is not None else None,
    )


def rowcount(result: sa.Result[Any]) -> int:
    # UPDATE results are CursorResults; the ORM's static type is the generic Result.
    return int(cast(sa.CursorResult[Any], result).rowcount)


# ---------------------------------------------------------------------- argument checks
def workload_id_of(workload: WorkloadRef) -> int:
    if isinstance(workload, WorkloadRecord):
        return workload.id
    if isinstance(workload, int) and not isinstance(workload, bool):
        return workload
    raise TypeError(f"workload must be a WorkloadRecord or an id, got {type(workload).__name__}")


def status_of(value: TrialStatus | str) -> TrialStatus:
    try:
        return TrialStatus(value)
    except ValueError:
        raise ValueError(f"unknown trial status {value!r}; one of {[s.value for s in TrialStatus]}") from None


def final_status(value: TrialStatus | str) -> TrialStatus:
    st = status_of(value)
    if st not in FINAL_STATUSES:
        raise ValueError(f"finish_trial needs a final status, not {st.value!r}")
    return st


def model_key(name: str) -> str:
    """A model's name as the database keys it: lower case, but an import path (``pkg.mod:builder``) as given."""
    return name if ":" in name else name.lower()


def checked_name(value: str, what: str, limit: int = 32) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ValueError(f"{what} must be a non-empty string of at most {limit} characters, got {value!r}")
    return value.strip()


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def clip_error(text: str | None) -> str | None:
    if text is None or len(text) <= _MAX_ERROR_CHARS:
        return text
    half = _MAX_ERROR_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"

