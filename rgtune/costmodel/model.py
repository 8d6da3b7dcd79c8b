"""The learned cost model: a scikit-learn regressor on per-workload normalized log times.

Absolute times do not transfer between graphs (AIFB's layer takes milliseconds, ogbn-mag's
seconds), but the *relative* cost of schedules largely does: so the target is normalized
within each workload, and so are the strongest features (counts relative to the default
schedule). Targets (``target=``):

* ``log_default`` (the default): ``log(time / the workload's default-schedule time)``;
  the default schedule is the first trial of every study, so the anchor is always measured
  (a workload without it is anchored at its median time);
* ``zscore``: the per-workload z-score of log time;
* ``rank``: the per-workload percentile of the time (0 fastest, 1 slowest), a ranking proxy.

Predictions are scores (lower is faster); :class:`~rgtune.costmodel.CostModelGuide`
turns them into milliseconds with the trials measured so far.

Example:
    >>> import random
    >>> samples = [Sample(f"w{w}", {"num:x": x, "num:g": w}, (1 + w) * (1 + x))
    ...            for w in range(3) for x in range(20)]
    >>> m = CostModel(estimator="et", min_trials=30).fit(samples)
    >>> m.ready, m.n_trials, m.n_workloads
    (True, 60, 3)
    >>> s = m.predict([{"num:x": 1.0, "num:g": 5.0}, {"num:x": 15.0, "num:g": 5.0}])
    >>> bool(s[0] < s[1])
    True
    >>> CostModel(min_trials=100).fit(samples).status.startswith("cost model off")
    True
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter, defaultdict
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rgtune.costmodel.features import FeatureEncoder
from rgtune.costmodel.history import Sample

log = logging.getLogger("rgtune.costmodel")

__all__ = ["CostModel", "ESTIMATORS", "TARGETS", "MIN_TRIALS", "MIN_WORKLOADS", "CURRENT_WEIGHT", "sample_weights"]

#: below this many ``ok`` trials (on this device and backend) the model stays out of the way
MIN_TRIALS = 30
#: ... or with fewer workloads than this, unless the current workload alone has MIN_TRIALS
MIN_WORKLOADS = 2

TARGETS = ("log_default", "zscore", "rank")

#: the default weight of the workload being tuned, in workloads' worth (see ``CostModel``)
CURRENT_WEIGHT = 1.0


def _hgb(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    # small and shallow: hundreds to thousands of rows, retrained while tuning
    return HistGradientBoostingRegressor(max_iter=150, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=5,
                                         l2_regularization=1.0, early_stopping=False, random_state=seed)


def _imputed(est: Any) -> Any:
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline

    # these trees take no NaN: a graph without counts gets the column median
    return make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True), est)


def _gbr(seed: int) -> Any:
    from sklearn.ensemble import GradientBoostingRegressor

    return _imputed(GradientBoostingRegressor(n_estimators=150, max_depth=4, learning_rate=0.1, subsample=0.8,
                                              random_state=seed))


def _rf(seed: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    return _imputed(RandomForestRegressor(n_estimators=150, min_samples_leaf=2, max_features=0.5, n_jobs=1,
                                          random_state=seed))


def _et(seed: int) -> Any:
    from sklearn.ensemble import ExtraTreesRegressor

    return _imputed(ExtraTreesRegressor(n_estimators=150, min_samples_leaf=2, max_features=0.5, n_jobs=1,
                                        random_state=seed))


class PairwiseTrees:
    """Gradient-boosted regression trees on a pairwise ranking loss: what a tuner needs is which of two
    schedules of one workload is faster, not by how many milliseconds.

    The score ``s`` (lower is faster) is a sum of trees, each fit to the gradient of RankNet's logistic
    loss ``log(1 + exp(s_fast - s_slow))`` over pairs of one group (a workload) with different targets,
    at most ``max_pairs`` per group (drawn); a group's pairs weigh, together, what its samples weigh
    (``sample_weight``: the cost model weighs workloads alike). Times of different workloads are never compared. Trees are scikit-learn's (they route NaN, a row without counts).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = rng.random((60, 2))
        >>> y = x[:, 0] * 3 + x[:, 1]                    # the order the trees should learn
        >>> m = PairwiseTrees(n_estimators=40).fit(x, y, groups=[i % 3 for i in range(60)])
        >>> s = m.predict(np.array([[0.1, 0.5], [0.9, 0.5]]))
        >>> bool(s[0] < s[1])
        True
    """

    needs_groups = True

    def __init__(self, n_estimators: int = 150, learning_rate: float = 0.1, max_leaf_nodes: int = 15,
                 min_samples_leaf: int = 5, max_pairs: int = 2000, seed: int = 0) -> None:
        self.n_estimators, self.learning_rate = n_estimators, learning_rate
        self.max_leaf_nodes, self.min_samples_leaf = max_leaf_nodes, min_samples_leaf
        self.max_pairs, self.seed = max_pairs, seed
        self.trees: list[Any] = []

    def _pairs(self, y: np.ndarray, groups: Sequence[Any], weight: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(faster, slower, weight) of the pairs, weights with mean 1."""
        rng = np.random.default_rng(self.seed)
        by_group: dict[Any, list[int]] = defaultdict(list)
        for i, g in enumerate(groups):
            by_group[g].append(i)
        fast, slow, w = [], [], []
        for g in sorted(by_group, key=str):
            idx = np.asarray(by_group[g])
            a, b = np.triu_indices(len(idx), 1)
            a, b = idx[a], idx[b]
            a, b = a[y[a] != y[b]], b[y[a] != y[b]]
            f, sl = np.where(y[a] < y[b], a, b), np.where(y[a] < y[b], b, a)
            if len(f) > self.max_pairs:
                pick = rng.choice(len(f), self.max_pairs, replace=False)
                f, sl = f[pick], sl[pick]
            if len(f):
                fast.append(f)
                slow.append(sl)
                w.append(np.full(len(f), weight[idx].mean() * len(idx) / len(f)))
        if not fast:
            raise ValueError("no pair of samples of one group with different targets: nothing to rank")
        pw = np.concatenate(w)
        return np.concatenate(fast), np.concatenate(slow), pw / pw.mean()

    def fit(self, x: np.ndarray, y: np.ndarray, groups: Sequence[Any],
            sample_weight: np.ndarray | None = None) -> "PairwiseTrees":
        from sklearn.tree import DecisionTreeRegressor

        y = np.asarray(y, dtype=float)
        n = len(y)
        fast, slow, w = self._pairs(y, groups, np.ones(n) if sample_weight is None else np.asarray(sample_weight))
        mass = np.bincount(fast, w, n) + np.bincount(slow, w, n)  # how much of the loss each sample is in
        s = np.zeros(n)
        self.trees = []
        for m in range(self.n_estimators):
            p = 1.0 / (1.0 + np.exp(s[slow] - s[fast]))  # the chance the model orders a pair wrong
            grad = np.bincount(fast, w * p, n) - np.bincount(slow, w * p, n)
            tree = DecisionTreeRegressor(max_leaf_nodes=self.max_leaf_nodes, min_samples_leaf=self.min_samples_leaf,
                                         random_state=self.seed + m)
            # each sample's mean gradient, weighted by its share of the loss (samples in no pair weigh nothing)
            tree.fit(x, -grad / np.maximum(mass, 1e-12), sample_weight=mass + 1e-12)
            s += self.learning_rate * tree.predict(x)
            self.trees.append(tree)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(len(x))
        for tree in self.trees:
            out += self.learning_rate * tree.predict(x)
        return out


