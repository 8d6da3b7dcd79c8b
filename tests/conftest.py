"""Shared test fixtures (the session's data and cache folders are set by the repository's conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

_REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def load_experiment() -> Callable[[str], ModuleType]:
    """``load("tuning_curves")`` imports ``experiments/tuning_curves.py`` (the scripts are not a package)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"rgtune_{name}_under_test", _REPO / "experiments" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
        spec.loader.exec_module(module)
        return module

    return load
