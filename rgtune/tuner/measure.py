"""Isolated measurement: compile -> verify -> time, in a worker process that may die.

A :class:`MeasureWorker` owns one worker process per workload. The worker loads the graph,
builds the search space and the float64 reference (the IR interpreter of the program) once, then serves trials:

1. estimate the memory the candidate's buffers need; one whose buffers are over the user's memory
   limit, or whose buffers and the verification case's inputs and results (the last case's size,
   then this one's) are over a share of the free memory, is refused (``out_of_memory``, never built;
   :mod:`.memory`);
2. make the trial's verification case: fresh random inputs and parameters (seeded by the trial) and
   the float64 reference's results on them, on every row or, on a big graph, on sampled rows
   (:mod:`.verification`);
3. compile the configuration with the backend (a :class:`CompileError` is ``compile_error``);
4. verify it against the case (relative error
   ``max|out - ref| / max|ref|`` below each result's tolerance), or ``wrong_result`` with the error;
   a wrong kernel is never timed;
5. time it: the first run is timed on its own (``details.first_run_ms``), and a candidate whose
   first run takes more than ``stop_slower`` times the best time so far (the parent passes it; never
   under :data:`STOP_MIN_S`) is ``stopped`` there; else the rest of the warm-up (the verification's
   run and the first run count as two of it), then repeats until both a count and a minimum time are
   reached, or ``max_seconds`` were measured (at least :data:`MIN_TIMED_RUNS` runs); the median is the
   kernels' time (the backend synchronizes around each run on a GPU);
6. build the schedule's layer and call it as a user does (:mod:`.call`: ``layer(x)``; in training its
   backward through autograd), verified on the same case (a wrong call is ``wrong_result``), then timed:
   ``details.kernel_ms`` and ``details.call_ms``. Which of the two is the trial's time is
   ``MeasureOptions.objective`` (:data:`OBJECTIVES`: by default the call on a GPU backend, the kernels
   elsewhere, where the call is recorded from :data:`MIN_TIMED_RUNS` runs). A sampler workload is timed
   by its batches (below), without a call.

A trial's outcome is a :class:`~rgtune.db.trial_result.TrialResult` (what the database records):
besides its status and times, its ``details`` have the worker's memory growth over the trial
(``memory.peak_bytes``, :mod:`.memory`), what verification covered (``verified``) and its seconds
(``verify_seconds``). A failed allocation, or a worker killed by the system's out-of-memory killer,
is ``out_of_memory``: it costs the trial, not the study.

A training workload (``Workload.mode == "training"``) measures one training step: the training
program (:mod:`rgtune.ir.autodiff`) computes the output, then the gradients of the input and of
every param for a random output gradient (:func:`rgtune.codegen.training.train_step`); each of them
is verified against torch's autograd through the float64 interpreter of the unoptimized program, and the step
is timed.

A sampler workload (``Workload.batches``) builds the schedule's mini-batch programs, verifies them on
one sampled block and times their binding and run over the sampler's fixed batches (:mod:`.batches`;
the build's facts name the batches, ``details.build["timed_on"]``); its times are per batch.

On a GPU, steps 2 and 3 hold the device's cross-process lock (:mod:`rgtune.tuner.device_lock`):
workers of several studies can share one GPU without timing each other's kernels; compiling and
the float64 reference overlap. A trial that waited for the lock has ``details.device_wait_s``.

Paired timing (``MeasureOptions(timing="paired")``, CPU backends): on a shared machine the speed
of the whole machine drifts over seconds, so one schedule's trials in one worker vary by as much
as the differences between good schedules. The drift is common to whatever runs at the moment:
when every run of the candidate alternates with a run of a fixed *reference* (the workload's
default schedule, compiled once per worker), it cancels in their ratio (BENCHMARKS.md,
"Measurement noise", has the spreads with and without). So a paired trial's time is
``reference_ms x median(candidate run / reference run)``: the ratio, drift cancelled, on the scale
of the reference's time when the first worker of this :class:`MeasureWorker` calibrated it (a
restarted worker keeps that scale).
``times`` stays the candidate's raw runs; ``details.paired`` has ``vs_reference`` (the ratio),
``reference_ms`` (the scale) and ``reference_now_ms`` (the reference's median in this trial: the
drift). Every timed run of the candidate costs a run of the reference too (``min_seconds`` counts
the candidate's time only); compiling and verifying do not change.

The parent waits at most ``timeout`` seconds for a trial; ``timeout=None`` (the default) adapts it to
the workload: :data:`ADAPTIVE_TIMEOUT_FACTOR` times the slowest trial that verified so far, at least
:data:`ADAPTIVE_TIMEOUT_MIN` s, and ``first_timeout`` for the first one. A hanging kernel is killed with
its process (``timeout``); a crash (segfault, illegal memory access that kills the process)
is ``runtime_error`` with the signal; either way the next trial gets a fresh worker. A worker
that cannot be restarted costs the trial (``failed``), not the study. While it waits, the
parent calls the worker's ``on_wait`` every ``heartbeat_s`` seconds (the tuner records a
heartbeat, so that other workers of a shared database do not take a long trial for an abandoned
one). The worker
never outlives its parent: it exits when its end of the pipe from the parent closes (a ``kill -9``
of ``tune`` would otherwise leave it running, holding the GPU's lock).

Where a worker comes from (:func:`start_method`): a CPU backend's is forked from a server process
that imported torch and rgtune once (``multiprocessing``'s ``forkserver``), so a start or a restart
after a crash or a hang costs a fork, not seconds of imports; the server runs nothing, so no thread
pool or device state is forked. It takes the parent's environment and thread count as they are when
it starts (not as they were when the server did). A device backend's (CUDA) is spawned fresh.

:meth:`MeasureWorker.reverify` checks a schedule again on fresh inputs, each run more than once,
without timing it: a kernel with a data race can pass one verification by luck.

Example:
    >>> from rgtune.tuner.workload import Workload
    >>> w = MeasureWorker(Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3",
    ...                            8, 8, 1, "reference"), MeasureOptions(repeats=2, warmup=1))
    >>> r = w.measure({}, seed=0)   # the default schedule
    >>> r.status, r.max_error < 1e-4
    ('ok', True)
    >>> w.close()
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from rgtune.db.trial_result import MemoryUse, PairedTiming, TrialDetails, TrialResult
from rgtune.tuner.device_lock import device_lock, lock_timeout
from rgtune.tuner.memory import MemoryBudget, is_out_of_memory
from rgtune.tuner.options import OptionError, check_at_least, check_choice, check_positive
from rgtune.ir.passes.precision import lowest_storage
from rgtune.tuner.batches import SampledBatches
from rgtune.tuner.call import LayerCall
from rgtune.tuner.verification import VERIFY_MODES, Case, Verifier, shown

if TYPE_CHECKING:
    from rgtune.tuner.workload import Workload

TIMINGS = ("plain", "paired")
#: what a trial's time is: the layer as called (``"call"``), its kernels (``"kernels"``), or ``"auto"``: the call on
#: a backend that times on the device (a GPU, where the host path is most of a small graph's call), the kernels
#: elsewhere (a CPU's call costs its kernels and little more, and paired timing cancels drift for kernels alone)
OBJECTIVES = ("auto", "call", "kernels")
#: ``MeasureOptions.timeout=None``: a trial may take this many times the slowest verified trial so far ...
ADAPTIVE_TIMEOUT_FACTOR = 5.0
#: ... and at least this long (seconds); the first trial (nothing measured yet) gets ``first_timeout``
ADAPTIVE_TIMEOUT_MIN = 60.0
#: a candidate is never stopped for a first run shorter than this (seconds)
STOP_MIN_S = 0.05
#: timed runs always made before ``max_seconds`` may end the repeats
MIN_TIMED_RUNS = 3
#: how a wrong result of the layer as called (:mod:`.call`) begins, in a trial and in a reverification
CALL_WRONG = "the layer as called (its kernels verified): "


@dataclass(frozen=True)
class MeasureOptions:
    warmup: int = 2
    repeats: int = 7
    min_seconds: float = 0.05  # keep repeating fast kernels until this much time was measured
    max_repeats: int = 200
    max_seconds: float = 2.0  # ... but stop repeating once this much was measured (after MIN_TIMED_RUNS runs)
    tolerance: float = 1e-4
    timeout: float | None = None  # seconds for one trial (compile + verify + time); None: adaptive (docstring)
    first_timeout: float = 900.0  # adaptive: the first trial's limit, before anything was measured
    startup_timeout: float = 300.0  # loading the graph and imports in a fresh worker
    verify: str = "auto"  # "full", "sampled" (verify_rows destinations), "auto": sampled on big graphs
    verify_rows: int = 512
    stop_slower: float | None = 3.0  # stop a candidate whose first run is this many times the best (None: never)
    memory_limit: int | None = None  # bytes a candidate's buffers may take (None: no limit but the free memory)
    timing: str = "plain"  # "paired": alternate every run with the default schedule's (see the module docstring)
    reference_ms: float | None = None  # paired timing's scale; None: the worker calibrates it when it starts
    heartbeat_s: float = 60.0  # while waiting for a trial, the parent calls ``on_wait`` this often
    objective: str = "auto"  # the trial's time: "call", "kernels" or "auto" (:data:`OBJECTIVES`); both are recorded

    def __post_init__(self) -> None:
        """Refuse a bad value with an :class:`~rgtune.tuner.options.OptionError` naming it."""
        check_choice("timing", self.timing, TIMINGS)
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("verify", self.verify, VERIFY_MODES)
        check_positive("timeout", self.timeout, "a positive number of seconds", optional=True)
        for name in ("first_timeout", "startup_timeout", "heartbeat_s", "max_seconds"):
            check_positive(name, getattr(self, name), "a positive number of seconds")
        check_at_least("warmup", self.warmup, 0, "a count of runs, 0 or more")
        check_at_least("repeats", self.repeats, 1, "a count of runs, 1 or more")
        check_at_least("verify_rows", self.verify_rows, 1, "a count of rows, 1 or more")
        if self.stop_slower is not None and not self.stop_slower > 1:
            raise OptionError("stop_slower", self.stop_slower, "a factor above 1, or off")
        check_positive("memory_limit", self.memory_limit, "a positive amount of memory", optional=True)
        check_positive("reference_ms", self.reference_ms, "a positive time in ms", optional=True)


# ----------------------------------------------------------------------- worker side
class _Session:
    """Everything a worker keeps between trials."""

    def __init__(self, workload: Workload, options: MeasureOptions) -> None:
        import torch

        from rgtune.codegen.base import create
        from rgtune.data import load_dataset
        from rgtune.search_spaces import SearchSpace

        self.w, self.o = workload, options
        self.graph = load_dataset(workload.dataset, root=workload.data_dir)
        self.backend = create(workload.backend)
        self.program = workload.program()
        self.space = SearchSpace(self.program, self.graph, self.backend.target, mode=workload.mode,
                                 precision=workload.precision)
        self.training = workload.mode == "training"
        if (self.training or workload.batches is not None) and options.timing == "paired":
            raise ValueError("paired timing alternates with the default schedule's forward on the whole graph; a "
                             "training workload or one timed on a sampler's batches is timed plain")
        self.device = self.backend.device_type
        #: what a trial's time is (:data:`OBJECTIVES`): ``"call"`` or ``"kernels"``
        self.objective = "call" if options.objective == "call" or (
            options.objective == "auto" and self.backend.times_on_device and workload.batches is None) else "kernels"
        if self.objective == "call" and (workload.batches is not None or options.timing == "paired"):
            raise ValueError("objective 'call' times the layer as called on the whole graph: a workload timed on a "
                             "sampler's batches, or with paired timing, is timed by its kernels (objective 'kernels')")
        #: a sampler workload: its fixed batches, and how a trial builds, verifies and times on them
        self.batches = None if workload.batches is None else \
            SampledBatches(workload.batches, self.graph, self.program, self.backend, workload.mode, self.device,
                           options.tolerance, workload.precision)
        # the oracle: the unoptimized program, op by op in torch (float64; float32 for its own rounding), on
        # sampled rows of a big graph (a sampler workload: every row of one of its blocks)
        self.verifier = self.batches.verifier if self.batches is not None else \
            Verifier(self.program, self.graph, training=self.training, base_tolerance=options.tolerance,
                     mode=options.verify, rows=options.verify_rows)
        self.memory = MemoryBudget("cpu" if self.device == "cpu" else "cuda", options.memory_limit,
                                   share_slots=self.device == "cpu")
        self.torch = torch
        self._case_bytes: int | None = None  # what the last verification case held (Case.resident_bytes)
        self.reference_run: Callable[[Any, dict[str, Any]], Any] | None = None
        self.reference_ms = options.reference_ms
        if options.timing == "paired":
            self._start_reference()

    def _start_reference(self) -> None:
        """Compile the default schedule as the paired timing's reference; calibrate its scale unless given."""
        if self.backend.times_on_device:
            raise ValueError(f"paired timing alternates host-timed runs; backend {self.w.backend!r} times with "
                             "device events: use timing 'plain'")
        point = self.space.compile(self.space.default())
        if not point.valid:
            raise ValueError(f"paired timing: the default schedule is not valid ({'; '.join(point.problems)})")
        built = self.backend.build(point.kernels, self.graph, point.config)
        x, params = self.verifier.inputs(0)
        x32, p32 = _on_device(x, self.device), {k: _on_device(v, self.device) for k, v in params.items()}
        self.reference_run = built.run
        if self.reference_ms is None:
            # three blocks, the median of their medians: one block is as noisy as a plain trial
            blocks = [statistics.median(_plain_times(lambda: self._run(built.run, x32, p32), self.o))
                      for _ in range(3)]
            self.reference_ms = statistics.median(blocks) * 1e3

    def _point(self, config: Mapping[str, Any]) -> Any:
        """The programs ``config`` makes: of the whole graph, or a sampler workload's mini-batch programs."""
        return self.space.compile(config) if self.batches is None else self.batches.point(config)

    def _build(self, point: Any) -> Any:
        """``point`` compiled, bound to the graph (or, for batches, to the block it is verified on)."""
        if self.batches is not None:
            return self.batches.build(point)
        return self.backend.build(point.kernels, self.graph, point.config)

    def _run_case(self, built: Any, kp: Any, dev: Case) -> dict[str, Any]:
        """What the built program computes for ``dev`` (on the device), named as the verifier names it."""
        if self.batches is not None:
            return self.batches.run_case(built, dev)
        if not self.training:
            return {"output": built.run(dev.x, dev.params)}
        from rgtune.codegen.training import train_step

        out, dx, grads = train_step(built, kp, self.graph, dev.x, dev.params, dev.dout)
        return {"output": out, "input gradient": dx, **{f"gradient of {n}": g for n, g in grads.items()}}

    def measure(self, config: Mapping[str, Any], seed: int, stop_after: float | None = None) -> TrialResult:
        """One trial (see the module docstring); ``stop_after``: seconds a first run may take before the
        candidate is stopped (``stopped``)."""
        from rgtune.codegen.base import CompileError

        self._collect()
        point = self._point(config)
        if not point.valid:
            return TrialResult("invalid", error="; ".join(point.problems))
        # batches run one block at a time: the largest block's buffers are what a run holds
        buffers = self.memory.estimate(point.kernels, self.graph if self.batches is None else self.batches.largest)
        # the check's inputs and results take about the same every trial: the last case's size refuses a
        # candidate before the oracle runs (the first trial makes its case first)
        why = self._case_bytes is not None and self.memory.refusal(buffers, self._case_bytes)
        if why:
            return self._refused(buffers, self._case_bytes, why)
        self.memory.start()
        t1 = time.perf_counter()
        case = self.verifier.case(seed)  # on the host, outside the device's lock
        reference_s = time.perf_counter() - t1
        self._case_bytes = case.resident_bytes()
        why = self.memory.refusal(buffers, self._case_bytes)
        if why:
            return self._refused(buffers, self._case_bytes, why)
        t0 = time.perf_counter()
        try:
            built = self._build(point)
        except CompileError as e:
            return TrialResult("compile_error", error=f"{e}\n{e.log}".strip())
        compile_s = time.perf_counter() - t0
        build_facts = dict(built.info) if self.batches is None else {**built.info, "timed_on": self.batches.describe()}
        cache_hit, source_hash = built.cache_hit, built.source_hash
        times: list[float] = []
        median = first = paired = None
        called: _Called | None = None
        with self._exclusive_device() as waited:
            dev = case.on(self.device)
            t2 = time.perf_counter()
            got = self._run_case(built, point.kernels, dev)
            self.backend.synchronize()
            t3 = time.perf_counter()
            storage = lowest_storage(point.kernels)
            err, which, tol = self.verifier.error(got, case if self.batches is None else
                                                  self.batches.case_of_variants(case), storage)
            del got
            reference_s += time.perf_counter() - t3
            verified = err < tol  # also False for NaN
            if verified:
                first, times, median, paired = self._time(built, point.kernels, dev, stop_after)
            if median is not None and self.batches is None:
                del built  # a big graph's call holds buffers of its own: not both at once
                self._collect()
                called = self._call(config, dev, case, storage)
        # the oracle's time; the kernels' own run is the first of the warm-up when the candidate is timed
        details = TrialDetails(
            verified=case.coverage(), verify_seconds=reference_s, verify_run_seconds=t3 - t2,
            tolerance=tol if tol > self.o.tolerance else None,  # float32 is this far off here, or the sums are long
            first_run_ms=None if first is None else first * 1e3,  # what the early stop compared
            paired=paired, device_wait_s=waited(),
            memory=MemoryUse(self.memory.peak(), buffers, buffers + self._case_bytes),
            cache_hit=cache_hit, build=build_facts,
            kernel_ms=None if median is None else median * 1e3,
            call_ms=None if called is None or called.times is None else statistics.median(called.times) * 1e3,
            objective=None if median is None else "kernels" if called is None else self.objective,
            call_warnings=[] if called is None else called.warnings)
        measured = dict(compile_seconds=compile_s, max_error=err, source_hash=source_hash, details=details)
        if not verified:
            return TrialResult("wrong_result", error=self._off_by(err, which, tol, storage), **measured)
        if median is None:
            assert first is not None and stop_after is not None
            # which rule set the limit: the factor over the best, or the floor under it (a fast best)
            rule = (f"the early stop's floor, which {self.o.stop_slower:g} x the best so far is under"
                    if stop_after <= STOP_MIN_S else f"{self.o.stop_slower:g} x the best so far")
            return TrialResult("stopped", error=f"stopped after its first run: {first * 1e3:.4g} ms, over "
                               f"{stop_after * 1e3:.4g} ms ({rule})", **measured)
        if called is not None and called.times is None:
            measured["max_error"] = max(err, called.error)
            return TrialResult("wrong_result", error=f"{CALL_WRONG}{called.why}", **measured)
        if called is not None and self.objective == "call":
            assert called.times is not None
            return TrialResult("ok", median=statistics.median(called.times), times=called.times, **measured)
        return TrialResult("ok", median=median, times=times, **measured)

    def _call_options(self) -> MeasureOptions:
        """How the call is timed: like the kernels where it is the trial's time; else (a record beside the
        kernels' time) in :data:`MIN_TIMED_RUNS` runs, so that recording it costs a trial little. The
        verification's call is one of the warm-up."""
        o = replace(self.o, warmup=max(0, self.o.warmup - 1))
        if self.objective == "call":
            return o
        return replace(o, repeats=MIN_TIMED_RUNS, min_seconds=0.0, max_seconds=min(o.max_seconds, 0.5))

    def _call(self, config: Mapping[str, Any], dev: Case, case: Case, storage: str) -> "_Called":
        """The schedule in a layer as a user calls it (:mod:`.call`): verified on the trial's case like its
        kernels, then timed (the verification's call is one of the warm-up) when right."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call = LayerCall(self.program, self.graph, config, self.backend, self.w.mode)
            got = call.results(dev.x, dev.params, dev.dout)
            self.backend.synchronize()
            err, which, tol = self.verifier.error(got, case, storage)
            del got
            right = err < tol
            why = "" if right else self._off_by(err, which, tol, storage)
            times = _plain_times(lambda: call.run(dev.x, dev.dout), self._call_options()) if right else None
        # said by the worker too (its stderr is the user's); kept with the trial, which a CUDA graph's failure slows
        said = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return _Called(err, why, times, said)

    def _off_by(self, err: float, which: str, tol: float, storage: str) -> str:
        """Why a result failed verification: its relative error against its tolerance (or, for a missing or
        misshapen result, :meth:`Verifier.error`'s reason)."""
        if err == float("inf"):
            return which
        return f"relative error {err:.3g} of the {which} exceeds the tolerance {shown(tol, self.o.tolerance, storage)}"

    def _refused(self, buffers: int, case_bytes: int, why: str) -> TrialResult:
        """``out_of_memory`` before building: the candidate's buffers, or they and the check's memory, are over
        a limit (:meth:`MemoryBudget.refusal`)."""
        m = self.memory
        memory = MemoryUse(buffer_bytes=buffers, estimated_bytes=buffers + case_bytes, refused=True,
                           limit_bytes=m.limit, free_limit_bytes=m.free_limit)
        return TrialResult("out_of_memory", error=f"refused before running: {why}", details=TrialDetails(memory=memory))

    def reverify(self, config: Mapping[str, Any], seeds: Sequence[int], runs: int) -> TrialResult:
        """Verify ``config`` again on the inputs of ``seeds``, each run ``runs`` times (no timing): its kernels,
        then (on a whole graph) the layer as a user calls it (:mod:`.call`); ``wrong_result`` at the first
        output off the float64 reference."""
        self._collect()
        point = self._point(config)
        if not point.valid:
            return TrialResult("invalid", error="; ".join(point.problems))
        built = self._build(point)
        source_hash = built.source_hash
        storage = lowest_storage(point.kernels)
        worst, coverage = 0.0, None

        def checked(run_case: Callable[[Case], Any], what: str) -> TrialResult | None:
            nonlocal worst, coverage
            for seed in seeds:
                # made per seed, for each pass: a sampled verifier's cases share its input tensors (valid until
                # the next case), so a case made earlier may no longer hold its inputs
                case = self.verifier.case(seed)
                case = case if self.batches is None else self.batches.case_of_variants(case)
                coverage = case.coverage()
                with self._exclusive_device():
                    dev = case.on(self.device)
                    for run in range(runs):
                        got = run_case(dev)
                        self.backend.synchronize()
                        err, which, tol = self.verifier.error(got, case, storage)
                        del got
                        if not err < tol:
                            details = TrialDetails(verified=coverage, fresh_inputs=list(seeds), runs_per_input=runs)
                            return TrialResult("wrong_result", max_error=err, source_hash=source_hash, details=details,
                                               error=f"{what}{self._off_by(err, which, tol, storage)} on fresh input "
                                                     f"{seed} (run {run + 1} of {runs})")
                        worst = max(worst, err)
            return None

        wrong = checked(lambda dev: self._run_case(built, point.kernels, dev), "")
        if wrong is None and self.batches is None:
            del built  # a big graph's layer holds buffers of its own: not both at once
            self._collect()
            call = LayerCall(self.program, self.graph, config, self.backend, self.w.mode)
            wrong = checked(lambda dev: call.results(dev.x, dev.params, dev.dout), CALL_WRONG)
        if wrong is not None:
            return wrong
        return TrialResult("ok", max_error=worst, source_hash=source_hash,
                           details=TrialDetails(verified=coverage, fresh_inputs=list(seeds), runs_per_input=runs))

    def _collect(self) -> None:
        """Free the last trial's memory before the next: a built program's buffers sit in reference cycles
        (the runtime and its bound kernels) that only the cyclic collector frees, and on a big graph a few
        trials' worth of per-edge workspaces took a worker past the machine's memory (killed at 18.7 GB
        on AM, where each trial needs under 5). A small graph's trials are too short to pay for it."""
        if self.verifier.sampled:
            gc.collect()
            if self.device != "cpu" and self.torch.cuda.is_available():
                self.torch.cuda.empty_cache()

    def _exclusive_device(self) -> Any:
        """The GPU's cross-process lock (:mod:`.device_lock`) for a GPU backend; nothing to hold on a CPU."""
        if self.device == "cpu":
            return device_lock(None)
        index = self.torch.cuda.current_device() if self.device == "cuda" else 0
        # wait at most half the trial's timeout: a busy lock fails this trial with its own error, not a kill
        return device_lock(f"{self.device}:{index}", timeout=lock_timeout((self.o.timeout or self.o.first_timeout) / 2))

    def _run(self, run: Callable[[Any, dict[str, Any]], Any], x: Any, params: dict[str, Any]) -> None:
        run(x, params)
        self.backend.synchronize()

    def _time(self, built: Any, kp: Any, dev: Case,
              stop_after: float | None) -> tuple[float, list[float], float | None, PairedTiming | None]:
        """The first run's seconds, the candidate's timed runs (seconds), the trial's time (their median, or
        paired with the reference) and, paired, the ratio, the scale and the reference's time now; no timed
        runs and None when the first run took longer than ``stop_after``. A training workload's run is
        one training step, timed on the host around a synchronization. The verification's run and the first run are
        two of the warm-up's."""
        x, params = dev.x, dev.params
        if self.batches is not None:
            run = self.batches.step(built, params)
        elif self.training:
            from rgtune.codegen.training import train_step

            def run() -> None:
                train_step(built, kp, self.graph, x, params, dev.dout)
                self.backend.synchronize()
        else:
            def run() -> None:
                self._run(built.run, x, params)

        # a sampler workload's run times every fixed batch: its trial's time is per batch (studies of another
        # batches= count of the same sampler compare)
        per = self.batches.num_batches if self.batches is not None else 1
        t = time.perf_counter()
        run()
        first = (time.perf_counter() - t) / per
        if stop_after is not None and first > stop_after:
            return first, [], None, None
        o = replace(self.o, warmup=max(0, self.o.warmup - 2))  # the verification's run and the first one
        if self.backend.times_on_device and not self.training and self.batches is None:  # a forward: device events
            times = list(self.backend.time_runs(built, x, params, o.warmup, o.repeats))
            return first, times, statistics.median(times), None
        if self.reference_run is None or self.training or self.batches is not None:
            times = [t / per for t in _plain_times(run, o)]
            return first, times, statistics.median(times), None
        reference, scale_ms = self.reference_run, self.reference_ms
        assert scale_ms is not None  # calibrated with the reference
        # the full warm-up: it warms the reference too (in a restarted worker it has not run yet)
        times, reference_times = paired_times(run, lambda: self._run(reference, x, params), self.o)
        ratio = statistics.median(c / r for c, r in zip(times, reference_times))
        paired = PairedTiming(ratio, scale_ms, statistics.median(reference_times) * 1e3)
        return first, times, ratio * scale_ms / 1e3, paired


@dataclass(frozen=True)
class _Called:
    """The layer as called: its error against the reference, why it failed, its timed runs (None: not right)."""

    error: float
    why: str
    times: list[float] | None
    warnings: list[str]


def _plain_times(run: Callable[[], Any], options: MeasureOptions) -> list[float]:
    """Seconds of each timed run, after ``options.warmup`` untimed ones."""
    for _ in range(options.warmup):
        run()
    times: list[float] = []
    spent = 0.0
    while len(times) < options.max_repeats and (len(times) < options.repeats or spent < options.min_seconds) \
            and not (len(times) >= MIN_TIMED_RUNS and spent >= options.max_seconds):
        t = time.perf_counter()
        run()
        dt = time.perf_counter() - t
        times.append(dt)
        spent += dt
    return times


def paired_times(run: Callable[[], Any], run_reference: Callable[[], Any], options: MeasureOptions,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """Seconds of each run of the candidate and of the reference, alternating, pair by pair.

    The pairs alternate which of the two runs first (a run right after another kernel may find
    the caches or the clock in another state). The counts of ``options`` (``warmup``, ``repeats``,
    ``min_seconds`` of the candidate's time, ``max_repeats``) apply to the candidate.

    Example (a clock that slows down 2x halfway, as a shared machine does; the ratio is unmoved):
        >>> now = [0.0]
        >>> def tick(cost):
        ...     now[0] += cost * (2.0 if now[0] > 0.5 else 1.0)
        >>> c, r = paired_times(lambda: tick(0.03), lambda: tick(0.01), MeasureOptions(warmup=1, repeats=20),
        ...                     clock=lambda: now[0])
        >>> sorted({round(a / b, 6) for a, b in zip(c, r)}), min(c) < max(c)
        ([3.0], True)
    """
    for _ in range(options.warmup):
        run()
        run_reference()
    times: list[float] = []
    reference: list[float] = []
    spent = 0.0
    while len(times) < options.max_repeats and (len(times) < options.repeats or spent < options.min_seconds) \
            and not (len(times) >= MIN_TIMED_RUNS and spent >= options.max_seconds):
        for is_candidate in ((True, False) if len(times) % 2 == 0 else (False, True)):
            t = clock()
            (run if is_candidate else run_reference)()
            dt = clock() - t
            (times if is_candidate else reference).append(dt)
        spent += times[-1]
    return times, reference


def _watch_parent() -> None:
    """Exit when the parent is gone: its end of the pipe ``multiprocessing`` started this process through
    closes (a forked worker's parent process is the fork server, so the pid would not tell). A daemon
    thread, so that a worker busy in a kernel still notices. The exit is immediate: nothing of a trial is
    the worker's to save."""
    parent = mp.parent_process()
    if parent is None:  # not started by multiprocessing (a test calling _worker_main directly)
        return

    def watch() -> None:
        parent.join()
        os._exit(3)

    threading.Thread(target=watch, name="rgtune-parent-watch", daemon=True).start()


def _take_parents_settings(environ: Mapping[str, str], threads: int) -> None:
    """The parent's environment and torch thread count as they are now: a forked worker's process has the
    fork server's, from when the server started (a ``scoped_env`` setting, ``tune --threads``, a test's
    cache folder would be missed)."""
    os.environ.clear()
    os.environ.update(environ)
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _worker_main(conn: Any, workload: Workload, options: MeasureOptions, parent: int,
                 environ: Mapping[str, str], threads: int) -> None:
    # the parent handles Ctrl-C; a worker killed mid-trial is restarted by it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _take_parents_settings(environ, threads)
    _watch_parent()
    try:
        _say_whose_model(workload, parent)
        session = _Session(workload, options)
        m = session.memory
        conn.send(("ready", (session.backend.device_info(), (m.device, m.limit, m.share_slots, m.free_limit))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("init_error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        kind, *args = msg
        try:
            result = session.measure(*args) if kind == "measure" else session.reverify(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the kernel is this trial's result
            status = "out_of_memory" if is_out_of_memory(e) else "runtime_error"
            result = TrialResult(status, error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
            if getattr(e, "poisons_process", False):
                # e.g. a CUDA illegal address: the context is unusable; the parent starts a fresh worker
                conn.send(("last_result", result))
                return
        conn.send(("result", result))


def _say_whose_model(workload: Workload, parent: int) -> None:
    """Log which code a worker imports for its model, and on whose word: the command of its parent
    process, which made the workload (a worker never takes a model path from the database, even
    when it serves a study that many machines share)."""
    from rgtune.ir.registry import registered_model

    if registered_model(workload.model, workload.model_source) is None:
        logging.getLogger("rgtune.tuner").info(
            "measurement worker %d: importing model %r from %r, as the command of process %d (user %s) named it",
            os.getpid(), workload.model, workload.model_source, parent, _user())


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (a container without one): the uid says it
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


# ----------------------------------------------------------------------- parent side
@contextlib.contextmanager
def _main_script_hidden(keep: bool) -> Iterator[None]:
    """Start a worker without running the user's script in it. Python's ``spawn`` runs the parent's main
    module in the child (as ``__mp_main__``, so that what the child unpickles may refer to it): a script that
    calls ``rgtune.tune()`` at its top level, without ``if __name__ == "__main__":``, would tune again in
    there and fail. The worker needs nothing of it (its target and the workload are rgtune's), so the
    main module's ``__file__`` and ``__spec__``, which tell ``spawn`` to run it, are hidden while the process
    starts. ``keep``: the workload's model is defined in the main script: the worker imports it from there
    (and the script needs the guard, as for any ``spawn``)."""
    main = sys.modules.get("__main__")
    if keep or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


#: what the fork server imports once, for every CPU worker it forks (everything a worker runs but the kernels)
_SERVER_PRELOAD = ["rgtune.tuner.measure"]


def start_method(backend: str) -> str:
    """How a worker of ``backend`` starts: ``"forkserver"`` for a backend whose ``device_type`` is ``"cpu"``
    (see the module's docstring), else ``"spawn"``: a device backend's worker stays a fresh interpreter (a
    process's CUDA state must never be forked, and the server's imports were not measured on a GPU).

    Example:
        >>> start_method("cpu"), start_method("reference"), start_method("cuda")
        ('forkserver', 'forkserver', 'spawn')
    """
    try:
        from rgtune.codegen.base import create

        device = create(backend).device_type
    except Exception:  # noqa: BLE001 - a backend that does not load here: its worker says why, spawned
        return "spawn"
    return "forkserver" if device == "cpu" and "forkserver" in mp.get_all_start_methods() else "spawn"


def _context(backend: str) -> Any:
    method = start_method(backend)
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_SERVER_PRELOAD)  # read when the server starts (once per process)
    return ctx


class WorkerStartError(RuntimeError):
    """The worker could not load the workload (bad dataset, backend unavailable...)."""


class MeasureWorker:
    """Runs trials of one workload in a child process; survives its hangs and crashes."""

    def __init__(self, workload: Workload, options: MeasureOptions | None = None,
                 on_wait: Callable[[], Any] | None = None) -> None:
        """``on_wait`` is called every ``options.heartbeat_s`` seconds while a request runs."""
        self.workload = workload
        self.options = options or MeasureOptions()
        self.on_wait = on_wait
        self._ctx = _context(workload.backend)
        self._proc: Any = None
        self._conn: Any = None
        self.device_info: dict[str, Any] = {}
        #: the worker's memory budget (its limit and how it estimates a candidate, :mod:`.memory`); once started
        self.memory: MemoryBudget | None = None
        self.restarts = 0
        self._started = False
        self._slowest: float | None = None  # the longest request that verified (adaptive timeout)

    def start(self) -> dict[str, Any]:
        """Start the worker (if needed) and return the backend's device info."""
        if self._proc is not None and self._proc.is_alive():
            return self.device_info
        parent, child = self._ctx.Pipe()
        import torch

        proc = self._ctx.Process(target=_worker_main, args=(child, self.workload, self.options, os.getpid(),
                                                            dict(os.environ), torch.get_num_threads()),
                                 daemon=True, name=f"rgtune-measure-{self.workload.model}")
        with _main_script_hidden(keep=(self.workload.model_source or "").startswith("__main__:")):
            proc.start()
        child.close()
        if not parent.poll(self.options.startup_timeout):
            proc.kill()
            raise WorkerStartError(f"the measurement worker did not start within {self.options.startup_timeout:g} s")
        try:
            kind, payload = parent.recv()
        except EOFError:
            proc.join(1)
            raise WorkerStartError(f"the measurement worker died while starting ({_exit_reason(proc.exitcode)})") \
                from None
        if kind != "ready":
            proc.join(5)
            raise WorkerStartError(str(payload))
        self._proc, self._conn = proc, parent
        self.device_info, (device, limit, share_slots, free_limit) = payload
        self.memory = MemoryBudget(device, limit, share_slots, free_limit)
        self._started = True
        return self.device_info

    def measure(self, config: Mapping[str, Any], seed: int = 0, best: float | None = None) -> TrialResult:
        """One trial; never raises for a fault of the kernel (see the module docstring). ``best``: the best
        time so far (seconds): a candidate whose first run takes ``stop_slower`` times longer is stopped."""
        stop = self.options.stop_slower
        # a first run of a few ms says little (cold caches) and stopping it saves nothing
        stop_after = max(best * stop, STOP_MIN_S) if best is not None and stop is not None else None
        result = self._request(("measure", dict(config), seed, stop_after))
        elapsed = result.details.elapsed_s
        if result.status in ("ok", "stopped") and elapsed is not None:
            self._slowest = max(self._slowest or 0.0, elapsed)
        return result

    @property
    def timeout(self) -> float:
        """Seconds the next request may take: ``options.timeout``, or adaptive (see the module docstring)."""
        if self.options.timeout is not None:
            return self.options.timeout
        if self._slowest is None:
            return self.options.first_timeout
        return max(ADAPTIVE_TIMEOUT_MIN, ADAPTIVE_TIMEOUT_FACTOR * self._slowest)

    def reverify(self, config: Mapping[str, Any], seeds: Sequence[int], runs: int = 2) -> TrialResult:
        """``config`` verified again on the inputs of ``seeds``, each run ``runs`` times, not timed:
        ``ok`` (``max_error`` the largest error seen) or ``wrong_result`` (see the module docstring)."""
        return self._request(("verify", dict(config), list(seeds), runs))

    def _request(self, message: tuple[Any, ...]) -> TrialResult:
        if self._proc is None or not self._proc.is_alive():
            if self._started:
                self.restarts += 1  # the last worker hung or crashed
                try:
                    self.start()
                except WorkerStartError as e:  # e.g. out of memory or disk for a moment: this trial's outcome
                    return TrialResult("failed", error=f"the measurement worker could not be restarted: {e}")
            else:
                self.start()
        t0 = time.perf_counter()
        oom_kills = _oom_kills()
        try:
            self._conn.send(message)
            ready = self._wait(t0)
        except (BrokenPipeError, OSError):
            ready = True  # the recv below reports the death
        if not ready:
            self._kill()
            adaptive = "" if self.options.timeout is not None else \
                (" (the first trial's limit)" if self._slowest is None else
                 f" ({ADAPTIVE_TIMEOUT_FACTOR:g} x the slowest verified trial so far, at least {ADAPTIVE_TIMEOUT_MIN:g} s)")
            return TrialResult("timeout", error=f"no result within {self.timeout:g} s{adaptive}; worker killed",
                               details=TrialDetails(elapsed_s=time.perf_counter() - t0, timeout_s=self.timeout))
        try:
            kind, result = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self._proc = None
            if code == -signal.SIGKILL and _oom_kills() > oom_kills:  # the kernel's out-of-memory killer
                return TrialResult("out_of_memory", error="the worker was killed by the system's out-of-memory "
                                   "killer (SIGKILL); worker restarted")
            return TrialResult("runtime_error", error=f"the kernel crashed its process ({_exit_reason(code)}); "
                               "worker restarted")
        result = result.with_details(elapsed_s=time.perf_counter() - t0)
        if kind == "last_result":  # the worker exits after it (its process is unusable)
            self._proc.join(10)
            self._proc = None
        paired = result.details.paired
        if paired is not None and self.options.reference_ms is None:
            # a restarted worker times on the same scale instead of calibrating its own
            self.options = replace(self.options, reference_ms=paired.reference_ms)
        return result

    def _wait(self, t0: float) -> bool:
        """Wait for the worker's answer until the timeout; ``on_wait()`` every ``heartbeat_s`` meanwhile."""
        while True:
            left = self.timeout - (time.perf_counter() - t0)
            if left <= 0:
                return False
            if self._conn.poll(min(left, self.options.heartbeat_s)):
                return True
            if self.on_wait is not None:
                self.on_wait()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> "MeasureWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def measure_rounds(workload: Workload, configs: Mapping[str, Mapping[str, Any]], rounds: int,
                   options: MeasureOptions | None = None,
                   on_result: Callable[[str, int, TrialResult], None] | None = None) -> dict[str, list[float | None]]:
    """Each configuration's time (seconds, the trial's median; None unless ``ok``) in each of ``rounds``.

    One worker measures them all, every round in a new shuffled order (seeded by the round), so that a
    drift of the machine's state favours no configuration; the kernels compiled in the first round are
    cached for the later ones. Single trials on a shared machine differ by tens of percent: comparing
    schedules that are a few percent apart needs the median of such rounds. ``on_result(name, round,
    result)`` sees every measurement as it finishes (e.g. to record it as a trial).

    Example:
        >>> from rgtune.tuner.workload import Workload
        >>> w = Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3", 8, 8, 1, "reference")
        >>> t = measure_rounds(w, {"default": {}}, rounds=2, options=MeasureOptions(repeats=2, warmup=1))
        >>> len(t["default"]), all(x > 0 for x in t["default"])
        (2, True)
    """
    times: dict[str, list[float | None]] = {name: [] for name in configs}
    with MeasureWorker(workload, options) as worker:
        worker.start()
        for rnd, name in interleaved(configs, rounds):
            res = worker.measure(configs[name], seed=rnd)
            times[name].append(res.median if res.status == "ok" else None)
            if on_result is not None:
                on_result(name, rnd, res)
    return times


def interleaved(names: Iterable[str], rounds: int, salt: str = "") -> Iterator[tuple[int, str]]:
    """``(round, name)``: every name once per round, each round in a new shuffled order (seeded by
    ``salt`` and the round), so that a drift of the machine's state favours no name.

    Example:
        >>> [name for _, name in interleaved(["a", "b", "c"], 2)]
        ['a', 'c', 'b', 'b', 'c', 'a']
    """
    names = sorted(names)
    for rnd in range(rounds):
        order = list(names)
        random.Random(f"{salt}{rnd}" if salt else rnd).shuffle(order)
        yield from ((rnd, name) for name in order)


def combine_measurements(results: Sequence[TrialResult]) -> TrialResult:
    """One schedule's ``ok`` measurements as one: the median of their times (each one's median), their
    runs together, the largest error; the details are the first one's, with ``measurements_ms`` (each
    one's time), ``device_wait_s`` their waits for the GPU summed, ``kernel_ms`` and ``call_ms`` the medians
    of theirs, and, when paired, ``vs_reference`` the median of their ratios.

    Example:
        >>> r = combine_measurements([TrialResult("ok", median=m, times=[m, m], max_error=e)
        ...                           for m, e in ((0.003, 1e-6), (0.002, 3e-6), (0.009, 2e-6))])
        >>> r.median, len(r.times), r.max_error, r.details.measurements_ms
        (0.003, 6, 3e-06, [3.0, 2.0, 9.0])
    """
    if not results or any(r.status != "ok" or r.median is None for r in results):
        raise ValueError("combine_measurements takes one or more ok measurements")
    first = results[0]
    ratios = [r.details.paired.vs_reference for r in results if r.details.paired is not None]
    paired = first.details.paired
    if paired is not None and len(ratios) == len(results):
        paired = replace(paired, vs_reference=statistics.median(ratios))
    details = replace(first.details, measurements_ms=[r.median * 1e3 for r in results],
                      device_wait_s=sum(r.details.device_wait_s for r in results), paired=paired,
                      kernel_ms=_median_of(r.details.kernel_ms for r in results),
                      call_ms=_median_of(r.details.call_ms for r in results))
    errors = [r.max_error for r in results if r.max_error is not None]
    return replace(first, median=statistics.median(r.median for r in results),
                   times=[t for r in results for t in r.times], max_error=max(errors) if errors else None,
                   details=details)


def _median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there (None: none is)."""
    there = [v for v in values if v is not None]
    return statistics.median(there) if there else None


def median_ok(times: Sequence[float | None]) -> float | None:
    """The median of a configuration's ``ok`` rounds of :func:`measure_rounds` (None: no round was ok).

    Example:
        >>> median_ok([3.0, None, 1.0, 2.0]), median_ok([None])
        (2.0, None)
    """
    ok = [t for t in times if t is not None]
    return statistics.median(ok) if ok else None


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"




def _on_device(t: Any, device: str) -> Any:
    import torch

    return t.to(device=device, dtype=torch.float32)


def _oom_kills() -> int:
    """The kernel's count of processes its out-of-memory killer killed (``/proc/vmstat``; 0 where unknown)."""
    try:
        for line in open("/proc/vmstat"):
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
