"""rgtune.codegen.cpu.memory: big kernel buffers come back to the pool only when torch lets go of their
memory, are reused (no new mapping, so no page faults) for the next batch, and the pool holds at most its
peak; a layer's training steps over new batches reuse its buffers."""

from __future__ import annotations

import gc

import torch

from rgtune.codegen.cpu.memory import POOL, BufferPool
from rgtune.data.sampling import NeighborSampler
from rgtune.data.synthetic import random_graph
from rgtune.runtime import Layer


def test_a_block_returns_when_its_last_view_dies_and_is_reused_zeroed_as_asked():
    pool = BufferPool(min_bytes=1024)
    t = pool.tensor((64, 100))
    address = t.data_ptr()
    t.fill_(7.0)
    view = t[10:]  # autograd's saved tensors, .grad, a user's slice: anything sharing the memory
    del t
    gc.collect()
    other = pool.tensor((64, 100))
    assert other.data_ptr() != address  # still in use through the view
    del view, other
    gc.collect()
    again = pool.tensor((64, 90), zero=True)
    assert again.data_ptr() == address
    assert pool.stats()["hits"] == 1 and float(again.abs().sum()) == 0.0


def test_small_buffers_and_other_dtypes_come_from_torch():
    pool = BufferPool(min_bytes=1 << 20)
    small = pool.tensor((10, 10))
    assert small.shape == (10, 10) and pool.stats()["misses"] == 0
    assert pool.tensor((10,), torch.float16).dtype == torch.float16


def test_the_pool_never_holds_more_free_memory_than_its_peak_in_use():
    pool = BufferPool(min_bytes=1024)
    for size in (1000, 5000, 20000, 3000, 40000, 1000):
        held = [pool.tensor((size,)) for _ in range(3)]
        del held
        gc.collect()
        s = pool.stats()
        assert s["in_use_bytes"] == 0 and s["free_bytes"] <= s["peak_bytes"]


def test_training_steps_on_new_batches_reuse_the_pooled_buffers():
    graph = random_graph((3000, 4000, 2000), num_relations=5, num_edges=60000, seed=1)
    layer = Layer("rgcn", graph, 64, 64, backend="cpu", mode="training")
    sampler = NeighborSampler(graph, [10])
    gen = torch.Generator().manual_seed(0)
    misses = []
    for step in range(6):
        block = sampler.sample({graph.ntypes[0]: torch.randperm(3000, generator=gen)[:1500]}, gen).blocks[0]
        x = torch.randn(block.num_nodes(), 64, requires_grad=True)
        layer(x, block).square().mean().backward()
        del x
        gc.collect()
        misses.append(POOL.stats()["misses"])
    # the first steps map what the pool lacks; later batches (of similar sizes) find their blocks
    assert misses[-1] == misses[-3], misses
    assert POOL.stats()["hits"] > 0
