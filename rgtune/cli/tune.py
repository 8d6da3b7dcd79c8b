"""``tune`` (``rgtune tune``): search the knobs of one workload and record every trial.

Example: ``tune --model hgt --dataset aifb --trials 50``; the same command resumes the study.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from rgtune.cli._common import (TRUST_CODE_HELP, CLIError, add_db_arg, add_mode_arg, add_workload_args, layer_sizes,
                                load_graph, model_options, open_db, positive_int, positive_seconds, resolve_backend,
                                trial_name)

if TYPE_CHECKING:
    from rgtune.tuner.study import TuneOptions

#: ``rgtune.tuner.measure.TIMINGS`` and ``OBJECTIVES``, spelt out: the measurement module imports torch, which
#: would cost every command (``--help`` included) seconds (tests/test_cli_examples.py checks that they agree)
TIMINGS = ("plain", "paired")
OBJECTIVES = ("auto", "call", "kernels")
#: ``tune --cost-model-policy`` unless given (BENCHMARKS.md, "Learned cost model", has how they compare)
DEFAULT_POLICY = "rank"
#: the flag that sets each field of :class:`TuneOptions` and :class:`MeasureOptions` (their errors name it)
_FLAGS = {"trials": "--trials", "time_budget": "--time-budget", "sampler": "--sampler", "confirm_top": "--confirm",
          "confirm_rounds": "--confirm-rounds", "confirm_share": "--confirm-share", "recheck": "--recheck",
          "reverify_inputs": "--reverify", "timeout": "--trial-timeout", "timing": "--timing", "objective": "--objective", "verify": "--verify",
          "verify_rows": "--verify-rows", "stop_slower": "--stop-slower", "memory_limit": "--memory-limit"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="search the knobs of one workload; record every trial",
        description="Search how a layer is computed (the IR's knobs and the kernels' schedules) on one graph, "
                    "verify and time every point, and record each trial in the database. The same command "
                    "resumes the same study.",
        epilog="Example: tune --model hgt --dataset aifb --trials 50\n\n"
               "--trials counts measured trials: candidates the cost model prunes are recorded but cost none; with "
               "the rank policy, the candidates of a pool that are not picked are not trials at all.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p, dataset_required=False)
    p.add_argument("--graph", default=None, metavar="FILE",
                   help="tune on your own graph instead of a dataset: a file written by rgtune.data.save_graph_file "
                        "(convert a PyG HeteroData or a DGL graph with rgtune.data.from_pyg / from_dgl first); "
                        "load_tuned finds the schedules of that graph by its content")
    add_mode_arg(p, "what is tuned")
    p.add_argument("--trials", type=positive_int, default=None,
                   help="measured trials to run now, added to those a resumed study already has (default 50 "
                        "unless --time-budget is given); the summary says how many the study holds")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS", help="start no trial after this long")
    p.add_argument("--backend", default="auto", help="auto (cuda if a GPU is usable, else cpu), cpu, cuda, reference")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads of the measured kernels (OMP_NUM_THREADS; default: the environment's, else one "
                        "per core). The thread count is part of the device's fingerprint: tune with the count your "
                        "training runs with, or load_tuned warns that the schedule was tuned on another device")
    p.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object on stdout (the readable summary goes to stderr)")
    add_db_arg(p)
    p.add_argument("--sampler", default="tpe", help="tpe (default), random, gp, cmaes")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "any"),
                   help="storage of the per-edge and per-node intermediates (sums stay float32; the layer's input, "
                        "output and gradients are the caller's): fp32 (default), bf16 or fp16 "
                        "(16-bit storage; on a CPU with AVX-512 BF16 the GEMMs touching bf16 rows multiply in "
                        "bfloat16), any (searched); the study records it, load_tuned(precision=...) finds it")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler and of the test inputs")
    p.add_argument("--trial-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="a trial taking longer is killed and recorded as timeout (default: adaptive, 5 x the slowest "
                        "verified trial so far and at least 60 s; 900 s for the first trial)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GB",
                   help="the memory (GiB) a schedule's buffers may take: a candidate estimated over it is refused "
                        "before it runs and recorded as out_of_memory, so the study finds the fastest schedule "
                        "that fits (default: none). Either way, one whose buffers with the verification's inputs "
                        "and results need more than 80%% of the memory free when the measuring process has loaded "
                        "the graph (host memory for cpu, device memory for cuda) is refused")
    p.add_argument("--stop-slower", type=float, default=3.0, metavar="X",
                   help="stop a candidate whose first run takes more than X times the best time so far; recorded as "
                        "stopped (pruned in Optuna's study), it counts as a trial (default 3; 0 turns it off)")
    p.add_argument("--verify", default="auto", choices=("auto", "full", "sampled"),
                   help="how a trial's results are checked against the float64 reference: every row (full), or "
                        "exactly on --verify-rows sampled destination nodes and their in-neighbourhoods (sampled: "
                        "the biggest hubs, nodes without in-edges, one per relation, random ones); auto (default) "
                        "samples on graphs of more than 200,000 edges")
    p.add_argument("--verify-rows", type=positive_int, default=512, metavar="N",
                   help="destination rows a sampled verification checks (default 512)")
    p.add_argument("--timing", default="plain", choices=TIMINGS,
                   help="plain (default): a trial's time is the median of its runs; paired (CPU backends): every "
                        "run alternates with a run of the default schedule and the trial's time is their ratio "
                        "on the default's scale, which cancels the drift of a shared machine's speed (two "
                        "schedules compare with a 1.4-3x smaller spread, see BENCHMARKS.md) at the cost of a run "
                        "of the default schedule per timed run")
    p.add_argument("--objective", default="auto", choices=OBJECTIVES,
                   help="what a trial's time is: call (the layer as a user calls it: layer(x), and in training its "
                        "backward, through autograd), kernels (the generated program's run alone), or auto "
                        "(default): call on a GPU, where the host path and CUDA-graph replay are much of a small "
                        "graph's call, kernels on a CPU (and on --batches). Every trial records both; the summary "
                        "shows both for the best")
    p.add_argument("--fresh", action="store_true", help="start a new study instead of resuming (history is kept)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--batches", default=None, metavar="SAMPLER",
                   help="tune for mini-batch training: time every trial on fixed batches of this neighbour sampler "
                        "instead of the whole graph (each block bound afresh, then a forward or a training step: "
                        "what a layer does with a new batch), e.g. neighbor:fanout=15x10,batch_size=1024. Fields: "
                        "fanout (per layer, first layer first, joined by x; -1: every in-neighbour), batch_size, "
                        "seed_type (default: the task's node type, else the one with the most in-edges), batches "
                        "(how many batches each trial times, default 4) and seed (default 0). The sampler is part "
                        "of the workload (load_tuned(..., batches=...) finds it); the best schedule tuned on the "
                        "whole graph, if recorded, is timed on the same batches and the summary compares them")
    p.add_argument("--cost-model", default="on", choices=("on", "off"),
                   help="on (default): the learned cost model, trained on this device's history, steers the "
                        "search (see --cost-model-policy; with --batches it ranks schedules by what they do on the "
                        "sampler's batches); it stays out of the way until the history is large enough, and says so")
    p.add_argument("--trust-code", action="store_true", help="cost model: " + TRUST_CODE_HELP)
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
    # rgtune.costmodel.policies.OPENING_RULES, spelt out: importing the cost model slows every command by 0.1 s
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
    p.add_argument("--confirm-share", type=float, default=0.25, metavar="F",
                   help="the confirmation takes at most this share of the search's time, or 30 s if that is more: "
                        "fewer rounds (at least 3), then fewer schedules (at least the fastest and the default), else "
                        "none (default 0.25; 1: at most as long as the search)")
    p.add_argument("--reverify", type=positive_int, default=3, metavar="N",
                   help="at the end, verify the best schedule again on N fresh inputs (each run twice) before it is "
                        "trusted; one that fails is never the best again, and the next one is checked (default 3)")
    p.add_argument("--recheck", type=positive_int, default=3, metavar="N",
                   help="a trial whose measurement beats the best so far is measured until it has N measurements, "
                        "and its time is their median, so that one lucky run does not steer the search "
                        "(default 3; 1 turns it off; costs N-1 measurements of such trials, not --trials)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:  # before torch starts its thread pool; the measurement worker inherits it
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        import torch

        torch.set_num_threads(args.threads)
    from rgtune.tuner.study import Tuner
    from rgtune.tuner.workload import Workload

    options = _tune_options(args)  # a bad value fails before anything is loaded or written
    backend = resolve_backend(args.backend)
    graph = _graph(args)  # fail fast on a bad dataset, before the database is touched
    batches = _sampler(args, graph)
    db = open_db(args.db)
    in_dim, out_dim = layer_sizes(args)
    workload = Workload(args.model, args.dataset, in_dim, out_dim, args.heads, backend,
                        args.data_dir, args.mode, model_options(args), batches=batches, precision=args.precision)
    named = f"{workload.model}({workload.options})" if workload.options else workload.model
    on = f"batches of {batches} (seeds of type {batches.seed_type(graph)!r}) from {graph.name}" \
        if batches is not None else graph.name
    print(f"tuning {named} on {on} ({graph.num_nodes():,} nodes, {graph.num_edges():,} edges, "
          f"{graph.num_rels} relations), {_sizes(in_dim, out_dim)}, heads={args.heads}, backend={backend}, "
          f"{'' if args.mode == 'inference' else 'mode=training (forward + backward), '}"
          f"{'' if args.precision == 'fp32' else f'precision={args.precision} (16-bit intermediates allowed), '}"
          f"db={db.name}", file=sys.stderr)
    tuner = Tuner(workload, db, options, graph=graph)
    summary = tuner.run()
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            _print_summary(summary)
        print(json.dumps(summary_json(summary)))
    else:
        _print_summary(summary)
    return 130 if summary.interrupted else 0


def _sizes(in_dim: int, out_dim: int) -> str:
    return f"hidden={in_dim}" if in_dim == out_dim else f"in_dim={in_dim}, out_dim={out_dim}"


def summary_json(s: Any) -> dict[str, Any]:
    """The summary as ``tune --json`` prints it: every field of :class:`~rgtune.tuner.study.TuneSummary` (the
    confirmation and the whole-graph comparison as objects), and the speedup over the default schedule."""
    return {**dataclasses.asdict(s), "speedup": s.speedup}


def _graph(args: argparse.Namespace) -> Any:
    """The graph of ``--dataset`` or ``--graph`` (exactly one); a ``--graph`` file is stored by content, and
    ``args.dataset`` becomes its stored name, which the measurement worker loads."""
    if (args.dataset is None) == (args.graph is None):
        raise CLIError("give the graph to tune with --dataset NAME or --graph FILE (one of them)")
    if args.dataset is not None:
        return load_graph(args)
    from rgtune.data.stored import load_graph_file, store_graph

    graph = load_graph_file(args.graph)
    args.dataset = store_graph(graph)
    return graph


def _sampler(args: argparse.Namespace, graph: Any) -> Any:
    """``--batches`` as a :class:`~rgtune.data.sampler_spec.SamplerSpec` checked on the graph (None: not given)."""
    if args.batches is None:
        return None
    from rgtune.data.sampler_spec import SamplerSpec

    try:
        spec = SamplerSpec.parse(args.batches)
        spec.seed_type(graph)
    except ValueError as e:
        raise CLIError(f"--batches: {e}") from None
    return spec


def _tune_options(args: argparse.Namespace) -> "TuneOptions":
    """The flags as :class:`TuneOptions`, which check them; a bad value is a usage error that names its flag."""
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.options import OptionError
    from rgtune.tuner.study import TuneOptions

    trials = args.trials if args.trials is not None else (None if args.time_budget else 50)
    memory_limit = None if args.memory_limit is None else int(args.memory_limit * 2**30)
    try:
        return TuneOptions(trials=trials, time_budget=args.time_budget, sampler=args.sampler, seed=args.seed,
                           fresh=args.fresh, progress=not args.quiet and sys.stderr.isatty(),
                           measure=MeasureOptions(timeout=args.trial_timeout, timing=args.timing, objective=args.objective,
                                                  verify=args.verify,
                                                  verify_rows=args.verify_rows, stop_slower=args.stop_slower or None,
                                                  memory_limit=memory_limit),
                           guide=_cost_model_guide(args), confirm_top=args.confirm, confirm_rounds=args.confirm_rounds,
                           confirm_share=args.confirm_share, recheck=args.recheck, reverify_inputs=args.reverify)
    except OptionError as e:
        flag = _FLAGS.get(e.option)
        if flag is None:  # not one of the flags: as the options say it
            raise
        given = getattr(args, flag[2:].replace("-", "_"))  # as the user wrote it (GiB, not the option's bytes)
        raise CLIError(e.shown_as(flag, repr(given) if e.choices else f"{given:g}")) from None


def _cost_model_guide(args: argparse.Namespace) -> Any:
    if args.cost_model == "off":
        return None
    from rgtune.costmodel import CostModelGuide, PrunePolicy, RankPolicy

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
    return CostModelGuide(policy=policy, data_dir=args.data_dir, trust_code=args.trust_code)


def _print_summary(s) -> None:
    status = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
    what = f"{s.measured} measured trials" + (f" ({s.rechecked} rechecked as a new best)" if s.rechecked else "") \
        + (" and a confirmation" if s.confirmation is not None else "")
    print(f"study {s.study_name}: {what} in {s.elapsed_s:.1f} s ({status or 'none'})"
          + (" -- interrupted; the same command resumes the study (--trials more measured trials)"
             if s.interrupted else ""))
    if s.earlier_measured:
        print(f"resumed: the study had {s.earlier_measured} measured trials before this run, "
              f"{s.earlier_measured + s.measured} now")
    if s.over_memory:
        print(f"memory: {s.over_memory} proposed schedules left out of the cost model's pools, their buffers over "
              "--memory-limit or the measuring process's free memory")
    if s.guide is not None:
        c = s.guide.get("counts", {})
        if "pools" in c:  # the rank policy
            own = c.get("explored", 0) + c.get("deferred", 0)
            what = (f"picked {c['pools']} of {c.get('candidates', 0)} proposed candidates to measure "
                    f"({own} of them the sampler's own first proposal, {c.get('local_picked', 0)} a change of a "
                    f"fast measured schedule)")
            if c.get("opening"):
                what = f"opened with its {c['opening']} first picks of {c.get('opening_pool', 0)} random schedules; " + what
        else:
            what = f"{c.get('pruned', 0)} of {c.get('candidates', 0)} candidates pruned"
        print(f"cost model: {s.guide.get('status')}; {what}, {c.get('refits', 0)} refits")
    if s.default_ms is not None:
        how = "median of the confirmation's rounds" if s.default_confirmed else "its measurement in the search"
        print(f"default schedule: {s.default_ms:.4g} ms ({how})")
    if s.best_ms is None:
        print("no verified schedule yet")
        return
    c = s.confirmation
    if c is not None:
        single = f"; the fastest single measurement of the search was {c.searched_best_ms:.4g} ms" \
            if c.searched_best_ms is not None else ""
        done = "" if c.finished else " -- interrupted, so not used"
        print(f"confirmation {c.id}: {c.schedules} schedules (the fastest, the last winner, the default) timed again "
              f"in {c.rounds} interleaved rounds ({c.elapsed_s:.1f} s){single}{done}")
    how = " (confirmed: median of the rounds)" if c is not None and c.finished and s.default_confirmed else ""
    if s.default_is_best:
        print(f"best schedule: the default schedule, {s.best_ms:.4g} ms{how}: no searched schedule beat it; "
              f"{trial_name(s.best_study_trial, s.best_trial_id)}")
    else:
        if s.speedup is None:
            speed = ""
        elif s.default_confirmed and s.paired_speedup is not None:
            speed = (f" ({s.speedup:.2f}x over the default schedule: the median of the confirmation's paired "
                     f"rounds; its medians' ratio {s.default_ms / s.best_ms:.2f}x)")
        elif s.default_confirmed:
            speed = f" ({s.speedup:.2f}x over the default schedule, both confirmed)"
        else:  # a confirmed median against one measurement would flatter or wrong the search: say which is which
            speed = f" ({s.speedup:.2f}x over the default schedule's measurement in the search)"
        print(f"best schedule: {s.best_ms:.4g} ms{how}{speed}, {trial_name(s.best_study_trial, s.best_trial_id)}")
    if s.best_verified_inputs:
        print(f"  re-verified on {s.best_verified_inputs} fresh inputs")
    _print_load(c)
    _print_call_and_kernels(s)
    _print_whole_graph(s)
    for k, v in sorted(s.best_knobs.items()):
        print(f"  {k} = {v}")


def _print_load(c: Any) -> None:
    """How busy the machine was while the confirmation timed (``MachineLoad``): a warning with the number
    when other processes kept cores busy, else one quiet line."""
    seen = None if c is None else c.load
    if seen is None:
        return
    if seen.busy:
        print(f"  the machine was busy while the confirmation timed: {seen.describe()}; the times and the speedup "
              "may not hold on an idle machine (run again when it is quiet, or compare with rgtune bench)")
    else:
        print(f"  the machine was quiet while the confirmation timed ({seen.describe()})")


def _print_call_and_kernels(s: Any) -> None:
    """The best trial's two times: the layer as a user calls it and its kernels alone (which one is the study's)."""
    if s.best_call_ms is None or s.best_kernel_ms is None:
        return
    which = "the layer as called" if s.best_objective == "call" else "its kernels"
    print(f"  the layer as called: {s.best_call_ms:.4g} ms, its kernels alone: {s.best_kernel_ms:.4g} ms "
          f"({s.best_call_ms / s.best_kernel_ms:.2f}x; the study's time is {which}')")


def _print_whole_graph(s: Any) -> None:
    """A sampler study: how its best compares, on its batches, with the best schedule tuned on the whole graph."""
    w = s.whole_graph
    if w is None or s.best_ms is None:
        return
    there = f", {w.whole_graph_ms:.4g} ms on the whole graph" if w.whole_graph_ms is not None else ""
    which = f"the best whole-graph schedule (trial {w.trial_id}{there})"
    if w.same_schedule:
        print(f"{which} is also the best on these batches")
    elif w.batches_ms is None:
        print(f"{which} was not measured on these batches")
    else:
        how = "both confirmed" if w.confirmed else "its measurements in the search"
        print(f"{which}: {w.batches_ms:.4g} ms on these batches; the best for them is "
              f"{w.batches_ms / s.best_ms:.2f}x as fast ({how})")
