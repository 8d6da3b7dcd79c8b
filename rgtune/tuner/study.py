"""The tuning loop: Optuna ask -> suggest a point -> (invalid? skipped?) -> measure -> tell.

A *guide* (``TuneOptions.guide``; the learned cost model, :class:`~rgtune.costmodel.CostModelGuide`)
steers the loop in one of two ways. A :class:`Guide` decides per candidate whether to skip
measuring it (recorded as ``pruned``, with its prediction). A :class:`RankingGuide` instead
picks the candidate to measure out of a pool: the sampler proposes candidates on an in-memory
copy of the study (:mod:`.proposals`; on the database each proposal would write its
parameters), as many as the guide asks for, less its *local* ones: 1-2 knobs of one of the
study's fastest measured schedules changed; the guide picks one, and only that one is measured
and added to the study. The copy learns every finished trial of the study, this worker's and
any other's, before each pool. A new study with a ranking guide first measures the guide's
*opening*: its picks out of random schedules, queued in the study right after the default
schedule.

One Optuna study per workload (model, sizes, graph content, device, backend, mode, sampler), stored
through Optuna's RDBStorage in the same database as rgtune's trial history. The same command
resumes the same study; ``fresh=True`` starts a new one (the recorded trials stay: they are
real measurements). The default schedule is the first trial of every study, so a study
always reports its speedup over it.

A sampler workload (``Workload.batches``, ``tune --batches``: trials timed on a sampler's fixed batches,
:mod:`.batches`) whose workload was also tuned on the whole graph (same device) measures that best
whole-graph schedule second, and has it in the confirmation's rounds: the summary says how the best
schedule for the batches compares with it on those batches (:class:`WholeGraphBest`).

Budget: ``trials`` counts *measured* trials. A candidate the guide skips is recorded as
``pruned`` with its predicted time and told to Optuna as pruned, but costs no measurement and
no budget; at most
``max_proposals_per_trial`` x ``trials`` candidates are proposed in all.

Confirmation: one measurement of a schedule varies by tens of percent between runs on a shared
machine, so the fastest of many single measurements is biased low and often not the fastest
schedule. When the search ends, the fastest schedules are timed again in interleaved rounds,
the best is verified again on fresh inputs, and the study is told the confirmed result
(:mod:`.confirmation`). ``confirm_top=0`` skips the rounds, not the re-verification. The rounds fit
in ``confirm_share`` of the search's time (at least :data:`CONFIRM_MIN_BUDGET_S`), each measurement
counted at the median time of the search's verified measurements.

Slow candidates: each measurement is given the best time so far; a candidate whose first run takes
``MeasureOptions.stop_slower`` times as long is ``stopped`` there (told to Optuna as pruned; it counts
as a measured trial). On a big graph where a bad schedule runs for a minute, that is most of a
search's time saved.

Recheck: the fastest of many single measurements is biased low during the search too, and the
search steers by it (the sampler's good trials, the cost model's fastest schedules, the
confirmation's candidates). So a measurement that beats the best so far is repeated until the
schedule has ``recheck`` measurements (3 by default), and the trial's time is their median: a
lucky measurement no longer becomes the best on its own. It costs ``recheck - 1`` more measurements of the
few trials that look like a new best (the kernels are compiled once), not budget; ``recheck=1``
turns it off. A repeat that is not ``ok`` (a schedule that verified once) is the trial's outcome.

Crash safety: a trial is committed as ``running`` before it is measured, and its heartbeat is
recorded while it runs. When a study resumes, trials left ``running`` by a dead process (Ctrl-C,
kill -9, power loss) become ``failed`` in both rgtune's history and Optuna's storage, so the
counts add up. A worker whose trial another worker declared abandoned (no heartbeat for long,
e.g. a network partition) still records its measurement, and adds it to the study as a new
trial. A measurement worker that cannot be restarted costs its trial; three in a row end the
run with the reason.

Example:
    >>> from rgtune.db import TrialDatabase
    >>> from rgtune.tuner.measure import MeasureOptions
    >>> from rgtune.tuner.workload import Workload
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> db = TrialDatabase(f"sqlite:///{os.path.join(d, 'results.db')}")
    >>> w = Workload("rgcn", "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3", 8, 8, 1, "reference")
    >>> s = Tuner(w, db, TuneOptions(trials=3, seed=0, progress=False, confirm_top=0,
    ...                               measure=MeasureOptions(repeats=2, warmup=1))).run()
    >>> s.trials_run, s.best_ms is not None, db.count_trials()
    (3, True, 3)
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from rgtune.codegen.base import backend_target
from rgtune.db.liveness import worker_alive, worker_id
from rgtune.db.trial_result import TrialDetails, TrialResult
from rgtune.tuner.confirmation import Confirmation, Confirmed
from rgtune.tuner.measure import MeasureOptions, MeasureWorker, WorkerStartError, combine_measurements
from rgtune.tuner.options import OptionError, check_at_least, check_choice, check_positive
from rgtune.tuner.proposals import Proposal, ProposalPool
from rgtune.tuner.workload import Workload

if TYPE_CHECKING:
    import optuna

    from rgtune.data.graph import HeteroGraph
    from rgtune.db import TrialDatabase, TrialRecord

SAMPLERS = ("tpe", "random", "gp", "cmaes")
#: statuses that cost no measurement (and so no budget)
UNMEASURED = ("pruned",)
#: the study's objective, as optuna-dashboard and ``study.metric_names`` show it
METRIC = "milliseconds"
#: the confirmation may always take this long (seconds), whatever its share of a short search
CONFIRM_MIN_BUDGET_S = 30.0
#: failed restarts of the measurement worker in a row that end the run
MAX_RESTART_FAILURES = 3


class Guide(Protocol):
    """``TuneOptions.guide``: decides per candidate whether to skip measuring it."""

    def __call__(self, config: dict[str, Any], point: Any) -> tuple[bool, float | None]:
        """(skip?, predicted ms or None) for a valid candidate."""
        ...


@runtime_checkable
class LearningGuide(Guide, Protocol):
    """A guide that learns from the study: the loop binds it, feeds it every measured trial, closes it."""

    def bind(self, db: "TrialDatabase", workload: Any, graph: Any, space: Any) -> str:
        """Attach to the workload being tuned (train on the history); returns a status line."""
        ...

    def observe(self, config: Mapping[str, Any], point: Any, result: TrialResult) -> None:
        """A measured trial finished (only an ``ok`` one has a time: :attr:`TrialResult.ok_ms`)."""
        ...

    def close(self) -> None:
        """The study ended (save what was learned)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Policy, settings, status and counts, as JSON values (recorded with the study)."""
        ...


@runtime_checkable
class RankingGuide(LearningGuide, Protocol):
    """A learning guide that can also pick the one candidate to measure out of a pool of proposals."""

    def pool_size(self) -> int:
        """How many candidates to propose for the next measurement (1: one at a time, through ``__call__``)."""
        ...

    def local_pool(self) -> tuple[int, int]:
        """Of the next pool, how many candidates change 1-2 knobs of one of the study's fastest measured
        schedules, and of how many of the fastest (``(0, 0)``: all from the sampler)."""
        ...

    def rank(self, candidates: Sequence[tuple[dict[str, Any], Any]],
             local: Sequence[bool] | None = None) -> tuple[int, list[float | None]]:
        """The index of the valid ``(config, point)`` candidate to measure, and each one's predicted ms; the
        sampler's proposals come first, ``local`` marks the local candidates."""
        ...

    def opening_pool(self) -> int:
        """How many random candidates a new study proposes to :meth:`opening` (0: no opening)."""
        ...

    def opening(self, candidates: Sequence[tuple[dict[str, Any], Any]]) -> list[int]:
        """The indices of the valid ``(config, point)`` candidates to measure first, after the default schedule."""
        ...


