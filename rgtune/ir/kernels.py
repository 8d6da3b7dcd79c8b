"""Intra-operator (kernel) IR: what the code generators read.

A :class:`KernelProgram` is a list of kernels over named :class:`Buffer` s. Each kernel is
one of a few templates. A template says what it computes and what it needs (a traversal whose
stage reads a destination's in-edges needs them grouped by destination); how a target may run
it (tiles, threads, mappings) and what it refuses are the backend's, declared next to its code
generator (:mod:`rgtune.codegen.schedule`):

* :class:`GemmKernel`: a segment GEMM. Rows are grouped by type (node type or relation),
  each group meets its own weight; the input row is gathered through an index (the row's
  source node, pair node, ...), the output row may be scattered, and an *epilogue*
  expression may be computed from the fresh output row (an attention inner product).
* :class:`TraversalKernel`: one walk over the edges computing one :class:`Stage`: store an
  edge value, an edge softmax, an aggregation into destinations (or destination pairs),
  softmax and aggregation fused with an online softmax, or an aggregation and the edge stores
  that read its sum (a training program's softmax backward). Mapped destination-parallel
  (no atomics, needs edges grouped by destination) or edge-parallel (atomics). A softmax
  normalizes over each destination's in-edges or, with ``group="dst_rel"``, over each
  destination's in-edges of one relation: in CSR order those are consecutive runs of a
  destination's edges; edge-parallel, a destination pair's (``dst_pair``) row of scratch.
* :class:`MapKernel`: an elementwise expression over the rows of one domain.
* :class:`WeightKernel`: a weight derived by associativity (runs once per call on weights).

A training program (:mod:`rgtune.ir.autodiff`) adds two templates:

* :class:`ScatterKernel`: one walk over the edges accumulating into their *sources* (or source
  pairs): the adjoint of gathering sources. Edges of one source are spread over the layout, so the
  schedule decides how writes of one source never race (atomics, or edges grouped by source).
* :class:`WeightGradKernel`: a segment GEMM whose rows are *reduced*: per type, ``x^T dy`` summed
  over the type's rows (a weight's gradient), or ``dy`` summed (a bias's or a param's).

Per-row computations are :class:`Expr` trees whose leaves load buffers or params *via* an
index relative to the kernel's row: ``row`` (same domain), ``src``/``dst`` (an edge's end
node), ``src_pair``/``dst_pair`` (an edge's unique pair), ``pair_node`` (a pair's node);
params via ``rel``, ``ntype``, ``src_ntype``, ``dst_ntype`` or ``none``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterator

from rgtune.ir.program import EDGE, NODE

#: the kernel IR's rows of a layer's *destination* nodes: the first ``num_dst_nodes`` nodes (every node of a
#: whole graph; a mini-batch's destinations, :class:`~rgtune.data.batch.Batch`). A node value that only
#: destinations need (an output, a root term, a query) is computed and stored for these rows alone
DST_NODE = "dst_node"
#: the row domains of node values
NODE_ROWS = (NODE, DST_NODE)

# ---------------------------------------------------------------------------- buffers


@dataclass(frozen=True)
class Buffer:
    """A materialized tensor ``rows(domain) x heads x dim``, stored as ``dtype`` (``float32``, or a 16-bit
    type a precision knob chose: :mod:`rgtune.ir.passes.precision`; every sum still accumulates in float32)."""

    name: str
    domain: str
    heads: int
    dim: int
    dtype: str = "float32"

    @property
    def width(self) -> int:
        return self.heads * self.dim


# ------------------------------------------------------------------------ expressions


@dataclass(frozen=True)
class Expr:
    """A per-row expression of shape ``heads x dim`` (``dim == 1`` broadcasts)."""

    heads: int
    dim: int

    def children(self) -> tuple["Expr", ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), Expr))

    def walk(self) -> Iterator["Expr"]:
        yield self
        for c in self.children():
            yield from c.walk()

    def flops(self) -> int:
        """Floating point operations per row (loads are free)."""
        return sum(e._own_flops() for e in self.walk())

    def _own_flops(self) -> int:
        return 0


@dataclass(frozen=True)
class Load(Expr):
    """Row ``via`` of ``buffer``. Its ``heads x dim`` may group the buffer's features differently than the
    buffer does (a view: ``heads * dim`` is the buffer's width, element ``(h, d)`` is feature ``h * dim + d``
    of the row): a re-indexed load of the same memory.

    ``guard``: the buffer holds destination rows only (:data:`DST_NODE`) and is zero beyond them, and the
    row read may be any node: the load is zero where the row is ``num_dst_nodes`` or past it."""

    buffer: str
    via: str
    guard: bool = False


@dataclass(frozen=True)
class ParamLoad(Expr):
    param: str
    via: str


@dataclass(frozen=True)
class GraphLoad(Expr):
    """A per-edge constant of the graph (``inv_dst_rel_degree``, ``inv_dst_degree``), or the caller's per-edge
    weight (``edge_weight``: given with each run as ``params[EDGE_WEIGHT]``, in the graph's edge order)."""

    kind: str


@dataclass(frozen=True)
class Acc(Expr):
    """In a GEMM epilogue: the output row just computed."""


@dataclass(frozen=True)
class InnerE(Expr):
    a: Expr
    b: Expr

    def _own_flops(self) -> int:
        return 2 * self.a.heads * self.a.dim


@dataclass(frozen=True)
class BinaryE(Expr):
    op: str
    a: Expr
    b: Expr

    def _own_flops(self) -> int:
        return self.heads * self.dim


@dataclass(frozen=True)
class UnaryE(Expr):
    op: str
    x: Expr
    alpha: float = 0.0

    def _own_flops(self) -> int:
        return self.heads * self.dim * (8 if self.op in ("gelu", "exp", "sigmoid", "gelu_grad", "sigmoid_grad") else 1)


@dataclass(frozen=True)
class ScaleE(Expr):
    x: Expr
    scale: float

    def _own_flops(self) -> int:
        return self.heads * self.dim


@dataclass(frozen=True)
class GatedE(Expr):
    """``sigmoid(gate) h + (1 - sigmoid(gate)) x`` (the gated residual)."""

    gate: Expr
    h: Expr
    x: Expr

    def _own_flops(self) -> int:
        return 4 * self.heads * self.dim + 8


@dataclass(frozen=True)
class ConcatE(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True)
class SliceE(Expr):
    """Features ``start .. start + dim - 1`` of every head of ``x`` (read at other features than the
    element's, as a concatenation's operands are)."""

    x: Expr
    start: int


@dataclass(frozen=True)
class BroadcastE(Expr):
    """``x`` (one head, or one feature) repeated over ``heads`` (``dim``): a sum over heads' adjoint."""

    x: Expr


@dataclass(frozen=True)
class ReduceE(Expr):
    """``x`` summed over its heads (``over="heads"``) or its features (``"dim"``)."""

    x: Expr
    over: str

    def _own_flops(self) -> int:
        return self.x.heads * self.x.dim


def expr_str(e: Expr) -> str:
    """A compact text form of an expression, e.g. ``inner(load(k@src_pair), load(q@dst))``."""
    if isinstance(e, Load):
        return f"{e.buffer}@{e.via}{'?' if e.guard else ''}"
    if isinstance(e, ParamLoad):
        return f"{e.param}[{e.via}]"
    if isinstance(e, GraphLoad):
        return e.kind
    if isinstance(e, Acc):
        return "acc"
    if isinstance(e, InnerE):
        return f"inner({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, BinaryE):
        sym = {"add": "+", "sub": "-", "mul": "*"}[e.op]
        return f"({expr_str(e.a)} {sym} {expr_str(e.b)})"
    if isinstance(e, UnaryE):
        return f"{e.op}({expr_str(e.x)}{', ' + str(e.alpha) if e.op.startswith('leaky_relu') else ''})"
    if isinstance(e, ScaleE):
        return f"{expr_str(e.x)} * {e.scale:.6g}"
    if isinstance(e, GatedE):
        return f"gated({expr_str(e.gate)}, {expr_str(e.h)}, {expr_str(e.x)})"
    if isinstance(e, ConcatE):
        return f"concat({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, SliceE):
        return f"slice_{e.start}:{e.start + e.dim}({expr_str(e.x)})"
    if isinstance(e, ReduceE):
        return f"sum_{e.over}({expr_str(e.x)})"
    if isinstance(e, BroadcastE):
        return f"broadcast_{e.heads}x{e.dim}({expr_str(e.x)})"
    raise TypeError(type(e))


def expr_loads(e: Expr) -> set[tuple[str, str]]:
    return {(x.buffer, x.via) for x in e.walk() if isinstance(x, Load)}


# ---------------------------------------------------------------------------- kernels


@dataclass
class Kernel:
    name: str

    @property
    def template(self) -> str:
        return template_name(type(self))

    def reads(self) -> set[str]:
        return set()

    def writes(self) -> set[str]:
        return set()

    def describe(self) -> str:
        raise NotImplementedError


@dataclass
class GemmKernel(Kernel):
    """``out[row] = x[in_index(row)] @ W[type(row)] (+ b[type(row)])``, rows grouped by type.

    ``rows`` is the domain iterated (node, edge, src_pair, dst_pair); ``x_via`` how a row finds
    its input row (``row``, ``src``, ``dst``, ``pair_node``). ``by`` picks the weight slice
    (``ntype`` of the row's node or of ``weight_end`` for edge/pair rows, ``rel``, ``none``).
    ``out`` may be ``None`` when only the epilogue outputs are needed; ``accumulate`` adds the
    rows into ``out`` at ``out_via`` (``row`` or ``pair_node``) instead of storing them.
    """

    rows: str = NODE
    x: str = ""
    x_via: str = "row"
    weight: str = ""
    bias: str | None = None
    by: str = "none"
    weight_end: str | None = None
    per_head: bool = False
    in_heads: int = 1
    in_dim: int = 0
    out_heads: int = 1
    out_dim: int = 0
    out: str | None = None
    out_via: str = "row"
    accumulate: bool = False
    epilogue: list[tuple[str, Expr]] = field(default_factory=list)

    def reads(self) -> set[str]:
        r = {self.x}
        for _, e in self.epilogue:
            r |= {b for b, _ in expr_loads(e)}
        return r

    def writes(self) -> set[str]:
        return ({self.out} if self.out else set()) | {o for o, _ in self.epilogue}

    def flops_per_row(self) -> int:
        k = self.in_dim if self.per_head else self.in_heads * self.in_dim
        n = self.out_heads * self.out_dim
        return 2 * k * n + sum(e.flops() for _, e in self.epilogue)

    def describe(self) -> str:
        src = self.x if self.x_via == "row" else f"{self.x}@{self.x_via}"
        w = f"{self.weight}[{self.by if self.by != 'ntype' or not self.weight_end else self.weight_end + '_ntype'}]"
        b = f" + {self.bias}" if self.bias else ""
        head = " per_head" if self.per_head else ""
        target = "(discarded)" if self.out is None else (f"{self.out}@{self.out_via} +=" if self.accumulate else f"{self.out} =")
        lines = [f"gemm {self.name} over {self.rows} rows: {target} {src} @ {w}{b}{head}  "
                 f"[{self.in_heads}x{self.in_dim} -> {self.out_heads}x{self.out_dim}]"]
        for o, e in self.epilogue:
            lines.append(f"    epilogue {o} = {expr_str(e)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Stage:
    """What one traversal computes per edge (and per destination)."""

    def exprs(self) -> tuple[Expr, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), Expr))

    def needs_dst_grouping(self) -> bool:
        return False

    def feature_dim(self) -> int:
        return max(e.dim for e in self.exprs())

    def outputs(self) -> tuple[str, ...]:
        """The buffers the stage writes."""
        return (self.out,)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EdgeStore(Stage):
    """``out[edge] = value``."""

    out: str
    value: Expr


