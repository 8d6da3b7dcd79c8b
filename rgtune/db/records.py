"""Plain values the trial database hands in and out: device info, records, exports (a trial's status and
details: :mod:`.trial_result`).

Queries return frozen dataclasses, not ORM objects, so that a result stays valid after its
session closed and can go straight to ``--json`` / ``--csv``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import IO, Any, Self

from rgtune.db.trial_result import TrialDetails

__all__ = [
    "DeviceInfo",
    "TrialRecord",
    "WorkloadRecord",
    "ConfirmationRecord",
    "canonical_json",
    "canonical_knobs",
    "sha256_hex",
    "records_to_json",
    "write_csv",
]


def _json_default(value: Any) -> Any:
    # numpy / torch scalars and arrays show up in knob values; store them as plain JSON.
    for attr in ("item", "tolist"):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                return fn()
            except (TypeError, ValueError):
                continue
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} value {value!r} cannot be stored as JSON")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces; NaN/inf are refused (they are not JSON).

    Example:
        >>> canonical_json({"b": (1, 2), "a": 0.5})
        '{"a":0.5,"b":[1,2]}'
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_json_default)
    except ValueError as e:
        raise ValueError(f"cannot store {value!r} as JSON: {e}") from None


def canonical_knobs(knobs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Knob values as stored (plain JSON types, keys sorted) and their sha256: the schedule key.

    Example:
        >>> a, h1 = canonical_knobs({"tile": 32, "fuse": True})
        >>> b, h2 = canonical_knobs({"fuse": True, "tile": 32})
        >>> a == b and h1 == h2, list(a)
        (True, ['fuse', 'tile'])
    """
    if not isinstance(knobs, Mapping):
        raise TypeError(f"knob values must be a mapping of name -> value, got {type(knobs).__name__}")
    if any(not isinstance(k, str) for k in knobs):
        raise TypeError(f"knob names must be strings, got {sorted(map(repr, knobs))}")
    text = canonical_json(dict(knobs))
    return json.loads(text), sha256_hex(text)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_DEVICE_KEYS: dict[str, tuple[str, ...]] = {
    "name": ("name", "device"),
    "architecture": ("architecture", "arch", "compute_capability"),
    "runtime": ("runtime", "driver"),
    "compiler": ("compiler",),
    "backend": ("backend",),
}


@dataclass(frozen=True)
class DeviceInfo:
    """A device and its software stack; two timings compare only on an identical one.

    ``extra`` holds everything else the backend reports; it must be stable facts (versions,
    sizes), not readings (temperature, free memory), because every field is in the fingerprint.

    Example:
        >>> d = DeviceInfo.from_mapping({"backend": "cpu", "device": "x86_64", "compiler": "gcc 12", "omp_threads": 16})
        >>> d.name, d.compiler, d.extra
        ('x86_64', 'gcc 12', {'omp_threads': 16})
        >>> len(d.fingerprint)
        64
    """

    name: str
    backend: str
    architecture: str = ""
    runtime: str = ""
    compiler: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, info: Mapping[str, Any]) -> Self:
        """From a backend's ``device_info()`` dict: known keys become columns, the rest ``extra``."""
        rest = dict(info)
        cols: dict[str, str] = {}
        for col, keys in _DEVICE_KEYS.items():
            for k in keys:
                if k in rest and rest[k] is not None:
                    cols[col] = str(rest.pop(k))
                    break
        if "backend" not in cols:
            raise ValueError(f"device info needs a 'backend' entry, got keys {sorted(info)}")
        cols.setdefault("name", cols["backend"])
        return cls(extra=rest, **cols)

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json({f.name: getattr(self, f.name) for f in fields(self)}))


def _iso(value: datetime | None) -> str | None:
    # Stored naive, always UTC: say so in the export.
    return value.replace(tzinfo=UTC).isoformat(timespec="microseconds") if value is not None else None


