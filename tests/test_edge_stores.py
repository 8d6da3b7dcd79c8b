"""Per-edge stores merged into one traversal (``autodiff.reuse=fuse``, :mod:`rgtune.ir.edge_stores`).

* RGAT's softmax backward becomes one traversal (19 kernels -> 15): the destination sum
  ``s[dst] += alpha * <dout, m>``, then the four edge gradients that read ``s@dst`` and compute the
  attention score's gradient once (three reduction loops in their C, not twelve), moving fewer bytes;
  HGT's edge gradients of one shape merge too, and its score gradient joins its destination sum.
* The merged programs compute what the separate ones do: the float64 reference of the separate program is
  the oracle for the merged one on the reference backend, the CPU backend and the CUDA emulator, on
  both traversal mappings (NVRTC compiles each where it is installed).
* The merge's rules on hand-written kernel lists: a store hoisted over kernels that do not touch what it
  reads or writes, delayed when hoisting is not allowed, left alone when neither is, never across the
  forward/backward boundary, between shapes, or over a fold that writes a param it reads; a sum into
  destinations fused with the stores after it that read it at their destination, and only those.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rgtune.codegen.base import create
from rgtune.codegen.cpu.generate import generate as generate_c
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.codegen.training import learnable_grads, train_step
from rgtune.data.synthetic import random_graph
from rgtune.ir.counts import count
from rgtune.ir.edge_stores import merge_edge_stores
from rgtune.ir.kernels import (AggregateStage, AggregateStores, BinaryE, EdgeStore, EdgeStores, GemmKernel, Kernel,
                               Load, ParamLoad, TraversalKernel, WeightKernel)
from rgtune.ir.models import build_model, rgat
from rgtune.search_spaces import SearchSpace

GRAPH = random_graph((12, 20), num_relations=3, num_edges=240, seed=3)
N = GRAPH.num_nodes()


def _space(model: str, backend: str = "cpu") -> SearchSpace:
    """``rgat_relation``: RGAT with a softmax per (destination, relation), whose backward sums into
    destination pairs."""
    program = rgat(16, 16, 2, softmax="relation") if model == "rgat_relation" else \
        build_model(model, 16, 16, 2 if model == "hgt" else 1)
    return SearchSpace(program, GRAPH, backend, mode="training")


def _merged(kernels: list[Kernel]) -> list[TraversalKernel]:
    return [k for k in kernels if isinstance(k, TraversalKernel) and isinstance(k.stage, (EdgeStores, AggregateStores))]


def test_rgats_softmax_backward_is_one_traversal() -> None:
    space = _space("rgat")
    separate = space.compile(space.default()).kernels
    fused = space.compile({**space.default(), "autodiff.reuse": "fuse"})
    merged = fused.kernels
    assert len(separate.kernels) - len(merged.kernels) == 4
    (one,) = _merged(merged.kernels)
    assert isinstance(one.stage, AggregateStores)
    backward = [k for k in separate.kernels[separate.forward_kernels:] if isinstance(k, TraversalKernel)]
    grads = {k.stage.out for k in backward if isinstance(k.stage, EdgeStore)}
    (total,) = [k.stage.out for k in backward if isinstance(k.stage, AggregateStage) and k.stage.out_via == "dst"
                and any(k.stage.out in s.reads() for s in backward if isinstance(s.stage, EdgeStore))]
    # the softmax backward's destination sum, then the four edge gradients that read it at their destination
    assert one.stage.total.out == total and {s.out for s in one.stage.stores} == grads and len(grads) == 4
    assert merged.forward_kernels == separate.forward_kernels  # the forward's one edge map stays alone
    # the relation softmax's sum into destination pairs joins its stores the same way
    rspace = _space("rgat_relation")
    relation = rspace.compile({**rspace.default(), "autodiff.reuse": "fuse"}).kernels
    (pairs,) = _merged(relation.kernels)
    assert isinstance(pairs.stage, AggregateStores) and pairs.stage.total.out_via == "dst_pair"
    assert len(pairs.stage.stores) == 4 and len(relation.kernels) == len(merged.kernels)
    # the sum's walk reduces one feature sum; the stores' walk the score's gradient and its two inner
    # products once per edge, not once per store
    (src,) = [s for s in generate_c(merged, fused.config).kernels if s.kernel == one.name]
    assert src.text.count("reduction(+:") == 1 + 3
    cs, cm = count(separate, GRAPH), count(merged, GRAPH)
    assert cm["kernels"] == cs["kernels"] - 4 and cm["bytes_min"] < cs["bytes_min"] and cm["flops"] < cs["flops"]


@pytest.mark.parametrize("model", ["rgat", "rgat_relation", "hgt"])
@pytest.mark.parametrize("mapping", ["dst_parallel", "edge_parallel"])
def test_merged_stores_compute_what_the_separate_ones_do(model: str, mapping: str) -> None:
    space = _space(model)
    base = {**space.default(), "traversal.mapping": mapping}
    separate, merged = space.compile(base), space.compile({**base, "autodiff.reuse": "fuse"})
    assert separate.valid and merged.valid, (separate.problems, merged.problems)
    assert _merged(merged.kernels.kernels), f"{model}: nothing merged"
    params = init_params(separate.kernels, GRAPH, dtype=torch.float64, seed=1)
    x, dout = torch.randn(N, 16, dtype=torch.float64), torch.randn(N, 16, dtype=torch.float64)
    want = train_step(create("reference").build(separate.kernels, GRAPH, separate.config), separate.kernels, GRAPH,
                      x, params, dout)
    same = train_step(create("reference").build(merged.kernels, GRAPH, merged.config), merged.kernels, GRAPH,
                      x, params, dout)
    _close(same, want, 1e-12, "reference")
    f32 = {k: v.float() for k, v in params.items()}
    cpu = train_step(create("cpu").build(merged.kernels, GRAPH, merged.config), merged.kernels, GRAPH,
                     x.float(), f32, dout.float())
    _close(cpu, want, 1e-4, "cpu")


@pytest.mark.parametrize("model", ["rgat", "rgat_relation", "hgt"])
def test_merged_stores_on_the_cuda_emulator_and_nvrtc(model: str) -> None:
    from rgtune.codegen.cuda.backend import CudaBackend
    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate

    assert find_cxx() is not None, "the CUDA emulator needs a C++ compiler"
    space = _space(model, "cuda")
    params = init_params(space.compile(space.default()).kernels, GRAPH, dtype=torch.float64, seed=2)
    x, dout = torch.randn(N, 16, dtype=torch.float64), torch.randn(N, 16, dtype=torch.float64)
    f32 = {k: v.float() for k, v in params.items()}
    for extra in ({}, {"traversal.mapping": "edge_parallel"}):
        point = space.compile({**space.default(), **extra, "autodiff.reuse": "fuse"})
        assert point.valid, point.problems
        kp = point.kernels
        assert _merged(kp.kernels)
        want = ReferenceExecutor(kp, GRAPH).run_training(x, params, dout)
        out, dx, grads = EmulatedProgram(kp, generate(kp, point.config).units, GRAPH).run_training(
            x.float(), f32, dout.float())
        _close((out, dx, learnable_grads(kp, GRAPH, f32, grads)), (want[0], want[1], learnable_grads(
            kp, GRAPH, params, want[2])), 1e-4, f"emulator {extra}")
        ok, why = CudaBackend.compile_available()
        if ok:
            assert CudaBackend().compile_only(kp, point.config, archs=("sm_90",)).cubins


def _close(got: Any, want: Any, tol: float, what: str) -> None:
    out, dx, grads = got
    assert torch.allclose(out.double(), want[0], atol=tol, rtol=tol), what
    assert torch.allclose(dx.double(), want[1], atol=tol, rtol=tol), what
    assert sorted(grads) == sorted(want[2]), what
    for name, g in want[2].items():
        assert torch.allclose(grads[name].double(), g, atol=tol, rtol=tol), (what, name)


# ----------------------------------------------------------------------------- the rules
SHAPES = {b: (1, 4) for b in ("a", "b", "c", "d", "y", "z")} | {"s": (1, 1)}


def _store(name: str, out: str, *reads: str, param: str | None = None) -> TraversalKernel:
    value: Any = Load(1, 4, reads[0], "row")
    for r in reads[1:]:
        value = BinaryE(1, 4, "mul", value, Load(1, 4, r, "row"))
    if param:
        value = BinaryE(1, 4, "mul", value, ParamLoad(1, 4, param, "rel"))
    return TraversalKernel(name, EdgeStore(out, value), "csr_dst")


def _gemm(name: str, x: str, out: str) -> GemmKernel:
    return GemmKernel(name, rows="edge", x=x, x_via="row", weight="w", bias=None, by="rel", weight_end=None,
                      per_head=False, in_heads=1, in_dim=4, out_heads=1, out_dim=4, out=out, out_via="row",
                      accumulate=False, epilogue=[])


def _names(ks: list[Kernel]) -> list[str]:
    def mark(k: Kernel) -> str:
        st = getattr(k, "stage", None)
        return "*" if isinstance(st, EdgeStores) else "+" if isinstance(st, AggregateStores) else ""
    return [k.name + mark(k) for k in ks]


def _sum(name: str, out: str, *reads: str) -> TraversalKernel:
    """``out[dst] += product of reads@row`` (a per-head value, as a softmax backward's)."""
    value: Any = Load(1, 1, reads[0], "row")
    for r in reads[1:]:
        value = BinaryE(1, 1, "mul", value, Load(1, 1, r, "row"))
    return TraversalKernel(name, AggregateStage(out, "dst", value), "csr_dst")


def _reading_sum(name: str, out: str, total: str, via: str = "dst") -> TraversalKernel:
    return TraversalKernel(name, EdgeStore(out, BinaryE(1, 4, "mul", Load(1, 4, "a", "row"),
                                                        Load(1, 1, total, via))), "csr_dst")


def test_a_store_is_hoisted_over_kernels_that_do_not_touch_it() -> None:
    ks: list[Kernel] = [_store("m1", "y", "a"), _gemm("g", "y", "c"), _store("m2", "z", "a", "b")]
    out, split = merge_edge_stores(ks, None, SHAPES)
    assert _names(out) == ["m1*", "g"] and split is None
    assert out[0].writes() == {"y", "z"}


def test_a_store_is_delayed_when_it_cannot_be_hoisted() -> None:
    # m2 reads c, which g writes: m2 cannot move up; m1 can move down (g does not read y)
    ks: list[Kernel] = [_store("m1", "y", "a"), _gemm("g", "b", "c"), _store("m2", "z", "c")]
    out, _ = merge_edge_stores(ks, None, SHAPES)
    assert _names(out) == ["g", "m1*"]


def test_stores_that_cannot_move_stay_apart() -> None:
    # g reads y (m1's) and writes c (m2's input): neither store may pass it
    ks: list[Kernel] = [_store("m1", "y", "a"), _gemm("g", "y", "c"), _store("m2", "z", "c")]
    assert _names(merge_edge_stores(ks, None, SHAPES)[0]) == ["m1", "g", "m2"]
    # one reads the other's output
    ks = [_store("m1", "y", "a"), _store("m2", "z", "y")]
    assert _names(merge_edge_stores(ks, None, SHAPES)[0]) == ["m1", "m2"]
    # another shape
    ks = [_store("m1", "y", "a"), _store("m2", "s", "a")]
    assert _names(merge_edge_stores(ks, None, SHAPES)[0]) == ["m1", "m2"]
    # the forward's and the backward's
    ks = [_store("m1", "y", "a"), _store("m2", "z", "b")]
    assert _names(merge_edge_stores(ks, 1, SHAPES)[0]) == ["m1", "m2"]
    # a fold writes the param the later store reads, and the earlier store's output is read by the GEMM after it
    ks = [_store("m1", "y", "a"), WeightKernel("f", "wt", "transpose", "w"), _gemm("g", "y", "c"),
          _store("m2", "z", "b", param="wt")]
    assert _names(merge_edge_stores(ks, None, SHAPES)[0]) == ["m1", "f", "g", "m2"]


def test_merging_in_the_forward_keeps_the_phase_boundary() -> None:
    ks: list[Kernel] = [_store("m1", "y", "a"), _store("m2", "z", "a"), _gemm("g", "y", "c"), _store("m3", "d", "c")]
    out, split = merge_edge_stores(ks, 3, SHAPES)
    assert _names(out) == ["m1*", "g", "m3"] and split == 2


SUM_SHAPES = SHAPES | {"t": (1, 1), "u": (1, 1)}


def test_a_sum_and_the_stores_reading_it_at_the_destination_are_one_traversal() -> None:
    ks: list[Kernel] = [_sum("s1", "t", "u"), _gemm("g", "b", "c"), _reading_sum("m1", "y", "t"),
                        _reading_sum("m2", "z", "t")]
    out, split = merge_edge_stores(ks, None, SUM_SHAPES)
    assert _names(out) == ["s1+", "g"] and split is None  # the two stores merged, then hoisted next to the sum
    assert out[0].writes() == {"t", "y", "z"}
    # delayed when the stores cannot move up: g writes what they read
    ks = [_sum("s1", "t", "u"), _gemm("g", "b", "a"), _reading_sum("m1", "y", "t")]
    assert _names(merge_edge_stores(ks, None, SUM_SHAPES)[0]) == ["g", "s1+"]


def test_a_sum_stays_apart_from_stores_it_cannot_serve() -> None:
    # read at the source: another destination's sum, not finished when the edge is stored
    ks: list[Kernel] = [_sum("s1", "t", "u"), _reading_sum("m1", "y", "t", via="src")]
    assert _names(merge_edge_stores(ks, None, SUM_SHAPES)[0]) == ["s1", "m1"]
    # a second sum into the same row between: the stores are fused with the last sum (whose total they read)
    ks = [_sum("s1", "t", "u"), _sum("s2", "t", "t"), _reading_sum("m1", "y", "t")]
    assert _names(merge_edge_stores(ks, None, SUM_SHAPES)[0]) == ["s1", "s2+"]
    # the forward's sum and the backward's stores
    ks = [_sum("s1", "t", "u"), _reading_sum("m1", "y", "t")]
    assert _names(merge_edge_stores(ks, 1, SUM_SHAPES)[0]) == ["s1", "m1"]
    # a store that does not read the sum
    ks = [_sum("s1", "t", "u"), _store("m1", "y", "a")]
    assert _names(merge_edge_stores(ks, None, SUM_SHAPES)[0]) == ["s1", "m1"]
