"""Turning a ``--db`` value into a configured SQLAlchemy engine, and the SQLite file checks.

What this module settles, and why:

* **URLs.** Any SQLAlchemy URL works; a bare file name ending in ``.db``, ``.sqlite`` or
  ``.sqlite3`` is taken as an SQLite file (``--db runs/x.db``). Anything else that does not
  parse, or whose driver is not installed, is a :class:`DatabaseURLError`, before any file
  is touched.
* **Passwords never become text.** :func:`hide_password` is the one way a URL is written into
  a message, a hint, a file or a repr (:func:`display_name` names a database with it), also
  for text that does not parse as a URL.
* **SQLite files are checked before SQLite opens them** (:func:`preflight_sqlite`): SQLite
  happily "opens" random bytes or a directory and only fails later, and it creates a new
  empty database wherever it is pointed. The checks give one clear message instead.
* **SQLite concurrency.** WAL journal (readers never block the writer), a busy timeout, and
  ``BEGIN IMMEDIATE`` for every write transaction: the write lock is taken when the
  transaction starts, where SQLite's busy handler can wait for it, instead of being upgraded
  from a read lock mid-transaction, which fails at once with "database is locked" and cannot be
  waited out. Python's ``sqlite3`` module is told to keep out of transaction control so that
  SQLAlchemy's ``BEGIN`` is the one that counts (the recipe in SQLAlchemy's SQLite docs).
* **Processes.** A pooled connection created in a parent process is never used in a forked
  child (SQLAlchemy's multiprocessing recipe); the child opens its own.
"""

from __future__ import annotations

import os
import re
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import sqlalchemy as sa
import sqlalchemy.exc as sa_exc
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from rgtune.db.errors import (
    POSTGRES_HINT,
    DatabaseCorruptError,
    DatabaseReadOnlyError,
    DatabaseURLError,
    one_line,
)

__all__ = ["WRITE_OPTION", "parse_url", "hide_password", "display_name", "sqlite_file", "engine_sqlite_file",
           "preflight_sqlite", "make_engine", "serialize_sqlite_transactions"]

#: execution option that marks an engine/connection as a writer (SQLite: BEGIN IMMEDIATE)
WRITE_OPTION = "rgtune_write"

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_SCHEME_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")  # two letters at least: C:\x.db is a path
_FILE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
#: the password of a URL-like text that SQLAlchemy cannot parse: ``[scheme:][//]user:PASSWORD@``
_PASSWORD_TEXT = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.\-]*:)?(?://)?[^:/@]*:)[^@]*@")
#: the same up to the last "@" (SQLAlchemy takes what follows an unescaped "@" in a password for the host)
_PASSWORD_TO_LAST_AT = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^:/@]*:).*@")
#: what to install for a driver module that is missing (by the module's name)
_DRIVER_PACKAGES = {
    "psycopg": "pip install 'rgtune[postgres]'",
    "psycopg2": "pip install psycopg2-binary, or use postgresql+psycopg:// with pip install 'rgtune[postgres]'",
    "MySQLdb": "pip install mysqlclient, or use mysql+pymysql:// with pip install pymysql",
    "pymysql": "pip install pymysql",
}


