"""``rgtune bench``: one layer side by side (rgtune, its torch lowering, the plain torch layer, PyG, DGL)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Sequence

from rgtune.cli._common import CLIError, CommandFailed, add_db_arg, add_layer_args, add_peak_arg, model_options

#: ``rgtune.bench.IMPLS`` and ``rgtune.tuner.verification.SAMPLE_ABOVE_EDGES``, spelt out: both modules import
#: torch, which would cost every command (``--help`` included) seconds (tests/test_cli_examples.py checks that
#: they agree)
IMPLS = ("rgtune", "lowering", "torch", "pyg", "dgl")
SAMPLE_ABOVE_EDGES = 200_000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="tuned layer vs reference lowering vs PyG vs DGL, side by side",
        description="Time one layer side by side: rgtune's tuned kernels, its torch lowering, the torch reference "
                    "layer, PyG and DGL (same graph, sizes, weights, threads): the forward, and a training step "
                    "(forward, then backward to the input and every parameter); print a table, with the floor of "
                    "rgtune's schedules on the device and the share of it reached; with --write, also write a row to "
                    "BENCHMARKS.md (nothing is written unless asked).",
        epilog="Example: rgtune bench --model rgcn --dataset aifb --tune-trials 30")
    add_layer_args(p, "aifb, mutag, ..., or synthetic:<spec>")
    add_db_arg(p)
    p.add_argument("--tune-trials", type=int, default=0, metavar="N",
                   help="tune N trials per mode (inference, training) first when this device has no record of "
                        "the workload in that mode (default 0: don't)")
    p.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=20, help="timed rounds (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per implementation and mode (default 3)")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and input")
    p.add_argument("--memory", action="store_true",
                   help="kept for old command lines: every implementation's peak memory (forward, training step) "
                        "is now measured with its run, in its own process")
    p.add_argument("--impl-timeout", type=float, default=None, metavar="SECONDS",
                   help="each implementation's process may take this long (imports, build, runs, check); past "
                        "it, it is killed and its row says '> N s' (default 600)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GB",
                   help="each implementation's process may hold this much resident memory; past it, it is "
                        "killed and its row says OOM (default: 75%% of the memory available at the start)")
    p.add_argument("--check-rows", type=int, default=512, metavar="N",
                   help=f"on a graph of more than {SAMPLE_ABOVE_EDGES:,} edges, check N sampled destination rows of each output "
                        "against the float64 reference on their in-neighbourhood (default 512)")
    add_peak_arg(p)
    p.add_argument("--write", nargs="?", const="BENCHMARKS.md", default=None, metavar="PATH",
                   help="write the row into the markdown file PATH (default when given without PATH: "
                        "BENCHMARKS.md); without it, bench prints only")
    p.add_argument("--output", default=None, metavar="PATH", help="the same as --write PATH (older command lines)")
    p.add_argument("--no-write", action="store_true", help="print only (the default; kept for older command lines)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also append the result as one JSON line (every repeat's time) to PATH")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Bench the layer, print the table, write the row (and the JSON line)."""
    from rgtune.bench import bench, format_table, result_json, write_benchmarks

    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise CLIError(f"unknown --impls {unknown}; choose from {','.join(IMPLS)}")
    if args.repeats < 1 or args.warmup < 0:
        raise CLIError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    for flag, value in (("--impl-timeout", args.impl_timeout), ("--memory-limit", args.memory_limit),
                        ("--check-rows", args.check_rows)):
        if value is not None and value <= 0:
            raise CLIError(f"{flag} must be > 0, got {value:g}")
    options = model_options(args)
    try:
        res = bench(args.model, args.dataset, in_dim=args.in_dim or args.hidden, out_dim=args.out_dim or args.hidden,
                    heads=args.heads, backend=args.backend, db=args.db, impls=impls, repeats=args.repeats,
                    warmup=args.warmup, threads=args.threads, seed=args.seed, tune_trials=args.tune_trials,
                    data_dir=args.data_dir, impl_timeout=args.impl_timeout, memory_limit_gb=args.memory_limit,
                    check_rows=args.check_rows, command="rgtune bench " + shlex.join(_portable(args.argv)),
                    options=options, peak=args.peak)
    except Exception as e:  # noqa: BLE001 - an implementation or library that failed: one line, as every command
        raise CommandFailed(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}") from e
    print(format_table(res))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result_json(res)) + "\n")
    target = args.write or args.output
    if target is not None and args.no_write:
        raise CLIError(f"--no-write and --write/--output {target} contradict each other; give one")
    if target is not None:
        write_benchmarks(Path(target), res)
        print(f"wrote the row to {target}")
    return 0


def _portable(argv: Sequence[str]) -> list[str]:
    """The command line as BENCHMARKS.md records it: without where files live on this machine
    (``--write``, ``--output``, ``--data-dir``, ``--json``, ``--no-write``; a database by its file name, a
    server's URL without its password)."""
    from rgtune.db.engine import hide_password

    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        i += 1
        # a flag's value is the next argument (--write's only when that is no flag: its path is optional)
        takes_next = name in ("--output", "--data-dir", "--db", "--json") or (
            name == "--write" and i < len(argv) and not argv[i].startswith("-"))
        if takes_next and not eq:
            value = argv[i] if i < len(argv) else ""
            i += 1
        if name in ("--write", "--output", "--data-dir", "--no-write", "--json"):
            continue
        if name == "--db":
            if value.startswith("sqlite:///"):  # a file's URL: its name only
                value = "sqlite:///" + Path(value[len("sqlite:///"):]).name
            out += ["--db", hide_password(value) if "://" in value else Path(value).name]
            continue
        out.append(arg)
    return out
