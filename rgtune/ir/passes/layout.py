"""Graph layout: how edges are ordered in memory and how wide indices are.

Knobs:

* ``layout.edges``: ``csr_dst`` (edges grouped by destination, each destination's in-edges
  grouped by relation), ``coo_rel_dst`` (segmented by relation, sorted by destination
  inside), ``coo_rel_src`` (segmented by relation, sorted by source inside). Per-edge
  buffers are stored in this order.
* ``layout.index_bits``: 32- or 64-bit node/edge indices in the kernels. 32 is offered only
  while the node and edge counts fit with a margin (:data:`rgtune.ir.bind.INDEX32_MAX_COUNT`:
  idx_t loop counters step past their end); on a larger graph the knob has the one choice 64.
  Feature widths do not matter: the kernels widen every index to 64 bits before multiplying
  it by a row width, so a per-edge buffer of more than 2**31 elements (ogbn-mag with reverse
  relations at 64 features) still uses 32-bit index arrays.

Example:
    >>> from types import SimpleNamespace
    >>> def bits(nodes, edges):
    ...     g = SimpleNamespace(num_nodes=lambda: nodes, num_edges=lambda: edges)
    ...     return LayoutPass().knobs(None, g)[1].choices
    >>> bits(1_939_743, 42_182_144), bits(10, 2**31 - 100)
    ((32, 64), (64,))
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from rgtune.ir.bind import CSR_DST, LAYOUTS, index32_problem
from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import Program

if TYPE_CHECKING:
    from rgtune.ir.plan import LoweringPlan

EDGE_ORDER = Knob("layout.edges", LAYOUTS, CSR_DST, "edge order in memory")
INDEX_BITS = Knob("layout.index_bits", (32, 64), 32, "width of node and edge indices")


class LayoutPass(Pass):
    name = "layout"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        problem = None if graph is None else index32_problem(graph.num_nodes(), graph.num_edges())
        if problem:
            # 32 is not a choice at all (rather than a constraint the tuner would keep hitting): the
            # knob's description says why
            return [EDGE_ORDER, dataclasses.replace(INDEX_BITS, choices=(64,), default=64,
                                                    doc=f"{INDEX_BITS.doc} (64 only: {problem})")]
        return [EDGE_ORDER, INDEX_BITS]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        return program  # the program is the same; what changes is how lowering lays it out (plan)

    def plan(self, plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
        return dataclasses.replace(plan, layout=config.get(EDGE_ORDER.name, EDGE_ORDER.default),
                                   index_bits=int(config.get(INDEX_BITS.name, INDEX_BITS.default)))
