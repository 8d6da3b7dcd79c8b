"""``rgtune.nn.pyg.HGTConv`` against PyG's own ``HGTConv`` on the same state dict (PyG is the oracle: it is
installed in CI, never skipped): which node types the output holds (and in which order), their values and
every gradient, per-type and lazy input sizes, sparse adjacencies, empty node types and relations, repr."""

from __future__ import annotations

import warnings

import pytest
import torch

from rgtune.bench.baselines import _pyg
from rgtune.nn.pyg import HGTConv
from rgtune.runtime._lookup import TunedScheduleWarning

# 'inst' is only ever a source; 'paper' and 'author' are destinations
META = (["paper", "author", "inst"],
        [("author", "writes", "paper"), ("paper", "rev_writes", "author"), ("inst", "employs", "author"),
         ("paper", "cites", "paper")])
COUNTS = {"paper": 9, "author": 7, "inst": 4}


def _edges(relations=None, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for src, rel, dst in META[1] if relations is None else relations:
        n = 15
        out[(src, rel, dst)] = torch.stack([torch.randint(0, COUNTS[src], (n,), generator=gen),
                                            torch.randint(0, COUNTS[dst], (n,), generator=gen)])
    return out


def _features(sizes: dict, seed: int = 1) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {t: torch.randn(COUNTS[t], f, generator=gen) for t, f in sizes.items()}


def _quiet(conv, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)  # no database: the default schedule
        return conv(*args)


def _pair(in_channels, out_channels, heads, metadata=META, x=None):
    """PyG's conv with perturbed parameters (PyG's skip and p_rel start at one) and rgtune's with its state."""
    torch.manual_seed(0)
    theirs = _pyg().nn.HGTConv(in_channels, out_channels, metadata, heads=heads)
    ours = HGTConv(in_channels, out_channels, metadata, heads=heads, db=None)
    if x is not None:  # lazy sizes: both are initialized by a first call
        theirs(x, _edges())
        _quiet(ours, x, _edges())
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def assert_as_pyg(theirs, ours, x: dict, edges: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Same output keys in the same order, same values; same gradients of every input and parameter."""
    xa = {t: v.clone().requires_grad_() for t, v in x.items()}
    xb = {t: v.clone().requires_grad_() for t, v in x.items()}
    want, got = theirs(xa, edges), _quiet(ours, xb, edges)
    assert list(got) == list(want)
    gen = torch.Generator().manual_seed(3)
    weights = {t: torch.randn(v.shape, generator=gen) for t, v in want.items()}
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=rtol, atol=atol, msg=lambda m, t=t: f"{t}: {m}")
    if not any(v.numel() for v in want.values()):
        return
    sum((want[t] * weights[t]).sum() for t in want).backward()
    sum((got[t] * weights[t]).sum() for t in got).backward()
    for t in x:
        a, b = xa[t].grad, xb[t].grad
        if a is None:  # PyG's graph does not reach it: rgtune's gradient is absent or zero
            assert b is None or not b.any(), t
        else:
            torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m, t=t: f"x[{t}]: {m}")
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        g = mine[name].grad
        if p.grad is None:
            assert g is None or not g.any(), name
        else:
            torch.testing.assert_close(g, p.grad, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


def test_the_output_holds_the_destination_types_given_in_x_dict_in_metadata_order():
    theirs, ours = _pair(8, 8, 2)
    x = _features({"author": 8, "inst": 8, "paper": 8})  # not metadata's order
    got = _quiet(ours, x, _edges())
    assert list(got) == ["paper", "author"]  # 'inst' is no destination of metadata: no output, not zeros
    assert_as_pyg(theirs, ours, x, _edges())


def test_a_destination_without_messages_in_this_call_gets_pyg_value():
    theirs, ours = _pair(8, 8, 2)
    x = _features({"author": 8, "paper": 8, "inst": 8})
    only = _edges([("author", "writes", "paper")])  # 'author' receives nothing: out_lin(gelu(0)) and the skip
    assert_as_pyg(theirs, ours, x, only)


def test_missing_input_node_type_and_missing_edge_type():
    theirs, ours = _pair(8, 16, 2)
    x = _features({"author": 8, "paper": 8})  # no 'inst' rows at all; its relation not given
    edges = _edges([("author", "writes", "paper"), ("paper", "rev_writes", "author")])
    assert_as_pyg(theirs, ours, x, edges)


@pytest.mark.parametrize("out_channels", [16, 8, 12])
def test_per_type_input_sizes(out_channels):
    """Sizes 8, 16, 4: padded to 16 in the kernels; PyG's gated skip only for the type whose size is out."""
    sizes = {"paper": 16, "author": 8, "inst": 4}
    theirs, ours = _pair(sizes, out_channels, 2 if out_channels % 2 == 0 else 1)
    assert ours.in_channels == sizes and ours._sizes[0] == 16
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert_as_pyg(theirs, ours, _features(sizes), _edges())


def test_a_type_that_per_type_sizes_leave_out_is_passed_over_as_pyg_does():
    theirs, ours = _pair({"paper": 16, "author": 8}, 8, 2)  # no size (no K/Q/V weight) for 'inst'
    edges = _edges([("author", "writes", "paper"), ("paper", "rev_writes", "author")])
    assert_as_pyg(theirs, ours, _features({"paper": 16, "author": 8, "inst": 8}), edges)


def test_per_type_sizes_in_float64_on_the_reference_backend():
    """The padded weights and features, through the kernel IR's own executor in float64: PyG's to rounding."""
    sizes = {"paper": 16, "author": 8, "inst": 4}
    torch.manual_seed(0)
    theirs = _pyg().nn.HGTConv(sizes, 8, META, heads=2).double()
    ours = HGTConv(sizes, 8, META, heads=2, db=None, backend="reference").double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    x = {t: v.double() for t, v in _features(sizes).items()}
    assert_as_pyg(theirs, ours, x, _edges(), rtol=1e-10, atol=1e-12)


def test_lazy_sizes_are_pyg_before_and_after_the_first_call():
    UP = torch.nn.parameter.UninitializedParameter
    torch.manual_seed(0)
    theirs = _pyg().nn.HGTConv(-1, 8, META, heads=2)
    torch.manual_seed(0)  # PyG's constructor, the same random numbers
    ours = HGTConv(-1, 8, META, heads=2, db=None)
    before = {k: type(v) for k, v in theirs.state_dict().items()}
    assert {k: type(v) for k, v in ours.state_dict().items()} == before
    assert sum(v is UP for v in before.values()) == 3  # the K/Q/V weights wait for their sizes
    x = _features({"author": 8, "paper": 16})  # 'inst' not in the first call: it stays lazy, as in PyG
    state = torch.get_rng_state()
    theirs(x, _edges([("author", "writes", "paper")]))
    torch.set_rng_state(state)
    _quiet(ours, x, _edges([("author", "writes", "paper")]))
    for k, v in theirs.state_dict().items():
        w = ours.state_dict()[k]
        assert type(w) is type(v), k
        if k != "kqv_lin.lins.inst.bias" and not isinstance(v, UP):  # PyG leaves a lazy type's bias unset
            assert torch.equal(w, v), k
    x["inst"] = torch.randn(4, 4)
    state = torch.get_rng_state()
    theirs(x, _edges())
    torch.set_rng_state(state)
    _quiet(ours, x, _edges())  # a type met later gets its size then (PyG's Linear's own lazy hook)
    assert ours.kqv_lin.lins["inst"].weight.shape == theirs.kqv_lin.lins["inst"].weight.shape == (24, 4)
    assert_as_pyg(theirs, ours, x, _edges())


def test_lazy_state_dicts_load_both_ways():
    x = _features({"author": 8, "paper": 16, "inst": 4})
    theirs, _ = _pair(-1, 8, 2, x=x)
    ours = HGTConv(-1, 8, META, heads=2, db=None)
    ours.load_state_dict(theirs.state_dict())  # into a lazy module, before any call
    assert_as_pyg(theirs, ours, x, _edges())
    back = _pyg().nn.HGTConv(-1, 8, META, heads=2)
    back.load_state_dict(ours.state_dict())
    for t, v in back(x, _edges()).items():
        torch.testing.assert_close(_quiet(ours, x, _edges())[t], v, rtol=1e-4, atol=1e-5)


def _adjacencies(edges: dict, form: str) -> dict:
    out = {}
    for (src, rel, dst), ei in edges.items():
        size = (COUNTS[dst], COUNTS[src])
        coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), size).coalesce()
        coo = torch.sparse_coo_tensor(coo.indices(), torch.ones(coo.indices().size(1)), size)  # no duplicates
        if form == "coo":
            out[(src, rel, dst)] = coo.coalesce()
        elif form == "csr":
            out[(src, rel, dst)] = coo.to_sparse_csr()
        elif form == "csc":
            out[(src, rel, dst)] = coo.to_sparse_csc()
        else:
            from torch_geometric.typing import SparseTensor

            out[(src, rel, dst)] = SparseTensor.from_torch_sparse_coo_tensor(coo.coalesce())
    return out