@dataclass(frozen=True)
class EdgeStores(Stage):
    """Several :class:`EdgeStore` in one walk over the edges (``autodiff.reuse=fuse``): each edge's rows are
    loaded once, and what the values share (a backward's score gradient, its inner products and feature
    sums) is computed once per edge and row of heads. Every store has the same shape (heads x dim), and
    none reads another's output (:mod:`rgtune.ir.edge_stores` merges only such)."""

    stores: tuple[EdgeStore, ...]

    def exprs(self) -> tuple[Expr, ...]:
        return tuple(s.value for s in self.stores)

    def outputs(self) -> tuple[str, ...]:
        return tuple(s.out for s in self.stores)


@dataclass(frozen=True)
class EdgeSoftmaxStage(Stage):
    """``out[edge] = exp(score - max) / sum`` over each destination's in-edges, per head; with
    ``group="dst_rel"``, over each destination's in-edges of one relation (one destination pair)."""

    out: str
    score: Expr
    group: str = "dst"

    def needs_dst_grouping(self) -> bool:
        return True


@dataclass(frozen=True)
class AggregateStage(Stage):
    """``out[dst or dst_pair of edge] += message``."""

    out: str
    out_via: str  # "dst" or "dst_pair"
    message: Expr

    def needs_dst_grouping(self) -> bool:
        return True


