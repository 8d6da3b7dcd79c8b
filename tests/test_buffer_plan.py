"""rgtune.codegen.buffer_plan: buffers with disjoint live intervals share slots; the cpu runtime's
planned workspace is smaller than one buffer each and computes the same numbers."""

from __future__ import annotations

import random

import torch

from rgtune.codegen.buffer_plan import plan_slots


def test_overlapping_intervals_never_share_a_slot_and_slots_fit_their_buffers():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 30)
        intervals, sizes = {}, {}
        for i in range(n):
            a = rng.randint(0, 20)
            intervals[f"b{i}"] = (a, a + rng.randint(0, 5))
            sizes[f"b{i}"] = rng.randint(1, 1000)
        slot_of, slot_sizes = plan_slots(intervals, sizes)
        for x in intervals:
            assert slot_sizes[slot_of[x]] >= sizes[x]
            for y in intervals:
                if x < y and slot_of[x] == slot_of[y]:
                    (a0, a1), (b0, b1) = intervals[x], intervals[y]
                    assert a1 < b0 or b1 < a0, (x, y)
        # never more slots than the most buffers live at once
        most = max(sum(1 for a, b in intervals.values() if a <= t <= b) for t in range(26))
        assert len(slot_sizes) == most


def test_a_training_programs_workspace_is_shared_between_its_phases():
    from rgtune.codegen.cpu import CpuBackend
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.data.synthetic import random_graph
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = random_graph((40, 30), num_relations=4, num_edges=600, seed=1)
    kp = compile_program(build_model("hgt", 8, 8, 2), {}, g, training=True).kernels
    built = CpuBackend().build(kp, g, {})
    runtime = built.run_fn.__self__  # the CpuRuntime
    params = init_params(kp, g, seed=0)
    x, dout = torch.randn(g.num_nodes(), 8), torch.randn(g.num_nodes(), 8)
    for _ in range(2):  # the second call reuses the workspace the first one left dirty
        out, dx, grads = built.run_training(x, params, dout)
    ref = ReferenceExecutor(kp, g).run_training(x.double(), {k: v.double() for k, v in params.items()}, dout.double())
    assert torch.allclose(out.double(), ref[0], atol=1e-4) and torch.allclose(dx.double(), ref[1], atol=1e-4)
    for k, v in grads.items():
        assert torch.allclose(v.double(), ref[2][k], atol=1e-4, rtol=1e-4), k
    one_each = sum(int(torch.tensor(s).prod()) for s in runtime._shapes.values()) * 4
    assert 0 < runtime.workspace_bytes < one_each
