"""What the commands share: the one-line error, argument groups and types, the database and backend lookups.

Every command fails with one line on stderr and a non-zero exit for a bad input (unknown model,
dataset, backend, knob; unreachable database ...), never with a traceback; ``RGTUNE_DEBUG=1``
shows the traceback anyway.

Example:
    >>> parse_sets(["compact.src=pair", " fusion.softmax = full "])
    {'compact.src': 'pair', 'fusion.softmax': 'full'}
    >>> positive_int("3")
    3
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from rgtune.db import DEFAULT_URL
from rgtune.ir.registry import ModelOptionError, list_models, model_spec, parse_options

EXIT_USAGE = 2
EXIT_FAILURE = 1
DATASET_HELP = "aifb, mutag, bgs, am, ogbn-mag, or synthetic:<preset>[,key=value...] (see `rgtune datasets`)"


class CLIError(Exception):
    """A bad input on the command line: printed as one line, exit status :data:`EXIT_USAGE`."""


class CommandFailed(Exception):
    """A command that could not do its work (no tuned schedule to export, an implementation that failed to
    bench): printed as is, exit status :data:`EXIT_FAILURE`."""


# ----------------------------------------------------------------- argument types and groups
def positive_int(text: str) -> int:
    """An argparse type: an integer > 0, with an error that names the bad value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0, with an error that names the bad value."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return v


