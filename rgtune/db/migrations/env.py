"""Alembic environment of rgtune's trial database (run by Alembic, never imported directly).

rgtune drives Alembic from code (:mod:`rgtune.db.migrate`); no ``alembic.ini`` is needed.
The caller hands over a connection that is already inside a transaction (SQLite: ``BEGIN
IMMEDIATE``; PostgreSQL: holding an advisory lock), so every revision of one upgrade commits or
rolls back together and two processes never migrate at the same time.

For development, a new revision is generated against a scratch database at head with::

    from alembic import command
    from rgtune.db.migrate import alembic_config
    command.revision(alembic_config("sqlite:///scratch.db"), "what changes", autogenerate=True, rev_id="0003")

then edited by hand (migrations never import the ORM models), and ``SCHEMA_VERSION`` in
:mod:`rgtune.db.schema` is bumped.
"""

from __future__ import annotations

from typing import Any

from alembic import context

from rgtune.db.schema import TABLE_PREFIX, VERSION_TABLE, Base

config = context.config


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    # Autogenerate must only look at rgtune's tables: Optuna's live in the same database.
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX)
    return True


def _configure(**kw: Any) -> None:
    context.configure(
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite can only alter most things by copying the table
        include_name=_include_name,
        compare_type=True,
        **kw,
    )


def _run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from rgtune.db.engine import make_engine, parse_url

        engine = make_engine(parse_url(config.get_main_option("sqlalchemy.url") or ""), readonly=False, busy_timeout=30.0)
        with engine.connect() as connection:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
        engine.dispose()
        return
    _configure(connection=connection)
    # The caller's transaction is the migration's transaction (Alembic sees it and does not nest).
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    _run_online()