@dataclass(frozen=True)
class AggregateStores(Stage):
    """An aggregation into destinations, then edge stores that read its sum at their destination, in one
    walk (``autodiff.reuse=fuse``): a softmax backward's ``s[dst] += alpha * <dout, m>`` followed by the
    score gradients that read ``s@dst``. Destination-parallel, a destination's in-edges are walked twice
    (sum, then store) by its one thread (warp), so the sum is ready without a launch in between and the
    edges' rows are still in cache; edge-parallel it is two loops (the sum's atomics must all land before
    any store reads it). The stores read ``total.out`` at ``total.out_via`` only, and the sum reads none of their
    outputs (:mod:`rgtune.ir.edge_stores` fuses only such). Into destination pairs (a softmax per relation's
    backward) likewise: a destination's pairs are its own, summed before its edges are stored."""

    total: AggregateStage
    stores: tuple[EdgeStore, ...]

    def exprs(self) -> tuple[Expr, ...]:
        return (self.total.message, *(s.value for s in self.stores))

    def outputs(self) -> tuple[str, ...]:
        return (self.total.out, *(s.out for s in self.stores))

    def needs_dst_grouping(self) -> bool:
        return True

    def feature_dim(self) -> int:
        """The feature size a vector width must divide: both walks' rows (the sum's and the stores')."""
        return math.gcd(*(e.dim for e in self.exprs()))


