"""PyG's input forms of ``RGCNConv`` and ``FiLMConv`` (rgtune.nn.pyg) and the IR options under them.

The fronts: PyG's repr; a transposed sparse adjacency as ``edge_index``; the x-size error; ``root_weight=False``
and ``bias=False`` (PyG's state dict); bipartite pairs; featureless ``x=None`` and node-index inputs (the
``featureless`` option of :func:`rgtune.ir.models.rgcn`); empty graphs. Each one against PyG's own module
with the same weights: outputs and every parameter's gradient.

The IR options (``root_weight``, ``bias``, ``featureless``): the adjoint after every IR configuration against
autograd of the program before the passes (float64), random training schedules on the CPU backend, the CUDA
emulator against the float64 reference, and NVRTC compiles of their training programs.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import torch

from rgtune.ir.models import rgcn
from rgtune.ir.program import IRError
from rgtune.nn.pyg import FiLMConv, RGCNConv
from rgtune.search_spaces import SearchSpace

G = pytest.importorskip("torch_geometric.nn")

R = 3
#: six sources, three destinations (bipartite calls read rows 0..2 of the destinations)
EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 5, 1], [0, 1, 2, 0, 1, 2, 1, 1, 0, 2]])
EDGE_TYPE = torch.tensor([0, 1, 2, 0, 1, 2, 1, 0, 0, 2])


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no database: the default schedule, said once
        return fn(*args)


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, *args: Any, tol: float = 1e-5) -> torch.Tensor:
    """Our output and every parameter gradient equal PyG's (same weights, same call); our output."""
    out, want = _quiet(ours, *args), theirs(*args)
    assert out.shape == want.shape
    assert torch.allclose(out, want, rtol=1e-4, atol=tol)
    mine = dict(ours.named_parameters())
    theirs_p = dict(theirs.named_parameters())
    assert set(mine) == set(theirs_p)
    names = sorted(mine)
    if out.numel() == 0:
        return out
    g_ours = torch.autograd.grad(out.square().sum(), [mine[n] for n in names], allow_unused=True)
    g_theirs = torch.autograd.grad(want.square().sum(), [theirs_p[n] for n in names], allow_unused=True)
    for n, a, b in zip(names, g_ours, g_theirs):
        a = torch.zeros_like(mine[n]) if a is None else a
        b = torch.zeros_like(mine[n]) if b is None else b
        assert torch.allclose(a, b, rtol=1e-4, atol=tol), n
    return out


def _rgcn_pair(*args: Any, **kw: Any) -> tuple[RGCNConv, torch.nn.Module]:
    ours = RGCNConv(*args, db=None, **kw)
    theirs = G.RGCNConv(*args, **kw)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _film_pair(*args: Any) -> tuple[FiLMConv, torch.nn.Module]:
    ours, theirs = FiLMConv(*args, db=None), G.FiLMConv(*args)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


# ----------------------------------------------------------------------------- 1. repr
def test_repr_is_pygs() -> None:
    for args in ((4, 32, 2), ((4, 16), 32, 2)):
        assert repr(RGCNConv(*args, db=None)) == repr(G.RGCNConv(*args))
        assert repr(RGCNConv(*args, num_bases=2, db=None)) == repr(G.RGCNConv(*args, num_bases=2))
    assert repr(FiLMConv(4, 32, db=None)) == "FiLMConv(4, 32, num_relations=1)" == repr(G.FiLMConv(4, 32))
    assert repr(FiLMConv((4, 16), 32, 2, db=None)) == repr(G.FiLMConv((4, 16), 32, 2))


# ----------------------------------------------------------------------------- 2. sparse adjacencies, errors
def _adjacencies(edge_index: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> list[torch.Tensor]:
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, (size[1], size[0]))
    return [coo, coo.to_sparse_csr(), coo.to_sparse_csc()]


def test_a_transposed_sparse_adjacency_is_its_edges_with_their_types() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2], [1, 2, 3, 4, 5, 0, 3, 5]])  # no repeated (src, dst)
    et = torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    conv = RGCNConv(4, 8, R, db=None)
    want = _quiet(conv, x, ei, et)
    for adj in _adjacencies(ei, et, (6, 6)):
        assert torch.allclose(_quiet(conv, x, adj), want, atol=1e-6), adj.layout
        assert torch.allclose(_quiet(conv, x, adj, _sorted_types(adj, ei, et)), want, atol=1e-6), adj.layout
    film = FiLMConv(4, 8, R, db=None)
    want = _quiet(film, x, ei, et)
    for adj in _adjacencies(ei, et, (6, 6)):
        assert torch.allclose(_quiet(film, x, adj), want, atol=1e-6), adj.layout


