"""The graph's index arrays as kernels see them, for one layout and index width.

Every backend binds a :class:`KernelProgram` to a graph through :func:`graph_arrays`; the
arrays are built once per (graph, layout, index width) and cached on the graph, from the graph's
derived structures (which are cached on disk for large graphs: see :mod:`rgtune.data.graph`); the
arrays of the other index width of a layout, when cached already, are cast rather than rebuilt.

Edge arrays are in the layout's order: position ``i`` is the ``i``-th edge in memory, and
per-edge buffers are stored in that order. ``e_rel_order`` lists edge positions relation by
relation (what a GEMM over edge rows iterates); ``rel_offsets`` delimits its relations.

32-bit indices (:func:`index32_problem`): the *values* of the arrays (node and edge ids, pair
ids, CSR offsets) must fit an ``int32``; the kernels compute every element offset (an index
times a row width) in 64 bits, so the width of the rows does not matter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from rgtune.data._sort import stable_argsort_small
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph


#: the arrays of the (source, relation) pairs, which a batch builds on first use
SRC_PAIR_FIELDS = ("sp_node", "sp_rel", "sp_offsets", "e_sp")


@dataclass(frozen=True)
class GraphArrays:
    layout: str
    index_bits: int
    num_nodes: int
    num_edges: int
    num_rels: int
    num_ntypes: int
    node_type: torch.Tensor  # (N,)
    node_offsets: torch.Tensor  # (runs+1,): the runs of one node type in row order (a graph's: its types)
    node_run_type: torch.Tensor  # (runs,): each run's type
    e_src: torch.Tensor  # (E,) layout order
    e_dst: torch.Tensor
    e_rel: torch.Tensor
    e_eid: torch.Tensor  # graph edge id of each position
    e_rel_order: torch.Tensor  # (E,) positions, relation-major
    rel_offsets: torch.Tensor  # (R+1,) into e_rel_order
    csr_indptr: torch.Tensor | None  # (N+1,) for csr_dst: a destination's in-edges are contiguous
    sp_node: torch.Tensor  # unique (src, rel) pairs, sorted by rel then node
    sp_rel: torch.Tensor
    sp_offsets: torch.Tensor  # (R+1,)
    e_sp: torch.Tensor  # (E,) layout position -> src pair
    dp_node: torch.Tensor
    dp_rel: torch.Tensor
    dp_offsets: torch.Tensor
    e_dp: torch.Tensor
    dp_inv_count: torch.Tensor  # (dst pairs,) float64: 1 / the pair's in-edges
    inv_in_degree: torch.Tensor  # (N,) float64: 1 / the node's in-degree
    rel_src_ntype: torch.Tensor  # (R,)
    rel_dst_ntype: torch.Tensor
    #: the rows a layer's output has: a graph's every node; a batch's destinations, the first rows
    num_dst_nodes: int

    def __getattr__(self, name: str) -> Any:
        # only for attributes not set: a batch's (source, relation) pairs, built on first use (few programs
        # read them, and on an ogbn-mag block they are half of the batch's arrays' time: see _build_batch)
        build = self.__dict__.get("_src_pairs")
        if name in SRC_PAIR_FIELDS and build is not None:
            for field, value in build().items():
                object.__setattr__(self, field, value)
            del self.__dict__["_src_pairs"]
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def rows(self, domain: str) -> int:
        if domain == "src_pair":
            return int(self.sp_node.numel())
        return {"node": self.num_nodes, "dst_node": self.num_dst_nodes, "edge": self.num_edges,
                "dst_pair": int(self.dp_node.numel())}[domain]

    def index_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}

    def graph_constant(self, kind: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """A per-edge constant of the graph in layout order (``inv_dst_rel_degree``: 1 / the edge's
        destination pair's in-edges; ``inv_dst_degree``: 1 / its destination's in-degree), gathered from
        the per-pair or per-node table into ``dtype``. Made on request, not held: in float64 the two
        would take 16 bytes an edge (340 MB on ogbn-mag) beside arrays that kernels read in float32.

        Example:
            >>> from rgtune.data.synthetic import random_graph
            >>> a = graph_arrays(random_graph((20, 20), num_relations=2, num_edges=100, seed=0), "csr_dst", 32)
            >>> deg = a.graph_constant("inv_dst_degree")
            >>> degree = torch.bincount(a.e_dst.long(), minlength=a.num_nodes).double()
            >>> bool(torch.equal(deg, 1.0 / degree[a.e_dst.long()]))
            True
        """
        if kind == "edge_weight":
            raise ValueError("the edge weight is the caller's, given with each call: read it with "
                             "GraphArrays.edge_weight(weight), not graph_constant")
        if kind == "inv_dst_rel_degree":
            table, index = self.dp_inv_count, self.e_dp
        elif kind == "inv_dst_degree":
            table, index = self.inv_in_degree, self.e_dst
        elif kind == "dst_degree":  # |N(dst)|: every edge's destination has one in-edge at least
            table, index = torch.round(1.0 / self.inv_in_degree.double()), self.e_dst
        else:
            raise ValueError(f"unknown graph constant {kind!r}; choose inv_dst_rel_degree, inv_dst_degree or "
                             "dst_degree")
        return torch.index_select(table.to(dtype), 0, index)

    def edge_weight(self, weight: torch.Tensor | None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The caller's per-edge weight (``params[EDGE_WEIGHT]``, :meth:`~rgtune.ir.program.ProgramBuilder.edge_weight`)
        in layout order, ``(E,)`` in ``dtype`` on the weight's device: ``weight`` is ``(E,)`` or ``(E, 1)`` in the
        graph's edge order (global edge ids: relation by relation, each relation's edges in their order; a
        batch's likewise), gathered through :attr:`e_eid`. A missing weight, or one of another length, is an error.

        Example:
            >>> from rgtune.data.synthetic import random_graph
            >>> a = graph_arrays(random_graph((20, 20), num_relations=2, num_edges=100, seed=0), "csr_dst", 32)
            >>> w = torch.rand(100)
            >>> bool(torch.equal(a.edge_weight(w), w.double()[a.e_eid.long()]))
            True
            >>> a.edge_weight(torch.rand(99, 1))
            Traceback (most recent call last):
            ...
            ValueError: edge_weight has 99 values, but the graph has 100 edges (one weight per edge: (100,) or (100, 1))
        """
        if weight is None:
            raise ValueError("this program reads edge_weight, a per-edge weight given with every call "
                             "(layer(x, edge_weight=w), w of shape (num_edges,) or (num_edges, 1)); none was given")
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"edge_weight must be a torch.Tensor, got {type(weight).__name__}")
        w = weight.detach()
        if w.dim() == 2 and w.shape[1] == 1:
            w = w[:, 0]
        if w.dim() != 1 or w.shape[0] != self.num_edges:
            got = f"{w.shape[0]} values" if w.dim() == 1 else f"shape {tuple(weight.shape)}"
            raise ValueError(f"edge_weight has {got}, but the graph has {self.num_edges} edges (one weight per "
                             f"edge: ({self.num_edges},) or ({self.num_edges}, 1))")
        return torch.index_select(w.to(dtype), 0, self.e_eid.to(w.device).long())

    def to(self, device: torch.device | str) -> "GraphArrays":
        """The same arrays on ``device`` (``self`` when they are there already).

        Torch ops that mix these arrays with tensors on a GPU need them there; an index on the
        CPU would also cost a host-to-device copy per op, which a captured CUDA graph forbids.
        """
        device = concrete_device(device)
        if self.node_type.device == device:
            return self
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self.index_tensors().items()})

    @cached_property
    def bsearch_probes(self) -> dict[str, int]:
        """Reads of ``compact.pair_index=bsearch`` to find every edge's pair, per via (``src_pair``,
        ``dst_pair``): ``ceil(log2(pairs_r + 1))`` per edge of relation ``r``. Computed once per
        graph, since the cost model counts them for every candidate schedule."""
        edges_per_rel = torch.diff(self.rel_offsets).double()
        out = {}
        for via, pair_offsets in (("src_pair", self.sp_offsets), ("dst_pair", self.dp_offsets)):
            steps = torch.ceil(torch.log2(torch.diff(pair_offsets).double() + 1.0))
            out[via] = int((edges_per_rel * steps).sum().item())
        return out