@pytest.mark.parametrize("form", ["coo", "csr", "csc", "SparseTensor"])
def test_sparse_adjacencies_are_their_edge_lists(form):
    import torch_geometric.typing

    if form == "SparseTensor" and not torch_geometric.typing.WITH_TORCH_SPARSE:
        pytest.skip("torch-sparse is not installed")  # PyG's own test skips the form too
    theirs, ours = _pair(8, 8, 2)
    x = _features({"author": 8, "paper": 8, "inst": 8})
    adj = _adjacencies(_edges(), form)
    assert_as_pyg(theirs, ours, x, adj)
    plain = {k: torch.stack([v.coalesce().indices()[1], v.coalesce().indices()[0]])
             for k, v in _adjacencies(_edges(), "coo").items()}
    for t, v in _quiet(ours, x, plain).items():
        torch.testing.assert_close(_quiet(ours, x, adj)[t], v, rtol=1e-5, atol=1e-6)


def test_zero_nodes_of_a_type_and_zero_edges_of_a_relation():
    theirs, ours = _pair(8, 8, 2)
    x = _features({"author": 8, "paper": 8, "inst": 8})
    x["paper"] = torch.zeros(0, 8)
    edges = {("author", "writes", "paper"): torch.zeros(2, 0, dtype=torch.long),
             ("inst", "employs", "author"): torch.tensor([[0, 1, 3], [2, 2, 6]])}
    got = _quiet(ours, x, edges)
    assert {t: tuple(v.shape) for t, v in got.items()} == {"author": (7, 8), "paper": (0, 8)}
    assert_as_pyg(theirs, ours, x, edges)
    no_edges = {("author", "writes", "paper"): torch.zeros(2, 0, dtype=torch.long)}
    assert_as_pyg(theirs, ours, x, no_edges)  # no edge in the whole graph
    empty = {t: torch.zeros(0, 8) for t in ("author", "paper")}  # no node of any given type
    assert {t: tuple(v.shape) for t, v in _quiet(ours, empty, no_edges).items()} == {"paper": (0, 8), "author": (0, 8)}
    assert_as_pyg(theirs, ours, empty, no_edges)


