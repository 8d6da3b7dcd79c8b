"""The passes over the inter-operator IR, each owning its knobs; the default pipeline.

Order: ``reorder`` (changes which linears exist) -> ``compact`` (moves values to pair
domains) -> ``fusion``, ``layout`` and ``precision`` (record decisions that lowering reads).
"""

from rgtune.ir.passes.base import (Constraint, Knob, KnobError, Pass, create, register_pass, registered_passes,
                                   unregister_pass)
from rgtune.ir.passes.compact import CompactPass
from rgtune.ir.passes.fusion import FusionPass
from rgtune.ir.passes.layout import LayoutPass
from rgtune.ir.passes.precision import PrecisionPass
from rgtune.ir.passes.reorder import ReorderPass

for _p in (ReorderPass(), CompactPass(), FusionPass(), LayoutPass(), PrecisionPass()):
    if not any(q.name == _p.name for q in registered_passes()):
        register_pass(_p)

__all__ = ["Constraint", "Knob", "KnobError", "Pass", "create", "register_pass", "registered_passes",
           "unregister_pass", "CompactPass", "FusionPass", "LayoutPass", "PrecisionPass", "ReorderPass"]
