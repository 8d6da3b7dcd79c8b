"""Which schedules should a new study measure first: the model's top K, or picks hedged over the history?

The rank policy's opening measures the cost model's ``K`` best-predicted schedules of a graph
it has no trials of. When that graph behaves unlike the history's graphs, all ``K`` can share
the same wrong large knob (HGT on MUTAG in the recheck ablation: every opening pick attended on
the destination side, the fastest schedules on the source side). Hedging spends some of the
``K`` picks on what other plausible histories would pick. The uncertainty that matters is
*which graphs the new one resembles*, so the plausible histories resample whole graphs: each
of ``--members`` models is fit on the history's workloads drawn with replacement (the
graph-level bootstrap, :meth:`CostModel.resampled`; schedules of one graph are not independent
evidence). Rules:

* ``top``: the full model's ``K`` best-predicted (what the tuner does);
* ``bag``: the full model's first pick, then each resampled model's first pick in turn (a
  Thompson-style draw per pick), repeats skipped, the rest from the full model's order;
* ``lcb``: the ``K`` lowest of mean minus standard deviation over the resampled models
  (optimism where the histories disagree).

Evaluation, no measuring: every graph of the history is held out in turn (its workloads are
ranked by models fit on the other graphs only); a schedule's true time is the median of its
measurements. For each held-out workload, ``--subpools`` random subsets of ``--subpool-size``
of its schedules (the first is all of them) stand for the opening's candidate pool, and each
rule's score is the best true time among its ``K`` picks over the best in the pool (1: the
opening found the pool's best). Repeated for several ``--resample-seeds``: the hedged rules
depend on the draw.

Outputs (``--out``): ``opening_rules.csv`` (one row per held-out workload x seed x subpool x
rule x K) and ``opening_rules.md`` (the table: mean score / share within 5% per workload and rule).

Example::

    python experiments/opening_rules.py --db sqlite:///cm_history.db --out experiments/results/opening_rules
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from costmodel_transfer import (
    RESULTS,
    _display,
    add_count_features_argument,
    split_names,
    use_count_features,
    write_csv,
)

from rgtune.costmodel import CostModel, GraphLoader, Sample
from rgtune.db import TrialDatabase, WorkloadRecord

RULES = ("top", "bag", "lcb")
#: a pick within this of the pool's best counts as found (the tuning curves' goal)
WITHIN = 1.05

Rule = Callable[[np.ndarray, np.ndarray, int], list[int]]


def top_k(full: np.ndarray, members: np.ndarray, k: int) -> list[int]:
    """The full model's ``k`` best-predicted (lower score is faster).

    Example:
        >>> top_k(np.array([3.0, 1.0, 2.0]), np.zeros((0, 3)), 2)
        [1, 2]
    """
    return [int(i) for i in np.argsort(full, kind="stable")[:k]]


def bagged(full: np.ndarray, members: np.ndarray, k: int) -> list[int]:
    """The full model's first pick, then each resampled model's first pick in turn, then the full model's order.

    Example:
        >>> bagged(np.array([0.0, 1.0, 2.0, 3.0]), np.array([[0.0, 5, 5, 1], [5, 5, 0, 9]]), 3)
        [0, 2, 1]
    """
    picks = top_k(full, members, 1)
    for scores in members:
        first = int(np.argmin(scores))
        if len(picks) < k and first not in picks:
            picks.append(first)
    return picks + [i for i in top_k(full, members, len(full)) if i not in picks][:k - len(picks)]


def lower_bound(full: np.ndarray, members: np.ndarray, k: int) -> list[int]:
    """The ``k`` lowest mean-minus-spread over the resampled models.

    Example:
        >>> lower_bound(np.zeros(3), np.array([[1.0, 0.0, 2.0], [1.0, 2.0, 2.0]]), 1)
        [1]
    """
    optimistic = members.mean(axis=0) - members.std(axis=0)
    return [int(i) for i in np.argsort(optimistic, kind="stable")[:k]]


RULE_FUNCS: dict[str, Rule] = {"top": top_k, "bag": bagged, "lcb": lower_bound}


def _true_times(samples: Sequence[Sample]) -> tuple[list[str], list[dict[str, float]], np.ndarray]:
    """A workload's schedules, a feature row each, and each one's median time."""
    by_schedule: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_schedule[s.schedule].append(s)
    names = sorted(by_schedule)
    return (names, [by_schedule[h][0].features for h in names],
            np.array([statistics.median(x.ms for x in by_schedule[h]) for h in names]))


def evaluate(db_url: str, *, holdouts: Sequence[str] | None, ks: Sequence[int], members: int,
             seeds: Sequence[int], subpools: int, subpool_size: int, data_dir: str | None) -> list[dict[str, Any]]:
    """One row per held-out workload x resample seed x subpool x rule x K (see the module docstring)."""
    from rgtune.costmodel.history import load_samples, matching_workloads

    db = TrialDatabase(db_url)
    graphs, cache = GraphLoader(data_dir), {}
    every = [w for w in db.workloads() if w.num_ok > 0]
    rows: list[dict[str, Any]] = []
    for holdout in holdouts or sorted({w.dataset for w in every}):
        held = [w for w in every if w.dataset == holdout]
        groups: dict[tuple[str, str], list[WorkloadRecord]] = defaultdict(list)
        for w in held:
            groups[(w.backend, w.device)].append(w)
        for (backend, device), group in groups.items():
            others = [x for x in matching_workloads(db, backend, device)
                      if x.dataset != holdout and x.graph_hash not in {w.graph_hash for w in group}]
            history = load_samples(db, others, graphs, cache)
            t0 = time.time()
            full = CostModel().fit(history)
            if not full.ready:  # the tuner would not open with this model either
                print(f"{holdout} ({backend}, {device}): skipped: {full.status}", flush=True)
                continue
            for seed in seeds:
                bag = full.resampled(history, members, seed)
                for w in group:
                    names, features, true_ms = _true_times(load_samples(db, [w], graphs, cache))
                    full_scores = full.predict(features)
                    member_scores = np.array([m.predict(features) for m in bag])
                    pools = np.random.default_rng(seed)
                    for p in range(subpools):
                        pool = (np.arange(len(names)) if p == 0 or len(names) <= subpool_size
                                else np.sort(pools.choice(len(names), size=subpool_size, replace=False)))
                        best = float(true_ms[pool].min())
                        for rule, pick in RULE_FUNCS.items():
                            for k in ks:
                                chosen = pool[pick(full_scores[pool], member_scores[:, pool], k)]
                                rows.append({"holdout": holdout, "model": w.model, "backend": backend,
                                             "seed": seed, "subpool": p, "pool": len(pool), "rule": rule,
                                             "k": k, "score": float(true_ms[chosen].min()) / best})
            print(f"{holdout}: {len(group)} workload(s), {len(seeds)} seed(s) x {members} resampled models "
                  f"({time.time() - t0:.0f} s)", flush=True)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per held-out workload and K, each rule's mean score and share within 5%, then the means."""
    cells: dict[tuple[str, str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["holdout"], r["model"], r["k"])][r["rule"]].append(r["score"])
    ks = sorted({k for _, _, k in cells})
    lines = ["| held out | model | K | " + " | ".join(f"{r}: mean / within 5%" for r in RULES) + " |",
             "|---|---|---|" + "---|" * len(RULES)]

    def cell(values: list[float]) -> str:
        return f"{np.mean(values):.3f} / {np.mean(np.array(values) <= WITHIN):.2f}"

    for (holdout, model, k), by_rule in sorted(cells.items()):
        lines.append(f"| {holdout} | {model} | {k} | " + " | ".join(cell(by_rule[r]) for r in RULES) + " |")
    for k in ks:
        for label, keep in (("mean, every workload", lambda h: True),
                            ("mean, real graphs", lambda h: not h.startswith("synthetic:"))):
            sel = {r: [x for (h, _, kk), d in cells.items() if kk == k and keep(h) for x in d[r]] for r in RULES}
            if not sel[RULES[0]]:
                continue
            lines.append(f"| {label} | | {k} | " + " | ".join(cell(sel[r]) for r in RULES) + " |")
    per_seed = defaultdict(list)
    for r in rows:
        per_seed[(r["k"], r["seed"], r["rule"])].append(r["score"])
    lines.append("")
    lines.append("Mean score over every workload, per resample seed: " + "; ".join(
        f"K={k} seed {s}: " + ", ".join(f"{r} {np.mean(per_seed[(k, s, r)]):.3f}" for r in RULES)
        for k, s in sorted({(k, s) for k, s, _ in per_seed})))
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///cm_history.db",
                   help="the history (experiments/costmodel_transfer.py --collect makes one)")
    p.add_argument("--holdouts", default=None, help="graphs held out, ';'-separated (',' when none is synthetic; default: every graph)")
    p.add_argument("--k", default="4", help="opening sizes compared, comma-separated (default 4, the policy's)")
    p.add_argument("--members", type=int, default=8, help="resampled models per seed (default 8)")
    p.add_argument("--resample-seeds", default="0,1,2,3,4", help="seeds of the graph resampling (default 0-4)")
    p.add_argument("--subpools", type=int, default=20, help="candidate pools per workload and seed (default 20)")
    p.add_argument("--subpool-size", type=int, default=40, help="schedules per pool (default 40)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--out", default=str(RESULTS / "opening_rules"), help="where the CSV and table go")
    add_count_features_argument(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ks = [int(x) for x in split_names(args.k)]
        seeds = [int(x) for x in split_names(args.resample_seeds)]
    except ValueError as e:
        raise SystemExit(f"--k and --resample-seeds take comma-separated integers: {e}") from e
    if min(ks, default=0) < 1 or args.members < 1 or args.subpools < 1 or args.subpool_size < 2:
        raise SystemExit("--k, --members and --subpools must be >= 1, --subpool-size >= 2")
    holdouts = split_names(args.holdouts) if args.holdouts else None
    use_count_features(args.count_features)
    rows = evaluate(args.db, holdouts=holdouts, ks=ks, members=args.members, seeds=seeds, subpools=args.subpools,
                    subpool_size=args.subpool_size, data_dir=args.data_dir)
    if not rows:
        raise SystemExit(f"no workload with ok trials in {_display(args.db)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "opening_rules.csv", rows)
    text = (f"History: {_display(args.db)}; {args.members} resampled models per seed, seeds {args.resample_seeds}; "
            f"{args.subpools} pools of {args.subpool_size} per workload (the first: every schedule).\n"
            f"Score: the best true time among a rule's K picks / the pool's best (1 = found it).\n\n" + table(rows))
    (out / "opening_rules.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
