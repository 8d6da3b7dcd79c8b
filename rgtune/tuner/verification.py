"""What a trial's kernels must compute, and how close: the float64 reference on all rows or on a sample.

A :class:`Verifier` makes a trial's *case* (:meth:`Verifier.case`): random inputs and parameters
(seeded), for a training workload a random output gradient ``dout``, and what the oracle computes
from them (the unoptimized program run op by op by :class:`~rgtune.ir.interpret.Interpreter`, in
float64; in training mode its gradients by autograd), each result with its tolerance.

**Full or sampled.** On a small graph the reference covers every row. On a big one (more than
``SAMPLE_ABOVE_EDGES`` edges, or ``mode="sampled"``) recomputing the whole float64 reference every
trial would cost more than the kernels it checks (HGT on AM: tens of seconds and gigabytes), so
the case checks ``rows`` sampled destination nodes exactly instead
(:func:`~rgtune.data.neighbourhood.sample_destinations`: the biggest hubs, nodes without in-edges,
a destination of every relation, random ones): the reference runs on their in-neighbourhood
(:func:`~rgtune.data.neighbourhood.in_neighbourhood`), where it computes those rows exactly as on
the whole graph. In training mode ``dout`` is zero outside the sampled rows, so the gradients of
the input and of every parameter that the kernels compute on the whole graph depend only on the
neighbourhood too, and are checked whole (the input gradient is zero outside the neighbourhood's
nodes, and checked to be). The sample is new for every seed; what it covered is in
:meth:`Case.coverage` (the trial's ``details.verified``).

**Tolerances.** A result's relative error is ``max|got - expected| / max|expected|``. Its
tolerance is the largest of: the base (``1e-4``); :data:`FLOAT32_MARGIN` times the error of the
same reference computed in float32 on the same inputs (some inputs are ill-conditioned in
float32: a softmax whose gradient cancels); and :data:`REDUCTION_MARGIN` x sqrt(L) x 2^-24 for
the longest float32 sum L the result needs (a destination's in-edges for the output and the input
gradient; every edge of the checked neighbourhood for a parameter's gradient): a float32 sum of L
terms is typically sqrt(L) units of rounding off, so a 150,000-in-edge hub is allowed 3.7e-4. The
float32 reference costs a second run of the reference, so it is computed only for a case where a
result is over its tolerance without it (:attr:`Case.float32_reference`).

**16-bit storage** (``precision.edges``, ``precision.nodes``: :mod:`rgtune.ir.passes.precision`). A program that stores some
intermediates in bfloat16 or float16 (summing in float32) is allowed, besides the above,
:data:`LOW_PRECISION_MARGIN` (per type) times the error of the same reference with its input, its params and
every op's result rounded to that type (:meth:`Interpreter.run <rgtune.ir.interpret.Interpreter.run>`'s
``round_to``; its gradients rounded too): a program that rounds only what it stores (and, multiplying in
bfloat16 pairs, a GEMM's operands) rounds less than that, so this bounds its honest error on these very
inputs, conditioning included, while a kernel bug (an error of order 1, or of a wrong element) still fails.
Both errors are maxima of rounding noise over a result's elements, for a small parameter's gradient one
noisy draw each: the program's error is typically 0.4x the reference's but reaches 2.5x on some inputs
(``experiments/precision_margin.py``: 2,208 results, RGCN, RGAT and HGT on AIFB and MUTAG, both types,
three schedules, eight cases each: median 0.42, 99th percentile 1.5, largest 2.52, float16, RGAT's input
gradient on AIFB; bfloat16's largest 2.37). The margins sit above that with room while the tolerance stays
far below a kernel bug's error: bfloat16's reference is off by up to 7% on a cancelling gradient (3 x that
is 0.22), float16's by up to 3.4% (4 x that is 0.13).
Computed once per case and type, when a trial of that type is checked (:meth:`Case.low_precision_tolerances`).

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.registry import build_model
    >>> g = random_graph((300, 300), num_relations=3, num_edges=3000, seed=0)
    >>> v = Verifier(build_model("rgcn", 8, 8), g, training=True, mode="sampled", rows=32)
    >>> case = v.case(seed=0)
    >>> case.coverage().rows, sorted(case.expected)
    (32, ['gradient of bias', 'gradient of root', 'gradient of weight', 'input gradient', 'output'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.data.neighbourhood import Neighbourhood, in_neighbourhood, sample_destinations
from rgtune.db.trial_result import Coverage
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.passes.precision import torch_dtype
from rgtune.ir.program import EDGE_WEIGHT, reads_edge_weight

__all__ = ["Case", "Verifier", "FLOAT32_MARGIN", "LOW_PRECISION_MARGIN", "REDUCTION_MARGIN", "SAMPLE_ABOVE_EDGES", "VERIFY_MODES",
           "relative_error", "shown", "tolerance"]

#: a kernel may be this many times as far off float64 as the reference computed in float32 (both
#: round at every step, in other orders)
FLOAT32_MARGIN = 8.0
#: a 16-bit program may be this many times as far off float64 as the reference rounded to its type at every op
#: (seen: at most 2.52x; see the module docstring)
LOW_PRECISION_MARGIN = {"bfloat16": 3.0, "float16": 4.0}
#: a float32 sum of L terms may be this many times sqrt(L) units of rounding (2^-24) off
REDUCTION_MARGIN = 16.0
#: ``mode="auto"`` samples rows on graphs with more edges than this
SAMPLE_ABOVE_EDGES = 200_000
VERIFY_MODES = ("auto", "full", "sampled")
_UNIT = 2.0 ** -24


@dataclass
class Expected:
    """One result the kernels must compute: ``value`` at the rows ``rows`` of theirs (None: all rows) out of
    ``total`` rows; ``zero_elsewhere``: their other rows must be exactly zero."""

    value: torch.Tensor
    rows: torch.Tensor | None = None
    total: int = 0
    zero_elsewhere: bool = False

    def error(self, got: torch.Tensor) -> float:
        """``got``'s relative error (inf for a wrong shape). Sampled, only the checked rows are copied to
        float64: a whole result of a big graph would be gigabytes next to the kernels' buffers."""
        got = got.detach()
        if self.rows is None:
            got = got.to("cpu", torch.float64)
            return relative_error(got, self.value) if tuple(got.shape) == tuple(self.value.shape) else math.inf
        if tuple(got.shape) != (self.total, *self.value.shape[1:]):
            return math.inf
        err = relative_error(got[self.rows.to(got.device)].to("cpu", torch.float64), self.value)
        if self.zero_elsewhere:
            stray = _largest_outside(got, self.rows) / (float(self.value.abs().max()) or 1.0)
            err = err if stray <= err else stray  # a NaN outside the rows fails too
        return err

    def nbytes(self) -> int:
        """Bytes this expected result holds."""
        return self.value.numel() * self.value.element_size() + (0 if self.rows is None else self.rows.numel() * 8)


