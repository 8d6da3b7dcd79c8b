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

from typing import Any, Mapping

from rgtune.ir.bind import index32_problem
from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import Program

LAYOUTS = ("csr_dst", "coo_rel_dst", "coo_rel_src")


class LayoutPass(Pass):
    name = "layout"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        bits: tuple[int, ...] = (32, 64)
        doc = "width of node and edge indices"
        problem = None if graph is None else index32_problem(graph.num_nodes(), graph.num_edges())
        if problem:
            # 32 is not a choice at all (rather than a constraint the tuner would keep hitting): the
            # knob's description says why
            bits, doc = (64,), f"{doc} (64 only: {problem})"
        return [
            Knob("layout.edges", LAYOUTS, "csr_dst", "edge order in memory"),
            Knob("layout.index_bits", bits, bits[0], doc),
        ]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        ann = dict(program.annotations)
        ann["layout"] = config.get("layout.edges", "csr_dst")
        ann["index_bits"] = int(config.get("layout.index_bits", 32))
        return program.copy(annotations=ann)
