"""Peak memory of one implementation's forward or training step, measured in its own process.

A process's peak is its own: run side by side in one process, each implementation's figure would
include what the others left allocated, and the allocator's caches would hide its growth. So
:func:`peak_memory` starts ``python -m rgtune.bench.memory`` per implementation and mode. The
child imports everything, loads the graph, makes the input and the reference layer that the
weights come from (:func:`~rgtune.bench.layers.detached_reference`: what it derives from the graph
stays its own), then measures from that baseline: building the layer (parameters, compiled
kernels, workspaces), one untimed step, one more step.
(Before the baseline, the child does all of it once on a tiny graph, so that imports and lazy
initialization are not counted.) What it reports is the highest memory above the baseline over all of that: the layer's own state
plus the most a step holds at once (for a training step the values the forward keeps for the
backward, the gradients and the temporaries).

* CPU: the resident set. The kernel's high-water mark (``VmHWM``) is reset at the baseline through
  ``/proc/self/clear_refs``; glibc is told to give large blocks back at once
  (``MALLOC_MMAP_THRESHOLD_``), so freed tensors are not resident when the next one is measured.
  Linux only (elsewhere the figure is None).
* CUDA: ``torch.cuda.max_memory_allocated`` above what was allocated at the baseline (the
  caching allocator's reserve is not counted).

Example:
    >>> spec = "synthetic:custom,nodes=200,edges=1500,ntypes=2,rels=3"
    >>> mb = peak_memory("rgcn", spec, "torch", "fwd+bwd", in_dim=8, out_dim=8, backend="reference", db=None)
    >>> mb is not None and mb > 0
    True
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

from rgtune.tuner.memory import reset_peak, status_bytes

#: glibc: blocks from 64 KiB up are mapped and unmapped on their own (no dynamic threshold), so a
#: freed tensor leaves the resident set at once
_MMAP_THRESHOLD = "65536"


def peak_memory(model: str, dataset: str, impl: str, mode: str, **kwargs: Any) -> float | None:
    """Peak MB of ``impl`` (a key of :data:`rgtune.bench.layers.IMPLS`) in ``mode`` (``fwd`` or
    ``fwd+bwd``) above the loaded graph and input, in a fresh process (see the module docstring;
    ``kwargs`` as :func:`measure_step`'s). None where it cannot be measured."""
    return measure_step(model, dataset, impl, mode, **kwargs)["peak_mb"]


def measure_step(model: str, dataset: str, impl: str, mode: str, *, in_dim: int = 64, out_dim: int = 64,
                 heads: int = 1, backend: str = "auto", db: str | None = None, seed: int = 0,
                 threads: int | None = None, data_dir: str | None = None, steps: int = 2,
                 config: dict[str, Any] | None = None, timeout: float = 3600.0, options: str = "") -> dict[str, Any]:
    """``{"peak_mb": ..., "step_s": [...]}``: the peak (as :func:`peak_memory`) over building and
    ``steps`` steps, and each step's seconds (the first includes what is built lazily), measured in
    a fresh process. ``config``: rgtune's schedule instead of the database's. A child that fails
    raises ``RuntimeError`` with its last line. ``options``: the model's, canonical text."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    args = {"model": model, "dataset": dataset, "impl": impl, "mode": mode, "in_dim": in_dim, "out_dim": out_dim,
            "heads": heads, "backend": backend, "db": db, "seed": seed, "threads": threads, "data_dir": data_dir,
            "steps": steps, "config": config, "options": options}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=_MMAP_THRESHOLD)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, "-m", "rgtune.bench.memory", json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"measuring {impl} ({mode}) in its own process failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------- the child
class _Meter:
    """Memory above a baseline taken at construction: the device's allocator on CUDA, else the RSS."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
            self.ok = True
        else:
            self.base = status_bytes("VmRSS") or 0
            self.ok = reset_peak() and self.base > 0

    def restart_peak(self) -> None:
        """Forget the peak so far (the baseline stays): the next :meth:`peak_mb` is the highest since now."""
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif self.ok:
            gc.collect()
            self.ok = reset_peak()

    def peak_mb(self) -> float | None:
        if not self.ok:
            return None
        if self.cuda:
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.base) / 1e6
        return ((status_bytes("VmHWM") or 0) - self.base) / 1e6


#: the graph the child runs everything on once before its baseline (see :func:`_measure`)
_WARMUP_GRAPH = "synthetic:custom,nodes=64,edges=256,ntypes=2,rels=3"


def _steps(a: dict[str, Any], graph: Any, backend: Any, steps: int) -> dict[str, Any]:
    """Build ``a``'s implementation for ``graph`` and run ``steps`` steps (the first builds what is
    built lazily: a training program, caches); the peak above the baseline taken just before
    building, and each step's seconds."""
    from rgtune.bench.layers import _sync, build_impls, detached_reference, run_once, upstream_grad

    device = torch.device(backend.device_type)
    x = torch.randn(graph.num_nodes(), a["in_dim"], device=device)
    grad = upstream_grad(graph.num_nodes(), a["out_dim"], device)
    sizes = (a["in_dim"], a["out_dim"], a["heads"])
    ref = detached_reference(a["model"], graph, *sizes, backend, a["seed"], a.get("options", ""))  # not measured
    meter = _Meter(device)
    impls, _, _ = build_impls(a["model"], graph, *sizes, backend, a["db"], (a["impl"],), a["seed"], check=False,
                              config=a.get("config"), options=a.get("options", ""), ref=ref)
    impl = impls[0]
    if impl.forward is None:
        raise RuntimeError(impl.problem or f"{a['impl']} could not be built")
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run_once(impl, a["mode"], x, grad)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    return {"peak_mb": meter.peak_mb(), "step_s": seconds}


def _measure(a: dict[str, Any]) -> dict[str, Any]:
    from rgtune.data import load_dataset
    from rgtune.runtime._lookup import resolve_backend

    if a["threads"]:
        torch.set_num_threads(a["threads"])
    be = resolve_backend(a["backend"])
    # Everything once on a tiny graph: imports, the libraries' and torch's lazy initialization and
    # thread pools are then part of the baseline, not of the layer's memory.
    _steps(a, load_dataset(_WARMUP_GRAPH), be, 2)
    return _steps(a, load_dataset(a["dataset"], root=a["data_dir"]), be, a.get("steps", 2))


def main(argv: list[str] | None = None) -> int:
    """``python -m rgtune.bench.memory '<json arguments>'``: one measurement, one JSON line."""
    a = json.loads((sys.argv[1:] if argv is None else argv)[0])
    print(json.dumps(_measure(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
