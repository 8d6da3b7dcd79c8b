"""``rgtune costmodel``: train the cost model on the trial history, or evaluate it on a held-out graph."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rgtune.cli._common import TRUST_CODE_HELP, CLIError, add_db_arg, open_query_db

if TYPE_CHECKING:  # the cost model loads scikit-learn: imported when the command runs, not with every command
    from rgtune.costmodel import CostModel, HoldoutResult
    from rgtune.db import TrialDatabase


#: ``rgtune.costmodel.model.ESTIMATORS`` and ``TARGETS``, spelt out: importing the cost model slows every command
#: by 0.1 s (tests/test_costmodel.py checks that they agree)
ESTIMATOR_CHOICES = ("et", "gbr", "hgb", "pairwise", "rf")
TARGET_CHOICES = ("log_default", "zscore", "rank")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "costmodel", help="train the cost model on the history, or evaluate it on a held-out graph",
        description="Train the learned cost model on the trial history, or evaluate it on a held-out graph.",
        epilog="Examples:\n  rgtune costmodel --db sqlite:///results.db            # train (or refresh) and save\n"
               "  rgtune costmodel --eval --db sqlite:///results.db --holdout aifb\n"
               "  rgtune costmodel --eval --db sqlite:///results.db --holdout aifb --batches "
               "neighbor:fanout=10x10,batch_size=256   # a sampler's workloads (tune --batches)\n"
               "  rgtune costmodel --db sqlite:///results.db --freeze history.json.gz   # a frozen history\n"
               "  rgtune costmodel --eval --history tests/data/costmodel_history.json.gz --holdout synthetic:bgs "
               "--train-max-edges 200000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_db_arg(p)
    p.add_argument("--eval", action="store_true",
                   help="train on every graph but --holdout, and rank the schedules measured on --holdout")
    p.add_argument("--holdout", metavar="DATASET", help="the held-out graph (its name in the database)")
    p.add_argument("--model", help="only held-out workloads of this model")
    p.add_argument("--batches", metavar="SAMPLER", default="",
                   help="--eval: rank the held-out graph's workloads tuned for this sampler (tune --batches, e.g. "
                        "neighbor:fanout=10x10,batch_size=256) instead of its whole-graph ones")
    p.add_argument("--backend", help="only this backend (default: the one with most trials on the held-out graph)")
    p.add_argument("--device", help="only this device (its name)")
    p.add_argument("--estimator", default="hgb", choices=ESTIMATOR_CHOICES, help="the regressor (default hgb; pairwise: trees on a pairwise ranking loss)")
    p.add_argument("--target", default="log_default", choices=TARGET_CHOICES,
                   help="per-workload normalization of the time (default log_default)")
    p.add_argument("--data-dir", default=None, help="where the history's graphs are loaded from")
    p.add_argument("--trust-code", action="store_true", help=TRUST_CODE_HELP)
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.add_argument("--freeze", metavar="FILE",
                   help="write the ok trials of --db's workloads to FILE, a frozen history (gzip'd JSON), "
                        "and stop")
    p.add_argument("--history", metavar="FILE",
                   help="--eval on a frozen history (--freeze) instead of --db: no timing noise, the same metrics "
                        "on every machine")
    p.add_argument("--train-max-edges", type=int, metavar="N",
                   help="--eval: train only on graphs of at most N edges (does a model of small graphs rank a "
                        "big one?)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train and save, or (``--eval``) evaluate; an evaluation ends with
    ``opa=<x> kendall_tau=<x> top1_error=<x> top5_error=<x> opa_10=<x>``."""
    import logging

    from rgtune.costmodel import CostModel, evaluate_holdout

    logging.basicConfig(level=logging.WARNING, format="rgtune: %(message)s")
    if args.eval and not args.holdout:
        raise CLIError("--eval needs --holdout DATASET")
    if args.history and not args.eval:
        raise CLIError("--history is evaluated (--eval --holdout DATASET); a model is trained and saved on --db")
    if args.train_max_edges is not None and not args.eval:
        raise CLIError("--train-max-edges is an option of --eval")
    if args.batches and not args.eval:
        raise CLIError("--batches is an option of --eval")
    if args.freeze:
        return _freeze(args)
    if args.history:
        from rgtune.costmodel.frozen import thaw

        try:
            db = thaw(args.history)
        except (OSError, ValueError) as e:
            raise CLIError(f"--history {args.history}: {e}") from None
    else:
        db = open_query_db(args.db, "rgtune costmodel")  # read-only: training reads the history, saves a file
    cm = CostModel(args.estimator, args.target)
    if args.eval:
        from rgtune.costmodel.evaluation import larger_than

        exclude = None if args.train_max_edges is None else larger_than(db, args.train_max_edges)
        r = evaluate_holdout(db, args.holdout, model=args.model, backend=args.backend, device=args.device,
                             cost_model=cm, data_dir=args.data_dir, trust_code=args.trust_code, exclude=exclude,
                             batches=args.batches)
        _print_holdout(r)
        out: dict[str, Any] = r.as_dict()
    else:
        out = {"models": _train_all(db, cm, args)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    if args.eval:
        print(r.last_line())
    return 0


def _freeze(args: argparse.Namespace) -> int:
    from rgtune.costmodel.frozen import freeze

    db = open_query_db(args.db, "rgtune costmodel")
    try:
        n = freeze(db, args.freeze, backend=args.backend)
    except OSError as e:
        raise CLIError(f"--freeze {args.freeze}: {e.strerror or e}") from None
    print(f"froze {n} ok trials to {args.freeze}")
    return 0


def _print_holdout(r: "HoldoutResult") -> None:
    from rgtune.costmodel.evaluation import METRICS, fmt_metric

    print(f"holdout {r.holdout} on {r.device} ({r.backend}): trained on {r.n_train} ok trials of "
          f"{r.n_train_workloads} other workload(s)")
    print(r.status)
    for w in r.per_workload:
        print(f"  {w['model']:<5} {w.get('mode', 'inference'):<9} in={w['in_dim']} out={w['out_dim']} heads={w['heads']}: {w['schedules']} schedules  "
              + " ".join(f"{k}={fmt_metric(w[k])}" for k in METRICS))


def _train_all(db: "TrialDatabase", cm: "CostModel", args: argparse.Namespace) -> list[dict[str, Any]]:
    from rgtune.costmodel import CostModel, GraphLoader, fit_on_history

    groups = sorted({(w.backend, w.device) for w in db.workloads()
                     if (args.backend is None or w.backend == args.backend)
                     and (args.device is None or w.device == args.device)})
    if not groups:
        print("no trials in the database yet: nothing to train on")
    out = []
    for be, dev in groups:
        fit = fit_on_history(db, CostModel(**cm.params()), be, dev, graphs=GraphLoader(args.data_dir),
                             trust_code=args.trust_code)
        if fit.path is None:
            where = "not saved (in-memory database)"
        else:
            where = f"{'kept at' if fit.loaded and not fit.refit else 'saved to'} {fit.path}"
        how = "refit" if fit.refit else "history unchanged: the saved model is used as it is"
        print(f"{dev} ({be}): {fit.model.status}; {how}; {where}")
        out.append({"device": dev, "backend": be, "status": fit.model.status, "path": str(fit.path)})
    return out