@dataclass
class TuneOptions:
    trials: int | None = 50  # measured trials to run in this invocation (None: until the time budget)
    time_budget: float | None = None  # seconds; no new trial starts after it
    sampler: str = "tpe"
    seed: int | None = None
    fresh: bool = False
    progress: bool = True
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    #: skips measuring candidates it predicts clearly worse (see :class:`LearningGuide`, the cost model)
    guide: Guide | None = None
    max_proposals_per_trial: int = 10  # candidates proposed in all <= this x trials (pruned ones included)
    confirm_top: int = 5  # at the end, time this many fastest schedules again (0: off; see the module docstring)
    confirm_rounds: int = 5  # ... in this many interleaved rounds (odd: the median is one of the rounds)
    #: ... within this share of the search's time (fewer rounds, then fewer schedules; None: no limit)
    confirm_share: float | None = 0.25
    recheck: int = 3  # a measurement beating the best so far is repeated to this many; the median counts (1: off)
    reverify_inputs: int = 3  # at the end, the best schedule is verified again on this many fresh inputs

    def __post_init__(self) -> None:
        """Refuse a bad value with an :class:`~rgtune.tuner.options.OptionError` naming it."""
        if self.trials is not None:
            check_at_least("trials", self.trials, 1, "a count of trials, 1 or more")
        check_positive("time_budget", self.time_budget, "a positive number of seconds", optional=True)
        check_choice("sampler", self.sampler, SAMPLERS)
        check_at_least("max_proposals_per_trial", self.max_proposals_per_trial, 1, "a count of proposals, 1 or more")
        if self.confirm_top == 1:  # one schedule has nothing to be compared with
            raise OptionError("confirm_top", 1, "0 (off) or at least 2 schedules to compare")
        check_at_least("confirm_top", self.confirm_top, 0, "0 (off) or at least 2 schedules to compare")
        check_at_least("confirm_rounds", self.confirm_rounds, 1, "a count of rounds, 1 or more")
        if self.confirm_share is not None and not 0 < self.confirm_share <= 1:
            raise OptionError("confirm_share", self.confirm_share, "a share of the search's time in (0, 1]")
        check_at_least("recheck", self.recheck, 1, "a count of measurements of a new best, 1 or more (1: off)")
        check_at_least("reverify_inputs", self.reverify_inputs, 1, "a count of fresh inputs, 1 or more")


