"""The typed outcome of one trial: what the measurement worker returns, the tuner steers by, the database stores.

A :class:`TrialResult` is the status, the times (seconds), the compile time, the error against the
reference, the source hash and the error message, plus :class:`TrialDetails`: everything else the
trial measured (what verification covered and how long it took, a raised tolerance, the first run,
paired timing, the wait for the GPU's lock, memory, the backend's facts about the build, the cost
model's prediction ...). The database keeps the columns it queries (``median_ms``, ``peak_bytes``,
``predicted_ms``, ...) and the details as one JSON object (``rg_trials.details``):
:meth:`TrialDetails.to_json` writes it and :meth:`TrialDetails.from_json` reads it back; nothing else
reads or writes that object by its keys. Its keys are those rgtune has always written, so rows of an
older rgtune read back too (their backend facts sat among the keys: they become :attr:`TrialDetails.build`).

Example:
    >>> r = TrialResult("ok", median=0.002, times=[0.002, 0.003],
    ...                 details=TrialDetails(verified=Coverage(), memory=MemoryUse(peak_bytes=4096)))
    >>> r.ok_ms, r.details.to_json()
    (2.0, {'peak_bytes': 4096, 'verified': {'rows': 'all'}})
    >>> TrialDetails.from_json(r.details.to_json()) == r.details
    True
    >>> TrialResult("fine")
    Traceback (most recent call last):
    ...
    ValueError: unknown trial status 'fine'; choose one of ['ok', 'invalid', 'compile_error', 'runtime_error', 'wrong_result', 'timeout', 'pruned', 'stopped', 'out_of_memory', 'failed']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Self

__all__ = ["TrialStatus", "FINAL_STATUSES", "Coverage", "PairedTiming", "MemoryUse", "TrialDetails", "TrialResult"]


class TrialStatus(StrEnum):
    """Where a trial stands. Only ``ok`` (verified against the reference, timed) can ever be best."""

    RUNNING = "running"  # written before measuring; a crash leaves it for mark_stale_running
    OK = "ok"
    INVALID = "invalid"  # violates a declared constraint: recorded, never compiled
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    WRONG_RESULT = "wrong_result"  # ran, but differs from the float64 reference
    TIMEOUT = "timeout"
    PRUNED = "pruned"  # skipped on the cost model's word
    STOPPED = "stopped"  # its first run was much slower than the best so far: not timed further
    OUT_OF_MEMORY = "out_of_memory"  # refused before running (estimated over the memory limit), or failed to allocate
    FAILED = "failed"  # anything else, including a worker that died mid-trial


FINAL_STATUSES = frozenset(TrialStatus) - {TrialStatus.RUNNING}


@dataclass(frozen=True)
class Coverage:
    """What a trial's verification checked: every row (``rows`` None), or sampled destination rows with
    their in-neighbourhoods (the nodes and edges they read, the longest in-edge list)."""

    rows: int | None = None
    nodes: int | None = None
    edges: int | None = None
    max_in_degree: int | None = None

    @property
    def sampled(self) -> bool:
        return self.rows is not None


@dataclass(frozen=True)
class PairedTiming:
    """A paired trial's figures: the median ratio of its runs to the reference's, the reference's time
    that scales the ratio (ms), and the reference's median in this trial (ms: the machine's drift)."""

    vs_reference: float
    reference_ms: float
    reference_now_ms: float


@dataclass(frozen=True)
class MemoryUse:
    """A trial's memory: its measured peak (growth over the worker's memory), the estimate of the
    candidate's buffers and of them with the verification's inputs and results, and, for a candidate
    refused before it ran, the limits it was over."""

    peak_bytes: int | None = None
    buffer_bytes: int | None = None
    estimated_bytes: int | None = None
    refused: bool = False
    limit_bytes: int | None = None  # the user's limit on the buffers
    free_limit_bytes: int | None = None  # the share of the free memory a trial may take

    @property
    def recorded_bytes(self) -> int | None:
        """What the trial's ``peak_bytes`` column holds: the peak, or for a refused candidate its estimate."""
        if self.peak_bytes is not None:
            return self.peak_bytes
        return self.estimated_bytes if self.refused else None


