"""``rgtune export``: a tuned schedule as a self-contained folder; ``load_exported`` reads it back.

The folder (format ``rgtune-export`` version 1)::

    README.txt           how to load it
    schedule.json        model (name, options, import path), sizes, backend, mode (inference or training), the knob config (the
                         kernel IR is rebuilt from it through SearchSpace), the graph's schema and
                         content hash, source hashes
    provenance.json      trial id, median time, device info and fingerprint, rgtune/torch versions,
                         database, export date (UTC)
    kernel_program.txt   the kernel IR of the schedule, for reading
    sources/<file>       the generated kernel sources (BuiltProgram.sources)
    signature.json       an HMAC of schedule.json under the exporting user's key (:mod:`rgtune._signing`)

:func:`load_exported` needs no database: it rebuilds the kernels from the config, checks
that the regenerated sources hash to the exported ones (a warning if not: another rgtune
version generates other code), and warns when the graph's content or this device differs
from what the schedule was tuned on. A graph with other node or edge types is an error.

**An export is data.** The folder is meant to be shared, so loading it runs none of its code:
the kernels are generated again from the knobs (checked against the search space), the sizes
and options are checked against the model, and the model is looked up among those registered
in the loading process. Its module (``model_source``, e.g. ``"mypkg.models:conv"``) is imported
only when this user signed the export here (their own export of a model registered in their own
module loads as before) or the caller passes ``trust_code=True``; otherwise the load is
:class:`~rgtune.ir.registry.UntrustedModelError`, before anything is imported.

The folder is written beside ``out_dir`` and renamed in; an earlier export it replaces is
renamed aside first and deleted last, so ``out_dir`` is never half-written, and what an export
killed midway leaves beside it is cleaned (or put back) by the next export. The database is
named without its password (the folder is meant to be shared).

Example:
    >>> import tempfile, warnings
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> d = tempfile.mkdtemp() + "/tuned"
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")       # no database: the default schedule, with a warning
    ...     _ = export(d, "rgcn", g, in_dim=8, out_dim=8, db=None, backend="reference", allow_default=True)
    >>> layer = load_exported(d, g)
    >>> layer.provenance["source"], layer.in_dim
    ('export', 8)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

import rgtune
from rgtune.codegen.base import Backend, available_backends, create
from rgtune.data import HeteroGraph
from rgtune.ir.program import IRError
from rgtune import _signing
from rgtune.ir.registry import ModelSpec, model_spec, parse_key, recorded_model, registered_model
from rgtune.runtime._lookup import fingerprint, graph_signature, resolve_backend, resolve_graph, shown_db, warn
from rgtune.runtime.load import select_schedule
from rgtune.runtime.module import GraphMismatchError, Layer
from rgtune.search_spaces import SearchSpace

if TYPE_CHECKING:
    from rgtune.db import TrialDatabase

__all__ = ["EXPORT_FORMAT", "FORMAT_VERSION", "SCHEDULE_FILE", "PROVENANCE_FILE", "SIGNATURE_FILE",
           "NoTunedScheduleError", "export", "export_layer", "load_exported", "read_export_json"]

EXPORT_FORMAT = "rgtune-export"
FORMAT_VERSION = 1
SCHEDULE_FILE, PROVENANCE_FILE, SIGNATURE_FILE = "schedule.json", "provenance.json", "signature.json"
_README, _KERNELS, _SOURCES = "README.txt", "kernel_program.txt", "sources"


class NoTunedScheduleError(LookupError):
    """Export was asked for a workload that has no recorded schedule (and defaults were not allowed)."""


# ---------------------------------------------------------------------- export
def export(
    out_dir: str | Path,
    model: str,
    graph: HeteroGraph | str,
    in_dim: int = 64,
    out_dim: int = 64,
    heads: int = 1,
    db: "str | TrialDatabase | None" = "results.db",
    backend: str | Backend = "auto",
    *,
    data_dir: str | Path | None = None,
    mode: str = "inference",
    options: Mapping[str, Any] | None = None,
    allow_default: bool = False,
    overwrite: bool = False,
    precision: str = "fp32",
) -> Path:
    """Write the best recorded schedule of a workload (as :func:`load_tuned` finds it) to ``out_dir``.

    Without a record this is :class:`NoTunedScheduleError` (naming the ``tune`` command), unless
    ``allow_default``, which exports the default schedule. ``out_dir`` must not exist, be empty,
    or (with ``overwrite``) be an earlier export. ``mode="training"`` exports the best training
    schedule (the layer then builds its training program at once); ``options`` are the model's;
    ``precision``: the study's policy, as :func:`load_tuned` takes it (with ``"fp32"``, the best
    16-bit schedules, where tuned, go along as the layer's schedules under ``torch.autocast``).
    Returns the folder.
    """
    sel = select_schedule(model, graph, in_dim, out_dim, heads, db, backend, mode=mode, data_dir=data_dir,
                          options=options, precision=precision)
    if sel.missing is not None and not allow_default:
        raise NoTunedScheduleError(f"{sel.missing}; or pass allow_default=True (--allow-default) to export "
                                   f"the default schedule")
    _clean_interrupted(Path(out_dir))  # an earlier export killed midway: its old folder back in place
    _check_target_dir(Path(out_dir), overwrite)  # before building: fail fast
    for message in sel.warnings:
        warn(message)
    layer = sel.build()
    return export_layer(layer, out_dir, overwrite=overwrite, db=shown_db(db))


def export_layer(layer: Layer, out_dir: str | Path, *, overwrite: bool = False, db: str | None = None) -> Path:
    """Write an already-built tuned layer's schedule, sources and provenance to ``out_dir`` (its model must
    be one :func:`load_exported` can rebuild: registered, or importable by its path)."""
    try:
        spec = model_spec(layer.model)
    except IRError:
        raise ValueError(f"cannot export a layer of model {layer.model!r}: it is not registered; register it with "
                         "rgtune.register_model (in an importable module) and build the layer by that name") from None
    out = Path(out_dir)
    _clean_interrupted(out)
    _check_target_dir(out, overwrite)
    be = layer._backend
    sources = layer.sources
    schedule = {
        "format": EXPORT_FORMAT, "format_version": FORMAT_VERSION,
        "model": spec.name, "options": spec.key(layer.options), "model_source": spec.source, "in_dim": layer.in_dim, "out_dim": layer.out_dim, "heads": layer.heads,
        "backend": be.name, "target": be.target, "mode": layer.mode, "config": layer.config,
        # the schedules of calls under torch.autocast, by storage type (where given: tuned ones)
        "autocast": {st: configs[layer.mode] for st, configs in sorted(layer.autocast_configs.items())},
        "source_hash": layer.source_hash,
        "sources": {name: {"path": f"{_SOURCES}/{name}", "sha256": _sha256(text)} for name, text in sources.items()},
        "graph": graph_signature(layer.graph),
    }
    prov = dict(layer.provenance)
    provenance = {
        "schedule": prov.get("source"), "trial_id": prov.get("trial_id"), "median_ms": prov.get("median_ms"),
        "db": shown_db(prov.get("db", db)), "schedule_hash": prov.get("schedule_hash"),
        "tuned_with_rgtune": prov.get("rgtune_version"),
        "tuned_on": {"device": prov.get("device"), "device_fingerprint": prov.get("device_fingerprint"),
                     "dataset": prov.get("dataset"), "graph_hash": prov.get("graph_hash")},
        "exported_on": {"device_info": be.device_info(), "device_fingerprint": fingerprint(be)},
        "rgtune_version": rgtune.__version__, "torch_version": torch.__version__,
        "graph": {"name": layer.graph.name, "content_hash": layer.graph.content_hash},
        "sizes": {"in_dim": layer.in_dim, "out_dim": layer.out_dim, "heads": layer.heads},
        "backend": be.name,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    schedule_text = json.dumps(schedule, indent=2, sort_keys=True) + "\n"
    files = {SCHEDULE_FILE: schedule_text,
             PROVENANCE_FILE: json.dumps(provenance, indent=2, sort_keys=True, default=str) + "\n",
             _KERNELS: layer.kernels.describe() + "\n", _README: _readme(out.name, schedule, provenance),
             **{f"{_SOURCES}/{name}": text for name, text in sources.items()}}
    signature = _signature(schedule_text.encode(), spec)
    if signature is not None:
        files[SIGNATURE_FILE] = signature
    tmp = Path(tempfile.mkdtemp(prefix=_leftover_prefix(out, "new"), dir=out.parent))
    try:
        (tmp / _SOURCES).mkdir()
        for name, text in files.items():
            (tmp / name).write_text(text)
        _swap_in(tmp, out)  # out was checked above: missing, empty, or an earlier export that may be replaced
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _signature(schedule: bytes, spec: ModelSpec) -> str | None:
    """``signature.json``: the HMAC of ``schedule.json`` under this user's key; None, with a warning,
    when the key cannot be used."""
    try:
        tag = _signing.sign(schedule)
    except _signing.SigningKeyError as e:
        warn(f"the export is not signed ({e}); loading it where model {spec.name!r} is not registered will need "
             "trust_code=True")
        return None
    return json.dumps({"signs": SCHEDULE_FILE, "hmac_sha256": tag,
                       "note": "an HMAC under the exporting user's rgtune key: only that user, on that machine, can "
                               "check it, and then loads the model's module without trust_code"}, indent=2) + "\n"


def _signed_here(folder: Path, schedule: bytes) -> bool:
    """Whether this user (on this machine) signed the folder's ``schedule.json``."""
    try:
        sig = json.loads((folder / SIGNATURE_FILE).read_text())
        return isinstance(sig, dict) and _signing.verify(schedule, sig.get("hmac_sha256"))
    except (OSError, ValueError):  # no signature, an unreadable one, or no usable key: not this user's
        return False


