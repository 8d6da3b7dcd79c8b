"""Ranking metrics of a cost model on measured schedules: what a tuner needs from predictions.

A tuner only ever compares candidates, so the metrics are about order, not error in ms:

* **ordered pair accuracy** (OPA): of the pairs with different true times, the fraction the
  model orders the same way (a tie in the prediction counts one half); 0.5 is a coin. With a
  ``margin``, only the pairs whose true times differ by more than that fraction: two measurements
  of one schedule differ by 5-15% on a busy CPU, so the plain figure's pairs of near-equal schedules
  are partly coin flips that no model can win (``opa_10``: a 10% margin).
* **Kendall's tau** (tau-b, ties handled): the same agreement on a -1..1 scale.
* **top-k error**: ``(best true time among the model's k best-predicted - true best) / true best``;
  0 when the model's top k contain the true best.

Example:
    >>> true = [1.0, 2.0, 3.0, 4.0]
    >>> ordered_pair_accuracy([1, 2, 4, 3], true)   # one of six pairs swapped
    0.8333333333333334
    >>> ordered_pair_accuracy([1, 2, 4, 3], [1.0, 2.0, 3.0, 3.1], margin=0.1)   # the swapped pair is a near tie
    1.0
    >>> round(kendall_tau([1, 2, 4, 3], true), 4)
    0.6667
    >>> topk_error([4, 3, 2, 1], true, k=1)         # picks the slowest: 3x slower than the best
    3.0
    >>> topk_error([4, 3, 2, 1], true, k=4)
    0.0
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["ordered_pair_accuracy", "kendall_tau", "topk_error", "ranking_metrics"]


def ordered_pair_accuracy(pred: Sequence[float], true: Sequence[float], margin: float = 0.0) -> float:
    """Fraction of pairs with different true times (by more than ``margin``, a fraction of the faster one)
    that the prediction orders alike (NaN: no such pair)."""
    p, t = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    dt = np.sign(t[:, None] - t[None, :])
    dp = np.sign(p[:, None] - p[None, :])
    upper = np.triu(np.ones_like(dt, dtype=bool), k=1) & (dt != 0)
    if margin > 0:
        upper &= np.maximum(t[:, None], t[None, :]) > (1.0 + margin) * np.minimum(t[:, None], t[None, :])
    n = int(upper.sum())
    if n == 0:
        return math.nan
    agree = (dp[upper] == dt[upper]).sum() + 0.5 * (dp[upper] == 0).sum()
    return float(agree / n)


def kendall_tau(pred: Sequence[float], true: Sequence[float]) -> float:
    """Kendall's tau-b (NaN when either side is constant)."""
    from scipy.stats import kendalltau

    if len(pred) < 2:
        return math.nan
    tau = kendalltau(np.asarray(pred, dtype=float), np.asarray(true, dtype=float)).statistic
    return float(tau) if tau is not None else math.nan


def topk_error(pred: Sequence[float], true: Sequence[float], k: int) -> float:
    """How much slower the best of the model's top ``k`` is than the true best (relative)."""
    p, t = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if t.size == 0:
        return math.nan
    order = np.argsort(p, kind="stable")[:k]
    best = float(t.min())
    return float((t[order].min() - best) / best)


def ranking_metrics(pred: Sequence[float], true: Sequence[float]) -> dict[str, float]:
    """``opa``, ``kendall_tau``, ``top1_error``, ``top5_error`` and ``opa_10`` of one set of schedules."""
    return {"opa": ordered_pair_accuracy(pred, true), "kendall_tau": kendall_tau(pred, true),
            "top1_error": topk_error(pred, true, 1), "top5_error": topk_error(pred, true, 5),
            "opa_10": ordered_pair_accuracy(pred, true, margin=0.1)}
