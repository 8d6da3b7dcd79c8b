"""The command line: ``tune`` and ``rgtune <command>``.

Every command fails with one line on stderr and a non-zero exit for a bad input (unknown
model, dataset, backend, knob; unreachable database ...), never with a traceback; set
``RGTUNE_DEBUG=1`` to see the traceback anyway.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Sequence

from rgtune.tuner._cli_args import MODELS, positive_int
from rgtune.tuner.measure import TIMINGS

EXIT_USAGE = 2
EXIT_FAILURE = 1
#: ``tune --cost-model-policy`` unless given (see BENCHMARKS.md, "Learned cost model", for how they compare)
DEFAULT_POLICY = "rank"


class CLIError(Exception):
    """A user-facing error: printed as one line."""


# ----------------------------------------------------------------- shared options
def _add_workload_args(p: argparse.ArgumentParser, dataset_required: bool = True) -> None:
    p.add_argument("--model", required=True, choices=MODELS, help="the layer to compile")
    p.add_argument("--dataset", required=dataset_required,
                   help="aifb, mutag, bgs, am, ogbn-mag, or synthetic:<preset>[,key=value...] (see `rgtune datasets`)")
    p.add_argument("--data-dir", default=None,
                   help="folder with one sub-folder per dataset (default: $RGTUNE_DATA_DIR, else the user cache)")
    p.add_argument("--hidden", type=positive_int, default=64, help="input and output feature size (default 64)")
    p.add_argument("--heads", type=positive_int, default=1, help="attention heads for RGAT/HGT (default 1)")


def _parse_sets(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise CLIError(f"--set expects knob=value, got {item!r} (e.g. --set compact.src=pair)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _load_graph(args: argparse.Namespace):
    from rgtune.data import load_dataset

    return load_dataset(args.dataset, root=args.data_dir)


# ----------------------------------------------------------------- commands
def cmd_datasets(args: argparse.Namespace) -> int:
    from rgtune.data import list_datasets
    from rgtune.data.synthetic import describe_presets

    print("datasets (--dataset NAME):")
    for name, about in list_datasets().items():
        print(f"  {name:<12} {about}")
    print("\nsynthetic presets (--dataset synthetic:PRESET[,key=value...]):")
    for line in describe_presets():
        print(f"  {line}")
    root = os.environ.get("RGTUNE_DATA_DIR")
    print(f"\ndata root: {root or '(unset: set RGTUNE_DATA_DIR or pass --data-dir; else the user cache)'}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from rgtune.ir.counts import count
    from rgtune.ir.models import build_model
    from rgtune.search_spaces import SearchSpace

    graph = _load_graph(args)
    program = build_model(args.model, args.hidden, args.hidden, args.heads)
    target = "cuda" if args.backend == "cuda" else "cpu"
    space = SearchSpace(program, graph, target)
    config = {**space.default(), **space.resolve(_parse_sets(args.set))}
    point = space.compile(config)
    print(f"# workload: {args.model} on {graph!r}, hidden={args.hidden}, heads={args.heads}, target={target}\n")
    print("# program before passes")
    print(program, end="\n\n")
    print("# configuration")
    for k in space.knobs:
        mark = "" if config[k.name] == k.default else "   (set)"
        print(f"  {k.name} = {config[k.name]}{mark}")
    if point.problems:
        print("\n# this configuration is invalid:")
        for p in point.problems:
            print(f"  - {p}")
        return EXIT_FAILURE
    print("\n# program after passes")
    print(point.compiled.program, end="\n\n")  # type: ignore[union-attr]
    print("# kernels")
    print(point.kernels.describe(), end="\n\n")
    c = count(point.kernels, graph, config, target)
    print("# counts")
    print(f"  FLOPs           {c['flops']:,}")
    print(f"  bytes (minimum) {c['bytes_min']:,}")
    print(f"  bytes (gathered){c['bytes_gathered']:>14,}")
    print(f"  kernels         {c['kernels']}")
    if c["weight_folds"]:
        print(f"  weight folds    {c['weight_folds']} ({c['weight_flops']:,} of the FLOPs, every call)")
    if c["index_probes"]:
        print(f"  pair lookups    {c['index_probes']:,} binary-search reads (compact.pair_index=bsearch)")
    print(f"  atomic updates  {c['atomics']:,}")
    print(f"  GEMM rows       {c['gemm_rows']}")
    print(f"  GEMM tiles      {c['gemm_tiles']:,} ({c['gemm_rows_computed']:,} rows computed, short tiles padded)")
    if args.source:
        _print_sources(args.backend, point.kernels, graph, config)
    if args.space:
        print("\n" + space.describe())
    return 0


def _print_sources(backend_name: str, kp: Any, graph: Any, config: dict[str, Any]) -> None:
    from rgtune.codegen.base import create

    backend = create(backend_name)
    generate: Callable[..., dict[str, str]] | None = getattr(backend, "generate", None)
    if generate is None:
        raise CLIError(f"backend {backend_name!r} cannot show generated sources")
    for name, text in generate(kp, config).items():
        print(f"\n# generated: {name}\n{text}")


def _open_db(url: str | None, create: bool = True):
    from rgtune.tuner.db import DEFAULT_URL, TrialDatabase

    return TrialDatabase(url or DEFAULT_URL)


def _resolve_backend(name: str) -> str:
    from rgtune.codegen.base import available_backends

    backends = available_backends()
    if name == "auto":
        ok, _ = backends.get("cuda", (False, ""))
        return "cuda" if ok else "cpu"
    if ":" in name:
        return name
    if name not in backends:
        raise CLIError(f"unknown backend {name!r}; choose one of {['auto', *sorted(backends)]}")
    ok, why = backends[name]
    if not ok:
        raise CLIError(f"backend {name!r} cannot run here: {why}")
    return name


def cmd_tune(args: argparse.Namespace) -> int:
    from rgtune.tuner.measure import MeasureOptions, Workload
    from rgtune.tuner.study import SAMPLERS, TuneOptions, Tuner

    if args.sampler not in SAMPLERS:
        raise CLIError(f"unknown sampler {args.sampler!r}; choose one of {list(SAMPLERS)}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise CLIError(f"--time-budget must be positive, got {args.time_budget}")
    if args.confirm < 0 or args.confirm == 1:
        raise CLIError(f"--confirm must be 0 (off) or at least 2 schedules to compare, got {args.confirm}")
    backend = _resolve_backend(args.backend)
    graph = _load_graph(args)  # fail fast on a bad dataset, before the database is touched
    db = _open_db(args.db)
    trials = args.trials if args.trials is not None else (None if args.time_budget else 50)
    workload = Workload(args.model, args.dataset, args.hidden, args.hidden, args.heads, backend,
                        args.data_dir)
    options = TuneOptions(trials=trials, time_budget=args.time_budget, sampler=args.sampler, seed=args.seed,
                          fresh=args.fresh, progress=not args.quiet and sys.stderr.isatty(),
                          measure=MeasureOptions(timeout=args.trial_timeout, timing=args.timing),
                          pruner=_cost_model_pruner(args),
                          confirm_top=args.confirm, confirm_rounds=args.confirm_rounds, recheck=args.recheck)
    print(f"tuning {args.model} on {graph.name} ({graph.num_nodes():,} nodes, {graph.num_edges():,} edges, "
          f"{graph.num_rels} relations), hidden={args.hidden}, heads={args.heads}, backend={backend}, "
          f"db={db.name}", file=sys.stderr)
    tuner = Tuner(workload, db, options)
    summary = tuner.run()
    _print_summary(summary)
    return 130 if summary.interrupted else 0


def _cost_model_pruner(args: argparse.Namespace) -> Any:
    if args.cost_model == "off":
        return None
    from rgtune.tuner.costmodel import CostModelPruner, PrunePolicy, RankPolicy

    name = args.cost_model_policy
    own = {"rank": {"pool": args.cost_model_pool, "opening": args.cost_model_opening,
                    "opening_rule": args.cost_model_opening_rule, "local": args.cost_model_local},
           "prune": {"margin": args.cost_model_margin}}  # the settings of one policy only
    for other, settings in own.items():
        for setting, value in settings.items():
            if other != name and value is not None:
                flag = setting.replace("_", "-")
                raise CLIError(f"--cost-model-{flag} does not apply to --cost-model-policy {name}")
    given = {setting: value for setting, value in own[name].items() if value is not None}
    try:
        policy = {"rank": RankPolicy, "prune": PrunePolicy}[name](
            explore=args.cost_model_explore, seed=args.seed or 0, **given)
    except ValueError as e:
        raise CLIError(f"--cost-model-policy {name}: {e}") from e
    return CostModelPruner(policy=policy, data_dir=args.data_dir)


def _print_summary(s) -> None:
    status = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
    what = f"{s.measured} measured trials" + (f" ({s.rechecked} rechecked as a new best)" if s.rechecked else "") \
        + (" and a confirmation" if s.confirmation is not None else "")
    print(f"study {s.study_name}: {what} in {s.elapsed_s:.1f} s ({status or 'none'})"
          + (" -- interrupted; run the same command to resume" if s.interrupted else ""))
    if s.pruner is not None:
        c = s.pruner.get("counts", {})
        if "pools" in c:  # the rank policy
            own = c.get("explored", 0) + c.get("deferred", 0)
            what = (f"picked {c['pools']} of {c.get('candidates', 0)} proposed candidates to measure "
                    f"({own} of them the sampler's own first proposal, {c.get('local_picked', 0)} a change of a "
                    f"fast measured schedule)")
            if c.get("opening"):
                what = f"opened with its {c['opening']} first picks of {c.get('opening_pool', 0)} random schedules; " + what
        else:
            what = f"{c.get('pruned', 0)} of {c.get('candidates', 0)} candidates pruned"
        print(f"cost model: {s.pruner.get('status')}; {what}, {c.get('refits', 0)} refits")
    if s.default_ms is not None:
        print(f"default schedule: {s.default_ms:.4g} ms")
    if s.best_ms is None:
        print("no verified schedule yet")
        return
    c = s.confirmation
    if c is not None:
        single = f"; the fastest single measurement of the search was {c.searched_best_ms:.4g} ms" \
            if c.searched_best_ms is not None else ""
        done = "" if c.finished else " -- interrupted, so not used"
        print(f"confirmation {c.id}: the {c.schedules} fastest schedules timed again in {c.rounds} interleaved rounds "
              f"({c.elapsed_s:.1f} s){single}{done}")
    speed = f" ({s.speedup:.2f}x over the default schedule)" if s.speedup else ""
    how = " (confirmed: median of the rounds)" if c is not None and c.finished else ""
    print(f"best schedule: {s.best_ms:.4g} ms{how}{speed}, trial {s.best_trial_id}")
    for k, v in sorted(s.best_knobs.items()):
        print(f"  {k} = {v}")


def _filters(args: argparse.Namespace) -> dict:
    f = {}
    for key in ("model", "dataset", "backend", "heads"):
        if getattr(args, key, None) is not None:
            f[key] = getattr(args, key)
    if getattr(args, "hidden", None) is not None:
        f["in_dim"] = f["out_dim"] = args.hidden
    if f.get("backend") == "auto":
        f.pop("backend")
    return f


def _emit(records: list, args: argparse.Namespace) -> None:
    from rgtune.tuner.db import records_to_json, write_csv

    if args.json:
        print(records_to_json(records))
    elif args.csv:
        write_csv(records, sys.stdout)
    else:
        for r in records:
            t = f"{r.median_ms:.4g} ms" if r.median_ms is not None else "-"
            err = f"  {r.error.splitlines()[0][:80]}" if r.error else ""
            role = "search" if r.confirmation_id is None else f"confirm {r.confirmation_id}"
            print(f"#{r.id:<5} {r.model:<5} {r.dataset:<12} {r.backend:<9} {role:<10} {r.status:<13} {t:>12}{err}")


def _check_db_exists(url: str | None) -> None:
    from rgtune.tuner.db import DEFAULT_URL

    url = url or DEFAULT_URL
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and len(url) > len("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not os.path.exists(path):
            raise CLIError(f"no database at {path}; run `tune` first or pass --db URL")


def cmd_best(args: argparse.Namespace) -> int:
    _check_db_exists(args.db)
    db = _open_db(args.db)
    best = db.best(**_filters(args))
    if best is None:
        raise CLIError("no verified trial matches; run `tune` for this workload first")
    if args.json or args.csv:
        _emit([best], args)
    else:
        how = "" if best.confirmation_id is None else \
            f" (median of the {db.confirmation(best.confirmation_id).rounds} rounds of confirmation {best.confirmation_id})"
        print(f"best: trial {best.id}, {best.median_ms:.4g} ms{how}, {best.model} on {best.dataset} "
              f"({best.backend}, {best.device}), max error {best.max_error:.2g}")
        for k, v in sorted(best.knobs.items()):
            print(f"  {k} = {v}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    _check_db_exists(args.db)
    db = _open_db(args.db)
    rows = db.history(status=args.status, limit=args.limit, **_filters(args))
    _emit(rows, args)
    return 0


# ----------------------------------------------------------------- parsers
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rgtune",
        description="rgtune: an autotuning compiler for relational GNN layers (RGCN, RGAT, HGT).",
        epilog="Examples:\n  tune --model hgt --dataset aifb\n  rgtune best --model hgt --dataset aifb\n"
               "  rgtune show --model rgat --dataset aifb --set compact.src=pair --set fusion.softmax=full",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("datasets", help="list the datasets and synthetic presets")
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("show", help="the IR before/after passes, the kernels and their counts for one configuration",
                       description="Show what rgtune compiles for one configuration of the knobs.")
    _add_workload_args(p)
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="set a knob (repeatable), e.g. --set compact.src=pair; `--space` lists them")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"), help="whose schedule knobs apply (default cpu)")
    p.add_argument("--source", action="store_true", help="also print the generated kernel source")
    p.add_argument("--space", action="store_true", help="also list every knob with its choices")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "tune", help="search the knobs of one workload; record every trial",
        description="Search how a layer is computed (the IR's knobs and the kernels' schedules) on one graph, "
                    "verify and time every point, and record each trial in the database. The same command "
                    "resumes the same study.",
        epilog="Example: tune --model hgt --dataset aifb --trials 50\n\n"
               "--trials counts measured trials: candidates the cost model prunes are recorded but cost none; with "
               "the rank policy, the candidates of a pool that are not picked are not trials at all.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_workload_args(p)
    p.add_argument("--trials", type=positive_int, default=None,
                   help="trials to run now (default 50 unless --time-budget is given)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS", help="start no trial after this long")
    p.add_argument("--backend", default="auto", help="auto (cuda if a GPU is usable, else cpu), cpu, cuda, reference")
    p.add_argument("--db", default=None, help="SQLAlchemy URL of the trial database (default sqlite:///results.db)")
    p.add_argument("--sampler", default="tpe", help="tpe (default), random, gp, cmaes")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler and of the test inputs")
    p.add_argument("--trial-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a trial taking longer is killed and recorded as timeout (default 60)")
    p.add_argument("--timing", default="plain", choices=TIMINGS,
                   help="plain (default): a trial's time is the median of its runs; paired (CPU backends): every "
                        "run alternates with a run of the default schedule and the trial's time is their ratio "
                        "on the default's scale, which cancels the drift of a shared machine's speed (two "
                        "schedules compare with a 1.4-3x smaller spread, see BENCHMARKS.md) at the cost of a run "
                        "of the default schedule per timed run")
    p.add_argument("--fresh", action="store_true", help="start a new study instead of resuming (history is kept)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--cost-model", default="on", choices=("on", "off"),
                   help="on (default): the learned cost model, trained on this device's history, steers the "
                        "search (see --cost-model-policy); it stays out of the way until the history is large "
                        "enough, and says so")
    p.add_argument("--cost-model-policy", default=DEFAULT_POLICY, choices=("prune", "rank"),
                   help="prune: skip measuring candidates predicted clearly slower than the best so far (recorded "
                        "as pruned; they do not count against --trials); rank: the sampler proposes "
                        "--cost-model-pool candidates per measurement and the one predicted fastest is measured, "
                        "unless it is predicted less than 5%% faster than the sampler's own first proposal "
                        f"(default {DEFAULT_POLICY})")
    p.add_argument("--cost-model-margin", type=float, default=None, metavar="X",
                   help="prune: skip a candidate predicted slower than X times the best measured schedule "
                        "(default 1.5)")
    p.add_argument("--cost-model-pool", type=int, default=None, metavar="N",
                   help="rank: candidates proposed per measurement (default 16)")
    p.add_argument("--cost-model-opening", type=int, default=None, metavar="K",
                   help="rank: a new study first measures the model's K first picks out of 256 random schedules "
                        "(see --cost-model-opening-rule), right after the default schedule (default 4; 0: none)")
    # _costmodel_pruner.OPENING_RULES, spelt out: importing the cost model here slows every command by 0.1 s
    p.add_argument("--cost-model-opening-rule", default=None, choices=("top", "lcb"),
                   help="rank: how the opening ranks its 256 schedules: lcb, the lowest mean minus spread of the "
                        "predictions of 8 models fit on resampled histories (hedges where the history's graphs "
                        "disagree; BENCHMARKS.md, 'Opening rules'); top, the model's prediction alone (default lcb)")
    p.add_argument("--cost-model-local", type=float, default=None, metavar="FRACTION",
                   help="rank: fraction of each pool that changes 1-2 knobs of one of the 3 fastest schedules "
                        "measured so far instead of coming from the sampler (default 0.5; 0: all from the sampler)")
    p.add_argument("--cost-model-explore", type=float, default=0.1, metavar="FRACTION",
                   help="prune: fraction of candidates measured whatever the prediction; rank: fraction of "
                        "measurements that take the sampler's own proposal (default 0.1)")
    p.add_argument("--confirm", type=int, default=5, metavar="K",
                   help="when the search ends, time the K fastest schedules (and the last confirmed winner) again "
                        "in interleaved rounds; `rgtune best` then returns the one with the lowest median: one "
                        "measurement varies by tens of percent on a busy machine, so the fastest of many single "
                        "measurements is biased low; it runs after --trials or --time-budget is spent "
                        "(default 5; 0 turns it off)")
    p.add_argument("--confirm-rounds", type=positive_int, default=5, metavar="R",
                   help="rounds of the confirmation (default 5; each costs one measurement per schedule)")
    p.add_argument("--recheck", type=positive_int, default=3, metavar="N",
                   help="a trial whose measurement beats the best so far is measured until it has N measurements, "
                        "and its time is their median, so that one lucky run does not steer the search "
                        "(default 3; 1 turns it off; costs N-1 measurements of such trials, not --trials)")
    p.set_defaults(func=cmd_tune)

    for name, about, func in (("best", "the best recorded schedule of a workload", cmd_best),
                              ("history", "the recorded trials of a workload", cmd_history)):
        p = sub.add_parser(name, help=about, description=about[0].upper() + about[1:] + ".")
        p.add_argument("--model", choices=MODELS, help="filter by model")
        p.add_argument("--dataset", help="filter by dataset (the graph's name)")
        p.add_argument("--backend", help="filter by backend")
        p.add_argument("--hidden", type=positive_int, help="filter by feature size")
        p.add_argument("--heads", type=positive_int, help="filter by heads")
        p.add_argument("--db", default=None, help="SQLAlchemy URL (default sqlite:///results.db)")
        fmt = p.add_mutually_exclusive_group()
        fmt.add_argument("--json", action="store_true", help="print JSON")
        fmt.add_argument("--csv", action="store_true", help="print CSV")
        if name == "history":
            p.add_argument("--status", help="only trials with this status (ok, invalid, wrong_result, ...)")
            p.add_argument("--limit", type=positive_int, default=None, help="at most this many rows")
        p.set_defaults(func=func)

    # these parse their own arguments (see main)
    sub.add_parser("export", help="write the best schedule's kernels to a folder for training code", add_help=False)
    sub.add_parser("bench", help="tuned layer vs reference lowering vs PyG vs DGL, side by side", add_help=False)
    sub.add_parser("costmodel", help="train the cost model on the history, or evaluate it on a held-out graph",
                   add_help=False)
    return parser


_DELEGATED = {"export": "_export_main", "bench": "_bench_main", "costmodel": "_costmodel_main"}


def _costmodel_main(argv: list[str]) -> int:
    from rgtune.tuner.costmodel import costmodel_main

    return costmodel_main(argv)


def _export_main(argv: list[str]) -> int:
    from rgtune.runtime import export_main

    return export_main(argv)


def _bench_main(argv: list[str]) -> int:
    """``rgtune bench`` runs ``experiments/bench.py`` of this checkout (it needs PyG and DGL)."""
    import importlib.util
    from pathlib import Path

    import rgtune

    path = Path(rgtune.__file__).resolve().parents[1] / "experiments" / "bench.py"
    if not path.exists():
        raise CLIError(f"`rgtune bench` runs experiments/bench.py from a source checkout; {path} is missing")
    spec = importlib.util.spec_from_file_location("rgtune_experiments_bench", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (its dataclasses look themselves up)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.bench_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in _DELEGATED:
        delegate = globals()[_DELEGATED[argv[0]]]
        return _run(lambda _args: delegate(argv[1:]), argparse.Namespace(db=None))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return _run(args.func, args)


def tune_main(argv: Sequence[str] | None = None) -> int:
    """``tune ...`` is ``rgtune tune ...``."""
    return main(["tune", *(sys.argv[1:] if argv is None else argv)])


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from rgtune.codegen.base import BackendError
    from rgtune.data.errors import DatasetError
    from rgtune.ir.program import IRError
    import sqlalchemy.exc as sa_exc

    from rgtune.tuner._db_errors import translate
    from rgtune.tuner.db import DatabaseError
    from rgtune.tuner.measure import WorkerStartError

    try:
        return func(args)
    except KeyboardInterrupt:
        print("rgtune: interrupted", file=sys.stderr)
        return 130
    except sa_exc.SQLAlchemyError as e:  # from Optuna's storage, which shares the database
        if os.environ.get("RGTUNE_DEBUG"):
            raise
        url = getattr(args, "db", None) or "results.db"
        err = translate(e, url, sqlite=url.startswith("sqlite") or url.endswith(".db"))
        print(f"rgtune: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILURE
    except (CLIError, DatasetError, IRError, BackendError, DatabaseError, WorkerStartError, ValueError) as e:
        if os.environ.get("RGTUNE_DEBUG"):
            raise
        # a missing dataset says where it looked and how to provide it: keep every line of that
        text = str(e).strip() if isinstance(e, DatasetError) else _one_line(e)
        print(f"rgtune: error: {text}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, (CLIError, IRError)) else EXIT_FAILURE


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    first, *rest = text.splitlines()
    return first + (f" (+{len(rest)} more lines; RGTUNE_DEBUG=1 for details)" if rest and len(first) < 60 else "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
