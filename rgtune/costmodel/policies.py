"""How the cost model steers the search: skip clearly worse candidates, or rank a pool of them.

:class:`CostModelGuide` is the tuner's guide (``TuneOptions.guide``, see :mod:`rgtune.tuner.study`):
bound to the workload being tuned, it trains on the device's history, predicts candidates, learns
from every measurement and refits every ``retrain_every`` ``ok`` trials. Until the model is
:attr:`~CostModel.ready` (enough history) it stays out of the way and says so. Two policies;
``policy.as_dict()`` is what a study records.

**Prune** (:class:`PrunePolicy`): the sampler proposes one candidate at a time and the model
skips measuring those it predicts clearly worse.

1. Until this workload has ``warmup`` measured trials (the default schedule first) nothing is
   skipped: predictions are relative scores, and these trials turn them into milliseconds
   (``log ms = c + log_scale * score``, ``c`` the median residual over this workload's trials).
2. A fraction ``explore`` of candidates is measured whatever the prediction (a seeded coin per
   candidate): the model learns only from what is measured.
3. Otherwise a candidate is skipped when predicted slower than ``margin`` x the model's
   prediction for the *best schedule measured so far*: prediction against prediction, so the
   model's ranking decides and its error in absolute time cancels.
4. After ``max_skip`` skips in a row the next candidate is measured (a study cannot stall on a
   model that predicts everything worse).

**Rank** (:class:`RankPolicy`): for every measurement the sampler proposes ``pool`` candidates
(:mod:`rgtune.tuner.proposals`), a fraction ``local`` of them instead changes one or two knobs
of one of the ``parents`` fastest measured schedules, and the model picks the one to measure:
its first among those not measured yet, if predicted at least ``min_gain`` faster than the
sampler's own first proposal; otherwise, and for a fraction ``explore`` of the measurements,
that first proposal. The model settles the large differences, where it is reliable; within a
few percent, where it is not, the sampler's search and the measurements decide. Candidates not
picked cost nothing and are not trials (``counts`` says how many there were).

**Opening** (part of :class:`RankPolicy`): before a new study has measured more than its default
schedule, the model already knows the history's other graphs, so the study's next ``opening``
measurements are its picks out of ``opening_pool`` random schedules, no two alike, enqueued
right after the default. ``opening_rule`` ranks them: ``lcb`` (default) by the mean minus the
standard deviation of the scores of ``opening_members`` models fit on resampled histories
(:meth:`CostModel.resampled`), which hedges where the history's graphs disagree; ``top`` by the
model's scores alone.

Why these rules and defaults, with the runs that chose them: BENCHMARKS.md (learned cost model)
and ``docs/tuner.md``.

Example (a cost model on a synthetic history; the tuner calls ``bind``/``__call__``/``observe``):
    >>> p = CostModelGuide(policy=PrunePolicy(margin=1.5, explore=0.0))
    >>> p({}, None)               # not bound to a workload: never prunes, predicts nothing
    (False, None)
    >>> p.status
    'cost model off: not bound to a workload yet'
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from rgtune.codegen.base import backend_target
from rgtune.costmodel.features import WorkloadContext
from rgtune.costmodel.history import GraphLoader, Sample, workload_key
from rgtune.costmodel.model import CostModel
from rgtune.costmodel.training import fit_on_history, save_history_rows
from rgtune.db.records import canonical_knobs

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph
    from rgtune.search_spaces import SearchSpace
    from rgtune.db import TrialDatabase, WorkloadRecord
    from rgtune.db.trial_result import TrialResult

log = logging.getLogger("rgtune.costmodel")

__all__ = ["PrunePolicy", "RankPolicy", "CostModelGuide", "OPENING_RULES"]

#: how the opening ranks its pool: "top", the model's scores; "lcb", the lowest mean minus
#: standard deviation of the scores of ``opening_members`` models fit on resampled histories
OPENING_RULES = ("top", "lcb")


@dataclass(frozen=True)
class PrunePolicy:
    """When the cost model may skip a measurement (see the module docstring for the rule)."""

    margin: float = 1.5  # prune when predicted > margin x the prediction for the best measured schedule
    explore: float = 0.1  # fraction of candidates measured regardless of the prediction
    warmup: int = 3  # measured trials of this workload before anything is pruned
    retrain_every: int = 5  # ok trials between refits
    max_skip: int = 50  # prunes in a row after which the next candidate is measured
    seed: int = 0  # the explore coin's seed

    def __post_init__(self) -> None:
        if not self.margin >= 1.0:
            raise ValueError(f"margin must be >= 1 (a multiple of the best time), got {self.margin}")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"explore must be a fraction in [0, 1], got {self.explore}")
        if self.warmup < 1 or self.retrain_every < 1 or self.max_skip < 1:
            raise ValueError("warmup, retrain_every and max_skip must be >= 1")

    def as_dict(self) -> dict[str, Any]:
        """The parameters and the rule, as plain JSON values (to store with the study)."""
        return {"rule": "prune if predicted(candidate) > margin * predicted(best measured schedule), except an "
                        "explore fraction; none before warmup measured trials or while the model is not ready",
                **asdict(self)}


@dataclass(frozen=True)
class RankPolicy:
    """Propose ``pool`` candidates per measurement and measure the model's first pick (see the module docstring)."""

    pool: int = 16  # candidates the sampler proposes for each measurement
    min_gain: float = 0.05  # the model's pick must be predicted this much faster than the sampler's own
    explore: float = 0.1  # fraction of measurements that take the sampler's own first proposal
    retrain_every: int = 5  # ok trials between refits
    seed: int = 0  # the explore coin's seed
    opening: int = 4  # a new study measures the model's first picks of opening_pool random schedules first
    opening_pool: int = 256
    opening_rule: str = "lcb"  # of OPENING_RULES: how the opening ranks its pool
    opening_members: int = 8  # "lcb": models fit on resampled histories
    local: float = 0.5  # fraction of the pool that changes 1-2 knobs of one of the fastest measured schedules
    parents: int = 3  # ... of one of this many fastest

    def __post_init__(self) -> None:
        if not 0.0 <= self.local < 1.0 or self.parents < 1:
            raise ValueError(f"local must be a fraction in [0, 1) of the pool (the sampler proposes at least one) "
                             f"and parents >= 1 schedules, got local {self.local}, parents {self.parents}")
        if self.opening < 0 or (self.opening and self.opening_pool < self.opening):
            raise ValueError(f"opening must be >= 0 schedules (0: none) and opening_pool >= opening, got "
                             f"{self.opening} and {self.opening_pool}")
        if self.opening_rule not in OPENING_RULES:
            raise ValueError(f"unknown opening_rule {self.opening_rule!r}; choose one of {list(OPENING_RULES)}")
        if self.opening_members < 2:
            raise ValueError(f"opening_members must be >= 2 resampled models (a spread needs two), got "
                             f"{self.opening_members}")
        if self.pool < 2:
            raise ValueError(f"pool must be >= 2 candidates (1 is the sampler alone), got {self.pool}")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"explore must be a fraction in [0, 1], got {self.explore}")
        if self.retrain_every < 1:
            raise ValueError(f"retrain_every must be >= 1, got {self.retrain_every}")
        if not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"min_gain must be a fraction in [0, 1), got {self.min_gain}")

    def as_dict(self) -> dict[str, Any]:
        """The parameters and the rule, as plain JSON values (to store with the study)."""
        return {"rule": "measure the best-predicted of pool candidates not measured yet (sampler proposals, "
                        "and a local fraction of changes of 1-2 knobs of one of the parents fastest measured "
                        "schedules) "
                        "if it is predicted min_gain faster than the sampler's own first proposal, else that one "
                        "(and for an explore fraction); the sampler alone while the model is not ready; a new "
                        "study first measures the opening best-predicted of opening_pool random schedules, after "
                        "the default (ranked by opening_rule)",
                **asdict(self)}