@dataclass(frozen=True)
class SoftmaxAggregate(Stage):
    """Fused: ``out[dst(e) or dst_pair(e)] += softmax_dst(score)[e] * message[e]`` (online softmax);
    ``group`` as :class:`EdgeSoftmaxStage`'s (``softmax_dst_rel``: normalized per destination pair)."""

    out: str
    out_via: str
    score: Expr
    message: Expr
    group: str = "dst"

    def needs_dst_grouping(self) -> bool:
        return True


def softmax_name(group: str) -> str:
    """How kernel descriptions (and the generated sources' comments) write a softmax over ``group``:
    ``softmax_dst`` (each destination's in-edges) or ``softmax_dst_rel`` (each destination pair's)."""
    return f"softmax_{group}"


@dataclass
class TraversalKernel(Kernel):
    """One walk over the edges (in the layout's order) computing ``stage``."""

    stage: Stage = field(default_factory=lambda: EdgeStore("", Acc(1, 1)))
    layout: str = "csr_dst"

    def reads(self) -> set[str]:
        return {b for e in self.stage.exprs() for b, _ in expr_loads(e)}

    def writes(self) -> set[str]:
        return set(self.stage.outputs())

    def flops_per_edge(self) -> int:
        st = self.stage
        if isinstance(st, EdgeStores):  # what the values share is computed once
            return _distinct_flops(st.exprs())
        if isinstance(st, AggregateStores):  # the sum's walk, its accumulation, then the stores' walk
            m = st.total.message
            return m.flops() + m.heads * m.dim + _distinct_flops(tuple(s.value for s in st.stores))
        f = sum(e.flops() for e in st.exprs())
        if isinstance(st, (EdgeSoftmaxStage, SoftmaxAggregate)):
            f += 10 * st.score.heads  # exp, max, sum, divide
        if isinstance(st, (AggregateStage, SoftmaxAggregate)):
            f += st.message.heads * st.message.dim  # the accumulation
        if isinstance(st, SoftmaxAggregate):
            f += st.message.heads * st.message.dim  # the weighting by the softmax
        return f

    def describe(self) -> str:
        st = self.stage
        if isinstance(st, EdgeStore):
            body = f"{st.out}[e] = {expr_str(st.value)}"
        elif isinstance(st, EdgeStores):  # one store per line, as a GEMM's epilogues
            body = f"{len(st.stores)} stores" + "".join(f"\n    {s.out}[e] = {expr_str(s.value)}" for s in st.stores)
        elif isinstance(st, AggregateStores):
            t = st.total
            n = len(st.stores)
            body = (f"{t.out}[{t.out_via}] += {expr_str(t.message)}, then {n} store{'s' if n > 1 else ''}"
                    + "".join(f"\n    {s.out}[e] = {expr_str(s.value)}" for s in st.stores))
        elif isinstance(st, EdgeSoftmaxStage):
            body = f"{st.out}[e] = {softmax_name(st.group)}({expr_str(st.score)})"
        elif isinstance(st, AggregateStage):
            body = f"{st.out}[{st.out_via}] += {expr_str(st.message)}"
        elif isinstance(st, SoftmaxAggregate):
            body = f"{st.out}[{st.out_via}] += {softmax_name(st.group)}({expr_str(st.score)}) * {expr_str(st.message)}"
        else:  # pragma: no cover
            body = repr(st)
        return f"traversal {self.name} over edges ({self.layout}): {body}"


