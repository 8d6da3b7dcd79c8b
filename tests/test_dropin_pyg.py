"""``rgtune.nn.pyg``: PyG's conv modules by an import line. Their state dicts load both ways and give PyG's
outputs and gradients (PyG is the oracle: it is installed in CI, never skipped), the relations are the
caller's integers, and what PyG's modules take that rgtune does not is an error naming it."""

from __future__ import annotations

import warnings

import pytest
import torch

from rgtune.bench.baselines import _pyg
from rgtune.nn.pyg import RGCNConv
from rgtune.runtime._lookup import TunedScheduleWarning

from _dropin import assert_same_as_library

N, E, R = 60, 400, 5


def _inputs(seed: int = 0, relations: int = R) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N, (2, E), generator=gen)
    edge_type = torch.randint(0, relations, (E,), generator=gen)
    return torch.randn(N, 8, generator=gen), edge_index, edge_type


def _conv(*args, **kwargs) -> RGCNConv:
    return RGCNConv(*args, db=None, **kwargs)


def _quiet(conv, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)  # no database: the default schedule
        return conv(*args)


@pytest.mark.parametrize("options", [{}, {"num_bases": 3}, {"num_blocks": 4}, {"aggr": "add"}],
                         ids=["plain", "bases", "blocks", "sum"])
def test_rgcnconv_equals_pyg_both_ways(options):
    theirs_cls = _pyg().nn.RGCNConv
    torch.manual_seed(0)
    theirs = theirs_cls(8, 16, R, **options)
    ours = _conv(8, 16, R, **options)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())  # PyG's names ...
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict())  # ... and shapes: PyG -> rgtune
    x, edge_index, edge_type = _inputs()
    assert_same_as_library(theirs, ours, lambda v: theirs(v, edge_index, edge_type),
                           lambda v: _quiet(ours, v, edge_index, edge_type), x)
    # rgtune -> PyG: a fresh PyG module with our (changed) weights gives our outputs
    with torch.no_grad():
        ours.root.mul_(2.0)
    back = theirs_cls(8, 16, R, **options)
    back.load_state_dict(ours.state_dict())
    assert torch.allclose(_quiet(ours, x, edge_index, edge_type), back(x, edge_index, edge_type), rtol=1e-4, atol=1e-5)


def test_relations_are_the_callers_integers_even_when_some_have_no_edges():
    theirs = _pyg().nn.RGCNConv(8, 16, 12)
    ours = _conv(8, 16, 12)  # 12 relations: names 00 .. 11, never sorted as 0, 1, 10, 11, 2 ...
    ours.load_state_dict(theirs.state_dict())
    x, edge_index, _ = _inputs()
    edge_type = torch.tensor([11, 10, 2, 0])[torch.arange(E) % 4]  # relations 1, 3-9 have no edges
    assert torch.allclose(_quiet(ours, x, edge_index, edge_type), theirs(x, edge_index, edge_type), rtol=1e-4,
                          atol=1e-5)


