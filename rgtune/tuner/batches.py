"""A sampler workload's trials: a schedule's mini-batch programs timed over fixed sampled batches.

A workload tuned for a sampler (``tune --batches neighbor:fanout=15x10,batch_size=1024``, a
:class:`~rgtune.data.sampler_spec.SamplerSpec`) is what a layer runs in mini-batch training: every step a
new block per layer, to which the layer binds its compiled programs (the block's index arrays and the
kernels' tables over them) before it runs the mini-batch programs on it
(:attr:`~rgtune.ir.plan.LoweringPlan.destinations`: values only the destinations need are computed for
them alone; for a first layer's block, whose input needs no gradient, the training program of the
params' gradients alone). So a trial of such a workload, in the measurement worker:

* compiles those programs of its schedule (:meth:`SampledBatches.point`, :meth:`SampledBatches.build`),
  once, as :class:`~rgtune.runtime.module.Layer` does;
* verifies each of them on one block, the seeds' block of the first batch, against the float64
  interpreter on every row (:class:`~rgtune.tuner.verification.Verifier` of that block);
* times one run as the sum over the sampler's fixed batches (the same ones for every trial, drawn once
  per worker from the spec's seed) and over each batch's blocks of: binding a fresh copy of the block
  (:meth:`~rgtune.data.batch.Batch.unbound`: nothing derived in an earlier run is kept, as a new batch
  has nothing) and a forward (inference) or a training step (training) on it. The trial's time is the
  median of such runs divided by the number of batches (a time per batch, whatever ``batches=`` a study
  used): per-batch preparation included, sampling itself not (it does not depend on the schedule).

Example:
    >>> from rgtune.codegen.base import create
    >>> from rgtune.data.sampler_spec import SamplerSpec
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.registry import build_model
    >>> g = random_graph((60, 90), num_relations=3, num_edges=1200, seed=0)
    >>> sb = SampledBatches(SamplerSpec.parse("neighbor:fanout=4x3,batch_size=16,batches=2"), g,
    ...                     build_model("rgcn", 8, 8), create("reference"), "training")
    >>> len(sb.blocks), sb.describe()["batches"]
    (4, 2)
    >>> point = sb.point({})
    >>> built = sb.build(point)
    >>> case = sb.verifier.case(0)
    >>> err, which, tol = sb.verifier.error(sb.run_case(built, case), sb.case_of_variants(case))
    >>> err < tol
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch

from rgtune.codegen.base import Backend, BuiltProgram, CompiledProgram, source_hash
from rgtune.codegen.training import train_step
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.data.sampler_spec import SamplerSpec
from rgtune.data.sampling import largest_block, layer_blocks
from rgtune.ir.kernels import KernelProgram
from rgtune.search_spaces import BlockSpaces, Point, SearchSpace
from rgtune.tuner.verification import Case, Verifier

__all__ = ["SampledBatches", "BatchesPoint", "BatchesBuild"]

#: what a result of the params'-gradients program is called in a case (next to the full program's)
_PARAMS_ONLY = " (params' gradients program)"


@dataclass
class BatchesPoint:
    """A schedule's mini-batch programs: ``full`` (with the input's gradient; the inference program in
    inference) and, in training, ``params_only`` (None where the schedule makes none: the layer then runs
    ``full`` on a first layer's block too)."""

    full: Point
    params_only: Point | None = None

    @property
    def valid(self) -> bool:
        return self.full.valid

    @property
    def problems(self) -> list[str]:
        return list(self.full.problems)

    @property
    def kernels(self) -> KernelProgram:
        return self.full.kernels

    @property
    def config(self) -> dict[str, Any]:
        return self.full.config


@dataclass
class BatchesBuild:
    """The compiled programs of a :class:`BatchesPoint` and their bindings to the verification block."""

    full: tuple[KernelProgram, CompiledProgram]
    params_only: tuple[KernelProgram, CompiledProgram] | None
    checked: dict[bool, BuiltProgram] = field(default_factory=dict)  # input_grad -> bound to the checked block

    @property
    def cache_hit(self) -> bool:
        return all(c.cache_hit for _, c in self._programs())

    @property
    def source_hash(self) -> str:
        """One hash of every program's files (the params'-gradients program's under their own names)."""
        sources = dict(self.full[1].sources)
        if self.params_only is not None:
            sources.update({f"params_only/{k}": v for k, v in self.params_only[1].sources.items()})
        return source_hash(sources)

    @property
    def info(self) -> dict[str, Any]:
        return {"programs": len(self._programs()), "compile_seconds": sum(c.compile_seconds for _, c in self._programs())}

    def _programs(self) -> list[tuple[KernelProgram, CompiledProgram]]:
        return [self.full] + ([self.params_only] if self.params_only is not None else [])

    def program(self, first_layer: bool) -> tuple[KernelProgram, CompiledProgram]:
        """The program a block runs: a first layer's block (its input needs no gradient) the params' one."""
        return self.params_only if first_layer and self.params_only is not None else self.full


class SampledBatches:
    """The fixed batches of a sampler workload, and how a trial builds, checks and times on them (see the
    module docstring).

    Args:
        spec: the sampler (its ``batches`` and ``seed`` say which batches are timed).
        graph: the whole graph the sampler draws from.
        program: the model's program; backend: the backend that compiles it; mode: ``"inference"`` or
            ``"training"``.
        device: where the inputs live (the backend's device type).
    """

    def __init__(self, spec: SamplerSpec, graph: HeteroGraph, program: Any, backend: Backend, mode: str,
                 device: str = "cpu", base_tolerance: float = 1e-4, precision: str = "fp32") -> None:
        self.spec, self.graph, self.backend, self.mode = spec, graph, backend, mode
        self.training = mode == "training"
        minibatches = spec.sample(graph)
        if not minibatches:
            raise ValueError(f"sampler {spec.key!r} draws no batch from graph {graph.name!r}: it has no seed nodes "
                             f"of type {spec.seed_type(graph)!r}")
        #: every block to time, with whether it is a first layer's (its input needs no gradient)
        self.blocks: list[tuple[bool, Batch]] = layer_blocks(minibatches)
        self.num_batches = len(minibatches)
        #: the block each trial is verified on: the seeds' block of the first batch (the smallest of its blocks)
        self.checked = minibatches[0].blocks[-1]
        #: the block a trial's memory is estimated on (blocks run one at a time)
        self.largest = largest_block(self.blocks)
        target = backend.target
        self._spaces = BlockSpaces(lambda g: SearchSpace(program, graph, target, mode, destinations=True, input_grad=g,
                                                         precision=precision), self.training)
        self.verifier = Verifier(program, self.checked, training=self.training, base_tolerance=base_tolerance,
                                 mode="full")
        gen = torch.Generator().manual_seed(spec.seed * 7919 + 3)
        in_dim, out_dim = program.x.heads * program.x.dim, program.output.heads * program.output.dim
        #: per block, its random input (and output gradient) on the device: drawn once, outside the timing
        self.inputs = [(torch.randn(b.num_nodes(), in_dim, generator=gen).to(device),
                        torch.randn(b.num_dst_nodes, out_dim, generator=gen).to(device) if self.training else None)
                       for _, b in self.blocks]

    def describe(self) -> dict[str, Any]:
        """The batches timed, for a trial's details and the summary."""
        return {"sampler": str(self.spec), "batches": self.num_batches, "blocks": len(self.blocks),
                "edges": sum(b.num_edges() for _, b in self.blocks),
                "checked_block": {"nodes": self.checked.num_nodes(), "edges": self.checked.num_edges(),
                                  "destinations": self.checked.num_dst_nodes}}

    def point(self, config: Mapping[str, Any]) -> BatchesPoint:
        """The mini-batch programs of ``config``; a params'-gradients program the schedule cannot make is
        left out (the full one runs instead, as in a layer)."""
        return BatchesPoint(*self._spaces.compile(config))

    def build(self, point: BatchesPoint) -> BatchesBuild:
        """Compile the point's programs and bind them to the verification block."""
        compile = self.backend.compile
        full = (point.full.kernels, compile(point.full.kernels, point.full.config))
        params_only = None if point.params_only is None else \
            (point.params_only.kernels, compile(point.params_only.kernels, point.params_only.config))
        built = BatchesBuild(full, params_only)
        for input_grad, program in ((True, full), (False, params_only)):
            if program is not None:
                built.checked[input_grad] = program[1].bind(self.checked)
        return built

    def case_of_variants(self, case: Case) -> Case:
        """``case`` with the params'-gradients program's results expected too (the same values, without
        the input's gradient), so that one comparison checks both programs."""
        if not self.training:
            return case
        extra = {name + _PARAMS_ONLY: e for name, e in case.expected.items() if name != "input gradient"}
        tolerances = {name + _PARAMS_ONLY: t for name, t in case.tolerances.items() if name != "input gradient"}
        both = replace(case, expected={**case.expected, **extra}, tolerances={**case.tolerances, **tolerances})
        if case.float32_reference is not None:
            raise_both = case.float32_reference

            def raised() -> None:  # the float32 reference raises the shared tolerances; copy them to the aliases
                raise_both()
                both.tolerances.update(case.tolerances)
                both.tolerances.update({n + _PARAMS_ONLY: t for n, t in case.tolerances.items()})
            both.float32_reference = raised
        if case.rounded_reference is not None:
            derive = case.rounded_reference

            def aliased(storage: str) -> dict[str, float]:  # a 16-bit program's tolerances, for the aliases too
                tols = derive(storage)
                return {**tols, **{n + _PARAMS_ONLY: t for n, t in tols.items() if n != "input gradient"}}
            both.rounded_reference, both.low_precision = aliased, {}
        return both

    def run_case(self, built: BatchesBuild, dev: Case) -> dict[str, Any]:
        """What the programs compute for the verification case ``dev`` (on the device), named as
        :meth:`case_of_variants` expects them."""
        kp, _ = built.full
        if not self.training:
            return {"output": built.checked[True].run(dev.x, dev.params)}
        out, dx, grads = train_step(built.checked[True], kp, self.checked, dev.x, dev.params, dev.dout)
        got: dict[str, Any] = {"output": out, "input gradient": dx, **{f"gradient of {n}": g for n, g in grads.items()}}
        params_only = built.checked.get(False)
        if params_only is None:  # the layer runs the full program there: it was checked just now
            return {**got, **{k + _PARAMS_ONLY: v for k, v in got.items() if k != "input gradient"}}
        assert built.params_only is not None
        out, _, grads = train_step(params_only, built.params_only[0], self.checked, dev.x, dev.params, dev.dout)
        got["output" + _PARAMS_ONLY] = out
        got.update({f"gradient of {n}{_PARAMS_ONLY}": g for n, g in grads.items()})
        return got

    def step(self, built: BatchesBuild, params: Mapping[str, Any]) -> Callable[[], None]:
        """One timed run: every batch's blocks bound afresh and run (a forward, or a training step)."""
        blocks = [(built.program(first), block, io) for (first, block), io in zip(self.blocks, self.inputs)]
        training, sync = self.training, self.backend.synchronize

        def run() -> None:
            for (kp, compiled), block, (x, dout) in blocks:
                fresh = block.unbound()
                program = compiled.bind(fresh)
                if training:
                    train_step(program, kp, fresh, x, params, dout)
                else:
                    program.run(x, params)
            sync()

        return run
