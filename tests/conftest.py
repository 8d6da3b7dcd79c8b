"""Shared test setup: where the raw datasets are, and a private processed-graph cache.

* ``RGTUNE_DATA_DIR`` defaults to ``<repo>/../shared/datasets`` (found relative to this file).
* ``RGTUNE_CACHE_DIR`` is always a fresh folder for the session, so tests never read or write
  the user's cache; subprocesses started by tests inherit both.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

_REPO = Path(__file__).resolve().parent.parent
_SHARED_DATASETS = _REPO.parent / "shared" / "datasets"
_session_cache: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_cache
    os.environ.setdefault("RGTUNE_DATA_DIR", str(_SHARED_DATASETS))
    _session_cache = tempfile.mkdtemp(prefix="rgtune-test-cache-")
    os.environ["RGTUNE_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)


@pytest.fixture
def load_experiment() -> Callable[[str], ModuleType]:
    """``load("bench")`` imports ``experiments/bench.py`` (the scripts are not a package)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"rgtune_{name}_under_test", _REPO / "experiments" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
        spec.loader.exec_module(module)
        return module

    return load
