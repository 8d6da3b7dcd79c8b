"""``rgtune.nn.dgl``: DGL's call forms, against DGL's own modules with the same state dict (DGL is the oracle).

``HeteroGraphConv`` is DGL's container: on a block called with DGL's ``(source, destination)`` pair the
destinations' rows (and their gradients) are the second dict's; every aggregate of DGL's (``sum``, ``mean``
on one fused program of rgtune's ``GATConv`` modules; ``max``, ``min``, ``stack`` and a callable on one
rgtune program per relation); any module (DGL's ``GraphConv``, a user's, with ``mod_args``/``mod_kwargs``);
relations skipped as DGL skips them. ``GATConv`` runs alone on a graph of one relation."""

from __future__ import annotations

import warnings

import pytest
import torch

dgl = pytest.importorskip("dgl")  # DGL is the oracle; CI installs it (the [dgl] extra)
import dgl.nn.pytorch as dglnn  # noqa: E402

from rgtune.nn.dgl import GATConv, HeteroGraphConv  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
KEYS = ["writes", ("paper", "cites", "paper"), "written_by"]


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no database: the default schedule, said once
        return fn(*args, **kwargs)


def _heterograph(seed: int = 0):
    """Two node types, three relations; paper 0 has no 'cites' in-edges (a zero in-degree)."""
    gen = torch.Generator().manual_seed(seed)
    n = {"author": 15, "paper": 25}

    def rel(ns, nd, e, low=0):
        return torch.randint(0, ns, (e,), generator=gen), torch.randint(low, nd, (e,), generator=gen)

    g = dgl.heterograph({("author", "writes", "paper"): rel(15, 25, 60), ("paper", "cites", "paper"): rel(25, 25, 50, 1),
                         ("paper", "written_by", "author"): rel(25, 15, 60)}, num_nodes_dict=n)
    return g, {t: torch.randn(k, 8, generator=gen) for t, k in n.items()}


def _pair(theirs, aggregate="sum", make=None):
    """DGL's container of DGL's GATConvs and ours of rgtune's, the same state dict (random biases)."""
    make = make or (lambda: GATConv(8, 4, 2))
    torch.manual_seed(0)
    ours = HeteroGraphConv({k: make() for k in KEYS}, aggregate=aggregate, db=None)
    with torch.no_grad():
        for mod in theirs.mods.values():
            mod.bias.uniform_(-0.5, 0.5)  # DGL starts them at zero: other values check each is added
    ours.load_state_dict(theirs.state_dict())
    return ours


def _compare(theirs, ours, g, inputs, *, leaves):
    """The same outputs (keys and values) and, for one random output gradient, the same gradients of every
    input leaf and parameter."""
    want, got = theirs(g, inputs(leaves[0])), _quiet(ours, g, inputs(leaves[1]))
    assert set(got) == set(want)
    for t in want:
        assert got[t].shape == want[t].shape, t
        assert torch.allclose(got[t], want[t], **TOL), t
    grads = {t: torch.randn_like(v) for t, v in want.items()}
    sum((want[t] * grads[t]).sum() for t in want).backward()
    sum((got[t] * grads[t]).sum() for t in got).backward()
    for a, b in zip(*(list(leaf.values()) for leaf in leaves)):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.allclose(b.grad, a.grad, **TOL)
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, **TOL), name
    return want


def _leaves(tensors):
    return [{k: v.clone().requires_grad_() for k, v in tensors.items()} for _ in range(2)]


def _block(g, x):
    seeds = {"paper": torch.arange(0, 25, 3), "author": torch.arange(0, 15, 4)}
    torch.manual_seed(1)
    block = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 3), seeds)
    src = {t: x[t][block.srcnodes[t].data[dgl.NID]] for t in block.srctypes}
    gen = torch.Generator().manual_seed(2)
    dst = {t: torch.randn(block.num_dst_nodes(t), 8, generator=gen) for t in block.dsttypes}  # not src's rows
    return block, src, dst