def parse_url(text: str | URL) -> URL:
    """A SQLAlchemy :class:`URL` for ``text``: a URL, or a path to an SQLite file.

    Example:
        >>> parse_url("sqlite:///results.db").database
        'results.db'
        >>> parse_url("runs/hgt.db").drivername
        'sqlite'
        >>> parse_url("results")
        Traceback (most recent call last):
        ...
        rgtune.db.errors.DatabaseURLError: 'results' is not a database URL; use e.g. sqlite:///results.db, a path ending in .db, or postgresql+psycopg://user@host:5432/rgtune
    """
    if isinstance(text, URL):
        return text
    text = str(text).strip()
    usage = f"use e.g. sqlite:///results.db, a path ending in .db, or {POSTGRES_HINT}"
    shown = hide_password(text)
    if not _SCHEME.match(text):
        if _SCHEME_PREFIX.match(text):  # "sqlite:results.db": a URL missing its "//", not a file name
            raise DatabaseURLError(f"{shown!r} is not a valid database URL (missing '//' after the scheme?); {usage}")
        if text.lower().endswith(_FILE_SUFFIXES) and "://" not in text:
            return URL.create("sqlite", database=text)
        raise DatabaseURLError(f"{shown!r} is not a database URL; {usage}")
    try:
        url = make_url(text)
    except (sa_exc.ArgumentError, ValueError) as e:
        raise DatabaseURLError(f"{shown!r} is not a valid database URL ({one_line(e)}); {usage}") from None
    _check_driver(url, usage)
    if url.get_backend_name() == "sqlite" and (url.host or url.username or url.password or url.port):
        raise DatabaseURLError(
            f"{shown!r} is not a valid SQLite URL (it has a host part); write sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    return url


def _check_driver(url: URL, usage: str) -> None:
    """Refuse a URL whose dialect is unknown or whose driver module is not installed, naming what to install.

    SQLAlchemy imports the driver only in ``create_engine``, where a missing one is a bare
    ``ModuleNotFoundError``; importing it here turns that into one line.
    """
    try:
        url.get_dialect().import_dbapi()
    except sa_exc.NoSuchModuleError:
        raise DatabaseURLError(f"unknown database kind {url.drivername!r} in {display_name(url)!r}; {usage}") from None
    except ImportError as e:  # the dialect exists, its driver module does not
        module = e.name or one_line(e)
        hint = _DRIVER_PACKAGES.get(module, f"install the Python package that provides the module {module!r}")
        raise DatabaseURLError(
            f"the database driver {module!r} for {url.drivername}:// URLs is not installed; {hint}"
        ) from None


def hide_password(url: str | URL) -> str:
    """``url`` as text with its password replaced by ``***``; paths and password-less URLs as written.

    The one way a database URL becomes text (messages, hints, exported files, reprs): text that
    SQLAlchemy cannot parse is masked by pattern, so an error about a malformed URL does not
    show its password either.

    Example:
        >>> hide_password("postgresql+psycopg://u:s3cret@db.example:5432/rgtune")
        'postgresql+psycopg://u:***@db.example:5432/rgtune'
        >>> hide_password("sqlite://user:pw@/x.db"), hide_password("user:pw@host/db")
        ('sqlite://user:***@/x.db', 'user:***@host/db')
        >>> hide_password("postgresql://u:p@ss@h/db"), hide_password("sqlite:///a@b.db")
        ('postgresql://u:***@h/db', 'sqlite:///a@b.db')
    """
    if isinstance(url, URL):
        shown = url.render_as_string(hide_password=True)
        # an unescaped "@" in the password: SQLAlchemy took what follows it for the host
        return _PASSWORD_TO_LAST_AT.sub(r"\1***@", shown) if "@" in (url.host or "") else shown
    text = str(url)
    if "@" not in text:
        return text
    try:
        parsed = make_url(text.strip()) if _SCHEME.match(text.strip()) else None
    except (sa_exc.ArgumentError, ValueError):
        parsed = None
    if parsed is None:
        return _PASSWORD_TEXT.sub(r"\1***@", text)
    return text if parsed.password is None else hide_password(parsed)


def display_name(url: str | URL) -> str:
    """How messages name a database: the SQLite file as written, else the URL without its password.

    Takes a URL or any ``--db`` text (also one that does not parse).

    Example:
        >>> display_name("sqlite:///runs/results.db"), display_name("postgresql://u:pw@h/rgtune")
        ('runs/results.db', 'postgresql://u:***@h/rgtune')
    """
    if not isinstance(url, URL):
        text = str(url).strip()
        if not _SCHEME.match(text):
            return hide_password(text)
        try:
            url = make_url(text)
        except (sa_exc.ArgumentError, ValueError):
            return hide_password(text)
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return hide_password(url)


def sqlite_file(url: URL) -> Path | None:
    """The file behind an SQLite URL; None for in-memory databases and ``file:`` URIs."""
    if url.get_backend_name() != "sqlite":
        return None
    db = url.database or ""
    if db in ("", ":memory:") or db.startswith("file:") or str(url.query.get("uri", "")).lower() in ("true", "1"):
        return None
    return Path(db)


def preflight_sqlite(path: Path, shown: str, *, readonly: bool) -> None:
    """Refuse, with one clear line, an SQLite path that SQLite would mishandle or fail on later.

    Nothing is created or modified here: a bad path must not leave a file behind.
    """
    if path.is_dir():
        raise DatabaseURLError(f"{shown} is a directory, not an SQLite database file; pass a file path such as {shown}/results.db")
    parent = path.parent
    where = "the working directory" if str(parent) == "." else f"directory {parent}"
    if not parent.is_dir():
        raise DatabaseURLError(f"cannot create {shown}: directory {parent} does not exist")
    if path.exists():
        _check_header(path, shown)
        if readonly:
            if not os.access(path, os.R_OK):
                raise DatabaseReadOnlyError(f"cannot read {shown}: permission denied")
            return
        if not os.access(path, os.R_OK | os.W_OK):
            raise DatabaseReadOnlyError(
                f"cannot write to {shown}: the file is read-only; make it writable, pass another --db, "
                f"or open it read-only for queries"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise DatabaseReadOnlyError(
                f"cannot write to {shown}: {where} is read-only "
                f"(SQLite creates {path.name}-wal and {path.name}-shm there); pass a --db in a writable directory"
            )
        _check_pages(path, shown)
    else:
        if readonly:
            raise DatabaseURLError(f"{shown} does not exist (opened read-only, so it is not created)")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise DatabaseReadOnlyError(f"cannot create {shown}: {where} is read-only; pass a --db in a writable directory")


def _check_header(path: Path, shown: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except PermissionError:
        raise DatabaseReadOnlyError(f"cannot read {shown}: permission denied") from None
    except OSError as e:
        raise DatabaseURLError(f"cannot read {shown}: {e.strerror or e}") from None
    # An empty file is a valid empty database (SQLite writes the header on the first write).
    if head and head != _SQLITE_MAGIC:
        raise DatabaseCorruptError(
            f"{shown} is not an SQLite database (file is not a database); move it away "
            f"(e.g. mv {shown} {shown}.bad) and run again, or pass another --db"
        )


def _check_pages(path: Path, shown: str) -> None:
    """Refuse a database whose pages are damaged before anything writes to it: a writer that opened it would
    add its rows to the pages that still read (a workload, a study, a waiting trial) and fail later. SQLite's
    ``quick_check`` reads every page through a read-only connection, so the file stays byte-identical."""
    wal = path.with_name(path.name + "-wal")
    if path.stat().st_size == 0 or wal.exists() and wal.stat().st_size > 0:
        return  # empty; or a writer's log holds newer pages (maybe mid-checkpoint): SQLite's own reads will tell
    import sqlite3

    try:  # immutable: no lock, no -shm or -wal made beside the file (a read-only WAL connection would make both)
        with closing(sqlite3.connect(f"file:{quote(str(path))}?immutable=1", uri=True)) as conn:
            rows = conn.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as e:
        problem = str(e)
    else:
        problem = "" if rows == [("ok",)] else str(rows[0][0]) if rows else "no answer"
    if problem:
        raise DatabaseCorruptError(
            f"{shown} is damaged (SQLite's check: {problem}); nothing was written to it; move it away "
            f"(e.g. mv {shown} {shown}.bad) and run again, or pass another --db"
        )


_READONLY_QUERY = {"mode": "ro", "uri": "true"}


def _readonly_sqlite_url(path: Path) -> URL:
    # SQLite's URI form is the only way to ask the driver for a read-only connection.
    return URL.create("sqlite", database="file:" + quote(str(path.resolve())), query=_READONLY_QUERY)


def engine_sqlite_file(engine_url: URL) -> Path | None:
    """The SQLite file behind the URL of an engine :func:`make_engine` made, read-only ones included.

    A read-only engine's URL is SQLite's ``file:...?mode=ro`` form (which :func:`sqlite_file`
    leaves alone); files kept next to the database (the cost model's) need the path.

    Example:
        >>> engine_sqlite_file(_readonly_sqlite_url(Path("/data/results.db"))).as_posix()
        '/data/results.db'
    """
    db = engine_url.database or ""
    if engine_url.get_backend_name() == "sqlite" and db.startswith("file:") and dict(engine_url.query) == _READONLY_QUERY:
        return Path(unquote(db[len("file:"):]))
    return sqlite_file(engine_url)


def make_engine(url: URL, *, readonly: bool, busy_timeout: float, echo: bool = False) -> Engine:
    """A configured engine for ``url`` (see the module docstring for what is configured)."""
    kwargs: dict[str, Any] = {"echo": echo}
    path = sqlite_file(url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if path is not None:
            # Absolute, so that a later chdir of the process cannot move the database.
            url = _readonly_sqlite_url(path) if readonly else url.set(database=os.path.abspath(path))
        kwargs["connect_args"] = {"timeout": busy_timeout}
    else:
        kwargs["pool_pre_ping"] = True  # long studies outlive idle server connections
        if backend == "postgresql" and "connect_timeout" not in url.query:
            kwargs["connect_args"] = {"connect_timeout": 10}  # a dead host fails in seconds, not minutes
    engine = sa.create_engine(url, **kwargs)
    _guard_fork(engine)
    if backend == "sqlite":
        _configure_sqlite(engine, busy_timeout=busy_timeout, wal=path is not None and not readonly)
    return engine


def serialize_sqlite_transactions(engine: Engine, *, busy_timeout: float) -> None:
    """Make every transaction of ``engine`` (an SQLite one made elsewhere) take the write lock when it begins.

    For Optuna's storage engine, which reads and then writes in one transaction with no way to mark
    it a writer: claiming a waiting trial reads its state, then sets it running. Under sqlite3's own
    transaction control the read runs outside any transaction, so two workers can both see the
    trial waiting and both run it (one Optuna trial measured twice). ``BEGIN IMMEDIATE`` for all
    makes the read and the write one step; the busy timeout lets the others wait their turn.
    Connections opened before this call are dropped from the pool.
    """
    _configure_sqlite(engine, busy_timeout=busy_timeout, wal=False, always_immediate=True)
    engine.dispose()


def _configure_sqlite(engine: Engine, *, busy_timeout: float, wal: bool, always_immediate: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None  # sqlite3 must not BEGIN on its own (see module docstring)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if wal:
                # Persistent in the file; a filesystem without shared memory keeps its old mode,
                # which is still safe (BEGIN IMMEDIATE + busy timeout), only slower for readers.
                cur.execute("PRAGMA journal_mode = WAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = always_immediate or conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _guard_fork(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _remember_pid(dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get("pid") != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise sa_exc.DisconnectionError("connection belongs to another process; opening a new one")