def concrete_device(device: torch.device | str) -> torch.device:
    """``device`` with the current GPU's index when it names none (``cuda`` -> ``cuda:0``), so that
    it compares equal to a tensor's ``.device``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


#: the largest node or edge count 32-bit indices serve. Below ``2**31 - 1`` by a margin: generated
#: loops keep idx_t counters that step past a range's end before the test ends them (a CUDA tile's
#: ``row0 + blockIdx.x * tile_rows``, up to 128 rows; a warp's ``rid += 32``; a gradient's
#: ``r0 += tile_r``), and a signed overflow there is undefined behaviour, not a wrap
INDEX32_MAX_COUNT = 2**31 - 1 - 2**16


def index32_problem(num_nodes: int, num_edges: int) -> str | None:
    """Why 32-bit indices cannot serve a graph with these counts, or None when they can (pairs and
    CSR offsets never exceed the edge count).

    >>> index32_problem(1_939_743, 42_182_144) is None  # ogbn-mag with reverse relations
    True
    >>> print(index32_problem(10, 2**31 - 100))
    2147483548 edges exceed 2147418111, the most 32-bit indices serve (idx_t loops step past their end); use layout.index_bits=64
    """
    for what, n in (("nodes", num_nodes), ("edges", num_edges)):
        if n > INDEX32_MAX_COUNT:
            return (f"{n} {what} exceed {INDEX32_MAX_COUNT}, the most 32-bit indices serve "
                    "(idx_t loops step past their end); use layout.index_bits=64")
    return None


#: the edge orders (``layout.edges``): edges grouped by destination, each destination's in-edges grouped by
#: relation; segmented by relation, sorted by destination inside; segmented by relation, sorted by source inside
CSR_DST, COO_REL_DST, COO_REL_SRC = "csr_dst", "coo_rel_dst", "coo_rel_src"
LAYOUT_PERMUTATIONS = {
    CSR_DST: lambda g: g.csr_by_dst.eid,
    COO_REL_DST: lambda g: g.layout("dst").eid,
    COO_REL_SRC: lambda g: g.layout("src").eid,
}
LAYOUTS = tuple(LAYOUT_PERMUTATIONS)


def graph_arrays(graph: "HeteroGraph | Batch", layout: str = CSR_DST, index_bits: int = 64,
                 keep: bool = True) -> GraphArrays:
    """Index arrays of ``graph`` in ``layout`` with ``index_bits``-bit indices (cached on the graph; ``keep=False``
    builds them without caching them when they are not cached yet: a one-off read of a big graph, whose
    arrays take a gigabyte per layout). A :class:`~rgtune.data.batch.Batch`'s are built from its own edges
    by a few torch sorts, on its device (:func:`_build_batch`), and kept on it for its forward and backward."""
    if layout not in LAYOUT_PERMUTATIONS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {sorted(LAYOUT_PERMUTATIONS)}")
    if index_bits not in (32, 64):
        raise ValueError(f"index_bits must be 32 or 64, got {index_bits}")
    if index_bits == 32:
        # a silent int32 cast of larger ids would wrap them: kernels would read the wrong rows
        problem = index32_problem(graph.num_nodes(), graph.num_edges())
        if problem:
            raise ValueError(f"graph {graph.name}: {problem}")
    cache = graph.__dict__.setdefault("_rgtune_arrays", {})
    key = (layout, index_bits)
    if key in cache:
        return cache[key]
    other = cache.get((layout, 96 - index_bits))
    if other is not None:
        built = _rewidth(other, index_bits)
    elif isinstance(graph, Batch):
        built = _build_batch(graph, layout, index_bits)
    else:
        with graph.derived_once():  # the arrays are built from them; a big graph's stay on disk, not in memory too
            built = _build(graph, layout, index_bits)
    if keep:
        cache[key] = built
    return built


def any_graph_arrays(graph: HeteroGraph) -> GraphArrays:
    """Index arrays of ``graph`` in whichever layout is cached, else in ``csr_dst`` built without caching them:
    for what every layout has alike (sizes, pairs, rows per type), without a layout's gigabyte held for it."""
    held = graph.__dict__.get("_rgtune_arrays")
    return next(iter(held.values())) if held else graph_arrays(graph, keep=False)


