"""One implementation in a process of its own, watched: its time limit, its memory limit, its result as JSON.

:func:`rgtune.bench.layers.bench` runs every implementation through :func:`run_impl`, one after
another. The parent (:func:`run_isolated`) starts ``python -m rgtune.bench.isolated '<json>'`` in a
session of its own and polls it: over ``timeout`` seconds, or with a resident set (``VmRSS`` of
``/proc/<pid>/status``) over the memory limit, the whole session is killed (SIGKILL) and the
outcome is ``"timeout"`` or ``"oom"``. A child that the kernel kills with SIGKILL (its
out-of-memory killer) and one whose allocation fails (MemoryError, torch's CPU allocator or CUDA
out of memory: :func:`rgtune.tuner.memory.is_out_of_memory`) are ``"oom"`` too; any other failure
is ``"failed"`` with the child's last line of stderr. The RSS is polled every ``poll`` seconds, so a
child that allocates fast may go somewhat over the limit before it is killed; leave headroom.

The child (:func:`measure_impl`) does, in order: everything once on a tiny graph, so that imports
and lazy initialization are not counted as the layer's memory (as :mod:`.memory`); loads the graph
and makes the input and output gradient (seeded, as every other child) and the reference layer the
weights come from (:func:`rgtune.bench.layers.detached_reference`: what it derives from the graph
stays its own, so the implementation pays for what it derives itself); takes the memory baseline
(:class:`rgtune.bench.memory._Meter`: the resident set's high-water mark reset, or CUDA's peak
statistics); builds the implementation; per mode, warm-up and the timed repeats, the mode's peak
being the highest of building and its runs above the baseline; between the forward and the
training step the float64 check of the output (:func:`rgtune.bench.layers.check_impl`, sampled
rows on a big graph): after the forward's peak is read and before the training step's is
restarted, so that the reference's memory is counted in neither. An implementation with a module of
its own for the training step (rgtune's training schedule) lets its forward module go before the
step is measured. It prints a line, :data:`MARKER` and the
result so far as JSON, after building, after each mode and at the end: a child killed in its
training step still hands back its forward's times and peak (the parent takes the last line; the
row's status then stands only for what is missing).

Example:
    >>> import sys
    >>> out = run_isolated([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    >>> out.status, out.result
    ('timeout', None)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rgtune.tuner.memory import available_bytes, status_bytes

#: the seconds an implementation may take by default (its process: imports, build, runs, check)
DEFAULT_TIMEOUT_S = 600.0
#: the share of the machine's available memory (``MemAvailable``) an implementation may use by default
DEFAULT_MEMORY_SHARE = 0.75
#: the child's result line starts with this
MARKER = "rgtune-bench-result "

_MMAP_THRESHOLD = "65536"  # as :mod:`.memory`: freed tensors leave the resident set at once


@dataclass
class Outcome:
    """What became of one child: ``status`` (``ok``, ``oom``, ``timeout``, ``failed``), its result (the JSON it
    printed, None if it printed none), why (for any status but ``ok``), its highest polled RSS and its seconds."""

    status: str
    result: dict[str, Any] | None
    message: str
    peak_rss_mb: float
    seconds: float


def available_memory_gb() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in GB (None where there is none)."""
    avail = available_bytes("cpu")
    return None if avail is None else avail / 1e9


def default_memory_limit_gb() -> float | None:
    """:data:`DEFAULT_MEMORY_SHARE` of the memory available now (None: unknown, no limit)."""
    avail = available_memory_gb()
    return None if avail is None else round(avail * DEFAULT_MEMORY_SHARE, 1)