def _leftover_prefix(out: Path, kind: str) -> str:
    """The name prefix of the folders an export of ``out`` keeps beside it while it runs (``new``, ``old``)."""
    return f".{out.name}.rgtune-{kind}-"


def _swap_in(new: Path, out: Path) -> None:
    """Put the finished folder ``new`` at ``out``, replacing what is there, by renames only.

    The old folder is renamed aside, the new one renamed in, then the old one deleted: ``out``
    never holds a half-written export, and no step deletes the old one before the new one is in
    place. A failure between the renames puts the old one back; a kill there leaves it aside,
    where the next export (:func:`_clean_interrupted`) puts it back.
    """
    if not out.exists():
        os.rename(new, out)
        return
    old = out.parent / f"{_leftover_prefix(out, 'old')}{secrets.token_hex(4)}"
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _clean_interrupted(out: Path) -> None:
    """Undo what an export of ``out`` that was killed midway left beside it.

    Its unfinished new folders are deleted; an old export it had renamed aside is put back when
    ``out`` is gone (a kill between the two renames of :func:`_swap_in`), else deleted.
    """
    if not out.parent.is_dir():
        return
    for leftover in out.parent.glob(glob.escape(_leftover_prefix(out, "new")) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    olds = sorted(out.parent.glob(glob.escape(_leftover_prefix(out, "old")) + "*"), key=lambda p: p.stat().st_mtime)
    if olds and not out.exists():
        os.rename(olds.pop(), out)  # the most recent one
    for leftover in olds:
        shutil.rmtree(leftover, ignore_errors=True)


def _check_target_dir(out: Path, overwrite: bool) -> None:
    if not out.parent.is_dir():
        raise FileNotFoundError(f"cannot export to {out}: directory {out.parent} does not exist")
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"cannot export to {out}: it is a file")
    if not any(out.iterdir()):
        return
    if not (out / SCHEDULE_FILE).is_file():
        raise FileExistsError(f"cannot export to {out}: the folder is not empty and is not an rgtune export")
    if not overwrite:
        raise FileExistsError(f"{out} already holds an export; pass overwrite=True (--force) to replace it")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _readme(name: str, s: Mapping[str, Any], p: Mapping[str, Any]) -> str:
    heads = "" if s["heads"] == 1 else f", heads={s['heads']}"
    options = f", options={parse_key(s['options'])}" if s["options"] else ""
    if p["schedule"] == "database":
        db = str(p["db"])  # a file by its name only: the README must not carry this machine's paths
        db = Path(db.removeprefix("sqlite:///")).name if db.startswith("sqlite:///") or "://" not in db else db
        origin = (f"trial {p['trial_id']} of {db}, median {p['median_ms']:.4g} ms on "
                  f"{p['tuned_on']['device']!r} ({s['backend']} backend)")
    else:
        origin = "the default schedule (no tuned record was available at export time)"
    g = s["graph"]
    return textwrap.dedent(f"""\
        rgtune export: {s['model']}{'(' + s['options'] + ')' if s['options'] else ''} on graph {g['name']!r} (content hash {g['content_hash']}),
        in_dim={s['in_dim']}, out_dim={s['out_dim']}, heads={s['heads']}, backend {s['backend']}.
        Schedule: {origin}.
        Exported {p['exported_at']} by rgtune {p['rgtune_version']}.

        Load it (no database needed; pass the path of this folder):

            from rgtune.data import load_dataset
            from rgtune.runtime import load_exported
            # the graph tuned on (or any HeteroGraph with the same node and edge types):
            graph = load_dataset({g['name']!r})
            layer = load_exported({name!r}, graph)   # a torch.nn.Module
            # x: (num_nodes, {s['in_dim']}) float32 in global node order, or a dict per node type
            out = layer(x)

        The layer is rgtune.runtime.Layer({s['model']!r}, graph, {s['in_dim']}, {s['out_dim']}{heads}{options}) with
        this schedule: the model's parameters and state_dict, the same call, and it trains.
        Generated: the kernels of the {s['mode']} program (sources/); a training schedule's
        backward kernels too (the backward runs them on what the forward saved). Torch: derived
        (reordered) weights, folded once per call.

        On load the kernels are rebuilt from schedule.json's config and the regenerated sources
        are checked against the hashes here (a warning if another rgtune version generates other
        code). A graph with other node or edge types is refused; other content, or another
        device, gives a warning that the schedule was tuned elsewhere (it still computes the
        right numbers).

        Files:
          schedule.json       model, sizes, backend, knob config, graph schema, source hashes
          provenance.json     trial, timing, devices, versions, date
          kernel_program.txt  the kernel IR of this schedule
          sources/            the generated kernel sources
          signature.json      an HMAC of schedule.json under the exporter's rgtune key

        Loading runs no code from this folder: the model is looked up among those registered in
        the loading process, and its module is imported only for the user who exported it (the
        signature) or with load_exported(..., trust_code=True).
        """)


