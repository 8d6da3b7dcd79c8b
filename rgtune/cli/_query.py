"""What ``rgtune best`` and ``rgtune history`` share: the workload filters and the three output formats."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from rgtune.cli._common import CLIError, add_db_arg, add_model_args, model_options, positive_int


def add_query_parser(sub: argparse._SubParsersAction, name: str, about: str,
                     run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """A query command's parser: filters of the workload, ``--db``, ``--json``/``--csv``."""
    p = sub.add_parser(name, help=about, description=about[0].upper() + about[1:] + ".")
    add_workload_filters(p, model_required=False)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    p.set_defaults(func=run)
    return p


def add_workload_filters(p: argparse.ArgumentParser, model_required: bool) -> None:
    """The options that select workloads (what :func:`filters` reads) and ``--db``."""
    add_model_args(p, required=model_required, what="filter by model")
    p.add_argument("--dataset", help="filter by dataset (the graph's name)")
    p.add_argument("--backend", help="filter by backend")
    p.add_argument("--hidden", type=positive_int, help="filter by feature size")
    p.add_argument("--heads", type=positive_int, help="filter by heads")
    p.add_argument("--mode", choices=("inference", "training"),
                   help="filter by mode: inference (a forward's schedules) or training (a training step's)")
    p.add_argument("--batches", metavar="SAMPLER",
                   help="filter by the sampler a workload was tuned for (tune --batches; 'none': the whole graph, "
                        "what --model selects unless this is given)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16", "any"),
                   help="filter by the storage types a workload's study allowed (tune --precision; fp32 is what "
                        "--model selects unless this is given)")
    add_db_arg(p)


def filters(args: argparse.Namespace) -> dict[str, Any]:
    """The workload filters given on the command line, as :meth:`TrialDatabase.history` takes them."""
    f = {}
    for key in ("model", "dataset", "backend", "heads", "mode", "precision"):
        if getattr(args, key, None) is not None:
            f[key] = getattr(args, key)
    if getattr(args, "hidden", None) is not None:
        f["in_dim"] = f["out_dim"] = args.hidden
    if getattr(args, "model", None) is not None:  # a model's workloads without options unless --model-opt says
        f["options"] = model_options(args)
    if f.get("backend") == "auto":
        f.pop("backend")
    if "options" in f and "precision" not in f:  # like options: a model's float32 workloads unless --precision says
        f["precision"] = "fp32"
    batches = getattr(args, "batches", None)
    if batches is None and "options" in f:  # like options: a model's whole-graph workloads unless --batches says
        f["batches"] = ""
    elif batches is not None:
        from rgtune.data.sampler_spec import SamplerSpec

        try:
            f["batches"] = "" if batches == "none" else SamplerSpec.parse(batches).key
        except ValueError as e:
            raise CLIError(f"--batches: {e}") from None
    return f


def emit(records: list, args: argparse.Namespace) -> None:
    """Trial records as JSON, CSV, or a line each."""
    from rgtune.db import records_to_json, write_csv

    if args.json:
        print(records_to_json(records))
    elif args.csv:
        write_csv(records, sys.stdout)
    else:
        if records:  # trial: the number in its study (what optuna-dashboard shows); record: the database's id
            print(f"{'trial':>5} {'record':<7} {'model':<5} {'dataset':<12} {'backend':<9} {'role':<10} {'status':<13} "
                  f"{'time':>12}")
        for r in records:
            t = f"{r.median_ms:.4g} ms" if r.median_ms is not None else "-"
            err = f"  {r.error.splitlines()[0][:80]}" if r.error else ""
            role = "search" if r.confirmation_id is None else f"confirm {r.confirmation_id}"
            model = f"{r.model}({r.options})" if r.options else r.model
            dataset = f"{r.dataset} [{r.batches}]" if r.batches else r.dataset
            dataset += f" [{r.precision}]" if r.precision != "fp32" else ""
            number = "-" if r.optuna_trial is None else str(r.optuna_trial)
            print(f"{number:>5} #{r.id:<6} {model:<5} {dataset:<12} {r.backend:<9} {role:<10} {r.status:<13} {t:>12}{err}")