@dataclass
class TuneSummary:
    workload_id: int
    study_name: str
    trials_run: int
    statuses: dict[str, int]
    default_ms: float | None
    best_ms: float | None
    best_knobs: dict[str, Any] | None
    best_trial_id: int | None
    elapsed_s: float
    interrupted: bool = False
    measured: int = 0  # trials that cost a measurement (not pruned)
    rechecked: int = 0  # trials measured ``recheck`` times because their first measurement beat the best so far
    over_memory: int = 0  # proposals of a ranked pool left out: their buffers alone were over a memory limit
    guide: dict[str, Any] | None = None  # the guide's describe() at the end, if it has one
    confirmation: "Confirmed | None" = None  # the confirmation that ended the run, if one ran
    #: ``default_ms`` and ``best_ms`` are both medians of the same confirmation's rounds (like with like)
    default_confirmed: bool = False
    default_is_best: bool = False  # no searched schedule beat the default schedule
    best_verified_inputs: int | None = None  # fresh inputs the best schedule passed re-verification on
    #: a sampler workload: the best whole-graph schedule timed on the same batches (None: none recorded)
    whole_graph: "WholeGraphBest | None" = None
    #: the best schedule's trial number in this study (``best_trial_id`` counts across the database)
    best_study_trial: int | None = None
    #: the best trial's kernels and its layer as called (ms; None: not measured); ``best_ms`` is one of them
    best_kernel_ms: float | None = None
    best_call_ms: float | None = None
    best_objective: str | None = None  # which one: "kernels" or "call"
    #: measured trials the study had before this run (a resumed study's; ``measured`` counts this run's only)
    earlier_measured: int = 0
    #: the median over the confirmation's rounds of the default's time / the best's in the same round
    paired_speedup: float | None = None

    @property
    def speedup(self) -> float | None:
        """The best schedule's speedup over the default: the paired one where both were confirmed (each round's
        two times taken moments apart), else the ratio of their times."""
        if self.default_is_best:
            return 1.0
        if self.paired_speedup is not None:
            return self.paired_speedup
        if self.default_ms and self.best_ms:
            return self.default_ms / self.best_ms
        return None


@dataclass
class WholeGraphBest:
    """A sampler workload's comparison: the best schedule tuned on the whole graph (trial ``trial_id``,
    ``whole_graph_ms`` there) and its time on the workload's batches (``batches_ms``: the confirmation's median
    where it took part, else its measurements in the search; ``confirmed`` says which)."""

    trial_id: int
    whole_graph_ms: float | None
    batches_ms: float | None
    confirmed: bool
    same_schedule: bool  # the best for the batches is this very schedule


def make_sampler(name: str, seed: int | None) -> "optuna.samplers.BaseSampler":
    """An Optuna sampler by name: ``tpe`` (default), ``random``, ``gp``, ``cmaes``.

    The space is categorical; CMA-ES handles numerical parameters only, so with ``cmaes``
    Optuna samples categorical knobs independently (it warns once).
    """
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():  # multivariate+group is what a conditional space needs
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose one of {list(SAMPLERS)}")


