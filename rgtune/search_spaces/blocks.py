"""A schedule's mini-batch programs: what a layer runs on a sampled block, as the tuner and the cost model see it.

A block's program computes its destinations' rows alone (``destinations=True``). In training, a block of a
model's first layer runs a second program: its input needs no gradient, so the program computes the params'
gradients only (``input_grad=False``: :func:`~rgtune.ir.autodiff.without_input_grad`), unless the schedule
cannot make one, where the layer runs the full program there too. The tuner times and checks both
(:mod:`rgtune.tuner.batches`); the cost model counts both (:mod:`rgtune.costmodel.features`).

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
    >>> spaces = BlockSpaces(lambda input_grad: SearchSpace(build_model("rgcn", 8, 8), g, "cpu", "training",
    ...                      destinations=True, input_grad=input_grad), training=True)
    >>> full, first_layer = spaces.compile(spaces.full.default())
    >>> full.valid, first_layer is not None and first_layer.valid
    (True, True)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from rgtune.search_spaces.space import Point, SearchSpace


class BlockSpaces:
    """The mini-batch spaces of one workload: ``full`` (every block's program), and in training ``params_only``
    (a first layer's block's). ``make(input_grad)`` makes either space."""

    def __init__(self, make: Callable[[bool], SearchSpace], training: bool) -> None:
        self.full = make(True)
        self.params_only = make(False) if training else None

    def compile(self, config: Mapping[str, Any]) -> tuple[Point, Point | None]:
        """``config``'s full program, and the params'-gradients program a first layer's block runs (None in
        inference, where the full program is invalid, or where the schedule cannot make one: the layer then
        runs the full one)."""
        full = self.full.compile(config)
        if self.params_only is None or not full.valid:
            return full, None
        params_only = self.params_only.compile(config)
        return full, params_only if params_only.valid else None
