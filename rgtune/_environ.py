"""Setting an environment variable for the length of a ``with`` block.

Example:
    >>> import os
    >>> with scoped_env("RGTUNE_EXAMPLE_VARIABLE", "1"):
    ...     os.environ["RGTUNE_EXAMPLE_VARIABLE"]
    '1'
    >>> "RGTUNE_EXAMPLE_VARIABLE" in os.environ
    False
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block; the previous value (or its absence) after it.

    Child processes started inside the block (a spawned measurement worker) inherit it.
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
