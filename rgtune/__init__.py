"""rgtune: an autotuning compiler for relational graph neural network layers.

The entry points: :func:`tune` (search and record the schedules of a workload: ``tune("hgt", "aifb")``, or of
each rgtune module a model runs on example inputs: ``tune(model, x, edge_index, edge_type, trials=50)``),
:func:`load_tuned` (the best one as a trainable ``torch.nn.Module``), :func:`load_exported`
(the same from an ``rgtune export`` folder, without the database), :func:`compile` (one
schedule, as a callable), :class:`Layer` (any model's program as a module, ``rgtune.nn.Layer``)
and :func:`register_model` (a model of your own: a builder of its IR program). The packages, bottom to top: ``data``, ``ir`` and ``models``,
``codegen``, ``search_spaces``, ``db``, ``costmodel``, ``tuner``, ``runtime``, ``bench``, ``cli``.
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"

# idle OpenMP threads sleep instead of spinning: rgtune's generated kernels and torch run on
# two OpenMP runtimes that otherwise steal each other's cores (see rgtune/codegen/cpu/__init__.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# heavy entry points load on first use, so that `import rgtune` stays light
_LAZY = {"tune": "rgtune.nn._tune", "compile": "rgtune.runtime.compile", "load_tuned": "rgtune.runtime",
         "load_exported": "rgtune.runtime", "Layer": "rgtune.runtime", "register_model": "rgtune.ir.registry",
         "list_models": "rgtune.ir.registry"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rgtune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
