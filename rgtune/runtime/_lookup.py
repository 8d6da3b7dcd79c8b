"""Private helpers of :mod:`rgtune.runtime`: backends, graphs, the database lookup, the tune command.

Example:
    >>> print(tune_command("rgcn", "aifb", 64, 64, 1, "cpu", "results.db"))
    tune --model rgcn --dataset aifb --hidden 64 --backend cpu --db results.db
"""

from __future__ import annotations

import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from rgtune.codegen.base import AUTO_ORDER, Backend, BackendError, available_backends, create
from rgtune.data import HeteroGraph, as_hetero_graph, load_dataset
from rgtune.data.datasets import dataset_info
from rgtune.data.errors import UnknownDatasetError
from rgtune.db.records import DeviceInfo
from rgtune.ir.registry import model_spec, parse_key

if TYPE_CHECKING:  # the database is imported where it is used: an exported layer loads without SQLAlchemy
    from rgtune.db import TrialDatabase, TrialRecord, WorkloadRecord

class TunedScheduleWarning(UserWarning):
    """The layer runs a schedule other than the best one tuned for this workload on this device."""


def check_model(model: str, options: Mapping[str, Any] | str | None = None) -> tuple[str, str]:
    """The model's registered name and its options as canonical text (``ValueError`` for an unknown
    model or a bad option, naming the valid ones)."""
    spec = model_spec(model)
    return spec.name, spec.key(options)


def resolve_backend(name: str | Backend) -> Backend:
    """A backend instance: ``"auto"`` is CUDA if usable, else the CPU backend, else ``reference``."""
    if isinstance(name, Backend):
        return name
    if name == "auto":
        usable = available_backends()
        for candidate in AUTO_ORDER:
            if usable.get(candidate, (False, ""))[0]:
                return create(candidate)
        raise BackendError(f"no backend can run here: {usable}")
    backend = create(name)
    ok, why = type(backend).available()
    if not ok:
        raise BackendError(f"backend {name!r} cannot run here: {why}")
    return backend


def resolve_graph(graph: Any, data_dir: str | Path | None = None) -> HeteroGraph:
    """A :class:`HeteroGraph` (a PyG ``HeteroData`` or a DGL graph converted), or a dataset name (``"aifb"``,
    ``"synthetic:..."``) loaded with ``data_dir``."""
    if isinstance(graph, str):
        return load_dataset(graph, root=data_dir)
    try:
        return as_hetero_graph(graph)
    except TypeError:
        raise TypeError(f"graph must be a rgtune HeteroGraph, a PyG HeteroData, a DGL graph or a dataset name, got "
                        f"{type(graph).__name__}") from None


def fingerprint(backend: Backend) -> str:
    """This machine's device fingerprint for ``backend`` (what the database keys timings by)."""
    return DeviceInfo.from_mapping(backend.device_info()).fingerprint


def graph_signature(graph: HeteroGraph) -> dict[str, Any]:
    """What identifies a graph's schema and content (stored in exports, compared on load)."""
    return {
        "name": graph.name,
        "content_hash": graph.content_hash,
        "ntypes": list(graph.ntypes),
        "canonical_etypes": [list(c) for c in graph.canonical_etypes],
        "num_nodes": {t: graph.num_nodes(t) for t in graph.ntypes},
        "num_edges": graph.num_edges(),
    }


def is_dataset_name(name: str) -> bool:
    try:
        dataset_info(name)
    except UnknownDatasetError:
        return False
    return True


def tune_call(model: str, in_dim: int, out_dim: int, heads: int, backend: str, db: str | None,
              mode: str = "inference", options: str = "", batches: str = "", precision: str = "fp32") -> str:
    """The Python call that tunes a graph that is not a dataset (``graph``: the caller's own object).

    Example:
        >>> print(tune_call("rgcn", 16, 4, 1, "cpu", "r.db", "training", "num_bases=30"))
        rgtune.tune('rgcn', graph, in_dim=16, out_dim=4, backend='cpu', mode='training', options='num_bases=30', db='r.db')
    """
    args = [repr(model), "graph"]
    args += [f"hidden={in_dim}"] if in_dim == out_dim else [f"in_dim={in_dim}", f"out_dim={out_dim}"]
    args += [f"heads={heads}"] * (heads != 1) + [f"backend={backend!r}"] + [f"mode={mode!r}"] * (mode != "inference")
    args += [f"options={options!r}"] * bool(options) + [f"batches={batches!r}"] * bool(batches)
    args += [f"precision={precision!r}"] * (precision != "fp32") + [f"db={db!r}"] * bool(db)
    return f"rgtune.tune({', '.join(args)})"


def tune_command(model: str, dataset: str, in_dim: int, out_dim: int, heads: int, backend: str,
                 db: str | None, mode: str = "inference", options: str = "", batches: str = "",
                 precision: str = "fp32") -> str:
    """The command that records a schedule for this workload (``options``: the model's, canonical text;
    ``batches``: the sampler's, ``""`` for the whole graph).

    Example:
        >>> print(tune_command("hgt", "aifb", 64, 64, 2, "cpu", None, mode="training"))
        tune --model hgt --dataset aifb --hidden 64 --heads 2 --backend cpu --mode training
        >>> print(tune_command("rgcn", "aifb", 16, 4, 1, "cpu", "r.db", options="num_bases=30"))
        tune --model rgcn --dataset aifb --in-dim 16 --out-dim 4 --model-opt num_bases=30 --backend cpu --db r.db
    """
    sizes = ["--hidden", str(in_dim)] if in_dim == out_dim else ["--in-dim", str(in_dim), "--out-dim", str(out_dim)]
    parts = ["tune", "--model", model, "--dataset", dataset, *sizes]
    for name, value in parse_key(options).items():
        parts += ["--model-opt", f"{name}={value}"]
    if heads != 1:
        parts += ["--heads", str(heads)]
    parts += ["--backend", backend] + (["--mode", mode] if mode != "inference" else [])
    parts += (["--batches", batches] if batches else []) + (["--precision", precision] if precision != "fp32" else [])
    parts += ["--db", db] if db else []
    return shlex.join(parts)