@dataclass
class _Workload:
    """The guide's view of the workload being tuned."""

    key: str
    ctx: WorkloadContext
    default: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)  # this workload's measured trials (history + now)
    scores: list[float] = field(default_factory=list)  # the current model's score of each
    best_ms: float | None = None
    best: int | None = None  # index of the fastest sample
    offset: float | None = None  # c in log ms = c + log_scale * score


class CostModelGuide:
    """``TuneOptions.guide``: ``(config, point) -> (prune?, predicted_ms)``, learning as trials finish.

    The loop calls :meth:`bind` once the workload is known, the guide for every valid
    candidate, :meth:`observe` after every measured trial, and :meth:`close` at the end.

    Args:
        model: the cost model's settings (a fresh :class:`CostModel` by default).
        policy: how the model steers the search: :class:`PrunePolicy` (the default) or :class:`RankPolicy`.
        model_path: where the trained model is saved: ``"auto"`` (next to an SQLite database,
            else the per-user cache), a path, or None (never saved).
        data_dir: where the history's graphs are loaded from (their counts are features).
        graphs: a :class:`GraphLoader` to share loaded graphs with (instead of ``data_dir``).
        trust_code: import the models that the history's workloads name and this process has not
            registered (a shared database's rows are data; without this their trials have no counts).
    """

    def __init__(self, model: CostModel | None = None, policy: PrunePolicy | RankPolicy | None = None, *,
                 model_path: Any = "auto", data_dir: str | None = None, graphs: GraphLoader | None = None,
                 trust_code: bool = False) -> None:
        self.template = model or CostModel()
        self.model = self.template
        self.policy = policy or PrunePolicy()
        self.model_path = model_path
        self.graphs = graphs or GraphLoader(data_dir)
        self.trust_code = trust_code
        self._rng = random.Random(self.policy.seed)
        self._db: "TrialDatabase | None" = None
        self._record: "WorkloadRecord | None" = None
        self._w: _Workload | None = None
        self._others: list[Sample] = []
        self._rows: dict[int, dict[str, float]] = {}
        self._contexts: dict[int, WorkloadContext] = {}
        self._path: Any = None
        self._since_fit = 0
        self._skipped = 0
        self._measured: set[str] = set()  # schedule hashes this workload has measured (a pool skips them)
        self.status = "cost model off: not bound to a workload yet"
        self.counts = {"candidates": 0, "predicted": 0, "pruned": 0, "explored": 0, "observed": 0, "refits": 0}
        if isinstance(self.policy, RankPolicy):
            self.counts.update(pools=0, not_picked=0, deferred=0, repeats=0, opening=0, opening_pool=0,
                               opening_members=0, local=0, local_picked=0)
        #: one entry per candidate: predicted_ms, pruned, explored (experiments read it)
        self.decisions: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lifecycle
    def bind(self, db: "TrialDatabase", workload: "WorkloadRecord", graph: "HeteroGraph",
             space: "SearchSpace | None" = None) -> str:
        """Train (or load) the model on the history of ``workload``'s device and backend; the status line."""
        self._db, self._record = db, workload
        self.graphs.add(graph)
        target = space.target if space is not None else backend_target(workload.backend, trust_code=True)  # the user's
        ctx = WorkloadContext(workload.model, workload.in_dim, workload.out_dim, workload.heads, workload.backend,
                              workload.device, dict(graph.stats.as_dict()), graph, target, workload.mode,
                              workload.options, batches=workload.batches)
        if space is not None:
            ctx._space = space
        self._contexts[workload.id] = ctx
        fit = fit_on_history(db, self.template, workload.backend, workload.device,
                             path=self.model_path, graphs=self.graphs, current=workload, contexts=self._contexts,
                             trust_code=self.trust_code)
        self.model, self._rows, self._path = fit.model, fit.rows, fit.path
        key = workload_key(workload.id)
        self._others = [s for s in fit.samples if s.workload != key]
        self._w = _Workload(key, ctx, canonical_knobs(ctx.space.default())[0],
                            [s for s in fit.samples if s.workload == key])
        self._measured = {t.schedule_hash for t in db.history(workload) if t.status not in ("pruned", "running")}
        self._rescore()
        self.status = self.model.status
        log.info("%s", self.status)
        return self.status

    def close(self) -> None:
        """Save the model with the rows of this study's trials (call once the study ends)."""
        if self._db is None or self._record is None or self.model.regressor is None:
            return
        save_history_rows(self._db, self.model, self._record.backend, self._record.device, self._path,
                          self.graphs, self._rows, self._contexts, self.trust_code)

    # ------------------------------------------------------------------ the hook
    def __call__(self, config: Mapping[str, Any], point: Any) -> tuple[bool, float | None]:
        """Prune this candidate? And its predicted time in ms (None when there is none)."""
        w = self._w
        if w is None or not self.model.ready:
            return False, None
        self.counts["candidates"] += 1
        scores = self._scores([(config, point)], "measuring")
        if scores is None:
            return False, None
        score = scores[0]
        self.counts["predicted"] += 1
        predicted = self._to_ms(score)
        prune = explored = False
        if isinstance(self.policy, RankPolicy):  # one candidate at a time (e.g. the enqueued default): measured
            return False, predicted
        if w.best is not None and w.best < len(w.scores) and len(w.samples) >= self.policy.warmup:
            explored = self._rng.random() < self.policy.explore
            slower = self.model.log_scale * (score - w.scores[w.best])  # predicted log(candidate / best)
            clearly_worse = slower > math.log(self.policy.margin)
            prune = clearly_worse and not explored and self._skipped < self.policy.max_skip
        self._skipped = self._skipped + 1 if prune else 0
        self.counts["pruned"] += prune
        self.counts["explored"] += explored
        self.decisions.append({"predicted_ms": predicted, "pruned": prune, "explored": explored})
        return prune, predicted

    def pool_size(self) -> int:
        """Candidates the loop should propose for the next measurement (1: one at a time, through ``__call__``)."""
        if isinstance(self.policy, RankPolicy) and self._w is not None and self.model.ready:
            return self.policy.pool
        return 1

    def local_pool(self) -> tuple[int, int]:
        """Of :meth:`pool_size`'s candidates, how many should change 1-2 knobs of one of the study's fastest
        measured schedules, and of how many of the fastest (``(0, 0)``: every candidate from the sampler)."""
        pool = self.pool_size()
        if pool > 1:
            assert isinstance(self.policy, RankPolicy)  # pool_size() checked it
            return int(pool * self.policy.local), self.policy.parents  # local < 1: the sampler keeps one at least
        return 0, 0

    def rank(self, candidates: Sequence[tuple[Mapping[str, Any], Any]],
             local: Sequence[bool] | None = None) -> tuple[int, list[float | None]]:
        """Which of the pool's valid ``(config, point)`` candidates to measure, and each one's predicted ms.

        The first pick of the model among the candidates this workload has not measured yet (all
        of them if every one was), unless it is predicted less than ``min_gain`` faster than the
        first of them (the sampler's own first proposal: the loop puts the sampler's proposals
        first); that one for an ``explore`` fraction too. ``local`` marks the local candidates
        (they are counted).
        """
        policy = self.policy
        if not isinstance(policy, RankPolicy):
            raise TypeError(f"rank() needs a RankPolicy; this guide has {type(policy).__name__}")
        if not candidates:
            raise ValueError("rank() needs at least one candidate")
        explored = self._rng.random() < policy.explore
        self.counts["pools"] += 1
        self.counts["candidates"] += len(candidates)
        fresh = [i for i, (config, _) in enumerate(candidates)
                 if canonical_knobs(dict(config))[1] not in self._measured]
        if not fresh:
            self.counts["repeats"] += 1
        fresh = fresh or list(range(len(candidates)))
        scores = self._scores(candidates, "measuring the sampler's proposal")
        if scores is None:
            self.decisions.append({"predicted_ms": None, "pruned": False, "explored": False, "pool": len(candidates)})
            return fresh[0], [None] * len(candidates)
        self.counts["predicted"] += len(candidates)
        predicted = [self._to_ms(x) for x in scores]
        pick = min(fresh, key=lambda i: scores[i])
        gain = self.model.log_scale * (scores[fresh[0]] - scores[pick])  # predicted log(sampler's / model's)
        if explored or gain < math.log1p(policy.min_gain):
            self.counts["deferred"] += not explored
            pick = fresh[0]
        self.counts["not_picked"] += len(candidates) - 1
        self.counts["explored"] += explored
        if local is not None:
            self.counts["local"] += sum(map(bool, local))
            self.counts["local_picked"] += bool(local[pick])
        self.decisions.append({"predicted_ms": predicted[pick], "pruned": False, "explored": explored,
                               "pool": len(candidates)})
        return pick, predicted

    def opening_pool(self) -> int:
        """Random schedules a new study should propose to :meth:`opening` (0: no opening, e.g. no model yet)."""
        policy = self.policy
        if isinstance(policy, RankPolicy) and policy.opening and self._w is not None and self.model.ready:
            return policy.opening_pool
        return 0

    def opening(self, candidates: Sequence[tuple[Mapping[str, Any], Any]]) -> list[int]:
        """The indices of the valid ``(config, point)`` candidates a new study measures first, fastest first.

        The policy's ``opening`` best-predicted ones, no two alike, none this workload has measured
        and not its default schedule (measured anyway); none while the model is not ready.
        """
        policy, w = self.policy, self._w
        if not self.opening_pool() or not candidates:
            return []
        assert isinstance(policy, RankPolicy) and w is not None  # opening_pool() checked both
        predicted = self._predict(candidates, "no opening")
        if predicted is None:
            return []
        rows, scores = predicted
        if policy.opening_rule == "lcb":
            scores = self._optimistic(rows, scores)
        self.counts["opening_pool"] += len(candidates)
        seen = set(self._measured) | {canonical_knobs(dict(w.default))[1]}
        picks: list[int] = []
        for i in sorted(range(len(candidates)), key=lambda i: scores[i]):
            schedule = canonical_knobs(dict(candidates[i][0]))[1]
            if schedule not in seen:
                seen.add(schedule)
                picks.append(i)
                if len(picks) == policy.opening:
                    break
        self.counts["opening"] += len(picks)
        return picks

    def observe(self, config: Mapping[str, Any], point: Any, result: "TrialResult") -> None:
        """Learn from a finished trial: only an ``ok`` one's time (:attr:`TrialResult.ok_ms`) is learnt; any
        other marks its schedule as measured."""
        w = self._w
        median_ms = result.ok_ms
        self._measured.add(canonical_knobs(dict(config))[1])
        if w is None or median_ms is None or not median_ms > 0 or not math.isfinite(median_ms):
            return
        self.counts["observed"] += 1
        try:
            row = w.ctx.features(config, _kernels(point))
        except Exception as e:  # noqa: BLE001
            log.warning("cost model: cannot featurize a trial (%s); not learnt", e)
            return
        knobs = canonical_knobs(dict(config))[0]
        w.samples.append(Sample(w.key, row, float(median_ms), knobs == w.default))
        if w.best_ms is None or median_ms < w.best_ms:
            w.best_ms, w.best = float(median_ms), len(w.samples) - 1
        self._since_fit += 1
        if self._since_fit >= self.policy.retrain_every:
            self._refit()
        elif self.model.regressor is not None:
            w.scores.append(float(self.model.predict([row])[0]))
            self._calibrate()

    # ------------------------------------------------------------------ reporting
    def describe(self) -> dict[str, Any]:
        """Policy, model settings, status and counts: what a study should record about its guide."""
        return {"policy": self.policy.as_dict(), "model": self.model.params(), "status": self.status,
                "counts": dict(self.counts)}

    # ------------------------------------------------------------------ internals
    def _scores(self, candidates: Sequence[tuple[Mapping[str, Any], Any]], instead: str) -> list[float] | None:
        """The model's score of each ``(config, point)`` candidate of the bound workload; None while the model
        is not ready, or (with a warning saying what happens ``instead``) when it cannot predict: a model must
        never stop the study."""
        predicted = self._predict(candidates, instead)
        return None if predicted is None else predicted[1]

    def _predict(self, candidates: Sequence[tuple[Mapping[str, Any], Any]], instead: str
                 ) -> tuple[list[dict[str, float]], list[float]] | None:
        """:meth:`_scores`, with the candidates' feature rows (for more models to score)."""
        w = self._w
        if w is None or not self.model.ready:
            return None
        try:
            rows = [w.ctx.features(c, _kernels(p)) for c, p in candidates]
            return rows, [float(x) for x in self.model.predict(rows)]
        except Exception as e:  # noqa: BLE001
            log.warning("cost model: prediction failed (%s: %s); %s", type(e).__name__, e, instead)
            return None

    def _optimistic(self, rows: Sequence[Mapping[str, float]], scores: list[float]) -> list[float]:
        """Mean minus standard deviation of the feature ``rows``' scores over models fit on resampled
        histories (``scores`` unchanged when that fails: a model must never stop the study)."""
        assert isinstance(self.policy, RankPolicy) and self._w is not None
        w = self._w
        try:
            members = self.model.resampled(self._others + w.samples, self.policy.opening_members,
                                           seed=self.policy.seed)
            spread = np.array([m.predict(rows) for m in members])
        except Exception as e:  # noqa: BLE001
            log.warning("cost model: resampled models failed (%s: %s); the opening ranks by the model alone",
                        type(e).__name__, e)
            return scores
        self.counts["opening_members"] = len(members)
        return [float(x) for x in spread.mean(axis=0) - spread.std(axis=0)]

    def _refit(self) -> None:
        assert self._w is not None
        self._since_fit = 0
        self.model.fit(self._others + self._w.samples, current=self._w.key)
        self.status = self.model.status
        self.counts["refits"] += 1
        self._rescore()

    def _rescore(self) -> None:
        w = self._w
        assert w is not None
        w.best = min(range(len(w.samples)), key=lambda i: w.samples[i].ms) if w.samples else None
        w.best_ms = w.samples[w.best].ms if w.best is not None else None
        if self.model.regressor is None or not w.samples:
            w.scores = []
        else:
            w.scores = [float(x) for x in self.model.predict([s.features for s in w.samples])]
        self._calibrate()

    def _calibrate(self) -> None:
        w = self._w
        assert w is not None
        if not w.scores or len(w.scores) != len(w.samples):
            w.offset = None
            return
        logt = np.log([s.ms for s in w.samples])
        w.offset = float(np.median(logt - self.model.log_scale * np.asarray(w.scores)))

    def _to_ms(self, score: float) -> float | None:
        w = self._w
        if w is None or w.offset is None:
            return None
        return float(math.exp(w.offset + self.model.log_scale * score))


def _kernels(point: Any) -> Any:
    """The compiled kernels of a point, if it has them (the guide also takes None)."""
    compiled = getattr(point, "compiled", None)
    return None if compiled is None else compiled.kernels
