"""Schema versioning of the trial database: Alembic, driven from code, upgraded in place.

The schema version is the Alembic revision recorded in ``rg_alembic_version`` (Optuna keeps its
own in ``alembic_version``). Opening a database:

* at :data:`SCHEMA_VERSION`: nothing to do (one SELECT, Alembic is not even loaded);
* older (or new and empty): upgraded to head in one transaction, data kept;
* newer than this code knows, or an unknown revision: refused with :class:`SchemaVersionError`,
  untouched, because an old rgtune writing to a newer schema could damage it.

Two processes opening the same old database at once must not both migrate it: the upgrade runs
inside the writer's transaction, which SQLite serializes (``BEGIN IMMEDIATE``) and PostgreSQL
serializes with a transaction-scoped advisory lock; the second process then re-reads the version,
finds head, and does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from rgtune.db.errors import SchemaTooOldError, SchemaVersionError
from rgtune.db.schema import SCHEMA_VERSION, TABLE_PREFIX, VERSION_TABLE

__all__ = [
    "MIGRATIONS_DIR", "alembic_config", "known_revisions", "current_revision", "ensure_schema", "migrate", "check_readable",
    "schema_lock",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_PG_LOCK_KEY = int.from_bytes(b"rgtunedb", "big")  # any constant; fits PostgreSQL's signed bigint


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic :class:`Config` for rgtune's migrations, without any ``alembic.ini``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser interpolation
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def known_revisions() -> list[str]:
    """Every revision this code ships, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def current_revision(conn: Connection) -> str | None:
    """The revision recorded in the database; None for a database rgtune never touched."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = list(conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    if len(rows) > 1:
        raise SchemaVersionError(f"the database records several schema versions {sorted(rows)}; it was not made by rgtune")
    return rows[0] if rows else None


def _has_rg_tables(conn: Connection) -> bool:
    return any(t.startswith(TABLE_PREFIX) and t != VERSION_TABLE for t in sa.inspect(conn).get_table_names())


def _refuse_unknown(current: str, shown: str) -> None:
    if current.isdigit() and SCHEMA_VERSION.isdigit() and int(current) > int(SCHEMA_VERSION):
        raise SchemaVersionError(
            f"{shown} has schema version {current}, newer than this rgtune knows ({SCHEMA_VERSION}); "
            f"upgrade rgtune (pip install -U rgtune) to use it"
        )
    if current not in known_revisions():
        raise SchemaVersionError(
            f"{shown} has schema version {current!r}, which this rgtune does not know (it knows up to {SCHEMA_VERSION}); "
            f"it was written by another rgtune build"
        )


def check_readable(conn: Connection, shown: str) -> str:
    """For read-only use: the schema must be exactly :data:`SCHEMA_VERSION`; returns it."""
    current = current_revision(conn)
    if current == SCHEMA_VERSION:
        return current
    if current is None:
        raise SchemaVersionError(f"{shown} holds no rgtune trial tables (opened read-only, so they are not created)")
    _refuse_unknown(current, shown)
    raise SchemaTooOldError(shown, current, SCHEMA_VERSION)


def ensure_schema(read_engine: Engine, write_engine: Engine, shown: str, *, upgrade: bool = True) -> str:
    """Bring the database to :data:`SCHEMA_VERSION` (or refuse, see module docstring); returns it."""
    # The common case, a current schema, needs no write lock: many workers open at once.
    with read_engine.connect() as conn, conn.begin():
        if current_revision(conn) == SCHEMA_VERSION:
            return SCHEMA_VERSION
    with write_engine.connect() as conn, _foreign_keys_deferred(conn), conn.begin():
        _lock(conn)
        current = current_revision(conn)
        if current == SCHEMA_VERSION:
            return current
        if current is not None:
            _refuse_unknown(current, shown)
        elif _has_rg_tables(conn):
            raise SchemaVersionError(
                f"{shown} has rgtune tables but no schema version ({VERSION_TABLE} is missing); it was not made by rgtune's migrations"
            )
        if not upgrade and current is not None:
            raise SchemaVersionError(f"{shown} has schema version {current}, older than this rgtune ({SCHEMA_VERSION}); open it with upgrade=True")
        command.upgrade(alembic_config(connection=conn), SCHEMA_VERSION)
        _check_foreign_keys(conn, shown)
    return SCHEMA_VERSION


def migrate(write_engine: Engine, revision: str) -> None:
    """Move the schema to ``revision``, up or down (tests, and downgrading by hand)."""
    with write_engine.connect() as conn, _foreign_keys_deferred(conn), conn.begin():
        _lock(conn)
        current = current_revision(conn)
        revs = known_revisions()
        cfg = alembic_config(connection=conn)
        if revision == "base" or (current is not None and current in revs and revs.index(revision) < revs.index(current)):
            command.downgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)
        _check_foreign_keys(conn, str(write_engine.url))


@contextmanager
def _foreign_keys_deferred(conn: Connection) -> Iterator[None]:
    """SQLite: foreign keys off while migrating, checked before the commit (:func:`_check_foreign_keys`).

    SQLite alters a table by copying it and dropping the original, which would trip the foreign
    keys of the rows that reference it (they point at the copy once it takes the name). The
    switch only works outside a transaction, so it is set on the raw connection before ``BEGIN``.
    """
    raw = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
    if raw is None:
        yield
        return
    raw.execute("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys = ON")


def _check_foreign_keys(conn: Connection, shown: str) -> None:
    if conn.dialect.name != "sqlite":
        return
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:  # raised inside the transaction: the migration rolls back
        raise SchemaVersionError(f"{shown}: the migration left {len(broken)} rows with broken foreign keys "
                                 f"(first: {tuple(broken[0])})")


@contextmanager
def schema_lock(write_engine: Engine) -> Iterator[None]:
    """Hold the schema lock while other code creates tables (Optuna's RDBStorage does, unguarded).

    Two PostgreSQL workers running ``CREATE TABLE`` for the same new table at once make one fail
    with a ``pg_type`` unique violation, so the second waits here until the first is done and
    then finds the tables. SQLite needs no lock: its DDL runs under the database write lock, and
    RDBStorage's own engine must not be blocked by one held here.
    """
    if write_engine.dialect.name != "postgresql":
        yield
        return
    with write_engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()


def _lock(conn: Connection) -> None:
    # SQLite: the caller's BEGIN IMMEDIATE already excludes other writers.
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