def _rss_mb(pid: int) -> float:
    return (status_bytes("VmRSS", pid) or 0) / 1e6


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole session (it may have started compilers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_isolated(argv: Sequence[str], *, timeout: float, memory_limit_gb: float | None = None,
                 env: dict[str, str] | None = None, poll: float = 0.05) -> Outcome:
    """Run ``argv`` as a watched child (see the module docstring) and classify how it ended; its result is
    the JSON after :data:`MARKER` on its stdout. Lines of its stderr that start with ``bench:`` are passed on."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if memory_limit_gb is not None and memory_limit_gb <= 0:
        raise ValueError(f"memory limit must be > 0 GB (or None: none), got {memory_limit_gb}")
    limit_mb = None if memory_limit_gb is None else memory_limit_gb * 1e3
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, env=env, start_new_session=True)
        ours, peak = None, 0.0
        try:
            while True:
                try:
                    proc.wait(timeout=poll)
                    break
                except subprocess.TimeoutExpired:
                    pass
                rss = _rss_mb(proc.pid)
                peak = max(peak, rss)
                if limit_mb is not None and rss > limit_mb:
                    ours = ("oom", f"over the memory limit of {memory_limit_gb:g} GB (resident set {rss:.0f} MB)")
                elif time.monotonic() - start > timeout:
                    ours = ("timeout", f"over the time limit of {timeout:g} s")
                if ours is not None:
                    _kill(proc)
                    proc.wait()
                    break
        finally:
            if proc.poll() is None:  # interrupted: leave no child behind
                _kill(proc)
                proc.wait()
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for line in stderr.splitlines():
        if line.startswith("bench:"):
            print(line, file=sys.stderr)
    result = _last_result(stdout)  # a killed child's: what it finished before (a mode's times)
    if ours is not None:
        return Outcome(ours[0], result, ours[1], peak, seconds)
    if proc.returncode == -signal.SIGKILL:
        return Outcome("oom", result, "killed by SIGKILL (most likely the kernel's out-of-memory killer)", peak,
                       seconds)
    if result is None or proc.returncode != 0:
        last = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return Outcome("failed", result, last, peak, seconds)
    return Outcome(result.get("status", "ok"), result, result.get("problem") or "", peak, seconds)


def _last_result(stdout: str) -> dict[str, Any] | None:
    """The last complete result line of a child's stdout (a line cut off by a kill is not one)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                continue
    return None


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a child: this one, glibc's mmap threshold (:mod:`.memory`), the thread count, and
    this rgtune importable (it may have been imported from a working tree not on the path)."""
    import rgtune

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=_MMAP_THRESHOLD)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    root = str(Path(rgtune.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_impl(args: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT_S,
             memory_limit_gb: float | None = None) -> Outcome:
    """Measure one implementation (``args``: :func:`measure_impl`'s) in a watched child."""
    argv = [sys.executable, "-m", "rgtune.bench.isolated", json.dumps(args)]
    return run_isolated(argv, timeout=timeout, memory_limit_gb=memory_limit_gb, env=child_env(args.get("threads")))


# ---------------------------------------------------------------------- the child
def _emit(res: dict[str, Any]) -> None:
    print(MARKER + json.dumps(res), flush=True)


def measure_impl(a: dict[str, Any], emit: Callable[[dict[str, Any]], None] = _emit) -> dict[str, Any]:
    """Build, time, measure and check ``a["impl"]`` (see the module docstring); ``a``: model, dataset,
    in_dim, out_dim, heads, backend, db, seed, threads, data_dir, options, repeats, warmup,
    sample_above (None: check every row), check_rows. The result as JSON values; ``emit`` gets the
    result so far after building and after each mode."""
    import torch

    from rgtune.bench.layers import (MODES, bench_input, build_with_reference, check_impl, detached_reference,
                                     time_impl, upstream_grad)
    from rgtune.bench.memory import _WARMUP_GRAPH, _Meter
    from rgtune.data import load_dataset
    from rgtune.runtime._lookup import resolve_backend

    if a.get("threads"):
        torch.set_num_threads(a["threads"])
    be = resolve_backend(a["backend"])
    device = torch.device(be.device_type)
    sizes = (a["model"], a["in_dim"], a["out_dim"], a["heads"])
    reference = lambda graph: detached_reference(sizes[0], graph, *sizes[1:], be, a["seed"],  # noqa: E731
                                                 a.get("options", ""))
    build = lambda graph, x, ref: build_with_reference(  # noqa: E731
        sizes[0], graph, *sizes[1:], be, a["db"], (a["impl"],), a["seed"], check=False,
        options=a.get("options", ""), x=x, ref=ref)
    # Everything once on a tiny graph (quietly: the real run reports its own problems), so that imports,
    # the libraries' and torch's lazy initialization and thread pools are part of the baseline.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(Exception):
        tiny = load_dataset(_WARMUP_GRAPH)
        x0 = bench_input(tiny, a["in_dim"], a["seed"], device)
        (warm,), _, _, _ = build(tiny, x0, reference(tiny))
        for mode in MODES:
            time_impl(warm, mode, x0, upstream_grad(tiny.num_nodes(), a["out_dim"], device), 1, 0)
        del warm, x0, tiny

    graph = load_dataset(a["dataset"], root=a["data_dir"])
    x = bench_input(graph, a["in_dim"], a["seed"], device)
    grad = upstream_grad(graph.num_nodes(), a["out_dim"], device)
    ref = reference(graph)  # the weights' source, before the baseline: not the implementation's memory
    meter = _Meter(device)
    (impl,), _, schedule, _ = build(graph, x, ref)
    built_mb = meter.peak_mb()
    res: dict[str, Any] = {"status": "ok", "key": impl.key, "name": impl.name, "math": impl.math,
                           "schedule": schedule, "dataset": graph.name, "edges": graph.num_edges(),
                           "problem": impl.problem, "error": None, "checked": None,
                           "times": {m: [] for m in MODES}, "peak_mb": {}, "counts": impl.counts,
                           "recorded": impl.recorded}
    if impl.forward is None:
        return res
    res["times"] = impl.times
    emit(res)
    for mode in MODES:
        meter.restart_peak()
        time_impl(impl, mode, x, grad, a["repeats"], a["warmup"])
        mode_mb = meter.peak_mb()
        if impl.times[mode]:
            res["peak_mb"][mode] = None if mode_mb is None or built_mb is None else max(built_mb, mode_mb)
        if mode == "fwd" and impl.forward is not None:
            # between the modes: the forward's peak is read, the training step's is restarted after it
            check_impl(impl, ref, x, sample_above=a.get("sample_above"), rows=a.get("check_rows", 512),
                       seed=a["seed"])
            res.update(error=impl.error, checked=impl.checked)
            if impl.forward is None:  # its forward raised in the check: no training step either
                res["problem"] = impl.problem
                break
        res["problem"] = impl.problem
        emit(res)
        if mode == "fwd" and impl.train is not None and impl.train is not impl.forward:
            # a module of its own for the training step (rgtune's training schedule): the forward's, with
            # its workspaces, is not part of the step's memory
            impl.forward = impl.params = None
    return res


def main(argv: list[str] | None = None) -> int:
    """``python -m rgtune.bench.isolated '<json arguments>'``: one implementation, its result lines."""
    from rgtune.bench.layers import is_out_of_memory

    a = json.loads((sys.argv[1:] if argv is None else argv)[0])
    so_far: dict[str, Any] = {}

    def emit(res: dict[str, Any]) -> None:
        so_far.clear()
        so_far.update(json.loads(json.dumps(res)))  # a copy: the result grows on
        _emit(res)

    try:
        res = measure_impl(a, emit)
    except BaseException as e:  # noqa: BLE001 - an allocation failing is a result, anything else a failure
        if not is_out_of_memory(e):
            raise
        why = str(e).splitlines()[0][:200] if str(e) else ""
        res = {**so_far, "status": "oom", "problem": f"{type(e).__name__}: {why}"}
    _emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
