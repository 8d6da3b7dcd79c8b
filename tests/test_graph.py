"""Tests of :class:`rgtune.data.graph.HeteroGraph`: queries, global numbering, derived layouts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rgtune.data.graph import HeteroGraph, NodeTask

# ---------------------------------------------------------------------------- fixtures


def _small() -> HeteroGraph:
    """The module docstring's graph plus a second 'cites' between other types and an empty relation."""
    return HeteroGraph(
        {"paper": 3, "author": 2, "venue": 1},
        {
            ("author", "writes", "paper"): (torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1])),
            ("paper", "cites", "paper"): (torch.tensor([1, 2]), torch.tensor([0, 0])),
            ("paper", "cites", "venue"): (torch.tensor([2]), torch.tensor([0])),
            ("venue", "hosts", "paper"): ([], []),
        },
        name="small",
    )


@st.composite
def hetero_graphs(draw: st.DrawFn) -> HeteroGraph:
    """Small random heterographs: empty types and relations, repeated names, multi-edges, self-loops."""
    ntypes = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
    counts = {t: draw(st.integers(0, 7)) for t in ntypes}
    triples = draw(
        st.lists(st.tuples(st.sampled_from(ntypes), st.sampled_from(["r", "s", "t"]), st.sampled_from(ntypes)),
                 max_size=5, unique=True)
    )
    edges = {}
    for s, r, d in triples:
        n = draw(st.integers(0, 15)) if counts[s] and counts[d] else 0
        src = draw(st.lists(st.integers(0, max(counts[s] - 1, 0)), min_size=n, max_size=n))
        dst = draw(st.lists(st.integers(0, max(counts[d] - 1, 0)), min_size=n, max_size=n))
        edges[(s, r, d)] = (torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64))
    return HeteroGraph(counts, edges, name="hyp")


def _hub(in_degree: int = 12_000) -> HeteroGraph:
    """One 'page' with ``in_degree`` in-edges from distinct users, plus a little other traffic."""
    rng = np.random.default_rng(0)
    users = in_degree + 100
    src = np.concatenate([np.arange(in_degree), rng.integers(0, users, 500)])
    dst = np.concatenate([np.full(in_degree, 3), rng.integers(0, 10, 500)])
    return HeteroGraph(
        {"user": users, "page": 10},
        {("user", "likes", "page"): (src, dst), ("page", "links", "page"): (np.array([0, 1, 3]), np.array([3, 3, 2]))},
    )


SETTINGS = settings(max_examples=40, deadline=None)

# ------------------------------------------------------------------------- DGL-style queries


def test_types_are_sorted_and_named_like_dgl() -> None:
    g = _small()
    assert g.ntypes == ["author", "paper", "venue"]
    assert g.canonical_etypes == sorted(g.canonical_etypes)
    assert g.etypes == ["writes", "cites", "cites", "hosts"]
    assert (g.num_ntypes, g.num_rels) == (3, 4)
    assert g.num_nodes() == 6 and g.num_nodes("paper") == 3
    assert g.num_edges() == 6 and g.num_edges("writes") == 3 and g.num_edges(("paper", "cites", "venue")) == 1
    assert g.num_edges("hosts") == 0
    src, dst = g.edges("writes")
    assert src.tolist() == [0, 0, 1] and dst.tolist() == [0, 1, 1]


def test_node_dict_order_does_not_matter() -> None:
    a = HeteroGraph({"x": 2, "y": 3}, {("x", "r", "y"): ([0, 1], [2, 0])})
    b = HeteroGraph({"y": 3, "x": 2}, {("x", "r", "y"): ([0, 1], [2, 0])})
    assert a.ntypes == b.ntypes and a.content_hash == b.content_hash
    assert torch.equal(a.src, b.src) and torch.equal(a.dst, b.dst)


