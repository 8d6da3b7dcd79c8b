"""A frozen trial history: a database's ``ok`` trials in one compact file, and back into a database.

The live quality of the cost model moves with the machine's noise and with the trials a study
happens to draw; a frozen history does not. :func:`freeze` writes the workloads of a database
(their graph's name, content hash and statistics, the sampler of one tuned for batches, their
device, and every ``ok`` measurement with its knobs) to a gzip'd JSON file; :func:`thaw` loads one
into a database (an in-memory SQLite one by default) on which :func:`~rgtune.costmodel.evaluate_holdout` computes the
same metrics on every machine, so the test command can assert them. The features are computed
from the knobs by the code under test, not stored: a change of the features or of the model is
measured on the same trials.

Per workload the knobs are stored as columns: each knob's distinct values once, each trial a row of
indexes into them (a few thousand trials take a few hundred kB).

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.db import DeviceInfo, TrialDatabase
    >>> from rgtune.db.trial_result import TrialResult
    >>> db = TrialDatabase("sqlite://")
    >>> g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
    >>> w = db.ensure_workload("rgcn", g, DeviceInfo(name="cpu0", backend="cpu"), in_dim=8, out_dim=8)
    >>> for ms, layout in ((2.0, "csr_dst"), (3.0, "coo")):
    ...     db.record_result(db.start_trial(w, {"layout.edges": layout}), TrialResult("ok", median=ms / 1e3))
    >>> import io
    >>> buffer = io.BytesIO()
    >>> freeze(db, buffer)
    2
    >>> copy = thaw(io.BytesIO(buffer.getvalue()))
    >>> [(t.median_ms, t.knobs) for t in copy.history(copy.workloads()[0])]
    [(2.0, {'layout.edges': 'csr_dst'}), (3.0, {'layout.edges': 'coo'})]
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from rgtune.db import TrialDatabase

__all__ = ["FORMAT", "freeze", "thaw"]

FORMAT = "rgtune-frozen-history"
#: 2 added a workload's sampler (``batches``); a history without sampler workloads is written as 1, which
#: every reader reads (one that did not know samplers would take a sampler's trials for the whole graph's)
FORMAT_VERSION = 2


@dataclass(frozen=True)
class _Stats:
    values: Mapping[str, Any]

    def as_dict(self) -> Mapping[str, Any]:
        return self.values


@dataclass(frozen=True)
class _FrozenGraph:
    """What :meth:`TrialDatabase.ensure_graph` needs of a graph: its name, content hash and statistics."""

    name: str
    content_hash: str
    stats: _Stats


def _devices(db: "TrialDatabase") -> dict[str, dict[str, Any]]:
    import sqlalchemy as sa

    from rgtune.db.schema import Device

    cols = ("name", "backend", "architecture", "runtime", "compiler", "extra")
    with db.session() as s:
        rows = s.execute(sa.select(Device.fingerprint, *(getattr(Device, c) for c in cols))).all()
    return {str(r[0]): {c: (dict(v or {}) if c == "extra" else str(v or "")) for c, v in zip(cols, r[1:])}
            for r in rows}


def freeze(db: "TrialDatabase", out: str | Path | IO[bytes], *, backend: str | None = None) -> int:
    """Write the ``ok`` trials of ``db``'s workloads (of ``backend``, default all) to ``out`` (a path or a
    binary file); returns how many trials were written."""
    from rgtune.costmodel.history import graph_stats

    stats, devices = graph_stats(db), _devices(db)
    workloads: list[dict[str, Any]] = []
    total = 0
    for w in db.workloads(**({"backend": backend} if backend else {})):
        trials = [t for t in db.history(w, status="ok") if t.median_ms is not None and t.median_ms > 0]
        if not trials:
            continue
        names = sorted({k for t in trials for k in t.knobs})
        # each knob's distinct values, in order of first use -> their index (JSON values: hashable scalars)
        values: dict[str, dict[Any, int]] = {k: {} for k in names}
        rows = [[round(float(t.median_ms), 6), [values[k].setdefault(t.knobs.get(k), len(values[k])) for k in names]]
                for t in trials]
        name, content_hash, graph_stats_ = stats[w.id]
        workloads.append({
            "model": w.model, "in_dim": w.in_dim, "out_dim": w.out_dim, "heads": w.heads, "options": w.options,
            "mode": w.mode, "backend": w.backend, "precision": w.precision,
            "device": devices[w.device_fingerprint],
            "graph": {"name": name, "content_hash": content_hash, "stats": graph_stats_},
            "knobs": [[k, list(values[k])] for k in names], "trials": rows,
            **({"batches": w.batches} if w.batches else {})})
        total += len(rows)
    version = FORMAT_VERSION if any("batches" in w for w in workloads) else 1
    payload = json.dumps({"format": FORMAT, "format_version": version, "workloads": workloads},
                         sort_keys=True, separators=(",", ":")).encode()
    data = gzip.compress(payload, compresslevel=9, mtime=0)  # mtime 0: the same history, the same bytes
    if isinstance(out, (str, Path)):
        Path(out).write_bytes(data)
    else:
        out.write(data)
    return total


def thaw(source: str | Path | IO[bytes], db: "TrialDatabase | None" = None) -> "TrialDatabase":
    """The frozen history ``source`` loaded into ``db`` (default a new in-memory SQLite database)."""
    from rgtune.db import DeviceInfo, TrialDatabase

    raw = Path(source).read_bytes() if isinstance(source, (str, Path)) else source.read()
    payload = json.loads(gzip.decompress(raw))
    if payload.get("format") != FORMAT:
        raise ValueError(f"{source}: not a frozen rgtune history (format {payload.get('format')!r}, "
                         f"expected {FORMAT!r})")
    if int(payload.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{source}: frozen-history format {payload['format_version']} is newer than this rgtune "
                         f"reads ({FORMAT_VERSION}); upgrade rgtune")
    db = db if db is not None else TrialDatabase("sqlite://")
    for w in payload["workloads"]:
        g = w["graph"]
        graph = _FrozenGraph(g["name"], g["content_hash"], _Stats(g["stats"]))
        rec = db.ensure_workload(w["model"], graph, DeviceInfo(**w["device"]), in_dim=w["in_dim"],
                                 out_dim=w["out_dim"], heads=w["heads"], backend=w["backend"], mode=w["mode"],
                                 options=w["options"], precision=w["precision"], batches=w.get("batches", ""))
        knobs = w["knobs"]
        db.import_measured(rec, (({name: choices[i] for (name, choices), i in zip(knobs, row)}, float(ms))
                                 for ms, row in w["trials"]))
    return db
