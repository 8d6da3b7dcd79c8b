"""Graph layout: how edges are ordered in memory and how wide indices are.

Knobs:

* ``layout.edges``: ``csr_dst`` (edges grouped by destination, each destination's in-edges
  grouped by relation), ``coo_rel_dst`` (segmented by relation, sorted by destination
  inside), ``coo_rel_src`` (segmented by relation, sorted by source inside). Per-edge
  buffers are stored in this order.
* ``layout.index_bits``: 32- or 64-bit node/edge indices in the kernels (32 only when every
  count fits).
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import Program

LAYOUTS = ("csr_dst", "coo_rel_dst", "coo_rel_src")


class LayoutPass(Pass):
    name = "layout"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        bits: tuple[int, ...] = (32, 64)
        if graph is not None and max(graph.num_nodes(), graph.num_edges()) >= 2**31 - 1:
            bits = (64,)
        return [
            Knob("layout.edges", LAYOUTS, "csr_dst", "edge order in memory"),
            Knob("layout.index_bits", bits, bits[0], "width of node and edge indices"),
        ]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        ann = dict(program.annotations)
        ann["layout"] = config.get("layout.edges", "csr_dst")
        ann["index_bits"] = int(config.get("layout.index_bits", 32))
        return program.copy(annotations=ann)