def test_pygs_to_homogeneous_numbering_gives_pygs_outputs():
    """The issue's case: a HeteroData in PyG's own metadata order (not sorted), to_homogeneous()'s edge types,
    PyG's weights loaded as they are: PyG's outputs (no relation re-sorted behind the caller's back)."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import RGCNConv as PyGRGCNConv

    gen = torch.Generator().manual_seed(3)
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(20, 8, generator=gen), torch.randn(12, 8, generator=gen)
    for rel, (s, d) in {("author", "writes", "paper"): (12, 20), ("paper", "rev_writes", "author"): (20, 12),
                        ("paper", "cites", "paper"): (20, 20)}.items():  # PyG's order, not a sorted one
        data[rel].edge_index = torch.stack([torch.randint(0, s, (50,), generator=gen),
                                            torch.randint(0, d, (50,), generator=gen)])
    homo = data.to_homogeneous()
    torch.manual_seed(0)
    theirs = PyGRGCNConv(8, 8, num_relations=3)
    ours = _conv(8, 8, num_relations=3)
    ours.load_state_dict(theirs.state_dict())
    assert_same_as_library(theirs, ours, lambda v: theirs(v, homo.edge_index, homo.edge_type),
                           lambda v: _quiet(ours, v, homo.edge_index, homo.edge_type), homo.x)


def test_a_new_edge_set_gets_its_graph_and_the_same_one_is_built_once():
    ours = _conv(8, 16, R)
    x, edge_index, edge_type = _inputs()
    _quiet(ours, x, edge_index, edge_type)
    graph = ours._graph(edge_index, edge_type, N)
    _quiet(ours, x, edge_index, edge_type)
    assert ours._graph(edge_index, edge_type, N) is graph  # the same tensors: no rebuild
    sub = edge_index[:, ::2], edge_type[::2]
    theirs = _pyg().nn.RGCNConv(8, 16, R)
    theirs.load_state_dict(ours.state_dict())
    assert torch.allclose(_quiet(ours, x, *sub), theirs(x, *sub), rtol=1e-4, atol=1e-5)
    edge_type[0] = (edge_type[0] + 1) % R  # changed in place: a new graph
    assert ours._graph(edge_index, edge_type, N) is not graph


def test_the_schedule_is_looked_up_once_with_one_warning(tmp_path):
    conv = RGCNConv(8, 16, R, db=str(tmp_path / "missing.db"))
    x, edge_index, edge_type = _inputs()
    with pytest.warns(TunedScheduleWarning, match="no tuned training schedule for rgcn") as caught:
        conv(x, edge_index, edge_type)
        conv(x, edge_index, edge_type)
    assert len(caught) == 1 and conv._layer.provenance["source"] == "default"


@pytest.mark.parametrize("make, says", [
    (lambda: _conv(8, 16, R, aggr="max"), "aggr='max' is not supported"),
    (lambda: _conv(8, 16, R, num_bases=2, num_blocks=2), "exclude each other"),
])
def test_what_rgtune_does_not_compute_is_refused_when_made(make, says):
    with pytest.raises(ValueError, match=says):
        make()


def test_bad_calls_name_what_is_wrong():
    conv = _conv(8, 16, R)
    x, edge_index, edge_type = _inputs()
    with pytest.raises(ValueError, match="x has 8 rows but edge_index refers to node"):
        conv(x[:8], edge_index, edge_type)
    with pytest.raises(ValueError, match="edge_type has values up to 5, but num_relations is 5"):
        _quiet(conv, x, edge_index, edge_type + 1)
    with pytest.raises(ValueError, match="edge_type is needed"):
        conv(x, edge_index)


def test_a_copy_and_a_pickle_keep_the_weights_and_rebuild_the_kernels(tmp_path):
    import copy

    conv = _conv(8, 16, R)
    x, edge_index, edge_type = _inputs()
    want = _quiet(conv, x, edge_index, edge_type)
    for other in (copy.deepcopy(conv), _saved_and_loaded(conv, tmp_path)):
        assert other._layer is None and torch.equal(other.weight, conv.weight)
        assert torch.allclose(_quiet(other, x, edge_index, edge_type), want)


def _saved_and_loaded(module, tmp_path):
    torch.save(module, tmp_path / "conv.pt")
    return torch.load(tmp_path / "conv.pt", weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("script, epochs", [("pyg_rgcn_aifb.py", 4), ("pyg_hgt_aifb.py", 2)])
def test_pygs_aifb_script_trains_the_same_with_rgtunes_import(tmp_path, script, epochs):
    """docs/examples/pyg_*_aifb.py, PyG's entity classification with the import line as the only change: the
    same losses from the same initial weights (experiments/dropin_pyg.py times them)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / script
    losses = {}
    for impl in ("pyg", "rgtune"):
        out = tmp_path / f"{impl}.json"
        subprocess.run([sys.executable, str(path), "--impl", impl, "--epochs", str(epochs), "--init",
                        str(tmp_path / "init.pt"), "--json", str(out)], check=True, capture_output=True, cwd=tmp_path,
                       timeout=600)
        losses[impl] = json.loads(out.read_text())["losses"]
    assert len(losses["pyg"]) == epochs
    for a, b in zip(losses["pyg"], losses["rgtune"]):
        assert abs(a - b) <= 1e-4 * abs(a), losses


# ------------------------------------------------------------------ HGTConv
def _hetero(seed: int = 0):
    from rgtune.data.synthetic import random_graph

    g = random_graph((30, 40, 20), num_relations=4, num_edges=300, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(g.num_nodes(t), 8, generator=gen) for t in g.ntypes}
    edges = {c: torch.stack(g.edges(c)) for c in g.canonical_etypes}
    return g, x, edges


