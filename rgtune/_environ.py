"""Setting an environment variable for the length of a ``with`` block; reading an on/off one.

Example:
    >>> import os
    >>> with scoped_env("RGTUNE_EXAMPLE_VARIABLE", "1"):
    ...     os.environ["RGTUNE_EXAMPLE_VARIABLE"]
    '1'
    >>> "RGTUNE_EXAMPLE_VARIABLE" in os.environ
    False
    >>> with scoped_env("RGTUNE_EXAMPLE_VARIABLE", " Off"):
    ...     env_flag("RGTUNE_EXAMPLE_VARIABLE", default=True)
    False
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block; the previous value (or its absence) after it.

    A measurement worker started inside the block takes it (a worker takes its parent's environment as it is
    when it starts).
    """
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def parse_flag(text: str) -> bool:
    """``1/true/on/yes`` is True, ``0/false/off/no`` False (any case, spaces around); else ValueError."""
    value = text.strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{text!r}: give 1 (true, on, yes) or 0 (false, off, no)")
    return value in _ON


def env_flag(name: str, default: bool) -> bool:
    """The on/off environment variable ``name`` (:func:`parse_flag`), ``default`` when unset; a ValueError
    that names the variable when it is neither."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return parse_flag(text)
    except ValueError as e:
        raise ValueError(f"{name}={e}") from None