@dataclass(frozen=True)
class TrialDetails:
    """What a trial measured besides its status, times and error (see the module docstring)."""

    verified: Coverage | None = None
    verify_seconds: float | None = None  # the float64 reference's time (the oracle)
    verify_run_seconds: float | None = None  # the candidate's own verification run
    tolerance: float | None = None  # set when raised over the base tolerance (float32's own error, long sums)
    first_run_ms: float | None = None  # what the early stop compared
    paired: PairedTiming | None = None
    device_wait_s: float = 0.0  # waited for the GPU's cross-process lock
    memory: MemoryUse = field(default_factory=MemoryUse)
    cache_hit: bool | None = None  # the kernels came from the compile cache
    build: Mapping[str, Any] = field(default_factory=dict)  # the backend's facts about the build (JSON values)
    elapsed_s: float | None = None  # the parent's wall time for the request
    timeout_s: float | None = None  # the limit a timed-out trial ran into
    measurements_ms: list[float] = field(default_factory=list)  # each measurement of a rechecked schedule
    predicted_ms: float | None = None  # the cost model's prediction
    fresh_inputs: list[int] = field(default_factory=list)  # a re-verification's input seeds ...
    runs_per_input: int | None = None  # ... and how often each ran
    kernel_ms: float | None = None  # the median of the kernels' runs (a training step: its kernels, one go)
    call_ms: float | None = None  # the median of the layer's runs as a user calls it (``layer(x)``, its backward)
    objective: str | None = None  # which of the two is the trial's time: "kernels" or "call"
    call_warnings: list[str] = field(default_factory=list)  # what the layer's call warned (a failed CUDA graph)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``rg_trials.details``: only what this trial has."""
        m, p, v = self.memory, self.paired, self.verified
        out: dict[str, Any] = {
            "verify_seconds": self.verify_seconds, "verify_run_seconds": self.verify_run_seconds,
            "tolerance": self.tolerance, "first_run_ms": self.first_run_ms,
            "device_wait_s": self.device_wait_s or None, "cache_hit": self.cache_hit,
            "peak_bytes": m.peak_bytes, "buffer_bytes": m.buffer_bytes, "estimated_bytes": m.estimated_bytes,
            "memory_refused": m.refused or None, "memory_limit_bytes": m.limit_bytes,
            "free_limit_bytes": m.free_limit_bytes, "elapsed": self.elapsed_s, "timeout_s": self.timeout_s,
            "measurements_ms": self.measurements_ms or None, "predicted_ms": self.predicted_ms,
            "inputs": self.fresh_inputs or None, "runs": self.runs_per_input, "build": dict(self.build) or None,
            "kernel_ms": self.kernel_ms, "call_ms": self.call_ms, "objective": self.objective,
            "call_warnings": self.call_warnings or None,
        }
        if v is not None:
            out["verified"] = {"rows": "all"} if not v.sampled else \
                {"sampled": True, "rows": v.rows, "nodes": v.nodes, "edges": v.edges, "max_in_degree": v.max_in_degree}
        if p is not None:
            out.update(timing="paired", vs_reference=p.vs_reference, reference_ms=p.reference_ms,
                       reference_now_ms=p.reference_now_ms)
        return {k: out[k] for k in sorted(out) if out[k] is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Read back what :meth:`to_json` wrote (or an older rgtune: its keys not named here are the backend's)."""
        d = dict(data)
        take = d.pop
        verified = take("verified", None)
        coverage = None if verified is None else Coverage() if verified.get("rows") == "all" else \
            Coverage(verified.get("rows"), verified.get("nodes"), verified.get("edges"), verified.get("max_in_degree"))
        paired = PairedTiming(take("vs_reference"), take("reference_ms"), take("reference_now_ms")) \
            if take("timing", None) == "paired" else None
        memory = MemoryUse(take("peak_bytes", None), take("buffer_bytes", None), take("estimated_bytes", None),
                           bool(take("memory_refused", False)), take("memory_limit_bytes", None),
                           take("free_limit_bytes", None))
        details = cls(coverage, take("verify_seconds", None), take("verify_run_seconds", None), take("tolerance", None),
                      take("first_run_ms", None), paired, take("device_wait_s", 0.0), memory, take("cache_hit", None),
                      {}, take("elapsed", None), take("timeout_s", None), list(take("measurements_ms", [])),
                      take("predicted_ms", None), list(take("inputs", [])), take("runs", None), take("kernel_ms", None),
                      take("call_ms", None), take("objective", None), list(take("call_warnings", [])))
        build = take("build", {})
        return replace(details, build={**d, **build})  # what is left of an older row: its backend's facts


@dataclass(frozen=True)
class TrialResult:
    """One trial's outcome (see the module docstring); ``median`` and ``times`` in seconds."""

    status: str
    median: float | None = None
    times: list[float] = field(default_factory=list)
    compile_seconds: float | None = None
    max_error: float | None = None
    source_hash: str | None = None
    error: str | None = None
    details: TrialDetails = field(default_factory=TrialDetails)

    def __post_init__(self) -> None:
        if self.status not in FINAL_STATUSES:
            choices = [s.value for s in TrialStatus if s in FINAL_STATUSES]
            raise ValueError(f"unknown trial status {self.status!r}; choose one of {choices}")

    @property
    def ok_ms(self) -> float | None:
        """The trial's time in ms when it is ``ok`` (verified and timed); else None."""
        return self.median * 1e3 if self.status == TrialStatus.OK and self.median is not None else None

    def with_details(self, **changes: Any) -> Self:
        """This result with some of its :class:`TrialDetails` changed."""
        return replace(self, details=replace(self.details, **changes))