# ---------------------------------------------------------------------- the database
def shown_db(db: "str | TrialDatabase | None") -> str | None:
    """``db`` as warnings, hints and exported files show it: as given, but never with its password.

    Example:
        >>> shown_db("postgresql+psycopg://u:s3cret@h/rgtune"), shown_db("results.db"), shown_db(None)
        ('postgresql+psycopg://u:***@h/rgtune', 'results.db', None)
    """
    from rgtune.db.engine import hide_password

    return None if db is None else hide_password(db) if isinstance(db, str) else db.name


def open_db(db: "str | TrialDatabase | None") -> "TrialDatabase | None":
    """The database to read, or None when there is none (a missing SQLite file is not created)."""
    from rgtune.db import DatabaseError, TrialDatabase
    from rgtune.db.engine import parse_url, sqlite_file  # the same URL rules as TrialDatabase

    if db is None or isinstance(db, TrialDatabase):
        return db

    path = sqlite_file(parse_url(db))
    if path is not None and not path.exists():
        return None
    try:
        return TrialDatabase(db, readonly=True)
    except DatabaseError:  # e.g. an older schema, which a read-only open refuses: upgrade it
        return TrialDatabase(db)


@dataclass
class Found:
    """A recorded best trial and how well it fits the request."""

    trial: "TrialRecord"
    workload: "WorkloadRecord"
    same_device: bool
    same_graph: bool

    def provenance(self, db: "TrialDatabase") -> dict[str, Any]:
        t, w = self.trial, self.workload
        return {"source": "database", "db": db.name, "trial_id": t.id, "mode": w.mode, "options": w.options,
                "batches": w.batches, "precision": w.precision,
                "median_ms": t.median_ms,
                # its kernels alone and the layer as called (None: a trial of an rgtune that timed one only)
                "kernel_ms": t.details.kernel_ms if t.details else None,
                "call_ms": t.details.call_ms if t.details else None,
                "device": t.device, "device_fingerprint": w.device_fingerprint, "backend": t.backend,
                "dataset": w.dataset, "graph_hash": w.graph_hash, "rgtune_version": t.rgtune_version,
                "schedule_hash": t.schedule_hash, "source_hash": t.source_hash,
                "same_device": self.same_device, "same_graph": self.same_graph}


def find_best(db: "TrialDatabase", model: str, graph: HeteroGraph, in_dim: int, out_dim: int, heads: int,
              backend: Backend, mode: str = "inference", options: str = "", batches: str = "",
              precision: str = "fp32") -> Found | None:
    """The best ``ok`` trial of this workload (``mode``: ``"inference"`` or ``"training"``; ``options``:
    the model's, canonical text; ``batches``: the sampler it was timed on, ``""``: the whole graph;
    ``precision``: the storage types its study allowed, ``tune --precision``): this
    graph (by content hash) on this device first; else this graph on another device; else a graph of the
    same name (other content)."""
    sizes = {"model": model, "in_dim": in_dim, "out_dim": out_dim, "heads": heads, "backend": backend.name,
             "mode": mode, "options": options, "batches": batches, "precision": precision}
    mine = fingerprint(backend)
    for same_graph, key in ((True, {"graph_hash": graph.content_hash}), (False, {"dataset": graph.name})):
        candidates = [w for w in db.workloads(**sizes, **key) if w.num_ok and w.best_ms is not None]  # type: ignore[arg-type]
        if not same_graph:
            candidates = [w for w in candidates if w.graph_hash != graph.content_hash]
        if not candidates:
            continue
        exact = [w for w in candidates if w.device_fingerprint == mine]
        pool = exact or candidates
        w = min(pool, key=lambda r: (r.best_ms, r.id))
        trial = db.best(w)
        if trial is not None:
            return Found(trial, w, same_device=bool(exact), same_graph=same_graph)
    return None


#: the kinds of workload whose "no tuned schedule" warning this process has shown (:func:`warn_once`)
_WARNED: set[tuple[Any, ...]] = set()


def warn_once(kind: tuple[Any, ...], message: str) -> bool:
    """:func:`warn` the first time this process meets ``kind`` (a workload kind: the model, its options, backend,
    mode, database; not the graph or the sizes, which differ per layer and per call); whether it warned."""
    if kind in _WARNED:
        return False
    _WARNED.add(kind)
    warn(message)
    return True


def warn(message: str) -> None:
    """A :class:`TunedScheduleWarning` attributed to the first caller outside rgtune and torch (the user's line,
    also when a module of :mod:`rgtune.nn` looked the schedule up in its first call)."""
    import torch

    inside = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent))
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is the frame that called warn()
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(inside):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, TunedScheduleWarning, stacklevel=level)
