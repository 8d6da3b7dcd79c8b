"""The command line: ``tune`` and ``rgtune <command>``, one module per command.

* :mod:`.tune`: search the knobs of one workload, record every trial (``tune`` is ``rgtune tune``);
* :mod:`.best`, :mod:`.history`: query the trial database (read-only, as ``export`` and
  ``costmodel`` read it: a missing file is refused by name, never created; an older schema is
  refused with how to upgrade it, never upgraded);
* :mod:`.plot`: a workload's tuning as a picture (times, best so far, knob importances);
* :mod:`.show`: the IR before and after passes, the kernels, their counts and sources;
* :mod:`.export`: the best schedule as a folder that training code loads without the database;
* :mod:`.bench`: one layer side by side against its torch lowering, PyG and DGL;
* :mod:`.costmodel`: train the cost model, or evaluate it on a held-out graph;
* :mod:`.datasets`: the datasets and synthetic presets.

Each command module adds its sub-parser (``add_parser``) and runs it (``run(args)``); :func:`main`
parses, then runs the command through :func:`~rgtune.cli._common.run_command`. This package is the
top of the stack: no other module of rgtune parses arguments or imports it.
Every command fails with one line on stderr and a non-zero exit for a bad input (unknown model,
dataset, backend, knob; unreachable database ...), never with a traceback; ``RGTUNE_DEBUG=1``
shows the traceback anyway.

Example:
    >>> build_parser().parse_args(["best", "--model", "hgt"]).model
    'hgt'
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from rgtune.cli import bench, best, costmodel, datasets, export, history, plot, show, tune
from rgtune.cli._common import EXIT_USAGE, run_command

__all__ = ["main", "tune_main", "build_parser", "command_parser"]

#: the commands in the order ``rgtune --help`` lists them
_COMMANDS = (datasets, show, tune, best, history, plot, export, bench, costmodel)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rgtune",
        description="rgtune: an autotuning compiler for relational GNN layers (RGCN, RGAT, HGT).",
        epilog="Examples:\n  tune --model hgt --dataset aifb\n  rgtune best --model hgt --dataset aifb\n"
               "  rgtune show --model rgat --dataset aifb --set compact.src=pair --set fusion.softmax=full",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser that reads the arguments of ``rgtune <name>``.

    Example:
        >>> command_parser("export").parse_args(["--model", "hgt", "--dataset", "aifb", "-o", "out"]).output
        'out'
    """
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if name not in sub.choices:
        raise ValueError(f"unknown command {name!r}; choose one of {sorted(sub.choices)}")
    return sub.choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    """``rgtune COMMAND ARGS...``: the exit status. ``args.argv`` is the command's own arguments as given
    (``bench`` records its command line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    args.argv = argv[1:]
    return run_command(args.func, args)


def tune_main(argv: Sequence[str] | None = None) -> int:
    """``tune ...`` is ``rgtune tune ...``."""
    return main(["tune", *(sys.argv[1:] if argv is None else argv)])
