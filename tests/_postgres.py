"""A throwaway PostgreSQL server for tests: session fixture ``postgres_server``, per-test ``postgres_url``.

The server is real, local and private to the test session:

1. ``initdb``/``pg_ctl`` are found under ``/usr/lib/postgresql/<version>/bin`` or on ``PATH``.
   If missing and the tests run as root on a Debian-like system, ``apt-get install -y postgresql``
   installs them (``apt-get update`` first when the package is unknown).
2. A cluster is made in a fresh temporary directory (trust authentication, no locale) and
   started on a free **loopback** port (``listen_addresses=127.0.0.1``), durability switched off
   for speed. PostgreSQL refuses to run as root, so as root the commands run as the
   ``postgres`` user (``runuser``); otherwise as the current user.
3. After the session: ``pg_ctl stop -m immediate``, and the directory is removed.

Whatever prevents this (no apt, not root, no network for apt, ``psycopg`` not installed, a start
that fails) skips the tests that use the fixture, with the reason. ``RGTUNE_TEST_POSTGRES=0``
skips them on purpose; ``RGTUNE_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db`` uses an
existing server instead (the user must be allowed to CREATE DATABASE).

Use from any test module::

    import _postgres

    postgres_server = _postgres.postgres_server  # pytest finds fixtures by module attribute
    postgres_url = _postgres.postgres_url

    def test_two_workers(postgres_url: str) -> None:  # a fresh, empty database per test
        ...
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "PostgresUnavailable", "start_postgres", "postgres_server", "postgres_url"]

_USER = "rgtune"
_APT_TIMEOUT_S = 900


class PostgresUnavailable(RuntimeError):
    """Why no PostgreSQL server can be had here (becomes the skip reason)."""


@dataclass
class PostgresServer:
    """A running server; ``url(db)`` gives a SQLAlchemy URL for one of its databases."""

    admin_url: str  # a database on it the test user may CREATE DATABASE from
    data_dir: Path | None = None  # None for an external server
    bin_dir: Path | None = None
    run_as: str | None = None
    _created: list[str] = field(default_factory=list)

    def url(self, dbname: str) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.admin_url).set(database=dbname).render_as_string(hide_password=False)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        name = name or f"rgtune_test_{secrets.token_hex(4)}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: use lowercase letters, digits and _")
        self._admin(f'CREATE DATABASE "{name}"')
        self._created.append(name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        import sqlalchemy as sa

        engine = sa.create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(sql)
        finally:
            engine.dispose()

    def stop(self) -> None:
        """Stop a server this module started and delete its files; drop the databases of an external one."""
        if self.data_dir is None:
            for name in self._created:
                try:
                    self.drop_database(name)
                except Exception:  # noqa: BLE001, S110 - best effort cleanup of someone else's server
                    pass
            return
        assert self.bin_dir is not None
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"], self.run_as, check=False)
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _as_user(cmd: Sequence[str], run_as: str | None) -> list[str]:
    if run_as is None:
        return list(cmd)
    if shutil.which("runuser"):
        return ["runuser", "-u", run_as, "--", *cmd]
    return ["su", "-s", "/bin/sh", run_as, "-c", " ".join(shlex.quote(c) for c in cmd)]


def _run(
    cmd: Sequence[str], run_as: str | None, *, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    # cwd: somewhere the server's user may enter (initdb complains about an unreadable cwd).
    proc = subprocess.run(_as_user(cmd, run_as), capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir(), check=False)
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise PostgresUnavailable(f"{Path(cmd[0]).name} failed ({proc.returncode}): {' | '.join(tail)}")
    return proc


def _version_key(p: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", p.parent.parent.name)) or (0,)


def _find_bin_dir() -> Path | None:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version_key, reverse=True)
    for initdb in candidates:
        if (initdb.parent / "pg_ctl").exists():
            return initdb.parent
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "pg_ctl").exists():
        return Path(found).resolve().parent
    return None


def _apt_install() -> None:
    if os.name != "posix" or os.geteuid() != 0:
        raise PostgresUnavailable("PostgreSQL is not installed (no initdb) and installing it needs root")
    if not shutil.which("apt-get"):
        raise PostgresUnavailable("PostgreSQL is not installed (no initdb) and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"]
    for attempt in range(2):
        proc = subprocess.run(install, capture_output=True, text=True, timeout=_APT_TIMEOUT_S, env=env, check=False)
        if proc.returncode == 0:
            return
        if attempt == 0:  # a fresh image has no package lists yet
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=_APT_TIMEOUT_S, env=env, check=False)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
    raise PostgresUnavailable(f"apt-get install postgresql failed: {tail[0]}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as_user() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable("running as root and there is no 'postgres' user to run the server as") from None
    if not shutil.which("runuser") and not shutil.which("su"):
        raise PostgresUnavailable("running as root and neither runuser nor su is available to drop privileges")
    return "postgres"


def start_postgres() -> PostgresServer:
    """Install if needed, initdb and start a private server on a loopback port (see module docstring)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable("the psycopg driver is not installed (pip install 'rgtune[postgres]')") from None
    bin_dir = _find_bin_dir()
    if bin_dir is None:
        _apt_install()
        bin_dir = _find_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailable("apt-get installed postgresql but initdb/pg_ctl were not found")
    run_as = _run_as_user()
    # Not under pytest's basetemp: that is private to root, and the server may run as 'postgres'.
    base = Path(tempfile.mkdtemp(prefix="rgtune-pg-"))
    data = base / "data"
    try:
        if run_as is not None:
            shutil.chown(base, user=run_as, group=None)
        _run([str(bin_dir / "initdb"), "-D", str(data), "-U", _USER, "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"], run_as, timeout=180)
        last = ""
        for _ in range(3):  # the port may be taken between choosing and binding it
            port = _free_port()
            opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            proc = _run(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "-t", "60", "-o", opts, "start"],
                run_as,
                check=False,
                timeout=90,
            )
            if proc.returncode == 0:
                server = PostgresServer(f"postgresql+psycopg://{_USER}@127.0.0.1:{port}/postgres", data, bin_dir, run_as)
                _wait_ready(server)
                return server
            log = base / "server.log"
            last = log.read_text(errors="replace").strip().splitlines()[-1:][0] if log.exists() and log.stat().st_size else proc.stderr.strip()
        raise PostgresUnavailable(f"pg_ctl start failed: {last}")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise


def _wait_ready(server: PostgresServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            server._admin("SELECT 1")
            return
        except Exception as e:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise PostgresUnavailable(f"server started but does not answer: {e}") from None
            time.sleep(0.2)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole test session (skips the test if none can be had)."""
    if os.environ.get("RGTUNE_TEST_POSTGRES", "").strip() == "0":
        pytest.skip("PostgreSQL tests disabled by RGTUNE_TEST_POSTGRES=0")
    external = os.environ.get("RGTUNE_TEST_POSTGRES_URL")
    if external:
        server = PostgresServer(external)
    else:
        try:
            server = start_postgres()
        except (PostgresUnavailable, OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"no PostgreSQL server for the tests: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database on the session's server, dropped after the test."""
    name = f"rgtune_test_{secrets.token_hex(4)}"
    url = postgres_server.create_database(name)
    try:
        yield url
    finally:
        postgres_server.drop_database(name)
