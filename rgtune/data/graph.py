"""The heterogeneous graph every pass and kernel of rgtune reads.

A :class:`HeteroGraph` holds node types with their counts and, per canonical edge type
``(src type, relation, dst type)``, the edges as per-type node ids, as DGL does. On top of
that it numbers everything globally, the way generated kernels want it:

* **global node ids**: the node types one after another, in :attr:`HeteroGraph.ntypes` order
  (``node_offsets[t] <= id < node_offsets[t+1]`` are the nodes of type ``t``);
* **global edge ids**: the canonical edge types one after another, each in the user's
  order (``rel_offsets[r] <= e < rel_offsets[r+1]`` are the edges of relation ``r``).
  "Relation" in rgtune always means a *canonical* edge type: AIFB has 104 of them
  (78 distinct names).

Derived structures are built on first use and cached on the graph (the graph is immutable):
relation-segmented layouts sorted by destination or source, CSR by destination, the unique
(node, relation) pairs with the edge -> pair map, and statistics. The sorted ones take seconds
on a graph of tens of millions of edges, so on a graph of at least :data:`DISK_CACHE_MIN_EDGES`
edges they are also cached on disk beside the processed graphs (see :mod:`rgtune.data._cache`):
the first process that builds one writes it, later ones (tuner workers, bench processes) read it.

Example:
    >>> import torch
    >>> g = HeteroGraph(
    ...     {"paper": 3, "author": 2},
    ...     {("author", "writes", "paper"): (torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1])),
    ...      ("paper", "cites", "paper"): (torch.tensor([1, 2]), torch.tensor([0, 0]))},
    ... )
    >>> g.ntypes, g.num_nodes(), g.num_edges("cites")
    (['author', 'paper'], 5, 2)
    >>> g.unique_pairs("src").num_pairs  # (author 0, writes), (author 1, writes), (paper 1, cites), (paper 2, cites)
    4
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np
import torch

CanonicalEType = tuple[str, str, str]
Side = Literal["src", "dst"]

__all__ = [
    "CanonicalEType",
    "EdgeLayout",
    "CSR",
    "UniquePairs",
    "GraphStats",
    "NodeTask",
    "HeteroGraph",
    "DISK_CACHE_MIN_EDGES",
]

#: Graphs with fewer edges build their derived structures in less time than reading a file takes,
#: so only larger ones use the disk cache (the tests lower it to exercise the cache on small graphs).
DISK_CACHE_MIN_EDGES = 100_000

#: The on-disk format version of each cached structure: bump one when its builder or its fields
#: change, so no process ever reads a file of the old format.
_DERIVED_VERSIONS = {"layout": 1, "csr": 1, "pairs": 1}
#: the cached properties that hold disk-cached structures: attribute -> (structure, kind)
_DISK_DERIVED = {"_layout_dst": ("layout-dst", "layout"), "_layout_src": ("layout-src", "layout"),
                 "csr_by_dst": ("csr-dst", "csr"), "_pairs_src": ("pairs-src", "pairs"),
                 "_pairs_dst": ("pairs-dst", "pairs")}


@dataclass(frozen=True)
class EdgeLayout:
    """Edges grouped by relation, each relation's block sorted by ``order`` (then the other end).

    ``eid[i]`` is the global edge id of the ``i``-th edge of this layout, so a per-edge tensor
    in graph order is brought into layout order by ``t[eid]``.
    """

    order: Side
    src: torch.Tensor  # global source node id, int64, (E,)
    dst: torch.Tensor  # global destination node id, int64, (E,)
    etype: torch.Tensor  # relation id, int64, (E,)
    eid: torch.Tensor  # global edge id in graph order, int64, (E,)
    rel_offsets: torch.Tensor  # (R+1,), the same as the graph's


@dataclass(frozen=True)
class CSR:
    """Incoming edges of every global node: ``indptr`` over destination nodes.

    Within one destination, edges are grouped by relation, then sorted by source.
    """

    indptr: torch.Tensor  # (N+1,)
    src: torch.Tensor  # (E,) global source of each in-edge
    etype: torch.Tensor  # (E,) relation of each in-edge
    eid: torch.Tensor  # (E,) global edge id


@dataclass(frozen=True)
class UniquePairs:
    """The unique (node, relation) pairs on one side of the edges.

    Pairs are sorted by relation, then node; ``pair_offsets[r]:pair_offsets[r+1]`` are the pairs
    of relation ``r``. ``edge_to_pair[e]`` is the pair of global edge ``e``; ``pair_count`` is how
    many edges share a pair (for ``side="dst"``: the in-degree of a node within one relation).
    """

    side: Side
    node: torch.Tensor  # (P,) global node id
    etype: torch.Tensor  # (P,) relation id
    pair_offsets: torch.Tensor  # (R+1,)
    edge_to_pair: torch.Tensor  # (E,) in graph edge order
    pair_count: torch.Tensor  # (P,)

    @property
    def num_pairs(self) -> int:
        return int(self.node.numel())

    def pairs_per_relation(self) -> torch.Tensor:
        return self.pair_offsets[1:] - self.pair_offsets[:-1]


@dataclass(frozen=True)
class GraphStats:
    """What the cost model and the docs need to know of a graph's shape."""

    num_nodes: int
    num_edges: int
    num_ntypes: int
    num_rels: int
    max_in_degree: int
    mean_in_degree: float
    in_degree_cv: float  # coefficient of variation of in-degrees (skew)
    max_out_degree: int
    out_degree_cv: float
    isolated_nodes: int
    empty_relations: int
    src_pairs: int
    dst_pairs: int
    src_pair_ratio: float  # unique (src, rel) pairs / edges: the compact GEMM's row fraction
    dst_pair_ratio: float
    edges_per_relation_cv: float

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