@pytest.mark.parametrize("aggregate", ["sum", "mean"])
def test_a_blocks_source_destination_pair_reads_the_destinations_rows(aggregate):
    """DGL's ``(src, dst)`` pair on a block: the destinations' rows are ``dst``'s (not ``src``'s first rows),
    and their gradient goes to ``dst``; on the one fused program."""
    g, x = _heterograph()
    block, src, dst = _block(g, x)
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in KEYS}, aggregate=aggregate)
    ours = _pair(theirs, aggregate)
    assert ours._fused
    flat = {**{("s", t): v for t, v in src.items()}, **{("d", t): v for t, v in dst.items()}}
    split = lambda leaf: ({t: leaf["s", t] for t in src}, {t: leaf["d", t] for t in dst})  # noqa: E731
    leaves = _leaves(flat)
    _compare(theirs, ours, block, split, leaves=leaves)
    assert all(leaves[1]["d", t].grad.abs().sum() > 0 for t in dst)  # the destinations' rows are read
    assert ours._layer._last_batch is not None  # ran the mini-batch program
    # the same pair on the whole graph (every node a destination), and the same tensor twice: DGL's own form
    leaves = _leaves({**{("s", t): v for t, v in x.items()}, **{("d", t): -v for t, v in x.items()}})
    _compare(theirs, ours, g, lambda leaf: ({t: leaf["s", t] for t in x}, {t: leaf["d", t] for t in x}),
             leaves=leaves)
    want = theirs(block, (src, {t: v[:block.num_dst_nodes(t)] for t, v in src.items()}))
    got = _quiet(ours, block, (src, {t: v[:block.num_dst_nodes(t)] for t, v in src.items()}))
    assert all(torch.allclose(got[t], want[t], **TOL) for t in want)


@pytest.mark.parametrize("aggregate", ["mean", "max", "min", "stack", "callable"])
@pytest.mark.parametrize("form", ["graph", "block", "pair"])
def test_every_aggregate_of_rgtune_gatconvs_equals_dgls(aggregate, form):
    """``mean`` on the fused program; ``max``, ``min``, ``stack`` and a callable with one rgtune program
    per relation, combined as DGL combines them."""
    def weighted(outs, dsttype):  # a user's aggregate: DGL passes the outputs in its relation order
        return sum((i + 1) * o for i, o in enumerate(outs))

    agg = weighted if aggregate == "callable" else aggregate
    g, x = _heterograph()
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in KEYS}, aggregate=agg)
    ours = _pair(theirs, agg)
    assert ours._fused == (aggregate == "mean")
    if form == "graph":
        leaves = _leaves(x)
        _compare(theirs, ours, g, lambda leaf: leaf, leaves=leaves)
        return
    block, src, dst = _block(g, x)
    if form == "block":
        _compare(theirs, ours, block, lambda leaf: leaf, leaves=_leaves(src))
        return
    flat = {**{("s", t): v for t, v in src.items()}, **{("d", t): v for t, v in dst.items()}}
    _compare(theirs, ours, block, lambda leaf: ({t: leaf["s", t] for t in src}, {t: leaf["d", t] for t in dst}),
             leaves=_leaves(flat))


