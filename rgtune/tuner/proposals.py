"""Candidate proposals on an in-memory copy of a study: the sampler's, and local changes of fast schedules.

A ranking guide (see :mod:`.study`) is shown a pool of candidates per measurement. Proposing them
on the study itself would write every proposal's parameters to the database; on a copy in memory
it costs a few milliseconds. The copy learns every finished trial of the study before each pool
(:meth:`ProposalPool.sync`), so its sampler knows what the real one knows; every proposal is told
failed on the copy at once (samplers ignore failed trials), so candidates that are not measured
never weigh on the sampler. Local candidates (:meth:`ProposalPool.mutate`) change 1 or 2 knobs of
one of the fastest measured schedules: the mutation step of an evolutionary search, with the
guide as its filter.

Example:
    >>> import optuna
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.search_spaces import SearchSpace
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> space = SearchSpace(build_model("rgcn", 8, 8), random_graph((10, 20), num_relations=2, num_edges=60, seed=0))
    >>> pool = ProposalPool(optuna.samplers.RandomSampler(seed=0), seed=0)
    >>> [space.check(p.config) for p in pool.propose(2, space)]
    [[], []]
    >>> pool.mutate(4, 3, space)   # nothing measured yet: no schedule to change
    []
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import optuna

__all__ = ["Proposal", "ProposalPool"]


@dataclass
class Proposal:
    """A candidate proposed on the in-memory copy: its knob values and its Optuna parameters."""

    config: dict[str, Any]
    params: dict[str, Any]
    distributions: dict[str, Any]
    number: int  # the copy's trial number (seeds the measurement)
    local: bool = False  # a change of a fast measured schedule (:meth:`ProposalPool.mutate`), not the sampler's


class ProposalPool:
    """The study's sampler on an in-memory copy of the study: candidate pools without database writes.

    Every proposal is told failed on the copy at once (samplers ignore failed trials), so the
    candidates that are not measured never weigh on the sampler; the measured one is added to
    the real study (``Tuner._pool_round``), and comes back to the copy with the next :meth:`sync`.
    """

    def __init__(self, sampler: "optuna.samplers.BaseSampler", seed: int | None = None) -> None:
        import optuna

        self.copy = optuna.create_study(direction="minimize", sampler=sampler)
        self._copied: set[int] = set()  # numbers of the real study's trials already on the copy
        self._rng = random.Random(seed)  # which parents and knobs :meth:`mutate` changes

    def sync(self, study: "optuna.Study") -> bool:
        """Copy the study's finished trials (of every worker) that the copy does not have yet;
        whether trials wait in the study (one read of the storage answers both)."""
        from optuna.trial import TrialState

        waiting = False
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING)):
            if t.state == TrialState.WAITING:
                waiting = True
            elif t.number not in self._copied:
                self._copied.add(t.number)
                self.copy.add_trial(t)
        return waiting

    def propose(self, n: int, space: Any) -> list[Proposal]:
        """``n`` candidates from the sampler."""
        return [self._ask(space) for _ in range(n)]

    def mutate(self, n: int, parents: int, space: Any) -> list[Proposal]:
        """Up to ``n`` distinct candidates that each change 1 or 2 parameters of one of the copy's ``parents``
        fastest completed trials to another of their values, none a schedule the study has (none before a
        trial completed). Parameters a change makes active (``compact.pair_index`` once something is
        compact) are the sampler's to choose, as in a proposal."""
        from optuna.trial import TrialState

        done = sorted(self.copy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.value)
        by_schedule: dict[tuple[tuple[str, Any], ...], Any] = {}  # each schedule's fastest trial, fastest first
        for t in done:
            by_schedule.setdefault(_params_key(t.params), t)
        seen = set(by_schedule)
        fastest = list(by_schedule.values())[:parents]
        out: list[Proposal] = []
        for _ in range(4 * n if fastest else 0):  # a few draws may repeat a schedule; give up after 4n
            if len(out) == n:
                break
            parent = self._rng.choice(fastest)
            free = [name for name, d in parent.distributions.items() if len(getattr(d, "choices", ())) > 1]
            if not free:
                continue
            params = dict(parent.params)
            for name in self._rng.sample(free, min(len(free), self._rng.choice((1, 2)))):
                params[name] = self._rng.choice([c for c in parent.distributions[name].choices if c != params[name]])
            key = _params_key(params)
            if key in seen:
                continue
            seen.add(key)
            self.copy.enqueue_trial(params)
            out.append(self._ask(space, local=True))
        return out

    def _ask(self, space: Any, local: bool = False) -> Proposal:
        """The copy's next candidate (an enqueued one first), told failed at once."""
        from optuna.trial import TrialState

        trial = self.copy.ask()
        config = space.suggest(trial)
        self.copy.tell(trial, state=TrialState.FAIL)
        return Proposal(config, dict(trial.params), dict(trial.distributions), trial.number, local)


def _params_key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))