@dataclass
class NodeTask:
    """An entity-classification task on one node type (AIFB: ``Personen``)."""

    category: str
    num_classes: int
    train_idx: torch.Tensor  # per-type ids of ``category``
    train_labels: torch.Tensor
    test_idx: torch.Tensor
    test_labels: torch.Tensor


def _as_index(values: object, what: str) -> torch.Tensor:
    t = torch.as_tensor(values)
    # An empty list or array defaults to a float dtype; it holds no ids, so it is a valid empty index.
    if (t.dtype.is_floating_point and t.numel() > 0) or t.dtype == torch.bool:
        raise TypeError(f"{what} must be an integer tensor, got {t.dtype}")
    return t.reshape(-1).to(torch.int64).contiguous()


def _cv(x: torch.Tensor) -> float:
    x = x.double()
    if x.numel() == 0 or float(x.mean()) == 0.0:
        return 0.0
    return float(x.std(unbiased=False) / x.mean())


_INT64_MAX = 2**63 - 1


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for a 1-d int64 ``index``: ``index_select`` does the same gather about twice
    as fast on the CPU as advanced indexing, which matters at tens of millions of edges.

    Example:
        >>> _take(torch.tensor([10, 20, 30]), torch.tensor([2, 0])).tolist()
        [30, 10]
    """
    return torch.index_select(values, 0, index)


def _lexsort(keys: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The stable argsort of int64 ``keys``, most significant first, each ``(values, bound)`` with
    ``0 <= values < bound``: what ``np.lexsort`` of the reversed keys gives, ties in index order.

    Keys whose bounds multiply to within int64 are fused into one composite key, so the common case
    is one stable sort of one array (several times faster than ``np.lexsort``'s pass per key);
    keys too wide to fuse are sorted least significant first, each pass stable.

    Example:
        >>> a, b = torch.tensor([1, 0, 1, 0, 1]), torch.tensor([2, 2, 0, 2, 0])
        >>> _lexsort([(a, 2), (b, 3)]).tolist()
        [1, 3, 2, 4, 0]
        >>> _lexsort([(a, 2**40), (b, 2**40)]).tolist()  # too wide to fuse: two passes
        [1, 3, 2, 4, 0]
    """
    groups: list[torch.Tensor] = []
    fused: torch.Tensor | None = None
    span = 1
    for values, bound in reversed(keys):
        bound = max(int(bound), 1)
        if fused is None:
            fused, span = values, bound
        elif span * bound <= _INT64_MAX:
            fused, span = values * span + fused, span * bound
        else:
            groups.append(fused)
            fused, span = values, bound
    if fused is None:
        raise ValueError("_lexsort needs at least one key")
    groups.append(fused)
    perm = torch.sort(groups[0], stable=True).indices
    for key in groups[1:]:
        perm = perm[torch.sort(key[perm], stable=True).indices]
    return perm