def _rewidth(a: GraphArrays, bits: int) -> GraphArrays:
    """``a`` with ``bits``-bit indices: the same values, a cast instead of a rebuild (the layout
    pass offers 32 bits only when every index fits)."""
    idx = torch.int32 if bits == 32 else torch.int64
    cast = {k: v.to(idx).contiguous() for k, v in a.index_tensors().items() if not v.dtype.is_floating_point}
    lazy = a.__dict__.get("_src_pairs")
    if lazy is None:
        return dataclasses.replace(a, index_bits=bits, **cast)
    # a batch's (source, relation) pairs not built yet: replace() would read them, building them in a's width
    # for the copy (a 64-bit program then read 32-bit indices: a crash); the copy builds its own when first read
    fields = {f.name: a.__dict__[f.name] for f in dataclasses.fields(a) if f.name in a.__dict__}
    out = GraphArrays(**{**fields, **cast, "index_bits": bits, **dict.fromkeys(SRC_PAIR_FIELDS)})
    for field in SRC_PAIR_FIELDS:
        del out.__dict__[field]
    out.__dict__["_src_pairs"] = lambda: {k: v.to(idx).contiguous() for k, v in lazy().items()}
    return out


def _build(g: HeteroGraph, layout: str, bits: int) -> GraphArrays:
    idx = torch.int32 if bits == 32 else torch.int64
    indptr = None
    inv_degree = 1.0 / g.in_degrees.double()
    if layout == CSR_DST:
        csr = g.csr_by_dst
        eid, e_src, e_rel = csr.eid, csr.src, csr.etype
        # In CSR order node v's in-edges are contiguous: per-destination values are each node's value
        # repeated by its in-degree, with no gather through the (random) permutation.
        e_dst = torch.repeat_interleave(torch.arange(g.num_nodes(), dtype=torch.int64), g.in_degrees)
        rel_order = stable_argsort_small(e_rel, g.num_rels)
        indptr = csr.indptr.to(idx)
    else:
        lay = g.layout("dst" if layout == COO_REL_DST else "src")
        eid, e_src, e_dst, e_rel = lay.eid, lay.src, lay.dst, lay.etype
        # A COO layout is segmented by relation already: its stable sort by relation is the identity.
        rel_order = torch.arange(g.num_edges(), dtype=torch.int64)
    sp, dp = g.unique_pairs("src"), g.unique_pairs("dst")
    # index_select: the same gather as t[eid], about twice as fast on the CPU at tens of millions of edges
    e_sp, e_dp = torch.index_select(sp.edge_to_pair, 0, eid), torch.index_select(dp.edge_to_pair, 0, eid)

    def i(t: torch.Tensor) -> torch.Tensor:
        return t.to(idx).contiguous()

    return GraphArrays(
        layout=layout, index_bits=bits, num_nodes=g.num_nodes(), num_edges=g.num_edges(), num_rels=g.num_rels,
        num_ntypes=g.num_ntypes, node_type=i(g.node_type), node_offsets=i(g.node_offsets),
        node_run_type=i(torch.arange(g.num_ntypes)), num_dst_nodes=g.num_nodes(),
        e_src=i(e_src), e_dst=i(e_dst), e_rel=i(e_rel), e_eid=i(eid), e_rel_order=i(rel_order),
        rel_offsets=i(g.rel_offsets), csr_indptr=indptr,
        sp_node=i(sp.node), sp_rel=i(sp.etype), sp_offsets=i(sp.pair_offsets), e_sp=i(e_sp),
        dp_node=i(dp.node), dp_rel=i(dp.etype), dp_offsets=i(dp.pair_offsets), e_dp=i(e_dp),
        # per pair and per node: graph_constant gathers them per edge, in the dtype asked for
        dp_inv_count=1.0 / dp.pair_count.double(), inv_in_degree=inv_degree,
        rel_src_ntype=i(g.src_ntype_of_rel), rel_dst_ntype=i(g.dst_ntype_of_rel),
    )


