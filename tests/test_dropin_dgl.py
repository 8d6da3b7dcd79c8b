"""``rgtune.nn.dgl``: DGL's ``RelGraphConv`` by an import line. Its state dict loads both ways and gives DGL's
outputs and gradients (DGL is the oracle, installed in CI), with ``norm=None`` (a sum) and with DGL's right
normalization per relation (a mean); any other ``norm`` and what rgtune does not compute are errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from rgtune.nn.dgl import HGTConv, RelGraphConv
from rgtune.runtime._lookup import TunedScheduleWarning

from _dropin import assert_same_as_library

N, E, R = 50, 300, 4


def _graph(seed: int = 0):
    import dgl

    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, N, (E,), generator=gen), torch.randint(0, N, (E,), generator=gen)
    etypes = torch.randint(0, R, (E,), generator=gen)
    norm_key = etypes * N + dst
    norm = (1.0 / torch.bincount(norm_key, minlength=R * N)[norm_key].float()).unsqueeze(1)
    return dgl.graph((src, dst), num_nodes=N), torch.randn(N, 8, generator=gen), etypes, norm


def _quiet(conv, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        return conv(*args, **kw)


@pytest.mark.parametrize("regularizer, bases", [(None, None), ("basis", 2), ("bdd", 4)])
@pytest.mark.parametrize("normalized", [False, True], ids=["sum", "mean"])
def test_relgraphconv_equals_dgl_both_ways(regularizer, bases, normalized):
    from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv

    g, x, etypes, norm = _graph()
    norm = norm if normalized else None
    torch.manual_seed(0)
    theirs = DGLRelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu)
    ours = RelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        theirs.h_bias.uniform_(-0.5, 0.5)  # DGL starts it at zero: other values check the mapping
    ours.load_state_dict(theirs.state_dict())
    assert_same_as_library(theirs, ours, lambda v: theirs(g, v, etypes, norm), lambda v: _quiet(ours, g, v, etypes, norm),
                           x)
    back = DGLRelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu)
    back.load_state_dict(ours.state_dict())  # rgtune -> DGL
    assert torch.allclose(back(g, x, etypes, norm), _quiet(ours, g, x, etypes, norm), rtol=1e-4, atol=1e-5)


def test_a_norm_that_requires_grad_is_refused():
    # any other norm, layer_norm, self_loop=False and bias=False: tests/test_dropin_dgl_forms.py
    g, x, etypes, norm = _graph()
    conv = RelGraphConv(8, 8, R, db=None)
    with pytest.raises(ValueError, match="norm requires grad"):
        _quiet(conv, g, x, etypes, (norm * 2).requires_grad_())


def _block(seed: int = 1):
    """A sampled block of ``_graph()`` (fan-out 5, 12 seeds, DGL's sampler and ``to_block``) with its
    edges' types, each relation's mean norm in the block, and its source nodes' features."""
    import dgl

    g, x, etypes, _ = _graph()
    torch.manual_seed(seed)
    seeds = torch.randperm(N)[:12]
    frontier = dgl.sampling.sample_neighbors(g, seeds, 5)
    block = dgl.to_block(frontier, seeds)
    et = etypes[frontier.edata[dgl.EID][block.edata[dgl.EID]]]  # the block's edges are the frontier's
    src, dst = block.edges()
    key = et * block.num_dst_nodes() + dst
    norm = (1.0 / torch.bincount(key, minlength=R * block.num_dst_nodes())[key].float()).unsqueeze(1)
    return block, x[block.srcdata[dgl.NID]], et, norm


@pytest.mark.parametrize("normalized", [False, True], ids=["sum", "mean"])
def test_a_block_computes_the_destinations_rows_as_dgl_does(normalized):
    from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv

    block, x, etypes, norm = _block()
    assert block.num_dst_nodes() < block.num_src_nodes()  # the sources outnumber the destinations
    norm = norm if normalized else None
    torch.manual_seed(0)
    theirs = DGLRelGraphConv(8, 8, R, "basis", 2)
    ours = RelGraphConv(8, 8, R, "basis", 2, db=None)
    ours.load_state_dict(theirs.state_dict())
    want = assert_same_as_library(theirs, ours, lambda v: theirs(block, v, etypes, norm),
                                  lambda v: _quiet(ours, block, v, etypes, norm), x)
    assert want.shape == (block.num_dst_nodes(), 8)
    # the kernels ran the mini-batch program on the block: destinations' rows only
    assert ours._layer._last_batch is not None and ours._layer._last_batch[0].num_dst_nodes == block.num_dst_nodes()
    # the next step's block: no new layer, no new compile
    layer = ours._layer
    block2, x2, etypes2, norm2 = _block(seed=2)
    got = _quiet(ours, block2, x2, etypes2, norm2 if normalized else None)
    assert ours._layer is layer
    assert torch.allclose(got, theirs(block2, x2, etypes2, norm2 if normalized else None), rtol=1e-4, atol=1e-5)


def test_a_block_whose_destinations_are_not_its_first_sources_is_refused():
    import dgl

    src, dst = torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1])
    block = dgl.create_block((src, dst), num_src_nodes=3, num_dst_nodes=2)
    block.srcdata[dgl.NID] = torch.tensor([7, 8, 9])
    block.dstdata[dgl.NID] = torch.tensor([8, 7])
    conv = RelGraphConv(8, 8, R, db=None)
    with pytest.raises(ValueError, match="not its first source nodes"):
        _quiet(conv, block, torch.randn(3, 8), torch.tensor([0, 1, 2]))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["dgl_rgcn_aifb.py", "dgl_hgt_aifb.py", "dgl_gat_aifb.py"])
