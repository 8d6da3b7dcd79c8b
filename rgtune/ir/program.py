"""Inter-operator IR: values with domains, operators, and :class:`Program`.

A value lives on a *domain* (what one row of it is) and has a shape of ``heads x features``:

=============  ===========================================================
``node``       one row per node (global numbering of the graph)
``edge``       one row per edge (stored in the layout's edge order)
``src_pair``   one row per unique (source node, relation) pair
``dst_pair``   one row per unique (destination node, relation) pair
=============  ===========================================================

Weights are :class:`Param` s indexed by node type, relation, or nothing. Every op is a small
frozen dataclass; a :class:`Program` is a list of them in SSA form. Models are written with
:class:`ProgramBuilder`, whose methods read like the equations (see ``rgtune.ir.models``).

Example:
    >>> b = ProgramBuilder("tiny", in_dim=8)
    >>> z = b.typed_linear(b.src(b.x), "weight", out=(1, 4), by="rel")
    >>> print(b.finish(b.aggregate(z)))  # doctest: +NORMALIZE_WHITESPACE
    program tiny(x: node[1x8])
      param weight: rel[8x4]
      %0 = gather(x, end=src) : edge[1x8]
      %1 = typed_linear(%0, weight, by=rel) : edge[1x4]
      %2 = aggregate(%1, to=node, reduce=sum) : node[1x4]
      return %2
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, Sequence

NODE, EDGE, SRC_PAIR, DST_PAIR = "node", "edge", "src_pair", "dst_pair"
DOMAINS = (NODE, EDGE, SRC_PAIR, DST_PAIR)
PAIR_OF_SIDE = {"src": SRC_PAIR, "dst": DST_PAIR}

ParamBy = Literal["ntype", "rel", "none"]
#: how a learnable param starts: Glorot uniform over the last two dims of its full tensor (PyG's ``glorot``: a
#: slice's own two for a matrix slice; types x entries for a per-type vector, RGCN's ``comp (R, B)``), 0, 1,
#: or ``uniform``: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the param's ``fan_in`` (the default of torch's and
#: PyG's ``Linear``, for its weight and its bias alike)
ParamInit = Literal["glorot", "zeros", "ones", "uniform"]
PARAM_INITS = ("glorot", "zeros", "ones", "uniform")

#: ``inc_positive``: ``x + 1`` where ``x > 0``, else ``x`` (PyG ``RGATConv``'s ``mod="f-additive"``), derivative 1
UNARY_OPS = ("leaky_relu", "gelu", "exp", "sigmoid", "relu", "neg", "inc_positive")
#: what an edge softmax normalizes over: each destination's in-edges (all relations), or each destination's
#: in-edges of one relation (a unique (destination, relation) pair: DGL's per-relation ``GATConv`` summed)
SOFTMAX_GROUPS = ("dst", "dst_rel")
#: the derivatives of the unary ops, written as unary ops of the same input (the adjoint uses them)
UNARY_GRAD_OPS = ("leaky_relu_grad", "gelu_grad", "sigmoid_grad", "relu_grad")
BINARY_OPS = ("add", "sub", "mul")
#: the :class:`GraphConst` kind of a per-edge weight the caller gives with every call, and the key under which
#: it travels beside the params (``params[EDGE_WEIGHT]``: one value per edge in the graph's edge order, see
#: :meth:`rgtune.ir.bind.GraphArrays.edge_weight`)
EDGE_WEIGHT = "edge_weight"


class IRError(ValueError):
    """A program is malformed (shapes, domains, unknown params)."""


@dataclass(frozen=True)
class Param:
    """A learnable weight, one slice per node type / relation (or one for all).

    ``shape`` is the shape of one slice. ``per_head`` linears have slices ``(H, Din, Dout)``.
    ``derived`` params are computed from others each call (linear reordering folds weights);
    they are not in the state_dict. ``init`` says how a layer initializes a learnable one; ``fan_in``
    is the input size the ``uniform`` init scales by (a bias's is its linear's, not in its shape).
    """

    name: str
    by: ParamBy
    shape: tuple[int, ...]
    derived: bool = False
    #: the gradient of this param (an adjoint program's output; see :mod:`rgtune.ir.autodiff`)
    grad_of: str | None = None
    init: ParamInit = "glorot"
    fan_in: int | None = None

    def __str__(self) -> str:
        kind = "derived " if self.derived else f"grad({self.grad_of}) " if self.grad_of else ""
        return f"{kind}param {self.name}: {self.by}[{'x'.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Value:
    """An SSA value: ``domain[heads x dim]``."""

    name: str
    domain: str
    heads: int
    dim: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.heads, self.dim)

    def __str__(self) -> str:
        return self.name


# ----------------------------------------------------------------------------- ops
@dataclass(frozen=True)
class Op:
    """Base of all ops: ``out`` is the value it defines."""

    out: Value

    def inputs(self) -> tuple[Value, ...]:
        return tuple(v for v in (getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "out") if isinstance(v, Value))

    def params(self) -> tuple[str, ...]:
        return ()

    def attrs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "out" and not isinstance(getattr(self, f.name), Value)}

    @property
    def opname(self) -> str:
        return _OPNAMES[type(self)]

    def replace(self, **changes: Any) -> "Op":
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        name = self.opname
        hidden = {"domain"}
        if isinstance(self, (Binary, Unary)):
            name = self.op
            hidden |= {"op"} | ({"alpha"} if self.op != "leaky_relu" else set())
        if isinstance(self, EdgeSoftmax) and self.group == "dst":
            hidden.add("group")  # the default: programs written before groups existed read as they did
        args = [v.name for v in self.inputs()]
        for k, v in self.attrs().items():
            if v is None or v is False or k in hidden:
                continue
            if k in ("weight", "bias", "param", "skip"):
                args.append(str(v))
            else:
                args.append(f"{k}={v}")
        return f"{self.out.name} = {name}({', '.join(args)}) : {self.out.domain}[{self.out.heads}x{self.out.dim}]"


@dataclass(frozen=True)
class Gather(Op):
    """Per edge, the row of a node value at the edge's ``end`` (``src`` or ``dst``)."""

    x: Value
    end: Literal["src", "dst"]


