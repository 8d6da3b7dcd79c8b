"""Expressions and indices for the CUDA templates: row indices, renaming, substitution, prelude.

The templates evaluate kernel-IR expressions with :class:`rgtune.codegen.cfamily.CEmitter`;
this module adds what only the CUDA side needs:

* :class:`RowIndex`: how a row of one domain reaches another (``src``, ``dst_pair``, ``rel``,
  ...) as a C expression, recording which graph arrays the kernel must receive;
* :class:`Emitter`: a ``CEmitter`` whose sub-expressions can be *substituted* by a C
  expression (a warp-reduced inner product or sum, a vector-loaded component, a shared-memory
  partial sum), so that templates decide where a value comes from without a new IR node;
* :func:`rename_buffers`: buffers get role names (``x``, ``out``, ``in0``) in the generated
  code, so that the same kernel in two programs is the same source (and compiled once).

Example:
    >>> from rgtune.ir.kernels import InnerE, Load
    >>> ix = RowIndex("edge", index_bits=32, pair_index="direct")
    >>> ix("src"), ix("src_pair"), sorted(ix.arrays)
    ('e_src[rid]', 'e_sp[rid]', ['e_sp', 'e_src'])
    >>> e = InnerE(1, 1, Load(1, 4, "in0", "row"), Load(1, 4, "in1", "dst"))
    >>> em = Emitter({"in0": (1, 4), "in1": (1, 4)}, {}, ix)
    >>> em.subst[e] = lambda h, d: "ip0"
    >>> em.element(e, "h", "d")
    'ip0'
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

from rgtune.codegen.cfamily import BF16_ROUND, CEmitter, helper_functions
from rgtune.ir.kernels import Acc, ConcatE, Expr, GraphLoad, InnerE, Load, ParamLoad, ReduceE, SliceE

#: graph index arrays a kernel may read, in the order they appear in kernel signatures
GRAPH_ARRAYS = ("node_type", "e_src", "e_dst", "e_rel", "e_rel_order", "csr_indptr", "e_sp", "e_dp",
                "sp_node", "sp_rel", "sp_offsets", "dp_node", "dp_rel", "dp_offsets")
#: per-edge float constants of the graph (``GraphLoad``), passed as ``G_<kind>``
GRAPH_CONSTANTS = ("inv_dst_rel_degree", "inv_dst_degree", "dst_degree", "edge_weight")  # edge_weight: the call's


class UnsupportedKernel(ValueError):
    """The kernel IR has a form this generator does not cover (a bug to report, not a bad schedule)."""


class RowIndex:
    """``via -> C expression`` for rows of ``domain``; the row's own id is the C variable ``rid``.

    Mirrors :meth:`rgtune.codegen.reference.ReferenceExecutor._index`: edges reach their ends,
    relation and pairs; pairs reach their node and relation; node types come from ``node_type``.
    ``pair_index="bsearch"`` finds an edge's pair by binary search in its relation's block.
    """

    def __init__(self, domain: str, index_bits: int, pair_index: str, rid: str = "rid") -> None:
        self.domain = domain
        self.index_bits = index_bits
        self.pair_index = pair_index
        self.rid = rid
        self.arrays: set[str] = set()
        self.constants: set[str] = set()

    def array(self, name: str, at: str) -> str:
        self.arrays.add(name)
        return f"{name}[{at}]"

    def __call__(self, via: str) -> str:
        r, dom = self.rid, self.domain
        if via == "row":
            return r
        if dom == "edge":
            if via in ("src", "dst", "rel"):
                return self.array(f"e_{via}", r)
            if via in ("src_ntype", "dst_ntype"):
                return self.array("node_type", self.array(f"e_{via[:3]}", r))
            if via in ("src_pair", "dst_pair"):
                side = via[0]  # "s" or "d"
                if self.pair_index == "direct":
                    return self.array(f"e_{side}p", r)
                self.arrays |= {f"{side}p_node", f"{side}p_offsets"}
                return (f"rg_find_pair({side}p_node, {side}p_offsets, {self.array('e_rel', r)}, "
                        f"{self.array('e_src' if side == 's' else 'e_dst', r)})")
        if dom in ("src_pair", "dst_pair"):
            p = dom[0] + "p"
            if via == "pair_node":
                return self.array(f"{p}_node", r)
            if via == "rel":
                return self.array(f"{p}_rel", r)
            if via == "ntype" or via == f"{dom[:3]}_ntype":
                return self.array("node_type", self.array(f"{p}_node", r))
        if dom in ("node", "dst_node") and via == "ntype":
            return self.array("node_type", r)
        raise UnsupportedKernel(f"no index {via!r} on {dom} rows")


class Emitter(CEmitter):
    """A :class:`CEmitter` with per-expression substitutions.

    ``subst[e]`` is called with the C expressions of ``(h, d)`` (``"0"`` where ``e`` broadcasts)
    and returns the C expression to use instead of computing ``e``; nested occurrences are
    found too, because ``CEmitter.element`` recurses through ``self.element``.

    ``leaf_subst[e]`` is the same for a value that holds only at the element being computed (a
    component of a vector load at ``(h, d0 + c)``): it is not used inside an inner product, a
    sum over features or heads, a concatenation or a slice, whose operands are read at other ``(h, d)``
    (the same load may occur inside and outside one: ``dout@dst * sum_dim(dout@dst * v)``).
    """

    def __init__(self, buffers: Mapping[str, tuple[int, int]], params: Mapping[str, tuple[int, ...]],
                 index: Callable[[str], str], acc_shape: tuple[int, int] | None = None,
                 storage: Mapping[str, str] | None = None) -> None:
        super().__init__(buffers, params, index, acc_shape, storage=storage)
        self.subst: dict[Expr, Callable[[str, str], str]] = {}
        self.leaf_subst: dict[Expr, Callable[[str, str], str]] = {}
        self._elsewhere = 0  # > 0 while evaluating operands read at other (h, d) than the element's

    def element(self, e: Expr, h: str, d: str) -> str:
        f = self.subst.get(e)
        if f is None and not self._elsewhere:
            f = self.leaf_subst.get(e)
        if f is not None:
            return f(h if e.heads > 1 else "0", d if e.dim > 1 else "0")
        if isinstance(e, (InnerE, ReduceE, ConcatE, SliceE)):
            self._elsewhere += 1
            try:
                return super().element(e, h, d)
            finally:
                self._elsewhere -= 1
        return super().element(e, h, d)

    def block(self, e: Expr, h: str, d: str) -> tuple[list[str], str]:
        """The statements ``e`` needs and its C expression, for one element."""
        value = self.element(e, h, d)
        return self.take_statements(), value


def rename_buffers(e: Expr, names: Mapping[str, str]) -> Expr:
    """``e`` with every ``Load`` of buffer ``b`` reading ``names[b]`` instead."""
    if isinstance(e, Load):
        return dataclasses.replace(e, buffer=names[e.buffer])
    changes = {f.name: rename_buffers(getattr(e, f.name), names)
               for f in dataclasses.fields(e) if isinstance(getattr(e, f.name), Expr)}
    return dataclasses.replace(e, **changes) if changes else e


def loads_in(exprs: list[Expr]) -> list[str]:
    """Buffers loaded by ``exprs``, in first-use order."""
    out: list[str] = []
    for e in exprs:
        for x in e.walk():
            if isinstance(x, Load) and x.buffer not in out:
                out.append(x.buffer)
    return out


def params_in(exprs: list[Expr]) -> list[str]:
    """Params read by ``exprs``, in first-use order."""
    out: list[str] = []
    for e in exprs:
        for x in e.walk():
            if isinstance(x, ParamLoad) and x.param not in out:
                out.append(x.param)
    return out


def constants_in(exprs: list[Expr]) -> list[str]:
    """Per-edge graph constants read by ``exprs``, in first-use order."""
    out: list[str] = []
    for e in exprs:
        for x in e.walk():
            if isinstance(x, GraphLoad) and x.kind not in out:
                out.append(x.kind)
    return out


def inner_products(e: Expr) -> list[InnerE]:
    """The inner products of ``e``, innermost first (each once)."""
    out: list[InnerE] = []

    def visit(x: Expr) -> None:
        for c in x.children():
            visit(c)
        if isinstance(x, InnerE) and x not in out:
            out.append(x)

    visit(e)
    return out


def warp_reductions(e: Expr) -> list[Expr]:
    """The inner products and sums over features of ``e``, innermost first (each once): the reductions a
    warp can share (lanes over the reduced dimension). Without sums, the inner products in the order of
    :func:`inner_products`."""
    out: list[Expr] = []

    def visit(x: Expr) -> None:
        for c in x.children():
            visit(c)
        if (isinstance(x, InnerE) or (isinstance(x, ReduceE) and x.over == "dim")) and x not in out:
            out.append(x)

    visit(e)
    return out


def has_acc(e: Expr) -> bool:
    """Whether ``e`` reads the GEMM's fresh output row."""
    return any(isinstance(x, Acc) for x in e.walk())


