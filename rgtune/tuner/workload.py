"""What the tuner tunes: a :class:`Workload` (model and options, sizes, graph, backend, mode, sampler).

A workload is made in the process of the user's own command (``tune``, :func:`rgtune.tune`, a
script); the measurement worker (:mod:`.measure`, a fresh process) receives it and imports the
model's code only from the path that command named or registered (``model_source``), never from
a database row.

Example:
    >>> w = Workload("rgcn", "aifb", 16, 16, 1, "cpu", options={"num_bases": 30})
    >>> w.model, w.options, w.mode
    ('rgcn', 'num_bases=30', 'inference')
    >>> w.program().name
    'rgcn'
    >>> Workload("rgcn", "aifb", 16, 16, 1, "cpu", batches="neighbor:fanout=10x10,batch_size=64").batches_key
    'neighbor:fanout=10x10,batch_size=64'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Workload"]


@dataclass(frozen=True)
class Workload:
    """What is tuned: model (with its options), sizes, graph (by dataset name), backend, mode, and the
    sampler whose batches the trials run on (``batches``: a :class:`~rgtune.data.sampler_spec.SamplerSpec`
    or its text, kept as the spec; None: the whole graph).

    ``options`` may be given as a mapping or as canonical text; it is kept as canonical text
    (:meth:`ModelSpec.key <rgtune.ir.registry.ModelSpec.key>`), and checked against the model's
    options when the workload is made. ``model_source`` is where a worker process imports a model
    registered elsewhere (``"package.module:builder"``; filled in from the registry when the workload
    is made, so it is always the path the user's own code or command named or registered, never one
    read from a database row).
    """

    model: str
    dataset: str
    in_dim: int
    out_dim: int
    heads: int
    backend: str
    data_dir: str | None = None
    mode: str = "inference"  # or "training": one training step (forward, then every gradient)
    options: Any = ""
    model_source: str | None = None
    #: the sampler whose batches the trials are timed on (:mod:`.batches`); None: the whole graph
    batches: Any = None
    #: the storage types the schedules may keep intermediates in (``fp32``, ``bf16``, ``fp16``, ``any``:
    #: :data:`rgtune.ir.passes.precision.POLICIES`)
    precision: str = "fp32"

    def __post_init__(self) -> None:
        from rgtune.data.sampler_spec import SamplerSpec

        spec = self.spec()
        object.__setattr__(self, "model", spec.name)
        object.__setattr__(self, "options", spec.key(self.options))
        if self.model_source is None:
            object.__setattr__(self, "model_source", spec.source)
        from rgtune.ir.passes.precision import check_policy

        check_policy(self.precision)
        if self.batches is not None and self.batches != "":
            object.__setattr__(self, "batches", SamplerSpec.parse(self.batches))
        else:
            object.__setattr__(self, "batches", None)

    @property
    def batches_key(self) -> str:
        """The sampler as the workload's key has it (``""``: the whole graph)."""
        return "" if self.batches is None else self.batches.key

    def spec(self) -> Any:
        """The model's :class:`~rgtune.ir.registry.ModelSpec`. In a measurement worker (a fresh process)
        a model registered elsewhere is imported from ``model_source``: the workload was made by the
        user's command in the parent, which named that model."""
        from rgtune.ir.registry import model_spec, recorded_model

        if self.model_source is None:
            return model_spec(self.model)
        return recorded_model(self.model, self.model_source, origin="the workload", trust_code=True)

    def program(self) -> Any:
        """The model's program at the workload's sizes and options (before the passes)."""
        return self.spec().build(self.in_dim, self.out_dim, self.heads, self.options)