def _distinct_flops(exprs: tuple[Expr, ...]) -> int:
    """The FLOPs of ``exprs`` with each distinct subexpression counted once (computed once per edge)."""
    return sum(x._own_flops() for x in {x for e in exprs for x in e.walk()})


@dataclass
class MapKernel(Kernel):
    """``out[row] = value`` for every row of ``rows``."""

    rows: str = NODE
    out: str = ""
    value: Expr = field(default_factory=lambda: Acc(1, 1))

    def reads(self) -> set[str]:
        return {b for b, _ in expr_loads(self.value)}

    def writes(self) -> set[str]:
        return {self.out}

    def describe(self) -> str:
        return f"map {self.name} over {self.rows} rows: {self.out} = {expr_str(self.value)}"


@dataclass
class WeightKernel(Kernel):
    """A derived weight (see :class:`rgtune.ir.program.FoldWeights`); runs once per call."""

    out: str = ""
    mode: str = ""
    a: str = ""
    b: str | None = None
    end: str | None = None

    def describe(self) -> str:
        return f"weights {self.out} := fold_{self.mode}({self.a}{', ' + self.b if self.b else ''}{', end=' + self.end if self.end else ''})"


@dataclass
class ScatterKernel(Kernel):
    """``out[src(e) or src_pair(e)] += message(e)`` for every edge ``e`` (the layout's order); or, over the rows of
    a pair domain (``rows``), ``out[pair_node(p)] += message(p)``: pairs of several relations share a node."""

    out: str = ""
    out_via: str = "src"  # "src" (a node) or "src_pair" for edge rows; "pair_node" for pair rows
    message: Expr = field(default_factory=lambda: Acc(1, 1))
    layout: str = "csr_dst"
    rows: str = EDGE

    def reads(self) -> set[str]:
        return {b for b, _ in expr_loads(self.message)}

    def writes(self) -> set[str]:
        return {self.out}

    def flops_per_edge(self) -> int:
        return self.message.flops() + self.message.heads * self.message.dim

    def describe(self) -> str:
        over = f"edges ({self.layout})" if self.rows == EDGE else f"{self.rows} rows"
        return f"scatter {self.name} over {over}: {self.out}[{self.out_via}] += {expr_str(self.message)}"


@dataclass
class WeightGradKernel(Kernel):
    """``grad[type] (+)= sum_r x[in_index(r)]^T dy[r]`` over the rows ``r`` of each type (``x`` None: ``sum_r dy[r]``).

    ``rows``, ``x_via``, ``by``, ``weight_end`` and ``per_head`` are those of the :class:`GemmKernel` whose
    weight ``param`` is (``dy`` is that GEMM's output gradient, read per row); ``grad`` is the gradient param
    written, one slice per type, zeroed first unless ``accumulate`` (a param used twice adds up).
    """

    rows: str = NODE
    x: str | None = None
    x_via: str = "row"
    dy: str = ""
    grad: str = ""
    param: str = ""
    by: str = "none"
    weight_end: str | None = None
    per_head: bool = False
    in_heads: int = 1
    in_dim: int = 0
    out_heads: int = 1
    out_dim: int = 0
    accumulate: bool = False

    def reads(self) -> set[str]:
        return {self.dy} | ({self.x} if self.x else set())

    def writes(self) -> set[str]:
        return set()

    def flops_per_row(self) -> int:
        k = self.in_dim if self.per_head else self.in_heads * self.in_dim
        return 2 * k * self.out_heads * self.out_dim if self.x else self.out_heads * self.out_dim

    def describe(self) -> str:
        src = "1" if self.x is None else (self.x if self.x_via == "row" else f"{self.x}@{self.x_via}")
        by = self.by if self.by != "ntype" or not self.weight_end else self.weight_end + "_ntype"
        op = "+=" if self.accumulate else "="
        return (f"weight_grad {self.name} over {self.rows} rows: {self.grad}[{by}] {op} sum {src}^T {self.dy}"
                f"{' per_head' if self.per_head else ''}  [{self.in_heads}x{self.in_dim} -> {self.out_heads}x{self.out_dim}]")


