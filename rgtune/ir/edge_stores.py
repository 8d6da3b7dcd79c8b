"""Merging per-edge stores, and the sums they read, into one traversal (``autodiff.reuse=fuse``).

A training program's backward writes several per-edge values that read the same rows and share a
reduction: RGAT's four edge gradients (the messages', the two attention vectors' and the
destination projection's) each need the attention score's gradient ``alpha * (<dout, m> - s_dst) *
leaky_relu'(...)``, three inner products of a row. Lowered one kernel per value, every kernel walks
the edges, gathers ``dout`` at the destination, loads the same rows and recomputes the score's
gradient for the one row it stores. Merged, one walk loads each row once, computes what the values
share once per edge, and stores them all (:class:`~rgtune.ir.kernels.EdgeStores`): fewer passes over
the edges, fewer launches.

Two edge stores merge when they are in the same phase (forward or backward), have the same layout
and output shape (one loop over heads and features covers both), neither reads the other's output,
and one can move next to the other: the merged kernel stands where the first one was (the second
is hoisted over the kernels between, which must not write what it reads, nor read or write what it
writes) or where the second one was (the first is delayed: the kernels between must not read what
it writes, nor write what it reads or writes).

Then the softmax backward's destination sum joins the stores that read it: RGAT's
``s[dst] += alpha * <dout, m>`` is read by every score gradient as ``s@dst``. An aggregation into
destinations (or destination pairs: a softmax per relation's) and the (merged) stores after it that read
its output, at their edge's destination (pair) and nowhere else, become one traversal (:class:`~rgtune.ir.kernels.AggregateStores`) under the same rules
of phase, layout and movement, when the sum reads none of the stores' outputs: a destination's thread
(warp) sums over its in-edges, then stores over the same in-edges, the sum finished. RGAT's training
program goes from 19 kernels to 15; HGT's from 46 to 44.

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.search_spaces import SearchSpace
    >>> from rgtune.ir.models import build_model
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> space = SearchSpace(build_model("rgat", 16, 16), g, "cpu", mode="training")
    >>> separate = space.compile(space.default()).kernels
    >>> merged = space.compile({**space.default(), "autodiff.reuse": "fuse"}).kernels
    >>> len(separate.kernels), len(merged.kernels)
    (19, 15)
    >>> print(next(k for k in merged.kernels if k.name == "aggregate2").describe())
    traversal aggregate2 over edges (csr_dst): vg5[dst] += (v10@row * sum_dim((dout@dst * v1@row))), then 4 stores
        vg12[e] = ((dout@dst * v10@row) + (((v10@row * (sum_dim((dout@dst * v1@row)) - vg5@dst)) * ...
        vg13[e] = ...
        vg14[e] = ...
        vg15[e] = ...
"""

from __future__ import annotations

from rgtune.ir.kernels import (AggregateStage, AggregateStores, EdgeStore, EdgeStores, Kernel, Load, ParamLoad, Stage,
                               TraversalKernel, WeightGradKernel, WeightKernel)

__all__ = ["merge_edge_stores"]


def merge_edge_stores(kernels: list[Kernel], forward_kernels: int | None,
                      shapes: dict[str, tuple[int, int]]) -> tuple[list[Kernel], int | None]:
    """``kernels`` with every mergeable pair of edge stores merged (see the module docstring), until none
    is left, and the new count of forward kernels. ``shapes``: buffer name -> ``(heads, dim)``."""
    out = list(kernels)
    split = forward_kernels
    merged = True
    while merged:
        merged = False
        stores = [i for i, k in enumerate(out) if _stores(k)]
        for a in stores:
            for b in (j for j in stores if j > a):
                at = _placement(out, a, b, split, shapes)
                if at is None:
                    continue
                ka, kb = out[a], out[b]
                assert isinstance(ka, TraversalKernel) and isinstance(kb, TraversalKernel)
                split = _replace(out, a, b, at, EdgeStores(_stores(ka) + _stores(kb)), split)
                merged = True
                break
            if merged:
                break
    return _sums_into_stores(out, split)


