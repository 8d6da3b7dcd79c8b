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

import itertools
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch

from rgtune.data._sort import stable_argsort_small
from rgtune.data.batch import Batch
from rgtune.data.graph import CanonicalEType, HeteroGraph

__all__ = ["MiniBatch", "NeighborSampler", "NeighborLoader", "layer_blocks", "largest_block"]

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


def layer_blocks(minibatches: Sequence[MiniBatch]) -> list[tuple[bool, Batch]]:
    """Every block of ``minibatches``, batch after batch, each with whether it is a first layer's (its input needs
    no gradient: a layer runs its params' gradients program there): what a study for a sampler times."""
    return [(i == 0, b) for mb in minibatches for i, b in enumerate(mb.blocks)]


def largest_block(blocks: Sequence[tuple[bool, Batch]]) -> Batch:
    """The block of ``blocks`` (:func:`layer_blocks`) with the most edges (then nodes): what a batch looks like at
    its biggest, and what bounds its memory (blocks run one at a time)."""
    return max((b for _, b in blocks), key=lambda b: (b.num_edges(), b.num_nodes()))


class NeighborSampler:
    """Samples the blocks of an ``len(fanouts)``-layer model around given seeds (see the module docstring).

    Args:
        graph: the full graph (its node and edge types are every block's).
        fanouts: one per layer, first layer first (as DGL's samplers list them; PyG's ``num_neighbors``
            lists them from the seeds outwards, the reverse order): an int for every relation, or a dict
            per canonical edge type (a relation it leaves out is not sampled); ``-1`` takes every in-neighbour.

    The graph's in-edges are indexed once, grouped by destination and relation (the groups a fan-out
    applies to); a batch then costs a few torch ops over the groups of its destinations and the edges
    it draws, whatever the number of relations.
    """

    def __init__(self, graph: HeteroGraph, fanouts: Sequence[Fanout]) -> None:
        if not fanouts:
            raise ValueError("fanouts: give one per layer (e.g. [15, 10]), got none")
        self.graph = graph
        self.fanouts = [torch.tensor(self._per_relation(f, i), dtype=torch.int64) for i, f in enumerate(fanouts)]
        r = max(graph.num_rels, 1)
        order = torch.sort(graph.dst * r + graph.etype, stable=True).indices  # by destination, then relation
        self._src, key = graph.src[order], (graph.dst * r + graph.etype)[order]
        # the (destination, relation) groups: where each starts among the sorted edges, its size and relation
        starts = torch.cat([torch.ones(min(1, key.numel()), dtype=torch.bool), key[1:] != key[:-1]]).nonzero().flatten()
        self._grp_start = starts
        self._grp_len = torch.diff(torch.cat([starts, torch.tensor([key.numel()])]))
        self._grp_rel = key[starts] % r
        per_node = torch.bincount(key[starts] // r, minlength=graph.num_nodes())
        self._node_grp = torch.cat([per_node.new_zeros(1), per_node.cumsum(0)])  # a node's groups: [ptr[v], ptr[v+1])
        self._node_type = graph.node_type
        #: per graph node, where it first occurs in the batch being made (-1: not yet); reset after use
        self._first = torch.full((graph.num_nodes(),), -1, dtype=torch.int64)
        self._lock = threading.Lock()  # one batch at a time uses it

    def _first_occurrence(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` deduplicated in order of first occurrence, and each element's index among them: one
        scatter into a per-node array (touching only ``ids``), no sort."""
        pos = torch.arange(ids.numel())
        with self._lock:
            first = self._first
            first[ids] = ids.numel()
            first.scatter_reduce_(0, ids, pos, reduce="amin")
            at = first[ids]
            first[ids] = -1
        is_first = at == pos
        rank = torch.cumsum(is_first, 0) - 1  # a first occurrence's index among the unique ids
        return ids[is_first], rank[at]

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
        per_type = [torch.as_tensor(seeds.get(t, empty), dtype=torch.int64).reshape(-1) for t in g.ntypes]
        seed_ids = dict(zip(g.ntypes, per_type))
        # the frontier: global ids, type by type (a block's destinations in its own global order)
        counts = [int(p.numel()) for p in per_type]
        frontier = torch.cat([p + int(g.node_offsets[i]) for i, p in enumerate(per_type)])
        blocks: list[Batch] = []
        for fanout in reversed(self.fanouts):
            block, frontier, counts = self._block(frontier, counts, fanout, generator)
            blocks.append(block)
        blocks.reverse()
        bounds = [0, *itertools.accumulate(counts)]
        inputs = {t: frontier[bounds[i]:bounds[i + 1]] - int(g.node_offsets[i]) for i, t in enumerate(g.ntypes)}
        return MiniBatch(seed_ids, inputs, blocks)

    def _block(self, dst: torch.Tensor, dst_counts: list[int], fanout: torch.Tensor,
               generator: torch.Generator | None) -> tuple[Batch, torch.Tensor, list[int]]:
        """One layer: the sampled in-edges of ``dst`` (global ids, type by type: the block's destinations in
        order), the block, and its sources (global ids, type by type, each type's destinations first)."""
        g = self.graph
        # the (destination, relation) groups of the destinations, and the fan-out of each
        first, count = self._node_grp[dst], self._node_grp[dst + 1] - self._node_grp[dst]
        owner = torch.arange(dst.numel()).repeat_interleave(count)
        grp = _ranges(first, count)
        k = fanout[self._grp_rel[grp]]
        keep = k != 0
        grp, owner, k = grp[keep], owner[keep], k[keep]
        pos, seg = _sample_segments(self._grp_start[grp], self._grp_len[grp], k, generator)
        src, rel, dst_local = self._src[pos], self._grp_rel[grp][seg], owner[seg]
        # the sources: the destinations, then the new nodes (first appearance), type by type
        nodes, where = self._first_occurrence(torch.cat([dst, src]))
        new = nodes[dst.numel():]
        new_type = self._node_type[new]
        by_type = stable_argsort_small(new_type, g.num_ntypes)
        new_counts = torch.bincount(new_type, minlength=g.num_ntypes).tolist()
        local = torch.empty(nodes.numel(), dtype=torch.int64)
        local[:dst.numel()] = torch.arange(dst.numel())
        local[dst.numel() + by_type] = dst.numel() + torch.arange(new.numel())
        src_local = local[where[dst.numel():]]
        # relation by relation (within a relation, in the order drawn)
        order = stable_argsort_small(rel, g.num_rels)
        rel_counts = torch.bincount(rel, minlength=g.num_rels)
        num_src = [d + n for d, n in zip(dst_counts, new_counts)]
        block = Batch.from_global(g.ntypes, g.canonical_etypes, num_src=num_src, num_dst=dst_counts,
                                  src=src_local[order], dst=dst_local[order], rel_counts=rel_counts, name=g.name)
        # the next layer's destinations: this block's sources, type by type, each type's destinations first
        new_sorted = new[by_type]
        d_bounds, n_bounds = [0, *itertools.accumulate(dst_counts)], [0, *itertools.accumulate(new_counts)]
        sources = torch.cat([part for t in range(g.num_ntypes) for part in
                             (dst[d_bounds[t]:d_bounds[t + 1]], new_sorted[n_bounds[t]:n_bounds[t + 1]])])
        return block, sources, num_src


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


def _ranges(first: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``first[i] .. first[i] + count[i] - 1`` for every ``i``, concatenated."""
    total = int(count.sum())
    starts = torch.cumsum(count, 0) - count
    return first.repeat_interleave(count) + torch.arange(total) - starts.repeat_interleave(count)


def _sample_segments(start: torch.Tensor, deg: torch.Tensor, k: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each segment ``[start, start + deg)``: every position when ``deg <= k`` (or ``k == -1``), else
    ``k`` of them uniformly without replacement; the positions and the segment of each, by segment (a block's
    edges then come by destination within each relation: what binding a batch counts on)."""
    seg = torch.arange(deg.numel())
    small = (deg <= k) | (k == -1)
    s_deg = deg[small]
    pos, owner = [_ranges(start[small], s_deg)], [seg[small].repeat_interleave(s_deg)]
    # a segment at most 4 fan-outs long: a random key per position, the k smallest; a longer one: 2k draws
    # with replacement, then k of their distinct values at random (a uniform k-subset by symmetry; a
    # segment left with fewer than k distinct ones, rarely, takes the first way)
    short = ~small & (deg <= 4 * k)
    long = ~small & ~short
    if bool(long.any()):
        l_seg, l_deg, l_k = seg[long], deg[long], k[long]
        draws = 2 * l_k
        owner_l = torch.arange(l_seg.numel()).repeat_interleave(draws)
        offset = (torch.rand(owner_l.numel(), generator=generator, dtype=torch.float64) * l_deg[owner_l]).long()
        key, counts = torch.unique(owner_l * int(l_deg.max()) + offset, return_counts=True)
        u_owner, u_offset = key // int(l_deg.max()), key % int(l_deg.max())
        distinct = torch.bincount(u_owner, minlength=l_seg.numel())
        enough = distinct >= l_k
        ok = enough[u_owner]
        chosen = _k_smallest_random(u_owner[ok], l_k, generator)
        pos.append(start[l_seg][u_owner[ok][chosen]] + u_offset[ok][chosen])
        owner.append(l_seg[u_owner[ok][chosen]])
        short[l_seg[~enough]] = True
    if bool(short.any()):
        b_seg, b_deg, b_k = seg[short], deg[short], k[short]
        cand_owner = torch.arange(b_seg.numel()).repeat_interleave(b_deg)
        chosen = _k_smallest_random(cand_owner, b_k, generator)
        first = torch.cumsum(b_deg, 0) - b_deg
        pos.append(start[b_seg][cand_owner[chosen]] + chosen - first[cand_owner[chosen]])
        owner.append(b_seg[cand_owner[chosen]])
    if len(pos) == 1:  # every segment taken whole: in segment order already
        return pos[0], owner[0]
    positions, segments = torch.cat(pos), torch.cat(owner)
    by_segment = stable_argsort_small(segments, max(deg.numel(), 1))
    return positions[by_segment], segments[by_segment]


def _k_smallest_random(owner: torch.Tensor, k: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Of the candidates grouped by ``owner`` (non-decreasing), ``k[o]`` of each group ``o`` uniformly at
    random: their indices."""
    keys = owner.double() + torch.rand(owner.numel(), generator=generator, dtype=torch.float64)
    order = torch.sort(keys).indices  # by group, then key
    counts = torch.bincount(owner, minlength=k.numel())
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - first[owner[order]]
    return order[rank < k[owner[order]]]
