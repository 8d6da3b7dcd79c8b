"""Mini-batches: a layer on a sampled block computes what it computes on the whole graph at those rows.

A block with every in-edge of its destinations (fan-out -1) gives each destination exactly its
full-graph output, and a loss on the destinations gives the same parameter gradients and, at each
source, the same input gradient: the oracle here is the same layer on the whole graph. The sampler's
draws are checked for what they promise (real edges, at most ``fanout`` per destination and relation,
all of them when fewer, no repeats, blocks that chain, the same batches for the same seed).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rgtune.data import HeteroGraph
from rgtune.data.batch import Batch, BatchTypeError
from rgtune.data.sampling import NeighborLoader, NeighborSampler
from rgtune.data.synthetic import random_graph
from rgtune.runtime import Layer

MODELS = [("rgcn", 1), ("rgat", 2), ("hgt", 2), ("film", 1)]


@pytest.fixture(scope="module")
def graph() -> HeteroGraph:
    return random_graph((60, 90, 30), num_relations=5, num_edges=1500, seed=3)


def _seeds(g: HeteroGraph, t: int, n: int) -> dict[str, torch.Tensor]:
    return {g.ntypes[t]: torch.arange(n)}


@pytest.mark.parametrize("model,heads", MODELS)
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_full_block_gives_each_destination_its_whole_graph_output_and_gradients(graph: HeteroGraph, model: str,
                                                                                  heads: int, backend: str) -> None:
    torch.manual_seed(0)
    layer = Layer(model, graph, 8, 8, heads, backend=backend, mode="training")
    mb = NeighborSampler(graph, [-1]).sample({graph.ntypes[1]: torch.tensor([5, 0, 17, 3])})
    (block,) = mb.blocks
    x = torch.randn(graph.num_nodes(), 8)
    per_type = graph.split_nodes(x)
    weight = torch.randn(block.num_dst_nodes, 8)
    # the whole graph: the loss on the seeds' rows
    xf = {t: v.clone().requires_grad_(True) for t, v in per_type.items()}
    out = layer(xf)
    seeds = {t: mb.seeds.get(t, torch.zeros(0, dtype=torch.int64)) for t in graph.ntypes}
    full_rows = torch.cat([out[t][seeds[t]] for t in graph.ntypes])
    (full_rows * weight).sum().backward()
    full_grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    # the block: its sources' inputs (destinations first), its destinations' outputs
    xb = {t: per_type[t][mb.input_nodes[t]].clone().requires_grad_(True) for t in graph.ntypes}
    got = layer(xb, block)
    rows = torch.cat([got[t] for t in graph.ntypes])
    assert torch.allclose(rows, full_rows.detach(), atol=1e-5)
    (rows * weight).sum().backward()
    for name, p in layer.named_parameters():
        assert torch.allclose(p.grad, full_grads[name], atol=1e-4), name
    for t in graph.ntypes:
        assert torch.allclose(xb[t].grad, xf[t].grad[mb.input_nodes[t]], atol=1e-5), t


@pytest.mark.parametrize("model,heads", [("rgcn", 1), ("hgt", 2)])
def test_an_input_that_needs_no_gradient_runs_the_program_of_the_params_gradients(graph: HeteroGraph, model: str,
                                                                                 heads: int) -> None:
    """A first layer's features need no gradient: the layer's backward then computes the params' gradients
    alone (fewer kernels), the same as with the input's."""
    torch.manual_seed(2)
    layer = Layer(model, graph, 8, 8, heads, backend="cpu", mode="training")
    block = NeighborSampler(graph, [4]).sample(_seeds(graph, 1, 20), torch.Generator().manual_seed(0)).blocks[0]
    for where in (block, None):
        rows = block.num_nodes() if where is not None else graph.num_nodes()
        x = torch.randn(rows, 8)
        grads = []
        for needs in (True, False):
            layer.zero_grad()
            xi = x.clone().requires_grad_(needs)
            out = layer(xi, where) if where is not None else layer(xi)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            assert (xi.grad is not None) == needs
            grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
        for name in grads[0]:
            assert torch.allclose(grads[1][name], grads[0][name], atol=1e-6), name
        built = (layer._runner_for(where) if where is not None else layer._runner).built
        full, params_only = built[("training", True)][0], built[("training", False)][0]
        assert params_only.input_grad is None and len(params_only.kernels) < len(full.kernels)