# ---------------------------------------------------------------------- load
def load_exported(
    path: str | Path,
    graph: HeteroGraph | str,
    *,
    backend: str | Backend | None = None,
    data_dir: str | Path | None = None,
    trust_code: bool = False,
) -> Layer:
    """The tuned layer of an export folder, rebuilt for ``graph`` without any database.

    Args:
        path: the folder :func:`export` wrote.
        graph: a :class:`HeteroGraph` or a dataset name; its node and edge types must be the
            exported graph's (:class:`GraphMismatchError` otherwise).
        backend: default the exported one (``"auto"`` with a warning when it cannot run here).
            On another target (cuda -> cpu) the tuned IR knobs are kept and the kernel
            schedule knobs take that target's defaults, with a warning.
        trust_code: import the module the export names for its model (``model_source``) even
            when this user did not sign the folder: that runs the module's code, so only for a
            folder from someone you trust. Not needed for a model registered in this process,
            nor for this user's own exports.
    """
    folder = Path(path)
    raw = _read_bytes(folder / SCHEDULE_FILE)
    s, p = _parse_json(folder / SCHEDULE_FILE, raw), read_export_json(folder / PROVENANCE_FILE)
    if s.get("format") != EXPORT_FORMAT or not isinstance(s.get("format_version"), int):
        raise ValueError(f"{folder}: not an rgtune export ({SCHEDULE_FILE} has no format {EXPORT_FORMAT!r})")
    if s["format_version"] > FORMAT_VERSION:
        raise ValueError(f"{folder}: export format version {s['format_version']} is newer than this rgtune reads "
                         f"({FORMAT_VERSION}); upgrade rgtune")
    spec = _exported_model(folder, s, raw, trust_code)
    options = s.get("options", "")  # exports before model options had none
    g = resolve_graph(graph, data_dir)
    _check_graph(folder, s["graph"], g)
    be = _backend_for(s["backend"], backend)
    config, mode = dict(s["config"]), s.get("mode", "inference")  # exports before training had no mode
    autocast = {str(k): dict(v) for k, v in (s.get("autocast") or {}).items()}  # exports before it had none
    if be.target != s["target"]:
        space = SearchSpace(spec.build(s["in_dim"], s["out_dim"], s["heads"], options), g, be.target, mode=mode,
                            precision="any")
        ir = {k.name for k in space.ir_knobs}
        config = {k: v for k, v in config.items() if k in ir}
        autocast = {}  # tuned for the other target's kernels: its calls under autocast derive their own
        warn(f"{folder}: tuned for the {s['target']} target ({s['backend']} backend), loading on {be.name} "
             f"({be.target}); keeping the tuned IR knobs, default {be.target} kernel schedule")
    tuned_fp = (p.get("tuned_on") or {}).get("device_fingerprint") or p["exported_on"]["device_fingerprint"]
    if be.name == s["backend"] and tuned_fp != fingerprint(be):
        device = (p.get("tuned_on") or {}).get("device") or p["exported_on"]["device_info"].get("device")
        warn(f"{folder}: the schedule was tuned on another device ({device!r}: a different device fingerprint: "
             f"hardware, compiler or threads); it computes the same numbers, but may not be the fastest here")
    provenance = {**p, "source": "export", "path": str(folder)}
    layer = Layer(spec.name, g, s["in_dim"], s["out_dim"], s["heads"], options=parse_key(options), config=config,
                  backend=be, provenance=provenance, mode=mode, device=be.device_type, autocast_config=autocast)
    if be.name == s["backend"] and layer.source_hash != s["source_hash"]:
        warn(f"{folder}: the regenerated kernel sources differ from the exported ones (hash {layer.source_hash}, "
             f"exported {s['source_hash']}; exported by rgtune {p.get('rgtune_version')}, this is "
             f"{rgtune.__version__}); the schedule is the same, the generated code is not")
    return layer


