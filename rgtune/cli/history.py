"""``rgtune history``: every recorded trial of a workload, with its status and time."""

from __future__ import annotations

import argparse

from rgtune.cli._common import open_query_db, positive_int
from rgtune.cli._query import add_query_parser, emit, filters


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_query_parser(sub, "history", "the recorded trials of a workload", run)
    p.add_argument("--status", help="only trials with this status (ok, invalid, wrong_result, ...)")
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many rows")


def run(args: argparse.Namespace) -> int:
    db = open_query_db(args.db, "rgtune history")
    emit(db.history(status=args.status, limit=args.limit, **filters(args)), args)
    return 0
