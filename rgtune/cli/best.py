"""``rgtune best``: the best recorded (and confirmed) schedule of a workload."""

from __future__ import annotations

import argparse

from rgtune.cli._common import CLIError, open_query_db, trial_name
from rgtune.cli._query import add_query_parser, emit, filters


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_query_parser(sub, "best", "the best recorded schedule of a workload", run)


def run(args: argparse.Namespace) -> int:
    db = open_query_db(args.db, "rgtune best")
    best = db.best(**filters(args))
    if best is None:
        raise CLIError("no verified trial matches; run `tune` for this workload first")
    if args.json or args.csv:
        emit([best], args)
    else:
        how = "" if best.confirmation_id is None else \
            f" (median of the {db.confirmation(best.confirmation_id).rounds} rounds of confirmation {best.confirmation_id})"
        on = f"batches of {best.batches} from {best.dataset}" if best.batches else best.dataset
        print(f"best: {trial_name(db.study_trial_number(best), best.id)}, {best.median_ms:.4g} ms{how}, {best.model} on {on} "
              f"({best.backend}, {best.device}), max error "
              f"{'not recorded' if best.max_error is None else format(best.max_error, '.2g')}")
        print(f"  re-verified on {best.verified_inputs} fresh inputs" if best.verified_inputs else
              "  not re-verified on fresh inputs yet (a `tune` run that ends normally does it)")
        for k, v in sorted(best.knobs.items()):
            print(f"  {k} = {v}")
    return 0
