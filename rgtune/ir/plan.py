"""The lowering plan: what the passes decided that lowering reads, as one frozen value.

A pass rewrites the program (:meth:`~rgtune.ir.passes.base.Pass.apply`) and records in a
:class:`LoweringPlan` what lowering must do that the program does not say (:meth:`Pass.plan
<rgtune.ir.passes.base.Pass.plan>`): the edge order and index width of the kernels, how an edge
finds its pair's row, which softmax-aggregations and GEMM epilogues fuse, whether a backward's
shared reductions get a buffer. Each field is one knob's value: its default is the knob's declared
default, next to the code the knob changes, so a field and its knob cannot disagree.

Example:
    >>> plan = plan_lowering({"layout.edges": "coo_rel_dst", "compact.pair_index": "bsearch"})
    >>> plan.layout, plan.pair_index, plan.index_bits  # nothing is per pair: the pair index is not read
    ('coo_rel_dst', 'direct', 32)
    >>> plan_lowering({"compact.src": "pair", "compact.pair_index": "bsearch"}).pair_index
    'bsearch'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rgtune.ir.autodiff import REUSE
from rgtune.ir.passes.base import Knob, registered_passes
from rgtune.ir.passes.compact import PAIR_INDEX
from rgtune.ir.passes.fusion import EPILOGUE, SOFTMAX
from rgtune.ir.passes.layout import EDGE_ORDER, INDEX_BITS
from rgtune.ir.passes.precision import EDGE_STORAGE, NODE_STORAGE

__all__ = ["LoweringPlan", "plan_lowering"]


def _knob(knob: Knob) -> Any:
    """A plan field holding ``knob``'s value (its default the knob's)."""
    return field(default=knob.default, metadata={"knob": knob})


@dataclass(frozen=True)
class LoweringPlan:
    """What lowering does beyond what the program says (see the module docstring)."""

    layout: str = _knob(EDGE_ORDER)  #: edge order of every per-edge buffer and traversal
    index_bits: int = _knob(INDEX_BITS)  #: width of the kernels' index arrays
    pair_index: str = _knob(PAIR_INDEX)  #: how an edge finds its pair's row (when some value is per pair)
    softmax_fusion: str = _knob(SOFTMAX)  #: which softmax-aggregations share a traversal
    epilogue: str = _knob(EPILOGUE)  #: inner products in their GEMM's epilogue
    reuse: str = _knob(REUSE)  #: a backward's shared reductions: inlined in each reader, or stored once
    edge_storage: str = _knob(EDGE_STORAGE)  #: storage type of the per-edge and per-pair intermediates
    node_storage: str = _knob(NODE_STORAGE)  #: storage type of the per-node intermediates
    #: not a knob but the workload's shape: the program runs on mini-batches (:class:`~rgtune.data.batch.Batch`),
    #: where only the first ``num_dst_nodes`` nodes' outputs are wanted, and the node values only they need
    #: are computed for those rows alone (:data:`~rgtune.ir.kernels.DST_NODE`). Such a program is right on
    #: a whole graph too (every node a destination), at the cost of its guarded loads
    destinations: bool = False


def plan_lowering(config: Mapping[str, Any], training: bool = False, destinations: bool = False) -> LoweringPlan:
    """The plan of a knob configuration (a full one, or a partial one: missing knobs at their defaults):
    every registered pass's decisions, then, for a training program (``training``), the adjoint's;
    ``destinations``: for mini-batches (:attr:`LoweringPlan.destinations`)."""
    plan = LoweringPlan(destinations=destinations)
    for p in registered_passes():
        plan = p.plan(plan, config)
    if training:
        from rgtune.ir.autodiff import plan_backward

        plan = plan_backward(plan, config)
    return plan