@pytest.mark.parametrize("model,heads", [("rgcn", 1), ("hgt", 2)])
def test_two_layers_on_sampled_blocks_train_and_match_the_reference_backend(graph: HeteroGraph, model: str,
                                                                            heads: int) -> None:
    """Sampled blocks (fan-outs 4 and 3) through two layers, cpu against the torch executor: same outputs
    and gradients, every step a new batch."""
    torch.manual_seed(1)
    layers = {be: [Layer(model, graph, 8, 8, heads, backend=be, mode="training") for _ in range(2)]
              for be in ("reference", "cpu")}
    for a, b in zip(layers["reference"], layers["cpu"]):
        b.load_state_dict(a.state_dict())
    feats = torch.randn(graph.num_nodes(), 8)
    per_type = graph.split_nodes(feats)
    loader = NeighborLoader(graph, [4, 3], _seeds(graph, 0, 30), batch_size=10, seed=5)
    steps = 0
    for mb in loader:
        results = {}
        for be, (l1, l2) in layers.items():
            h = l1({t: per_type[t][mb.input_nodes[t]] for t in graph.ntypes}, mb.blocks[0])
            out = l2({t: torch.relu(v) for t, v in h.items()}, mb.blocks[1])
            loss = out[graph.ntypes[0]].square().mean()
            loss.backward()
            results[be] = (loss.item(), [p.grad.clone() for layer in (l1, l2) for p in layer.parameters()])
            for layer in (l1, l2):
                layer.zero_grad()
        assert results["cpu"][0] == pytest.approx(results["reference"][0], rel=1e-4)
        for g_cpu, g_ref in zip(results["cpu"][1], results["reference"][1]):
            assert torch.allclose(g_cpu, g_ref, atol=1e-4)
        steps += 1
    assert steps == 3


def test_the_sampler_draws_real_edges_at_most_fanout_per_destination_and_relation(graph: HeteroGraph) -> None:
    sampler = NeighborSampler(graph, [3])
    seeds = {t: torch.arange(graph.num_nodes(t)) for t in graph.ntypes}
    (block,) = sampler.sample(seeds, torch.Generator().manual_seed(0)).blocks
    nodes = sampler.sample(seeds, torch.Generator().manual_seed(0)).input_nodes
    real = {c: set(zip(*(v.tolist() for v in graph.edges(c)))) for c in graph.canonical_etypes}
    src_g, dst_g = block.src, block.dst
    for r, c in enumerate(graph.canonical_etypes):
        lo, hi = int(block.rel_offsets[r]), int(block.rel_offsets[r + 1])
        s_local = _local(block, c[0], src_g[lo:hi])
        d_local = _local(block, c[2], dst_g[lo:hi])
        s_ids, d_ids = nodes[c[0]][s_local], nodes[c[2]][d_local]
        pairs = list(zip(s_ids.tolist(), d_ids.tolist()))
        assert set(pairs) <= real[c] and len(set(pairs)) <= len(pairs)
        indeg = torch.bincount(graph.edges(c)[1], minlength=graph.num_nodes(c[2]))
        got = torch.bincount(d_ids, minlength=graph.num_nodes(c[2]))
        assert torch.equal(got, torch.clamp(indeg, max=3))  # all of them when fewer than the fan-out
        # no edge drawn twice (a multigraph's parallel edges are distinct edges, so count positions)
        assert len(pairs) == int(got.sum())


def _local(block: Batch, ntype: str, global_ids: torch.Tensor) -> torch.Tensor:
    """The per-type ids of ``global_ids`` (all of one type) in ``block``."""
    positions = block.src_positions(ntype)
    inverse = torch.full((block.num_nodes(),), -1, dtype=torch.int64)
    inverse[positions] = torch.arange(positions.numel())
    out = inverse[global_ids]
    assert bool((out >= 0).all())
    return out


@pytest.mark.parametrize("fanout", [1, 2])
def test_the_sampler_emits_each_relations_edges_by_destination(graph: HeteroGraph, fanout: int) -> None:
    # taken whole, sampled from a few, or from many: every kind of (destination, relation) group, whose
    # edges must still come by relation, then destination (binding a batch counts on it)
    seeds = {t: torch.arange(graph.num_nodes(t)) for t in graph.ntypes}
    for block in NeighborSampler(graph, [fanout, fanout]).sample(seeds, torch.Generator().manual_seed(3)).blocks:
        key = block.etype * block.num_nodes() + block.dst
        assert bool((key[1:] >= key[:-1]).all())


def test_the_same_seed_gives_the_same_batches_and_another_epoch_others(graph: HeteroGraph) -> None:
    def edges(loader: NeighborLoader) -> list[Any]:
        return [tuple(b.src.tolist() + b.dst.tolist()) for mb in loader for b in mb.blocks]

    a, b = (NeighborLoader(graph, [5, 5], _seeds(graph, 1, 40), batch_size=16, seed=9) for _ in range(2))
    first = edges(a)
    assert first == edges(b)
    assert first != edges(a)  # the second epoch


def test_a_batch_with_a_type_the_layer_does_not_know_is_refused(graph: HeteroGraph) -> None:
    with pytest.raises(BatchTypeError, match=r"node types \['author'\] that the layer was not made for"):
        Batch(graph.ntypes, graph.canonical_etypes, num_src={"author": 1}, num_dst={}, edges={})
    other = random_graph((10, 10), num_relations=2, num_edges=40, seed=0)
    block = NeighborSampler(other, [2]).sample({other.ntypes[0]: torch.arange(3)}).blocks[0]
    layer = Layer("rgcn", graph, 4, 4)
    with pytest.raises(BatchTypeError, match="has other node or edge types"):
        layer({t: torch.randn(block.num_src[t], 4) for t in other.ntypes}, block)


