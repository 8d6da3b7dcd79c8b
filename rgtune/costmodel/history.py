"""The cost model's training data: ``ok`` trials of the database as feature rows with a time.

One :class:`Sample` per ``ok`` trial. Rows are computed once per trial id and kept in a
cache (saved with the model), because a row needs the trial's graph (for the IR's counts)
and loading every graph of the history is the expensive part of training, not the fit.

Graphs are found by the name the database keeps (``aifb``, ``synthetic:bgs,scale=0.1``)
through :func:`rgtune.data.load_dataset`, and accepted only when their content hash is the
recorded one; a graph that cannot be loaded here leaves its rows without counts. So does a model
that is not registered in this process: a row's model name is data (a shared database may name
``"os:system"``), and its module is imported only with ``trust_code``
(:func:`rgtune.ir.registry.recorded_model`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rgtune.codegen.base import backend_target
from rgtune.costmodel.features import WorkloadContext
from rgtune.db.records import canonical_knobs

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph
    from rgtune.db import TrialDatabase, WorkloadRecord

log = logging.getLogger("rgtune.costmodel")
#: what a history graph that cannot be loaded costs (said in the warning once per graph)
_WITHOUT_COUNTS = "its trials are learnt without the IR's counts (a weaker model)"

GraphResolver = Callable[[str, str], "HeteroGraph | None"]
#: the key under which a cached row keeps whether its trial was its workload's default schedule (1.0 or 0.0; not a
#: feature): with it, a history whose rows are all cached is loaded without building any workload's space, which
#: needs its graph (seconds per big synthetic graph, at every start of a study)
DEFAULT_MARK = "meta:default_schedule"


@dataclass(frozen=True)
class Sample:
    """One measured schedule: its workload (the normalization group), features and time."""

    workload: str
    features: dict[str, float]
    ms: float
    is_default: bool = False
    trial_id: int | None = None
    schedule: str = ""  # the knobs' hash: repeated measurements of one schedule are one point


@dataclass
class GraphLoader:
    """Graphs by (name, content hash), loaded once; None where the graph is not available here.

    Example:
        >>> GraphLoader(enabled=False)("aifb", "0123")
    """

    data_dir: str | None = None
    enabled: bool = True
    _graphs: dict[str, "HeteroGraph | None"] = field(default_factory=dict)

    def missing(self) -> list[str]:
        """The content hashes asked for that could not be loaded here (their rows have no counts)."""
        return sorted(h for h, g in self._graphs.items() if g is None)

    def add(self, graph: "HeteroGraph") -> None:
        self._graphs[graph.content_hash] = graph

    def __call__(self, name: str, content_hash: str) -> "HeteroGraph | None":
        if content_hash in self._graphs:
            return self._graphs[content_hash]
        graph = None
        if self.enabled:
            try:
                from rgtune.data import load_dataset

                graph = load_dataset(name, root=self.data_dir)
                if graph.content_hash != content_hash:
                    log.warning("graph %r loads here with another content than the history's; %s", name,
                                _WITHOUT_COUNTS)
                    graph = None
            except Exception as e:  # noqa: BLE001 - any dataset problem: the rows just have no counts
                # a warning, once per graph: without the counts the model ranks clearly worse (an
                # evaluation without the dataset folder gave other numbers than one with it)
                log.warning("graph %r of the history cannot be loaded here (%s); %s: pass --data-dir or set "
                            "RGTUNE_DATA_DIR", name, " ".join(str(e).split()) or type(e).__name__, _WITHOUT_COUNTS)
        self._graphs[content_hash] = graph
        return graph


def workload_key(workload_id: int) -> str:
    return f"w{workload_id}"


def graph_stats(db: "TrialDatabase") -> dict[int, tuple[str, str, dict[str, Any]]]:
    """Workload id -> (graph name, content hash, statistics) as the database recorded them."""
    import sqlalchemy as sa

    from rgtune.db.schema import Graph, Workload

    q = sa.select(Workload.id, Graph.name, Graph.content_hash, Graph.stats).join(Graph, Workload.graph_id == Graph.id)
    with db.session() as s:
        return {int(w): (str(n), str(h), dict(st or {})) for w, n, h, st in s.execute(q).all()}


def context_for(w: "WorkloadRecord", name: str, stats: dict[str, Any], graph: "HeteroGraph | None",
                trust_code: bool = False) -> WorkloadContext:
    """The context of a history workload; without its graph, or a model that can be built here, its rows
    have no counts."""
    if graph is not None and not _model_available(w.model, trust_code):
        graph = None
    return WorkloadContext(w.model, w.in_dim, w.out_dim, w.heads, w.backend, w.device, stats, graph,
                           backend_target(w.backend, trust_code=trust_code), w.mode, w.options, trust_code,
                           batches=w.batches)


def _model_available(model: str, trust_code: bool) -> bool:
    from rgtune.ir.registry import UnknownModelError, recorded_model

    try:
        recorded_model(model, origin="a workload of the trial database", trust_code=trust_code)
        return True
    except UnknownModelError as e:
        log.warning("%s; %s", e, _WITHOUT_COUNTS)
        return False


def matching_workloads(db: "TrialDatabase", backend: str, device: str | None,
                       exclude: Callable[["WorkloadRecord"], bool] | None = None) -> list["WorkloadRecord"]:
    """The workloads on this device (by name) and backend: whole graphs' and samplers' (``tune --batches``,
    whose rows describe one of their batches).

    By name, not by fingerprint: a compiler or driver update makes a new fingerprint, and the
    schedules' *relative* costs mostly survive it. Times themselves are never compared across
    stacks: a workload has one device fingerprint, and the target is normalized per workload.
    """
    return [w for w in db.workloads(backend=backend, device=device) if exclude is None or not exclude(w)]


def load_samples(db: "TrialDatabase", workloads: Iterable["WorkloadRecord"], graphs: GraphLoader,
                 cache: dict[int, dict[str, float]], contexts: dict[int, WorkloadContext] | None = None,
                 trust_code: bool = False) -> list[Sample]:
    """Every ``ok`` trial of ``workloads`` as a :class:`Sample`; rows come from ``cache`` when there.

    ``cache`` (trial id -> row) is filled with the rows computed here. ``trust_code``: import the
    models the rows name that this process has not registered (see the module docstring).
    """
    stats = graph_stats(db)
    contexts = {} if contexts is None else contexts
    samples: list[Sample] = []
    for w in workloads:
        trials = db.history(w, status="ok")
        if not trials:
            continue
        name, chash, st = stats[w.id]
        ctx = contexts.get(w.id)
        default: dict[str, Any] | None = None
        for t in trials:
            if t.median_ms is None or t.median_ms <= 0:
                continue
            row = cache.get(t.id)
            if row is None or DEFAULT_MARK not in row:
                if ctx is None:
                    ctx = contexts[w.id] = context_for(w, name, st, graphs(name, chash), trust_code)
                if default is None:
                    default = _default_knobs(w, ctx, st, graphs, name, chash, contexts, trust_code)
                row = cache[t.id] = {**(row if row is not None else ctx.features(t.knobs)),
                                     DEFAULT_MARK: float(t.knobs == default)}
            features = {k: v for k, v in row.items() if k != DEFAULT_MARK}
            samples.append(Sample(workload_key(w.id), features, float(t.median_ms), row[DEFAULT_MARK] == 1.0, t.id,
                                  t.schedule_hash))
    return samples


def _default_knobs(w: "WorkloadRecord", ctx: WorkloadContext | None, st: dict[str, Any], graphs: GraphLoader,
                   name: str, chash: str, contexts: dict[int, WorkloadContext], trust_code: bool) -> dict[str, Any]:
    if ctx is None:
        ctx = contexts[w.id] = context_for(w, name, st, graphs(name, chash), trust_code)
    try:
        return canonical_knobs(ctx.space.default())[0]
    except Exception:  # noqa: BLE001 - a model this version cannot build: no default, median normalization
        return {"__none__": True}
