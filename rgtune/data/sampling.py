"""Heterogeneous neighbour sampling: the mini-batches of one epoch, as blocks a layer takes directly.

For a batch of seed nodes and an :math:`L`-layer model, the last layer's destinations are the seeds;
each of them draws up to ``fanout`` of its in-neighbours per relation (uniformly, without
replacement: all of them when it has fewer), and the sources these edges reach are the previous
layer's destinations, and so on down to the first layer, whose sources are the input nodes. This is
what PyG's ``NeighborLoader`` and DGL's ``MultiLayerNeighborSampler`` compute; here every step is a
few vectorized torch ops over the sampled edges (a per-relation in-edge index of the graph is built
once), and each layer's subgraph comes out as a :class:`~rgtune.data.batch.Batch` in the layers'
conventions: per node type, a block's destinations are the first of its sources.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((50, 80), num_relations=3, num_edges=900, seed=0)
    >>> loader = NeighborLoader(g, fanouts=[4, 3], seeds={g.ntypes[1]: torch.arange(20)}, batch_size=8, seed=0)
    >>> len(loader), [len(mb.blocks) for mb in loader]
    (3, [2, 2, 2])
    >>> mb = next(iter(loader))
    >>> mb.blocks[1].num_dst, mb.blocks[0].num_dst == mb.blocks[1].num_src  # the seeds; blocks chain
    ({'n0': 0, 'n1': 8}, True)
    >>> mb.seeds[g.ntypes[1]].tolist() == mb.input_nodes[g.ntypes[1]][:8].tolist()  # sources: destinations first
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch

from rgtune.data.batch import Batch
from rgtune.data.graph import CanonicalEType, HeteroGraph

__all__ = ["MiniBatch", "NeighborSampler", "NeighborLoader"]

#: a layer's fan-out: one count for every relation, or a count per canonical edge type (others: 0)
Fanout = int | Mapping[CanonicalEType, int]


@dataclass
class MiniBatch:
    """One step's sample: the seeds, every layer's block (``blocks[0]`` is the first layer's, whose
    sources are ``input_nodes``), each node set per type as ids of the graph's per-type numbering."""

    seeds: dict[str, torch.Tensor]
    input_nodes: dict[str, torch.Tensor]
    blocks: list[Batch]

    @property
    def num_edges(self) -> int:
        return sum(b.num_edges() for b in self.blocks)


class NeighborSampler:
    """Samples the blocks of an ``len(fanouts)``-layer model around given seeds (see the module docstring).

    Args:
        graph: the full graph (its node and edge types are every block's).
        fanouts: one per layer, first layer first (as PyG's ``num_neighbors`` and DGL's fan-outs): an int
            for every relation, or a dict per canonical edge type (a relation it leaves out is not
            sampled); ``-1`` takes every in-neighbour.
    """

    def __init__(self, graph: HeteroGraph, fanouts: Sequence[Fanout]) -> None:
        if not fanouts:
            raise ValueError("fanouts: give one per layer (e.g. [15, 10]), got none")
        self.graph = graph
        self.fanouts = [self._per_relation(f, i) for i, f in enumerate(fanouts)]
        ntype_id = {t: i for i, t in enumerate(graph.ntypes)}
        # per relation, the in-edges of each destination: sources sorted by destination (a CSC), built once
        self._csc: list[tuple[torch.Tensor, torch.Tensor]] = []
        for c in graph.canonical_etypes:
            src, dst = graph.edges(c)
            order = torch.sort(dst, stable=True).indices
            counts = torch.bincount(dst, minlength=graph.num_nodes(c[2]))
            self._csc.append((torch.cat([counts.new_zeros(1), counts.cumsum(0)]), src[order]))
        self._src_type = [ntype_id[c[0]] for c in graph.canonical_etypes]
        self._dst_type = [ntype_id[c[2]] for c in graph.canonical_etypes]

    def _per_relation(self, fanout: Fanout, layer: int) -> list[int]:
        g = self.graph
        if isinstance(fanout, int):
            if fanout < -1 or fanout == 0:
                raise ValueError(f"fanouts[{layer}] = {fanout}: a positive count, or -1 for every in-neighbour")
            return [fanout] * g.num_rels
        unknown = [c for c in fanout if tuple(c) not in g.canonical_etypes]
        if unknown:
            raise ValueError(f"fanouts[{layer}] names edge types {unknown} that graph {g.name!r} does not have; its "
                             f"edge types: {g.canonical_etypes}")
        return [int(fanout.get(c, 0)) for c in g.canonical_etypes]

    def sample(self, seeds: Mapping[str, torch.Tensor], generator: torch.Generator | None = None) -> MiniBatch:
        """The blocks around ``seeds`` (per type, ids of the graph's per-type numbering)."""
        g = self.graph
        unknown = sorted(set(seeds) - set(g.ntypes))
        if unknown:
            raise ValueError(f"seeds of node types {unknown} that graph {g.name!r} does not have; its node types: "
                             f"{g.ntypes}")
        empty = torch.zeros(0, dtype=torch.int64)
        frontier = [torch.as_tensor(seeds.get(t, empty), dtype=torch.int64).reshape(-1) for t in g.ntypes]
        seed_ids = {t: f for t, f in zip(g.ntypes, frontier)}
        blocks: list[Batch] = []
        for fanout in reversed(self.fanouts):
            block, frontier = self._block(frontier, fanout, generator)
            blocks.append(block)
        blocks.reverse()
        return MiniBatch(seed_ids, {t: f for t, f in zip(g.ntypes, frontier)}, blocks)

    def _block(self, dst: list[torch.Tensor], fanout: list[int],
               generator: torch.Generator | None) -> tuple[Batch, list[torch.Tensor]]:
        """One layer: the sampled in-edges of ``dst`` (per type), and the block's sources (destinations first)."""
        g = self.graph
        picked: list[tuple[torch.Tensor, torch.Tensor]] = []  # per relation: (source id, destination position)
        for r, (indptr, sources) in enumerate(self._csc):
            nodes = dst[self._dst_type[r]]
            if fanout[r] == 0 or nodes.numel() == 0:
                picked.append((torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)))
                continue
            start, deg = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
            pos, owner = _sample_segments(start, deg, fanout[r], generator)
            picked.append((sources[pos], owner))
        # each type's sources: its destinations, then the new ones in order of first appearance
        new_ids: list[list[torch.Tensor]] = [[] for _ in g.ntypes]
        for r, (src, _) in enumerate(picked):
            new_ids[self._src_type[r]].append(src)
        sources, local = [], []
        for t, ids in enumerate(new_ids):
            nodes, where = _first_occurrence_order(torch.cat([dst[t], *ids]))
            sources.append(nodes)
            local.append(where[dst[t].numel():])  # the local id of each sampled source, relation by relation
        edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor]] = {}
        taken = [0] * len(g.ntypes)
        for r, (src, owner) in enumerate(picked):
            t = self._src_type[r]
            edges[g.canonical_etypes[r]] = (local[t][taken[t]:taken[t] + src.numel()], owner)
            taken[t] += src.numel()
        block = Batch(g.ntypes, g.canonical_etypes, num_src={t: int(s.numel()) for t, s in zip(g.ntypes, sources)},
                      num_dst={t: int(d.numel()) for t, d in zip(g.ntypes, dst)}, edges=edges, name=g.name,
                      check=False)
        return block, sources


