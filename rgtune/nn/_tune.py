"""``rgtune.tune``: a model name on a dataset or graph (:func:`rgtune.tuner.tune`), or a script's own
``torch.nn.Module`` on example inputs (:func:`tune_model`: the workloads of the rgtune modules inside it).

It lives here, above :mod:`rgtune.tuner`, because a model's workloads are what its modules of :mod:`rgtune.nn`
look up (:func:`rgtune.nn._dropin.collect_workloads`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from rgtune.ir.registry import parse_key
from rgtune.nn._dropin import collect_workloads, forget_schedules
from rgtune.tuner import TuneSummary
from rgtune.tuner import tune as tune_workload

__all__ = ["tune", "tune_model"]


def tune(model: Any, *inputs: Any, **kwargs: Any) -> Any:
    """Tune a model name on a dataset or a graph, ``tune("hgt", "aifb", hidden=16, trials=10)``: as
    :func:`rgtune.tuner.tune` (``tune --model ... --dataset ...``), returning its :class:`TuneSummary`; or every
    rgtune module of a ``torch.nn.Module`` on the inputs of one call, ``tune(model, x, edge_index, edge_type,
    trials=50)``: as :func:`tune_model`, returning one summary per workload.
    """
    if isinstance(model, torch.nn.Module):
        return tune_model(model, *inputs, **kwargs)
    if len(inputs) != 1:
        raise TypeError(f"rgtune.tune({model!r}, dataset, ...) takes one dataset or graph after the model name, got "
                        f"{len(inputs)} positional arguments (a torch.nn.Module as the first argument takes the inputs "
                        "of one call)")
    return tune_workload(model, inputs[0], **kwargs)


def tune_model(module: torch.nn.Module, *inputs: Any, trials: int | None = 50, mode: str | None = None,
               db: str | None = None, backend: str = "auto", kwargs: Mapping[str, Any] | None = None,
               **tune_args: Any) -> list[TuneSummary]:
    """Tune the workloads of every rgtune module (:mod:`rgtune.nn.pyg`, :mod:`rgtune.nn.dgl`) inside ``module``.

    ``module(*inputs, **kwargs)`` runs once, without gradients, with a forward hook on each such module; each
    distinct workload they met (the model, the graph the module built, its sizes and options, the backend of
    the inputs' device, the module's ``mode``) is tuned with :func:`rgtune.tuner.tune` (the graph stored by
    content, as the modules look their schedules up), and the modules forget the schedules they had looked up:
    their next call finds the tuned ones. ``db``: where to record them (default: each module's own ``db``;
    given, the modules' lookups read it from now on). ``mode``: default each module's own (a drop-in's is
    ``"training"``). ``backend``: ``"auto"`` (the backend each module ran on) or a backend's name.
    ``tune_args``: further arguments of :func:`rgtune.tuner.tune` (``seed``, ``cost_model``, ``progress``,
    ``precision``, ``time_budget``, ``confirm_top``, ...). Returns the summaries, one per workload.

    Example:
        >>> import os, tempfile, torch
        >>> from rgtune.nn.pyg import RGCNConv
        >>> db = os.path.join(tempfile.mkdtemp(), "results.db")
        >>> conv = RGCNConv(4, 4, num_relations=2, db=db)
        >>> x, edge_index, edge_type = torch.randn(6, 4), torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([0, 1, 1])
        >>> summaries = tune_model(conv, x, edge_index, edge_type, trials=1, seed=0, progress=False, cost_model=False,
        ...                        confirm_top=0)
        >>> [s.measured for s in summaries]
        [1]
    """
    for refused in ("options", "in_dim", "out_dim", "hidden", "heads", "batches"):
        if refused in tune_args:
            raise TypeError(f"rgtune.tune(module, ...): {refused}= is for tune(model_name, dataset); a module's "
                            "workloads (options, sizes) are its own")
    workloads, met = collect_workloads(module, inputs, kwargs)
    if db is not None:
        for m in met:  # their next lookups read where the schedules are
            m.db = db
    summaries = []
    for w in workloads:
        where = db if db is not None else w.db
        if where is None:
            raise ValueError(f"rgtune.tune: a {w.model} module of {type(module).__name__} has db=None (no schedule "
                             "lookup); give it a database (db='results.db') or pass db= here")
        if not isinstance(where, str):  # an open TrialDatabase
            where = where.url
        summaries.append(tune_workload(w.model, w.graph, options=dict(parse_key(w.options)), in_dim=w.in_dim,
                                       out_dim=w.out_dim, heads=w.heads, trials=trials, db=where, mode=mode or w.mode,
                                       backend=w.backend if backend == "auto" else backend, **tune_args))
    forget_schedules(met)
    return summaries
