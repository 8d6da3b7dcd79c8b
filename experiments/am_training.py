"""A training step on an AM-sized graph: rgtune's generated backward against DGL, time and peak memory.

``synthetic:am`` has AM's statistics (881,680 nodes, 5.7M edges, 96 relations). Each implementation
runs in its own process (:func:`rgtune.bench.memory.measure_step`): the graph and the input are
loaded, then the layer is built and ``--steps`` training steps run (forward, then backward of
``sum(out * g)`` to the input and every parameter; no optimizer); reported: the peak memory above
the loaded graph and input over all of it (resident set on the CPU), and the median of the steps
after the first (the first builds what is built lazily). rgtune runs the default training schedule
(``--save`` sets ``autodiff.save``) unless ``--db`` has a tuned one; DGL's ``HGTConv`` has no GELU
and no biases (slightly less work than rgtune's HGT). No float64 check at this size (the test suite
checks the same kernels on smaller graphs).

Run::

    python experiments/am_training.py --threads 2                  # HGT, rgtune (default schedule) and DGL
    python experiments/am_training.py --impls rgtune --save nodes   # another autodiff.save
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    from rgtune.bench.memory import measure_step

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Run::")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hgt", choices=("rgcn", "rgat", "hgt"))
    p.add_argument("--dataset", default="synthetic:am")
    p.add_argument("--impls", default="rgtune,dgl", help="comma-separated: rgtune, torch, pyg, dgl (default rgtune,dgl)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="training steps per implementation (default 3)")
    p.add_argument("--save", default=None, help="rgtune: autodiff.save of the default schedule (all, nodes, input)")
    p.add_argument("--db", default=None, help="rgtune: a trial database with a tuned training schedule")
    p.add_argument("--json", type=Path, default=RESULTS / "am_training.jsonl", help="JSON lines (appended)")
    args = p.parse_args(argv)
    if args.save is not None and args.db is not None:
        p.error("--save sets the default schedule's knob; with --db the tuned schedule is used")
    rows = {}
    for impl in [s.strip() for s in args.impls.split(",") if s.strip()]:
        print(f"{impl}: building and running {args.steps} training steps in its own process ...", file=sys.stderr,
              flush=True)
        try:
            r = measure_step(args.model, args.dataset, impl, "fwd+bwd", in_dim=args.hidden, out_dim=args.hidden,
                             backend="cpu", db=args.db, threads=args.threads, steps=args.steps, timeout=4 * 3600,
                             config={"autodiff.save": args.save} if args.save else None)
        except Exception as e:  # noqa: BLE001 - out of memory or time is a result, not a crash
            rows[impl] = {"problem": str(e)}
            print(f"{impl}: {e}", flush=True)
            continue
        steady = r["step_s"][1:] or r["step_s"]
        rows[impl] = {**r, "step_s_median": statistics.median(steady)}
        print(f"{impl}: step {statistics.median(steady):.2f} s (steps {', '.join(f'{t:.2f}' for t in r['step_s'])}), "
              f"peak {r['peak_mb'] / 1e3:.2f} GB", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "a") as f:
        f.write(json.dumps({"model": args.model, "dataset": args.dataset, "hidden": args.hidden,
                            "threads": args.threads, "save": args.save, "impls": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
