"""Studies side by side on one GPU machine (the experiments' ``--jobs``): a study on the GPU spends most of
its time on the host, and the measurement workers' lock on the device (:mod:`rgtune.tuner.device_lock`)
keeps any two from timing at once. CPU backends time on the cores the other studies compile on, so
they run one study at a time. Each job process gets ``cores // jobs`` host threads.

Example:
    >>> run_parallel(pow, [(2, 3), (3, 2)], jobs=1)
    [8, 9]
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
PARALLEL_BACKENDS = ("cuda",)  # the device's lock serializes their timing


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
    """``[fn(*t) for t in tasks]``, ``jobs`` at a time in fresh processes (in this one when ``jobs`` is 1);
    ``on_done`` sees each result as it comes."""
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