def test_gatconv_alone_equals_dgls_on_a_graph_a_pair_and_a_block():
    torch.manual_seed(0)
    theirs = dglnn.GATConv(8, 4, 2, activation=torch.tanh)
    ours = GATConv(8, 4, 2, activation=torch.tanh, db=None)
    with torch.no_grad():
        theirs.bias.uniform_(-0.5, 0.5)
    ours.load_state_dict(theirs.state_dict())
    gen = torch.Generator().manual_seed(3)
    g = dgl.add_self_loop(dgl.graph((torch.randint(0, 30, (120,), generator=gen),
                                     torch.randint(0, 30, (120,), generator=gen)), num_nodes=30))
    x = torch.randn(30, 8, generator=gen)
    seeds = torch.arange(0, 30, 4)
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    for graph, feat, rows in [(g, lambda leaf: leaf["x"], x),
                              (g, lambda leaf: (leaf["x"], leaf["y"]), x),
                              (block, lambda leaf: leaf["x"], x[block.srcdata[dgl.NID]])]:
        leaves = _leaves({"x": rows, "y": torch.randn(30, 8, generator=gen)})
        want, got = theirs(graph, feat(leaves[0])), _quiet(ours, graph, feat(leaves[1]))
        assert got.shape == want.shape == (graph.num_dst_nodes(), 2, 4)
        assert torch.allclose(got, want, **TOL)
        grad = torch.randn_like(want)
        want.backward(grad)
        got.backward(grad)
        for k in leaves[0]:
            a, b = leaves[0][k].grad, leaves[1][k].grad
            assert (a is None) == (b is None) and (a is None or torch.allclose(b, a, **TOL)), k
    zero = dgl.graph((torch.tensor([0]), torch.tensor([1])), num_nodes=3)
    with pytest.raises(dgl.DGLError, match="0-in-degree"):
        _quiet(GATConv(8, 4, 2, db=None), zero, torch.randn(3, 8))
    with pytest.raises(ValueError, match="edge_weight is not supported"):
        ours(g, x, edge_weight=torch.ones(g.num_edges(), 1))


def test_a_container_of_any_modules_calls_them_as_dgls_does():
    """DGL's GraphConv and a user's module inside rgtune's container (the container's semantics): the same
    outputs as DGL's container, ``mod_args``/``mod_kwargs`` by edge type, a relation skipped when its source
    type has no input, outputs only for the destination types reached."""
    g, x = _heterograph()
    torch.manual_seed(0)
    theirs = dglnn.HeteroGraphConv({k: dglnn.GraphConv(8, 3, allow_zero_in_degree=True) for k in KEYS}, "max")
    ours = HeteroGraphConv({k: dglnn.GraphConv(8, 3) for k in KEYS}, "max", db=None)
    ours.load_state_dict(theirs.state_dict())
    want, got = theirs(g, x), ours(g, x)
    assert set(got) == set(want) == {"author", "paper"}
    assert all(torch.allclose(got[t], want[t], **TOL) for t in want)
    only_papers = {"paper": x["paper"]}  # 'writes' (from authors) skipped; authors have no input: DGL's KeyError
    with pytest.raises(KeyError):
        theirs(g, only_papers)
    with pytest.raises(KeyError):
        ours(g, only_papers)

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, rel_graph, h, arg=None, *, kw=None):
            self.seen.append((arg, kw))
            return torch.zeros(rel_graph.num_dst_nodes(), 2)

    mods = {k: Counting() for k in ["writes", "cites", "written_by"]}
    conv = HeteroGraphConv(mods, "sum", db=None)
    out = conv(g, x, mod_args={"writes": (1,)}, mod_kwargs={"cites": {"kw": "k"}})
    assert set(out) == {"author", "paper"}
    assert [m.seen for m in mods.values()] == [[(1, None)], [(None, "k")], [(None, None)]]
    # rgtune's GATConvs on a block without authors' input: 'writes' (from authors) and 'written_by' (to
    # authors, whose destination rows are missing) are skipped, as DGL skips them
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in KEYS})
    ours = _pair(theirs)
    block, src, _ = _block(g, x)
    papers = {"paper": src["paper"]}
    want, got = theirs(block, papers), _quiet(ours, block, papers)
    assert set(got) == set(want) == {"paper"}
    assert all(torch.allclose(got[t], want[t], **TOL) for t in want)


def test_modules_of_other_sizes_run_one_program_each():
    g, x = _heterograph()
    torch.manual_seed(0)
    sizes = {"writes": 2, ("paper", "cites", "paper"): 2, "written_by": 1}
    theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, h) for k, h in sizes.items()}, "sum")
    ours = HeteroGraphConv({k: GATConv(8, 4, h) for k, h in sizes.items()}, "sum", db=None)
    ours.load_state_dict(theirs.state_dict())
    assert not ours._fused
    _compare(theirs, ours, g, lambda leaf: leaf, leaves=_leaves(x))


