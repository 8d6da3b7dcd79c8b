"""Round trips between HeteroGraph and DGL / PyG, and the homogeneous view RGCNConv takes."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
import torch

from rgtune.data.graph import HeteroGraph, NodeTask
from rgtune.data.interop import from_dgl, from_pyg, to_dgl, to_pyg, to_pyg_homogeneous
from rgtune.data.synthetic import load_synthetic, random_graph


@pytest.fixture(scope="module")
def dgl() -> ModuleType:
    return pytest.importorskip("dgl", reason="DGL is not installed (pip install 'rgtune[dgl]')")


@pytest.fixture(scope="module")
def pyg() -> ModuleType:
    return pytest.importorskip("torch_geometric", reason="PyG is not installed (pip install 'rgtune[pyg]')")


def _graphs() -> list[HeteroGraph]:
    """A preset look-alike, corner cases (empty relation, isolated nodes, an empty node type,
    repeated relation names, multi-edges), and a graph with features and a task."""
    corner = random_graph({"a": 6, "b": 0, "c": 9}, relations=[("a", "r", "c"), ("c", "r", "a"), ("c", "s", "c")],
                          num_edges=40, empty_relations=1, isolated_nodes=2, seed=3)
    task = NodeTask("paper", 3, torch.tensor([4, 0, 2]), torch.tensor([2, 0, 1]), torch.tensor([5]), torch.tensor([1]))
    featured = HeteroGraph(
        {"paper": 6, "author": 4},
        {("author", "writes", "paper"): ([0, 1, 3, 3], [5, 0, 2, 2]), ("paper", "cites", "paper"): ([1], [4])},
        features={"paper": torch.randn(6, 3), "author": torch.randn(4, 3)},
        task=task,
    )
    return [load_synthetic("aifb,scale=0.3"), corner, featured]


def _same_task(a: NodeTask | None, b: NodeTask | None, ordered: bool) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert (a.category, a.num_classes) == (b.category, b.num_classes)
    for idx_a, y_a, idx_b, y_b in ((a.train_idx, a.train_labels, b.train_idx, b.train_labels),
                                   (a.test_idx, a.test_labels, b.test_idx, b.test_labels)):
        if not ordered:  # masks carry no order: compare (index, label) sets
            idx_a, perm = idx_a.sort()
            y_a = y_a[perm]
        assert idx_a.tolist() == idx_b.tolist() and y_a.tolist() == y_b.tolist()


def _same_graph(a: HeteroGraph, b: HeteroGraph) -> None:
    assert b.content_hash == a.content_hash
    assert b.ntypes == a.ntypes and b.canonical_etypes == a.canonical_etypes
    assert set(b.features) == set(a.features)
    for t, x in a.features.items():
        assert torch.equal(b.features[t], x)


# ------------------------------------------------------------------------------------ DGL


@pytest.mark.dgl
@pytest.mark.parametrize("index", range(3))
def test_dgl_round_trip(dgl: ModuleType, index: int) -> None:
    g = _graphs()[index]
    d = to_dgl(g)
    assert sorted(d.ntypes) == g.ntypes and sorted(d.canonical_etypes) == g.canonical_etypes
    assert d.num_nodes() == g.num_nodes() and d.num_edges() == g.num_edges()
    for c in g.canonical_etypes:
        s, t = d.edges(etype=c, order="eid")
        assert torch.equal(s, g.edges(c)[0]) and torch.equal(t, g.edges(c)[1])
    back = from_dgl(d, name=g.name, num_classes=g.task.num_classes if g.task else None)
    _same_graph(g, back)
    _same_task(g.task, back.task, ordered=False)


@pytest.mark.dgl
def test_dgl_task_layout_matches_dgl_rdf_datasets(dgl: ModuleType) -> None:
    g = _graphs()[2]
    data = to_dgl(g).nodes["paper"].data
    assert data["train_mask"].tolist() == [True, False, True, False, True, False]
    assert data["label"].tolist() == [0, -1, 1, -1, 2, 1]  # -1: unlabeled, as DGL's RDF datasets
    assert torch.equal(to_dgl(g).nodes["author"].data["feat"], g.features["author"])


@pytest.mark.dgl
def test_from_dgl_homogeneous_graph(dgl: ModuleType) -> None:
    d = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=4)
    g = from_dgl(d, name="ring")
    assert g.ntypes == ["_N"] and g.canonical_etypes == [("_N", "_E", "_N")] and g.num_nodes() == 4
    assert g.task is None and g.name == "ring"


@pytest.mark.dgl
def test_to_dgl_needs_an_edge_type(dgl: ModuleType) -> None:
    with pytest.raises(ValueError, match="no edge types"):
        to_dgl(HeteroGraph({"a": 3}, {}))


# ------------------------------------------------------------------------------------ PyG


@pytest.mark.pyg
@pytest.mark.parametrize("index", range(3))
def test_pyg_round_trip(pyg: ModuleType, index: int) -> None:
    g = _graphs()[index]
    data = to_pyg(g)
    assert sorted(data.node_types) == g.ntypes and sorted(data.edge_types) == g.canonical_etypes
    for c in g.canonical_etypes:
        assert torch.equal(data[c].edge_index, torch.stack(g.edges(c)))
    for t in g.ntypes:
        assert data[t].num_nodes == g.num_nodes(t)
    back = from_pyg(data, name=g.name)
    _same_graph(g, back)
    _same_task(g.task, back.task, ordered=True)


@pytest.mark.pyg
def test_from_pyg_infers_missing_node_counts(pyg: ModuleType) -> None:
    from torch_geometric.data import HeteroData

    data = HeteroData()
    data["a"].x = torch.randn(3, 2)
    data["a", "to", "b"].edge_index = torch.tensor([[0, 2], [4, 1]])  # 'b' has no store of its own
    g = from_pyg(data)
    assert (g.num_nodes("a"), g.num_nodes("b")) == (3, 5) and torch.equal(g.features["a"], data["a"].x)


# ------------------------------------------------------------------------- homogeneous view


@pytest.mark.parametrize("index", range(3))
def test_pyg_homogeneous_is_our_global_numbering(index: int) -> None:
    g = _graphs()[index]
    edge_index, edge_type, n = to_pyg_homogeneous(g)
    assert edge_index.shape == (2, g.num_edges()) and edge_index.dtype == torch.int64
    assert torch.equal(edge_index[0], g.src) and torch.equal(edge_index[1], g.dst)
    assert torch.equal(edge_type, g.etype) and n == g.num_nodes()
    for r, c in enumerate(g.canonical_etypes):  # edge_type r is relation canonical_etypes[r]
        s, d = g.edges(c)
        mask = edge_type == r
        assert torch.equal(edge_index[0, mask], g.to_global(c[0], s))
        assert torch.equal(edge_index[1, mask], g.to_global(c[2], d))


@pytest.mark.pyg
def test_rgcnconv_accepts_the_homogeneous_view(pyg: ModuleType) -> None:
    from torch_geometric.nn import RGCNConv

    g = _graphs()[0]
    edge_index, edge_type, n = to_pyg_homogeneous(g)
    conv = RGCNConv(8, 4, num_relations=g.num_rels)
    assert conv(torch.randn(n, 8), edge_index, edge_type).shape == (n, 4)


# --------------------------------------------------------------------------- missing library


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the next import of that name raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "dgl", None)
    monkeypatch.setitem(sys.modules, "torch_geometric.data", None)
    g = _graphs()[1]
    with pytest.raises(ImportError, match=r"pip install 'rgtune\[dgl\]'"):
        to_dgl(g)
    with pytest.raises(ImportError, match=r"pip install 'rgtune\[pyg\]'"):
        to_pyg(g)