def _pairwise(seed: int) -> PairwiseTrees:
    return PairwiseTrees(seed=seed)


#: scikit-learn regressors by name: a factory ``seed -> estimator``; any regressor with fit/predict works (one
#: with ``needs_groups`` is given each sample's workload as ``groups``)
ESTIMATORS: dict[str, Callable[[int], Any]] = {"hgb": _hgb, "gbr": _gbr, "rf": _rf, "et": _et, "pairwise": _pairwise}


def normalized_targets(samples: Sequence[Sample], target: str) -> np.ndarray:
    """The training target of each sample, normalized within its workload (see the module docstring)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {list(TARGETS)}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.workload].append(i)
    logt = np.log(np.array([s.ms for s in samples], dtype=float))
    y = np.empty(len(samples))
    for idx in groups.values():
        v = logt[idx]
        if target == "log_default":
            anchors = [logt[i] for i in idx if samples[i].is_default]
            y[idx] = v - (float(np.median(anchors)) if anchors else float(np.median(v)))
        elif target == "zscore":
            y[idx] = (v - v.mean()) / max(float(v.std()), 1e-3)
        else:
            from scipy.stats import rankdata

            y[idx] = (rankdata(v) - 1) / max(len(v) - 1, 1)
    return y


def sample_weights(samples: Sequence[Sample], *, balance: bool, current: str | None = None,
                   current_weight: float = 1.0) -> np.ndarray | None:
    """Training weights (mean 1): each workload's total weight equal when ``balance``, the
    ``current`` workload's times ``current_weight``; None when every weight would be 1.

    Example:
        >>> s = [Sample("a", {}, 1.0), Sample("a", {}, 2.0), Sample("b", {}, 1.0)]
        >>> sample_weights(s, balance=True).tolist()
        [0.75, 0.75, 1.5]
        >>> sample_weights(s, balance=True, current="b", current_weight=4.0).tolist()
        [0.3, 0.3, 2.4]
        >>> sample_weights(s, balance=False) is None
        True
    """
    if not balance and (current is None or current_weight == 1.0):
        return None
    counts: dict[str, int] = defaultdict(int)
    for s in samples:
        counts[s.workload] += 1
    w = np.array([(1.0 / counts[s.workload] if balance else 1.0) * (current_weight if s.workload == current else 1.0)
                  for s in samples])
    return w * (len(samples) / w.sum())


class CostModel:
    """Features -> a per-workload relative score of a schedule (lower is faster).

    Args:
        estimator: a name of :data:`ESTIMATORS` or a factory ``seed -> regressor``.
        target: how times are normalized per workload (:data:`TARGETS`).
        min_trials, min_workloads: how much history it takes before the model is :attr:`ready`.
        balance: weight each workload equally (a workload with many trials does not drown the others).
        current_weight: how many workloads' worth of weight the workload being tuned (``fit``'s
            ``current``) gets: 1 counts it as one workload among the others; more lets its own
            trials, once it has some, decide where the other graphs' history disagrees.
        seed: the estimator's random state (fits are deterministic).
    """

    def __init__(self, estimator: str | Callable[[int], Any] = "hgb", target: str = "log_default", *,
                 min_trials: int = MIN_TRIALS, min_workloads: int = MIN_WORKLOADS, balance: bool = True,
                 current_weight: float = CURRENT_WEIGHT, seed: int = 0) -> None:
        if isinstance(estimator, str) and estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}")
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; choose one of {list(TARGETS)}")
        if not (math.isfinite(current_weight) and current_weight > 0):
            raise ValueError(f"current_weight must be a positive number of workloads' worth, got {current_weight}")
        self.estimator = estimator
        self.target = target
        self.min_trials = int(min_trials)
        self.min_workloads = int(min_workloads)
        self.balance = balance
        self.current_weight = float(current_weight)
        self.seed = seed
        self.encoder: FeatureEncoder | None = None
        self.regressor: Any = None
        self.n_trials = 0
        self.n_workloads = 0
        #: log-time change per unit of score (1 for ``log_default``): how the guide reads scores as ms
        self.log_scale = 1.0
        self.trained_on: tuple[int, ...] = ()  # trial ids of the last fit (None ids left out)
        self.status = "cost model off: not trained yet"

    # ------------------------------------------------------------------ settings
    def params(self) -> dict[str, Any]:
        """The settings, as plain values (stored with a study, printed by the CLI)."""
        est = self.estimator if isinstance(self.estimator, str) else getattr(self.estimator, "__name__", "custom")
        return {"estimator": est, "target": self.target, "min_trials": self.min_trials,
                "min_workloads": self.min_workloads, "balance": self.balance,
                "current_weight": self.current_weight, "seed": self.seed}

    @property
    def ready(self) -> bool:
        """Trained on enough history to be trusted with pruning."""
        return self.regressor is not None and self.status.startswith("cost model on")

    def _enough(self, samples: Sequence[Sample], current: str | None) -> tuple[bool, str]:
        n, workloads = len(samples), {s.workload for s in samples}
        own = sum(1 for s in samples if s.workload == current) if current is not None else 0
        if n >= self.min_trials and (len(workloads) >= self.min_workloads or own >= self.min_trials):
            return True, f"cost model on: trained on {n} ok trials of {len(workloads)} workload(s)"
        return False, (f"cost model off: {n} ok trial(s) of {len(workloads)} workload(s) on this device and "
                       f"backend; it needs >= {self.min_trials} trials on >= {self.min_workloads} workloads "
                       f"(or {self.min_trials} on this one); tuning without it")

    # ------------------------------------------------------------------ fit / predict
    def fit(self, samples: Sequence[Sample], current: str | None = None) -> "CostModel":
        """Fit on ``samples`` (any workloads); ``current`` names the workload being tuned, if any.

        With too little history the model is fit anyway when it can be (for evaluation) but
        :attr:`ready` stays False and :attr:`status` says why.
        """
        enough, self.status = self._enough(samples, current)
        self.n_trials, self.n_workloads = len(samples), len({s.workload for s in samples})
        self.trained_on = tuple(sorted(s.trial_id for s in samples if s.trial_id is not None))
        if len(samples) < 2:
            self.regressor = self.encoder = None
            return self
        y = normalized_targets(samples, self.target)
        rows = [s.features for s in samples]
        self.encoder = FeatureEncoder.fit(rows)
        x = self.encoder.transform(rows)
        factory = ESTIMATORS[self.estimator] if isinstance(self.estimator, str) else self.estimator
        reg = factory(self.seed)
        kwargs = self._fit_kwargs(reg, samples, current)
        if getattr(reg, "needs_groups", False):
            kwargs["groups"] = [s.workload for s in samples]
        with _one_thread():
            reg.fit(x, y, **kwargs)
        self.regressor = reg
        # a ranker's scores are not the target's scale: the slope of log time on its own scores, within workloads
        self.log_scale = _log_scale(samples, reg.predict(x) if getattr(reg, "needs_groups", False) else y)
        log.info("%s", self.status)
        return self

    def _fit_kwargs(self, reg: Any, samples: Sequence[Sample], current: str | None) -> dict[str, Any]:
        w = sample_weights(samples, balance=self.balance, current=current, current_weight=self.current_weight)
        if w is None:
            return {}
        if hasattr(reg, "steps"):  # a pipeline: the weight goes to its last step
            return {f"{reg.steps[-1][0]}__sample_weight": w}
        return {"sample_weight": w}

    def predict(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        """Scores of feature rows (lower is faster); comparable within one workload."""
        if self.regressor is None or self.encoder is None:
            raise RuntimeError("the cost model is not trained")
        with _one_thread():
            return np.asarray(self.regressor.predict(self.encoder.transform(rows)), dtype=float)

    def resampled(self, samples: Sequence[Sample], members: int, seed: int = 0) -> list[CostModel]:
        """``members`` models with these settings, each fit on ``samples``' workloads drawn with replacement.

        The graph-level bootstrap: the schedules of one workload are not independent evidence, the
        workloads are. A workload drawn twice enters as two workloads (it weighs twice). How far
        the members disagree about a schedule says how much the prediction depends on which graphs
        the history happens to hold.

        Example:
            >>> samples = [Sample(f"w{w}", {"num:x": x}, (1 + w) * (1 + x)) for w in range(3) for x in range(9)]
            >>> [m.n_workloads for m in CostModel(min_trials=1).resampled(samples, 2, seed=0)]
            [3, 3]
        """
        workloads = sorted({s.workload for s in samples})
        rng = np.random.default_rng(seed)
        out = []
        for m in range(members):
            drawn = Counter(rng.choice(workloads, size=len(workloads), replace=True).tolist())
            copies = [dataclasses.replace(s, workload=f"{s.workload}#{c}")
                      for s in samples for c in range(drawn[s.workload])]
            member = CostModel(self.estimator, self.target, min_trials=self.min_trials,
                               min_workloads=self.min_workloads, balance=self.balance,
                               current_weight=self.current_weight, seed=self.seed + 1 + m)
            out.append(member.fit(copies))
        return out

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict[str, Any]:
        """What :func:`write_model` stores (no database handle, no graph)."""
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "CostModel":
        m = cls.__new__(cls)
        m.__dict__.update(state)
        return m


_controller: Any = None


def _one_thread() -> Any:
    """A context in which OpenMP/BLAS use one thread.

    The trees' OpenMP threads spinning on a shared, busy machine made a one-row prediction take
    0.3 s and a 1 s fit take minutes; one thread is fast at these sizes. The controller is made
    once: building one scans the loaded libraries (~30 ms).
    """
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1)


def _log_scale(samples: Sequence[Sample], y: np.ndarray) -> float:
    """Least-squares slope of log time on the target, within workloads (1 for ``log_default``)."""
    logt = np.log(np.array([s.ms for s in samples], dtype=float))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.workload].append(i)
    num = den = 0.0
    for idx in groups.values():
        dy, dt = y[idx] - y[idx].mean(), logt[idx] - logt[idx].mean()
        num += float(dy @ dt)
        den += float(dy @ dy)
    return num / den if den > 0 and math.isfinite(num / den) else 1.0
