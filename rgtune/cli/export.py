"""``rgtune export``: the best schedule of a workload as a folder that training code loads without the database."""

from __future__ import annotations

import argparse
import sys
import warnings

from rgtune.cli._common import CommandFailed, add_db_arg, add_layer_args, add_mode_arg, model_options, open_query_db
from rgtune.ir.registry import parse_key


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write the best schedule's kernels to a folder for training code",
        description="Write the best recorded schedule of a workload as a self-contained folder "
                    "(kernel sources, schedule, provenance, README) that rgtune.runtime.load_exported reads "
                    "without the database.",
        epilog="Example: rgtune export --model hgt --dataset aifb -o tuned_hgt/")
    add_layer_args(p, "the dataset the schedule was tuned on (aifb, synthetic:...)")
    add_mode_arg(p, "which schedule to export")
    add_db_arg(p)
    p.add_argument("-o", "--output", required=True, help="the folder to write (must not exist, or be empty)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "any"),
                   help="the study's precision policy, as `tune --precision` recorded it (default fp32; with fp32 "
                        "the best bf16/fp16 schedules, where tuned, go along as the layer's schedules under "
                        "torch.autocast)")
    p.add_argument("--allow-default", action="store_true", help="export the default schedule when none is recorded")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export (:func:`rgtune.runtime.export`) and say where to, and how to load it."""
    from rgtune.runtime import NoTunedScheduleError, TunedScheduleWarning, export
    from rgtune.runtime.export import PROVENANCE_FILE, SCHEDULE_FILE, read_export_json

    in_dim, out_dim = args.in_dim or args.hidden, args.out_dim or args.hidden
    # read-only; a missing file is passed by name: export says so (or, --allow-default, skips it) without creating it
    database = open_query_db(args.db, "rgtune export", missing_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TunedScheduleWarning)
        try:
            out = export(args.output, args.model, args.dataset, in_dim, out_dim, args.heads,
                         db=database if database is not None else args.db, backend=args.backend,
                         data_dir=args.data_dir, mode=args.mode, options=parse_key(model_options(args)),
                         allow_default=args.allow_default, overwrite=args.force, precision=args.precision)
        except (NoTunedScheduleError, OSError) as e:  # nothing to export, or a folder in the way
            raise CommandFailed(str(e)) from e
        finally:
            if database is not None:
                database.close()
    for w in caught:
        print(f"rgtune: warning: {w.message}", file=sys.stderr)
    s = read_export_json(out / SCHEDULE_FILE)
    prov = read_export_json(out / PROVENANCE_FILE)
    what = f"trial {prov['trial_id']} ({prov['median_ms']:.4g} ms)" if prov["schedule"] == "database" else "default schedule"
    mode = "" if s.get("mode", "inference") == "inference" else f", {s['mode']}"
    named = f"{s['model']}({s['options']})" if s.get("options") else s["model"]
    print(f"exported {named} on {s['graph']['name']} ({what}, backend {s['backend']}{mode}) to {out}")
    print(f"load it with: rgtune.runtime.load_exported({str(out)!r}, graph)")
    return 0