@pytest.mark.parametrize("order", ["as built", "reversed"])
def test_hgtconv_equals_pyg_both_ways_whatever_the_metadata_order(order):
    from rgtune.nn.pyg import HGTConv

    g, x, edges = _hetero()
    ntypes, etypes = list(g.ntypes), list(g.canonical_etypes)
    if order == "reversed":  # PyG numbers types in the caller's order: mapped by name, never by position
        ntypes, etypes = ntypes[::-1], etypes[::-1]
        edges = dict(reversed(list(edges.items())))
    torch.manual_seed(0)
    theirs = _pyg().nn.HGTConv(8, 8, (ntypes, etypes), heads=2)
    ours = HGTConv(8, 8, (ntypes, etypes), heads=2, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():  # PyG's skip and p_rel start at one: other values check the mapping
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    xa = {t: v.clone().requires_grad_() for t, v in x.items()}
    xb = {t: v.clone().requires_grad_() for t, v in x.items()}
    want, got = theirs(xa, edges), _quiet(ours, xb, edges)
    for t in g.ntypes:
        if want.get(t) is not None:
            assert torch.allclose(got[t], want[t], rtol=1e-4, atol=1e-5), t
    loss_w = sum((v * (i + 1)).sum() for i, v in enumerate(want[t] for t in g.ntypes if want.get(t) is not None))
    loss_g = sum((v * (i + 1)).sum() for i, v in enumerate(got[t] for t in g.ntypes if want.get(t) is not None))
    loss_w.backward()
    loss_g.backward()
    for t in g.ntypes:
        assert torch.allclose(xb[t].grad, xa[t].grad, rtol=1e-4, atol=1e-5), t
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-5), name
    back = _pyg().nn.HGTConv(8, 8, (ntypes, etypes), heads=2)
    back.load_state_dict(ours.state_dict())  # rgtune -> PyG
    assert all(torch.allclose(back(x, edges)[t], _quiet(ours, x, edges)[t], rtol=1e-4, atol=1e-5)
               for t in g.ntypes if want.get(t) is not None)


def test_hgtconv_refuses_what_it_does_not_compute():
    from rgtune.nn.pyg import HGTConv

    g, x, edges = _hetero()
    with pytest.raises(ValueError, match="in_channels=0"):  # lazy (-1) and per-type sizes: test_dropin_pyg_hgt.py
        HGTConv(0, 8, (g.ntypes, g.canonical_etypes), heads=2, db=None)
    conv = HGTConv(8, 8, (g.ntypes, g.canonical_etypes), heads=2, db=None)
    with pytest.raises(ValueError, match="is not in metadata"):
        _quiet(conv, x, {("n0", "nope", "n1"): torch.zeros(2, 0, dtype=torch.long)})


# ------------------------------------------------------------------ FiLMConv
def test_filmconv_equals_pyg_both_ways():
    from rgtune.nn.pyg import FiLMConv

    torch.manual_seed(0)
    theirs = _pyg().nn.FiLMConv(8, 16, R)
    ours = FiLMConv(8, 16, R, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict())
    x, edge_index, edge_type = _inputs()
    assert_same_as_library(theirs, ours, lambda v: theirs(v, edge_index, edge_type),
                           lambda v: _quiet(ours, v, edge_index, edge_type), x)
    with pytest.raises(ValueError, match="aggr='add' is not supported"):
        FiLMConv(8, 16, R, aggr="add", db=None)


# ------------------------------------------------------------------ RGATConv
@pytest.mark.parametrize("mechanism, heads, concat", [("across-relation", 1, True), ("within-relation", 1, True),
                                                      ("across-relation", 3, True), ("within-relation", 2, False)])
def test_rgatconv_equals_pyg_both_ways(mechanism, heads, concat):
    from rgtune.nn.pyg import RGATConv

    torch.manual_seed(0)
    theirs = _pyg().nn.RGATConv(8, 16, R, attention_mechanism=mechanism, heads=heads, concat=concat)
    ours = RGATConv(8, 16, R, attention_mechanism=mechanism, heads=heads, concat=concat, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        theirs.bias.uniform_(-0.5, 0.5)  # PyG starts it at zero: other values check that it is added
    ours.load_state_dict(theirs.state_dict())
    x, edge_index, edge_type = _inputs()
    want = assert_same_as_library(theirs, ours, lambda v: theirs(v, edge_index, edge_type),
                                  lambda v: _quiet(ours, v, edge_index, edge_type), x)
    assert want.shape == (N, 16 * heads if concat else 16)
    back = _pyg().nn.RGATConv(8, 16, R, attention_mechanism=mechanism, heads=heads, concat=concat)
    back.load_state_dict(ours.state_dict())  # rgtune -> PyG
    assert torch.allclose(back(x, edge_index, edge_type), want, rtol=1e-4, atol=1e-5)


def test_rgatconv_refuses_other_modes():
    from rgtune.nn.pyg import RGATConv

    with pytest.raises(ValueError, match="heads=0; a positive int"):
        RGATConv(8, 16, R, heads=0, db=None)
    with pytest.raises(ValueError, match="dim=2 is not supported"):
        RGATConv(8, 16, R, attention_mode="multiplicative-self-attention", dim=2, db=None)