#: the CUDA definitions of the 16-bit storage types (:data:`rgtune.codegen.cfamily.C_TYPES`), in a unit that
#: reads or writes one: the bits in an ``unsigned short``. bfloat16 rounds in integer operations exactly as the
#: C/OpenMP generator's does (both targets store the same bits); float16 converts by PTX ``cvt`` (round to
#: nearest even), on the emulator (``RG_EMULATED``) by GCC's ``_Float16``. ``rg_16x2``/``rg_16x4`` are the
#: vector loads and stores of 2 and 4 elements (4- and 8-byte aligned, as ``float2``/``float4`` are 8 and 16).
LOW_PRECISION_CUDA = f"""\
typedef unsigned short rg_bf16;  // bfloat16 bits (precision.*: loads widen to float, stores round once)
typedef unsigned short rg_f16;   // float16 bits
struct alignas(4) rg_16x2 {{ unsigned short x, y; }};
struct alignas(8) rg_16x4 {{ unsigned short x, y, z, w; }};
__device__ __forceinline__ static float rg_from_bf16(rg_bf16 v) {{ return __uint_as_float((unsigned)v << 16); }}
__device__ __forceinline__ static rg_bf16 rg_to_bf16(float f) {{
  const unsigned u = __float_as_uint(f);
  return (rg_bf16)({BF16_ROUND});  // to nearest even; a NaN stays a NaN
}}
#ifdef RG_EMULATED
static inline float rg_from_f16(rg_f16 v) {{ _Float16 h; memcpy(&h, &v, 2); return (float)h; }}
static inline rg_f16 rg_to_f16(float f) {{ const _Float16 h = (_Float16)f; rg_f16 v; memcpy(&v, &h, 2); return v; }}
#else
__device__ __forceinline__ static float rg_from_f16(rg_f16 v) {{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }}
__device__ __forceinline__ static rg_f16 rg_to_f16(float f) {{ rg_f16 v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f)); return v; }}
#endif"""