def _sorted_types(adj: torch.Tensor, ei: torch.Tensor, et: torch.Tensor) -> torch.Tensor:
    """``et`` in the adjacency's storage order (what PyG aligns an explicit edge_type with)."""
    from rgtune.nn._inputs import edge_list

    read = edge_list(adj, "edge_index").edge_index
    where = {(int(s), int(d)): int(t) for s, d, t in zip(ei[0], ei[1], et)}
    return torch.tensor([where[(int(s), int(d))] for s, d in zip(read[0], read[1])])


def test_bad_inputs_are_named() -> None:
    conv = RGCNConv(4, 8, R, db=None)
    x = torch.randn(6, 4)
    with pytest.raises(ValueError, match="edge_index must hold integer node ids"):
        conv(x, EDGE_INDEX.float(), EDGE_TYPE)
    big = EDGE_INDEX.clone()
    big[0, 3] = 99
    with pytest.raises(ValueError, match="x has 6 rows but edge_index refers to node 99"):
        conv(x, big, EDGE_TYPE)
    with pytest.raises(ValueError, match=r"x\[1\] has 3 rows but edge_index refers to destination node 5"):
        RGCNConv((4, 4), 8, R, db=None)((x, x[:3]), torch.tensor([[0], [5]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="sparse adjacency has 5 nodes"):
        conv(x, torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([0]), (5, 5)))
    with pytest.raises(ValueError, match="Block-diagonal decomposition not supported for non-continuous"):
        _quiet(RGCNConv(6, 8, R, num_blocks=2, db=None), None, EDGE_INDEX, EDGE_TYPE)


# ----------------------------------------------------------------------------- 3. root_weight, bias
@pytest.mark.parametrize("kw", [{"root_weight": False}, {"bias": False}, {"root_weight": False, "bias": False},
                                {"root_weight": False, "num_bases": 2}, {"bias": False, "num_blocks": 2}])
def test_root_weight_and_bias_off_have_pygs_state_dict_and_outputs(kw: dict[str, Any]) -> None:
    torch.manual_seed(1)
    ours, theirs = _rgcn_pair(4, 8, R, **kw)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ("root" in ours.state_dict()) == kw.get("root_weight", True)
    assert ("bias" in ours.state_dict()) == kw.get("bias", True)
    _same(ours, theirs, torch.randn(6, 4), EDGE_INDEX, EDGE_TYPE)


# ----------------------------------------------------------------------------- 4. bipartite
@pytest.mark.parametrize("kw", [{}, {"num_bases": 2}, {"num_blocks": 2}, {"root_weight": False}, {"aggr": "add"}])
def test_bipartite_rgcn_reads_sources_for_messages_and_destinations_for_the_root(kw: dict[str, Any]) -> None:
    torch.manual_seed(2)
    dst_in = 6 if "num_blocks" in kw else 5  # blocks: 5 destination features pad to 3 per block
    ours, theirs = _rgcn_pair((4, dst_in), 8, R, **kw)
    out = _same(ours, theirs, (torch.randn(6, 4), torch.randn(3, dst_in)), EDGE_INDEX, EDGE_TYPE)
    assert out.shape == (3, 8)
    if "num_blocks" in kw:  # a destination size the blocks do not divide
        ours, theirs = _rgcn_pair((4, 5), 8, R, **kw)
        _same(ours, theirs, (torch.randn(6, 4), torch.randn(3, 5)), EDGE_INDEX, EDGE_TYPE)


@pytest.mark.parametrize("kw", [{}, {"num_blocks": 2}])
def test_bipartite_with_one_size_reads_the_rows_as_they_are(kw: dict[str, Any]) -> None:
    torch.manual_seed(7)
    ours, theirs = _rgcn_pair(4, 8, R, **kw)
    x = torch.randn(6, 4)
    assert _same(ours, theirs, (x, x[:3]), EDGE_INDEX, EDGE_TYPE).shape == (3, 8)
    film, pyg_film = _film_pair(4, 8, R)
    assert _same(film, pyg_film, (x, x[:3]), EDGE_INDEX, EDGE_TYPE).shape == (3, 8)
    with pytest.raises(ValueError, match=r"takes x as a pair"):
        RGCNConv((4, 4), 8, R, db=None)(x, EDGE_INDEX, EDGE_TYPE)


def test_bipartite_inputs_get_their_gradients() -> None:
    torch.manual_seed(3)
    ours, theirs = _rgcn_pair((4, 5), 8, R, num_bases=2)
    xs, xd = torch.randn(6, 4, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    a = torch.autograd.grad(_quiet(ours, (xs, xd), EDGE_INDEX, EDGE_TYPE).sum(), [xs, xd])
    b = torch.autograd.grad(theirs((xs, xd), EDGE_INDEX, EDGE_TYPE).sum(), [xs, xd])
    for u, v in zip(a, b):
        assert torch.allclose(u, v, atol=1e-5)


@pytest.mark.parametrize("relations", [1, R])
def test_bipartite_film(relations: int) -> None:
    torch.manual_seed(4)
    ours, theirs = _film_pair((4, 5), 8, relations)
    et = EDGE_TYPE if relations > 1 else None
    args = (EDGE_INDEX,) if et is None else (EDGE_INDEX, et)
    out = _same(ours, theirs, (torch.randn(6, 4), torch.randn(3, 5)), *args)
    assert out.shape == (3, 8)
    adj = torch.sparse_coo_tensor(EDGE_INDEX.flip(0), EDGE_TYPE if relations > 1 else torch.zeros(10, dtype=torch.long),
                                  (3, 6))
    x = (torch.randn(6, 4), torch.randn(3, 5))
    if relations > 1:  # the adjacency's values are the edge types
        coalesced = adj.coalesce()
        assert torch.allclose(_quiet(ours, x, adj), theirs(x, coalesced.indices().flip(0), coalesced.values()),
                              atol=1e-5)


# ----------------------------------------------------------------------------- 5. featureless
@pytest.mark.parametrize("kw", [{}, {"num_bases": 2}, {"root_weight": False}, {"bias": False},
                                {"num_bases": 2, "root_weight": False, "aggr": "add"}])
def test_featureless_rgcn_is_pygs(kw: dict[str, Any]) -> None:
    torch.manual_seed(5)
    ours, theirs = _rgcn_pair(6, 8, R, **kw)
    none = _same(ours, theirs, None, EDGE_INDEX, EDGE_TYPE)
    assert none.shape == (6, 8)
    assert torch.allclose(_quiet(ours, torch.arange(6), EDGE_INDEX, EDGE_TYPE), none, atol=1e-6)
    _same(ours, theirs, torch.tensor([5, 3, 1, 0, 2, 4, 3]), torch.tensor([[0, 6, 2], [1, 1, 6]]),
          torch.tensor([0, 2, 1]))
    pair_ours, pair_theirs = _rgcn_pair((6, 3), 8, R, **kw)
    out = _same(pair_ours, pair_theirs, (None, torch.tensor([2, 0, 1])), EDGE_INDEX, EDGE_TYPE)
    assert out.shape == (3, 8)
    _same(pair_ours, pair_theirs, (torch.tensor([5, 4, 3, 2, 1, 0]), torch.tensor([1, 1, 0])), EDGE_INDEX, EDGE_TYPE)


def test_featureless_indices_out_of_range_are_named() -> None:
    with pytest.raises(ValueError, match="x holds node indices outside 0 .. 5"):
        _quiet(RGCNConv(6, 8, R, db=None), torch.tensor([0, 1, 2, 3, 4, 5, 6]), EDGE_INDEX, EDGE_TYPE)


# ----------------------------------------------------------------------------- 6. empty graphs
def test_empty_graphs_have_pygs_shapes() -> None:
    torch.manual_seed(6)
    none_e, none_t = torch.empty(2, 0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    for n in (5, 0):
        ours, theirs = _rgcn_pair(4, 8, R)
        assert _same(ours, theirs, torch.randn(n, 4), none_e, none_t).shape == (n, 8)
        ours, theirs = _film_pair(4, 8, R)
        assert _same(ours, theirs, torch.randn(n, 4), none_e, none_t).shape == (n, 8)
    ours, theirs = _rgcn_pair(5, 8, R, num_bases=2)
    assert _same(ours, theirs, None, none_e, none_t).shape == (5, 8)
    ours, theirs = _rgcn_pair((4, 5), 8, R)
    assert _same(ours, theirs, (torch.randn(3, 4), torch.randn(0, 5)), none_e, none_t).shape == (0, 8)
    ours, theirs = _rgcn_pair(4, 8, R)  # relations 1 and 2 have no edges
    _same(ours, theirs, torch.randn(4, 4), torch.tensor([[0, 1, 2], [1, 2, 3]]), torch.zeros(3, dtype=torch.long))


# ----------------------------------------------------------------------------- the IR options
IR_OPTIONS = [{"root_weight": False}, {"bias": False}, {"root_weight": False, "bias": False, "num_bases": 2},
              {"featureless": True, "num_bases": 3}, {"featureless": True, "num_relations": 6},
              {"featureless": True, "num_bases": 2, "root_weight": False, "aggr": "sum"},
              {"featureless": True, "num_relations": 6, "bias": False}]
_IDS = ["-".join(f"{k}={v}" for k, v in o.items()) for o in IR_OPTIONS]


def _program(option: dict[str, Any], in_dim: int = 13, out_dim: int = 10):
    return rgcn(in_dim, out_dim, **option)


def test_featureless_options_are_checked() -> None:
    with pytest.raises(IRError, match="featureless=True .* does not support num_blocks"):
        rgcn(10, 8, featureless=True, num_blocks=2)
    with pytest.raises(IRError, match="needs num_relations"):
        rgcn(10, 8, featureless=True)
    p = rgcn(10, 8, featureless=True, num_bases=3)
    assert p.in_dim == 4 * 8 and set(p.state_params()) == {"comp", "root_select", "bias"}


@pytest.mark.parametrize("option", IR_OPTIONS, ids=_IDS)
def test_every_ir_configuration_has_the_gradients_of_autograd(option: dict[str, Any]) -> None:
    from test_autodiff import _check, _distinct
    from test_rgcn_decomposition import _edge_cases, _lowered_matches_interpreter

    graph = _edge_cases()
    before = _program(option, 8, 8)
    for after, layout in _distinct(before, graph):
        _check(before, after, graph, layout)
    configs = list(SearchSpace(before, graph, "cpu", mode="training").ir_configs())
    assert _lowered_matches_interpreter(before, graph, configs) >= len(configs) // 3


@pytest.mark.slow
@pytest.mark.parametrize("option", IR_OPTIONS, ids=_IDS)
def test_cpu_random_training_schedules(option: dict[str, Any]) -> None:
    """8 random training schedules (IR and schedule knobs) on the CPU backend against the float64 reference."""
    from test_cpu_training import program_workload, verify
    from test_rgcn_decomposition import _edge_cases

    from rgtune.codegen.cpu import CpuBackend

    ok, why = CpuBackend.available()
    if not ok:
        pytest.skip(f"cpu backend: {why}")
    graph = _edge_cases("forms_cpu_edge_cases", hub=600)
    w = program_workload(_program(option), graph)
    rng = random.Random(f"forms-{option}")
    verify(CpuBackend(), [("random", w, w.space.sample(rng)) for _ in range(8)])


EMULATED = [({"root_weight": False}, {}), ({"bias": False, "root_weight": False}, {"compact.src": "pair"}),
            ({"featureless": True, "num_bases": 3}, {}),
            ({"featureless": True, "num_bases": 3}, {"compact.src": "pair", "autodiff.save": "input"}),
            ({"featureless": True, "num_relations": 5}, {"scatter.mapping": "edge_parallel",
                                                         "traversal.mapping": "edge_parallel"})]


@pytest.mark.parametrize("option,cfg", EMULATED, ids=[f"{a}-{b}" for a, b in EMULATED])
def test_cuda_emulated_training_step(option: dict[str, Any], cfg: dict[str, Any]) -> None:
    """The generated CUDA training program on the CPU emulator against the float64 reference."""
    from test_cuda_training import _edge_case_graph, _needs_cxx, emulated_training_step

    _needs_cxx()
    g = _edge_case_graph()
    program = _program(option, 12, 12)
    space = SearchSpace(program, g, "cuda", mode="training")
    emulated_training_step(space, g, cfg, (program.in_dim, 12), f"rgcn {option} {cfg}")


@pytest.mark.slow
def test_cuda_training_programs_compile_with_nvrtc() -> None:
    """Every 4th IR configuration's training program and 4 random training schedules of each option, compiled."""
    from _nvrtc_ledger import Ledger
    from test_cuda_training import _OK, _WHY, _valid_point

    from rgtune.codegen.cuda.generate import generate
    from rgtune.data.synthetic import random_graph

    if not _OK:
        pytest.skip(f"NVRTC unavailable: {_WHY}")
    graph = random_graph((50, 80, 30), num_relations=6, num_edges=800, seed=0)
    ledger = Ledger()
    for option in IR_OPTIONS:
        space = SearchSpace(_program(option, 16, 16), graph, "cuda", mode="training")
        programs = [generate(p.kernels, p.config) for p in
                    (_valid_point(space, cfg) for cfg in list(space.ir_configs())[::4])]
        rng = random.Random(f"nvrtc-{option}")
        for _ in range(4):
            cfg = space.sample(rng)
            programs.append(generate(space.compile(cfg).kernels, cfg))
        problems = ledger.compile(f"rgcn {option}", programs)
        assert not problems, "\n".join(problems[:5])