def test_dgls_aifb_script_trains_the_same_with_rgtunes_import(tmp_path, script):
    """docs/examples/dgl_rgcn_aifb.py, DGL's entity classification (basis regularizer, right normalization per
    relation), dgl_hgt_aifb.py (HGTConv with DGL's dropout) and dgl_gat_aifb.py (HeteroGraphConv of GATConv),
    with the import line as the only change: the same losses from the same initial weights (and dropout masks)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / script
    losses = {}
    for impl in ("dgl", "rgtune"):
        out = tmp_path / f"{impl}.json"
        subprocess.run([sys.executable, str(path), "--impl", impl, "--epochs", "4", "--init", str(tmp_path / "init.pt"),
                        "--json", str(out)], check=True, capture_output=True, cwd=tmp_path, timeout=600)
        losses[impl] = json.loads(out.read_text())["losses"]
    assert len(losses["dgl"]) == 4
    for a, b in zip(losses["dgl"], losses["rgtune"]):
        assert abs(a - b) <= 1e-4 * abs(a), losses


T, ET = 3, 4  # node and edge types of the typed graphs below


def _typed_graph(seed: int = 0):
    """A DGL graph in the typed homogeneous form (``dgl.to_homogeneous`` of a heterograph: each edge type joins
    one pair of node types), its features, node and edge types."""
    import dgl

    gen = torch.Generator().manual_seed(seed)
    ntype = torch.randint(0, T, (N,), generator=gen)
    pairs = [(0, 1), (1, 2), (2, 2), (1, 0)]  # edge type e joins node types pairs[e]
    src, dst, etypes = [], [], []
    for e, (a, b) in enumerate(pairs):
        sa, sb = (ntype == a).nonzero().flatten(), (ntype == b).nonzero().flatten()
        n = 60
        src.append(sa[torch.randint(0, sa.numel(), (n,), generator=gen)])
        dst.append(sb[torch.randint(0, sb.numel(), (n,), generator=gen)])
        etypes.append(torch.full((n,), e))
    perm = torch.randperm(4 * 60, generator=gen)  # edges in no particular order
    src, dst, etypes = torch.cat(src)[perm], torch.cat(dst)[perm], torch.cat(etypes)[perm]
    return dgl.graph((src, dst), num_nodes=N), torch.randn(N, 8, generator=gen), ntype, etypes


@pytest.mark.parametrize("in_size, heads, use_norm", [(8, 2, False), (6, 2, True)], ids=["same-size", "projected-norm"])
def test_hgtconv_equals_dgl_both_ways(in_size, heads, use_norm):
    from dgl.nn.pytorch import HGTConv as DGLHGTConv

    g, x, ntype, etypes = _typed_graph()
    x = x[:, :in_size].contiguous()
    torch.manual_seed(0)
    theirs = DGLHGTConv(in_size, 8 // heads, heads, T, ET, dropout=0.0, use_norm=use_norm)
    ours = HGTConv(in_size, 8 // heads, heads, T, ET, dropout=0.0, use_norm=use_norm, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():  # DGL starts them at one: other values check the mapping per type
        for p in (theirs.skip, *theirs.relation_pri):
            p.uniform_(0.5, 1.5)
    ours.load_state_dict(theirs.state_dict())
    assert_same_as_library(theirs, ours, lambda v: theirs(g, v, ntype, etypes), lambda v: _quiet(ours, g, v, ntype, etypes),
                           x)
    back = DGLHGTConv(in_size, 8 // heads, heads, T, ET, dropout=0.0, use_norm=use_norm)
    back.load_state_dict(ours.state_dict())  # rgtune -> DGL
    assert torch.allclose(back(g, x, ntype, etypes), _quiet(ours, g, x, ntype, etypes), rtol=1e-4, atol=1e-5)


def test_hgtconv_dropout_is_dgls_and_a_block_computes_its_destinations():
    import dgl
    from dgl.nn.pytorch import HGTConv as DGLHGTConv

    g, x, ntype, etypes = _typed_graph()
    torch.manual_seed(0)
    theirs = DGLHGTConv(8, 4, 2, T, ET, dropout=0.5)
    ours = HGTConv(8, 4, 2, T, ET, dropout=0.5, db=None)
    ours.load_state_dict(theirs.state_dict())
    for m in (theirs, ours):  # the same dropout mask: the same draws in the same order (making the layer at
        m.train()             # the first call draws none of the caller's)
    torch.manual_seed(1)
    want = theirs(g, x, ntype, etypes)
    torch.manual_seed(1)
    got = _quiet(ours, g, x, ntype, etypes)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    theirs.eval(), ours.eval()
    seeds = torch.arange(0, N, 3)
    frontier = dgl.sampling.sample_neighbors(g, seeds, 4)
    block = dgl.to_block(frontier, seeds)
    src_ids = block.srcdata[dgl.NID]
    bt, bx, be = ntype[src_ids], x[src_ids], etypes[frontier.edata[dgl.EID][block.edata[dgl.EID]]]
    assert block.num_dst_nodes() < block.num_src_nodes()
    want = assert_same_as_library(theirs, ours, lambda v: theirs(block, v, bt, be), lambda v: _quiet(ours, block, v, bt, be),
                                  bx)
    assert want.shape == (seeds.numel(), 8)
    assert ours._layer._last_batch is not None  # ran the mini-batch program


def test_hgtconv_refuses_a_relation_the_first_graph_did_not_have():
    g, x, ntype, etypes = _typed_graph()
    conv = HGTConv(8, 4, 2, T, ET, dropout=0.0, db=None)
    _quiet(conv, g, x, ntype, etypes)
    import dgl

    other = dgl.graph((torch.tensor([0]), torch.tensor([1])), num_nodes=N)
    nt = ntype.clone()
    nt[0], nt[1] = 2, 0  # edge type 0 from node type 2 to 0: not a relation of the first graph
    with pytest.raises(ValueError, match="relations are fixed by the first graph"):
        _quiet(conv, other, x, nt, torch.tensor([0]))


def _heterograph(seed: int = 0):
    """A DGL heterograph of two node types and three relations (one keyed by its canonical type below), one
    'paper' without in-edges of 'cites' (a zero in-degree), and its features."""
    import dgl

    gen = torch.Generator().manual_seed(seed)
    n = {"author": 15, "paper": 25}
    data = {("author", "writes", "paper"): (torch.randint(0, 15, (60,), generator=gen), torch.randint(0, 25, (60,), generator=gen)),
            ("paper", "cites", "paper"): (torch.randint(0, 25, (50,), generator=gen), torch.randint(1, 25, (50,), generator=gen)),
            ("paper", "written_by", "author"): (torch.randint(0, 25, (60,), generator=gen), torch.randint(0, 15, (60,), generator=gen))}
    g = dgl.heterograph(data, num_nodes_dict=n)
    return g, {t: torch.randn(k, 8, generator=gen) for t, k in n.items()}


@pytest.mark.parametrize("order", [1, -1], ids=["as-built", "reversed"])
def test_heterographconv_of_gatconvs_equals_dgl_both_ways(order):
    import dgl.nn.pytorch as dglnn

    from rgtune.nn.dgl import GATConv, HeteroGraphConv

    g, x = _heterograph()
    keys = ["writes", ("paper", "cites", "paper"), "written_by"][::order]  # names and a canonical type, any order
    torch.manual_seed(0)
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in keys}, aggregate="sum")
    ours = HeteroGraphConv({k: GATConv(8, 4, 2) for k in keys}, aggregate="sum", db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():  # DGL starts the bias at zero: other values check it is added per relation
        for mod in theirs.mods.values():
            mod.bias.uniform_(-0.5, 0.5)
    ours.load_state_dict(theirs.state_dict())
    xa = {t: v.clone().requires_grad_() for t, v in x.items()}
    xb = {t: v.clone().requires_grad_() for t, v in x.items()}
    want, got = theirs(g, xa), _quiet(ours, g, xb)
    assert set(got) == set(want) == {"author", "paper"}
    grads = {t: torch.randn_like(v) for t, v in want.items()}
    sum((want[t] * grads[t]).sum() for t in want).backward()
    sum((got[t] * grads[t]).sum() for t in got).backward()
    for t in want:
        assert got[t].shape == want[t].shape == (g.num_nodes(t), 2, 4)
        assert torch.allclose(got[t], want[t], rtol=1e-4, atol=1e-5), t
        assert torch.allclose(xb[t].grad, xa[t].grad, rtol=1e-4, atol=1e-5), t
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-5), name
    back = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in keys})
    back.load_state_dict(ours.state_dict())  # rgtune -> DGL
    out = back(g, x)
    assert all(torch.allclose(out[t], _quiet(ours, g, x)[t], rtol=1e-4, atol=1e-5) for t in out)


def test_heterographconv_refuses_what_rgat_does_not_compute():
    from rgtune.nn.dgl import GATConv, HeteroGraphConv

    # activation, other aggregates and modules of other sizes are supported (tests/test_dropin_dgl_forms.py)
    with pytest.raises(ValueError, match="attn_drop=0.5 is not supported"):
        GATConv(8, 4, 2, attn_drop=0.5)
    with pytest.raises(ValueError, match="aggregate='median' is not one of DGL's"):
        HeteroGraphConv({"a": GATConv(8, 4, 2)}, aggregate="median", db=None)
    g, x = _heterograph()
    conv = HeteroGraphConv({"writes": GATConv(8, 4, 2), "cites": GATConv(8, 4, 2)}, db=None)
    with pytest.raises(KeyError, match="no module for edge type"):
        _quiet(conv, g, x)


def test_heterographconv_on_a_block_computes_the_destinations_as_dgl_does():
    import dgl
    import dgl.nn.pytorch as dglnn

    from rgtune.nn.dgl import GATConv, HeteroGraphConv

    g, x = _heterograph()
    keys = ["writes", "cites", "written_by"]
    torch.manual_seed(0)
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in keys})
    ours = HeteroGraphConv({k: GATConv(8, 4, 2) for k in keys}, db=None)
    ours.load_state_dict(theirs.state_dict())
    seeds = {"paper": torch.arange(0, 25, 3), "author": torch.arange(0, 15, 4)}
    torch.manual_seed(1)
    block = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 3), seeds)
    src = {t: x[t][block.srcnodes[t].data[dgl.NID]] for t in block.srctypes}
    want, got = theirs(block, src), _quiet(ours, block, src)
    assert set(got) == set(want)
    for t in want:
        assert got[t].shape == want[t].shape == (seeds[t].numel(), 2, 4)
        assert torch.allclose(got[t], want[t], rtol=1e-4, atol=1e-5), t
    assert ours._layer._last_batch is not None  # ran the mini-batch program
    pair = {t: v[:block.num_dst_nodes(t)] for t, v in src.items()}  # DGL's (source, destination) form
    got = _quiet(ours, block, (src, pair))
    assert all(torch.allclose(got[t], want[t], rtol=1e-4, atol=1e-5) for t in want)