@dataclass(frozen=True)
class GatherPair(Op):
    """Per unique (node, relation) pair on ``side``, the row of a node value at the pair's node."""

    x: Value
    side: Literal["src", "dst"]


@dataclass(frozen=True)
class Expand(Op):
    """Per edge, the row of a pair value at the edge's pair (compact materialization's reader)."""

    x: Value


@dataclass(frozen=True)
class TypedLinear(Op):
    """``x @ weight[type] (+ bias[type])``, the type being the row's node type or relation.

    ``per_head``: ``weight[type]`` is ``(H, Din, Dout)`` and head ``h`` of ``x`` meets matrix ``h``;
    otherwise ``x`` is flattened to ``heads*dim`` and ``weight[type]`` is ``(Din, H*Dout)``.
    ``end`` picks which end's node type indexes the weight when rows are edges or pairs and
    ``by == "ntype"`` (a composed linear).
    """

    x: Value
    weight: str
    bias: str | None
    by: ParamBy
    per_head: bool = False
    end: Literal["src", "dst"] | None = None

    def params(self) -> tuple[str, ...]:
        return (self.weight,) + ((self.bias,) if self.bias else ())


@dataclass(frozen=True)
class ParamRead(Op):
    """Per row, the slice ``param[type]`` of a ``(H, D)`` parameter (an attention vector, a prior)."""

    param: str
    by: ParamBy
    domain: str
    end: Literal["src", "dst"] | None = None

    def params(self) -> tuple[str, ...]:
        return (self.param,)


@dataclass(frozen=True)
class GraphConst(Op):
    """A per-edge constant of the graph; ``inv_dst_rel_degree`` is ``1 / |N_r(dst)|``, ``inv_dst_degree``
    ``1 / |N(dst)|``, ``dst_degree`` ``|N(dst)|`` (the destination's in-degree over all relations)."""

    kind: Literal["inv_dst_rel_degree", "inv_dst_degree", "dst_degree"]
    domain: str


@dataclass(frozen=True)
class Inner(Op):
    """Per head, the inner product over features: ``(H, D) x (H, D) -> (H, 1)``."""

    a: Value
    b: Value


@dataclass(frozen=True)
class Binary(Op):
    """Elementwise ``add``/``sub``/``mul`` with broadcasting of a 1-feature operand (and of heads)."""

    op: str
    a: Value
    b: Value


@dataclass(frozen=True)
class Unary(Op):
    """Elementwise ``leaky_relu`` (slope ``alpha``), ``gelu`` (erf), ``exp``, ``sigmoid``, ``relu``, ``neg``."""

    op: str
    x: Value
    alpha: float = 0.0


@dataclass(frozen=True)
class Scale(Op):
    """Multiply by a compile-time constant."""

    x: Value
    scale: float


@dataclass(frozen=True)
class EdgeSoftmax(Op):
    """Per head, softmax over a group of edges: ``group="dst"``, a destination's in-edges (all relations);
    ``"dst_rel"``, a destination's in-edges of one relation (one unique (destination, relation) pair:
    the edges of one ``dst_pair`` row). Printed only when not the default."""

    x: Value
    group: Literal["dst", "dst_rel"] = "dst"

    def __post_init__(self) -> None:
        if self.group not in SOFTMAX_GROUPS:
            raise IRError(f"edge_softmax: unknown group {self.group!r}; choose one of {list(SOFTMAX_GROUPS)}")


