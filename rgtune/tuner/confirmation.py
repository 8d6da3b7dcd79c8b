"""The end of a run: the fastest schedules timed again side by side, the best re-verified, the study told.

One measurement of a schedule varies by tens of percent between runs on a shared machine, so the
fastest of many single measurements is biased low and often not the fastest schedule. When the
search ends (:class:`Confirmation`):

1. **Rounds.** The ``confirm_top`` fastest schedules of the workload, the winner of the previous
   confirmation and the default schedule are timed again in ``confirm_rounds`` interleaved rounds,
   each round a trial of the confirmation. The default takes part so that the run's speedup
   compares like with like (two confirmed medians), and says so when the default won; so does
   any schedule the tuner asks for (``also``: for a sampler workload, the best schedule tuned on the
   whole graph, which its summary compares with the best for the batches).
2. **Contenders.** A schedule of this study measured faster than the winner's median but not
   confirmed (it was not among the fastest by a single measurement) is timed in further rounds
   beside the winner, so no unconfirmed measurement undercuts the confirmed best.
3. **Re-verification.** A kernel with a data race can pass one verification by luck. The
   schedule :meth:`TrialDatabase.best` returns is verified again on ``reverify_inputs`` fresh
   inputs, each run twice (:meth:`MeasureWorker.reverify`), and the outcome is recorded
   (:meth:`TrialDatabase.record_verification`); a schedule that fails is never the best again,
   and the next best is checked, until one passes. This runs with ``confirm_top=0`` too.
4. **The study.** Optuna's study is told the confirmed result: the trials of every confirmed
   schedule take its confirmed median as their value (the single measurement stays in the
   trial's user attribute ``rgtune.measured_ms``), those of a schedule that failed re-verification
   become failed, and the best schedule gets a trial if the study has none of it (each single
   measurement stays in rgtune's history). So the study's ``best_trial`` (what optuna-dashboard
   shows) is the schedule ``rgtune best`` returns.

Rounds cost ``schedules x confirm_rounds`` measurements and the re-verification a few runs, not
budget; ``confirm_top=0`` skips the rounds. With a time budget (``budget_s``, the tuner gives it a
share of the search's time, and ``measurement_s``, what one measurement took in the search), the
rounds fit in it: fewer rounds (at least :data:`MIN_ROUNDS`, so that a median means something),
then fewer of the fastest schedules (at least the fastest and the default), else no rounds at all.
Contenders are timed whatever is left of the budget (few, and without them a single measurement
could undercut the confirmed best). On a big graph, where one measurement takes
seconds, a fixed 5 x 5 re-timing would otherwise cost more than the search. An interrupted confirmation is recorded but never
trusted by :meth:`TrialDatabase.best`.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from rgtune.tuner.machine_load import LoadSeen, MachineLoad
from rgtune.tuner.measure import MeasureWorker, interleaved

if TYPE_CHECKING:
    import optuna

    from rgtune.db import TrialDatabase, TrialRecord, WorkloadRecord

log = logging.getLogger("rgtune.tuner")

__all__ = ["Confirmed", "Confirmation"]

#: rounds of contenders after the first ones at most (each adds schedules measured below the winner)
MAX_CONTENDER_ROUNDS = 3
#: schedules re-verified at most at the end of a run (each failure makes the next best a candidate)
MAX_REVERIFIED = 5
#: rounds a budgeted confirmation runs at least (else it confirms fewer schedules, or none)
MIN_ROUNDS = 3


@dataclass
class Confirmed:
    """What the end-of-run confirmation did."""

    id: int
    schedules: int
    rounds: int
    elapsed_s: float
    finished: bool  # False: interrupted (the database's best ignores it)
    searched_best_ms: float | None  # the fastest single measurement of the search, for comparison
    medians_ms: dict[str, float]  # schedule hash -> its median over the rounds (ok rounds only)
    #: schedule hash -> round -> its time in that round (ms; ok rounds only): what paired ratios are made of
    round_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    #: how busy the machine was while the rounds ran (None: not measurable here)
    load: LoadSeen | None = None

    def paired_speedup(self, slower: str, faster: str) -> float | None:
        """The median over the rounds both took part in of ``slower``'s time / ``faster``'s: each ratio compares
        two times taken moments apart, so a load that came and went moves both (None: no common round)."""
        a, b = self.round_ms.get(slower, {}), self.round_ms.get(faster, {})
        ratios = [a[r] / b[r] for r in a if r in b and b[r] > 0]
        return statistics.median(ratios) if ratios else None


class Confirmation:
    """Confirms the fastest schedules of a finished search (see the module docstring)."""

    def __init__(self, db: "TrialDatabase", workload: "WorkloadRecord", worker: MeasureWorker, study: "optuna.Study",
                 default: "TrialRecord | None", distributions: Mapping[str, Any], *, top: int, rounds: int,
                 reverify_inputs: int = 3, budget_s: float | None = None, measurement_s: float | None = None,
                 progress: Callable[..., Any] | None = None,
                 also: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """``also``: schedule hash -> knobs of schedules timed in the rounds beside the default, whatever their
        single measurements (a sampler workload's: the best whole-graph schedule, which its summary compares)."""
        self.db, self.workload, self.worker, self.study = db, workload, worker, study
        self.default, self.distributions = default, dict(distributions)  # default: its first ok trial
        self.also = {h: dict(k) for h, k in (also or {}).items()}
        self.top, self.rounds, self.reverify_inputs = top, rounds, reverify_inputs
        self.budget_s, self.measurement_s = budget_s, measurement_s
        self._progress = progress

    def run(self) -> Confirmed | None:
        """Rounds, contenders, re-verification and the study's values; None when no rounds ran."""
        confirmed = self._confirm() if self.top else None
        if confirmed is None or confirmed.finished:
            self.reverify_best(confirmed.id if confirmed is not None else None)
            self.tell_study(confirmed)
        return confirmed

    # ---------------------------------------------------------------- rounds
    def _confirm(self) -> Confirmed | None:
        previous = self.db.confirmed_best(self.workload)
        knobs: dict[str, dict[str, Any]] = {}  # schedule hash -> knobs, fastest single measurement first
        fastest: float | None = None
        for t in self.db.history(self.workload, status="ok", order="fastest"):
            if t.confirmation_id is None and t.schedule_hash not in knobs:
                fastest = t.median_ms if fastest is None else fastest
                knobs[t.schedule_hash] = t.knobs
                if len(knobs) == self.top:
                    break
        if previous is not None:
            knobs.setdefault(previous.schedule_hash, previous.knobs)  # the last winner defends its place
        if self.default is not None:  # the speedup compares two confirmed medians
            knobs.setdefault(self.default.schedule_hash, self.default.knobs)
        for h, k in self.also.items():
            knobs.setdefault(h, k)
        knobs = self._fit(knobs, previous.schedule_hash if previous is not None else None)
        if len(knobs) < 2:
            return None
        cid = self.db.start_confirmation(self.workload, schedules=len(knobs), rounds=self.rounds)
        t0 = time.time()
        finished = False
        self._round_ms: dict[str, dict[int, float]] = {}  # hash -> round -> ms, for paired ratios
        self._passes = 0
        load = MachineLoad.start()
        try:
            self._time(cid, knobs)
            for _ in range(MAX_CONTENDER_ROUNDS):
                contenders = self._contenders(self.db.confirmation_medians(cid))
                if not contenders:  # timed whatever the budget: an unconfirmed faster one would undercut the best
                    break
                self._time(cid, contenders)
            self.db.finish_confirmation(cid)
            finished = True
        except KeyboardInterrupt:
            pass  # the rounds so far stay recorded; best() ignores an unfinished confirmation
        seen = load.stop()
        medians = self.db.confirmation_medians(cid)
        return Confirmed(cid, len(medians), self.rounds, time.time() - t0, finished, fastest, medians,
                         round_ms=self._round_ms, load=seen)

    def _fit(self, knobs: dict[str, dict[str, Any]], previous: str | None) -> dict[str, dict[str, Any]]:
        """The schedules to confirm, and ``self.rounds``, within the time budget (see the module docstring);
        an empty dict when not even two schedules fit."""
        if self.budget_s is None or not self.measurement_s:
            return knobs
        fits = int(self.budget_s // self.measurement_s)  # measurements the budget affords
        if fits >= len(knobs) * self.rounds:
            return knobs
        if fits >= len(knobs) * MIN_ROUNDS:
            self.rounds = fits // len(knobs)
            return knobs
        self.rounds = MIN_ROUNDS
        keep = fits // MIN_ROUNDS
        if keep < 2:
            log.info("the confirmation's budget (%.0f s) affords %d measurements of %.1f s: no rounds",
                     self.budget_s, fits, self.measurement_s)
            return {}
        # the fastest first, then the default (the run's speedup), the ones asked for, the last winner, the next fastest
        default = self.default.schedule_hash if self.default is not None else None
        kept = [h for h in (default, *self.also, previous) if h in knobs]
        top = [h for h in knobs if h not in kept]
        order = top[:1] + list(dict.fromkeys(kept)) + top[1:]
        return {h: knobs[h] for h in order[:keep]}

    def _time(self, cid: int, knobs: Mapping[str, Mapping[str, Any]]) -> None:
        """``self.rounds`` interleaved rounds of ``knobs``, each measurement a trial of confirmation ``cid``."""
        bar = self._progress(total=len(knobs) * self.rounds, desc="confirming") if self._progress else None
        try:
            salt = f"confirmation {cid} of {','.join(sorted(knobs))} round "
            # each pass numbers its rounds apart: a contenders' pass pairs its schedules with the winner's times in
            # its own rounds, not the first pass's
            base, self._passes = self._passes * self.rounds, self._passes + 1
            for rnd, h in interleaved(knobs, self.rounds, salt=salt):
                tid = self.db.start_trial(self.workload, knobs[h], confirmation_id=cid)
                try:
                    result = self.worker.measure(knobs[h], seed=rnd)
                except KeyboardInterrupt:
                    self.db.finish_trial(tid, "failed", error="interrupted (Ctrl-C)")
                    raise
                self.db.record_result(tid, result)
                if result.status == "ok" and result.median is not None:
                    self._round_ms.setdefault(h, {})[base + rnd] = result.median * 1e3
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()

    def _contenders(self, medians: Mapping[str, float]) -> dict[str, dict[str, Any]]:
        """The schedules of this study measured faster than the confirmed winner but not confirmed, with
        the winner beside them (empty when there are none)."""
        from optuna.trial import TrialState

        if not medians:
            return {}
        winner = min(medians, key=medians.__getitem__)
        by_id = self._trials_by_id()
        out: dict[str, dict[str, Any]] = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            rec = by_id.get(t.user_attrs.get("rgtune.trial_id"))
            if rec is not None and rec.schedule_hash not in medians and t.value is not None \
                    and t.value < medians[winner]:
                out[rec.schedule_hash] = rec.knobs
        if out:
            out[winner] = next(t.knobs for t in by_id.values() if t.schedule_hash == winner)
        return out

    # ---------------------------------------------------------------- re-verification
    def reverify_best(self, confirmation_id: int | None) -> None:
        """Verify the best schedule again on fresh inputs unless it already was; the next best while one fails."""
        rng = random.SystemRandom()  # inputs nobody chose: not the search's seeds, not the rounds'
        for _ in range(MAX_REVERIFIED):
            best = self.db.best(self.workload)
            if best is None or (best.verified_inputs or 0) >= self.reverify_inputs:
                return
            seeds = [rng.randrange(2**31) for _ in range(self.reverify_inputs)]
            result = self.worker.reverify(best.knobs, seeds, runs=2)
            if result.status not in ("ok", "wrong_result"):  # the worker died or timed out: no verdict
                log.warning("could not re-verify trial %s (%s): %s", best.id, result.status, result.error)
                return
            self.db.record_verification(self.workload, best.knobs, result.status, inputs=len(seeds), runs=2,
                                        max_error=result.max_error, error=result.error,
                                        source_hash=result.source_hash, confirmation_id=confirmation_id)
            if result.status == "ok":
                return
            log.warning("trial %s's schedule failed re-verification (%s): never the best again", best.id, result.error)

    # ---------------------------------------------------------------- the study
    def tell_study(self, confirmed: Confirmed | None) -> None:
        """Give the study the confirmed result (see the module docstring, step 4)."""
        from optuna.trial import TrialState, create_trial

        by_id = self._trials_by_id()
        rejected = {v.schedule_hash for v in self.db.verifications(self.workload) if v.status != "ok"}
        medians = confirmed.medians_ms if confirmed is not None and confirmed.finished else {}
        values: dict[int, float] = {}  # by the trial's number in the study
        failed: list[int] = []
        seen: set[str] = set()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            rec = by_id.get(t.user_attrs.get("rgtune.trial_id"))
            if rec is None:
                continue
            seen.add(rec.schedule_hash)
            if rec.schedule_hash in rejected:
                failed.append(t.number)
            elif rec.schedule_hash in medians and t.value != medians[rec.schedule_hash]:
                values[t.number] = medians[rec.schedule_hash]
        if values or failed:
            self.db.correct_optuna_trials(self.study.study_name, values, failed)
        best = self.db.best(self.workload)
        if best is not None and best.schedule_hash not in seen:  # e.g. a previous study's winner
            params = {k: v for k, v in best.knobs.items() if k in self.distributions}
            self.study.add_trial(create_trial(state=TrialState.COMPLETE, value=best.median_ms, params=params,
                                              distributions={k: self.distributions[k] for k in params},
                                              user_attrs={"rgtune.trial_id": best.id,
                                                          "rgtune.confirmation": best.confirmation_id}))

    # ---------------------------------------------------------------- helpers
    def _trials_by_id(self) -> dict[int, "TrialRecord"]:
        return {t.id: t for t in self.db.history(self.workload)}

