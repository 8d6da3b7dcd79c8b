"""How the tuner's options refuse a bad value: :class:`OptionError`, raised by the options' own dataclasses.

:class:`~rgtune.tuner.study.TuneOptions` and :class:`~rgtune.tuner.measure.MeasureOptions` check
their values when they are made, with the helpers here, and nowhere else: ``tune`` on the command
line builds them from its flags and shows their :class:`OptionError` under the flag's name
(:meth:`OptionError.shown_as`).

Example:
    >>> e = OptionError("stop_slower", 0.5, "a factor above 1, or off")
    >>> str(e)
    'stop_slower must be a factor above 1, or off, got 0.5'
    >>> e.shown_as("--stop-slower", "0.5")
    '--stop-slower must be a factor above 1, or off, got 0.5'
    >>> str(OptionError("timing", "blocks", choices=("plain", "paired")))
    "unknown timing 'blocks'; choose one of ['plain', 'paired']"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["OptionError", "check_choice", "check_positive", "check_at_least"]


class OptionError(ValueError):
    """A bad value of an option: which option, the value, and what it may be (a requirement or choices)."""

    def __init__(self, option: str, value: Any, requirement: str = "", choices: Sequence[Any] = ()) -> None:
        self.option, self.value, self.requirement, self.choices = option, value, requirement, tuple(choices)
        super().__init__(self.shown_as(option, repr(value)))

    def shown_as(self, name: str, value: str) -> str:
        """The message with the option called ``name`` (e.g. its flag) and its value written as ``value``."""
        if self.choices:
            return f"unknown {name} {value}; choose one of {list(self.choices)}"
        return f"{name} must be {self.requirement}, got {value}"


def check_choice(option: str, value: Any, choices: Sequence[Any]) -> None:
    """Refuse ``value`` unless it is one of ``choices``."""
    if value not in choices:
        raise OptionError(option, value, choices=choices)


def check_positive(option: str, value: Any, requirement: str, *, optional: bool = False) -> None:
    """Refuse ``value`` unless it is a finite number above 0 (or, ``optional``, None)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise OptionError(option, value, requirement)


def check_at_least(option: str, value: Any, least: int, requirement: str) -> None:
    """Refuse ``value`` unless it is an integer of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionError(option, value, requirement)