def read_export_json(path: Path) -> dict[str, Any]:
    return _parse_json(path, _read_bytes(path))


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path.parent}: not an rgtune export folder (no {path.name})") from None


def _parse_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not an rgtune export file (a JSON {type(value).__name__}, not an object)")
    return value


def _exported_model(folder: Path, s: Mapping[str, Any], raw: bytes, trust_code: bool) -> ModelSpec:
    """The export's model: registered here, or imported from its ``model_source`` when this user signed
    the folder or the caller trusts it (:func:`~rgtune.ir.registry.recorded_model` says how to otherwise)."""
    name, source = s.get("model"), s.get("model_source")
    if not isinstance(name, str) or not (source is None or isinstance(source, str)):
        raise ValueError(f"{folder}: {SCHEDULE_FILE} names no model (model {name!r}, model_source {source!r})")
    if not trust_code and registered_model(name, source) is None:
        trust_code = _signed_here(folder, raw)  # this user's own export: the path is one they recorded
    return recorded_model(name, source, origin=f"export folder {folder}", trust_code=trust_code)


def _check_graph(folder: Path, exported: Mapping[str, Any], g: HeteroGraph) -> None:
    mine = graph_signature(g)
    for key, what in (("ntypes", "node types"), ("canonical_etypes", "edge types")):
        if mine[key] != exported[key]:
            theirs, ours = exported[key], mine[key]
            extra = [t for t in ours if t not in theirs]
            missing = [t for t in theirs if t not in ours]
            detail = "; ".join(f"{label} {items[:3]}{' ...' if len(items) > 3 else ''}"
                               for label, items in (("missing", missing), ("unexpected", extra)) if items)
            raise GraphMismatchError(
                f"{folder} was tuned for graph {exported['name']!r}, whose {what} differ from those of "
                f"{g.name!r} ({len(theirs)} vs {len(ours)}{'; ' + detail if detail else ', in another order'}); "
                f"a schedule only applies to a graph with the same node and edge types")
    if mine["content_hash"] != exported["content_hash"]:
        warn(f"{folder} was tuned on graph {exported['name']!r} (hash {exported['content_hash']}); {g.name!r} has "
             f"the same types but other content (hash {mine['content_hash']}): the schedule computes the same "
             f"numbers, but was tuned elsewhere")


def _backend_for(exported: str, requested: str | Backend | None) -> Backend:
    if requested is not None:
        return resolve_backend(requested)
    ok, why = available_backends().get(exported, (False, f"unknown backend {exported!r}"))
    if ok:
        return create(exported)
    warn(f"the exported backend {exported!r} cannot run here ({why}); using backend='auto'")
    return resolve_backend("auto")
