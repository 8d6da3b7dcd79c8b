"""rgtune.runtime: tuned layers as trainable ``torch.nn.Module`` s, from the database or an export folder.

* :func:`load_tuned` -- the best recorded schedule of a workload on this device (default
  schedule and a warning naming the ``tune`` command when there is none);
* :func:`export` / :func:`load_exported` -- a self-contained folder (sources, schedule,
  provenance) and its loader, which needs no database;
* :class:`Layer` -- any model's program as a trainable module: its parameters are the
  program's, its forward and backward run the generated kernels (see :mod:`.module`).

Example:
    >>> import torch, warnings
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")            # no database here: default schedule
    ...     layer = load_tuned("hgt", g, in_dim=8, out_dim=8, heads=2, db=None, backend="reference")
    >>> layer(torch.randn(30, 8)).shape
    torch.Size([30, 8])
"""

from rgtune.runtime._lookup import TunedScheduleWarning
from rgtune.runtime.export import NoTunedScheduleError, export, export_layer, load_exported
from rgtune.runtime.load import load_tuned
from rgtune.runtime.module import GraphMismatchError, Layer

__all__ = [
    "load_tuned",
    "load_exported",
    "export",
    "export_layer",
    "Layer",
    "GraphMismatchError",
    "NoTunedScheduleError",
    "TunedScheduleWarning",
]
