"""One layer's sampled subgraph (a block): destination nodes, the source nodes that reach them, their edges.

Mini-batch training gives each layer a new small graph every step: the nodes whose outputs the next
layer (or the loss) needs, the *destinations*, and the nodes their sampled in-edges come from, the
*sources*. A :class:`Batch` holds one, in the conventions of DGL's blocks and PyG's
``NeighborLoader``: per node type ``t`` there are ``num_src[t]`` source nodes, numbered ``0 ..
num_src[t] - 1``, and the first ``num_dst[t]`` of them are the destinations; per canonical edge type,
the edges as ``(source id, destination id)`` in those per-type numberings. Its node and edge types are
the layer's (the graph's it was made for): a batch may lack the edges of a relation or the nodes of a
type, but it has no type the layer does not know.

What the kernels see is one global numbering: every destination first (type by type), then every
source-only node (type by type). So a layer's output rows, the destinations', are the prefix
``0 .. num_dst_nodes - 1`` of its input rows, a destination reads its own input row at the same
index, and an edge's destination is always below ``num_dst_nodes``. Edges are global ids relation by
relation, as in a :class:`~rgtune.data.graph.HeteroGraph`. Building a batch is a few vectorized torch
ops over its own edges and nodes (no work proportional to the whole graph), on whatever device its
tensors are on; nothing is cached across batches (each is used once).

Example:
    >>> import torch
    >>> b = Batch(["author", "paper"], [("author", "writes", "paper"), ("paper", "cites", "paper")],
    ...           num_src={"author": 2, "paper": 3}, num_dst={"paper": 2},
    ...           edges={("author", "writes", "paper"): ([0, 1], [0, 1]), ("paper", "cites", "paper"): ([2], [0])})
    >>> b.num_nodes(), b.num_dst_nodes, b.node_type.tolist()   # the 2 destination papers, then the sources
    (5, 2, [1, 1, 0, 0, 1])
    >>> b.src.tolist(), b.dst.tolist()   # writes: authors 0, 1 (global 2, 3); cites: paper 2 (global 4)
    ([2, 3, 4], [0, 1, 0])
    >>> x = {"author": torch.tensor([[1.0], [2.0]]), "paper": torch.tensor([[10.0], [11.0], [12.0]])}
    >>> b.flatten_src(x).flatten().tolist()
    [10.0, 11.0, 1.0, 2.0, 12.0]
    >>> {t: v.flatten().tolist() for t, v in b.split_dst(torch.tensor([[5.0], [6.0]])).items()}
    {'author': [], 'paper': [5.0, 6.0]}
"""

from __future__ import annotations

import copy
import itertools
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import torch

from rgtune.data.graph import CanonicalEType, HeteroGraph

__all__ = ["Batch", "BatchTypeError"]

#: what binding kernels keeps on a graph or a batch (:func:`rgtune.ir.bind.graph_arrays`, the backends' tables)
#: is under attribute names that start so
_DERIVED = "_rgtune"


class BatchTypeError(ValueError):
    """A batch names a node or edge type the layer was not made for."""


