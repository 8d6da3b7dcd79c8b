"""rgtune.db: the versioned SQL history of every tuning trial (SQLite by default, PostgreSQL for many workers).

* :mod:`.database`: :class:`TrialDatabase`: get-or-create of devices, graphs, schedules and
  workloads; the trial lifecycle (start, heartbeat, finish, abandoned trials); the queries
  (``best``, ``history``, ``workloads``); confirmations.
* :mod:`.engine`: a ``--db`` value turned into a configured SQLAlchemy engine; SQLite file checks.
* :mod:`.errors`: :class:`DatabaseError` and its kinds; driver errors translated into them.
* :mod:`.schema` and :mod:`.migrate` (Alembic revisions in ``migrations/``): the tables at head,
  and the in-place upgrade of an older database.
* :mod:`.records`: the plain values queries return (:class:`TrialRecord`, ...), JSON and CSV;
  :mod:`.trial_result`: a trial's typed outcome (:class:`TrialResult`, its status and details), which the
  tuner's worker returns and :meth:`TrialDatabase.record_result` stores.
* :mod:`.optuna_storage`: Optuna's storage in the same database (the one module below Optuna's study API).
* :mod:`.queries`, :mod:`.best`, :mod:`.liveness`: the joined trial query, which trial is best,
  which ``running`` trial is abandoned.

The tuner writes it; the runtime, the CLI's queries and the cost model read it.

Example:
    >>> from rgtune.db import TrialDatabase
    >>> db = TrialDatabase("sqlite://")      # in memory; the default is sqlite:///results.db
    >>> db.count_trials()
    0
"""

from typing import Any

#: the trial database when none is named (``--db``): ``results.db`` in the working directory
DEFAULT_URL = "sqlite:///results.db"

# Loaded on first use: the records (:mod:`.records`) need no SQLAlchemy, and a reader of an
# exported layer (``rgtune.runtime.load_exported``) imports them without opening a database.
_LAZY = {
    **dict.fromkeys(("SCHEMA_VERSION", "TrialDatabase", "WorkloadFilter", "GraphLike", "NotFoundError", "worker_id"),
                    "rgtune.db.database"),
    **dict.fromkeys(("DatabaseError", "DatabaseURLError", "DatabaseUnreachableError", "DatabaseReadOnlyError",
                     "DatabaseCorruptError", "DatabaseLockedError", "SchemaVersionError", "SchemaTooOldError"),
                   "rgtune.db.errors"),
    **dict.fromkeys(("DeviceInfo", "TrialRecord", "WorkloadRecord", "ConfirmationRecord", "records_to_json",
                     "write_csv"), "rgtune.db.records"),
    **dict.fromkeys(("TrialStatus", "FINAL_STATUSES", "TrialResult", "TrialDetails"), "rgtune.db.trial_result"),
}
__all__ = sorted([*_LAZY, "DEFAULT_URL"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rgtune.db' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
