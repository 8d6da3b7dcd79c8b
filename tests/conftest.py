"""Shared test setup: where the raw datasets are, and a private processed-graph cache.

* ``RGTUNE_DATA_DIR`` defaults to ``<repo>/../shared/datasets`` (found relative to this file).
* ``RGTUNE_CACHE_DIR`` is always a fresh folder for the session, so tests never read or write
  the user's cache; subprocesses started by tests inherit both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_SHARED_DATASETS = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"
_session_cache: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_cache
    os.environ.setdefault("RGTUNE_DATA_DIR", str(_SHARED_DATASETS))
    _session_cache = tempfile.mkdtemp(prefix="rgtune-test-cache-")
    os.environ["RGTUNE_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)
