"""Features of one trial for the cost model: knobs, the IR's counts, the graph, the sizes, the device.

A feature row is a plain ``dict[str, float]``. Two kinds of names:

* ``is:...`` indicators (one-hot): ``is:knob:layout.edges=csr_dst``, ``is:model=hgt``,
  ``is:kernel:gemm`` (then the value is how many kernels of that template run). An indicator
  missing from a row is 0.
* ``num:...`` numbers: log-scaled counts (``num:log_flops``), counts relative to the workload's
  default schedule (``num:rel_flops = log(flops / default flops)``), graph statistics, sizes,
  and the numeric value of integer knobs (``num:knob:gemm.tile_rows = log2(32)``). A number
  missing from a row is NaN (a graph that could not be loaded has no counts; the tree models
  route NaN on their own).

Nothing here names a model, a knob or a template: knobs come from the configuration, templates
from the kernels, statistics from :class:`~rgtune.data.graph.GraphStats`. The relative counts
are what lets a model trained on one graph rank the schedules of another: the workload's scale
cancels out, as it does in the per-workload target.

A sampler workload's row (``tune --batches``, ``WorkloadContext.batches``) describes what its trials
time, one batch: the counts are those of the schedule's mini-batch programs (destinations only; a
first layer's block runs the params'-gradients program in training, as a layer does) summed over the
blocks of the sampler's batches and divided by their number; the graph statistics are those of the
largest block (what a batch looks like: in-degrees capped by the fan-outs), and ``is:batches`` marks it.
So a model trained on whole graphs ranks a sampler's schedules by what they do on its batches.

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((20, 30), num_relations=3, num_edges=200, seed=0)
    >>> ctx = WorkloadContext.create("rgcn", g, 8, 8, 1, backend="cpu", device="test cpu")
    >>> row = ctx.features(ctx.space.default())
    >>> row["num:rel_flops"], row["is:knob:layout.edges=csr_dst"], row["is:model=rgcn"]
    (0.0, 1.0, 1.0)
    >>> row == ctx.features(ctx.space.default())    # deterministic
    True
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from rgtune.codegen.base import backend_target

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph
    from rgtune.ir.kernels import KernelProgram
    from rgtune.search_spaces import BlockSpaces, SearchSpace

__all__ = ["WorkloadContext", "FeatureEncoder", "COUNT_KEYS", "graph_features"]

#: the scalar entries of :func:`rgtune.ir.counts.count` that become features (the others were
#: tried and ranked held-out graphs no better: ``git show b6d635a:BENCHMARKS.md``, "What did not work")
COUNT_KEYS = ("flops", "bytes_min", "bytes_gathered", "kernels", "atomics", "gemm_rows_total", "weight_flops")
#: the counts only a training program has (its rows only: an inference row's features stay as they were)
TRAINING_COUNT_KEYS = ("saved_bytes", "backward_kernels")

#: graph statistics used as they are (ratios, coefficients of variation) or log-scaled (sizes)
_STAT_PLAIN = ("in_degree_cv", "out_degree_cv", "src_pair_ratio", "dst_pair_ratio", "edges_per_relation_cv",
               "mean_in_degree")
_STAT_LOG = ("num_nodes", "num_edges", "num_ntypes", "num_rels", "max_in_degree", "max_out_degree")


def _log(x: float) -> float:
    return math.log1p(max(float(x), 0.0))


def graph_features(stats: Mapping[str, Any]) -> dict[str, float]:
    """The graph part of a row, from :meth:`GraphStats.as_dict` (or the database's copy of it).

    Example:
        >>> graph_features({"num_edges": 99, "src_pair_ratio": 0.5})["num:graph:src_pair_ratio"]
        0.5
    """
    out: dict[str, float] = {}
    for k in _STAT_PLAIN:
        v = stats.get(k)
        out[f"num:graph:{k}"] = float(v) if v is not None else math.nan
    for k in _STAT_LOG:
        v = stats.get(k)
        out[f"num:graph:log_{k}"] = _log(v) if v is not None else math.nan
    e, n = stats.get("num_edges"), stats.get("num_nodes")
    rels, empty = stats.get("num_rels"), stats.get("empty_relations")
    # how skewed the hub is relative to the average: what decides load balance across threads
    if e and n and stats.get("max_in_degree") is not None:
        out["num:graph:hub_share"] = float(stats["max_in_degree"]) / float(e)
    if rels and empty is not None:
        out["num:graph:empty_rel_fraction"] = float(empty) / float(rels)
    return out


def _knob_features(config: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in sorted(config):
        value = config[name]
        out[f"is:knob:{name}={value}"] = 1.0
        # integer knobs (tile sizes, chunks, index bits) are ordered: give the trees the order too
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out[f"num:knob:{name}"] = math.log2(float(value))
    return out


def _count_features(c: Mapping[str, Any], base: Mapping[str, Any] | None, num_edges: float) -> dict[str, float]:
    out: dict[str, float] = {}
    e = max(float(num_edges), 1.0)
    keys = COUNT_KEYS + (TRAINING_COUNT_KEYS if c.get("backward_kernels") else ())
    for k in keys:
        v = float(c[k])
        out[f"num:log_{k}"] = _log(v)
        out[f"num:per_edge_{k}"] = _log(v / e)
        if base is not None:
            out[f"num:rel_{k}"] = _log(v) - _log(float(base[k]))
    flops, bmin, bgat = float(c["flops"]), float(c["bytes_min"]), float(c["bytes_gathered"])
    out["num:intensity"] = _log(flops / max(bmin, 1.0))
    out["num:gather_overhead"] = bgat / max(bmin, 1.0)  # how much a cache would save
    return out


@dataclass
class WorkloadContext:
    """What does not change between the trials of one workload: sizes, graph, device; its space.

    ``graph`` may be None (a graph of the history that cannot be loaded here): then the
    row has no counts (NaN) but keeps the knobs, statistics and sizes.
    """

    model: str
    in_dim: int
    out_dim: int
    heads: int
    backend: str
    device: str
    stats: dict[str, Any]
    graph: "HeteroGraph | None" = None
    target: str = "cpu"
    mode: str = "inference"  # "training": a point is the training program (forward and backward kernels)
    options: str = ""  # the model's options, canonical text
    #: import the model's module when it is not registered here (the name comes from a database row)
    trust_code: bool = False
    #: a sampler workload's sampler (canonical text, ``tune --batches``): rows describe one of its batches
    batches: str = ""
    _space: "SearchSpace | None" = field(default=None, repr=False)
    _sampled: "_SampledBlocks | None" = field(default=None, repr=False)
    _unsampled: bool = field(default=False, repr=False)  # drawing the sampler's batches failed (said once)
    _base_counts: dict[str, Any] | None = field(default=None, repr=False)
    _fixed: dict[str, float] | None = field(default=None, repr=False)

    @classmethod
    def create(cls, model: str, graph: "HeteroGraph", in_dim: int, out_dim: int, heads: int, *,
               backend: str, device: str, target: str | None = None, options: str = "") -> "WorkloadContext":
        """A context for a loaded graph (its statistics are read from it)."""
        return cls(model, in_dim, out_dim, heads, backend, device, dict(graph.stats.as_dict()), graph,
                   target or backend_target(backend), options=options)

    @property
    def space(self) -> "SearchSpace":
        """The workload's search space (built on first use; needs the graph)."""
        if self._space is None:
            self._space = self._make_space()
        return self._space

    def _make_space(self, **batch_program: bool) -> "SearchSpace":
        """The whole graph's space, or with ``destinations``/``input_grad`` a mini-batch program's."""
        from rgtune.ir.registry import recorded_model
        from rgtune.search_spaces import SearchSpace

        spec = recorded_model(self.model, origin="the trial database", trust_code=self.trust_code)
        # a history's schedules may store intermediates in 16 bits: every storage type the target has
        return SearchSpace(spec.build(self.in_dim, self.out_dim, self.heads, self.options),
                           self.graph, self.target, mode=self.mode, precision="any", **batch_program)

    @property
    def sampled(self) -> "_SampledBlocks | None":
        """A sampler workload's blocks and mini-batch spaces (None for a whole-graph one or without its graph)."""
        if self.batches and self.graph is not None and self._sampled is None and not self._unsampled:
            try:
                self._sampled = _SampledBlocks.draw(self)
            except Exception as e:  # noqa: BLE001 - a sampler of another version, a graph it draws nothing from
                self._unsampled = True  # the rows keep the knobs and the whole graph's statistics, no counts
                logging.getLogger("rgtune.costmodel").warning(
                    "cost model: cannot draw the batches of sampler %r from %r (%s: %s); its trials are learnt "
                    "without counts", self.batches, self.graph.name, type(e).__name__, e)
        return self._sampled

    def _compiled(self, config: Mapping[str, Any], kernels: "KernelProgram | None") -> "KernelProgram | None":
        if self.batches:  # the batch's program (the whole graph's ``kernels`` are not what runs); none undrawn
            try:
                return None if self.sampled is None else self.sampled.programs(config)[0]
            except Exception:  # noqa: BLE001 - as below
                return None
        if kernels is not None or self.graph is None:
            return kernels
        try:
            point = self.space.compile(config)
        except Exception:  # noqa: BLE001 - a knob set of another rgtune version: the row just has no counts
            return None
        return point.kernels if point.compiled is not None else None

    def _counts(self, config: Mapping[str, Any], kernels: "KernelProgram | None") -> dict[str, Any] | None:
        from rgtune.ir.counts import count

        if kernels is None or self.graph is None:
            return None
        try:
            if self.sampled is not None:  # (``kernels`` is then its full program: see _compiled)
                return self.sampled.counts(config, {**self.space.default(), **config})
            return count(kernels, self.graph, {**self.space.default(), **config})
        except Exception:  # noqa: BLE001 - as above
            return None

    @property
    def _shape_stats(self) -> dict[str, Any]:
        """The statistics the graph features describe: the whole graph's, or a sampler's largest block's."""
        return self.sampled.stats if self.sampled is not None else self.stats

    def _fixed_features(self) -> dict[str, float]:
        if self._fixed is None:
            stats = self._shape_stats
            fixed = graph_features(stats)
            fixed.update({
                "num:size:log_in_dim": math.log2(self.in_dim), "num:size:log_out_dim": math.log2(self.out_dim),
                "num:size:log_heads": math.log2(self.heads),
                # per-edge work of a dense message: what the counts scale with
                "num:size:log_edge_work": _log(float(stats.get("num_edges") or 0) * self.in_dim * self.out_dim),
                f"is:model={self.model}": 1.0, f"is:backend={self.backend}": 1.0, f"is:device={self.device}": 1.0,
                f"is:mode={self.mode}": 1.0,
            })
            if self.batches:
                fixed["is:batches"] = 1.0
            self._fixed = fixed
        return self._fixed

    def features(self, config: Mapping[str, Any], kernels: "KernelProgram | None" = None) -> dict[str, float]:
        """The feature row of one configuration (``kernels``: its compiled kernels, if at hand)."""
        row = dict(self._fixed_features())
        row.update(_knob_features(config))
        kernels = self._compiled(config, kernels)
        counts = self._counts(config, kernels)
        if counts is not None and kernels is not None:
            if self._base_counts is None:
                default = self.space.default()
                self._base_counts = self._counts(default, self._compiled(default, None)) or {}
            edges = self.sampled.edges_per_batch if self.sampled is not None else self.stats.get("num_edges")
            row.update(_count_features(counts, self._base_counts or None, float(edges or 0)))
            for k in kernels.kernels:
                key = f"is:kernel:{k.template}"
                row[key] = row.get(key, 0.0) + 1.0
        return row


def _drawn(graph: Any, spec: Any) -> list[Any]:
    """``spec``'s batches of ``graph`` (:meth:`SamplerSpec.sample <rgtune.data.sampler_spec.SamplerSpec.sample>`),
    drawn once per graph object and cached on it, as its counts are: the same spec draws the same batches,
    and every model's workload on one graph and sampler describes them (building a big graph's sampler is
    seconds of sorting)."""
    cache = graph.__dict__.setdefault("_rgtune_sampled", {})
    if spec.key not in cache:
        cache[spec.key] = spec.sample(graph)
    return cache[spec.key]


@dataclass
class _SampledBlocks:
    """A sampler workload's fixed batches as the cost model sees them: every block of the sampler's first
    batches (drawn as the tuner draws them), with the mini-batch spaces that compile a schedule's programs."""

    blocks: list[tuple[bool, Any]]  # (a first layer's block?, the block)
    num_batches: int
    spaces: "BlockSpaces"
    stats: dict[str, Any]
    edges_per_batch: float
    _last: tuple[Any, tuple[Any, Any]] | None = field(default=None, repr=False)

    @classmethod
    def draw(cls, ctx: WorkloadContext) -> "_SampledBlocks":
        from rgtune.data.sampler_spec import SamplerSpec
        from rgtune.data.sampling import largest_block, layer_blocks
        from rgtune.search_spaces import BlockSpaces

        assert ctx.graph is not None
        minibatches = _drawn(ctx.graph, SamplerSpec.parse(ctx.batches))
        blocks = layer_blocks(minibatches)
        if not blocks:
            raise ValueError(f"sampler {ctx.batches!r} draws no batch from graph {ctx.graph.name!r}")
        largest = largest_block(blocks)
        return cls(blocks, len(minibatches),
                   BlockSpaces(lambda g: ctx._make_space(destinations=True, input_grad=g), ctx.mode == "training"),
                   dict(largest.as_graph().stats.as_dict()),
                   sum(b.num_edges() for _, b in blocks) / len(minibatches))

    def programs(self, config: Mapping[str, Any]) -> tuple["KernelProgram | None", "KernelProgram | None"]:
        """``config``'s mini-batch programs: the full one and the one a first layer's block runs (the params'
        gradients program where the schedule makes one, else the full one); None where it makes none. The last
        configuration's are kept: a row compiles them once for its kernels and its counts."""
        key = tuple(sorted(config.items()))
        if self._last is None or self._last[0] != key:
            full, params_only = self.spaces.compile(config)
            programs: tuple[Any, Any] = ((None, None) if not full.valid else
                                         (full.kernels, (params_only or full).kernels))
            self._last = (key, programs)
        return self._last[1]

    def counts(self, config: Mapping[str, Any], full_config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The counts of ``config``'s mini-batch programs per batch (None where the schedule makes none)."""
        from rgtune.ir.counts import count

        full, first_layer = self.programs(config)
        if full is None:
            return None
        keys = COUNT_KEYS + TRAINING_COUNT_KEYS
        total = dict.fromkeys(keys, 0.0)
        for first, block in self.blocks:
            c = count(first_layer if first else full, block, full_config)
            for k in keys:
                total[k] += float(c.get(k) or 0)
        return {k: v / self.num_batches for k, v in total.items()}


@dataclass
class FeatureEncoder:
    """Feature rows -> a matrix with fixed, sorted columns (learned from the training rows).

    Example:
        >>> enc = FeatureEncoder.fit([{"num:a": 1.0, "is:x": 1.0}, {"num:b": 2.0}])
        >>> enc.columns
        ['is:x', 'num:a', 'num:b']
        >>> enc.transform([{"num:a": 3.0, "is:unseen": 1.0}]).tolist()
        [[0.0, 3.0, nan]]
    """

    columns: list[str]

    @classmethod
    def fit(cls, rows: Iterable[Mapping[str, float]]) -> "FeatureEncoder":
        names: set[str] = set()
        for r in rows:
            names.update(r)
        return cls(sorted(names))

    def transform(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        x = np.empty((len(rows), len(self.columns)), dtype=np.float64)
        missing = np.array([math.nan if c.startswith("num:") else 0.0 for c in self.columns])
        for i, r in enumerate(rows):
            x[i] = [r.get(c, m) for c, m in zip(self.columns, missing)]
        return x
