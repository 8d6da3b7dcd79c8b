"""``load_tuned``: the best recorded schedule of a workload as a trainable ``torch.nn.Module``.

Example:
    >>> import warnings
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     layer = load_tuned("rgcn", g, in_dim=8, out_dim=8, db=None, backend="reference")
    >>> layer.provenance["source"], type(layer).__name__, layer.model
    ('default', 'Layer', 'rgcn')
    >>> "no database" in str(caught[0].message)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import rgtune
from rgtune.codegen.base import Backend
from rgtune.data import HeteroGraph
from rgtune.data.sampler_spec import SamplerSpec
from rgtune.ir.passes import KnobError
from rgtune.ir.passes.precision import check_policy
from rgtune.ir.program import IRError
from rgtune.runtime._lookup import (Found, check_model, find_best, is_dataset_name, open_db, resolve_backend, resolve_graph,
                                    shown_db, tune_call, tune_command, warn)
from rgtune.ir.registry import parse_key
from rgtune.runtime.module import Layer
from rgtune.search_spaces import MODES

if TYPE_CHECKING:
    from rgtune.db import TrialDatabase

__all__ = ["load_tuned", "select_schedule", "Selection"]


def load_tuned(
    model: str,
    graph: HeteroGraph | str,
    in_dim: int = 64,
    out_dim: int = 64,
    heads: int = 1,
    db: "str | TrialDatabase | None" = "results.db",
    backend: str | Backend = "auto",
    *,
    options: Mapping[str, Any] | None = None,
    mode: str = "inference",
    data_dir: str | Path | None = None,
    batches: "str | SamplerSpec | None" = None,
    precision: str = "fp32",
) -> Layer:
    """A :class:`~rgtune.runtime.module.Layer` running the best recorded schedule.

    The database is searched for the workload (``model`` with its ``options``, the graph by content
    hash, the sizes, the backend) and the fastest verified trial recorded on this device (the fingerprint of
    ``backend.device_info()``) is used. Failing that, with a :class:`TunedScheduleWarning`: the
    best trial of this graph on another device, then of a graph with the same name but other
    content, then the default schedule; each warning names the ``tune`` command that records
    a schedule for this device.

    Args:
        model: a registered model (``"rgcn"``, ``"rgat"``, ``"hgt"``, one registered with
            :func:`rgtune.register_model`) or ``"package.module:builder"``.
        options: the model's options (``{"num_bases": 30}``); a bad name or value is a ``ValueError``
            listing the valid ones.
        graph: a :class:`HeteroGraph` (or a PyG ``HeteroData``, a DGL graph: converted), or a dataset name
            (loaded from ``data_dir``). A graph that is not a dataset is found by its content, as
            ``rgtune.tune(model, graph)`` recorded it.
        in_dim, out_dim, heads: the layer's sizes (the workload's).
        db: a SQLAlchemy URL, a ``.db`` path, an open :class:`TrialDatabase`, or None (no
            lookup). A missing SQLite file is not created.
        backend: ``"auto"`` (CUDA if usable, else ``cpu``, else ``reference``) or a backend name.
        mode: ``"inference"`` (the schedule of the fastest forward) or ``"training"`` (of the
            fastest training step: forward, then backward to the input and every param). Without
            a training record, the best inference schedule with the backward's knobs at their
            defaults, with a warning.
        batches: the sampler of mini-batch training (``"neighbor:fanout=15x10,batch_size=1024"``, a
            :class:`~rgtune.data.sampler_spec.SamplerSpec`): the schedule tuned for its batches (``tune
            --batches``); without one, the best whole-graph schedule, with a warning. ``None``: the
            schedule tuned on the whole graph.
        precision: the storage types the schedule may keep per-edge intermediates in, as ``tune
            --precision`` recorded them (``"fp32"``; ``"bf16"``, ``"fp16"``, ``"any"``: 16-bit storage, sums in
            float32; :mod:`rgtune.ir.passes.precision`); without such a study, the best float32 schedule, with
            a warning. With ``"fp32"``, the best schedules of this graph's ``bf16`` and ``fp16`` studies, where
            there are some, become the layer's schedules under ``torch.autocast`` in that type
            (:meth:`Layer.autocast_schedule`; ``provenance["autocast_trials"]`` names them).

    Returns:
        A module with the model's parameters (those of its torch layer and of PyG's), ``state_dict`` and call; its
        ``provenance`` says where the schedule came from.
    """
    sel = select_schedule(model, graph, in_dim, out_dim, heads, db, backend, mode=mode, data_dir=data_dir,
                          options=options, batches=batches, precision=precision)
    for message in sel.warnings:
        warn(message)
    return sel.build()


@dataclass
class Selection:
    """The schedule :func:`load_tuned` would use, and what it would warn about."""

    model: str
    graph: HeteroGraph
    sizes: tuple[int, int, int]
    backend: Backend
    config: dict[str, Any] | None
    provenance: dict[str, Any]
    warnings: list[str]
    missing: str | None  # why there is no record (None: a record was found)
    hint: str  # "run `tune ...`"
    where: str  # the workload, in words
    mode: str = "inference"
    options: str = ""  # the model's options, canonical text
    batches: str = ""  # the sampler asked for, canonical text ("": the whole graph)
    #: storage type -> the best schedule tuned with that precision: what a call under torch.autocast runs
    autocast: dict[str, dict[str, Any]] = field(default_factory=dict)

    def build(self) -> Layer:
        """The layer; a recorded schedule that no longer compiles falls back to the default, with a warning."""
        m, g, (i, o, h), be = self.model, self.graph, self.sizes, self.backend
        device = be.device_type  # the layer lives where its kernels run
        opts = parse_key(self.options)
        try:
            return Layer(m, g, i, o, h, options=opts, config=self.config, backend=be, provenance=self.provenance,
                         mode=self.mode, device=device, autocast_config=self.autocast)
        except (KnobError, ValueError) as e:
            if self.config is None:
                raise
            recorded = self.provenance.get("rgtune_version")
            why = (f"it was recorded by rgtune {recorded}, whose knobs differ from this version's ({rgtune.__version__})"
                   if recorded and recorded != rgtune.__version__ else
                   "it was recorded by this rgtune version, whose tuner should not record a schedule a layer cannot "
                   "build: please report it")
            warn(f"{self.where}: the recorded schedule of trial {self.provenance.get('trial_id')} does not compile "
                 f"here ({e}); {why}. Using the default schedule. To record a new one, {self.hint}")
            return Layer(m, g, i, o, h, options=opts, backend=be, device=device, mode=self.mode,
                         provenance={"source": "default", "rejected_trial": self.provenance.get("trial_id")})


def select_schedule(model: str, graph: HeteroGraph | str, in_dim: int, out_dim: int, heads: int,
                    db: "str | TrialDatabase | None", backend: str | Backend, *, mode: str = "inference",
                    data_dir: str | Path | None = None, options: Mapping[str, Any] | str | None = None,
                    batches: "str | SamplerSpec | None" = None, precision: str = "fp32") -> Selection:
    """Look the workload up (see :func:`load_tuned`) without building anything or warning."""
    sel, find = _select(model, graph, in_dim, out_dim, heads, db, backend, mode, data_dir, options, batches, precision)
    if precision == "fp32" and find is not None:
        _find_autocast(sel, find)
    return sel


def _select(model: str, graph: HeteroGraph | str, in_dim: int, out_dim: int, heads: int,
            db: "str | TrialDatabase | None", backend: str | Backend, mode: str, data_dir: str | Path | None,
            options: Mapping[str, Any] | str | None, batches: "str | SamplerSpec | None", precision: str
            ) -> tuple[Selection, Callable[..., "Found | None"] | None]:
    """The selection, and how records of this workload are found (``find(mode, batches, precision)``)."""
    try:
        model, opts = check_model(model, options)
    except IRError as e:  # an unknown model or option: the caller's value
        raise ValueError(str(e)) from None
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
    check_policy(precision)
    sampler = "" if batches is None else SamplerSpec.parse(batches).key  # a bad spec: a ValueError naming it
    g = resolve_graph(graph, data_dir)
    be = resolve_backend(backend)
    database = open_db(db)
    db_text = shown_db(db)
    if is_dataset_name(g.name):
        command = tune_command(model, g.name, in_dim, out_dim, heads, be.name, db_text, mode, opts, sampler, precision)
        hint = f"run `{command}`"
    else:  # the user's own graph: tuned from Python, where the graph is (or saved, with tune --graph)
        call = tune_call(model, in_dim, out_dim, heads, be.name, db_text, mode, opts, sampler, precision)
        hint = (f"run `{call}` with this graph ({g.name!r} is not a dataset; or save it with "
                "rgtune.data.save_graph_file and run tune --graph)")
    kind = "" if mode == "inference" else "training "
    named = f"{model}({opts})" if opts else model
    on = f"batches of {sampler} from {g.name!r}" if sampler else repr(g.name)
    where = (f"{named} on {on} (in_dim={in_dim}, out_dim={out_dim}, heads={heads}, backend={be.name}"
             f"{'' if precision == 'fp32' else ', precision=' + precision})")
    find = (lambda m, b=sampler, p=precision: find_best(database, model, g, in_dim, out_dim, heads, be, m, opts, b, p)) \
        if database is not None else None
    found = find(mode) if find is not None else None
    sel = Selection(model, g, (in_dim, out_dim, heads), be, None, {"source": "default"}, [], None, hint, where, mode,
                    opts, sampler)
    if found is None and precision != "fp32" and find is not None:
        found = find(mode, sampler, "fp32")
        if found is not None:  # a float32 schedule runs wherever a 16-bit one would
            assert database is not None
            return _adopt(sel, found, database, g, (
                f"no {precision} {kind}schedule tuned for {where} in {database.name}. To record one, {hint}",
                f"no schedule tuned with precision {precision} for {where}; using the best float32 one "
                f"(trial {found.trial.id}). To record one, {hint}")), find
    if found is None and sampler and find is not None:
        found = find(mode, "")
        if found is not None:  # what a user without batches gets: the schedule tuned on the whole graph
            assert database is not None
            return _adopt(sel, found, database, g, (
                f"no {kind}schedule tuned for {where} in {database.name}. To record one, {hint}",
                f"no {kind}schedule tuned for {where}; using the best one tuned on the whole graph "
                f"(trial {found.trial.id}). To record one, {hint}")), find
    if found is None and mode == "training" and find is not None:
        found = find("inference")
        if found is not None:  # the tuned forward, the backward's knobs at their defaults
            assert database is not None
            return _adopt(sel, found, database, g, (
                f"no tuned training schedule for {where} in {database.name}. To record one, {hint}",
                f"no tuned training schedule for {where}; using the best inference schedule (trial {found.trial.id}) "
                f"with the backward's knobs at their defaults. To record one, {hint}"), backward="default knobs"), find
    if found is None:
        why = f"no database at {db_text}" if database is None and db is not None else \
            "no database given" if database is None else f"{database.name} has no verified trial"
        sel.missing = f"no tuned {kind}schedule for {where}: {why}. To record one, {hint}"
        sel.warnings.append(f"no tuned {kind}schedule for {where}: {why}; using the default schedule. "
                            f"To record one, {hint}")
        return sel, find
    assert database is not None
    return _adopt(sel, found, database, g), find


def _find_autocast(sel: Selection, find: Callable[..., "Found | None"]) -> None:
    """The best schedules tuned in 16 bits (``tune --precision bf16|fp16``), for the layer's calls under
    torch.autocast in that type (without one, such a call runs the float32 schedule's 16-bit variant)."""
    for policy, storage in (("bf16", "bfloat16"), ("fp16", "float16")):
        found = find(sel.mode, sel.batches, policy)
        if found is not None and found.same_graph:
            sel.autocast[storage] = dict(found.trial.knobs)
            sel.provenance.setdefault("autocast_trials", {})[storage] = found.trial.id


def _adopt(sel: Selection, found: Found, database: "TrialDatabase", g: HeteroGraph,
           stand_in: tuple[str, str] | None = None, **provenance: str) -> Selection:
    """``sel`` with ``found``'s schedule; ``stand_in``: it stands in for the missing record (what is missing,
    the warning); ``provenance``: added to the record's."""
    sel.config, sel.provenance = dict(found.trial.knobs), {**found.provenance(database), **provenance}
    if stand_in is not None:
        sel.missing = stand_in[0]
        sel.warnings.append(stand_in[1])
    _warn_fit(sel, found, g)
    return sel


def _warn_fit(sel: Selection, found: Found, g: HeteroGraph) -> None:
    """Warn when the record is of another graph's content or of another device."""
    where, hint = sel.where, sel.hint
    if not found.same_graph:
        sel.warnings.append(
            f"{where}: using trial {found.trial.id}, tuned on a graph named {g.name!r} with other content "
            f"(hash {found.workload.graph_hash}, this graph {g.content_hash}); to tune this graph, {hint}")
    elif not found.same_device:
        sel.warnings.append(
            f"{where}: using trial {found.trial.id}, tuned on another device ({found.trial.device!r}, "
            f"a different device fingerprint: hardware, compiler or threads); to tune here, {hint}")