@dataclass(frozen=True)
class Aggregate(Op):
    """Sum (or mean) rows into the node or pair they belong to on one ``end`` of the edge (None: the
    destination): edge -> node, edge -> pair of that end, pair -> its node. The source side is what
    a gather of sources turns into in the adjoint (:mod:`rgtune.ir.autodiff`)."""

    x: Value
    to: str
    reduce: Literal["sum", "mean"] = "sum"
    end: Literal["src", "dst"] | None = None

    @property
    def side(self) -> str:
        return self.end or "dst"


@dataclass(frozen=True)
class ReduceSum(Op):
    """Sum over the heads (``over="heads"``: ``(H, D) -> (1, D)``) or the features (``"dim"``: ``(H, D) -> (H, 1)``);
    the adjoint of a broadcast."""

    x: Value
    over: Literal["heads", "dim"]


@dataclass(frozen=True)
class Broadcast(Op):
    """``x`` repeated over the heads (``x`` has 1 head) or the features (1 feature) of ``out``: the adjoint
    of a :class:`ReduceSum` (a sum over heads in the forward: the basis combination of RGCN's
    ``reorder.bases=transform``)."""

    x: Value


@dataclass(frozen=True)
class View(Op):
    """The same rows with their features grouped into other heads: ``(H, D) -> (H', D')`` with
    ``H * D == H' * D'`` (row-major: head ``h'`` is features ``h' D' .. (h' + 1) D' - 1`` of the row).
    No data moves; it reads the buffer of ``x`` (RGCN's block-diagonal decomposition splits a node's
    features into blocks, and joins the blocks' outputs back)."""

    x: Value


@dataclass(frozen=True)
class Concat(Op):
    """Concatenate features of two values of the same domain and heads."""

    a: Value
    b: Value


@dataclass(frozen=True)
class Slice(Op):
    """Features ``start .. start + out.dim - 1`` of every head of ``x`` (the adjoint of a :class:`Concat`)."""

    x: Value
    start: int


@dataclass(frozen=True)
class GatedResidual(Op):
    """``sigmoid(skip[ntype]) * h + (1 - sigmoid(skip[ntype])) * x`` per node."""

    h: Value
    x: Value
    skip: str

    def params(self) -> tuple[str, ...]:
        return (self.skip,)


@dataclass(frozen=True)
class FoldWeights(Op):
    """Derive a weight by associativity (linear operator reordering); computed once per call.

    ``mode``:
      * ``vec``: ``W[r] (Din, H*D)`` with ``a[r] (H, D)`` -> ``(Din, H)``: ``(h W) a = h (W a)``.
      * ``compose``: ``A[ntype of end of r] (Din, H*D)`` then per-head ``B[r] (H, D, D)``
        -> ``(Din, H*D)``; with ``bias_of``, the bias ``b_A[nt] B[r]`` instead.
      * ``transpose``: per-head ``B[r] (H, D, D)`` -> ``B[r]^T``.
      * ``split_heads``: ``W[r] (Din, H*D)`` -> ``(H, Din, D)``.
      * ``bases``: bases ``V (B, Din, Dout)`` (``a``) with coefficients ``comp[r] (B,)`` (``b``) ->
        ``W[r] = sum_b comp[r, b] V[b]`` ``(Din, Dout)`` (R-GCN's basis decomposition).
      * ``join_heads``: ``V (H, Din, D)`` -> ``(Din, H*D)``: column block ``h`` is ``V[h]`` (one GEMM
        applies every basis at once).
    The output is a derived :class:`Param` named by ``out_param``; ``out`` is a dummy value.
    """

    out_param: str
    mode: Literal["vec", "compose", "transpose", "compose_bias", "split_heads", "bases", "join_heads"]
    a: str
    b: str | None = None
    end: Literal["src", "dst"] | None = None

    def params(self) -> tuple[str, ...]:
        return (self.a,) + ((self.b,) if self.b else ())

    def __str__(self) -> str:
        extra = f", end={self.end}" if self.end else ""
        b = f", {self.b}" if self.b else ""
        return f"{self.out_param} := fold_{self.mode}({self.a}{b}{extra})"