def test_etype_lookup_errors() -> None:
    g = _small()
    with pytest.raises(KeyError, match="ambiguous"):
        g.to_canonical_etype("cites")
    with pytest.raises(KeyError, match="unknown edge type"):
        g.num_edges("nope")
    with pytest.raises(KeyError, match="unknown canonical"):
        g.rel_id(("paper", "writes", "author"))
    with pytest.raises(ValueError, match="edge types"):
        g.edges()
    with pytest.raises(KeyError, match="unknown node type"):
        g.num_nodes("journal")
    assert g.rel_id(("paper", "cites", "venue")) == g.canonical_etypes.index(("paper", "cites", "venue"))
    single = HeteroGraph({"a": 2}, {("a", "r", "a"): ([0], [1])})
    assert single.edges()[1].tolist() == [1]


# --------------------------------------------------------------------------- global numbering


@SETTINGS
@given(hetero_graphs())
def test_global_numbering(g: HeteroGraph) -> None:
    counts = [g.num_nodes(t) for t in g.ntypes]
    assert g.node_offsets.tolist() == [0] + list(np.cumsum(counts))
    assert g.node_type.tolist() == [i for i, n in enumerate(counts) for _ in range(n)]
    sizes = [g.num_edges(c) for c in g.canonical_etypes]
    assert g.rel_offsets.tolist() == [0] + list(np.cumsum(sizes))
    assert g.etype.tolist() == [r for r, n in enumerate(sizes) for _ in range(n)]
    for r, (s, _, d) in enumerate(g.canonical_etypes):
        lo, hi = int(g.rel_offsets[r]), int(g.rel_offsets[r + 1])
        ts, td = g.edges(g.canonical_etypes[r])
        assert torch.equal(g.src[lo:hi], g.to_global(s, ts)) and torch.equal(g.dst[lo:hi], g.to_global(d, td))
        assert int(g.src_ntype_of_rel[r]) == g.ntype_id(s) and int(g.dst_ntype_of_rel[r]) == g.ntype_id(d)
        assert bool((g.node_type[g.src[lo:hi]] == g.ntype_id(s)).all())
        assert bool((g.node_type[g.dst[lo:hi]] == g.ntype_id(d)).all())


def test_flatten_and_split_nodes() -> None:
    g = _small()
    per_type = {t: torch.full((g.num_nodes(t), 2), float(i)) for i, t in enumerate(g.ntypes)}
    flat = g.flatten_nodes(per_type)
    assert flat[:, 0].tolist() == g.node_type.double().tolist()
    assert all(torch.equal(v, per_type[t]) for t, v in g.split_nodes(flat).items())
    with pytest.raises(KeyError, match="missing"):
        g.flatten_nodes({"paper": per_type["paper"]})
    with pytest.raises(ValueError, match="expected 3 rows"):
        g.flatten_nodes({**per_type, "paper": torch.zeros(2, 2)})


def test_from_global_matches_constructor() -> None:
    g = _small()
    h = HeteroGraph.from_global(
        {t: g.num_nodes(t) for t in g.ntypes}, g.src, g.dst, g.etype, g.canonical_etypes, name="again"
    )
    assert h.content_hash == g.content_hash
    with pytest.raises(ValueError, match="etype ids"):
        HeteroGraph.from_global({"a": 2}, [0], [1], [1], [("a", "r", "a")])


# ------------------------------------------------------------------------ derived structures


@SETTINGS
@given(hetero_graphs())
def test_layouts_are_sorted_permutations(g: HeteroGraph) -> None:
    for order in ("dst", "src"):
        lay = g.layout(order)
        assert sorted(lay.eid.tolist()) == list(range(g.num_edges()))
        assert torch.equal(lay.src, g.src[lay.eid]) and torch.equal(lay.dst, g.dst[lay.eid])
        assert torch.equal(lay.etype, g.etype)  # relation blocks stay where they are
        keys = list(zip(lay.etype.tolist(), *((lay.dst, lay.src) if order == "dst" else (lay.src, lay.dst))))
        keys = [(r, int(a), int(b)) for r, a, b in keys]
        assert keys == sorted(keys)
    with pytest.raises(ValueError):
        g.layout("edge")  # type: ignore[arg-type]


