"""What the experiment scripts share (not a script: they import it from this folder).

Their command lines, their result files, schedules timed side by side (:func:`rounds_ms`), and studies side
by side on one GPU (``--jobs``, :func:`run_parallel`): a GPU study spends most of its time on the host, and
the measurement workers' lock on the device (:mod:`rgtune.tuner.device_lock`) keeps any two from timing at
once; CPU backends time on the cores the other studies compile on, so they run one study at a time.

Example:
    >>> split_names("aifb,mutag"), split_names("synthetic:custom,nodes=9;aifb")
    (['aifb', 'mutag'], ['synthetic:custom,nodes=9', 'aifb'])
    >>> run_parallel(pow, [(2, 3), (3, 2)], jobs=1)
    [8, 9]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "results"
PARALLEL_BACKENDS = ("cuda",)  # the device's lock serializes their timing


#: the options the scripts share: (type, default, help)
OPTIONS: dict[str, tuple[Callable[[str], Any], Any, str]] = {
    "models": (str, "hgt,rgat", "models, comma-separated"),
    "datasets": (str, "aifb,mutag", "datasets, ','-separated (';' where a synthetic spec holds commas)"),
    "hidden": (int, 64, "feature size, in = out"),
    "backend": (str, None, "cpu (default when usable), else reference; cuda on a GPU"),
    "data-dir": (str, None, "dataset root (default $RGTUNE_DATA_DIR)"),
    "threads": (int, None, "OpenMP threads of the measured kernels (default: the environment's)"),
    "jobs": (int, 1, "studies side by side (GPU backends only)"),
    "out": (Path, RESULTS, "where results go"),
}


def parser(doc: str, *options: str, **defaults: Any) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first paragraph is the description, the rest the epilog; with the
    shared ``options`` (keys of :data:`OPTIONS`), ``defaults`` (by dest) overriding theirs."""
    first, _, rest = doc.strip().partition("\n\n")
    p = argparse.ArgumentParser(description=first, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in options:
        kind, default, text = OPTIONS[name]
        default = defaults.get(name.replace("-", "_"), default)
        shown = default.relative_to(RESULTS.parents[1]) if isinstance(default, Path) else default
        p.add_argument(f"--{name}", type=kind, default=default, help=text if default is None else
                       f"{text} (default {shown})")
    return p


def setup(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The backend (--backend, else cpu where usable, else reference), --jobs checked against it, and the
    measured kernels' OpenMP threads pinned to --threads (the measurement workers inherit the environment;
    the device's fingerprint records the count; on a busy shared machine 1 thread is the stable choice)."""
    from rgtune.codegen.base import available_backends

    backend = args.backend or ("cpu" if available_backends().get("cpu", (False, ""))[0] else "reference")
    if problem := jobs_problem(getattr(args, "jobs", 1), backend):
        p.error(problem)
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    return backend


def split_names(text: str) -> list[str]:
    """A list option: ';'-separated, or ','-separated when it holds no synthetic spec (those hold commas)."""
    sep = ";" if ";" in text or "synthetic:" in text else ","
    return [t for t in (x.strip() for x in text.split(sep)) if t]


def canonical_dataset(name: str, data_dir: str | None = None) -> str:
    """The name the database records for ``name`` (a synthetic spec drops its default fields)."""
    from rgtune.data import load_dataset

    return load_dataset(name, root=data_dir).name


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of dicts as CSV (the union of their keys; floats to 6 significant digits); nothing for no rows."""
    if rows:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def rounds_ms(workload: Any, schedules: Mapping[str, Mapping[str, Any]], rounds: int, options: Any = None,
              on_result: Callable[..., None] | None = None) -> dict[str, list[float | None]]:
    """:func:`rgtune.tuner.measure.measure_rounds` in ms: each schedule's time in each of ``rounds`` interleaved
    rounds in one measurement process (None: not ``ok``)."""
    from rgtune.tuner.measure import measure_rounds

    seconds = measure_rounds(workload, schedules, rounds, options, on_result)
    return {name: [None if t is None else t * 1e3 for t in times] for name, times in seconds.items()}


def jobs_problem(jobs: int, backend: str) -> str | None:
    """Why ``--jobs`` cannot be ``jobs`` with ``backend`` (None: it can)."""
    if jobs < 1:
        return f"--jobs must be >= 1, got {jobs}"
    if jobs > 1 and backend not in PARALLEL_BACKENDS:
        return (f"--jobs {jobs} needs a GPU backend ({', '.join(PARALLEL_BACKENDS)}), not {backend!r}: studies side "
                "by side on the CPU would time each other's kernels")
    return None


def threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // jobs)


def limit_threads(threads: int) -> None:
    """This process's and its children's host threads (OpenMP, MKL, torch, scikit-learn's OpenMP)."""
    os.environ.update(dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), str(threads)))
    import torch
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)


def run_parallel(fn: Callable[..., T], tasks: Sequence[tuple[Any, ...]], jobs: int,
                 on_done: Callable[[T], None] | None = None) -> list[T]:
    """``[fn(*t) for t in tasks]``, ``jobs`` at a time in fresh processes of ``cores // jobs`` host threads
    each (in this one when ``jobs`` is 1); ``on_done`` sees each result as it comes."""
    if jobs <= 1:
        results = []
        for t in tasks:
            results.append(fn(*t))
            if on_done is not None:
                on_done(results[-1])
        return results
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=limit_threads,
                             initargs=(threads_per_job(jobs),)) as pool:
        futures = [pool.submit(fn, *t) for t in tasks]
        for f in as_completed(futures) if on_done is not None else ():
            on_done(f.result())
        return [f.result() for f in futures]
