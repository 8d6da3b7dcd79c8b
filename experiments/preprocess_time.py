"""Time and peak memory of loading a graph and of building each derived structure the kernels need.

Makes the numbers of BENCHMARKS.md's "Preprocessing" paragraph (Real-size graphs). Per --datasets graph, a
fresh process loads it, then asks for (each timed once, on first use): content_hash (the disk cache of the
derived structures is keyed by it), the layouts by destination and by source, the unique (node, relation)
pairs of both sides, the CSR by destination, the degrees, the statistics, and `graph_arrays` for every
layout and index width the layout pass offers (one at a time, as a trial holds only its own). Peak memory:
the resident set's high-water mark, reset before each step (Linux). Run it twice with one --cache-dir: the
first run builds the structures and caches them (cold), the second reads them (warm).

Examples::

    python experiments/preprocess_time.py --datasets synthetic:bgs synthetic:am synthetic:ogbn-mag --label cold --cache-dir /tmp/c
    python experiments/preprocess_time.py --datasets synthetic:ogbn-mag --label warm --cache-dir /tmp/c
    python experiments/preprocess_time.py --datasets synthetic:ogbn-mag,reverse=1 --no-arrays --label cold
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, parser  # noqa: E402 - experiments/ is not a package


def measure(dataset: str, label: str, arrays: bool = True) -> list[dict[str, Any]]:
    """Every step's seconds and memory for ``dataset``, in this process (``arrays``: graph_arrays too)."""
    from rgtune.data.datasets import load_dataset
    from rgtune.ir.bind import graph_arrays
    from rgtune.ir.passes.layout import LAYOUTS, LayoutPass
    from rgtune.tuner.memory import reset_peak, status_bytes

    rows: list[dict[str, Any]] = []
    graph: Any = None
    mb = lambda field: None if (b := status_bytes(field)) is None else round(b / 2**20, 1)  # noqa: E731

    def step(name: str, fn: Callable[[], object]) -> None:
        reset_peak()
        t0 = time.perf_counter()
        fn()
        rows.append({"dataset": dataset, "label": label, "step": name, "seconds": round(time.perf_counter() - t0, 4),
                     "peak_rss_mb": mb("VmHWM"), "rss_after_mb": mb("VmRSS")})

    def load() -> None:
        nonlocal graph
        graph = load_dataset(dataset)

    step("load", load)
    for name, fn in [("content_hash", lambda: graph.content_hash), ("layout_dst", lambda: graph.layout("dst")),
                     ("layout_src", lambda: graph.layout("src")), ("pairs_src", lambda: graph.unique_pairs("src")),
                     ("pairs_dst", lambda: graph.unique_pairs("dst")), ("csr_by_dst", lambda: graph.csr_by_dst),
                     ("in_degrees", lambda: graph.in_degrees), ("out_degrees", lambda: graph.out_degrees),
                     ("stats", lambda: graph.stats)]:
        step(name, fn)
    bits = next(k for k in LayoutPass().knobs(None, graph) if k.name == "layout.index_bits")  # type: ignore[arg-type]
    for layout in LAYOUTS if arrays else ():
        for b in bits.choices:
            step(f"graph_arrays:{layout}:{b}", lambda lay=layout, b=b: graph_arrays(graph, lay, int(b)))
            graph.__dict__.pop("_rgtune_arrays", None)
    for r in rows:
        r.update(num_edges=graph.num_edges(), num_nodes=graph.num_nodes())
    return rows


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--datasets", nargs="+", default=["synthetic:bgs", "synthetic:am", "synthetic:ogbn-mag"],
                   help="graphs, one process each (default the three real-size presets)")
    p.add_argument("--label", default="run", help="a tag for the JSON lines (e.g. before, cold, warm)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="RGTUNE_CACHE_DIR for the measured processes (default: the environment's)")
    p.add_argument("--out", type=Path, default=RESULTS / "preprocess_time.jsonl", help="JSON lines (appended)")
    p.add_argument("--no-arrays", action="store_true",
                   help="skip graph_arrays (the largest graphs: six sets of arrays would not fit the memory)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process's dataset
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.label, arrays=not args.no_arrays)))
        return
    env = dict(os.environ, **({"RGTUNE_CACHE_DIR": str(args.cache_dir)} if args.cache_dir else {}))
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        child = [sys.executable, __file__, "--one", dataset, "--label", args.label] + ["--no-arrays"] * args.no_arrays
        rows += json.loads(subprocess.run(child, env=env, check=True, stdout=subprocess.PIPE,
                                          text=True).stdout.strip().splitlines()[-1])
    print(f"{'dataset':<30} {'label':<8} {'step':<28} {'seconds':>9} {'peak MB':>9} {'after MB':>9}")
    for r in rows:
        print(f"{r['dataset']:<30} {r['label']:<8} {r['step']:<28} {r['seconds']:>9.3f} {r['peak_rss_mb'] or 0:>9.0f} "
              f"{r['rss_after_mb'] or 0:>9.0f}")
        append_jsonl(args.out, r)


if __name__ == "__main__":
    main()