class Tuner:
    """Tunes one workload, recording every trial in ``db``; ``graph``: the workload's dataset already loaded
    (else loaded when the run starts; a big graph held twice costs a gigabyte)."""

    def __init__(self, workload: Workload, db: "TrialDatabase", options: TuneOptions | None = None,
                 graph: "HeteroGraph | None" = None) -> None:
        self.workload = workload
        self._graph = graph
        self.db = db
        self.options = options or TuneOptions()
        self.rechecked = 0  # trials of this run measured again as a new best (see ``recheck``)
        self.over_memory = 0  # proposals left out of ranked pools: over the worker's memory limit (``_compile``)
        self._restart_failures = 0  # failed restarts of the measurement worker in a row
        self._walls: list[float] = []  # seconds of each ok measurement of this run (the confirmation budgets them)

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        import optuna

        from rgtune.data import load_dataset
        from rgtune.search_spaces import SearchSpace

        w = self.workload
        self.graph = self._graph if self._graph is not None else load_dataset(w.dataset, root=w.data_dir)
        program = w.program()
        # before the worker starts: a precision the target cannot store is the caller's error, said here
        self.space = SearchSpace(program, self.graph, backend_target(w.backend, trust_code=True), mode=w.mode,
                                 precision=w.precision)
        # while a trial runs, its row in the database shows that this process is alive
        self.worker = MeasureWorker(w, self.options.measure, on_wait=self.db.heartbeat_worker)
        device = self.worker.start()
        self.record = self.db.ensure_workload(w.model, self.graph, device, in_dim=w.in_dim, out_dim=w.out_dim,
                                              heads=w.heads, backend=w.backend, mode=w.mode, options=w.options,
                                              batches=w.batches_key, precision=w.precision)
        self.db.mark_stale_running(self.record)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = self.db.optuna_storage()
        name = self.record.study_name
        if self.options.fresh:
            # a new study (the sampler forgets); the trials already recorded stay in the history
            name = f"{name}:fresh-{int(time.time() * 1000)}"
        else:
            name = self._latest_study_name(storage, name)
        self.study = optuna.create_study(study_name=name, storage=storage, direction="minimize",
                                         sampler=make_sampler(self.options.sampler, self.options.seed),
                                         load_if_exists=True)
        with warnings.catch_warnings():  # metric names are experimental in Optuna; the name is all we set
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names([METRIC])
        self.study.set_user_attr("rgtune.workload_id", self.record.id)
        self.study.set_user_attr("rgtune.sampler", self.options.sampler)
        # a study's trials compare only when timed one way: a paired trial is on its reference's scale (within
        # ~10% of plain), and the layer as called takes longer than its kernels
        m = self.options.measure
        for attr, now, default, shown in (("timing", m.timing, "plain", "{}"),
                                          ("objective", m.objective, "auto", "by objective {!r}")):
            before = self.study.user_attrs.get(f"rgtune.{attr}", default)
            if self.study.trials and before != now:
                warnings.warn(f"study {name!r} was timed {shown.format(before)}; its new trials are timed "
                              f"{shown.format(now)} (use --fresh for a study timed one way)", stacklevel=2)
            self.study.set_user_attr(f"rgtune.{attr}", now)
        self.study.set_user_attr("rgtune.recheck", self.options.recheck)
        self._fail_abandoned_optuna_trials()
        new_study = not self.study.trials
        # a resumed study's measured trials (its recorded trials but those the cost model pruned): told in the
        # summary, since --trials counts the trials this run measures
        ids = {t.user_attrs.get("rgtune.trial_id") for t in self.study.trials} - {None}
        self.earlier_measured = 0 if new_study else sum(
            1 for r in self.db.history(self.record) if r.id in ids and r.status not in UNMEASURED)
        #: a sampler workload's counterpart on the whole graph: its best trial, timed here too (_whole_graph_best)
        self.whole_graph = self._whole_graph_best()
        if new_study:
            self.study.enqueue_trial(self.space.default(), skip_if_exists=True)
            if self.whole_graph is not None:  # measured on the batches second: a good start, and the comparison
                known = self.space.distributions()
                self.study.enqueue_trial({k: v for k, v in self.whole_graph.knobs.items() if k in known},
                                         skip_if_exists=True)
        guide = self.options.guide
        #: the guide, when it learns from the study (bound now, fed every measured trial, closed at the end)
        self._learner: LearningGuide | None = guide if isinstance(guide, LearningGuide) else None
        self._ranker: RankingGuide | None = guide if isinstance(guide, RankingGuide) else None
        self._proposals: ProposalPool | None = None  # created with the first pool
        if self._learner is not None:
            self._learner.bind(self.db, self.record, self.graph, self.space)  # its status ends up in describe()
            # the policy and its parameters stay with the study (counts are updated at the end)
            self.study.set_user_attr("rgtune.guide", self._learner.describe())
        if new_study and self._ranker is not None:
            self._enqueue_opening(self._ranker)

    def _enqueue_opening(self, ranker: RankingGuide) -> None:
        """Queue the ranker's picks out of random schedules as a new study's first trials after the default
        (the model knows other graphs before this one has a measurement; see ``RankPolicy.opening``)."""
        import optuna

        n = ranker.opening_pool()
        if n <= 0:
            return
        proposals = ProposalPool(optuna.samplers.RandomSampler(seed=self.options.seed)).propose(n, self.space)
        _, valid = self._compile(proposals)
        for i in ranker.opening([(p.config, point) for p, point in valid]):
            self.study.enqueue_trial(valid[i][0].params, skip_if_exists=True)

    def _whole_graph_best(self) -> "TrialRecord | None":
        """For a sampler workload, the best trial of the same workload tuned on the whole graph (same model,
        options, sizes, graph content, device, backend and mode), if one was recorded: the schedule a user
        would run on the batches without ``--batches``. None for a whole-graph workload."""
        r = self.record
        if self.workload.batches is None:
            return None
        for w in self.db.workloads(model=r.model, options=r.options, in_dim=r.in_dim, out_dim=r.out_dim,
                                   heads=r.heads, backend=r.backend, mode=r.mode, graph_hash=r.graph_hash, batches=""):
            if w.device_fingerprint == r.device_fingerprint and w.num_ok:
                return self.db.best(w)
        return None

    @staticmethod
    def _latest_study_name(storage: Any, base: str) -> str:
        import optuna

        names = [n for n in optuna.get_all_study_names(storage) if n.startswith(base)]
        return max(names, key=lambda n: (len(n), n)) if names else base

    def _fail_abandoned_optuna_trials(self) -> None:
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            tid = t.user_attrs.get("rgtune.trial_id")
            if tid is not None:
                try:
                    alive = self.db.trial(int(tid)).status == "running"
                except Exception:  # noqa: BLE001 - a missing record means nobody owns it
                    alive = False
            else:  # an Optuna trial started (naive local time) by a worker that has not recorded it yet
                started = (t.datetime_start or datetime.now()).astimezone(UTC).replace(tzinfo=None)
                alive = worker_alive(t.user_attrs.get("rgtune.worker", ""), started)
            if not alive:
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)

    # ------------------------------------------------------------------ loop
    def run(self) -> TuneSummary:
        """Search, confirm, and summarize (see the module docstring). A failure of the database, also one that
        reaches the loop through Optuna's storage (a full disk, a lock held too long, a dropped connection), is a
        one-line :class:`~rgtune.db.DatabaseError`; the trials recorded so far stay, and the same call resumes."""
        import sqlalchemy.exc as sa_exc
        from optuna.exceptions import StorageInternalError

        try:
            return self._run()
        except (StorageInternalError, sa_exc.SQLAlchemyError) as e:
            raise self.db.explain(e) from e

    def _run(self) -> TuneSummary:
        self._setup()
        opts = self.options
        start = time.time()
        statuses: dict[str, int] = {}
        proposed = measured = 0
        max_proposed = None if opts.trials is None else opts.trials * max(1, opts.max_proposals_per_trial)
        interrupted = False
        confirmed: Confirmed | None = None
        bar = _progress(opts)
        try:
            while (opts.trials is None or measured < opts.trials) and \
                    (max_proposed is None or proposed < max_proposed) and \
                    (opts.time_budget is None or time.time() - start < opts.time_budget):
                pool = self._ranker.pool_size() if self._ranker is not None else 1
                if pool > 1 and self._pool_ready():
                    config, point, result = self._pool_round(pool)
                else:
                    config, point, result = self._single_round()
                statuses[result.status] = statuses.get(result.status, 0) + 1
                proposed += 1
                if result.status not in UNMEASURED:
                    measured += 1
                    self._observe(config, point, result)
                self._update_progress(bar, result, start)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if bar is not None:
                bar.close()
        try:
            if not interrupted:
                confirmed = Confirmation(
                    self.db, self.record, self.worker, self.study, self._default_trial(), self.space.distributions(),
                    top=opts.confirm_top, rounds=opts.confirm_rounds, reverify_inputs=opts.reverify_inputs,
                    budget_s=None if opts.confirm_share is None else
                    max(CONFIRM_MIN_BUDGET_S, opts.confirm_share * (time.time() - start)),
                    measurement_s=statistics.median(self._walls) if self._walls else None,
                    progress=(lambda **kw: _progress(opts, **kw)) if opts.progress else None,
                    also={} if self.whole_graph is None else
                    {self.whole_graph.schedule_hash: self.whole_graph.knobs}).run()
                interrupted = confirmed is not None and not confirmed.finished
        finally:
            self.worker.close()
            guide_info = self._close_guide()
        return self._summary(proposed, measured, statuses, time.time() - start, interrupted, guide_info, confirmed)

    def _single_round(self) -> tuple[dict[str, Any], Any, TrialResult]:
        """Ask the study for one candidate; prune or measure it; tell the study."""
        import optuna
        from optuna.trial import TrialState

        trial = self.study.ask()
        trial.set_user_attr("rgtune.worker", worker_id())
        config = self.space.suggest(trial)
        tid = self.db.start_trial(self.record, config, optuna_trial=trial.number)
        trial.set_user_attr("rgtune.trial_id", tid)
        try:
            point = self.space.compile(config)
            result = self._evaluate(tid, config, point, trial.number)
        except KeyboardInterrupt:
            self.db.finish_trial(tid, "failed", error="interrupted (Ctrl-C)")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.db.record_result(tid, result)
        state, value = _optuna_outcome(result)
        told = self.study.tell(trial, value, state=state, skip_if_finished=True)
        if told.state != state:
            # another worker declared this trial abandoned (its heartbeat came too late) and failed it in the
            # study; the measurement is real: the study gets it as a new trial
            self.study.add_trial(optuna.trial.create_trial(
                state=state, value=value, params=trial.params, distributions=trial.distributions,
                user_attrs={"rgtune.trial_id": tid, "rgtune.worker": worker_id()}))
        return config, point, result

    def _pool_round(self, pool: int) -> tuple[dict[str, Any], Any, TrialResult]:
        """Propose ``pool`` candidates, measure the ranking guide's pick, add it to the study."""
        from optuna.trial import create_trial

        assert self._ranker is not None and self._proposals is not None  # _pool_ready() synced the copy
        local, parents = self._ranker.local_pool()
        mutants = self._proposals.mutate(min(local, pool - 1), parents, self.space)
        # the sampler's proposals first: the ranker compares its pick with the sampler's own first one
        compiled, valid = self._compile(self._proposals.propose(pool - len(mutants), self.space) + mutants)
        if valid:
            pick, predictions = self._ranker.rank([(p.config, point) for p, point in valid],
                                                  [p.local for p, _ in valid])
            (chosen, point), predicted = valid[pick], predictions[pick]
        else:  # every proposal breaks a constraint: record one as invalid, as the single path would
            (chosen, point), predicted = compiled[0], None
        tid = self.db.start_trial(self.record, chosen.config)  # its Optuna trial exists once it is told
        try:
            result = self._evaluate(tid, chosen.config, point, chosen.number, ranked=True, predicted=predicted)
        except KeyboardInterrupt:
            self.db.finish_trial(tid, "failed", error="interrupted (Ctrl-C)")
            raise
        self.db.record_result(tid, result)
        state, value = _optuna_outcome(result)
        self.study.add_trial(create_trial(state=state, value=value, params=chosen.params,
                                          distributions=chosen.distributions,
                                          user_attrs={"rgtune.trial_id": tid, "rgtune.worker": worker_id()}))
        return chosen.config, point, result

    def _compile(self, proposals: list[Proposal]) -> tuple[list[tuple[Proposal, Any]], list[tuple[Proposal, Any]]]:
        """Each proposal with its compiled point, and the valid ones of those that fit the worker's memory limit
        (what a ranker is shown); when none fits, the valid ones (the worker records the pick's refusal)."""
        compiled = [(p, self.space.compile(p.config)) for p in proposals]
        valid = [(p, point) for p, point in compiled if point.valid]
        fits = [(p, point) for p, point in valid if self._fits(point)]
        self.over_memory += len(valid) - len(fits)
        return compiled, fits or valid

    def _fits(self, point: Any) -> bool:
        """Whether a candidate's buffers (estimated; the worker adds the check's own memory) fit the worker's
        memory limit: on a big graph most of a pool can be schedules that would be refused, each a trial lost."""
        budget = self.worker.memory
        return budget is None or budget.fits(budget.estimate(point.kernels, self.graph))

    def _pool_ready(self) -> bool:
        """Bring the in-memory copy up to date; False while trials wait in the study (the default
        schedule, or a user's ``enqueue_trial``): those come first, one at a time."""
        if self._proposals is None:
            self._proposals = ProposalPool(make_sampler(self.options.sampler, self.options.seed), self.options.seed)
        return not self._proposals.sync(self.study)

    def _evaluate(self, tid: int, config: dict[str, Any], point: Any, number: int, *, ranked: bool = False,
                  predicted: float | None = None) -> TrialResult:
        """Skip or measure one candidate (``ranked``: a ranking guide chose it out of a pool, ``predicted``)."""
        if not point.valid:  # recorded, never compiled
            return TrialResult("invalid", error="; ".join(point.problems))
        if not ranked and self.options.guide is not None:
            skip, predicted = self.options.guide(config, point)
            if skip:
                return TrialResult("pruned", details=TrialDetails(predicted_ms=predicted))
        seed = (self.options.seed or 0) * 1_000_003 + number
        result = self._measure(tid, config, seed)
        if predicted is not None:  # recorded next to the measurement: how good the model is, online
            result = result.with_details(predicted_ms=predicted)
        return result

    def _measure(self, tid: int, config: dict[str, Any], seed: int) -> TrialResult:
        """Measure a candidate (trial ``tid``); one that beats the best so far ``recheck`` times in all (see the
        module docstring)."""
        best = self._best_s()
        result = self._measure_once(tid, config, seed, best)
        if self.options.recheck <= 1 or not self._beats_best(result, best):
            return result
        measurements = [result]
        while len(measurements) < self.options.recheck:
            again = self._measure_once(tid, config, seed, best)
            if again.status != "ok":  # it verified and ran once: whatever failed now is the trial's outcome
                return replace(again, error=f"{again.error or again.status} (in measurement {len(measurements) + 1} "
                                            f"of {self.options.recheck}; the first was ok)")
            measurements.append(again)
        self.rechecked += 1
        return combine_measurements(measurements)

    def _measure_once(self, tid: int, config: dict[str, Any], seed: int, best: float | None) -> TrialResult:
        """One measurement; a worker that cannot be restarted costs the trial, and :data:`MAX_RESTART_FAILURES`
        in a row end the run."""
        result = self.worker.measure(config, seed=seed, best=best)
        if result.status == "ok" and result.details.elapsed_s is not None:
            self._walls.append(result.details.elapsed_s)  # what a confirmation's measurement will cost
        if result.status == "failed" and (result.error or "").startswith("the measurement worker could not be restarted"):
            self._restart_failures += 1
            if self._restart_failures >= MAX_RESTART_FAILURES:
                self.db.finish_trial(tid, "failed", error=result.error)
                raise WorkerStartError(f"{self._restart_failures} restarts of the measurement worker failed in a row; "
                                       f"the last: {result.error}")
        else:
            self._restart_failures = 0
        return result

    def _best_s(self) -> float | None:
        """The best verified time of the workload so far, in seconds (a candidate much slower is stopped)."""
        best = self.db.best(self.record)
        return None if best is None or best.median_ms is None else best.median_ms / 1e3

    def _beats_best(self, result: TrialResult, best: float | None) -> bool:
        """Whether ``result`` is faster than ``best`` (seconds; None: nothing verified yet)."""
        if result.status != "ok" or result.median is None:
            return False
        return best is None or result.median < best

    def _observe(self, config: dict[str, Any], point: Any, result: TrialResult) -> None:
        if self._learner is not None and result.status != "invalid":
            self._learner.observe(config, point, result)

    def _close_guide(self) -> dict[str, Any] | None:
        if self._learner is None:
            return None
        self._learner.close()
        info = self._learner.describe()
        self.study.set_user_attr("rgtune.guide", info)
        return info

    # ------------------------------------------------------------------ reporting
    def default_ms(self) -> float | None:
        default = self._default_trial()
        return default.median_ms if default is not None else None

    def _default_trial(self) -> "TrialRecord | None":
        """The first ``ok`` measurement of the default schedule (every study measures it first)."""
        default = self.space.default()
        for rec in self.db.history(self.record, status="ok"):
            if rec.knobs == default or all(rec.knobs.get(k) == v for k, v in default.items()):
                return rec
        return None

    def _update_progress(self, bar: Any, result: TrialResult, start: float) -> None:
        if bar is None:
            return
        best = self.db.best(self.record)
        default = self.default_ms()
        post = {"last": result.status}
        if result.status == "pruned":
            predicted = result.details.predicted_ms
            post["last"] = "pruned" + (f" (predicted {predicted:.3g} ms)" if predicted else "")
        if best is not None:
            post["best"] = f"{best.median_ms:.3g} ms"
            if default:
                post["speedup"] = f"{default / best.median_ms:.2f}x"
        if self.options.time_budget is not None:
            post["left"] = f"{max(0.0, self.options.time_budget - (time.time() - start)):.0f} s"
        bar.set_postfix(post, refresh=False)
        if result.status in UNMEASURED:
            bar.refresh()  # the bar counts measured trials, the budget
        else:
            bar.update(1)

    def _summary(self, proposed: int, measured: int, statuses: dict[str, int], elapsed: float, interrupted: bool,
                 guide: dict[str, Any] | None, confirmed: Confirmed | None) -> TuneSummary:
        best = self.db.best(self.record)
        default = self._default_trial()
        default_ms, default_confirmed = (default.median_ms if default else None), False
        default_hash = default.schedule_hash if default else None
        if best is not None and confirmed is not None and confirmed.finished and best.confirmation_id == confirmed.id \
                and default_hash in confirmed.medians_ms:
            default_ms, default_confirmed = confirmed.medians_ms[default_hash], True  # both confirmed medians
        whole = self._whole_graph_comparison(best, confirmed)
        timed = best.details if best is not None and best.details is not None else TrialDetails()
        return TuneSummary(self.record.id, self.study.study_name, proposed, statuses, default_ms,
                           best.median_ms if best else None, best.knobs if best else None,
                           best.id if best else None, elapsed, interrupted, measured, rechecked=self.rechecked,
                           over_memory=self.over_memory, guide=guide, confirmation=confirmed, default_confirmed=default_confirmed,
                           default_is_best=best is not None and default is not None and best.schedule_hash == default_hash,
                           best_verified_inputs=best.verified_inputs if best else None, whole_graph=whole,
                           best_study_trial=self.db.study_trial_number(best) if best else None,
                           best_kernel_ms=timed.kernel_ms, best_call_ms=timed.call_ms, best_objective=timed.objective,
                           earlier_measured=getattr(self, "earlier_measured", 0),
                           paired_speedup=confirmed.paired_speedup(default_hash, best.schedule_hash)
                           if default_confirmed and best is not None and default_hash is not None else None)

    def _whole_graph_comparison(self, best: "TrialRecord | None", confirmed: Confirmed | None) -> WholeGraphBest | None:
        """The best whole-graph schedule's time on the batches: confirmed with the best where both took part in
        the confirmation that decided it, else the median of its measurements on the batches (None: never measured)."""
        wg = self.whole_graph
        if wg is None:
            return None
        h = wg.schedule_hash
        if confirmed is not None and confirmed.finished and best is not None and best.confirmation_id == confirmed.id \
                and h in confirmed.medians_ms:
            ms, sure = confirmed.medians_ms[h], True
        else:
            runs = [t.median_ms for t in self.db.history(self.record, status="ok") if t.schedule_hash == h]
            ms, sure = (statistics.median_low(runs) if runs else None), False
        return WholeGraphBest(wg.id, wg.median_ms, ms, sure, best is not None and best.schedule_hash == h)


# ---------------------------------------------------------------------- helpers
def _progress(opts: TuneOptions, total: int | None = None, desc: str = "tuning") -> Any:
    if not opts.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=opts.trials if total is None else total, unit="trial", dynamic_ncols=True, desc=desc)


def _optuna_outcome(result: TrialResult) -> tuple["optuna.trial.TrialState", float | None]:
    """What Optuna is told of a trial: complete with its time in ms, pruned, or failed."""
    from optuna.trial import TrialState

    if result.ok_ms is not None:
        return TrialState.COMPLETE, result.ok_ms
    # a candidate over the memory limit is pruned too: TPE counts pruned trials among the bad ones and steers
    # away (a failed trial it ignores, and on a big graph it kept proposing schedules that would not fit)
    return (TrialState.PRUNED if result.status in ("pruned", "stopped", "out_of_memory") else TrialState.FAIL), None
