"""rgtune.costmodel: a learned cost model, fit on the SQL trial history, that steers the search.

* :mod:`.features`: what a schedule looks like to the model: the knob values one-hot (and the
  integer ones as numbers), the IR's counts for the schedule (:func:`rgtune.ir.counts.count`:
  FLOPs, bytes, GEMM rows, kernels, atomics; log-scaled, per edge and relative to the
  workload's default schedule), the kernels per template, the graph's statistics, the sizes,
  the device and backend. Nothing names a model or a knob.
* :mod:`.history`: the ``ok`` trials of one device and backend as training samples, graphs
  loaded once.
* :mod:`.model`: :class:`CostModel`, a scikit-learn regressor (gradient-boosted trees by
  default) of the log time normalized per workload, ``log(time / default-schedule time)``,
  trained on every workload of the device, so other graphs' trials help a new one; each
  workload weighs the same.
* :mod:`.training` and :mod:`.store`: fitting on the history and the saved model (next to an
  SQLite database, ``results.db.costmodel/``, or in the per-user cache), with a format version
  and a checksum; anything untrustworthy is refit.
* :mod:`.policies`: :class:`CostModelGuide`, the tuner's guide, with :class:`PrunePolicy` (skip
  candidates predicted clearly worse) or :class:`RankPolicy` (measure the best-predicted of a
  pool of proposals).
* :mod:`.metrics` and :mod:`.evaluation`: ranking metrics, and the holdout evaluation behind
  ``rgtune costmodel --eval`` (train on every other graph, rank the held-out one).

With fewer than :data:`MIN_TRIALS` ``ok`` trials, or fewer than :data:`MIN_WORKLOADS` workloads
(unless the tuned workload alone has :data:`MIN_TRIALS`), the model stays out of the way:
:attr:`CostModelGuide.status` says so and nothing is skipped.

Example: a guide in the tuning loop (the loop's side is :mod:`rgtune.tuner.study`):
    >>> from rgtune.tuner.study import TuneOptions
    >>> guide = CostModelGuide(CostModel(), PrunePolicy(margin=2.0, explore=0.1))
    >>> options = TuneOptions(trials=50, guide=guide)
    >>> sorted(guide.describe())
    ['counts', 'model', 'policy', 'status']
"""

from __future__ import annotations

from rgtune.costmodel.evaluation import HoldoutResult, evaluate_holdout
from rgtune.costmodel.features import FeatureEncoder, WorkloadContext, graph_features
from rgtune.costmodel.history import GraphLoader, Sample
from rgtune.costmodel.metrics import kendall_tau, ordered_pair_accuracy, ranking_metrics, topk_error
from rgtune.costmodel.model import ESTIMATORS, MIN_TRIALS, MIN_WORKLOADS, TARGETS, CostModel
from rgtune.costmodel.policies import CostModelGuide, PrunePolicy, RankPolicy
from rgtune.costmodel.store import FORMAT_VERSION
from rgtune.costmodel.training import HistoryFit, fit_on_history, model_path_for

__all__ = [
    "CostModel", "CostModelGuide", "PrunePolicy", "RankPolicy", "Sample", "WorkloadContext", "FeatureEncoder", "GraphLoader",
    "HistoryFit", "HoldoutResult", "ESTIMATORS", "TARGETS", "MIN_TRIALS", "MIN_WORKLOADS", "FORMAT_VERSION",
    "fit_on_history", "model_path_for", "evaluate_holdout", "graph_features",
    "ordered_pair_accuracy", "kendall_tau", "topk_error", "ranking_metrics",
]
