"""In-neighbourhoods of sampled destination nodes: how a big graph's layer is checked row by row.

A relational layer's output row of node ``v`` depends only on ``v``'s own input row and on the edges
into ``v`` (their sources' input rows, their relations, ``v``'s in-degrees); so does the gradient
that flows back from that row. The subgraph made of a set of destinations, every edge into them and
those edges' sources (:func:`in_neighbourhood`) therefore computes exactly the same output rows for
the destinations as the whole graph does, at the cost of their neighbourhoods instead of the graph.
It keeps every node type and relation of the graph (some may be empty), so parameters made for the
graph (one slice per type or relation) fit it unchanged.

:func:`sample_destinations` picks which rows to check: the nodes with the most in-edges (where a
float32 sum is longest and a kernel's work splitting matters most), a few nodes with no in-edge
(only their own row and bias reach the output), one destination of every non-empty relation (so
every relation's weights are exercised), and uniform random nodes for the rest.

Example:
    >>> import torch
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((40, 60), num_relations=3, num_edges=400, seed=0)
    >>> hood = in_neighbourhood(g, sample_destinations(g, 16, seed=1))
    >>> hood.graph.num_edges() == int(torch.isin(g.dst, hood.nodes[hood.rows]).sum())
    True
    >>> hood.graph.ntypes == g.ntypes and hood.graph.canonical_etypes == g.canonical_etypes
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rgtune.data.graph import HeteroGraph

__all__ = ["Neighbourhood", "in_neighbourhood", "sample_destinations", "HUBS", "SOURCELESS"]

#: the destinations with the most in-edges that every sample includes
HUBS = 2
#: destinations without any in-edge that every sample includes (when the graph has some)
SOURCELESS = 2


@dataclass(frozen=True)
class Neighbourhood:
    """A subgraph of a graph: some destinations, every edge into them, those edges' sources.

    ``nodes`` are the subgraph's nodes as ids of the whole graph (sorted; the subgraph numbers them
    0..len-1 in that order, so node types stay in the graph's order); ``rows`` are the positions of
    the chosen destinations among them; ``dst`` the destinations' ids in the whole graph (sorted).
    """

    graph: HeteroGraph
    nodes: torch.Tensor
    rows: torch.Tensor
    dst: torch.Tensor

    @property
    def max_in_degree(self) -> int:
        """The longest in-edge list of a destination (the longest reduction over edges)."""
        if not self.graph.num_edges():
            return 0
        return int(torch.bincount(self.graph.dst, minlength=self.graph.num_nodes()).max())

    def describe(self) -> dict[str, int]:
        """What a check on this neighbourhood covers, as JSON values."""
        return {"rows": int(self.dst.numel()), "nodes": int(self.nodes.numel()), "edges": self.graph.num_edges(),
                "max_in_degree": self.max_in_degree}


def sample_destinations(graph: HeteroGraph, count: int, seed: int = 0) -> torch.Tensor:
    """About ``count`` destination node ids (global, sorted, distinct) to check (see the module docstring).

    Example:
        >>> from rgtune.data.synthetic import random_graph
        >>> g = random_graph((40, 60), num_relations=3, num_edges=400, seed=0)
        >>> d = sample_destinations(g, 10, seed=0)
        >>> bool((d[1:] > d[:-1]).all()), int(torch.bincount(g.dst, minlength=100).argmax()) in d.tolist()
        (True, True)
    """
    if count < 1:
        raise ValueError(f"count must be at least 1 destination, got {count}")
    n = graph.num_nodes()
    if n <= count:
        return torch.arange(n, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    degree = graph.in_degrees  # cached on the graph: this runs every trial
    picked = [torch.topk(degree, min(HUBS, n)).indices]
    sourceless = (degree == 0).nonzero().flatten()
    if sourceless.numel():
        picked.append(sourceless[torch.randperm(sourceless.numel(), generator=gen)[:SOURCELESS]])
    offsets = graph.rel_offsets
    for r in range(graph.num_rels):  # one destination of every relation that has edges
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        if hi > lo:
            picked.append(graph.dst[lo + int(torch.randint(hi - lo, (1,), generator=gen))].reshape(1))
    chosen = torch.unique(torch.cat(picked))
    missing = count - chosen.numel()
    if missing > 0:
        # more than needed, then the first new ones: a random permutation of n would cost O(n) memory per trial
        extra = torch.unique(torch.randint(n, (2 * missing + 16,), generator=gen))
        extra = extra[~torch.isin(extra, chosen)]
        extra = extra[torch.randperm(extra.numel(), generator=gen)[:missing]]
        chosen = torch.unique(torch.cat([chosen, extra]))
    return chosen


def in_neighbourhood(graph: HeteroGraph, dst: torch.Tensor) -> Neighbourhood:
    """The subgraph of the destinations ``dst`` (global ids): every edge into them and its source.

    Example:
        >>> from rgtune.data.synthetic import random_graph
        >>> g = random_graph((5, 5), num_relations=2, num_edges=30, seed=0)
        >>> h = in_neighbourhood(g, torch.tensor([7]))
        >>> h.graph.num_edges() == int((g.dst == 7).sum()), int(h.nodes[h.rows][0])
        (True, 7)
    """
    dst = torch.unique(torch.as_tensor(dst, dtype=torch.int64))
    n = graph.num_nodes()
    if dst.numel() and (int(dst.min()) < 0 or int(dst.max()) >= n):
        raise ValueError(f"destination ids must be in [0, {n}), got {int(dst.min())}..{int(dst.max())}")
    wanted = torch.zeros(n, dtype=torch.bool)
    wanted[dst] = True
    keep = wanted[graph.dst].nonzero().flatten()  # edges into the destinations, in the graph's order
    nodes = torch.unique(torch.cat([dst, graph.src[keep]]))  # sorted: node types stay contiguous
    local = lambda ids: torch.searchsorted(nodes, ids)  # noqa: E731 - global id -> subgraph id
    type_of = graph.node_type[nodes]
    counts = torch.bincount(type_of, minlength=graph.num_ntypes)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)[:-1]])
    src_l, dst_l, rel = local(graph.src[keep]), local(graph.dst[keep]), graph.etype[keep]
    edges = {}
    for r, (stype, name, dtype_) in enumerate(graph.canonical_etypes):
        mine = rel == r
        edges[(stype, name, dtype_)] = (src_l[mine] - starts[graph.ntype_id(stype)],
                                        dst_l[mine] - starts[graph.ntype_id(dtype_)])
    sub = HeteroGraph({t: int(counts[i]) for i, t in enumerate(graph.ntypes)}, edges,
                      name=f"{graph.name}[{dst.numel()} rows]")
    return Neighbourhood(sub, nodes, local(dst), dst)
