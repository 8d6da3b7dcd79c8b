"""``rgtune._environ.scoped_env``: set for the block, restored after it (also after an error)."""

from __future__ import annotations

import doctest
import os

import pytest

from rgtune import _environ
from rgtune._environ import scoped_env


def test_docstring_example_runs() -> None:
    result = doctest.testmod(_environ)
    assert result.attempted > 0 and result.failed == 0


def test_a_previous_value_comes_back_even_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RGTUNE_TEST_SCOPED", "before")
    with pytest.raises(RuntimeError), scoped_env("RGTUNE_TEST_SCOPED", "inside"):
        assert os.environ["RGTUNE_TEST_SCOPED"] == "inside"
        raise RuntimeError("boom")
    assert os.environ["RGTUNE_TEST_SCOPED"] == "before"