def _build_batch(b: Batch, layout: str, bits: int) -> GraphArrays:
    """A batch's arrays: the same structures as :func:`_build`'s, made with torch ops over the batch's own
    edges and nodes, in time proportional to the batch, on its device. A sampler's batch has its edges by
    relation, then destination (:class:`~rgtune.data.sampling.NeighborSampler`): its destination-major order
    is then one radix sort of the destinations, and its relation order that sort's inverse; the (relation,
    node) pairs come from runs of the sorted keys; the (relation, source) pairs are built on first use (what
    reads them: compact source pairs), since they need a sort of every edge's key."""
    idx = torch.int32 if bits == 32 else torch.int64
    n, e, r = b.num_nodes(), b.num_edges(), b.num_rels
    src, dst, rel = b.src, b.dst, b.etype.to(b.device)
    indptr = None
    in_degree = torch.bincount(dst, minlength=n)
    rel_dst = rel * max(n, 1) + dst
    by_rel_dst = bool((rel_dst[1:] >= rel_dst[:-1]).all()) if e > 1 else True
    if layout == CSR_DST:  # by destination, then relation (stable: the sampler's order of neighbours)
        if by_rel_dst:  # a stable sort by destination keeps each one's edges by relation
            eid = stable_argsort_small(dst, b.num_dst_nodes or 1)
            rel_order = torch.empty_like(eid)
            rel_order[eid] = torch.arange(e, device=b.device)  # back to relation-major: the inverse
        else:
            eid = stable_argsort_small(dst * max(r, 1) + rel, max(n * r, 1))
            rel_order = stable_argsort_small(rel[eid], max(r, 1))
        indptr = torch.cat([in_degree.new_zeros(1), in_degree.cumsum(0)]).to(idx)
    else:  # segmented by relation, sorted by one end inside
        end = dst if layout == COO_REL_DST else src
        eid = (torch.arange(e, device=b.device) if by_rel_dst and layout == COO_REL_DST else
               stable_argsort_small(rel * max(n, 1) + end, max(n * r, 1)))
        rel_order = torch.arange(e, device=b.device)

    def pairs(key: torch.Tensor, in_order: bool) -> tuple[torch.Tensor, ...]:
        """Unique (node, relation) pairs sorted by relation then node; each edge's pair; the pairs per relation;
        the edges per pair. ``key``: each edge's ``rel * n + node``, ``in_order`` when sorted already."""
        order = None if in_order else stable_argsort_small(key, max(n * r, 1))
        ordered = key if order is None else key[order]
        first = torch.ones(e, dtype=torch.bool, device=b.device)
        first[1:] = ordered[1:] != ordered[:-1]  # where a pair's run starts
        pair = torch.cumsum(first, 0) - 1
        starts = first.nonzero().flatten()
        keys = ordered[starts]
        count = torch.diff(starts, append=torch.tensor([e], device=b.device))
        edge_to_pair = pair if order is None else torch.empty_like(pair).index_copy_(0, order, pair)
        p_rel = keys // max(n, 1)
        offsets = torch.searchsorted(p_rel, torch.arange(r + 1, device=b.device))
        return keys - p_rel * max(n, 1), p_rel, offsets, edge_to_pair, count

    dp_node, dp_rel, dp_off, dp_of_edge, dp_count = pairs(rel_dst, by_rel_dst)

    def i(t: torch.Tensor) -> torch.Tensor:
        return t.to(idx).contiguous()

    def src_pairs() -> dict[str, torch.Tensor]:
        sp_node, sp_rel, sp_off, sp_of_edge, _ = pairs(rel * max(n, 1) + src, False)
        return {"sp_node": i(sp_node), "sp_rel": i(sp_rel), "sp_offsets": i(sp_off), "e_sp": i(sp_of_edge[eid])}

    none = torch.zeros(0, dtype=idx)
    arrays = GraphArrays(
        layout=layout, index_bits=bits, num_nodes=n, num_edges=e, num_rels=r, num_ntypes=b.num_ntypes,
        node_type=i(b.node_type), node_offsets=i(b.node_run_offsets), node_run_type=i(b.node_run_type),
        e_src=i(src[eid]), e_dst=i(dst[eid]), e_rel=i(rel[eid]), e_eid=i(eid), e_rel_order=i(rel_order),
        rel_offsets=i(b.rel_offsets), csr_indptr=indptr,
        sp_node=none, sp_rel=none, sp_offsets=none, e_sp=none,  # replaced by src_pairs() on first use
        dp_node=i(dp_node), dp_rel=i(dp_rel), dp_offsets=i(dp_off), e_dp=i(dp_of_edge[eid]),
        dp_inv_count=1.0 / dp_count.double(), inv_in_degree=1.0 / in_degree.double(),
        rel_src_ntype=i(b.src_ntype_of_rel), rel_dst_ntype=i(b.dst_ntype_of_rel), num_dst_nodes=b.num_dst_nodes,
    )
    for field in SRC_PAIR_FIELDS:
        del arrays.__dict__[field]
    arrays.__dict__["_src_pairs"] = src_pairs
    return arrays


def row_types(a: GraphArrays, rows: str, by: str, end: str | None = None) -> torch.Tensor | None:
    """The weight slice (node type or relation) of every row of a GEMM over ``rows``, in row
    order; ``None`` when one weight serves all rows (``by="none"``). ``end`` picks the edge end
    whose node type indexes a per-node-type weight on edge rows."""
    if by == "none":
        return None
    if rows == "node":
        return a.node_type.long()
    if rows == "dst_node":
        return a.node_type.long()[:a.num_dst_nodes]
    if rows == "edge":
        if by == "rel":
            return a.e_rel.long()
        return a.node_type.long()[(a.e_src if end == "src" else a.e_dst).long()]
    node, rel = (a.sp_node, a.sp_rel) if rows == "src_pair" else (a.dp_node, a.dp_rel)
    return rel.long() if by == "rel" else a.node_type.long()[node.long()]
