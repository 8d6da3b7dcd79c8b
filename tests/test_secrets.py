"""No database password in plaintext: warnings and their ``tune`` hints, exported folders, CLI errors,
the command line ``rgtune bench`` records, and how a database names itself."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import _postgres
import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy.engine import make_url

import rgtune.runtime.load
from rgtune.cli import main
from rgtune.cli._common import run_command
from rgtune.codegen.base import create
from rgtune.data import HeteroGraph, load_dataset
from rgtune.db import DatabaseURLError, TrialDatabase
from rgtune.runtime import TunedScheduleWarning, export, load_tuned

postgres_server = _postgres.postgres_server  # pytest fixtures, found by module attribute
postgres_url = _postgres.postgres_url

SECRET = "s3cret"
PG = f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x"  # nothing listens on port 1: connecting fails at once
PG_SHOWN = "postgresql+psycopg://u:***@127.0.0.1:1/x"
GRAPH = "synthetic:custom,nodes=60,edges=300,ntypes=2,rels=3,seed=1"


@pytest.fixture(scope="module")
def graph() -> HeteroGraph:
    return load_dataset(GRAPH)


@pytest.fixture
def as_if_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime finds an empty database behind any URL: its messages about a server, without one."""
    monkeypatch.setattr(rgtune.runtime.load, "open_db", lambda db: TrialDatabase("sqlite://"))


def _files_text(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.rglob("*")) if p.is_file())


def _record(db: TrialDatabase, graph: HeteroGraph) -> int:
    """A verified trial of rgcn 8 -> 8 on this machine's reference backend, as the tuner records it."""
    w = db.ensure_workload("rgcn", graph, create("reference").device_info(), in_dim=8, out_dim=8, backend="reference")
    t = db.start_trial(w, {})
    db.finish_trial(t, "ok", median_ms=1.0, times_ms=[1.0], max_error=1e-7)
    return t


# ---------------------------------------------------------------------- without a server
def test_the_tune_hint_of_a_load_tuned_warning_hides_the_password(graph, as_if_reachable) -> None:
    with pytest.warns(TunedScheduleWarning) as caught:
        load_tuned("rgcn", graph, 8, 8, db=PG, backend="reference")
    text = str(caught[0].message)
    assert f"--db '{PG_SHOWN}'" in text and SECRET not in text  # quoted for the shell: it has a *


def test_export_allow_default_writes_no_password(tmp_path, graph, as_if_reachable) -> None:
    with pytest.warns(TunedScheduleWarning) as caught:
        out = export(tmp_path / "shared", "rgcn", graph, 8, 8, db=PG, backend="reference", allow_default=True)
    assert json.loads((out / "provenance.json").read_text())["db"] == PG_SHOWN
    assert SECRET not in _files_text(out) and SECRET not in str(caught[0].message)


def test_the_cli_fallback_for_storage_errors_hides_the_password(capsys) -> None:
    def storage_fails(args: argparse.Namespace) -> int:  # as Optuna's storage fails during a study
        raise sa_exc.OperationalError("SELECT 1", {}, Exception("connection failed: Connection refused"))

    assert run_command(storage_fails, argparse.Namespace(db=PG)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"rgtune: error: cannot connect to {PG_SHOWN}") and SECRET not in err


@pytest.mark.parametrize("command", [["best"], ["history"], ["costmodel"], ["export", "-o", "out"]])
def test_an_unreachable_server_is_one_line_without_the_password(command, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    args = [] if command[0] in ("best", "history", "costmodel") else \
        ["--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--backend", "reference"]
    assert main([*command, *args, "--db", PG]) != 0
    err = capsys.readouterr().err
    assert f"cannot connect to {PG_SHOWN}" in err and SECRET not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("url", [f"sqlite://user:{SECRET}@/x.db", f"user:{SECRET}@host/rgtune",
                                 f"postgresql://u:{SECRET}@host:notaport/db", f"sqlite:user:{SECRET}@x.db"])
def test_a_bad_url_is_refused_without_showing_its_password(url) -> None:
    with pytest.raises(DatabaseURLError) as info:
        TrialDatabase(url)
    assert SECRET not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize("command", [["best"], ["history"], ["costmodel"], ["tune", "--model", "rgcn"],
                                     ["export", "--model", "rgcn", "--backend", "reference", "-o", "out"]])
def test_the_cli_refuses_a_sqlite_url_with_a_password_without_showing_it(command, tmp_path, monkeypatch,
                                                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    dataset = ["--dataset", GRAPH] if command[0] in ("tune", "export") else []
    assert main([*command, *dataset, "--db", f"sqlite://user:{SECRET}@/x.db"]) != 0
    err = capsys.readouterr().err
    assert "sqlite://user:***@/x.db" in err and SECRET not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


def test_bench_records_its_command_line_without_the_password() -> None:
    from rgtune.cli.bench import _portable

    assert _portable(["--model", "rgcn", "--db", PG]) == ["--model", "rgcn", "--db", PG_SHOWN]
    assert _portable([f"--db={PG}"]) == ["--db", PG_SHOWN]


# ---------------------------------------------------------------------- with a server
def test_a_postgres_password_appears_nowhere(postgres_url, tmp_path, monkeypatch, capsys, graph) -> None:
    # trust authentication: the server accepts and ignores the password
    url = make_url(postgres_url).set(password=SECRET).render_as_string(hide_password=False)
    monkeypatch.chdir(tmp_path)
    with TrialDatabase(url) as db:
        assert SECRET not in db.name + repr(db) and "***@" in db.name
        with pytest.warns(TunedScheduleWarning) as caught:  # no record yet
            load_tuned("rgcn", graph, 8, 8, db=url, backend="reference")
        assert SECRET not in str(caught[0].message) and "***@" in str(caught[0].message)
        common = ["export", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--backend", "reference", "--db", url]
        assert main([*common, "--allow-default", "-o", "default"]) == 0
        _record(db, graph)
        assert main([*common, "-o", "tuned"]) == 0
        assert main(["best", "--db", url]) == 0 and main(["history", "--db", url, "--json"]) == 0
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    for folder in ("default", "tuned"):
        assert SECRET not in _files_text(tmp_path / folder)
    readme = (tmp_path / "tuned" / "README.txt").read_text()
    assert "***@" in readme  # names the database it came from, without the password
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        layer = load_tuned("rgcn", graph, 8, 8, db=url, backend="reference")
    assert SECRET not in json.dumps(layer.provenance, default=str)