def test_repr_is_pyg():
    for in_channels in (8, {"paper": 8, "author": 4, "inst": 8}, -1):
        assert repr(HGTConv(in_channels, 16, META, heads=2, db=None)) == "HGTConv(-1, 16, heads=2)"
        assert repr(HGTConv(in_channels, 16, META, heads=2, db=None)) == \
            repr(_pyg().nn.HGTConv(in_channels, 16, META, heads=2))


def test_errors_name_the_argument():
    conv = HGTConv(8, 8, META, heads=2, db=None)
    x = _features({"author": 8, "paper": 8})
    with pytest.raises(ValueError, match="no features for its node type 'inst'"):
        _quiet(conv, x, _edges([("inst", "employs", "author")]))
    with pytest.raises(ValueError, match=r"x_dict\['paper'\] has 5 features"):
        _quiet(conv, {"author": x["author"], "paper": torch.zeros(9, 5)}, _edges([("author", "writes", "paper")]))
    with pytest.raises(ValueError, match="is not in metadata"):
        _quiet(conv, x, {("author", "nope", "paper"): torch.zeros(2, 0, dtype=torch.long)})
    with pytest.raises(ValueError, match="in_channels=0"):
        HGTConv(0, 8, META, db=None)
    with pytest.raises(ValueError, match="in_channels="):
        HGTConv({"paper": 8, "author": 2.5, "inst": 8}, 8, META, db=None)