def _largest_outside(got: torch.Tensor, rows: torch.Tensor, block: int = 1 << 16) -> float:
    """The largest magnitude in ``got``'s rows other than ``rows`` (0 where there are none), a block of rows at
    a time so that no copy of the whole result is made."""
    if got.numel() == 0:
        return 0.0
    per_row = torch.empty(got.shape[0], dtype=torch.float64)
    flat = got.reshape(got.shape[0], -1)
    for start in range(0, got.shape[0], block):
        per_row[start:start + block] = flat[start:start + block].abs().amax(dim=1).to("cpu", torch.float64)
    per_row[rows] = 0.0
    return float(per_row.max())


@dataclass
class Case:
    """A trial's inputs (float64 on the host, or float32 on the device), what the reference computed from
    them, each result's tolerance, and (sampled) the neighbourhood it covered."""

    x: Any
    params: dict[str, Any]
    dout: Any
    expected: dict[str, Expected]
    tolerances: dict[str, float] = field(default_factory=dict)
    hood: Neighbourhood | None = None
    #: raises ``tolerances`` to what the reference computed in float32 misses by; :meth:`Verifier.error` calls
    #: it (once) only when a result is over its tolerance without it: it costs a second reference run
    float32_reference: Callable[[], None] | None = None
    #: storage type -> each result's tolerance for a program storing intermediates in it (see the module
    #: docstring); computed by :meth:`low_precision_tolerances`, once per type
    rounded_reference: Callable[[str], dict[str, float]] | None = None
    low_precision: dict[str, dict[str, float]] = field(default_factory=dict)

    def low_precision_tolerances(self, storage: str) -> dict[str, float]:
        """Each result's tolerance for a program storing intermediates as ``storage`` (``bfloat16``,
        ``float16``): :data:`LOW_PRECISION_MARGIN` (of that type) x the error of the reference rounded to it at every op."""
        if storage not in self.low_precision:
            assert self.rounded_reference is not None, "a case without its reference cannot derive tolerances"
            self.low_precision[storage] = self.rounded_reference(storage)
        return self.low_precision[storage]

    def on(self, device: str) -> "Case":
        """The inputs in float32 on ``device`` (the expected results stay on the host)."""
        move = lambda t: None if t is None else t.to(device=device, dtype=torch.float32)  # noqa: E731
        return Case(move(self.x), {k: move(v) for k, v in self.params.items()}, move(self.dout), self.expected,
                    self.tolerances, self.hood, self.float32_reference, self.rounded_reference, self.low_precision)

    def resident_bytes(self) -> int:
        """Bytes the verification holds while a candidate runs: the float32 inputs and parameters the kernels
        read, the expected results, and checked whole (not sampled), the largest result's float64 copy that
        the comparison makes. The memory budget counts them next to the candidate's own buffers."""
        inputs = [self.x, self.dout, *self.params.values()]
        held = sum(t.numel() * 4 for t in inputs if t is not None)
        held += sum(e.nbytes() for e in self.expected.values())
        if self.hood is None:
            held += max((e.value.numel() * 8 for e in self.expected.values()), default=0)
        return held

    def coverage(self) -> Coverage:
        """What this case checks: every row, or the sample's rows, nodes, edges and longest in-edge list."""
        return Coverage() if self.hood is None else Coverage(**self.hood.describe())