def _sums_into_stores(ks: list[Kernel], split: int | None) -> tuple[list[Kernel], int | None]:
    """Each aggregation into destinations (or destination pairs) fused with the (merged) edge stores after it
    that read its sum at their destination (pair) (:class:`~rgtune.ir.kernels.AggregateStores`), where one
    can move next to the other (as two stores do, :func:`_placement`), and the new count of forward kernels."""
    out = list(ks)
    for a, ka in enumerate(out):
        if not (isinstance(ka, TraversalKernel) and isinstance(ka.stage, AggregateStage)):
            continue
        total = ka.stage
        for b in range(a + 1, len(out)):
            kb = out[b]
            stores = _stores(kb)
            if not stores or not _reads_sum_at(stores, total.out, total.out_via):
                continue
            assert isinstance(kb, TraversalKernel)
            if kb.layout != ka.layout or (split is not None and (a < split) != (b < split)) \
                    or set(kb.writes()) & ka.reads():
                break
            at = _meeting_point(out, a, b)
            if at is None:
                break
            split = _replace(out, a, b, at, AggregateStores(total, stores), split)
            return _sums_into_stores(out, split)  # the list changed: look again from the start
    return out, split


def _reads_sum_at(stores: tuple[EdgeStore, ...], total: str, via: str) -> bool:
    """Whether ``stores`` read buffer ``total``, and only at ``via``, the row their edge's destination
    (``dst``) or destination pair (``dst_pair``) summed into: the fused walk has finished that one, another
    node's may not be."""
    vias = {x.via for s in stores for x in s.value.walk() if isinstance(x, Load) and x.buffer == total}
    return vias == {via}


def _stores(k: Kernel) -> tuple[EdgeStore, ...]:
    """The stores of an edge-store traversal (empty for any other kernel)."""
    if not isinstance(k, TraversalKernel):
        return ()
    if isinstance(k.stage, EdgeStore):
        return (k.stage,)
    if isinstance(k.stage, EdgeStores):
        return k.stage.stores
    return ()


def _placement(ks: list[Kernel], a: int, b: int, split: int | None,
               shapes: dict[str, tuple[int, int]]) -> int | None:
    """Where the merge of edge stores ``ks[a]`` and ``ks[b]`` (``a < b``) can stand: ``a`` (``b`` hoisted),
    ``b`` (``a`` delayed), or ``None`` when they cannot merge."""
    ka, kb = ks[a], ks[b]
    assert isinstance(ka, TraversalKernel) and isinstance(kb, TraversalKernel)
    if split is not None and (a < split) != (b < split):
        return None  # a forward and a backward kernel: the phases run apart
    if ka.layout != kb.layout:
        return None
    if len({shapes[o] for o in ka.writes() | kb.writes()}) != 1:
        return None
    if _conflict(ka, kb):
        return None
    return _meeting_point(ks, a, b)


def _meeting_point(ks: list[Kernel], a: int, b: int) -> int | None:
    """Where traversals ``ks[a]`` and ``ks[b]`` (``a < b``) can stand together: ``a`` (``b`` hoisted over the
    kernels between), else ``b`` (``a`` delayed), else ``None``."""
    ka, kb = ks[a], ks[b]
    assert isinstance(ka, TraversalKernel) and isinstance(kb, TraversalKernel)
    between = ks[a + 1:b]
    if not any(_conflict(k, kb) for k in between):
        return a
    if not any(_conflict(k, ka) for k in between):
        return b
    return None


def _replace(ks: list[Kernel], a: int, b: int, at: int, stage: Stage, split: int | None) -> int | None:
    """``ks[a]`` and ``ks[b]`` replaced, in place, by one traversal of ``stage`` at ``at`` (named and laid out as
    ``ks[a]``); the new count of forward kernels."""
    first = ks[a]
    assert isinstance(first, TraversalKernel)
    ks[at] = TraversalKernel(first.name, stage, first.layout)
    del ks[b if at == a else a]
    return split - 1 if split is not None and b < split else split  # two forward kernels became one


def _conflict(k: Kernel, store: TraversalKernel) -> bool:
    """Whether edge store ``store`` cannot move over ``k``: ``k`` writes a buffer or param it reads, or reads
    or writes a buffer it writes."""
    reads = store.reads() | {x.param for e in store.stage.exprs() for x in e.walk() if isinstance(x, ParamLoad)}
    written = k.writes() | ({k.out} if isinstance(k, WeightKernel) else set()) | \
        ({k.grad} if isinstance(k, WeightGradKernel) else set())
    return bool(written & reads or (k.reads() | k.writes()) & store.writes())
