"""The learned cost model: fit on the SQL trial history, prune the search, transfer across graphs.

What it is made of (one private module each):

* features (``_costmodel_features``): the knob values one-hot (and the integer ones as
  numbers), the IR's counts for the schedule (:func:`rgtune.ir.counts.count`: FLOPs, minimum
  and gathered bytes, GEMM rows, kernels launched, atomics; log-scaled, per edge and relative
  to the workload's default schedule), the kernels per template, the graph's statistics
  (nodes, edges, relations, degree skew, unique-pair ratios), the sizes and the device and
  backend. Nothing names a model or a knob.
* the model (``_costmodel_model``): a scikit-learn regressor (gradient-boosted trees by
  default) on the log time normalized per workload, ``log(time / default-schedule time)``,
  trained on every ``ok`` trial of the same device and backend, so other graphs' trials
  help a new one; each workload weighs the same (``current_weight`` can weigh the tuned one
  more: up to 12 workloads' worth ranked its unmeasured schedules no better once it had 5-40
  trials, ``experiments/costmodel_transfer.py --warm``, so the default is 1).
* training and the saved model (``_costmodel_train``, ``_costmodel_store``): next to an
  SQLite database (``results.db.costmodel/``) or in the per-user cache, with a format
  version and a checksum; anything untrustworthy is retrained.
* the policies (``_costmodel_pruner``): :class:`CostModelPruner`, the ``TuneOptions.pruner``
  hook, with :class:`PrunePolicy` (skip candidates predicted clearly worse) or
  :class:`RankPolicy` (measure the best-predicted of a pool of proposals).
* the holdout evaluation and ``rgtune costmodel`` (``_costmodel_eval``).

With fewer than :data:`MIN_TRIALS` ``ok`` trials, or fewer than :data:`MIN_WORKLOADS`
workloads (unless the tuned workload alone has :data:`MIN_TRIALS`), the model stays out of
the way: :attr:`CostModelPruner.status` says so and nothing is pruned.

Example: a pruner in the tuning loop (the loop wiring is in ``study.py``):
    >>> from rgtune.tuner.study import TuneOptions
    >>> pruner = CostModelPruner(CostModel(), PrunePolicy(margin=2.0, explore=0.1))
    >>> options = TuneOptions(trials=50, pruner=pruner)
    >>> sorted(pruner.describe())
    ['counts', 'model', 'policy', 'status']
"""

from __future__ import annotations

from rgtune.tuner._costmodel_eval import HoldoutResult, costmodel_main, evaluate_holdout
from rgtune.tuner._costmodel_features import FeatureEncoder, WorkloadContext, graph_features
from rgtune.tuner._costmodel_history import GraphLoader, Sample
from rgtune.tuner._costmodel_metrics import kendall_tau, ordered_pair_accuracy, ranking_metrics, topk_error
from rgtune.tuner._costmodel_model import ESTIMATORS, MIN_TRIALS, MIN_WORKLOADS, TARGETS, CostModel
from rgtune.tuner._costmodel_pruner import CostModelPruner, PrunePolicy, RankPolicy
from rgtune.tuner._costmodel_store import FORMAT_VERSION
from rgtune.tuner._costmodel_train import HistoryFit, fit_on_history, model_path_for

__all__ = [
    "CostModel", "CostModelPruner", "PrunePolicy", "RankPolicy", "Sample", "WorkloadContext", "FeatureEncoder", "GraphLoader",
    "HistoryFit", "HoldoutResult", "ESTIMATORS", "TARGETS", "MIN_TRIALS", "MIN_WORKLOADS", "FORMAT_VERSION",
    "fit_on_history", "model_path_for", "evaluate_holdout", "costmodel_main", "graph_features",
    "ordered_pair_accuracy", "kendall_tau", "topk_error", "ranking_metrics",
]