class Verifier:
    """Cases of ``program`` on ``graph`` and the errors of results against them (see the module docstring).

    ``mode``: ``"full"``, ``"sampled"`` (``rows`` destinations), or ``"auto"`` (sampled on graphs with
    more than :data:`SAMPLE_ABOVE_EDGES` edges). ``graph`` may be a mini-batch's block
    (:class:`~rgtune.data.batch.Batch`), checked on every row: its program computes the destinations'
    output alone, so the output checked is the reference's first ``num_dst_nodes`` rows, and ``dout`` has
    those rows (the reference's output gradient is zero past them).
    """

    def __init__(self, program: Any, graph: HeteroGraph | Batch, *, training: bool, base_tolerance: float = 1e-4,
                 mode: str = "auto", rows: int = 512) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"unknown verification mode {mode!r}; choose one of {list(VERIFY_MODES)}")
        if rows < 1:
            raise ValueError(f"rows must be at least 1 sampled destination, got {rows}")
        self.program, self.graph, self.training = program, graph, training
        self.base, self.rows = base_tolerance, rows
        #: a block's program computes its destinations' rows alone (the prefix of its nodes)
        self.out_rows = graph.num_dst_nodes if isinstance(graph, Batch) else graph.num_nodes()
        if mode == "sampled" and isinstance(graph, Batch):
            raise ValueError(f"a block ({graph!r}) is verified on every row: sampled verification is for whole graphs")
        self.sampled = mode == "sampled" or (mode == "auto" and not isinstance(graph, Batch)
                                             and graph.num_edges() > SAMPLE_ABOVE_EDGES)
        self._full = None if self.sampled else Interpreter(program, graph)
        self._full_lengths = None if self.sampled else self._lengths(graph)  # the same for every case
        self._x32: torch.Tensor | None = None  # sampled: the whole graph's input, kept between cases
        self._dout32: torch.Tensor | None = None
        self._dout_rows: torch.Tensor | None = None  # the rows of _dout32 that the last case set

    def inputs(self, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Random float64 input (all rows) and parameters of ``seed``."""
        params = {**random_params(self.program, self.graph, seed=seed), **self._edge_weight(seed)}
        gen = torch.Generator().manual_seed(seed * 7919 + 2)
        return torch.randn(self.graph.num_nodes(), self.program.x.heads * self.program.x.dim, generator=gen,
                           dtype=torch.float64), params

    def case(self, seed: int) -> Case:
        """The inputs of ``seed`` and what the reference computes from them, with tolerances.

        Sampled, the inputs are float32 tensors of the whole graph that the verifier keeps and reuses: only
        the rows the check reads (the neighbourhood's nodes; ``dout``: the sampled rows, zero elsewhere)
        are drawn anew for ``seed``, since drawing every row of a big graph costs more than the check. A
        case's inputs are therefore valid until the next :meth:`case`."""
        n, out_dim = self.graph.num_nodes(), self.program.output.heads * self.program.output.dim
        gen = torch.Generator().manual_seed(seed * 7919 + 1)
        if not self.sampled:
            x, params = self.inputs(seed)
            dout = torch.randn(self.out_rows, out_dim, generator=gen, dtype=torch.float64) if self.training else None
            # the reference computes every node's output: the rows past a block's destinations get no gradient
            dout_all = None if dout is None else torch.cat([dout, dout.new_zeros(n - self.out_rows, out_dim)])
            hood, lengths = None, self._full_lengths
            exact = _reference(self._full, x, params, dout_all)
            rounded = lambda: _reference(self._full, x.float(), {k: v.float() for k, v in params.items()},  # noqa: E731
                                         None if dout_all is None else dout_all.float())
            stored = lambda dtype: _reference(self._full, x, params, dout_all, dtype)  # noqa: E731
            if self.out_rows < n:
                exact["output"] = exact["output"][:self.out_rows]
                rounded = _first_rows(rounded, self.out_rows)
                stored = _first_rows(stored, self.out_rows)
        else:
            hood = in_neighbourhood(self.graph, sample_destinations(self.graph, self.rows, seed=seed))
            x, params, dout = self._sampled_inputs(seed, hood, gen)
            interp = Interpreter(self.program, hood.graph)
            sub = _hood_params(params, self.graph, hood)  # the reference's: the edge weights of hood's edges
            nodes = hood.nodes
            x_rows, dout_rows = x[nodes].double(), None if dout is None else dout[nodes].double()
            exact = _reference(interp, x_rows, sub, dout_rows)
            rounded = lambda: _reference(interp, x_rows.float(), {k: v.float() for k, v in sub.items()},  # noqa: E731
                                         None if dout_rows is None else dout_rows.float())
            stored = lambda dtype: _reference(interp, x_rows, sub, dout_rows, dtype)  # noqa: E731
            lengths = self._lengths(hood.graph)
        expected = {name: _expected(name, value, hood, n) for name, value in exact.items()}
        length = {name: lengths["rows" if name in ("output", "input gradient") else "params"] for name in exact}
        tolerances = {name: tolerance(self.base, None, None, length[name]) for name in exact}

        def raise_tolerances() -> None:  # what the float32 reference itself misses by, computed when needed
            r = rounded()
            tolerances.update({name: tolerance(self.base, value, r[name], length[name])
                               for name, value in exact.items()})

        def low_precision(storage: str) -> dict[str, float]:  # see the module docstring
            r = stored(torch_dtype(storage))
            return {name: LOW_PRECISION_MARGIN[storage] * relative_error(r[name].double(), value)
                    for name, value in exact.items()}

        return Case(x, params, dout, expected, tolerances, hood, raise_tolerances, low_precision)

    def _sampled_inputs(self, seed: int, hood: Neighbourhood, gen: torch.Generator
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
        """The kept float32 input (and output gradient) with the rows ``hood`` reads drawn for ``seed``;
        float64 parameters (float32-representable, as the rows are)."""
        n, in_dim = self.graph.num_nodes(), self.program.x.heads * self.program.x.dim
        out_dim = self.program.output.heads * self.program.output.dim
        if self._x32 is None:
            self._x32 = torch.randn(n, in_dim, generator=torch.Generator().manual_seed(7), dtype=torch.float32)
        self._x32[hood.nodes] = torch.randn(hood.nodes.numel(), in_dim, generator=gen, dtype=torch.float32)
        dout = None
        if self.training:
            if self._dout32 is None:
                self._dout32 = torch.zeros(n, out_dim, dtype=torch.float32)
            if self._dout_rows is not None:
                self._dout32[self._dout_rows] = 0.0
            self._dout32[hood.dst] = torch.randn(hood.dst.numel(), out_dim, generator=gen, dtype=torch.float32)
            self._dout_rows, dout = hood.dst, self._dout32
        params = {k: v.float().double() for k, v in random_params(self.program, self.graph, seed=seed).items()}
        return self._x32, {**params, **self._edge_weight(seed)}, dout

    def _edge_weight(self, seed: int) -> dict[str, torch.Tensor]:
        """``{EDGE_WEIGHT: w}`` for a program that reads the caller's per-edge weight: random positive weights
        of ``seed`` in ``[0.5, 1.5)``, float32-representable, one per edge of the graph in its edge order (a
        schedule is verified on them as on the input); else nothing."""
        if not reads_edge_weight(self.program):
            return {}
        gen = torch.Generator().manual_seed(seed * 7919 + 3)
        w = 0.5 + torch.rand(self.graph.num_edges(), generator=gen, dtype=torch.float64)
        return {EDGE_WEIGHT: w.float().double()}

    def _lengths(self, graph: HeteroGraph) -> dict[str, int]:
        deg = int(torch.bincount(graph.dst, minlength=graph.num_nodes()).max()) if graph.num_edges() else 0
        return {"rows": max(deg, 1), "params": max(graph.num_edges(), graph.num_nodes(), 1)}

    def error(self, got: Mapping[str, Any], case: Case, storage: str = "float32") -> tuple[float, str, float]:
        """The result furthest off the reference relative to its tolerance: its relative error, its name,
        its tolerance (error inf and a reason as the name for a missing or misshapen result). ``storage``: the
        least precise storage type of the program's buffers (:func:`~rgtune.ir.passes.precision.lowest_storage`),
        whose rounding the tolerances allow for."""
        worst, which, tol = 0.0, "", self.base
        low = {} if storage == "float32" else case.low_precision_tolerances(storage)
        for name, want in case.expected.items():
            a = got.get(name)
            if a is None and name.startswith("gradient of ") and not bool(want.value.any()):
                continue  # a parameter the program does not read: no gradient, as autograd gives it none
            err = math.inf if a is None else want.error(a)
            if err == math.inf:
                shape = None if a is None else tuple(a.shape)
                return math.inf, f"{name}: shape {shape} does not match {tuple(want.value.shape)}", self.base
            mine = max(case.tolerances.get(name, self.base), low.get(name, 0.0))
            if not err < mine and case.float32_reference is not None:
                # over the tolerance: is float32 itself this far off on these inputs? (computed once per case)
                case.float32_reference()
                case.float32_reference = None
                return self.error(got, case, storage)
            if math.isnan(err):  # no later result may replace it: NaN compares false with anything
                return err, name, mine
            if err / mine > worst / tol:
                worst, which, tol = err, name, mine
        return worst, which, tol


def _first_rows(reference: Callable[[], dict[str, torch.Tensor]], rows: int) -> Callable[[], dict[str, torch.Tensor]]:
    """``reference`` with its output cut to its first ``rows`` rows (a block's destinations)."""

    def cut() -> dict[str, torch.Tensor]:
        r = reference()
        return {**r, "output": r["output"][:rows]}

    return cut


def _expected(name: str, value: torch.Tensor, hood: Neighbourhood | None, total: int) -> Expected:
    """Where the whole graph's result (``total`` rows for the output and the input gradient) must equal the
    neighbourhood's ``value``."""
    if hood is None:
        return Expected(value)
    if name == "output":
        return Expected(value[hood.rows], hood.dst, total)
    if name == "input gradient":
        return Expected(value, hood.nodes, total, zero_elsewhere=True)
    return Expected(value)  # a parameter's gradient: dout is zero outside the sample, so it is the whole one


def _hood_params(params: Mapping[str, torch.Tensor], graph: HeteroGraph, hood: Neighbourhood) -> dict[str, torch.Tensor]:
    """``params`` for the reference on ``hood``'s subgraph: the caller's edge weight cut to its edges (the edges
    into its destinations, in the graph's order, which the subgraph keeps)."""
    if EDGE_WEIGHT not in params:
        return dict(params)
    wanted = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    wanted[hood.dst] = True
    return {**params, EDGE_WEIGHT: params[EDGE_WEIGHT][wanted[graph.dst]]}


def _reference(interp: Interpreter, x: torch.Tensor, params: Mapping[str, torch.Tensor],
               dout: torch.Tensor | None, round_to: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The interpreter's results by name, in the dtype of ``x`` (gradients of ``dout`` by autograd); ``round_to``:
    every op's result rounded to it."""
    if dout is None:
        with torch.no_grad():
            return {"output": interp.run(x, params, round_to=round_to).output}
    with torch.enable_grad():
        names = [n for n in params if n != EDGE_WEIGHT]  # the caller's edge weight gets no gradient
        leaves = [t.clone().requires_grad_(True) for t in (x, *(params[n] for n in names))]
        given = {EDGE_WEIGHT: params[EDGE_WEIGHT]} if EDGE_WEIGHT in params else {}
        out = interp.run(leaves[0], {**dict(zip(names, leaves[1:])), **given}, round_to=round_to).output
        grads = torch.autograd.grad(out, leaves, dout, allow_unused=True)
    expected = {"output": out.detach(), "input gradient": grads[0]}
    expected.update({f"gradient of {n}": torch.zeros_like(t) if g is None else g
                     for n, t, g in zip(names, leaves[1:], grads[1:])})
    return expected


def tolerance(base: float, exact: torch.Tensor | None, rounded: torch.Tensor | None, length: int) -> float:
    """A result's tolerance: ``base``, :data:`FLOAT32_MARGIN` x the error of the reference computed in float32
    (``rounded``) against float64 (``exact``), or :data:`REDUCTION_MARGIN` x sqrt(``length``) units of float32
    rounding for its longest sum, whichever is largest.

    Example:
        >>> exact = torch.tensor([1.0, -1.0], dtype=torch.float64)
        >>> tolerance(1e-4, exact, torch.tensor([1.0, -1.0]), 10), tolerance(1e-4, exact, torch.tensor([1.0, -1.003]), 10)
        (0.0001, 0.024000...)
        >>> round(tolerance(1e-4, exact, exact.float(), 150_000), 5)  # a 150,000-edge hub
        0.00037
    """
    own = 0.0 if exact is None or rounded is None else FLOAT32_MARGIN * relative_error(rounded.double(), exact)
    return max(base, own, REDUCTION_MARGIN * math.sqrt(length) * _UNIT)


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|a - ref| / max|ref|`` (``max|a - ref|`` where ``ref`` is all zero; 0 for no elements).

    Example:
        >>> relative_error(torch.tensor([1.0, 2.1]), torch.tensor([1.0, 2.0]))
        0.04999...
    """
    return float((a - ref).abs().max()) / (float(ref.abs().max()) or 1.0) if ref.numel() else 0.0


def shown(tol: float, base: float, storage: str = "float32") -> str:
    """A tolerance as a message says it: where it is above the base, why (``storage``: the program's least
    precise buffer type).

    Example:
        >>> shown(1e-4, 1e-4), shown(3e-4, 1e-4).startswith("0.0003 (")
        ('0.0001', True)
        >>> shown(0.02, 1e-4, "bfloat16")
        '0.02 (the reference rounded to bfloat16 at every op: its error on these inputs x 3; base 0.0001)'
    """
    if tol == base:
        return f"{tol:.3g}"
    if storage != "float32":
        return (f"{tol:.3g} (the reference rounded to {storage} at every op: its error on these inputs x "
                f"{LOW_PRECISION_MARGIN[storage]:g}; base {base:g})")
    return (f"{tol:.3g} (the float32 reference's own error on these inputs x {FLOAT32_MARGIN:g}, or the longest "
            f"float32 sum's expected rounding; base {base:g})")