def test_empty_relations_and_types_cost_nothing_and_work(graph: HeteroGraph) -> None:
    """A batch of one destination type whose sampled edges cover one relation: the others are empty."""
    c = graph.canonical_etypes[0]
    block = NeighborSampler(graph, [{c: 2}]).sample({c[2]: torch.arange(4)}).blocks[0]
    assert block.num_edges() == int((block.rel_offsets[1] - block.rel_offsets[0]))
    for model, heads in MODELS:
        layer = Layer(model, graph, 4, 4, heads, backend="cpu")
        x = {t: torch.randn(block.num_src[t], 4) for t in graph.ntypes}
        out = layer(x, block)
        assert {t: tuple(v.shape) for t, v in out.items()} == {t: (block.num_dst[t], 4) for t in graph.ntypes}


def _arrays_by_sorting(b: Batch, layout: str) -> dict[str, torch.Tensor]:
    """The oracle of a batch's index arrays: comparison sorts and ``torch.unique`` of int64 keys, no shortcut
    (the fast paths assume the sampler's edge order, or count pairs densely)."""
    n, r = b.num_nodes(), b.num_rels
    src, dst, rel = b.src, b.dst, b.etype
    if layout == "csr_dst":
        eid = torch.sort(dst * r + rel, stable=True).indices
        rel_order = torch.sort(rel[eid], stable=True).indices
    else:
        eid = torch.sort(rel * n + (dst if layout == "coo_rel_dst" else src), stable=True).indices
        rel_order = torch.arange(b.num_edges())
    out = {"e_src": src[eid], "e_dst": dst[eid], "e_rel": rel[eid], "e_eid": eid, "e_rel_order": rel_order}
    for side, node in (("sp", src), ("dp", dst)):
        keys, inverse = torch.unique(rel * n + node, return_inverse=True)
        out.update({f"{side}_node": keys % n, f"{side}_rel": keys // n, f"e_{side}": inverse[eid],
                    f"{side}_offsets": torch.searchsorted(keys // n, torch.arange(r + 1))})
    return out


@pytest.mark.parametrize("layout", ["csr_dst", "coo_rel_dst", "coo_rel_src"])
@pytest.mark.parametrize("order", ["sampled", "shuffled"])
def test_a_batch_index_arrays_are_those_of_sorting_its_edges(graph: HeteroGraph, layout: str, order: str) -> None:
    """The sampler's batches take the fast paths (edges by relation, then destination); a batch built from
    edges in another order takes the general one; both give what sorting the edges gives."""
    from rgtune.ir.bind import graph_arrays

    block = NeighborSampler(graph, [5]).sample(_seeds(graph, 1, 40), torch.Generator().manual_seed(2)).blocks[0]
    if order == "shuffled":  # the same edges, each relation's in a random order
        g = torch.Generator().manual_seed(3)
        edges = {}
        for r, c in enumerate(graph.canonical_etypes):
            lo, hi = int(block.rel_offsets[r]), int(block.rel_offsets[r + 1])
            perm = torch.randperm(hi - lo, generator=g) + lo
            edges[c] = (_local(block, c[0], block.src[perm]), _local(block, c[2], block.dst[perm]))
        block = Batch(graph.ntypes, graph.canonical_etypes, num_src=block.num_src, num_dst=block.num_dst, edges=edges)
        key = block.etype * block.num_nodes() + block.dst
        assert not bool((key[1:] >= key[:-1]).all())  # the general path, then
    a = graph_arrays(block, layout, 64)
    for name, want in _arrays_by_sorting(block, layout).items():
        assert torch.equal(getattr(a, name).long(), want), name


@pytest.mark.parametrize("first, then", [(32, 64), (64, 32)])
def test_a_batchs_arrays_in_another_width_build_their_own_source_pairs(graph: HeteroGraph, first: int, then: int) -> None:
    """The (source, relation) pairs are built on first use; arrays cast to another width before that build
    theirs in their own width (a 64-bit program once read a copy's 32-bit pairs: a segfault on ogbn-mag batches)."""
    from rgtune.ir.bind import SRC_PAIR_FIELDS, graph_arrays

    block = NeighborSampler(graph, [5]).sample(_seeds(graph, 1, 40), torch.Generator().manual_seed(2)).blocks[0]
    graph_arrays(block, "coo_rel_src", first)  # its pairs not read yet
    a = graph_arrays(block, "coo_rel_src", then)
    want = _arrays_by_sorting(block, "coo_rel_src")
    for name in SRC_PAIR_FIELDS:
        got = getattr(a, name)
        assert got.dtype == (torch.int32 if then == 32 else torch.int64), name
        assert torch.equal(got.long(), want[name]), name
    assert all(getattr(graph_arrays(block, "coo_rel_src", first), n).dtype ==
               (torch.int32 if first == 32 else torch.int64) for n in SRC_PAIR_FIELDS)