class _Exportable:
    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps as ISO 8601 strings with their UTC offset)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = _iso(v) if isinstance(v, datetime) else v.to_json() if isinstance(v, TrialDetails) else v
        return out


@dataclass(frozen=True)
class WorkloadRecord(_Exportable):
    """A workload with the names of its graph and device, and a summary of its trials."""

    id: int
    model: str
    dataset: str  # the graph's name
    graph_hash: str
    device: str  # the device's name
    device_fingerprint: str
    backend: str
    mode: str
    in_dim: int
    out_dim: int
    heads: int
    study_name: str
    created_at: datetime
    options: str = ""  # the model's options, canonical text ("" for none)
    batches: str = ""  # the sampler the workload's trials were timed on, canonical text ("": the whole graph)
    precision: str = "fp32"  # the storage types its schedules may use (tune --precision)
    num_trials: int = 0
    num_ok: int = 0
    best_ms: float | None = None  # the fastest single ok measurement (best() may confirm another)


@dataclass(frozen=True)
class TrialRecord(_Exportable):
    """One trial with its workload's identity and its schedule's knob values."""

    id: int
    workload_id: int
    model: str
    dataset: str
    device: str
    backend: str
    mode: str
    in_dim: int
    out_dim: int
    heads: int
    study_name: str
    schedule_id: int
    schedule_hash: str
    knobs: dict[str, Any]
    optuna_trial: int | None
    status: str
    median_ms: float | None
    times_ms: list[float] | None
    compile_s: float | None
    max_error: float | None
    predicted_ms: float | None
    source_hash: str | None
    rgtune_version: str
    error: str | None
    worker: str | None
    started_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime | None
    options: str = ""  # the workload's model options, canonical text
    batches: str = ""  # the sampler the workload's trials were timed on, canonical text ("": the whole graph)
    precision: str = "fp32"  # the storage types the workload's schedules may use (tune --precision)
    confirmation_id: int | None = None  # a round of this confirmation (None: a trial of the search)
    #: fresh inputs its schedule passed re-verification on (set by ``TrialDatabase.best``; None elsewhere)
    verified_inputs: int | None = None
    peak_bytes: int | None = None  # the trial's memory growth (or, refused, its estimated need)
    details: TrialDetails | None = None  # what the trial verified and measured besides its times


@dataclass(frozen=True)
class ConfirmationRecord(_Exportable):
    """The fastest schedules of a workload timed again side by side (see ``TrialDatabase.best``)."""

    id: int
    workload_id: int
    schedules: int
    rounds: int
    worker: str | None
    started_at: datetime
    finished_at: datetime | None  # None: interrupted (or still running)


@dataclass(frozen=True)
class VerificationRecord(_Exportable):
    """A schedule of a workload verified again on fresh inputs (see ``TrialDatabase.record_verification``)."""

    id: int
    workload_id: int
    schedule_hash: str
    confirmation_id: int | None
    status: str  # ok or wrong_result
    inputs: int
    runs: int
    max_error: float | None
    error: str | None
    source_hash: str | None
    worker: str | None
    created_at: datetime


def records_to_json(records: Iterable[_Exportable], indent: int | None = 2) -> str:
    """``--json``: a JSON list of :meth:`as_dict` rows.

    Example:
        >>> records_to_json([], indent=None)
        '[]'
    """
    return json.dumps([r.as_dict() for r in records], indent=indent, allow_nan=False, default=_json_default)


def write_csv(records: Sequence[_Exportable], stream: IO[str]) -> None:
    """``--csv``: one row per record; nested values (knobs, times) as compact JSON in their cell."""
    rows = [r.as_dict() for r in records]
    if not rows:
        return
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: canonical_json(v) if isinstance(v, (dict, list)) else ("" if v is None else v) for k, v in row.items()})


def finite_or_none(value: float | None, what: str) -> float | None:
    """``value`` as a float; NaN and infinities are refused (they break ordering and JSON)."""
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return v
