"""The float64 reference layers: equal to PyG (RGCN, HGT) and to a per-edge loop (RGAT).

Relative error everywhere is ``max|ours - theirs| / max|theirs|`` in float64.
"""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from rgtune.data import HeteroGraph
from rgtune.torch_layers import HGT, RGAT, RGCN, RelationalLayer
from rgtune.torch_layers.pyg import to_pyg_hgt, to_pyg_rgcn

TOL = 1e-10
MODELS: dict[str, type[RelationalLayer]] = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}


# ----------------------------------------------------------------------------- helpers
def rel_err(ours: Tensor, theirs: Tensor) -> float:
    ours, theirs = ours.detach(), theirs.detach()
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300))


def random_graph(seed: int = 0, scale: int = 1) -> HeteroGraph:
    """A small graph with every awkward case the layers must handle.

    * ``venue`` is the destination of no relation (PyG's HGTConv leaves it out of its output);
    * ``(author, reviews, paper)`` has no edges;
    * two canonical edge types share the name ``likes``;
    * edges are drawn with replacement (repeated edges), ``cites`` can have self-loops;
    * some authors and papers receive no edge at all.
    """
    gen = torch.Generator().manual_seed(seed)
    n = {"author": 7 * scale, "paper": 9 * scale, "venue": 3 * scale}
    # Only the first few nodes of a type receive edges, so the rest have no in-edges.
    receivers = {"author": 4 * scale, "paper": 7 * scale}

    def rand_edges(s: str, d: str, e: int) -> tuple[Tensor, Tensor]:
        return (
            torch.randint(0, n[s], (e * scale,), generator=gen),
            torch.randint(0, receivers[d], (e * scale,), generator=gen),
        )

    edges = {
        ("author", "writes", "paper"): rand_edges("author", "paper", 12),
        ("paper", "cites", "paper"): rand_edges("paper", "paper", 10),
        ("paper", "written_by", "author"): rand_edges("paper", "author", 6),
        ("venue", "publishes", "paper"): rand_edges("venue", "paper", 5),
        ("author", "likes", "paper"): rand_edges("author", "paper", 4),
        ("paper", "likes", "paper"): rand_edges("paper", "paper", 3),
        ("author", "reviews", "paper"): (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
    }
    return HeteroGraph(n, edges, name=f"random{seed}")


def tiny_graph() -> HeteroGraph:
    """Few enough parameters for gradcheck; still two node types, a no-in-edge node, 3 relations."""
    t = torch.tensor
    return HeteroGraph(
        {"a": 3, "b": 2},
        {
            ("a", "r", "b"): (t([0, 1, 2, 2]), t([0, 0, 1, 1])),
            ("b", "s", "a"): (t([0, 1]), t([0, 1])),
            ("a", "u", "a"): (t([1, 2]), t([0, 0])),
        },
        name="tiny",
    )


def make_layer(cls: type[RelationalLayer], g: HeteroGraph, in_dim: int, out_dim: int, heads: int, seed: int) -> RelationalLayer:
    """A float64 layer with *every* parameter random (biases, mu and skip too, not their init)."""
    torch.manual_seed(seed)
    layer = cls(g, in_dim, out_dim) if cls is RGCN else cls(g, in_dim, out_dim, heads=heads)
    layer = layer.double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "mu":
                p.uniform_(0.5, 2.0)
            elif p.dim() < 2 or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return layer


def features(g: HeteroGraph, dim: int, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(g.num_nodes(), dim, generator=gen, dtype=torch.float64)


def dst_ntypes(g: HeteroGraph) -> set[str]:
    return {c[2] for c in g.canonical_etypes}


# --------------------------------------------------------------------- PyG equivalents
def run_pyg_rgcn(layer: RGCN, x: Tensor) -> Tensor:
    g = layer.graph
    return to_pyg_rgcn(layer)(x, torch.stack([g.src, g.dst]), g.etype)


def run_pyg_hgt(layer: HGT, x: Tensor) -> dict[str, Tensor]:
    g = layer.graph
    edge_index = {c: torch.stack(g.edges(c)) for c in g.canonical_etypes}
    return to_pyg_hgt(layer)(g.split_nodes(x), edge_index)


def check_hgt_against_pyg(layer: HGT, x: Tensor) -> float:
    """Compare on PyG's destination types; check the others against our documented rule."""
    g = layer.graph
    ours = layer(g.split_nodes(x))
    theirs = run_pyg_hgt(layer, x)
    # PyG leaves node types that no relation points to out of its output.
    assert set(theirs) == dst_ntypes(g)
    err = max(rel_err(ours[t], theirs[t]) for t in theirs)
    for t in set(g.ntypes) - dst_ntypes(g):
        # Ours: such nodes aggregate nothing, so o = a_bias of their type, then the gated skip.
        ti = g.ntype_id(t)
        expected = layer.a_bias[ti].expand_as(ours[t])
        if layer.in_dim == layer.out_dim:
            gate = torch.sigmoid(layer.skip[ti])
            expected = gate * expected + (1 - gate) * g.split_nodes(x)[t]
        err = max(err, rel_err(ours[t], expected))
    return err


# -------------------------------------------------------------- per-edge loop for RGAT
def rgat_loop(layer: RGAT, x: Tensor) -> Tensor:
    """Hector/Graphiler RGAT written one edge and one head at a time, straight from the formula."""
    g = layer.graph
    H, D = layer.heads, layer.head_dim
    src, dst, et = g.src.tolist(), g.dst.tolist(), g.etype.tolist()
    out = torch.zeros(g.num_nodes(), H * D, dtype=torch.float64)
    for i in range(g.num_nodes()):
        in_edges = [e for e in range(len(dst)) if dst[e] == i]
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            scores, zs = [], []
            for e in in_edges:
                r, j = et[e], src[e]
                z_j = (x[j] @ layer.weight[r])[cols]
                z_i = (x[i] @ layer.weight[r])[cols]
                s = float(layer.attn_dst[r, h] @ z_i + layer.attn_src[r, h] @ z_j)
                scores.append(s if s > 0 else 0.2 * s)
                zs.append(z_j)
            if not in_edges:
                continue  # no in-edges: output stays 0
            m = max(scores)
            w = [math.exp(s - m) for s in scores]
            out[i, cols] = sum(wk * zk for wk, zk in zip(w, zs)) / sum(w)
    return out


# ----------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=False)
def pyg(monkeypatch: pytest.MonkeyPatch):
    tg = pytest.importorskip("torch_geometric")
    # With pyg_lib installed, RGCNConv may pick a segment-matmul path that averages over *all*
    # in-edges instead of per relation (its own TODO); pin the per-relation path.
    monkeypatch.setattr(tg.backend, "use_segment_matmul", False)
    return tg


@pytest.fixture(scope="module")
def aifb() -> HeteroGraph:
    pytest.importorskip("rgtune.data.datasets")
    from rgtune.data import load_dataset

    return load_dataset("aifb")


DIMS = [(8, 8), (6, 8)]  # in == out (gated skip) and in != out


# -------------------------------------------------------------- equality with PyG
@pytest.mark.pyg
@pytest.mark.parametrize("in_dim,out_dim", DIMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_rgcn_equals_pyg_random(pyg, seed: int, in_dim: int, out_dim: int) -> None:
    g = random_graph(seed, scale=2)
    layer = make_layer(RGCN, g, in_dim, out_dim, 1, seed)
    x = features(g, in_dim, seed)
    assert rel_err(layer(x), run_pyg_rgcn(layer, x)) < TOL


@pytest.mark.pyg
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("in_dim,out_dim", DIMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_hgt_equals_pyg_random(pyg, seed: int, in_dim: int, out_dim: int, heads: int) -> None:
    g = random_graph(seed, scale=2)
    assert set(g.ntypes) - dst_ntypes(g) == {"venue"}  # the non-destination case is exercised
    layer = make_layer(HGT, g, in_dim, out_dim, heads, seed)
    assert check_hgt_against_pyg(layer, features(g, in_dim, seed)) < TOL


@pytest.mark.pyg
@pytest.mark.parametrize("in_dim,out_dim", [(64, 64), (32, 64)])
def test_rgcn_equals_pyg_aifb(pyg, aifb: HeteroGraph, in_dim: int, out_dim: int) -> None:
    layer = make_layer(RGCN, aifb, in_dim, out_dim, 1, seed=3)
    x = features(aifb, in_dim)
    assert rel_err(layer(x), run_pyg_rgcn(layer, x)) < TOL


@pytest.mark.pyg
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("in_dim,out_dim", [(64, 64), (32, 64)])
def test_hgt_equals_pyg_aifb(pyg, aifb: HeteroGraph, in_dim: int, out_dim: int, heads: int) -> None:
    layer = make_layer(HGT, aifb, in_dim, out_dim, heads, seed=4)
    assert check_hgt_against_pyg(layer, features(aifb, in_dim)) < TOL


# ----------------------------------------------------------- RGAT against the loop
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_rgat_equals_edge_loop(seed: int, heads: int) -> None:
    g = random_graph(seed)
    layer = make_layer(RGAT, g, 5, 8, heads, seed)
    x = features(g, 5, seed)
    with torch.no_grad():
        ours, ref = layer(x), rgat_loop(layer, x)
    no_in = g.in_degrees == 0
    assert no_in.any() and (~no_in).any()
    assert torch.equal(ours[no_in], torch.zeros_like(ours[no_in]))
    assert rel_err(ours, ref) < TOL


# --------------------------------------------------------------------- behaviour
@pytest.mark.parametrize("name", MODELS)
def test_parameter_layout_matches_contract(name: str) -> None:
    g = random_graph(0)
    T, R, H, D, i, o = g.num_ntypes, g.num_rels, 2, 4, 6, 8
    layer = MODELS[name](g, i, o) if name == "rgcn" else MODELS[name](g, i, o, heads=H)
    expected = {
        "rgcn": {"weight": (R, i, o), "root": (i, o), "bias": (o,)},
        "rgat": {"weight": (R, i, H * D), "attn_src": (R, H, D), "attn_dst": (R, H, D)},
        "hgt": {
            **{f"{p}_weight": (T, i, H * D) for p in "kqv"},
            **{f"{p}_bias": (T, H * D) for p in "kqv"},
            "w_att": (R, H, D, D), "w_msg": (R, H, D, D), "mu": (R, H),
            "a_weight": (T, H * D, o), "a_bias": (T, o), "skip": (T,),
        },
    }[name]
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == expected


def test_hgt_init_as_pyg() -> None:
    layer = HGT(random_graph(0), 8, 8, heads=2)
    assert torch.equal(layer.mu, torch.ones_like(layer.mu))
    assert torch.equal(layer.skip, torch.ones_like(layer.skip))
    assert torch.equal(layer.a_bias, torch.zeros_like(layer.a_bias))


@pytest.mark.parametrize("name", MODELS)
def test_dict_and_tensor_inputs_agree(name: str) -> None:
    g = random_graph(2)
    layer = make_layer(MODELS[name], g, 6, 8, 2, seed=5)
    x = features(g, 6)
    flat = layer(x)
    per_type = layer(g.split_nodes(x))
    assert isinstance(flat, Tensor) and isinstance(per_type, dict)
    assert list(per_type) == g.ntypes
    assert torch.equal(g.flatten_nodes(per_type), flat)


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_round_trip(name: str) -> None:
    g = random_graph(3)
    a = make_layer(MODELS[name], g, 8, 8, 2, seed=6)
    b = make_layer(MODELS[name], g, 8, 8, 2, seed=7)
    x = features(g, 8)
    assert not torch.equal(a(x), b(x))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))
    # Only parameters travel: the graph's index buffers are not part of the state.
    assert set(a.state_dict()) == {n for n, _ in a.named_parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_double_and_float32(name: str) -> None:
    g = random_graph(4)
    torch.manual_seed(0)
    cls = MODELS[name]
    layer = cls(g, 8, 8) if cls is RGCN else cls(g, 8, 8, heads=2)
    assert all(p.dtype == torch.float32 for p in layer.parameters())
    x = features(g, 8)
    out32 = layer(x.float())
    assert out32.dtype == torch.float32
    layer.double()
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    assert layer.src.dtype == torch.int64  # index buffers untouched by .double()
    out64 = layer(x)
    assert out64.dtype == torch.float64
    assert rel_err(out32.double(), out64) < 1e-4
    # dtype= at construction gives a float64 layer directly
    direct = cls(g, 8, 8, dtype=torch.float64) if cls is RGCN else cls(g, 8, 8, heads=2, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in direct.parameters())
    direct.load_state_dict(layer.state_dict())
    assert torch.equal(direct(x), out64)


@pytest.mark.parametrize("name", MODELS)
def test_backward_reaches_every_parameter(name: str) -> None:
    g = random_graph(5)
    layer = make_layer(MODELS[name], g, 8, 8, 2, seed=8)
    x = features(g, 8).requires_grad_()
    layer(x).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for n, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, n


@pytest.mark.parametrize(
    "name,in_dim,out_dim,heads",
    [("rgcn", 3, 4, 1), ("rgcn", 4, 4, 1), ("rgat", 3, 4, 2), ("hgt", 4, 4, 2), ("hgt", 3, 4, 1)],
)
def test_gradcheck(name: str, in_dim: int, out_dim: int, heads: int) -> None:
    g = tiny_graph()
    layer = make_layer(MODELS[name], g, in_dim, out_dim, heads, seed=9)
    x = features(g, in_dim).requires_grad_()
    names = [n for n, _ in layer.named_parameters()]
    if name == "hgt" and in_dim != out_dim:
        names.remove("skip")  # the gate is unused without the skip connection
    params = [getattr(layer, n).detach().clone().requires_grad_() for n in names]

    def f(x: Tensor, *ps: Tensor) -> Tensor:
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-7, rtol=1e-5)


# -------------------------------------------------------------------- validation
def _layer(name: str, g: HeteroGraph | None = None) -> RelationalLayer:
    return make_layer(MODELS[name], g or random_graph(6), 4, 6, 2, seed=0)


@pytest.mark.parametrize("name", MODELS)
def test_error_wrong_feature_size(name: str) -> None:
    layer = _layer(name)
    n = layer.graph.num_nodes()
    with pytest.raises(ValueError, match=r"feature size: expected in_dim=4, got 5"):
        layer(torch.zeros(n, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"node type 'paper'.*expected in_dim=4, got 3"):
        layer({t: torch.zeros(v.shape[0], 3 if t == "paper" else 4, dtype=torch.float64)
               for t, v in layer.graph.split_nodes(torch.zeros(n, 4)).items()})


@pytest.mark.parametrize("name", MODELS)
def test_error_wrong_rows(name: str) -> None:
    layer = _layer(name)
    n = layer.graph.num_nodes()
    with pytest.raises(ValueError, match=rf"number of rows: expected {n}, got {n + 1}"):
        layer(torch.zeros(n + 1, 4, dtype=torch.float64))
    x = layer.graph.split_nodes(torch.zeros(n, 4, dtype=torch.float64))
    x["author"] = x["author"][:-1]
    na = layer.graph.num_nodes("author")
    with pytest.raises(ValueError, match=rf"'author'.*expected {na}, got {na - 1}"):
        layer(x)
    with pytest.raises(ValueError, match=r"2-D.*got shape \(%d,\)" % n):
        layer(torch.zeros(n, dtype=torch.float64))


@pytest.mark.parametrize("name", MODELS)
def test_error_dtype(name: str) -> None:
    layer = _layer(name)
    n = layer.graph.num_nodes()
    with pytest.raises(ValueError, match=r"floating dtype, expected torch.float64, got torch.int64"):
        layer(torch.zeros(n, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"dtype torch.float32, expected torch.float64"):
        layer(torch.zeros(n, 4, dtype=torch.float32))


@pytest.mark.parametrize("name", MODELS)
def test_error_dict_keys(name: str) -> None:
    layer = _layer(name)
    x = layer.graph.split_nodes(torch.zeros(layer.graph.num_nodes(), 4, dtype=torch.float64))
    missing = {t: v for t, v in x.items() if t != "venue"}
    with pytest.raises(ValueError, match=r"missing node type 'venue'"):
        layer(missing)
    with pytest.raises(ValueError, match=r"unknown node types \['conference'\]"):
        layer({**x, "conference": x["venue"]})


@pytest.mark.parametrize("name", ["rgat", "hgt"])
def test_error_heads_do_not_divide(name: str) -> None:
    with pytest.raises(ValueError, match=r"divisible by heads, got out_dim=6, heads=4"):
        MODELS[name](random_graph(0), 4, 6, heads=4)


@pytest.mark.parametrize("name", MODELS)
def test_error_bad_sizes(name: str) -> None:
    with pytest.raises(ValueError, match=r"in_dim must be a positive int, got 0"):
        MODELS[name](random_graph(0), 0, 4)


@pytest.mark.parametrize("name", MODELS)
def test_error_graph_without_relations(name: str) -> None:
    g = HeteroGraph({"a": 3}, {}, name="norel")
    with pytest.raises(ValueError, match=r"'norel' has no relations.*expected at least 1, got 0"):
        MODELS[name](g, 4, 4)


def test_repr_names_the_graph() -> None:
    assert "graph='random0'" in repr(HGT(random_graph(0), 4, 4, heads=2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", MODELS)
def test_cuda_matches_cpu(name: str) -> None:
    g = random_graph(7, scale=2)
    layer = make_layer(MODELS[name], g, 8, 8, 2, seed=10)
    x = features(g, 8)
    ref = layer(x)
    layer.to("cuda")
    assert layer.src.is_cuda  # the graph's index buffers travel with the module
    assert rel_err(layer(x.cuda()).cpu(), ref) < TOL
