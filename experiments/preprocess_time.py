"""Time and peak memory of loading a graph and of building each derived structure the kernels need.

For every ``--datasets`` graph, one fresh process (so one graph's memory never inflates the next
one's peak) loads it and then asks for, in this order: ``content_hash`` (first, because the
on-disk cache of the derived structures is keyed by it), the layouts by destination and by
source, the unique (node, relation) pairs of both sides, the CSR by destination, the in- and
out-degrees, the statistics, and :func:`rgtune.ir.bind.graph_arrays` for every layout and index
width the layout pass offers. A structure is timed once, on first use, as a process sees it; the
arrays of one (layout, width) are dropped before the next ones are built, as a trial that binds
one schedule holds only its own.

Peak RSS is sampled every 2 ms from ``/proc/self/statm`` while a step runs (Linux; elsewhere the
process's lifetime peak). Run it twice with the same ``--cache-dir``: the first run builds the
structures (and writes them to the cache), the second one reads them. A table goes to stdout and
one JSON line per step to ``--out``.

Examples::

    python experiments/preprocess_time.py --datasets synthetic:bgs synthetic:am --label cold --cache-dir /tmp/c
    python experiments/preprocess_time.py --datasets synthetic:ogbn-mag --label warm --cache-dir /tmp/c
    python experiments/preprocess_time.py --datasets synthetic:ogbn-mag,reverse=1 --no-arrays --label cold
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "preprocess_time.jsonl"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int | None:
    """The process's resident set now, or None where ``/proc`` is absent."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return None


class _PeakRSS:
    """Samples the resident set in a thread while a step runs (the lifetime peak would hide later steps)."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()

    def __enter__(self) -> "_PeakRSS":
        self.peak = _rss_bytes() or 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, _rss_bytes() or 0)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        now = _rss_bytes()
        # Without /proc, the lifetime peak (ru_maxrss is KiB on Linux) is the best there is.
        lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.peak = max(self.peak, now) if now is not None else lifetime


def measure(dataset: str, label: str, arrays: bool = True) -> list[dict[str, Any]]:
    """Every step's seconds and memory for ``dataset``, in this process (``arrays``: graph_arrays too)."""
    from rgtune.data.datasets import load_dataset
    from rgtune.ir.bind import graph_arrays
    from rgtune.ir.passes.layout import LAYOUTS, LayoutPass

    rows: list[dict[str, Any]] = []
    graph: Any = None

    def step(name: str, fn: Callable[[], object]) -> None:
        with _PeakRSS() as rss:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        rows.append({"dataset": dataset, "label": label, "step": name, "seconds": round(seconds, 4),
                     "peak_rss_mb": round(rss.peak / 2**20, 1), "rss_after_mb": round((_rss_bytes() or 0) / 2**20, 1)})

    def load() -> None:
        nonlocal graph
        graph = load_dataset(dataset)

    step("load", load)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("content_hash", lambda: graph.content_hash),
        ("layout_dst", lambda: graph.layout("dst")),
        ("layout_src", lambda: graph.layout("src")),
        ("pairs_src", lambda: graph.unique_pairs("src")),
        ("pairs_dst", lambda: graph.unique_pairs("dst")),
        ("csr_by_dst", lambda: graph.csr_by_dst),
        ("in_degrees", lambda: graph.in_degrees),
        ("out_degrees", lambda: graph.out_degrees),
        ("stats", lambda: graph.stats),
    ]
    for name, fn in steps:
        step(name, fn)
    knobs = LayoutPass().knobs(None, graph)  # type: ignore[arg-type]
    bits_knob = next(k for k in knobs if k.name == "layout.index_bits")
    for layout in LAYOUTS if arrays else ():
        for bits in bits_knob.choices:
            step(f"graph_arrays:{layout}:{bits}", lambda lay=layout, b=bits: graph_arrays(graph, lay, int(b)))
            graph.__dict__.pop("_rgtune_arrays", None)
    for r in rows:
        r.update(num_edges=graph.num_edges(), num_nodes=graph.num_nodes())
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'dataset':<30} {'label':<8} {'step':<28} {'seconds':>9} {'peak MB':>9} {'after MB':>9}"]
    for r in rows:
        lines.append(f"{r['dataset']:<30} {r['label']:<8} {r['step']:<28} {r['seconds']:>9.3f} "
                     f"{r['peak_rss_mb']:>9.0f} {r['rss_after_mb']:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["synthetic:bgs", "synthetic:am", "synthetic:ogbn-mag"])
    p.add_argument("--label", default="run", help="a tag for the JSON lines (e.g. before, cold, warm)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="RGTUNE_CACHE_DIR for the measured processes (default: the environment's)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-arrays", action="store_true",
                   help="skip graph_arrays (the largest graphs: six sets of arrays would not fit the memory)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process's dataset
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.label, arrays=not args.no_arrays)))
        return
    env = dict(os.environ)
    if args.cache_dir is not None:
        env["RGTUNE_CACHE_DIR"] = str(args.cache_dir)
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        child = [sys.executable, __file__, "--one", dataset, "--label", args.label] + ["--no-arrays"] * args.no_arrays
        out = subprocess.run(child, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows += json.loads(out.strip().splitlines()[-1])
    print(_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