@SETTINGS
@given(hetero_graphs())
def test_csr_by_dst(g: HeteroGraph) -> None:
    csr = g.csr_by_dst
    assert sorted(csr.eid.tolist()) == list(range(g.num_edges()))
    assert torch.equal(csr.indptr[1:] - csr.indptr[:-1], g.in_degrees)
    for v in range(g.num_nodes()):
        lo, hi = int(csr.indptr[v]), int(csr.indptr[v + 1])
        eids = csr.eid[lo:hi]
        assert bool((g.dst[eids] == v).all())
        assert torch.equal(csr.src[lo:hi], g.src[eids]) and torch.equal(csr.etype[lo:hi], g.etype[eids])
        keys = list(zip(csr.etype[lo:hi].tolist(), csr.src[lo:hi].tolist()))
        assert keys == sorted(keys)


def _check_pairs(g: HeteroGraph) -> None:
    for side in ("src", "dst"):
        pairs = g.unique_pairs(side)
        ends = g.src if side == "src" else g.dst
        brute = set(zip(ends.tolist(), g.etype.tolist()))
        assert pairs.num_pairs == len(brute)
        got = list(zip(pairs.etype.tolist(), pairs.node.tolist()))
        assert got == sorted((r, n) for n, r in brute)  # by relation, then node
        p = pairs.edge_to_pair
        assert torch.equal(pairs.node[p], ends) and torch.equal(pairs.etype[p], g.etype)
        assert int(pairs.pair_count.sum()) == g.num_edges()
        assert torch.equal(pairs.pair_count, torch.bincount(p, minlength=pairs.num_pairs))
        per_rel = Counter(r for _, r in brute)
        assert pairs.pairs_per_relation().tolist() == [per_rel[r] for r in range(g.num_rels)]


@SETTINGS
@given(hetero_graphs())
def test_unique_pairs_match_brute_force(g: HeteroGraph) -> None:
    _check_pairs(g)
    with pytest.raises(ValueError):
        g.unique_pairs("both")  # type: ignore[arg-type]


@SETTINGS
@given(hetero_graphs())
def test_stats_match_brute_force(g: HeteroGraph) -> None:
    s = g.stats
    indeg = Counter(g.dst.tolist())
    outdeg = Counter(g.src.tolist())
    n = g.num_nodes()
    assert (s.num_nodes, s.num_edges, s.num_ntypes, s.num_rels) == (n, g.num_edges(), g.num_ntypes, g.num_rels)
    assert s.max_in_degree == max(indeg.values(), default=0)
    assert s.max_out_degree == max(outdeg.values(), default=0)
    assert s.isolated_nodes == sum(1 for v in range(n) if v not in indeg and v not in outdeg)
    assert s.empty_relations == sum(1 for c in g.canonical_etypes if g.num_edges(c) == 0)
    assert s.src_pairs == len(set(zip(g.src.tolist(), g.etype.tolist())))
    assert s.mean_in_degree == pytest.approx(g.num_edges() / n if n else 0.0)
    if g.num_edges():
        assert s.dst_pair_ratio == pytest.approx(s.dst_pairs / g.num_edges())
    assert set(s.as_dict()) >= {"in_degree_cv", "src_pair_ratio", "edges_per_relation_cv"}
    assert "HeteroGraph(" in g.describe()


def test_hub_with_many_in_edges() -> None:
    g = _hub(12_000)
    hub = g.to_global("page", torch.tensor([3]))
    assert int(g.in_degrees.argmax()) == int(hub) and g.stats.max_in_degree >= 12_000
    csr = g.csr_by_dst
    lo, hi = int(csr.indptr[hub]), int(csr.indptr[hub + 1])
    assert hi - lo == int(g.in_degrees[hub])
    # Within the hub, edges are grouped by relation ('likes' before 'links'), then sorted by source.
    keys = list(zip(csr.etype[lo:hi].tolist(), csr.src[lo:hi].tolist()))
    assert keys == sorted(keys)
    dst_pairs = g.unique_pairs("dst")
    likes = g.rel_id("likes")
    hub_pair = int(((dst_pairs.node == hub) & (dst_pairs.etype == likes)).nonzero())
    assert int(dst_pairs.pair_count[hub_pair]) >= 12_000
    _check_pairs(g)


# ----------------------------------------------------------------------------- content hash


