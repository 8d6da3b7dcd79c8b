"""A sampler written as text: what ``tune --batches`` tunes for and ``load_tuned(batches=...)`` looks up.

``neighbor:fanout=15x10,batch_size=1024`` is a :class:`~rgtune.data.sampling.NeighborLoader` of fan-outs
15 and 10 (one per layer, **first layer first**, as DGL's ``MultiLayerNeighborSampler`` lists them; PyG's
``num_neighbors`` lists them from the seeds outwards, so PyG's ``[10, 15]`` is this ``15x10``; ``-1``
takes every in-neighbour) and 1024 seeds per batch. The seeds are the training nodes of the graph's
task where it has one (AIFB's ``Personen``), else every node of ``seed_type`` (default: the node type
with the most in-edges: ogbn-mag's ``paper``). Two more fields say how a tuner *measures* it, not what it
is, so they are not part of its :attr:`~SamplerSpec.key`: ``batches`` (how many batches every trial times,
default 4: the loader's first ones, over more than one epoch where an epoch has fewer) and ``seed`` (the
shuffle and draws, default 0): every trial of a study times the same batches, and its time is per batch.

Example:
    >>> spec = SamplerSpec.parse("neighbor: batch_size=16, fanout=10x5, batches=2")
    >>> spec.key, spec.batches, spec.fanouts
    ('neighbor:fanout=10x5,batch_size=16', 2, (10, 5))
    >>> str(spec)
    'neighbor:fanout=10x5,batch_size=16,batches=2'
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((50, 80), num_relations=3, num_edges=900, seed=0)
    >>> mbs = spec.sample(g)
    >>> len(mbs), [len(mb.blocks) for mb in mbs], spec.seed_type(g)
    (2, [2, 2], 'n0')
    >>> SamplerSpec.parse("neighbor:fanout=10x5")
    Traceback (most recent call last):
    ...
    ValueError: sampler 'neighbor:fanout=10x5': missing batch_size (e.g. neighbor:fanout=15x10,batch_size=1024)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from rgtune.data.graph import HeteroGraph
from rgtune.data.sampling import MiniBatch, NeighborLoader

__all__ = ["SamplerSpec", "EXAMPLE"]

#: how the spec is written, for messages
EXAMPLE = "neighbor:fanout=15x10,batch_size=1024"
_KINDS = ("neighbor",)
_FIELDS = ("fanout", "batch_size", "seed_type", "batches", "seed")
_DEFAULT_BATCHES, _DEFAULT_SEED = 4, 0


@dataclass(frozen=True)
class SamplerSpec:
    """A neighbour sampler (see the module docstring): fan-outs per layer, batch size, seed node type,
    and how many batches of which seed a tuner times."""

    fanouts: tuple[int, ...]
    batch_size: int
    seed_type_name: str | None = None
    batches: int = _DEFAULT_BATCHES
    seed: int = _DEFAULT_SEED
    kind: str = "neighbor"

    def __post_init__(self) -> None:
        text = f"sampler {str(self)!r}"
        if self.kind not in _KINDS:
            raise ValueError(f"{text}: unknown kind {self.kind!r}; choose one of {list(_KINDS)}")
        if not self.fanouts or any(f == 0 or f < -1 for f in self.fanouts):
            raise ValueError(f"{text}: fanout must be one count per layer, each positive or -1 (every "
                             f"in-neighbour), joined by 'x', got {'x'.join(map(str, self.fanouts)) or 'none'}")
        for name, least in (("batch_size", 1), ("batches", 1), ("seed", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{text}: {name} must be at least {least}, got {getattr(self, name)}")

    @classmethod
    def parse(cls, text: "str | SamplerSpec") -> "SamplerSpec":
        """The spec of ``text`` (``kind:field=value,...``; spaces ignored); a bad field is a ``ValueError``
        naming it and the valid ones."""
        if isinstance(text, SamplerSpec):
            return text
        if not isinstance(text, str):
            raise TypeError(f"a sampler is written as text (e.g. {EXAMPLE}), got {type(text).__name__}")
        kind, colon, rest = text.replace(" ", "").partition(":")
        if not colon or kind not in _KINDS:
            raise ValueError(f"sampler {text!r}: write it as kind:field=value,... with kind one of {list(_KINDS)} "
                             f"(e.g. {EXAMPLE})")
        fields: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            name, eq, value = item.partition("=")
            if not eq or name not in _FIELDS:
                raise ValueError(f"sampler {text!r}: unknown field {item!r}; the fields are {list(_FIELDS)} "
                                 f"(e.g. {EXAMPLE})")
            if name in fields:
                raise ValueError(f"sampler {text!r}: {name} given twice")
            fields[name] = value
        for needed in ("fanout", "batch_size"):
            if needed not in fields:
                raise ValueError(f"sampler {text!r}: missing {needed} (e.g. {EXAMPLE})")
        try:
            fanouts = tuple(int(f) for f in fields["fanout"].split("x"))
            ints = {k: int(fields[k]) for k in ("batch_size", "batches", "seed") if k in fields}
        except ValueError:
            raise ValueError(f"sampler {text!r}: fanout is counts joined by 'x' (15x10), batch_size, batches and "
                             "seed are integers") from None
        return cls(fanouts, seed_type_name=fields.get("seed_type") or None, **ints)

    @property
    def key(self) -> str:
        """What the sampler is, canonical text (the workload key's ``batches``): kind, fan-outs, batch size
        and, when given, the seed type; not how many batches a tuner times, nor their seed."""
        seed_type = f",seed_type={self.seed_type_name}" if self.seed_type_name else ""
        return f"{self.kind}:fanout={'x'.join(map(str, self.fanouts))},batch_size={self.batch_size}{seed_type}"

    def __str__(self) -> str:
        """The key, with ``batches`` and ``seed`` where they are not the defaults."""
        extra = "".join(f",{k}={v}" for k, v, d in (("batches", self.batches, _DEFAULT_BATCHES),
                                                    ("seed", self.seed, _DEFAULT_SEED)) if v != d)
        return self.key + extra

    def seed_type(self, graph: HeteroGraph) -> str:
        """The node type of the seeds: the one named, else the task's, else the type with the most in-edges."""
        if self.seed_type_name is not None:
            if self.seed_type_name not in graph.ntypes:
                raise ValueError(f"sampler {self.key!r}: graph {graph.name!r} has no node type "
                                 f"{self.seed_type_name!r}; its node types: {graph.ntypes}")
            return self.seed_type_name
        if graph.task is not None:
            return graph.task.category
        return max(graph.ntypes, key=lambda t: sum(graph.num_edges(c) for c in graph.canonical_etypes if c[2] == t))

    def seeds(self, graph: HeteroGraph) -> dict[str, torch.Tensor]:
        """The seed nodes: the task's training nodes when they are of the seed type, else all of its nodes."""
        t = self.seed_type(graph)
        task = graph.task
        ids = task.train_idx if task is not None and task.category == t else torch.arange(graph.num_nodes(t))
        return {t: torch.as_tensor(ids, dtype=torch.int64)}

    def loader(self, graph: HeteroGraph) -> NeighborLoader:
        """The sampler's loader over ``graph`` (shuffled with ``seed``)."""
        return NeighborLoader(graph, list(self.fanouts), self.seeds(graph), batch_size=self.batch_size, seed=self.seed)

    def sample(self, graph: HeteroGraph) -> list[MiniBatch]:
        """The loader's first ``batches`` batches, from its first epoch and, where that epoch is shorter (AIFB's
        140 training nodes are one batch of 512), the next ones: the same batches for the same spec and graph,
        whatever the process."""
        loader, drawn = self.loader(graph), []
        while len(drawn) < self.batches:
            before = len(drawn)
            drawn += itertools.islice(iter(loader), self.batches - len(drawn))
            if len(drawn) == before:  # no seed nodes: no batch at all
                break
        return drawn