@dataclass(frozen=True)
class WeightGrad(Op):
    """The gradient of a param: per type, the sum over the rows of that type of ``x^T dy`` (a weight), or of
    ``dy`` (``x`` None: a bias, an attention vector, a gate). ``accumulate`` adds to the gradient's earlier
    contributions (a param used twice). Like :class:`FoldWeights` it defines a param (``out_param``, whose
    :attr:`Param.grad_of` is ``param``); ``out`` is a dummy value."""

    out_param: str
    param: str
    x: Value | None
    dy: Value
    by: ParamBy
    per_head: bool = False
    end: Literal["src", "dst"] | None = None
    accumulate: bool = False

    def params(self) -> tuple[str, ...]:
        return (self.param,)

    def __str__(self) -> str:
        x = self.x.name if self.x is not None else "1"
        flags = "".join((", per_head" if self.per_head else "", f", end={self.end}" if self.end else "",
                         ", +=" if self.accumulate else ""))
        return f"{self.out_param} := weight_grad({x}, {self.dy.name}, by={self.by}{flags})"


#: ops that define a param instead of a value
PARAM_OPS = (FoldWeights, WeightGrad)


_OPNAMES: dict[type, str] = {
    Gather: "gather",
    GatherPair: "gather_pair",
    Expand: "expand",
    TypedLinear: "typed_linear",
    ParamRead: "param",
    GraphConst: "graph_const",
    Inner: "inner",
    Binary: "binary",
    Unary: "unary",
    Scale: "scale",
    EdgeSoftmax: "edge_softmax",
    Aggregate: "aggregate",
    ReduceSum: "reduce_sum",
    Broadcast: "broadcast",
    View: "view",
    WeightGrad: "weight_grad",
    Concat: "concat",
    Slice: "slice",
    GatedResidual: "gated_residual",
    FoldWeights: "fold",
}
_BUILTIN_OPS = frozenset(_OPNAMES)


def register_opname(op_type: type, name: str) -> None:
    """How ops of ``op_type`` print (:func:`rgtune.ir.op_rules.register_op` calls it)."""
    if op_type in _BUILTIN_OPS and _OPNAMES[op_type] != name:
        raise IRError(f"{op_type.__name__} is a built-in op, printed as {_OPNAMES[op_type]!r}")
    _OPNAMES[op_type] = name


def unregister_opname(op_type: type) -> None:
    if op_type not in _BUILTIN_OPS:
        _OPNAMES.pop(op_type, None)


# ------------------------------------------------------------------------- program
@dataclass
class Program:
    """A model in the inter-operator IR: one node input ``x``, params, ops (SSA), one output.

    What the passes decide beyond the program itself (edge layout, fusion) is not in it: they hand
    it to lowering as a :class:`~rgtune.ir.plan.LoweringPlan`.

    A training program (:func:`rgtune.ir.autodiff.adjoint`) also reads the output's gradient
    (``inputs``: ``(dout,)``) and defines the input's gradient (``input_grad``) and, for every
    param, its gradient param (``param_grads``: param -> the grad param a :class:`WeightGrad`
    defines); its first ``forward_ops`` ops are the forward's, the rest the backward's.
    """

    name: str
    x: Value
    params: dict[str, Param]
    ops: list[Op]
    output: Value
    heads: int = 1
    inputs: tuple[Value, ...] = ()
    input_grad: Value | None = None
    param_grads: dict[str, str] = field(default_factory=dict)
    forward_ops: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def copy(self, **changes: Any) -> "Program":
        kw = dict(name=self.name, x=self.x, params=dict(self.params), ops=list(self.ops), output=self.output,
                  heads=self.heads, inputs=self.inputs, input_grad=self.input_grad,
                  param_grads=dict(self.param_grads), forward_ops=self.forward_ops)
        kw.update(changes)
        return Program(**kw)

    # -- queries ---------------------------------------------------------------
    def producers(self) -> dict[str, Op]:
        return {op.out.name: op for op in self.ops if not isinstance(op, PARAM_OPS)}

    def users(self) -> dict[str, list[Op]]:
        users: dict[str, list[Op]] = {}
        for op in self.ops:
            for v in op.inputs():
                users.setdefault(v.name, []).append(op)
        return users

    def values(self) -> Iterator[Value]:
        yield self.x
        yield from self.inputs
        for op in self.ops:
            if not isinstance(op, PARAM_OPS):
                yield op.out

    @property
    def in_dim(self) -> int:
        return self.x.dim

    @property
    def out_dim(self) -> int:
        return self.output.heads * self.output.dim

    def state_params(self) -> dict[str, Param]:
        """The learnable params (the layer's state_dict), without derived ones and gradients."""
        return {k: p for k, p in self.params.items() if not p.derived and p.grad_of is None}

    @property
    def is_training(self) -> bool:
        """Whether this program also computes gradients (see :mod:`rgtune.ir.autodiff`)."""
        return self.input_grad is not None or bool(self.param_grads)

    # -- checks ------------------------------------------------------------------
    def validate(self) -> None:
        defined = {self.x.name, *(v.name for v in self.inputs)}
        for op in self.ops:
            for v in op.inputs():
                if v.name not in defined:
                    raise IRError(f"{op}: input {v.name} is used before it is defined")
            for p in op.params():
                if p not in self.params:
                    raise IRError(f"{op}: unknown param {p!r}; params are {sorted(self.params)}")
            if isinstance(op, PARAM_OPS):
                if op.out_param not in self.params:
                    raise IRError(f"{op}: the param it defines, {op.out_param!r}, is not declared")
                continue
            if op.out.name in defined:
                raise IRError(f"value {op.out.name} is defined twice")
            defined.add(op.out.name)
        for v in (self.output, self.input_grad):
            if v is not None and v.name not in defined:
                raise IRError(f"output {v.name} is never defined")
        defining = {op.out_param for op in self.ops if isinstance(op, WeightGrad)}
        for param, grad in self.param_grads.items():
            if grad not in defining:
                raise IRError(f"the gradient {grad!r} of {param!r} is never computed")

    # -- text ------------------------------------------------------------------
    def __str__(self) -> str:
        args = ", ".join(f"{v.name}: {v.domain}[{v.heads}x{v.dim}]" for v in (self.x, *self.inputs))
        lines = [f"program {self.name}({args})"]
        lines += [f"  {p}" for p in self.params.values()]
        for i, op in enumerate(self.ops):
            if i == self.forward_ops:
                lines.append("  -- backward --")
            lines.append(f"  {op}")
        grads = ([f"d{self.x.name}={self.input_grad.name}"] if self.input_grad is not None else []) + \
            [f"d{p}={g}" for p, g in self.param_grads.items()]
        lines.append(f"  return {self.output.name}" + (f"; {', '.join(grads)}" if grads else ""))
        return "\n".join(lines)