def test_a_graph_without_edges_gives_dgls_keys_and_biases():
    """Every relation called on no edges: DGL's GATConv gives its bias at every destination."""
    g, x = _heterograph()
    for etype in g.canonical_etypes:
        g = dgl.remove_edges(g, g.edges(form="eid", etype=etype), etype=etype)
    for aggregate in ["sum", "max"]:
        theirs = dglnn.HeteroGraphConv({k: dglnn.GATConv(8, 4, 2) for k in KEYS}, aggregate)
        ours = _pair(theirs, aggregate)
        want, got = theirs(g, x), _quiet(ours, g, x)
        assert set(got) == set(want) == {"author", "paper"}
        assert all(got[t].shape == want[t].shape and torch.allclose(got[t], want[t], **TOL) for t in want)


@pytest.mark.parametrize("flags", [dict(self_loop=False), dict(bias=False), dict(self_loop=False, bias=False),
                                   dict(layer_norm=True), dict(layer_norm=True, bias=False, self_loop=False)],
                         ids=["no-self-loop", "no-bias", "neither", "layer-norm", "layer-norm-alone"])
@pytest.mark.parametrize("regularizer", [None, "basis", "bdd"])
def test_relgraphconv_options_equal_dgls(flags, regularizer):
    """``self_loop=False`` and ``bias=False`` (rgtune RGCN's ``root_weight``/``bias`` options), ``layer_norm``
    (the kernels' messages' sum, then DGL's norm, bias and self-loop), on a graph and on a block, with and
    without DGL's right normalization per relation."""
    from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv

    from rgtune.nn.dgl import RelGraphConv

    from _dropin import assert_same_as_library

    n, e, r = 40, 200, 3
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    etypes = torch.randint(0, r, (e,), generator=gen)
    key = etypes * n + dst
    norm = (1.0 / torch.bincount(key, minlength=r * n)[key].float()).unsqueeze(1)
    g = dgl.graph((src, dst), num_nodes=n)
    x = torch.randn(n, 8, generator=gen)
    bases = 2 if regularizer else None
    torch.manual_seed(0)
    theirs = DGLRelGraphConv(8, 6, r, regularizer, bases, activation=torch.tanh, **flags)
    ours = RelGraphConv(8, 6, r, regularizer, bases, activation=torch.tanh, db=None, **flags)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(-0.5, 0.5)  # DGL starts the bias and the norm's shift at zero
    ours.load_state_dict(theirs.state_dict())
    weights = torch.rand(e, 1, generator=gen)  # any per-edge norm: rgtune RGCN's aggr="weighted"
    for kw in ({}, {"norm": norm}, {"norm": weights}):
        assert_same_as_library(theirs, ours, lambda h, kw=kw: theirs(g, h, etypes, **kw),
                               lambda h, kw=kw: _quiet(ours, g, h, etypes, **kw), x)
    seeds = torch.arange(0, n, 3)
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    bt = etypes[block.edata[dgl.EID]]
    rows = x[block.srcdata[dgl.NID]]
    bw = weights[block.edata[dgl.EID]]
    for kw in ({}, {"norm": bw}):
        want = assert_same_as_library(theirs, ours, lambda h, kw=kw: theirs(block, h, bt, **kw),
                                      lambda h, kw=kw: _quiet(ours, block, h, bt, **kw), rows)
        assert want.shape == (seeds.numel(), 6)
    # DGL's presorted call (edges sorted by type, the types as counts) gives the same
    order = torch.sort(etypes, stable=True).indices
    sg = dgl.graph((src[order], dst[order]), num_nodes=n)
    counts = torch.bincount(etypes, minlength=r).tolist()
    got = _quiet(ours, sg, x, counts, weights[order], presorted=True)
    assert torch.allclose(got, theirs(g, x, etypes, weights), **TOL)