def prelude(index_bits: int, storage: Iterable[str] = ()) -> str:
    """What every generated unit starts with: index type, helpers, warp reductions; the 16-bit types where
    ``storage`` (the unit's buffers' storage types) has one."""
    idx = "int" if index_bits == 32 else "long long"
    low = [LOW_PRECISION_CUDA] if set(storage) - {"float32"} else []
    return "\n".join([
        f"typedef {idx} idx_t;  // layout.index_bits = {index_bits}",
        *low,
        "#ifndef INFINITY",
        "#define INFINITY __int_as_float(0x7f800000)",
        "#endif",
        helper_functions("__device__ __forceinline__ static"),
        "__device__ __forceinline__ static float rg_warp_sum(float v) {",
        "#pragma unroll",
        "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
        "  return v;",
        "}",
    ])


FIND_PAIR = """\
// compact.pair_index = bsearch: the pair (rel, node) is found by binary search among the
// relation's pairs, which are sorted by node (rgtune.ir.bind: pairs sorted by rel, then node)
__device__ __forceinline__ static idx_t rg_find_pair(const idx_t* __restrict__ pair_node,
                                                   const idx_t* __restrict__ pair_offsets, idx_t rel, idx_t node) {
  idx_t lo = pair_offsets[rel], hi = pair_offsets[rel + 1];
  while (lo < hi) {
    const idx_t mid = lo + (hi - lo) / 2;
    if (pair_node[mid] < node) lo = mid + 1; else hi = mid;
  }
  return lo;
}"""

ATOMIC_MAX = """\
// atomic max on floats by the int-ordering trick: non-negative floats order like signed ints,
// negative floats order reversely like unsigned ints; the initial value is -INFINITY
__device__ __forceinline__ static void rg_atomic_max(float* addr, float v) {
  if (v >= 0.0f) atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  else atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}"""
