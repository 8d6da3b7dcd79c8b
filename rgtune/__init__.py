"""rgtune: an autotuning compiler for relational graph neural network layers."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# heavy entry points load on first use, so that `import rgtune` stays light
_LAZY = {"compile": "rgtune.codegen.compile", "load_tuned": "rgtune.runtime", "load_exported": "rgtune.runtime"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rgtune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