def model_name(text: str) -> str:
    """An argparse type: a registered model's name, or ``package.module:builder`` (imported)."""
    try:
        return model_spec(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def model_help(what: str) -> str:
    return (f"{what}: {', '.join(list_models())}, or a builder of your own as package.module:function "
            "(README, 'Extending it')")


def add_model_args(p: argparse.ArgumentParser, required: bool = True, what: str = "the layer") -> None:
    """``--model`` and its repeatable ``--model-opt name=value``."""
    p.add_argument("--model", required=required, type=model_name, help=model_help(what))
    p.add_argument("--model-opt", action="append", default=[], metavar="NAME=VALUE",
                   help="a model option (repeatable), e.g. --model-opt num_bases=30 for rgcn; part of the workload's "
                        "identity. `rgtune show --model M` lists a model's options")


def model_options(args: argparse.Namespace) -> str:
    """The ``--model-opt`` values checked against the model's options, as canonical text (``""``: none)."""
    given = getattr(args, "model_opt", None) or []
    if args.model is None:
        if given:
            raise CLIError("--model-opt needs --model")
        return ""
    try:
        return model_spec(args.model).key(parse_options(given))
    except ModelOptionError as e:
        raise CLIError(str(e)) from None


def add_workload_args(p: argparse.ArgumentParser, dataset_required: bool = True) -> None:
    """``--model --model-opt --dataset --data-dir --hidden --in-dim --out-dim --heads``: the workload of ``tune`` and
    ``show`` (:func:`layer_sizes` reads the sizes)."""
    add_model_args(p, what="the layer to compile")
    p.add_argument("--dataset", required=dataset_required, help=DATASET_HELP)
    p.add_argument("--data-dir", default=None,
                   help="folder with one sub-folder per dataset (default: $RGTUNE_DATA_DIR, else the user cache)")
    p.add_argument("--hidden", type=positive_int, default=64, help="input and output feature size (default 64)")
    p.add_argument("--in-dim", type=positive_int, default=None, help="input feature size (default --hidden)")
    p.add_argument("--out-dim", type=positive_int, default=None, help="output feature size (default --hidden)")
    p.add_argument("--heads", type=positive_int, default=1, help="attention heads of a model with attention (default 1)")


def layer_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """``(in_dim, out_dim)``: ``--in-dim`` and ``--out-dim``, each ``--hidden`` where not given."""
    return args.in_dim or args.hidden, args.out_dim or args.hidden


def add_layer_args(p: argparse.ArgumentParser, dataset_help: str) -> None:
    """``--model --model-opt --dataset --data-dir --hidden --in-dim --out-dim --heads --backend``: one layer (export,
    bench)."""
    add_model_args(p)
    p.add_argument("--dataset", required=True, help=dataset_help)
    p.add_argument("--data-dir", default=None, help="dataset root (default: $RGTUNE_DATA_DIR, else the user cache)")
    p.add_argument("--hidden", type=positive_int, default=64, help="in and out feature size (default 64)")
    p.add_argument("--in-dim", type=positive_int, default=None, help="input feature size (default --hidden)")
    p.add_argument("--out-dim", type=positive_int, default=None, help="output feature size (default --hidden)")
    p.add_argument("--heads", type=positive_int, default=1, help="attention heads of a model with attention (default 1)")
    p.add_argument("--backend", default="auto", help="auto (default: cuda if a GPU is usable, else cpu), cpu, cuda, "
                                                     "reference")


#: ``--trust-code``'s help: commands whose cost model reads the models a database's rows name
TRUST_CODE_HELP = ("import the module a database row names for its model when this process has not registered it "
                   "(running that module's code: only for a database whose writers you trust); without it, such "
                   "rows are learnt without the IR's counts, and a warning names them")


def add_db_arg(p: argparse.ArgumentParser) -> None:
    """``--db``: the trial database, :data:`rgtune.db.DEFAULT_URL` unless given."""
    p.add_argument("--db", default=DEFAULT_URL, metavar="URL",
                   help=f"the trial database: a SQLAlchemy URL or a path ending in .db (default {DEFAULT_URL})")


def add_mode_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--mode inference|training``: which of a workload's schedules (a forward's, or a training step's)."""
    p.add_argument("--mode", default="inference", choices=("inference", "training"),
                   help=f"{what}: inference (the forward alone, default) or training (one training step: the forward, "
                        "then the gradients of the input and of every parameter)")


def device_peak_name(text: str) -> str:
    """An argparse type: ``auto`` or a device whose peak gives the floor (:func:`rgtune.ir.roofline.peak_names`)."""
    from rgtune.ir.roofline import peak_names

    name = text.strip().lower()
    if name != "auto" and name not in peak_names():
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; choose from auto, {', '.join(peak_names())}")
    return name


def add_peak_arg(p: argparse.ArgumentParser) -> None:
    """``--peak DEVICE``: whose memory bandwidth and FLOP rate give a schedule's floor (:mod:`rgtune.ir.roofline`)."""
    from rgtune.ir.roofline import BANDWIDTH_ENV, FLOPS_ENV, GPU_PEAKS

    p.add_argument("--peak", type=device_peak_name, default="auto", metavar="DEVICE",
                   help="the device whose bandwidth and float32 FLOP rate give the floor (the fastest the counted "
                        "bytes and FLOPs could run): auto (default: the backend's device; a CPU measured here, "
                        f"${BANDWIDTH_ENV} and ${FLOPS_ENV} override; a GPU by its datasheet, an H100 SXM's where "
                        f"none is visible), cpu, or a GPU: h100, a100, {', '.join(GPU_PEAKS)}")


def parse_sets(items: Sequence[str]) -> dict[str, str]:
    """``--set knob=value`` items as a dict (values are strings; the search space converts them)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise CLIError(f"--set expects knob=value, got {item!r} (e.g. --set compact.src=pair)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# ----------------------------------------------------------------- lookups
def load_graph(args: argparse.Namespace) -> Any:
    from rgtune.data import load_dataset

    return load_dataset(args.dataset, root=args.data_dir)


def open_db(url: str) -> Any:
    """The trial database to record trials in (``tune``): created, or upgraded in place, as needed."""
    from rgtune.db import TrialDatabase

    return TrialDatabase(url)


def open_query_db(url: str, command: str, *, missing_ok: bool = False) -> Any:
    """The trial database to query (``best``, ``history``, ``export``, ``costmodel``), opened read-only.

    A query must not write: a missing SQLite file is refused by name (``missing_ok``: None)
    instead of being created empty, and an older schema is refused with how to upgrade it
    instead of being upgraded.
    """
    from rgtune.db import SchemaTooOldError, TrialDatabase
    from rgtune.db.engine import display_name, hide_password

    if missing_ok and missing_db_file(url) is not None:
        return None
    check_db_exists(url)
    try:
        return TrialDatabase(url, readonly=True)
    except SchemaTooOldError as e:
        shown = hide_password(url)
        raise CLIError(
            f"{display_name(url)} has schema version {e.found}, older than this rgtune ({e.expected}); `{command}` "
            f"opens it read-only, so it is not upgraded: run `tune` once with --db {shown}, or python -c "
            f"\"from rgtune.db import TrialDatabase; TrialDatabase('{shown}')\", to upgrade it in place") from None


def missing_db_file(url: str) -> str | None:
    """The SQLite file ``url`` names, as written, when it does not exist (opening it would create it); else None."""
    from rgtune.db.engine import parse_url, sqlite_file

    path = sqlite_file(parse_url(url))
    return None if path is None or path.exists() else str(path)


def check_db_exists(url: str) -> None:
    """Refuse a missing SQLite file by name (``missing.db``, ``sqlite:///x.db``, ``sqlite:////abs/x.db``)."""
    path = missing_db_file(url)
    if path is not None:
        raise CLIError(f"no database at {path}; run `tune` first or pass --db URL")


def resolve_backend(name: str) -> str:
    """A backend name that can run here: ``auto`` is cuda where a GPU is usable, else cpu."""
    from rgtune.codegen.base import auto_backend, available_backends

    if name == "auto":
        return auto_backend()
    backends = available_backends()
    if ":" in name:
        return name
    if name not in backends:
        raise CLIError(f"unknown backend {name!r}; choose one of {['auto', *sorted(backends)]}")
    ok, why = backends[name]
    if not ok:
        raise CLIError(f"backend {name!r} cannot run here: {why}")
    return name


# ----------------------------------------------------------------- errors
def run_command(func: Any, args: argparse.Namespace) -> int:
    """``func(args)``, with every user-facing error turned into one line on stderr and an exit status."""
    import sqlalchemy.exc as sa_exc

    from rgtune.codegen.base import BackendError
    from rgtune.data.errors import DatasetError
    from rgtune.db import DatabaseError
    from rgtune.db.engine import display_name
    from rgtune.db.errors import translate
    from rgtune.ir.program import IRError
    from rgtune.tuner.measure import WorkerStartError

    try:
        return func(args)
    except KeyboardInterrupt:
        print("rgtune: interrupted", file=sys.stderr)
        return 130
    except sa_exc.SQLAlchemyError as e:  # from Optuna's storage, which shares the database
        if os.environ.get("RGTUNE_DEBUG"):
            raise
        url = getattr(args, "db", None) or DEFAULT_URL
        err = translate(e, display_name(url), sqlite=url.startswith("sqlite") or url.endswith(".db"))
        print(f"rgtune: error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILURE
    except (CLIError, CommandFailed, DatasetError, IRError, BackendError, DatabaseError, WorkerStartError,
            ValueError) as e:
        if os.environ.get("RGTUNE_DEBUG"):
            raise
        # a missing dataset says where it looked and how to provide it, a failed command what to do: every line
        text = str(e).strip() if isinstance(e, (DatasetError, CommandFailed)) else one_line(e)
        print(f"rgtune: error: {text}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, (CLIError, IRError)) else EXIT_FAILURE


def one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    first, *rest = text.splitlines()
    return first + (f" (+{len(rest)} more lines; RGTUNE_DEBUG=1 for details)" if rest and len(first) < 60 else "")


def trial_name(number: int | None, record: int | None) -> str:
    """A trial as its study numbers it (:meth:`~rgtune.db.TrialDatabase.study_trial_number`: what
    optuna-dashboard shows), with its record's id in the database (which counts across every study)."""
    return f"trial {number} of the study (record #{record})" if number is not None else f"record #{record}"
