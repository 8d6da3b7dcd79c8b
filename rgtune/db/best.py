"""Private helper of :mod:`rgtune.db`: which trial of a workload is its best.

Without a confirmation, the fastest ``ok`` trial (lowest median; the earliest on a tie).

With one (revision 0003), the latest *finished* confirmation of the workload decides: its
schedules were timed in interleaved rounds in one process, and the schedule with the lowest
median over its ``ok`` rounds wins; the trial returned is its round whose time is that median. The
median of an even number of rounds is the lower middle one (a contender's rounds add to the
winner's), never the mean of the two: a round's time, so the best trial's time, the confirmed median
and the Optuna study's value of that schedule (:mod:`rgtune.tuner.confirmation`) are one number. A trial of the search
recorded after that confirmation, and faster than the winner's median, is returned instead:
it has not been confirmed yet (``tune`` confirms at the end of every run by default, so this
happens only after ``--confirm 0`` or an interrupted confirmation).

A schedule that failed a re-verification on fresh inputs (revision 0004, ``rg_verifications``)
is never the best, with or without a confirmation: its kernels computed a wrong output once.

Why: on a shared machine one measurement of a schedule varies by tens of percent from run to
run, so the fastest of a hundred single measurements is biased low (the winner's curse) and
often not the fastest schedule.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.orm import Session

from rgtune.db.schema import Confirmation, Trial, Verification
from rgtune.db.trial_result import TrialStatus

__all__ = ["best_trial_id", "confirmed_winner", "confirmed_pick", "confirmation_medians", "rejected_schedules"]

_OK = TrialStatus.OK.value


def confirmed_pick(rounds: list[tuple[int, int, float]]) -> tuple[int, float] | None:
    """``(trial id, median ms)`` of the winning schedule among ``(trial id, schedule id, ms)`` rounds.

    Example:
        >>> confirmed_pick([(1, 7, 3.0), (2, 8, 2.0), (3, 7, 1.0), (4, 8, 2.5), (5, 7, 2.0), (6, 8, 9.0)])
        (5, 2.0)
        >>> confirmed_pick([(1, 7, 1.0), (2, 7, 3.0), (3, 8, 2.5), (4, 8, 2.5)])  # even: a round's time, not a mean
        (1, 1.0)
        >>> confirmed_pick([]) is None
        True
    """
    by_schedule: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for trial_id, schedule_id, ms in rounds:
        by_schedule[schedule_id].append((ms, trial_id))
    if not by_schedule:
        return None
    medians = {sch: statistics.median_low(ms for ms, _ in v) for sch, v in by_schedule.items()}
    winner = min(medians, key=lambda sch: (medians[sch], min(t for _, t in by_schedule[sch])))
    middle = min(by_schedule[winner], key=lambda r: (abs(r[0] - medians[winner]), r[1]))
    return middle[1], medians[winner]


def rejected_schedules(s: Session, workload_id: int) -> set[int]:
    """The schedules of a workload that failed a re-verification on fresh inputs: never its best."""
    return set(s.scalars(sa.select(Verification.schedule_id)
                         .where(Verification.workload_id == workload_id, Verification.status != _OK)))


def confirmation_medians(s: Session, confirmation_id: int, rejected: set[int] = frozenset()) -> dict[int, float]:
    """Schedule id -> the median of its ``ok`` rounds in a confirmation, the lower middle one for an even count
    (see the module docstring; rejected schedules left out)."""
    rounds: dict[int, list[float]] = defaultdict(list)
    for sch, ms in s.execute(sa.select(Trial.schedule_id, Trial.median_ms)
                             .where(Trial.confirmation_id == confirmation_id, Trial.status == _OK,
                                    Trial.median_ms.is_not(None))):
        if int(sch) not in rejected:
            rounds[int(sch)].append(float(ms))
    return {sch: statistics.median_low(v) for sch, v in rounds.items()}


def confirmed_winner(s: Session, workload_id: int, rejected: set[int] | None = None) -> tuple[int, float, int] | None:
    """``(trial id, median ms, id of its last round)`` of the winner of the workload's latest finished
    confirmation, if it has one with an ``ok`` round (schedules that failed a re-verification left out)."""
    conf = s.scalar(sa.select(Confirmation.id)
                    .where(Confirmation.workload_id == workload_id, Confirmation.finished_at.is_not(None))
                    .order_by(Confirmation.id.desc()).limit(1))
    if conf is None:
        return None
    rejected = rejected_schedules(s, workload_id) if rejected is None else rejected
    rows = s.execute(sa.select(Trial.id, Trial.schedule_id, Trial.median_ms, Trial.status)
                     .where(Trial.confirmation_id == conf)).all()
    pick = confirmed_pick([(int(t), int(sch), float(ms)) for t, sch, ms, st in rows
                           if st == _OK and ms is not None and int(sch) not in rejected])
    return None if pick is None else (pick[0], pick[1], max(int(t) for t, *_ in rows))


def best_trial_id(s: Session, workload_id: int) -> int | None:
    """The id of the workload's best trial (see the module docstring), or None without ``ok`` trials."""
    rejected = rejected_schedules(s, workload_id)
    fastest = (sa.select(Trial.id, Trial.median_ms)
               .where(Trial.workload_id == workload_id, Trial.status == _OK, Trial.median_ms.is_not(None),
                      Trial.schedule_id.not_in(rejected))
               .order_by(Trial.median_ms, Trial.id).limit(1))
    winner = confirmed_winner(s, workload_id, rejected)
    if winner is not None:
        winner_id, winner_ms, last_round = winner
        newer = s.execute(fastest.where(Trial.id > last_round, Trial.confirmation_id.is_(None))).first()
        return int(newer[0]) if newer is not None and newer[1] < winner_ms else winner_id
    row = s.execute(fastest).first()
    return None if row is None else int(row[0])