class HeteroGraph:
    """A typed multi-relational graph; immutable once built.

    Args:
        num_nodes_dict: node count per node type. The order of ``ntypes`` is sorted by name,
            so the same graph numbers its nodes the same way whatever order the dict has.
        edges: per canonical edge type ``(src type, relation, dst type)``, the ``(src, dst)``
            per-type node ids. Relations are kept in sorted order of their canonical tuple.
            A relation may have no edges.
        name: a label for messages and the database (``"aifb"``).
        features: optional input features per node type.
        task: optional node-classification task.
    """

    def __init__(
        self,
        num_nodes_dict: Mapping[str, int],
        edges: Mapping[CanonicalEType, tuple[object, object]],
        name: str = "graph",
        features: Mapping[str, torch.Tensor] | None = None,
        task: NodeTask | None = None,
    ) -> None:
        self.name = name
        self.ntypes: list[str] = sorted(num_nodes_dict)
        self._ntype_id = {t: i for i, t in enumerate(self.ntypes)}
        counts = [int(num_nodes_dict[t]) for t in self.ntypes]
        if any(c < 0 for c in counts):
            raise ValueError(f"negative node count in {dict(num_nodes_dict)}")
        self._num_nodes = dict(zip(self.ntypes, counts))
        self.node_offsets = torch.tensor([0] + list(np.cumsum(counts, dtype=np.int64)), dtype=torch.int64)

        self.canonical_etypes: list[CanonicalEType] = sorted(tuple(c) for c in edges)  # type: ignore[misc]
        self._rel_id = {c: i for i, c in enumerate(self.canonical_etypes)}
        self._typed_edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]] = {}
        for cet in self.canonical_etypes:
            if len(cet) != 3:
                raise ValueError(f"canonical edge type must be (src type, relation, dst type), got {cet!r}")
            stype, _, dtype_ = cet
            for t in (stype, dtype_):
                if t not in self._num_nodes:
                    raise ValueError(f"edge type {cet} names node type {t!r}, which is not among {self.ntypes}")
            s, d = edges[cet]
            s, d = _as_index(s, f"src of {cet}"), _as_index(d, f"dst of {cet}")
            if s.numel() != d.numel():
                raise ValueError(f"edge type {cet}: {s.numel()} sources but {d.numel()} destinations")
            for ids, t, end in ((s, stype, "src"), (d, dtype_, "dst")):
                if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self._num_nodes[t]):
                    raise ValueError(
                        f"edge type {cet}: {end} id out of range [0, {self._num_nodes[t]}) of node type {t!r}"
                    )
            self._typed_edges[cet] = (s, d)

        rel_sizes = [self._typed_edges[c][0].numel() for c in self.canonical_etypes]
        self.rel_offsets = torch.tensor([0] + list(np.cumsum(rel_sizes, dtype=np.int64)), dtype=torch.int64)
        self.src_ntype_of_rel = torch.tensor([self._ntype_id[c[0]] for c in self.canonical_etypes], dtype=torch.int64)
        self.dst_ntype_of_rel = torch.tensor([self._ntype_id[c[2]] for c in self.canonical_etypes], dtype=torch.int64)
        if self.canonical_etypes:
            self.src = torch.cat([self._typed_edges[c][0] + self.node_offsets[self._ntype_id[c[0]]] for c in self.canonical_etypes])
            self.dst = torch.cat([self._typed_edges[c][1] + self.node_offsets[self._ntype_id[c[2]]] for c in self.canonical_etypes])
        else:
            self.src = torch.zeros(0, dtype=torch.int64)
            self.dst = torch.zeros(0, dtype=torch.int64)
        self.etype = torch.repeat_interleave(torch.arange(len(rel_sizes), dtype=torch.int64), torch.tensor(rel_sizes, dtype=torch.int64))
        self.node_type = torch.repeat_interleave(torch.arange(len(counts), dtype=torch.int64), torch.tensor(counts, dtype=torch.int64))

        self.features: dict[str, torch.Tensor] = dict(features or {})
        self.task = task

    # ------------------------------------------------------------------ DGL-style queries
    @property
    def etypes(self) -> list[str]:
        """Relation names, one per canonical edge type (names may repeat, as in DGL)."""
        return [c[1] for c in self.canonical_etypes]

    @property
    def num_rels(self) -> int:
        return len(self.canonical_etypes)

    @property
    def num_ntypes(self) -> int:
        return len(self.ntypes)

    def num_nodes(self, ntype: str | None = None) -> int:
        if ntype is None:
            return int(self.node_offsets[-1])
        return self._num_nodes[self._check_ntype(ntype)]

    def num_edges(self, etype: str | CanonicalEType | None = None) -> int:
        if etype is None:
            return int(self.rel_offsets[-1])
        return int(self._typed_edges[self.to_canonical_etype(etype)][0].numel())

    def edges(self, etype: str | CanonicalEType | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` per-type node ids of one edge type (``etype`` may be omitted if there is one)."""
        if etype is None:
            if self.num_rels != 1:
                raise ValueError(f"edges(): this graph has {self.num_rels} edge types; name one with etype=")
            etype = self.canonical_etypes[0]
        return self._typed_edges[self.to_canonical_etype(etype)]

    def to_canonical_etype(self, etype: str | Sequence[str]) -> CanonicalEType:
        if isinstance(etype, str):
            matches = [c for c in self.canonical_etypes if c[1] == etype]
            if len(matches) == 1:
                return matches[0]
            if not matches:
                raise KeyError(f"unknown edge type {etype!r}; known relation names: {sorted(set(self.etypes))[:20]}")
            raise KeyError(f"edge type {etype!r} is ambiguous: {matches[:5]}...; pass a canonical (src, rel, dst) tuple")
        cet = tuple(etype)
        if cet not in self._rel_id:
            raise KeyError(f"unknown canonical edge type {cet!r}")
        return cet  # type: ignore[return-value]

    def rel_id(self, etype: str | CanonicalEType) -> int:
        return self._rel_id[self.to_canonical_etype(etype)]

    def ntype_id(self, ntype: str) -> int:
        return self._ntype_id[self._check_ntype(ntype)]

    def _check_ntype(self, ntype: str) -> str:
        if ntype not in self._num_nodes:
            raise KeyError(f"unknown node type {ntype!r}; known: {self.ntypes}")
        return ntype

    def to_global(self, ntype: str, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.node_offsets[self.ntype_id(ntype)]

    # ------------------------------------------------------------- features: dict <-> flat
    def flatten_nodes(self, per_type: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Stack per-type node tensors into global node order (every node type must be present)."""
        missing = [t for t in self.ntypes if t not in per_type and self._num_nodes[t] > 0]
        if missing:
            raise KeyError(f"missing tensors for node types {missing}")
        parts = []
        ref = next(iter(per_type.values()))
        for t in self.ntypes:
            v = per_type.get(t)
            if v is None:
                v = ref.new_zeros((0,) + tuple(ref.shape[1:]))
            if v.shape[0] != self._num_nodes[t]:
                raise ValueError(f"node type {t!r}: expected {self._num_nodes[t]} rows, got {v.shape[0]}")
            parts.append(v)
        return torch.cat(parts, 0)

    def split_nodes(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inverse of :meth:`flatten_nodes`."""
        return {t: flat[int(self.node_offsets[i]) : int(self.node_offsets[i + 1])] for i, t in enumerate(self.ntypes)}

    # --------------------------------------------------------------- derived, cached
    def layout(self, order: Side = "dst") -> EdgeLayout:
        """Edges segmented by relation; within a relation sorted by ``order`` then the other end."""
        if order not in ("dst", "src"):
            raise ValueError(f"layout order must be 'dst' or 'src', got {order!r}")
        return self._layout_dst if order == "dst" else self._layout_src

    @cached_property
    def _layout_dst(self) -> EdgeLayout:
        return self._make_layout("dst")

    @cached_property
    def _layout_src(self) -> EdgeLayout:
        return self._make_layout("src")

    def _make_layout(self, order: Side) -> EdgeLayout:
        def build() -> dict[str, torch.Tensor]:
            primary, secondary = (self.dst, self.src) if order == "dst" else (self.src, self.dst)
            n = self.num_nodes()
            eid = _lexsort([(self.etype, self.num_rels), (primary, n), (secondary, n)])
            return {"src": _take(self.src, eid), "dst": _take(self.dst, eid), "etype": _take(self.etype, eid),
                    "eid": eid}

        e = self.num_edges()
        t = self._disk_cached(f"layout-{order}", "layout", build, {"src": e, "dst": e, "etype": e, "eid": e})
        return EdgeLayout(order, t["src"], t["dst"], t["etype"], t["eid"], self.rel_offsets)

    @cached_property
    def csr_by_dst(self) -> CSR:
        """In-edges of every node, grouped by relation within a node, then by source."""

        def build() -> dict[str, torch.Tensor]:
            n = self.num_nodes()
            eid = _lexsort([(self.dst, n), (self.etype, self.num_rels), (self.src, n)])
            return {"src": _take(self.src, eid), "etype": _take(self.etype, eid), "eid": eid}

        e = self.num_edges()
        t = self._disk_cached("csr-dst", "csr", build, {"src": e, "etype": e, "eid": e})
        indptr = torch.zeros(self.num_nodes() + 1, dtype=torch.int64)
        indptr[1:] = torch.cumsum(self.in_degrees, 0)
        return CSR(indptr, t["src"], t["etype"], t["eid"])

    def unique_pairs(self, side: Side) -> UniquePairs:
        """The unique (source or destination node, relation) pairs, with the edge -> pair map."""
        if side not in ("dst", "src"):
            raise ValueError(f"side must be 'src' or 'dst', got {side!r}")
        return self._pairs_src if side == "src" else self._pairs_dst

    @cached_property
    def _pairs_src(self) -> UniquePairs:
        return self._make_pairs("src")

    @cached_property
    def _pairs_dst(self) -> UniquePairs:
        return self._make_pairs("dst")

    def _make_pairs(self, side: Side) -> UniquePairs:
        def build() -> dict[str, torch.Tensor]:
            node = self.src if side == "src" else self.dst
            n = max(self.num_nodes(), 1)
            key = self.etype * n + node
            uniq, inverse, count = torch.unique(key, sorted=True, return_inverse=True, return_counts=True)
            pair_etype = uniq // n
            per_rel = torch.bincount(pair_etype, minlength=self.num_rels)
            offsets = torch.zeros(self.num_rels + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(per_rel, 0)
            return {"node": uniq % n, "etype": pair_etype, "pair_offsets": offsets,
                    "edge_to_pair": inverse.to(torch.int64), "pair_count": count}

        t = self._disk_cached(f"pairs-{side}", "pairs", build,
                              {"edge_to_pair": self.num_edges(), "pair_offsets": self.num_rels + 1},
                              same_length=("node", "etype", "pair_count"))
        return UniquePairs(side, t["node"], t["etype"], t["pair_offsets"], t["edge_to_pair"], t["pair_count"])

    @contextmanager
    def derived_once(self) -> Iterator[None]:
        """Inside, the derived structures (layouts, CSR, unique pairs) loaded for one use are let go at
        the end, where the disk cache holds them (a big graph: reading one again is a memory-mapped load
        of 0.01-0.1 s). What is built from them (a layout's index arrays, :mod:`rgtune.ir.bind`) then
        does not keep them resident beside it: on ogbn-mag they hold about 0.9 GB.

        Example:
            >>> g = HeteroGraph({"a": 2}, {("a", "r", "a"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
            >>> with g.derived_once():
            ...     _ = g.csr_by_dst
            >>> "csr_by_dst" in g.__dict__  # a small graph has no disk cache: kept
            True
        """
        before = set(self.__dict__)
        try:
            yield
        finally:
            if self.num_edges() >= DISK_CACHE_MIN_EDGES:
                from rgtune.data import _cache

                for name, (structure, kind) in _DISK_DERIVED.items():
                    if name in self.__dict__ and name not in before and _cache.derived_path(
                            self.content_hash, structure, _DERIVED_VERSIONS[kind]).is_file():
                        del self.__dict__[name]

    def _disk_cached(
        self,
        structure: str,
        kind: str,
        build: Callable[[], dict[str, torch.Tensor]],
        lengths: Mapping[str, int],
        same_length: Sequence[str] = (),
    ) -> dict[str, torch.Tensor]:
        """The tensors of ``structure`` from the disk cache, else from ``build()`` (then written there).

        A cached file must hold 1-d int64 ``lengths[name]``-long tensors and ``same_length`` ones of
        one common length (a file of another graph or a damaged one fails that): otherwise it is
        ignored with a warning and rebuilt.
        """
        if self.num_edges() < DISK_CACHE_MIN_EDGES:
            return build()
        # Imported here: rgtune.data._cache imports this module (for HeteroGraph).
        from rgtune.data import _cache

        version = _DERIVED_VERSIONS[kind]
        got = _cache.load_derived(self.content_hash, structure, version)
        if got is not None:
            want = dict(lengths)
            if same_length and same_length[0] in got:
                want.update({name: got[same_length[0]].numel() for name in same_length})
            bad = [name for name in [*lengths, *same_length] if name not in got or got[name].dtype != torch.int64
                   or got[name].dim() != 1 or got[name].numel() != want.get(name, -1)]
            if not bad:
                return got
            _cache.log.warning("ignoring cached %s of graph %s (fields %s do not fit it); rebuilding it",
                               structure, self.content_hash, bad)
        built = build()
        _cache.save_derived(self.content_hash, structure, version, built)
        return built

    @cached_property
    def in_degrees(self) -> torch.Tensor:
        return torch.bincount(self.dst, minlength=self.num_nodes())

    @cached_property
    def out_degrees(self) -> torch.Tensor:
        return torch.bincount(self.src, minlength=self.num_nodes())

    @cached_property
    def stats(self) -> GraphStats:
        e = max(self.num_edges(), 1)
        indeg, outdeg = self.in_degrees, self.out_degrees
        sizes = self.rel_offsets[1:] - self.rel_offsets[:-1]
        sp, dp = self.unique_pairs("src").num_pairs, self.unique_pairs("dst").num_pairs
        return GraphStats(
            num_nodes=self.num_nodes(),
            num_edges=self.num_edges(),
            num_ntypes=self.num_ntypes,
            num_rels=self.num_rels,
            max_in_degree=int(indeg.max()) if indeg.numel() else 0,
            mean_in_degree=float(indeg.double().mean()) if indeg.numel() else 0.0,
            in_degree_cv=_cv(indeg),
            max_out_degree=int(outdeg.max()) if outdeg.numel() else 0,
            out_degree_cv=_cv(outdeg),
            isolated_nodes=int(((indeg + outdeg) == 0).sum()),
            empty_relations=int((sizes == 0).sum()),
            src_pairs=sp,
            dst_pairs=dp,
            src_pair_ratio=sp / e,
            dst_pair_ratio=dp / e,
            edges_per_relation_cv=_cv(sizes),
        )

    @cached_property
    def content_hash(self) -> str:
        """A hash of the structure (types, counts, edges): the key of a graph in the database."""
        h = hashlib.sha256()
        for t in self.ntypes:
            h.update(f"N{t}\0{self._num_nodes[t]}\0".encode())
        for c in self.canonical_etypes:
            h.update(("E" + "\0".join(c) + "\0").encode())
            s, d = self._typed_edges[c]
            h.update(s.numpy().tobytes())
            h.update(d.numpy().tobytes())
        return h.hexdigest()[:16]

    # ----------------------------------------------------------------------- misc
    def __repr__(self) -> str:
        return (
            f"HeteroGraph(name={self.name!r}, num_nodes={self.num_nodes()}, num_edges={self.num_edges()}, "
            f"ntypes={self.num_ntypes}, canonical_etypes={self.num_rels})"
        )

    def describe(self) -> str:
        """A multi-line summary: node types, the largest relations, statistics."""
        lines = [repr(self)]
        for t in self.ntypes:
            lines.append(f"  node type {t}: {self._num_nodes[t]}")
        sizes = sorted(((self.num_edges(c), c) for c in self.canonical_etypes), reverse=True)
        for n, c in sizes[:5]:
            lines.append(f"  edge type {c}: {n}")
        if len(sizes) > 5:
            lines.append(f"  ... {len(sizes) - 5} more edge types")
        for k, v in self.stats.as_dict().items():
            lines.append(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
        return "\n".join(lines)

    def subgraph_counts(self) -> dict[CanonicalEType, int]:
        return {c: self.num_edges(c) for c in self.canonical_etypes}

    @classmethod
    def from_global(
        cls,
        ntype_counts: Mapping[str, int],
        src: Iterable[int] | torch.Tensor,
        dst: Iterable[int] | torch.Tensor,
        etype: Iterable[int] | torch.Tensor,
        canonical_etypes: Sequence[CanonicalEType],
        name: str = "graph",
    ) -> "HeteroGraph":
        """Build from global node ids (types numbered in sorted order) and relation ids."""
        ntypes = sorted(ntype_counts)
        offsets = np.cumsum([0] + [int(ntype_counts[t]) for t in ntypes])
        tid = {t: i for i, t in enumerate(ntypes)}
        src_t, dst_t, et = _as_index(src, "src"), _as_index(dst, "dst"), _as_index(etype, "etype")
        # An out-of-range relation id would otherwise match no mask below and its edges would vanish.
        if et.numel() and (int(et.min()) < 0 or int(et.max()) >= len(canonical_etypes)):
            raise ValueError(f"etype ids must lie in [0, {len(canonical_etypes)}), the number of canonical_etypes")
        edges = {}
        for r, c in enumerate(canonical_etypes):
            m = et == r
            edges[tuple(c)] = (src_t[m] - int(offsets[tid[c[0]]]), dst_t[m] - int(offsets[tid[c[2]]]))
        return cls(ntype_counts, edges, name=name)

