"""The errors of the trial database, and the translation of driver errors into them.

Every failure a user can cause (a wrong ``--db``, a file they cannot write, random bytes where
``results.db`` should be, a server that is down) surfaces as one :class:`DatabaseError` with a
one-line message that names the database and says what to do. Driver exceptions
(``sqlite3``, ``psycopg``) never leak out of :class:`rgtune.db.TrialDatabase`.
"""

from __future__ import annotations

import sqlalchemy.exc as sa_exc

__all__ = [
    "DatabaseError",
    "DatabaseURLError",
    "DatabaseUnreachableError",
    "DatabaseReadOnlyError",
    "DatabaseCorruptError",
    "DatabaseLockedError",
    "SchemaVersionError",
    "SchemaTooOldError",
    "one_line",
    "is_locked",
    "is_retryable",
    "translate",
]

POSTGRES_HINT = "postgresql+psycopg://user@host:5432/rgtune"


class DatabaseError(RuntimeError):
    """Base of every error of the trial database; the message is one line."""


class DatabaseURLError(DatabaseError):
    """The ``--db`` value is not a usable database URL (syntax, unknown dialect, missing driver, bad path)."""


class DatabaseUnreachableError(DatabaseError):
    """The database server could not be reached or refused the connection."""


class DatabaseReadOnlyError(DatabaseError):
    """The database (or the directory holding an SQLite file) cannot be written."""


class DatabaseCorruptError(DatabaseError):
    """The file is not an SQLite database, or its pages are damaged."""


class DatabaseLockedError(DatabaseError):
    """SQLite stayed locked by another process longer than the busy timeout, retries included."""


class SchemaVersionError(DatabaseError):
    """The schema is newer than this rgtune knows, unknown, or (read-only) not the current one."""


class SchemaTooOldError(SchemaVersionError):
    """A read-only open found an older schema: only a writable open upgrades it (in place).

    ``found`` is the database's schema version, ``expected`` this rgtune's; callers that open
    read-only on purpose (the query commands) say how to upgrade instead of writing.
    """

    def __init__(self, shown: str, found: str, expected: str) -> None:
        super().__init__(f"{shown} has schema version {found}, older than this rgtune ({expected}); "
                         f"open it once writable to upgrade it in place")
        self.found, self.expected = found, expected


def one_line(text: object, limit: int = 300) -> str:
    """The first non-empty line of ``text``, shortened: driver messages span several lines."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return str(type(text).__name__) if not isinstance(text, str) else ""


def _driver_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return one_line(orig if orig is not None else exc)


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked/busy" (the transaction did not commit)."""
    msg = _driver_message(exc).lower()
    return isinstance(exc, sa_exc.OperationalError) and ("database is locked" in msg or "database table is locked" in msg or "database is busy" in msg)


def is_retryable(exc: BaseException) -> bool:
    """Errors after which re-running the whole transaction is safe and likely to succeed.

    SQLite's lock errors, and PostgreSQL's serialization failure / deadlock (SQLSTATE 40001,
    40P01): in all of them the server rolled the transaction back.
    """
    if is_locked(exc):
        return True
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(exc, sa_exc.DBAPIError) and sqlstate in ("40001", "40P01")


def _is_connection_failure(exc: sa_exc.DBAPIError, low: str) -> bool:
    if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
        return True
    if not isinstance(exc, sa_exc.OperationalError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate:
        # 08: connection exception; 28: bad user/password; 57P0x: server shutting down or
        # starting; 3D000: no such database. A server-side error has a SQLSTATE, so a missing
        # table ("relation ... does not exist", 42P01) is not mistaken for an unreachable server.
        return sqlstate[:2] in ("08", "28") or sqlstate.startswith("57P0") or sqlstate == "3D000"
    # Client-side failures (psycopg: "connection failed: ...") and drivers without SQLSTATE.
    return any(s in low for s in ("connect", "timeout", "timed out", "resolve", "refused", "unreachable"))


def translate(exc: BaseException, where: str, *, sqlite: bool, busy_timeout: float = 0.0) -> DatabaseError:
    """The :class:`DatabaseError` that explains a driver/SQLAlchemy exception about ``where``.

    ``where`` is the SQLite file as the user wrote it, or the URL with its password hidden.
    """
    if isinstance(exc, DatabaseError):
        return exc
    msg = _driver_message(exc)
    low = msg.lower()
    if sqlite:
        if "file is not a database" in low or "malformed" in low or "not a database" in low:
            return DatabaseCorruptError(
                f"{where} is not a usable SQLite database ({msg}); move it away "
                f"(e.g. mv {where} {where}.bad) and run again, or pass another --db"
            )
        if "readonly" in low or "read-only" in low:
            return DatabaseReadOnlyError(
                f"cannot write to {where} ({msg}); make the file and its directory writable, "
                f"or pass a --db in a writable place"
            )
        if "unable to open database file" in low:
            return DatabaseReadOnlyError(
                f"cannot open {where} ({msg}): the file or its directory is missing or not writable "
                f"(SQLite needs to create {where}-wal and {where}-shm next to it)"
            )
        if is_locked(exc):
            return DatabaseLockedError(
                f"{where} stayed locked by another process for more than {busy_timeout:g}s ({msg}); "
                f"SQLite serializes writers: for many concurrent workers use PostgreSQL (--db {POSTGRES_HINT})"
            )
        if "disk i/o error" in low or "database or disk is full" in low:
            return DatabaseError(f"{where}: {msg} (is the disk full or the file on a network filesystem?)")
    if isinstance(exc, sa_exc.ArgumentError):
        return DatabaseURLError(f"{where}: {one_line(exc)}")
    if not sqlite and isinstance(exc, sa_exc.DBAPIError):
        if _is_connection_failure(exc, low):
            return DatabaseUnreachableError(f"cannot connect to {where}: {msg}")
        if getattr(exc.orig, "sqlstate", None) == "25006":  # read_only_sql_transaction: a standby or read-only role
            return DatabaseReadOnlyError(f"cannot write to {where}: {msg}")
    return DatabaseError(f"{where}: {type(getattr(exc, 'orig', None) or exc).__name__}: {msg}")
