"""rgtune.tuner: the search. An Optuna study per workload, each trial measured in an isolated worker.

* :mod:`.workload`: :class:`Workload`, what is tuned;
* :mod:`.options`: :class:`OptionError`, how :class:`TuneOptions` and :class:`MeasureOptions` refuse a value;
* :mod:`.study`: :class:`Tuner`, the loop (ask, suggest a point, skip or measure, tell), the
  recheck of a new best, the confirmation of the fastest schedules at the end, crash safety;
  the :class:`~.study.Guide` protocols a cost model implements;
* :mod:`.proposals`: candidate pools on an in-memory copy of the study;
* :mod:`.measure`: the worker process (compile, verify against the float64 reference, time),
  killed and restarted when a kernel hangs or crashes;
* :mod:`.batches`: a sampler workload's trials, timed on fixed sampled batches (``tune --batches``);
* :mod:`.device_lock`: the cross-process lock that keeps studies sharing a GPU from timing
  each other's kernels.

:func:`tune` is ``tune`` on the command line, from Python. ``docs/tuner.md`` explains the loop's
choices.

Example:
    >>> import os, tempfile
    >>> db = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'results.db')}"
    >>> s = tune("rgcn", "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3", hidden=8, trials=3, db=db,
    ...          backend="reference", seed=0, progress=False, confirm_top=0)
    >>> s.measured, s.best_ms is not None
    (3, True)
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.db import DEFAULT_URL
from rgtune.tuner.measure import MeasureOptions
from rgtune.tuner.study import TuneOptions, TuneSummary, Tuner
from rgtune.tuner.workload import Workload

__all__ = ["tune", "Tuner", "TuneOptions", "TuneSummary", "Workload", "MeasureOptions"]


def tune(model: str, dataset: Any, *, options: Mapping[str, Any] | None = None, hidden: int = 64, heads: int = 1,
         trials: int | None = 50, db: str = DEFAULT_URL, backend: str = "auto", data_dir: str | None = None,
         seed: int | None = None, mode: str = "inference", cost_model: bool | None = None, progress: bool = True,
         batches: str | None = None, in_dim: int | None = None, out_dim: int | None = None,
         precision: str = "fp32", **tune_options: Any) -> TuneSummary:
    """Tune ``model`` on ``dataset`` as ``tune --model ... --dataset ...`` does, and return the summary.

    ``model``: a registered model (:func:`rgtune.register_model`) or ``"package.module:builder"``;
    ``dataset``: a dataset name, or a graph (a :class:`~rgtune.data.HeteroGraph`, a PyG ``HeteroData``, a DGL
    graph): it is stored by content for the measurement worker (:mod:`rgtune.data.stored`), and
    :func:`~rgtune.runtime.load_tuned` finds its schedules by that content. ``in_dim``/``out_dim``: the layer's
    sizes (default ``hidden`` both);
    ``options``: the model's options (``{"num_bases": 30}``; part of the workload's identity).
    ``backend="auto"`` is cuda where a GPU is usable, else cpu. ``mode="training"`` tunes one training step
    (forward, then the gradients of the input and every param) instead of the forward. ``batches``: a sampler
    (``"neighbor:fanout=15x10,batch_size=1024"``, :class:`~rgtune.data.sampler_spec.SamplerSpec`): each trial
    is timed on its fixed batches instead of the whole graph (:mod:`.batches`). ``precision``: the storage
    types the schedules may keep per-edge intermediates in (``fp32``, ``bf16``, ``fp16``, ``any``: searched;
    :mod:`rgtune.ir.passes.precision`), part of the workload's identity. ``cost_model``: the learned
    cost model steers the search with its default policy (it stays idle until the device's history is large
    enough; a sampler workload's candidates it ranks by what they do on its batches); default on.
    ``tune_options`` are further :class:`TuneOptions` fields (``time_budget``, ``confirm_top``,
    ``recheck``, ``measure``, ...). The same call resumes the same study; every trial is recorded in ``db``.
    """
    from rgtune.codegen.base import auto_backend

    guide = None
    if cost_model is not False:  # None: the default, on
        from rgtune.costmodel import CostModelGuide, RankPolicy

        guide = CostModelGuide(policy=RankPolicy(seed=seed or 0), data_dir=data_dir)
    name = auto_backend() if backend == "auto" else backend
    graph = None
    if not isinstance(dataset, str):  # the user's own graph: stored by content for the worker to load
        from rgtune.data import as_hetero_graph, store_graph

        graph = as_hetero_graph(dataset)
        dataset = store_graph(graph)
    workload = Workload(model, dataset, in_dim or hidden, out_dim or hidden, heads, name, data_dir, mode, options or {},
                        batches=batches, precision=precision)
    from rgtune.db import TrialDatabase

    with TrialDatabase(db) as database:
        return Tuner(workload, database, TuneOptions(trials=trials, seed=seed, progress=progress, guide=guide,
                                                      **tune_options), graph=graph).run()
