"""Parameters of the big test matrices: the default run takes a sample, ``RGTUNE_EXHAUSTIVE=1`` the whole.

The exhaustive marker is defined in ``conftest.py`` (its tests are skipped unless the variable is set).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pytest

__all__ = ["sampled"]


def sampled(models: Iterable[str], default: int | Mapping[str, int], full: int) -> list[Any]:
    """``(model, n)`` parameters: each model with its default-run ``n`` (``default``, or ``default[model]``
    with ``full`` for a model it does not name), and ``(model, full)`` marked ``exhaustive`` for each model
    whose default is not ``full``. ``n`` is a count of draws or a stride, whatever the test makes of it.

    Example:
        >>> [getattr(p, "values", p) for p in sampled(["rgcn", "hgt"], {"hgt": 3}, 1)]
        [('rgcn', 1), ('hgt', 3), ('hgt', 1)]
    """
    models = list(models)
    pick = (lambda m: default.get(m, full)) if isinstance(default, Mapping) else (lambda m: default)
    return ([(m, pick(m)) for m in models]
            + [pytest.param(m, full, marks=pytest.mark.exhaustive) for m in models if pick(m) != full])