# ------------------------------------------------------------------------- builder
class ProgramBuilder:
    """Writes a program op by op; each method returns the new :class:`Value`.

    ``x`` is the node input ``node[1 x in_dim]``. Params are declared on first use, with
    their slice shape inferred from the operands.
    """

    def __init__(self, name: str, in_dim: int, heads: int = 1) -> None:
        if in_dim <= 0:
            raise IRError(f"in_dim must be positive, got {in_dim}")
        self.name = name
        self.heads = heads
        self.x = Value("x", NODE, 1, in_dim)
        self.params: dict[str, Param] = {}
        self.ops: list[Op] = []
        self._counter = 0

    # -- internals -----------------------------------------------------------
    def _new(self, domain: str, heads: int, dim: int) -> Value:
        v = Value(f"%{self._counter}", domain, heads, dim)
        self._counter += 1
        return v

    def _emit(self, op: Op) -> Value:
        self.ops.append(op)
        return op.out

    def op(self, op_type: type[Op], domain: str, heads: int, dim: int, **fields: Any) -> Value:
        """A new op of ``op_type`` (any registered op, :func:`rgtune.ir.op_rules.register_op`) with the
        given fields, whose output is ``domain[heads x dim]``."""
        return self._emit(op_type(out=self._new(domain, heads, dim), **fields))

    def _param(self, name: str, by: ParamBy, shape: tuple[int, ...], init: ParamInit = "glorot",
               fan_in: int | None = None) -> str:
        if init not in PARAM_INITS:
            raise IRError(f"param {name!r}: unknown init {init!r}; choose one of {list(PARAM_INITS)}")
        if init == "uniform" and fan_in is None:
            raise IRError(f"param {name!r}: the uniform init needs the fan-in (the linear's input size)")
        p = Param(name, by, tuple(int(s) for s in shape), init=init,
                  fan_in=int(fan_in) if init == "uniform" and fan_in is not None else None)
        old = self.params.get(name)
        if old is not None and old != p:
            raise IRError(f"param {name!r} declared as {old} and again as {p}")
        self.params[name] = p
        return name

    def declare(self, name: str, by: ParamBy, shape: tuple[int, ...], init: ParamInit = "glorot") -> str:
        """A learnable param that no op reads (yet): part of the layer's state dict all the same (HGT's skip
        gate when its sizes differ, which PyG's ``HGTConv`` keeps, so that state dicts match at every size)."""
        return self._param(name, by, shape, init)

    def _weight(self, name: str, by: ParamBy, shape: tuple[int, ...], init: ParamInit = "glorot",
                fan_in: int | None = None) -> str:
        """A linear's weight: a learnable param declared here, or a derived one declared before (a fold's)."""
        old = self.params.get(name)
        if old is not None and old.derived:
            if (old.by, old.shape) != (by, tuple(shape)):
                need = f"{by}[{'x'.join(map(str, shape))}]"
                raise IRError(f"param {name!r} is derived as {old}; this linear needs {need}")
            return name
        return self._param(name, by, shape, init, fan_in)

    # -- ops -----------------------------------------------------------------
    def src(self, x: Value) -> Value:
        """Per edge, ``x`` at the source node."""
        return self._gather(x, "src")

    def dst(self, x: Value) -> Value:
        """Per edge, ``x`` at the destination node."""
        return self._gather(x, "dst")

    def _gather(self, x: Value, end: Literal["src", "dst"]) -> Value:
        if x.domain != NODE:
            raise IRError(f"gather needs a node value, got {x.domain}")
        return self._emit(Gather(self._new(EDGE, x.heads, x.dim), x, end))

    def typed_linear(self, x: Value, weight: str, out: tuple[int, int], by: ParamBy = "rel",
                     bias: str | None = None, per_head: bool = False, init: ParamInit = "glorot",
                     bias_init: ParamInit = "zeros") -> Value:
        """``x @ weight[type] + bias[type]`` with ``type`` the node type (``by="ntype"``) or relation;
        ``init``, ``bias_init`` as :class:`Param`'s (a ``uniform`` one scales by this linear's fan-in)."""
        heads, dim = out
        fan_in = x.dim if per_head else x.heads * x.dim
        if by == "ntype" and x.domain != NODE:
            raise IRError("a typed linear by node type reads node values; gather after it")
        if by == "rel" and x.domain == NODE:
            raise IRError("a typed linear by relation reads edge or pair values; gather first")
        if per_head:
            if x.heads != heads:
                raise IRError(f"per-head linear keeps heads: input has {x.heads}, output {heads}")
            self._weight(weight, by, (heads, x.dim, dim), init, fan_in)
        else:
            self._weight(weight, by, (x.heads * x.dim, heads * dim), init, fan_in)
        if bias:
            self._param(bias, by, (heads * dim,), bias_init, fan_in)
        return self._emit(TypedLinear(self._new(x.domain, heads, dim), x, weight, bias, by, per_head))

    def basis_weight(self, name: str, bases: str, comp: str, num_bases: int, shape: tuple[int, int]) -> str:
        """The per-relation weight ``name[r] = sum_b comp[r, b] bases[b]`` of a basis decomposition (R-GCN's):
        declares ``bases`` ``(num_bases, Din, Dout)`` shared by all relations, ``comp`` ``(num_bases,)`` per
        relation (both Glorot-initialized, as PyG's ``RGCNConv(num_bases=...)``), and ``name``, derived from
        them once per call (a ``bases`` fold); returns ``name``, the weight of a :meth:`typed_linear` by relation."""
        if num_bases < 1:
            raise IRError(f"param {name!r}: num_bases={num_bases} must be a positive integer")
        din, dout = shape
        self._param(bases, "none", (num_bases, din, dout))
        self._param(comp, "rel", (num_bases,))
        derived = Param(name, "rel", (int(din), int(dout)), derived=True)
        if name in self.params:
            raise IRError(f"param {name!r} is declared twice (as {self.params[name]} and as {derived})")
        self.params[name] = derived
        self.ops.append(FoldWeights(out=self.x, out_param=name, mode="bases", a=bases, b=comp))
        return name

    def view(self, x: Value, heads: int) -> Value:
        """``x`` with its ``heads x dim`` features regrouped into ``heads`` heads (row-major: no data moves;
        ``node[1 x 64]`` viewed with 4 heads is ``node[4 x 16]``, and back)."""
        width = x.heads * x.dim
        if heads < 1 or width % heads:
            valid = [h for h in range(1, width + 1) if width % h == 0]
            raise IRError(f"view: {width} features do not split into heads={heads}; valid heads: {valid}")
        return self._emit(View(self._new(x.domain, heads, width // heads), x))

    def param(self, name: str, like: Value, dim: int | None = None, by: ParamBy = "rel",
              init: ParamInit = "glorot") -> Value:
        """Per row of ``like``'s domain, ``name[type]``: a ``(heads, dim)`` vector, or with
        ``dim=None`` one scalar per head (slice shape ``(heads,)``); ``init`` as :class:`Param`'s."""
        self._param(name, by, (like.heads,) if dim is None else (like.heads, dim), init)
        return self._emit(ParamRead(self._new(like.domain, like.heads, dim or 1), name, by, like.domain))

    def shared_row(self, name: str, dim: int, like: Value, init: ParamInit = "glorot") -> Value:
        """One ``(1, dim)`` parameter row ``name``, the same for every row of ``like``'s domain and every head
        (it broadcasts over the heads of what it meets)."""
        self._param(name, "none", (1, dim), init)
        return self._emit(ParamRead(self._new(like.domain, 1, dim), name, "none", like.domain))

    def linear(self, x: Value, weight: str, out: tuple[int, int], bias: str | None = None,
               init: ParamInit = "glorot", bias_init: ParamInit = "zeros") -> Value:
        """``x @ weight + bias`` with one weight for all rows."""
        return self.typed_linear(x, weight, out, by="none", bias=bias, init=init, bias_init=bias_init)

    def inv_dst_rel_degree(self) -> Value:
        """Per edge ``1/|N_r(dst)|``: a mean over each relation's in-neighbours."""
        return self._emit(GraphConst(self._new(EDGE, 1, 1), "inv_dst_rel_degree", EDGE))

    def dst_degree(self) -> Value:
        """Per edge ``|N(dst)|``, its destination's in-degree over all relations (PyG ``RGATConv``'s ``mod``)."""
        return self._emit(GraphConst(self._new(EDGE, 1, 1), "dst_degree", EDGE))

    def inc_positive(self, x: Value) -> Value:
        """``x + 1`` where ``x > 0``, else ``x``, elementwise (PyG ``RGATConv``'s ``mod="f-additive"``)."""
        return self._emit(Unary(self._new(x.domain, x.heads, x.dim), "inc_positive", x))

    def edge_weight(self) -> Value:
        """Per edge the caller's weight ``w_e`` (``edge[1x1]``), given with every call rather than derived from
        the graph: ``layer(x, edge_weight=w)`` with ``w`` ``(E,)`` or ``(E, 1)`` in the graph's edge order (each
        relation's edges one after another; a dict per canonical edge type also works). It is a constant of the
        call: no gradient flows to it (DGL's ``norm``; a dropout mask)."""
        return self._emit(GraphConst(self._new(EDGE, 1, 1), EDGE_WEIGHT, EDGE))

    def inner(self, a: Value, b: Value) -> Value:
        """Per head ``<a_h, b_h>``."""
        _check_same(a, b, "inner", need_dim=True)
        return self._emit(Inner(self._new(a.domain, max(a.heads, b.heads), 1), a, b))

    def mul(self, a: Value, b: Value) -> Value:
        return self._binary("mul", a, b)

    def add(self, a: Value, b: Value) -> Value:
        return self._binary("add", a, b)

    def _binary(self, op: str, a: Value, b: Value) -> Value:
        _check_same(a, b, op, need_dim=False)
        return self._emit(Binary(self._new(a.domain, max(a.heads, b.heads), max(a.dim, b.dim)), op, a, b))

    def scale(self, x: Value, c: float) -> Value:
        return self._emit(Scale(self._new(x.domain, x.heads, x.dim), x, float(c)))

    def leaky_relu(self, x: Value, slope: float = 0.2) -> Value:
        return self._emit(Unary(self._new(x.domain, x.heads, x.dim), "leaky_relu", x, float(slope)))

    def relu(self, x: Value) -> Value:
        return self._emit(Unary(self._new(x.domain, x.heads, x.dim), "relu", x))

    def gelu(self, x: Value) -> Value:
        return self._emit(Unary(self._new(x.domain, x.heads, x.dim), "gelu", x))

    def edge_softmax(self, s: Value, per_relation: bool = False) -> Value:
        """Softmax of ``s`` over each destination's in-edges, per head; with ``per_relation``, over each
        destination's in-edges of one relation (``group="dst_rel"``)."""
        if s.domain != EDGE:
            raise IRError(f"edge_softmax needs an edge value, got {s.domain}")
        return self._emit(EdgeSoftmax(self._new(EDGE, s.heads, s.dim), s, "dst_rel" if per_relation else "dst"))

    def aggregate(self, x: Value, reduce: Literal["sum", "mean"] = "sum") -> Value:
        """Sum the edge rows of ``x`` into their destination nodes."""
        if x.domain != EDGE:
            raise IRError(f"aggregate needs an edge value, got {x.domain}")
        return self._emit(Aggregate(self._new(NODE, x.heads, x.dim), x, NODE, reduce))

    def concat(self, a: Value, b: Value) -> Value:
        if a.domain != b.domain or a.heads != b.heads:
            raise IRError(f"concat needs the same domain and heads: {a.domain}[{a.heads}] vs {b.domain}[{b.heads}]")
        return self._emit(Concat(self._new(a.domain, a.heads, a.dim + b.dim), a, b))

    def gated_residual(self, h: Value, x: Value, skip: str) -> Value:
        """``sigmoid(skip[t]) h + (1 - sigmoid(skip[t])) x`` with ``t`` the node's type."""
        if h.heads * h.dim != x.heads * x.dim:
            raise IRError(f"gated residual needs equal sizes: {h.heads * h.dim} vs {x.heads * x.dim}")
        self._param(skip, "ntype", (), init="ones")
        return self._emit(GatedResidual(self._new(NODE, h.heads, h.dim), h, x, skip))

    def finish(self, out: Value) -> Program:
        if out.domain != NODE:
            raise IRError(f"a program returns a node value, got {out.domain}")
        return Program(self.name, self.x, dict(self.params), list(self.ops), out, self.heads)


def reads_edge_weight(program: Program) -> bool:
    """Whether ``program`` reads the caller's per-edge weight (:meth:`ProgramBuilder.edge_weight`): then every
    run takes it beside the params, as ``params[EDGE_WEIGHT]``."""
    return any(isinstance(op, GraphConst) and op.kind == EDGE_WEIGHT for op in program.ops)


def _check_same(a: Value, b: Value, what: str, need_dim: bool) -> None:
    if a.domain != b.domain:
        raise IRError(f"{what}: operands live on different domains ({a.domain} vs {b.domain}); gather or expand first")
    if a.heads != b.heads and 1 not in (a.heads, b.heads):
        raise IRError(f"{what}: heads {a.heads} vs {b.heads}")
    if need_dim and a.dim != b.dim:
        raise IRError(f"{what}: feature sizes {a.dim} vs {b.dim}")
    if not need_dim and a.dim != b.dim and 1 not in (a.dim, b.dim):
        raise IRError(f"{what}: feature sizes {a.dim} vs {b.dim} do not broadcast")


# ---------------------------------------------------------------- rewriting helpers
class Rewriter:
    """Rebuilds a program op by op with fresh value names; passes use it to replace ops.

    ``emit`` appends an op (renaming its inputs through the substitution map); ``alias`` makes
    an old value name stand for a new value.
    """

    def __init__(self, program: Program, prefix: str = "%") -> None:
        self.program = program
        self.ops: list[Op] = []
        self.params = dict(program.params)
        self.subst: dict[str, Value] = {program.x.name: program.x}
        self._counter = 0
        self._prefix = prefix

    def new(self, domain: str, heads: int, dim: int) -> Value:
        v = Value(f"{self._prefix}{self._counter}", domain, heads, dim)
        self._counter += 1
        return v

    def get(self, v: Value) -> Value:
        return self.subst[v.name]

    def emit(self, op: Op, **changes: Any) -> Value:
        """Append ``op`` with inputs renamed (and ``changes`` applied); returns its new output."""
        renamed = {f.name: self.subst[getattr(op, f.name).name] for f in dataclasses.fields(op)
                   if f.name != "out" and f.name not in changes and isinstance(getattr(op, f.name), Value)}
        renamed.update(changes)
        new_op = op.replace(**renamed)
        if not isinstance(new_op, FoldWeights):
            src_out = new_op.out
            new_out = self.new(src_out.domain, src_out.heads, src_out.dim)
            new_op = new_op.replace(out=new_out)
            if not isinstance(op, FoldWeights) and op.out.name not in self.subst:
                self.subst[op.out.name] = new_out
        self.ops.append(new_op)
        return new_op.out

    def add(self, op_type: type, out_domain: str, heads: int, dim: int, **fields: Any) -> Value:
        """Append a brand-new op of ``op_type`` whose output is ``out_domain[heads x dim]``."""
        out = self.new(out_domain, heads, dim)
        self.ops.append(op_type(out=out, **fields))
        return out

    def add_fold(self, fold: FoldWeights, param: Param) -> str:
        if fold.out_param not in self.params:
            self.params[fold.out_param] = param
            self.ops.append(fold)
        return fold.out_param

    def alias(self, old: Value, new: Value) -> None:
        self.subst[old.name] = new

    def finish(self) -> Program:
        ops = _dead_code_elimination(self.ops, self.subst[self.program.output.name])
        used = {p for op in ops for p in op.params()} | {op.out_param for op in ops if isinstance(op, FoldWeights)}
        params = {k: p for k, p in self.params.items() if k in used or not p.derived}
        return Program(self.program.name, self.program.x, params, ops, self.subst[self.program.output.name],
                       self.program.heads)


def _dead_code_elimination(ops: Sequence[Op], output: Value) -> list[Op]:
    live = {output.name}
    live_params: set[str] = set()
    keep: list[Op] = []
    for op in reversed(ops):
        if isinstance(op, FoldWeights):
            if op.out_param in live_params:
                keep.append(op)
                live_params.update(op.params())
            continue
        if op.out.name in live:
            keep.append(op)
            live.update(v.name for v in op.inputs())
            live_params.update(op.params())
    keep.reverse()
    return keep


def walk(values: Iterable[Value], producers: dict[str, Op]) -> Iterator[Op]:
    """Ops that the given values depend on, each once, in no particular order."""
    seen: set[str] = set()
    stack = [v.name for v in values]
    while stack:
        name = stack.pop()
        if name in seen or name not in producers:
            continue
        seen.add(name)
        op = producers[name]
        yield op
        stack.extend(v.name for v in op.inputs())


def inv_sqrt(d: int) -> float:
    return 1.0 / math.sqrt(d)