class Batch:
    """A block of one layer (see the module docstring).

    Args:
        ntypes: the layer's node types, in its order (a :class:`HeteroGraph`'s ``ntypes``).
        canonical_etypes: the layer's canonical edge types, in its order.
        num_src: source nodes per node type (a type left out has none).
        num_dst: destination nodes per node type, at most ``num_src`` of it (the first ones).
        edges: per canonical edge type (any subset of ``canonical_etypes``), ``(src, dst)`` per-type ids:
            ``src < num_src[src type]``, ``dst < num_dst[dst type]``.
        name: a label for messages.
        check: validate the ids (one pass over the edges; off for a sampler that builds them in range).
    """

    def __init__(self, ntypes: Sequence[str], canonical_etypes: Sequence[CanonicalEType], *,
                 num_src: Mapping[str, int], num_dst: Mapping[str, int],
                 edges: Mapping[CanonicalEType, tuple[object, object]], name: str = "batch", check: bool = True) -> None:
        self._counts(ntypes, canonical_etypes, num_src, num_dst, name)
        _known("edge type", edges, self._rel_id, self.canonical_etypes)
        src_parts, dst_parts, sizes = [], [], []
        device = None
        for cet in self.canonical_etypes:
            s, d = edges.get(cet, ((), ()))
            s, d = _index(s, device), _index(d, device)
            device = device or (s.device if s.numel() else None)
            if s.numel() != d.numel():
                raise ValueError(f"batch {name!r}: edge type {cet} has {s.numel()} sources and {d.numel()} "
                                 "destinations")
            st, dt = self._ntype_id[cet[0]], self._ntype_id[cet[2]]
            if check and s.numel():
                _in_range(name, cet, "source", s, self.num_src[cet[0]])
                _in_range(name, cet, "destination", d, self.num_dst[cet[2]])
            src_parts.append(self._global(s, st))
            dst_parts.append(d + self._dst_base[dt])
            sizes.append(s.numel())
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        self._edges(torch.cat([p.to(empty.device) for p in src_parts]) if src_parts else empty,
                    torch.cat([p.to(empty.device) for p in dst_parts]) if dst_parts else empty,
                    torch.tensor(sizes, dtype=torch.int64))

    @classmethod
    def from_global(cls, ntypes: Sequence[str], canonical_etypes: Sequence[CanonicalEType], *,
                    num_src: Sequence[int], num_dst: Sequence[int], src: torch.Tensor, dst: torch.Tensor,
                    rel_counts: torch.Tensor, name: str = "batch") -> "Batch":
        """A batch from its global numbering directly (a sampler's: no per-relation work): per type (in
        ``ntypes`` order) its source and destination counts, the edges relation by relation as global ids
        (``src < num_nodes``, ``dst < num_dst_nodes``) and the edges of each relation. Not checked."""
        b = cls.__new__(cls)
        b._counts(ntypes, canonical_etypes, dict(zip(ntypes, num_src)), dict(zip(ntypes, num_dst)), name)
        b._edges(src, dst, rel_counts.to(torch.int64).cpu())
        return b

    def _counts(self, ntypes: Sequence[str], canonical_etypes: Sequence[CanonicalEType], num_src: Mapping[str, int],
                num_dst: Mapping[str, int], name: str) -> None:
        """The node types, their counts and the global numbering (see the module docstring)."""
        self.name = name
        self.ntypes = list(ntypes)
        self.canonical_etypes = [tuple(c) for c in canonical_etypes]
        self._ntype_id = {t: i for i, t in enumerate(self.ntypes)}
        self._rel_id = {c: i for i, c in enumerate(self.canonical_etypes)}
        _known("node type", num_src, self._ntype_id, self.ntypes)
        _known("node type", num_dst, self._ntype_id, self.ntypes)
        n_src = [int(num_src.get(t, 0)) for t in self.ntypes]
        n_dst = [int(num_dst.get(t, 0)) for t in self.ntypes]
        for t, s, d in zip(self.ntypes, n_src, n_dst):
            if not 0 <= d <= s:
                raise ValueError(f"batch {name!r}: node type {t!r} has {d} destinations but {s} source nodes; the "
                                 "destinations are the first source nodes, so 0 <= num_dst <= num_src")
        self.num_src, self.num_dst = dict(zip(self.ntypes, n_src)), dict(zip(self.ntypes, n_dst))
        self.num_dst_nodes = sum(n_dst)
        self._num_nodes = sum(n_src)
        # global id of a type's local id i: dst_base[t] + i for a destination, src_base[t] + i - n_dst[t] after
        only = [s - d for s, d in zip(n_src, n_dst)]
        self._dst_base = [0, *itertools.accumulate(n_dst)][:-1]
        self._src_base = [self.num_dst_nodes + b for b in [0, *itertools.accumulate(only)][:-1]]
        self._n_dst = n_dst
        #: the runs of one node type in the global order: offsets and each run's type (destinations, then sources)
        self.node_run_offsets = torch.tensor([0, *itertools.accumulate(n_dst + only)], dtype=torch.int64)
        self.node_run_type = torch.arange(len(self.ntypes)).repeat(2)
        self.src_ntype_of_rel = torch.tensor([self._ntype_id[c[0]] for c in self.canonical_etypes], dtype=torch.int64)
        self.dst_ntype_of_rel = torch.tensor([self._ntype_id[c[2]] for c in self.canonical_etypes], dtype=torch.int64)

    def _edges(self, src: torch.Tensor, dst: torch.Tensor, rel_counts: torch.Tensor) -> None:
        """The edges, global ids relation by relation, and the per-node and per-edge types."""
        self.src, self.dst = src, dst
        device = src.device
        counts = torch.tensor(self._n_dst + [n - d for n, d in zip(self.num_src.values(), self._n_dst)])
        self.node_type = torch.arange(len(self.ntypes)).repeat(2).repeat_interleave(counts).to(device)
        self.rel_offsets = torch.cat([rel_counts.new_zeros(1), rel_counts.cumsum(0)])
        self.etype = torch.arange(rel_counts.numel()).repeat_interleave(rel_counts).to(device)

    def _global(self, local: torch.Tensor, t: int) -> torch.Tensor:
        """Global ids of type ``t``'s local ids (destinations first, then the type's source-only nodes)."""
        d = self._n_dst[t]
        return torch.where(local < d, local + self._dst_base[t], local - d + self._src_base[t])

    # ------------------------------------------------------------------ what the kernels' arrays read
    @property
    def num_rels(self) -> int:
        return len(self.canonical_etypes)

    @property
    def num_ntypes(self) -> int:
        return len(self.ntypes)

    def num_nodes(self, ntype: str | None = None) -> int:
        """Every node of the batch (sources, destinations among them), or a type's source nodes."""
        return self._num_nodes if ntype is None else self.num_src[ntype]

    def num_edges(self) -> int:
        return int(self.src.numel())

    @property
    def device(self) -> torch.device:
        return self.src.device

    def unbound(self) -> "Batch":
        """This batch as its sampler made it: the same edges and counts (shared, not copied), without what
        binding kernels derived from them (index arrays, the kernels' tables: kept on the batch for its
        forward and backward). What a tuner times a binding on, since a new batch never has them."""
        fresh = copy.copy(self)
        fresh.__dict__ = {k: v for k, v in self.__dict__.items() if not k.startswith(_DERIVED)}
        return fresh

    @contextmanager
    def derived_once(self) -> Iterator[None]:
        """Nothing to let go of: a batch's structures are built from its own edges, never cached on disk."""
        yield

    # ------------------------------------------------------------------ inputs and outputs
    def flatten_src(self, per_type: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``{ntype: (num_src[t], F)}`` (per-type source order, destinations first) in the global order."""
        unknown = sorted(set(per_type) - set(self.ntypes))
        if unknown:
            raise BatchTypeError(f"batch {self.name!r}: input for node types {unknown} the layer was not made for; "
                                 f"its node types: {self.ntypes}")
        dst, src = [], []
        for t in self.ntypes:
            n, d = self.num_src[t], self.num_dst[t]
            if n == 0 and t not in per_type:
                continue
            if t not in per_type:
                raise ValueError(f"batch {self.name!r}: no input for node type {t!r}, which has {n} source nodes")
            x = per_type[t]
            if x.dim() != 2 or x.size(0) != n:
                raise ValueError(f"batch {self.name!r}: the input of node type {t!r} must be ({n}, features): its "
                                 f"source nodes, destinations first; got shape {tuple(x.shape)}")
            dst.append(x[:d])
            src.append(x[d:])
        parts = dst + src
        if not parts:
            raise ValueError(f"batch {self.name!r} has no nodes")
        return torch.cat(parts, 0)

    def split_dst(self, out: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``(num_dst_nodes, F)`` output rows as ``{ntype: (num_dst[t], F)}``."""
        return {t: out[b:b + self.num_dst[t]] for t, b in zip(self.ntypes, self._dst_base)}

    def as_graph(self) -> HeteroGraph:
        """The block as a graph over its source nodes (per type the caller's numbering: destinations first),
        its edges relation by relation: what a layer is made for (and its schedule looked up by) when the
        first thing it sees is a batch. Built on request, not kept.

        Example:
            >>> b = Batch(["a"], [("a", "r", "a")], num_src={"a": 3}, num_dst={"a": 1},
            ...           edges={("a", "r", "a"): ([2], [0])})
            >>> g = b.as_graph()
            >>> g.num_nodes("a"), [e.tolist() for e in g.edges(("a", "r", "a"))]
            (3, [[2], [0]])
        """
        ids = torch.arange(self._num_nodes, device=self.device)
        t = self.node_type
        dst_base, src_base, n_dst = (torch.tensor(v, device=self.device)
                                     for v in (self._dst_base, self._src_base, self._n_dst))
        local = torch.where(ids < self.num_dst_nodes, ids - dst_base[t], ids - src_base[t] + n_dst[t])
        bounds = self.rel_offsets.tolist()
        edges = {c: (local[self.src[a:b]], local[self.dst[a:b]])
                 for c, a, b in zip(self.canonical_etypes, bounds[:-1], bounds[1:])}
        return HeteroGraph(dict(self.num_src), edges, name=self.name)

    def src_positions(self, ntype: str) -> torch.Tensor:
        """The global rows of ``ntype``'s source nodes, in their per-type order (a gather of the flat input)."""
        t = self._ntype_id[ntype]
        return self._global(torch.arange(self.num_src[ntype], device=self.device), t)

    def __repr__(self) -> str:
        return (f"Batch({self.name!r}, {self.num_dst_nodes:,} destinations, {self._num_nodes:,} nodes, "
                f"{self.num_edges():,} edges, {self.num_rels} relations)")


def _known(what: str, given: Mapping, ids: Mapping, valid: Sequence) -> None:
    unknown = [k for k in given if tuple(k) not in ids and k not in ids] if what == "edge type" else \
        [k for k in given if k not in ids]
    if unknown:
        raise BatchTypeError(f"the batch has {what}s {unknown} that the layer was not made for; its {what}s: "
                             f"{list(valid)}")


def _index(values: object, device: torch.device | None) -> torch.Tensor:
    t = values if isinstance(values, torch.Tensor) else torch.as_tensor(values, dtype=torch.int64, device=device)
    if t.dtype != torch.int64:
        t = t.long()
    return t.reshape(-1)


def _in_range(name: str, cet: CanonicalEType, end: str, ids: torch.Tensor, n: int) -> None:
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        raise ValueError(f"batch {name!r}: edge type {cet}: a {end} id ({lo if lo < 0 else hi}) is outside "
                         f"[0, {n}) of its node type")
