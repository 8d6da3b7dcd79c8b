"""Accumulating into the addend (rgtune.ir.addend): the folded program computes what the unfolded one
does, on the CPU kernels, forward and training step, and holds two node buffers less."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rgtune.codegen.base import create
from rgtune.codegen.buffer_plan import footprint_bytes
from rgtune.codegen.reference import init_params
from rgtune.data.synthetic import random_graph
from rgtune.ir.addend import accumulate_into_addends
from rgtune.ir.kernels import MapKernel
from rgtune.ir.registry import build_model
from rgtune.search_spaces import SearchSpace

GRAPH = random_graph((60, 40), num_relations=3, num_edges=600, seed=1)
CONFIGS = [{"reorder.aggregate_first": "on"}, {"reorder.aggregate_first": "off"}]


def _unfolded(point):
    """The kernel program as lowering made it, before the fold (the fold is its last step)."""
    from rgtune.ir import lowering

    return lowering._Lowering(point.compiled.program, point.compiled.plan).run()


def _compiled(mode: str, config: dict = CONFIGS[0]):
    space = SearchSpace(build_model("rgcn", 8, 8), GRAPH, "cpu", mode=mode)
    point = space.compile(config)
    assert point.valid, point.problems
    return space, point


@pytest.mark.parametrize("config", CONFIGS, ids=["aggregate_first", "messages_first"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_fold_keeps_the_result_and_saves_two_node_buffers_per_sum(mode, config):
    space, point = _compiled(mode, config)
    folded, unfolded = point.kernels, _unfolded(point)
    assert not any(isinstance(k, MapKernel) and k.out == unfolded.output for k in folded.kernels)
    sums = 2 if mode == "training" else 1  # the output, and the input gradient
    assert len(folded.kernels) == len(unfolded.kernels) - sums
    if mode == "training":
        assert folded.input_grad != unfolded.input_grad
    node_buffer = GRAPH.num_nodes() * 8 * 4
    assert footprint_bytes(unfolded, GRAPH, share_slots=False) - footprint_bytes(folded, GRAPH, share_slots=False) \
        == 2 * node_buffer * sums

    backend = create("cpu")
    params = init_params(folded, GRAPH, seed=3)
    x = torch.randn(GRAPH.num_nodes(), 8, generator=torch.Generator().manual_seed(4))
    built = {name: backend.build(kp, GRAPH, point.config) for name, kp in (("folded", folded), ("unfolded", unfolded))}
    if mode == "inference":
        a, b = (built[n].run(x, params) for n in ("folded", "unfolded"))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        dout = torch.randn(GRAPH.num_nodes(), 8, generator=torch.Generator().manual_seed(5))
        (oa, dxa, ga), (ob, dxb, gb) = (built[n].run_training(x, params, dout) for n in ("folded", "unfolded"))
        torch.testing.assert_close(oa, ob, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(dxa, dxb, rtol=1e-5, atol=1e-6)
        assert ga.keys() == gb.keys()
        for k in ga:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5)


def test_no_fold_where_another_kernel_reads_an_addend():
    _, point = _compiled("inference")
    unfolded = _unfolded(point)
    assert accumulate_into_addends(unfolded).output != unfolded.output  # the form folds
    gemm1 = unfolded.kernels[0]
    # a second reader of the self-loop's rows (after the GEMM would have added into them): no fold
    reader = MapKernel("map9", "node", "v99", dataclasses.replace(
        unfolded.kernels[-1].value, b=unfolded.kernels[-1].value.a))
    assert gemm1.out in reader.reads()
    extra = dataclasses.replace(unfolded, kernels=unfolded.kernels[:-1] + [reader, unfolded.kernels[-1]],
                                buffers={**unfolded.buffers, "v99": unfolded.buffers[unfolded.output]})
    assert accumulate_into_addends(extra) is extra
