"""Test session setup for the tests and for the doctests of every module of the package.

* ``RGTUNE_DATA_DIR`` defaults to ``<repo>/../shared/datasets`` (found relative to this file).
* ``RGTUNE_CACHE_DIR`` is always a fresh folder for the session, so tests never read or write
  the user's cache; ``RGTUNE_CONFIG_DIR`` (the cost model's signing key) is a folder inside it, so
  tests never make or use the user's key; ``RGTUNE_DEVICE_LOCK_DIR`` too, so that the test processes
  of one run (``scripts/test`` runs two, pytest-xdist's workers) and a user's own ``tune`` never wait
  on one another's device lock; subprocesses started by tests inherit all four. pytest-xdist's workers
  share the session's folder (the caches are process-safe, as for the many ``tune`` processes of a
  user): a kernel or a parsed dataset one worker made, the other finds. A test that counts cache hits
  sets a folder of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent
_SHARED_DATASETS = _REPO.parent / "shared" / "datasets"
#: modules with no examples that cannot be imported on their own (Alembic runs env.py; __main__ runs the CLI)
collect_ignore = ["rgtune/cli/__main__.py", "rgtune/db/migrations"]
#: the session's cache folder, made by the process that removes it at the end (the controller of an xdist run)
_SESSION_VARIABLE = "RGTUNE_TEST_SESSION_CACHE"
_session_cache: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_cache
    os.environ.setdefault("RGTUNE_DATA_DIR", str(_SHARED_DATASETS))
    shared = os.environ.get(_SESSION_VARIABLE) if hasattr(config, "workerinput") else None
    if shared is None or not os.path.isdir(shared):
        shared = _session_cache = tempfile.mkdtemp(prefix="rgtune-test-cache-")
        os.environ[_SESSION_VARIABLE] = shared  # the xdist workers, started after this, inherit it
    os.environ["RGTUNE_CACHE_DIR"] = shared
    os.environ["RGTUNE_CONFIG_DIR"] = os.path.join(shared, "config")
    os.environ["RGTUNE_DEVICE_LOCK_DIR"] = os.path.join(shared, "device-locks")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)


#: seconds an exhaustive matrix's test may take (the whole matrix of the slowest is hours on 2 cores)
EXHAUSTIVE_TIMEOUT_S = 6 * 3600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Exhaustive matrices run only when asked for (``RGTUNE_EXHAUSTIVE=1``): the default run, CI's,
    takes their samples. Asked for, each gets ``EXHAUSTIVE_TIMEOUT_S`` instead of the suite's 600 s per test
    (one matrix, e.g. 600 RGAT training programs in 16 bits, is longer than that on 2 cores)."""
    if os.environ.get("RGTUNE_EXHAUSTIVE") == "1":
        for item in items:
            if item.get_closest_marker("exhaustive") is not None and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(EXHAUSTIVE_TIMEOUT_S))
        return
    skip = pytest.mark.skip(reason="exhaustive matrix: set RGTUNE_EXHAUSTIVE=1 to run it")
    for item in items:
        if item.get_closest_marker("exhaustive") is not None:
            item.add_marker(skip)
