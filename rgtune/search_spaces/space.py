"""The search space of one workload: IR knobs from the passes, schedule knobs from the backend.

Nothing here names a model or a knob: IR knobs are whatever the registered passes declare
for the program (:func:`rgtune.ir.pipeline.discover_knobs`), schedule knobs whatever the
target's backend declares for the kernel templates (``"gemm.tile_rows"``, see
:mod:`rgtune.codegen.schedule`). A configuration is one flat dict ``knob -> value``; a point is
*valid* when the passes' constraints and every lowered kernel's constraints hold.

In ``mode="training"`` a point is the training program (the adjoint of the program after the
passes, :mod:`rgtune.ir.autodiff`): the adjoint's knob (which forward values are saved) joins the
IR knobs, the knobs of the backward's templates (scatter, weight gradient) the schedule knobs.

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
    >>> space = SearchSpace(build_model("rgat", 8, 8, 2), g, target="cpu")
    >>> cfg = space.default()
    >>> space.check(cfg)
    []
    >>> "gemm.tile_rows" in cfg and "compact.src" in cfg
    True
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from rgtune.codegen.schedule import target_schedule
from rgtune.ir.kernels import KernelProgram
from rgtune.ir.passes import Knob, KnobError
from rgtune.ir.pipeline import (Compiled, apply_passes, check_constraints, discover_constraints, discover_knobs,
                                resolve_config)
from rgtune.ir.autodiff import adjoint, training_knobs
from rgtune.ir.kernels import ScatterKernel, WeightGradKernel, template_name
from rgtune.ir.lowering import lower
from rgtune.ir.passes.precision import POLICIES, STORAGE_KNOBS, check_policy
from rgtune.ir.plan import plan_lowering
from rgtune.ir.program import IRError, Program

if TYPE_CHECKING:
    import optuna

    from rgtune.data.graph import HeteroGraph

#: what a workload computes: the forward alone, or a training step (forward, then every gradient)
MODES = ("inference", "training")
#: the templates only a training program has (their knobs are left out of an inference space)
TRAINING_TEMPLATES = frozenset(template_name(t) for t in (ScatterKernel, WeightGradKernel))


@dataclass
class Point:
    """A configuration compiled: the program after passes, its kernels, and what is wrong with it."""

    config: dict[str, Any]
    compiled: Compiled | None
    problems: list[str]

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def kernels(self) -> KernelProgram:
        assert self.compiled is not None, "an IR-invalid point has no kernels"
        return self.compiled.kernels


class SearchSpace:
    """Knobs, defaults, sampling, constraint checks and Optuna suggestions for one workload."""

    def __init__(self, program: Program, graph: "HeteroGraph | None", target: str = "cpu",
                 mode: str = "inference", destinations: bool = False, input_grad: bool = True,
                 precision: str = "fp32") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
        #: which storage types the programs may keep intermediates in (the ``precision.*`` knobs' choices)
        self.precision = check_policy(precision)
        self.mode = mode
        #: the programs are for mini-batches (:attr:`~rgtune.ir.plan.LoweringPlan.destinations`)
        self.destinations = destinations
        #: a training program computes the input's gradient (False: the params' only,
        #: :func:`~rgtune.ir.autodiff.without_input_grad`; what a layer runs when its input needs none)
        self.input_grad = input_grad
        self.schedule = target_schedule(target)  # an unknown target is an error that lists the known ones
        if graph is not None and graph.num_rels == 0:
            raise IRError(f"model {program.name!r} needs a graph with at least one edge type; "
                          f"{graph.name!r} has none (node types: {graph.ntypes})")
        self.program = program
        self.graph = graph
        self.target = target
        storage = {k.name for k in STORAGE_KNOBS}
        self.ir_knobs: list[Knob] = [self._policy_storage_knob(k) if k.name in storage else k
                                     for k in discover_knobs(program, graph)]
        self.ir_knobs += training_knobs(program) if mode == "training" else []
        self.constraints = discover_constraints(program, graph)
        self.schedule_knobs: list[Knob] = [Knob(name, p.choices, p.default, p.doc)
                                            for name, p in self.schedule.knobs().items()
                                            if mode == "training" or name.split(".")[0] not in TRAINING_TEMPLATES]
        self._inference: SearchSpace | None = None  # a training space's inference twin (its programs' checks)

    def _policy_storage_knob(self, knob: Knob) -> Knob:
        """A ``precision.*`` knob with the storage types that both the precision policy and the target allow."""
        allowed = tuple(t for t in knob.choices if t in POLICIES[self.precision] and t in self.schedule.storage)
        if not allowed:
            raise KnobError(f"precision {self.precision!r} stores intermediates as {' or '.join(POLICIES[self.precision])}"
                            f"; the {self.target} target's kernels store {' and '.join(self.schedule.storage)} only "
                            f"(choose precision fp32, or the cpu target)")
        return dataclasses.replace(knob, choices=allowed, default=allowed[0])

    # ----------------------------------------------------------------- knobs
    @property
    def knobs(self) -> list[Knob]:
        return self.ir_knobs + self.schedule_knobs

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KnobError(f"unknown knob {name!r}; valid knobs: {sorted(k.name for k in self.knobs)}")

    def default(self) -> dict[str, Any]:
        """The default schedule: every knob at its default (always valid)."""
        return {k.name: k.default for k in self.knobs}

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with defaults filled in and values checked; unknown knobs are errors."""
        return resolve_config(self.knobs, config, strict=True)

    def size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.choices)
        return n

    # ----------------------------------------------------------------- points
    def compile(self, config: Mapping[str, Any]) -> Point:
        """Apply the IR knobs, lower, and check every constraint (IR and kernel)."""
        full = self.resolve(config)
        problems = check_constraints(self.constraints, full)
        if problems:
            return Point(full, None, problems)
        after = apply_passes(self.program, full, self.graph)
        training = self.mode == "training"
        if training:
            after = adjoint(after, config=full, input_grad=self.input_grad)
        plan = plan_lowering(full, training, self.destinations)
        kp = lower(after, plan)
        problems = self.schedule.check(kp, full)
        if training and not problems:
            problems = self._inference_problems(full)
        return Point(full, Compiled({k.name: full[k.name] for k in self.ir_knobs}, after, kp, plan), problems)

    def _inference_problems(self, config: Mapping[str, Any]) -> list[str]:
        """What is wrong with the inference program the same knobs make: a layer trained with a schedule
        also runs its forward without gradients (evaluation, ``torch.no_grad()``), so a training schedule is
        valid only when that program is too."""
        if self._inference is None:
            self._inference = SearchSpace(self.program, self.graph, self.target, "inference", self.destinations,
                                          precision=self.precision)
        names = {k.name for k in self._inference.knobs}
        point = self._inference.compile({k: v for k, v in config.items() if k in names})
        return [f"the inference program of this schedule (what a layer runs without gradients): {p}"
                for p in point.problems]

    def check(self, config: Mapping[str, Any]) -> list[str]:
        return self.compile(config).problems

    def ir_configs(self) -> Iterator[dict[str, Any]]:
        """Every combination of IR knobs that satisfies the passes' constraints (schedule at defaults).

        Inactive knobs (``compact.pair_index`` when nothing is compact) stay at their default,
        so each distinct configuration comes once.
        """
        names = [k.name for k in self.ir_knobs]
        seen = set()
        for values in itertools.product(*(k.choices for k in self.ir_knobs)):
            cfg = dict(zip(names, values))
            for k in self.ir_knobs:
                if not k.is_active(cfg):
                    cfg[k.name] = k.default
            key = tuple(sorted(cfg.items(), key=lambda kv: kv[0]))
            if key in seen or check_constraints(self.constraints, cfg):
                continue
            seen.add(key)
            yield {**self.default(), **cfg}

    def sample(self, rng: random.Random, max_tries: int = 200) -> dict[str, Any]:
        """A uniformly drawn valid configuration (rejection sampling)."""
        for _ in range(max_tries):
            # a knob with one choice draws nothing: the draws of a space stay as they were when one is added
            cfg = {k.name: k.choices[0] if len(k.choices) == 1 else rng.choice(k.choices) for k in self.knobs}
            for k in self.ir_knobs:
                if not k.is_active(cfg):
                    cfg[k.name] = k.default
            point = self.compile(cfg)
            if point.compiled is not None:
                for k in self.schedule_knobs:
                    valid = self._valid_choices(k, cfg, point)
                    if cfg[k.name] not in valid:
                        cfg[k.name] = rng.choice(valid)
                point = self.compile(cfg)
            if point.valid:
                return cfg
        raise RuntimeError(f"no valid configuration in {max_tries} draws; the constraints may exclude everything")

    # ----------------------------------------------------------------- optuna
    def suggest(self, trial: "optuna.Trial") -> dict[str, Any]:
        """Define-by-run: IR knobs that are active, then the parameters of the templates used."""
        cfg: dict[str, Any] = {}
        for k in self.ir_knobs:
            valid = self._valid_ir_choices(k, cfg)
            if k.is_active(cfg) and len(valid) > 1:
                cfg[k.name] = trial.suggest_categorical(k.name, list(k.choices))
            else:  # inactive, or the knobs chosen so far leave one value
                cfg[k.name] = valid[0] if k.is_active(cfg) else k.default
        point = self.compile({**self.default(), **cfg})
        used = self._templates_used(point)
        for k in self.schedule_knobs:
            if k.name.split(".")[0] not in used:
                cfg[k.name] = k.default
                continue
            valid = self._valid_choices(k, cfg, point)
            if len(valid) == 1:  # the kernels leave no choice (e.g. edge-parallel on a COO layout)
                cfg[k.name] = valid[0]
            else:
                cfg[k.name] = trial.suggest_categorical(k.name, list(k.choices))
        return cfg

    def _valid_ir_choices(self, knob: Knob, partial: Mapping[str, Any]) -> list[Any]:
        """Values of an IR knob that break no pass constraint given the knobs chosen so far."""
        base = {**self.default(), **partial}
        problems = {c: set(check_constraints(self.constraints, {**base, knob.name: c})) for c in knob.choices}
        common = set.intersection(*problems.values())
        return [c for c in knob.choices if problems[c] == common] or list(knob.choices)

    def _valid_choices(self, knob: Knob, config: Mapping[str, Any], point: Point) -> list[Any]:
        """The values of a schedule knob that add no kernel-constraint violation of their own.

        A value is valid when the problems with it are exactly the problems every value has
        (those come from other knobs).
        """
        if point.compiled is None:
            return list(knob.choices)
        base = {**self.default(), **config}
        problems = {c: set(self.schedule.check(point.kernels, {**base, knob.name: c})) for c in knob.choices}
        common = set.intersection(*problems.values())
        return [c for c in knob.choices if problems[c] == common] or list(knob.choices)

    def _templates_used(self, point: Point) -> set[str]:
        if point.compiled is None:
            return {t.name for t in self.schedule.templates}
        return {k.template for k in point.kernels.kernels}

    def distributions(self) -> dict[str, "optuna.distributions.BaseDistribution"]:
        """Every knob as an Optuna categorical distribution (for ``study.enqueue_trial`` etc.)."""
        from optuna.distributions import CategoricalDistribution

        return {k.name: CategoricalDistribution(list(k.choices)) for k in self.knobs}

    def describe(self) -> str:
        mode = "" if self.mode == "inference" else f", {self.mode}"
        lines = [f"search space ({self.target}{mode}): {len(self.knobs)} knobs, {self.size():,} points before constraints"]
        for k in self.knobs:
            cond = " (conditional)" if k.active_if else ""
            lines.append(f"  {k.name} in {list(k.choices)} default {k.default!r}{cond}: {k.doc}")
        for c in self.constraints:
            lines.append(f"  constraint {c.name}: {c.doc}")
        return "\n".join(lines)