class NeighborLoader:
    """The mini-batches of one epoch: ``seeds`` (per type) in batches of ``batch_size`` (shuffled with
    ``seed``, the epoch's draws seeded by it too), each sampled by a :class:`NeighborSampler` of ``fanouts``.

    Iterating again gives a new epoch (another shuffle and other draws, still determined by ``seed`` and
    the epoch's number), so two loaders of one seed give the same batches.
    """

    def __init__(self, graph: HeteroGraph, fanouts: Sequence[Fanout], seeds: Mapping[str, torch.Tensor], *,
                 batch_size: int, shuffle: bool = True, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.sampler = NeighborSampler(graph, fanouts)
        self.seeds = [(t, torch.as_tensor(ids, dtype=torch.int64).reshape(-1)) for t, ids in seeds.items()]
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.epoch = 0

    def __len__(self) -> int:
        return sum((ids.numel() + self.batch_size - 1) // self.batch_size for _, ids in self.seeds)

    def __iter__(self) -> Iterator[MiniBatch]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        for t, ids in self.seeds:
            order = ids[torch.randperm(ids.numel(), generator=gen)] if self.shuffle else ids
            for i in range(0, order.numel(), self.batch_size):
                yield self.sampler.sample({t: order[i:i + self.batch_size]}, gen)


def _sample_segments(start: torch.Tensor, deg: torch.Tensor, k: int,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each segment ``[start, start + deg)``: every position when ``deg <= k`` (or ``k == -1``), else
    ``k`` of them uniformly without replacement; the positions and the index of the segment of each."""
    if k == -1:
        k = int(deg.max()) if deg.numel() else 0
    seg = torch.arange(deg.numel())
    small = deg <= k
    # small segments: all their positions
    s_deg = deg[small]
    s_owner = seg[small].repeat_interleave(s_deg)
    s_first = torch.cumsum(s_deg, 0) - s_deg
    s_pos = start[small].repeat_interleave(s_deg) + torch.arange(int(s_deg.sum())) - s_first.repeat_interleave(s_deg)
    if bool(small.all()):
        return s_pos, s_owner
    # large segments: a random key per candidate, the k smallest keys of each segment
    b_deg, b_start, b_seg = deg[~small], start[~small], seg[~small]
    owner = torch.arange(b_deg.numel()).repeat_interleave(b_deg)
    first = torch.cumsum(b_deg, 0) - b_deg
    within = torch.arange(int(b_deg.sum())) - first.repeat_interleave(b_deg)
    keys = owner.double() + torch.rand(owner.numel(), generator=generator, dtype=torch.float64)
    order = torch.sort(keys).indices  # by segment, then key
    rank = torch.arange(order.numel()) - first[owner[order]]
    chosen = order[rank < k]
    l_pos = b_start[owner[chosen]] + within[chosen]
    l_owner = b_seg[owner[chosen]]
    pos, owner_all = torch.cat([s_pos, l_pos]), torch.cat([s_owner, l_owner])
    order = torch.sort(owner_all, stable=True).indices  # edges of one destination together
    return pos[order], owner_all[order]


def _first_occurrence_order(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` deduplicated in order of first occurrence, and each element's index among them."""
    if ids.numel() == 0:
        return ids, ids
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amin")
    order = torch.sort(first).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return uniq[order], rank[inverse]
