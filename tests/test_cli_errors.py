"""The query commands never write the database they read, and a URL whose driver is missing is one line.

``best``, ``history``, ``costmodel`` and ``export`` refuse a missing SQLite file by name (plain
paths, relative and absolute ``sqlite:///`` URLs) instead of creating an empty database, and
refuse an older schema with how to upgrade it instead of upgrading it.
"""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

import pytest

from rgtune.cli import main
from rgtune.costmodel import model_path_for
from rgtune.costmodel.store import default_model_path
from rgtune.db import TrialDatabase
from rgtune.db.engine import make_engine, parse_url
from rgtune.db.migrate import migrate
from rgtune.db.schema import SCHEMA_VERSION, VERSION_TABLE

GRAPH = "synthetic:custom,nodes=60,edges=300,ntypes=2,rels=3,seed=1"
OLD_SCHEMA = "0002"
#: argv of each command that reads the database, before ``--db``
QUERIES = {
    "best": ["best"],
    "history": ["history"],
    "costmodel": ["costmodel"],
    "export": ["export", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--backend", "reference", "-o", "out"],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return rc, err


# ---------------------------------------------------------------------- a missing driver
@pytest.mark.parametrize("url, module, install", [("mysql://u@h/db", "MySQLdb", "pip install mysqlclient"),
                                                  ("mysql+pymysql://u@h/db", "pymysql", "pip install pymysql")])
@pytest.mark.parametrize("command", [*QUERIES, "tune"])
def test_a_missing_driver_is_one_line_naming_it(command, url, module, install, tmp_path, monkeypatch, capsys) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    monkeypatch.chdir(tmp_path)
    argv = ["tune", "--model", "rgcn", "--dataset", GRAPH, "--trials", "1"] if command == "tune" else QUERIES[command]
    rc, err = _run([*argv, "--db", url], capsys)
    assert rc != 0 and f"driver {module!r}" in err and install in err


# ---------------------------------------------------------------------- a missing file
def _forms(tmp_path: Path) -> dict[str, str]:
    return {"plain path": "missing.db", "relative URL": "sqlite:///missing.db",
            "absolute URL": f"sqlite:///{tmp_path / 'missing.db'}"}


@pytest.mark.parametrize("form", ["plain path", "relative URL", "absolute URL"])
@pytest.mark.parametrize("command", list(QUERIES))
def test_a_missing_database_is_refused_by_name_and_not_created(command, form, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    rc, err = _run([*QUERIES[command], "--db", _forms(tmp_path)[form]], capsys)
    assert rc != 0 and "no database at" in err and "missing.db" in err
    assert list(tmp_path.iterdir()) == []  # no database, no -wal/-shm, no export folder


# ---------------------------------------------------------------------- an older schema
@pytest.fixture
def old_db(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    engine = make_engine(parse_url(str(path)), readonly=False, busy_timeout=5)
    migrate(engine.execution_options(rgtune_write=True), OLD_SCHEMA)
    engine.dispose()
    return path


def _schema(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()[0]


@pytest.mark.parametrize("command", list(QUERIES))
def test_an_older_schema_is_not_upgraded_and_the_error_says_how(command, old_db, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    rc, err = _run([*QUERIES[command], "--db", old_db.name], capsys)
    assert rc != 0 and f"old.db has schema version {OLD_SCHEMA}, older than this rgtune ({SCHEMA_VERSION})" in err
    assert "read-only" in err and "run `tune` once with --db old.db" in err
    assert _schema(old_db) == OLD_SCHEMA and not (tmp_path / "out").exists()
    TrialDatabase(str(old_db)).close()  # what the message says: a writable open upgrades it
    assert _schema(old_db) == SCHEMA_VERSION


def test_query_commands_read_an_existing_database(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    TrialDatabase("results.db").close()
    assert main(["history", "--json"]) == 0 and capsys.readouterr().out.strip() == "[]"
    rc, err = _run(["best"], capsys)
    assert rc == 2 and "no verified trial matches" in err


def test_the_cost_model_of_a_database_opened_read_only_is_saved_next_to_it(tmp_path) -> None:
    path = tmp_path / "results.db"
    TrialDatabase(str(path)).close()
    with TrialDatabase(str(path), readonly=True) as db:
        assert model_path_for(db, "cpu0", "cpu") == default_model_path(path, db.name, "cpu0", "cpu")