TEMPLATES: tuple[type[Kernel], ...] = (GemmKernel, TraversalKernel, MapKernel, ScatterKernel, WeightGradKernel)


# ----------------------------------------------------------------------- programs


@dataclass
class KernelProgram:
    """Lowered program: buffers, params, kernels in execution order, and the output buffer.

    ``layout`` / ``index_bits`` / ``pair_index`` are the graph-side choices every kernel shares.
    ``param_shapes`` holds the full shape of every param (learnable and derived).
    """

    name: str
    buffers: dict[str, Buffer]
    kernels: list[Kernel]
    input: str
    output: str
    param_shapes: dict[str, tuple[int, ...]]
    param_by: dict[str, str]
    layout: str = "csr_dst"
    index_bits: int = 64
    pair_index: str = "direct"
    zero_init: set[str] = field(default_factory=set)
    #: a training program's: the output's gradient (a second input buffer), the input's gradient (a buffer),
    #: param -> its gradient param (written by weight-gradient kernels), and how many kernels are the forward's
    dout: str | None = None
    input_grad: str | None = None
    param_grads: dict[str, str] = field(default_factory=dict)
    forward_kernels: int | None = None

    @property
    def is_training(self) -> bool:
        return self.dout is not None

    @property
    def saved(self) -> tuple[str, ...]:
        """A training program's buffers that its forward writes and its backward reads (the input
        excluded: the caller keeps it): what the forward hands to the backward, held in between."""
        if not self.is_training:
            return ()
        forward, backward = self.kernels[:self.forward_kernels], self.kernels[self.forward_kernels:]
        written = set().union(*(k.writes() for k in forward))
        read = set().union(*(k.reads() for k in backward))
        return tuple(sorted((written & read) - {self.input}))

    @property
    def storage(self) -> dict[str, str]:
        """Buffer name -> its storage type, for the buffers not stored as float32."""
        return {n: b.dtype for n, b in self.buffers.items() if b.dtype != "float32"}

    @property
    def saved_params(self) -> tuple[str, ...]:
        """A training program's derived params folded by its forward (the backward reads them too:
        they are handed over rather than folded twice)."""
        if not self.is_training:
            return ()
        return tuple(k.out for k in self.kernels[:self.forward_kernels] if isinstance(k, WeightKernel))

    def describe(self) -> str:
        lines = [f"kernels {self.name}: layout={self.layout} index_bits={self.index_bits} pair_index={self.pair_index}"]
        for b in self.buffers.values():
            stored = "" if b.dtype == "float32" else f" {b.dtype}"
            lines.append(f"  buffer {b.name}: {b.domain}[{b.heads}x{b.dim}]{stored}"
                         f"{' (zeroed)' if b.name in self.zero_init else ''}")
        for i, k in enumerate(self.kernels):
            if i == self.forward_kernels:
                lines.append("  # backward")
            lines.append("  " + k.describe().replace("\n", "\n  "))
        lines.append(f"  output {self.output}")
        if self.is_training:
            grads = ", ".join(f"{p}: {g}" for p, g in self.param_grads.items())
            lines.append(f"  gradients: input {self.input_grad}; {grads}")
        return "\n".join(lines)


def template_name(t: type[Kernel]) -> str:
    return t.__name__.replace("Kernel", "").lower()


def kernel_exprs(k: Kernel) -> tuple[Expr, ...]:
    """The expressions a kernel evaluates per row (a GEMM's epilogue, a traversal's stage, a map's value,
    a scatter's message); none for the others."""
    if isinstance(k, GemmKernel):
        return tuple(e for _, e in k.epilogue)
    if isinstance(k, TraversalKernel):
        return k.stage.exprs()
    if isinstance(k, MapKernel):
        return (k.value,)
    if isinstance(k, ScatterKernel):
        return (k.message,)
    return ()


def reads_guarded(k: Kernel) -> bool:
    """Whether ``k`` reads a destinations' buffer at rows that may be past them (:attr:`Load.guard`): its
    code needs the destinations' count."""
    return any(isinstance(x, Load) and x.guard for e in kernel_exprs(k) for x in e.walk())
