"""Tests of the synthetic graph generator: determinism, preset statistics, knobs, spec errors."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rgtune.data.errors import DatasetError
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import PRESETS, SyntheticSpecError, describe_presets, load_synthetic, random_graph

# The datasets README: nodes, edges (with reverse edges), canonical edge types, relation names.
README = {
    "aifb": (7_262, 48_810, 104, 78),
    "mutag": (27_163, 148_100, 50, 46),
    "bgs": (94_806, 672_884, 96, 96),
    "am": (881_680, 5_668_682, 96, 96),
}
MAG_NODES = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
MAG_EDGES = {
    ("author", "writes", "paper"): 7_145_660,
    ("author", "affiliated_with", "institution"): 1_043_998,
    ("paper", "cites", "paper"): 5_416_271,
    ("paper", "has_topic", "field_of_study"): 7_505_078,
}


def _has_duplicate_edges(g: HeteroGraph) -> bool:
    n = g.num_nodes()
    keys = (g.etype * n + g.src) * n + g.dst
    return bool(torch.unique(keys).numel() < keys.numel())


# ------------------------------------------------------------------------------ determinism


def test_same_spec_same_graph() -> None:
    a, b = load_synthetic("aifb,scale=0.5,seed=3"), load_synthetic("aifb,seed=3,scale=0.5")
    assert a.content_hash == b.content_hash and a.name == b.name == "synthetic:aifb,scale=0.5,seed=3"
    for c in a.canonical_etypes:
        assert all(torch.equal(x, y) for x, y in zip(a.edges(c), b.edges(c)))


def test_known_hashes() -> None:
    # Fixed values: a graph must be the same on every run and machine, since the results database
    # keys schedules by content_hash. A numpy that changed its Generator streams would show here.
    assert load_synthetic("custom,nodes=300,edges=2000,seed=5").content_hash == "267515091c2d30c7"
    assert random_graph([10, 20], 4, 80, degree_skew=1.0, seed=2).content_hash == "2b9306e35ee6a5d7"


def test_seed_changes_edges_not_schema() -> None:
    a, b = load_synthetic("mutag,scale=0.2,seed=1"), load_synthetic("mutag,scale=0.2,seed=2")
    assert a.content_hash != b.content_hash
    assert a.canonical_etypes == b.canonical_etypes
    assert a.subgraph_counts() == b.subgraph_counts()
    assert {t: a.num_nodes(t) for t in a.ntypes} == {t: b.num_nodes(t) for t in b.ntypes}


def test_defaults_do_not_change_the_name() -> None:
    g = load_synthetic("synthetic:aifb,seed=0,scale=1,reverse=1")
    assert g.name == "synthetic:aifb" and g.content_hash == load_synthetic("aifb").content_hash


# ------------------------------------------------------------------------- preset statistics


@pytest.mark.parametrize("preset", ["aifb", "mutag", "bgs", pytest.param("am", marks=pytest.mark.slow)])
def test_rdf_presets_match_readme(preset: str) -> None:
    nodes, edges, rels, names = README[preset]
    g = load_synthetic(preset)
    assert (g.num_nodes(), g.num_edges(), g.num_rels, len(set(g.etypes))) == (nodes, edges, rels, names)
    assert not _has_duplicate_edges(g)
    # Every relation has a reverse twin with the same edges, swapped.
    for s, r, d in g.canonical_etypes:
        if not r.startswith("rev-"):
            fs, fd = g.edges((s, r, d))
            rs, rd = g.edges((d, "rev-" + r, s))
            assert torch.equal(fs, rd) and torch.equal(fd, rs)
    assert g.stats.empty_relations == 0
    assert g.stats.isolated_nodes < 0.05 * nodes  # entity graphs mention (almost) all their nodes


def test_aifb_types_and_largest_relations() -> None:
    g = load_synthetic("aifb")
    assert {t: g.num_nodes(t) for t in g.ntypes} == {
        "Forschungsgebiete": 146, "Forschungsgruppen": 5, "Kooperationen": 28, "Personen": 237,
        "Projekte": 78, "Publikationen": 1318, "_Literal": 5450,
    }
    forward = sorted((g.num_edges(c), c) for c in g.canonical_etypes if not c[1].startswith("rev-"))[::-1]
    assert forward[:3] == [
        (2609, ("Personen", "publication", "Publikationen")),
        (2550, ("Publikationen", "author", "Personen")),
        (2120, ("Publikationen", "isAbout", "Forschungsgebiete")),
    ]
    assert all(c[0] != "_Literal" for _, c in forward)  # literals are only objects of triples
    m = load_synthetic("mutag")
    assert max(m.subgraph_counts().items(), key=lambda kv: kv[1]) in {
        (("bond", "inBond", "d"), 18_634), (("d", "rev-inBond", "bond"), 18_634)
    }


def test_ogbn_mag_small_scale() -> None:
    g = load_synthetic("ogbn-mag,scale=0.01")
    assert g.ntypes == sorted(MAG_NODES) and g.num_rels == 4
    for t, n in MAG_NODES.items():
        assert g.num_nodes(t) == round(n * 0.01)
    for c, n in MAG_EDGES.items():
        assert g.num_edges(c) == round(n * 0.01)
    r = load_synthetic("ogbn-mag,scale=0.01,reverse=1")
    assert r.num_rels == 8 and r.num_edges() == 2 * g.num_edges()
    assert r.num_edges(("paper", "rev_writes", "author")) == g.num_edges("writes")
    # Hubs: fields of study collect far more papers than papers collect authors.
    assert r.stats.in_degree_cv > 2.0 and g.stats.max_in_degree > 50 * g.stats.mean_in_degree


@pytest.mark.slow
def test_ogbn_mag_full_size_is_fast() -> None:
    t0 = time.perf_counter()
    g = load_synthetic("ogbn-mag")
    elapsed = time.perf_counter() - t0
    print(f"\nsynthetic ogbn-mag (21.1M edges): {elapsed:.1f} s")
    assert {t: g.num_nodes(t) for t in g.ntypes} == MAG_NODES
    assert g.subgraph_counts() == MAG_EDGES and g.num_edges() == 21_111_007
    assert elapsed < 120  # about 6 s on a 2-core machine; vectorized numpy, no Python loop over edges


# ------------------------------------------------------------------------------------ scale


@pytest.mark.parametrize("scale", [0.25, 2.0])
def test_scale_multiplies_counts(scale: float) -> None:
    base, g = load_synthetic("bgs"), load_synthetic(f"bgs,scale={scale}")
    assert g.num_rels == base.num_rels and g.canonical_etypes == base.canonical_etypes
    assert g.num_nodes() == pytest.approx(scale * base.num_nodes(), rel=0.01)
    assert g.num_edges() == pytest.approx(scale * base.num_edges(), rel=0.01)
    assert not _has_duplicate_edges(g)


def test_tiny_scale_clips_to_distinct_pairs() -> None:
    g = load_synthetic("aifb,scale=0.01")
    assert all(g.num_nodes(t) >= 1 for t in g.ntypes) and g.num_rels == 104
    assert not _has_duplicate_edges(g)
    assert 0 < g.num_edges() <= round(0.01 * 48_810) + 104


# ------------------------------------------------------------------------------------ knobs


def test_custom_counts_and_zipf() -> None:
    spec = "custom,nodes=10000,edges=80000,ntypes=4,rels=12,zipf=1.2,degree_skew=1.5,seed=0"
    g = load_synthetic(spec)
    assert (g.num_nodes(), g.num_edges(), g.num_ntypes, g.num_rels) == (10_000, 80_000, 4, 12)
    sizes = sorted(g.subgraph_counts().values())
    flat = sorted(load_synthetic("custom,nodes=10000,edges=80000,ntypes=4,rels=12,zipf=0").subgraph_counts().values())
    assert sizes[-1] / sizes[0] > 10 and flat[-1] - flat[0] <= 1
    assert not _has_duplicate_edges(g)


def test_degree_skew_makes_hubs() -> None:
    flat = load_synthetic("custom,nodes=5000,edges=50000,degree_skew=0,src_skew=0")
    skewed = load_synthetic("custom,nodes=5000,edges=50000,degree_skew=1.5,src_skew=0")
    assert skewed.stats.in_degree_cv > 2 * flat.stats.in_degree_cv
    assert skewed.stats.max_in_degree > 5 * flat.stats.max_in_degree
    assert flat.stats.out_degree_cv == pytest.approx(skewed.stats.out_degree_cv, rel=0.5)


def test_reverse_and_multi() -> None:
    g = load_synthetic("custom,nodes=200,edges=4000,rels=4,reverse=1")
    assert g.num_rels == 4 and g.num_edges() == 4000
    assert sum(r.startswith("rev_") for r in g.etypes) == 2
    dense = "custom,nodes=40,edges=3000,ntypes=1,rels=2,degree_skew=1.5"
    multi = load_synthetic(dense + ",multi=1")
    assert multi.num_edges() == 3000 and _has_duplicate_edges(multi)
    with pytest.raises(SyntheticSpecError, match="multi=1"):
        load_synthetic(dense)  # 3000 edges cannot fit in 2 relations of 40 x 40 distinct pairs


def test_random_graph_corner_cases() -> None:
    g = random_graph(
        {"user": 15_000, "item": 50, "tag": 30},
        relations=[("user", "likes", "item"), ("tag", "on", "item"), ("item", "has", "tag"),
                   ("user", "follows", "user")],
        num_edges=3000, empty_relations=1, isolated_nodes=5, hub_in_degree=12_000, multi=False, seed=4,
    )
    assert g.num_edges(("user", "follows", "user")) == 0  # the last relation is the empty one
    assert g.stats.empty_relations == 1
    assert g.stats.max_in_degree > 10_000  # the hub
    hub = int(g.in_degrees.argmax())
    assert int(g.node_type[hub]) == g.ntype_id("item")
    assert g.stats.isolated_nodes >= 5 * 3
    assert not _has_duplicate_edges(g)
    src_only = random_graph([10, 10, 10], num_relations=6, num_edges=60, source_only_ntypes=1, seed=1)
    no_in = src_only.ntypes[-1]
    assert int(src_only.in_degrees[src_only.node_type == src_only.ntype_id(no_in)].sum()) == 0


@settings(max_examples=30, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=3),
    num_relations=st.integers(0, 5),
    num_edges=st.integers(0, 60),
    multi=st.booleans(),
    reverse=st.booleans(),
    skew=st.sampled_from([0.0, 0.7, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_random_graph_properties(
    counts: list[int], num_relations: int, num_edges: int, multi: bool, reverse: bool, skew: float, seed: int
) -> None:
    kw = dict(num_edges=num_edges, multi=multi, reverse=reverse, degree_skew=skew, src_skew=skew, seed=seed)
    g = random_graph(counts, num_relations, **kw)
    assert g.content_hash == random_graph(counts, num_relations, **kw).content_hash
    assert g.num_rels == num_relations * (2 if reverse else 1)
    assert g.num_edges() <= num_edges * (2 if reverse else 1)
    if multi and num_relations and all(counts):
        assert g.num_edges() == num_edges * (2 if reverse else 1)
    if not multi:
        assert not _has_duplicate_edges(g)


def test_random_graph_errors() -> None:
    with pytest.raises(ValueError, match="usable source nodes"):
        random_graph([5, 5], 1, 10, hub_in_degree=100, multi=False)
    with pytest.raises(ValueError, match="empty_relations"):
        random_graph([5], 2, 10, empty_relations=3)
    with pytest.raises(ValueError, match="reverse=False"):
        random_graph([5, 5], 2, 10, source_only_ntypes=1, reverse=True)
    with pytest.raises(ValueError, match="num_nodes"):
        random_graph({"a": -1})
    with pytest.raises(ValueError, match=r"node types \['c'\]"):
        random_graph({"a": 2, "b": 2}, relations=[("a", "r", "c")])
    with pytest.raises(ValueError, match="repeat"):
        random_graph({"a": 2}, relations=[("a", "r", "a"), ("a", "r", "a")])


# --------------------------------------------------------------------------------- spec errors


@pytest.mark.parametrize(
    "spec, match",
    [
        ("", "must start with a preset, one of: aifb, mutag, bgs, am, ogbn-mag, custom"),
        ("aifbb", "unknown synthetic preset 'aifbb'.*presets: aifb, mutag"),
        ("aifb,scael=2", "unknown field 'scael'; valid fields for 'aifb': .*scale"),
        ("aifb,nodes=5", "unknown field 'nodes' \\(only 'custom' takes it"),
        ("aifb,scale=0", "field 'scale' must be a number > 0"),
        ("aifb,scale=abc", "field 'scale' must be a number > 0.*got 'abc'"),
        ("aifb,seed=1.5", "field 'seed' must be an integer >= 0"),
        ("aifb,reverse=maybe", "field 'reverse' must be 0/1"),
        ("aifb,seed=1,seed=2", "field 'seed' given twice"),
        ("aifb,scale", "expected key=value, got 'scale'"),
        ("seed=3", "must start with a preset"),
        ("custom,nodes=2,ntypes=3", "nodes=2 must be >= ntypes=3"),
        ("custom,edges=11,reverse=1", "must be even"),
        ("custom,rels=0,edges=5", "need rels >= 1"),
    ],
)
def test_spec_errors_name_the_field(spec: str, match: str) -> None:
    with pytest.raises(SyntheticSpecError, match=match) as info:
        load_synthetic(spec)
    assert isinstance(info.value, ValueError) and isinstance(info.value, DatasetError)


def test_spec_accepts_loose_forms() -> None:
    g = load_synthetic(" Custom , nodes = 1e3 , edges=5000 , reverse=true ")
    assert (g.num_nodes(), g.num_edges()) == (1000, 5000)


def test_describe_presets() -> None:
    lines = describe_presets()
    assert all(any(line.startswith(p) for line in lines) for p in PRESETS)
    assert any("21,111,007" in line for line in lines)


def test_edges_keep_a_random_order() -> None:
    # Kernels and layouts must not rely on input order: generated edges are not pre-sorted.
    src, _ = load_synthetic("mutag").edges(("bond", "inBond", "d"))
    assert not bool((src[1:] >= src[:-1]).all())
    assert np.unique(src.numpy()).size > 1