def test_content_hash_is_stable() -> None:
    # A fixed value: the hash keys graphs in results databases, so it must not drift between
    # runs, machines or versions. If the hashing is changed on purpose, update it here.
    assert _small().content_hash == _small().content_hash
    assert _small().content_hash == "5c87a55efeda213e"


def test_content_hash_ignores_labels_and_features() -> None:
    g = _small()
    h = HeteroGraph(
        {t: g.num_nodes(t) for t in g.ntypes},
        {c: g.edges(c) for c in g.canonical_etypes},
        name="renamed",
        features={"paper": torch.randn(3, 4)},
        task=NodeTask("paper", 2, torch.tensor([0]), torch.tensor([1]), torch.tensor([2]), torch.tensor([0])),
    )
    assert h.content_hash == g.content_hash


def _variant(**change: object) -> HeteroGraph:
    nodes = {"paper": 3, "author": 2, "venue": 1}
    edges: dict[tuple[str, str, str], tuple[object, object]] = {
        ("author", "writes", "paper"): ([0, 0, 1], [0, 1, 1]),
        ("paper", "cites", "paper"): ([1, 2], [0, 0]),
        ("paper", "cites", "venue"): ([2], [0]),
        ("venue", "hosts", "paper"): ([], []),
    }
    if "nodes" in change:
        nodes.update(change["nodes"])  # type: ignore[arg-type]
    if "edges" in change:
        edges.update(change["edges"])  # type: ignore[arg-type]
    if "drop" in change:
        del edges[change["drop"]]  # type: ignore[arg-type]
    return HeteroGraph(nodes, edges)


@pytest.mark.parametrize(
    "change",
    [
        {"nodes": {"venue": 2}},  # one more (isolated) node
        {"nodes": {"journal": 0}},  # one more, empty, node type
        {"edges": {("author", "writes", "paper"): ([0, 0, 1], [0, 1, 2])}},  # one endpoint
        {"edges": {("author", "writes", "paper"): ([0, 0], [0, 1])}},  # one edge fewer
        {"drop": ("venue", "hosts", "paper")},  # an empty relation less
        {"drop": ("paper", "cites", "venue"), "edges": {("paper", "cited", "venue"): ([2], [0])}},  # a name
    ],
)
def test_content_hash_is_sensitive(change: dict[str, object]) -> None:
    assert _variant().content_hash == _small().content_hash
    assert _variant(**change).content_hash != _small().content_hash


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "nodes, edges, error, match",
    [
        ({"a": 2}, {("a", "r", "b"): ([0], [0])}, ValueError, "names node type 'b'"),
        ({"a": 2}, {("a", "r", "a"): ([0, 2], [0, 1])}, ValueError, r"src id out of range \[0, 2\)"),
        ({"a": 2}, {("a", "r", "a"): ([0], [-1])}, ValueError, "dst id out of range"),
        ({"a": 2}, {("a", "r", "a"): ([0.0], [1.0])}, TypeError, "integer"),
        ({"a": 2}, {("a", "r", "a"): (torch.tensor([0.5]), torch.tensor([1]))}, TypeError, "float"),
        ({"a": 2}, {("a", "r", "a"): ([True], [False])}, TypeError, "bool"),
        ({"a": 2}, {("a", "r", "a"): ([0, 1], [1])}, ValueError, "2 sources but 1 destinations"),
        ({"a": -1}, {}, ValueError, "negative node count"),
        ({"a": 2}, {("a", "r"): ([0], [1])}, ValueError, "canonical edge type"),
    ],
)
def test_bad_input_raises(nodes: dict[str, int], edges: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        HeteroGraph(nodes, edges)


def test_empty_relations_and_graphs_are_fine() -> None:
    g = HeteroGraph({"a": 3}, {("a", "r", "a"): ([], []), ("a", "s", "a"): (np.array([], dtype=np.int32), [])})
    assert g.num_edges() == 0 and g.stats.empty_relations == 2 and g.stats.isolated_nodes == 3
    e = HeteroGraph({}, {})
    assert e.num_nodes() == 0 and e.csr_by_dst.indptr.tolist() == [0] and e.unique_pairs("src").num_pairs == 0
