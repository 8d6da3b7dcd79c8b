"""Kernel-IR expressions as C, shared by the C/OpenMP and the CUDA generators.

An :class:`~rgtune.ir.kernels.Expr` has a shape ``heads x dim`` (a 1 broadcasts). The
kernel templates generate loops over a row, its heads ``h`` and features ``d``; this module
turns an expression into a C expression for element ``(h, d)`` of the current row, plus the
statements it needs first (an inner product is a reduction loop into a temporary, emitted
before the ``d`` loop since it does not depend on ``d``).

Names in the generated code: a buffer ``b`` is the pointer ``b``; a param ``p`` is ``P_p``;
a per-edge graph constant ``k`` is ``G_k``; a GEMM's fresh output row is ``acc``. How the
current row reaches another domain's row (``src``, ``dst_pair``, ...) is the template's
business: it passes ``index(via) -> C expression``.

Example:
    >>> from rgtune.ir.kernels import InnerE, Load, ParamLoad
    >>> e = InnerE(2, 1, Load(2, 8, "z", "src_pair"), ParamLoad(2, 8, "attn", "rel"))
    >>> em = CEmitter({"z": (2, 8)}, {"attn": (2, 8)}, index=lambda via: {"src_pair": "sp", "rel": "r"}[via])
    >>> em.element(e, "h", "0")
    't0'
    >>> print("\\n".join(em.take_statements()))
    float t0 = 0.0f;
    for (int k1 = 0; k1 < 8; ++k1) t0 += z[(long)(sp) * 16 + (h) * 8 + k1] * P_attn[(long)(r) * 16 + (h) * 8 + k1];
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from rgtune.ir.kernels import (Acc, BinaryE, BroadcastE, ConcatE, Expr, GatedE, GraphLoad, InnerE, Load, ParamLoad,
                               ReduceE, ScaleE, SliceE, UnaryE)

Shape = tuple[int, ...]


def helper_functions(qualifier: str = "static inline", vector_math: bool = False) -> str:
    """C definitions of the elementwise functions the expressions call (``rg_gelu``, ...).

    With ``vector_math``, ``rg_gelu`` uses a branch-free rational approximation of ``erf``
    (Eigen's; absolute error < 5e-7 in float32) instead of the libm call, so a compiler can
    vectorize loops that apply it (libm's ``erff`` has no SIMD variant without fast-math).

    >>> "erff" in helper_functions(), "erff" in helper_functions(vector_math=True)
    (True, False)
    """
    q = qualifier
    gelu = (f"{q} float rg_gelu(float x) {{ return 0.5f * x * (1.0f + rg_erf(x)); }}" if vector_math else
            f"{q} float rg_gelu(float x) {{ return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }}")
    lines = [
        f"{q} float rg_leaky_relu(float x, float a) {{ return x > 0.0f ? x : a * x; }}",
        gelu,
        f"{q} float rg_sigmoid(float x) {{ return 1.0f / (1.0f + expf(-x)); }}",
        f"{q} float rg_relu(float x) {{ return x > 0.0f ? x : 0.0f; }}",
    ]
    if vector_math:
        lines.insert(0, _RATIONAL_ERF.format(q=q))
    return "\n".join(lines)


# erf(x / sqrt(2)) as p(x^2) x / q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float); no calls, no branches
_RATIONAL_ERF = """{q} float rg_erf(float x) {{
    x *= 0.70710678118654752f;
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    const float x2 = x * x;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p + -2.10102402082508e-06f;
    p = x2 * p + -5.69250639462346e-05f;
    p = x2 * p + -7.34990630326855e-04f;
    p = x2 * p + -2.95459980854025e-03f;
    p = x2 * p + -1.60960333262415e-02f;
    float r = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    r = x2 * r + -1.68282697438203e-03f;
    r = x2 * r + -7.37332916720468e-03f;
    r = x2 * r + -1.42647390514189e-02f;
    return x * p / r;
}}"""


#: the C element type of each buffer storage type (:mod:`rgtune.ir.passes.precision`); the 16-bit ones are
#: defined by each generator (:data:`LOW_PRECISION_C` for C/OpenMP), with ``rg_from_<t>``/``rg_to_<t>``
C_TYPES = {"float32": "float", "bfloat16": "rg_bf16", "float16": "rg_f16"}
_SHORT = {"bfloat16": "bf16", "float16": "f16"}

#: float32 bits ``u`` rounded to bfloat16's (to nearest even, in integer operations a compiler vectorizes; a NaN
#: that arithmetic makes, quiet, stays a NaN): both code generators round so, and store the same bits
BF16_ROUND = "(u + 0x7fffu + ((u >> 16) & 1u)) >> 16"

#: C/OpenMP definitions of the 16-bit storage types: bfloat16 is a float32's upper half (rounded to nearest
#: even, in integer operations a compiler vectorizes; a NaN that arithmetic makes, quiet, stays a NaN), float16
#: is GCC's ``_Float16`` (converted by F16C instructions)
LOW_PRECISION_C = f"""typedef unsigned short rg_bf16;  /* bfloat16 bits */
typedef _Float16 rg_f16;
static inline float rg_from_bf16(rg_bf16 v) {{ uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, sizeof f); return f; }}
static inline rg_bf16 rg_to_bf16(float f) {{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (rg_bf16)({BF16_ROUND});
}}
static inline float rg_from_f16(rg_f16 v) {{ return (float)v; }}
static inline rg_f16 rg_to_f16(float f) {{ return (rg_f16)f; }}"""


def c_load(storage: str, element: str) -> str:
    """The float value of ``element`` (a C lvalue of a buffer stored as ``storage``).

    >>> c_load("float32", "b0[i]"), c_load("bfloat16", "b0[i]")
    ('b0[i]', 'rg_from_bf16(b0[i])')
    """
    return element if storage == "float32" else f"rg_from_{_SHORT[storage]}({element})"


def c_store(storage: str, value: str) -> str:
    """``value`` (a float C expression) as an element of a buffer stored as ``storage`` (rounded once).

    >>> c_store("float16", "acc[j]")
    'rg_to_f16(acc[j])'
    """
    return value if storage == "float32" else f"rg_to_{_SHORT[storage]}({value})"


def c_float(v: float) -> str:
    """A float literal C and CUDA parse to the same value."""
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"


class CEmitter:
    """Builds C expressions for kernel-IR expressions at one row.

    Args:
        buffers: buffer name -> ``(heads, dim)``.
        params: param name -> slice shape (``()``, ``(H,)``, ``(H, D)``, ...).
        index: via -> C expression of the row index in the target's domain (or the type id
            for ``rel``, ``ntype``, ``src_ntype``, ``dst_ntype``).
        acc_shape: ``(heads, dim)`` of ``acc`` (the GEMM output row), when there is one.
        simd_reductions: put ``#pragma omp simd reduction(+:t)`` before each inner-product
            loop, so a C compiler vectorizes the float reduction without fast-math (OpenMP
            C only; CUDA generators leave it off).
        storage: buffer name -> its storage type, where not float32 (a load converts it to float).
    """

    def __init__(self, buffers: Mapping[str, tuple[int, int]], params: Mapping[str, Shape],
                 index: Callable[[str], str], acc_shape: tuple[int, int] | None = None,
                 simd_reductions: bool = False, storage: Mapping[str, str] | None = None) -> None:
        self.buffers = buffers
        self.storage = storage or {}
        self.params = params
        self.index = index
        self.acc_shape = acc_shape
        self.simd_reductions = simd_reductions
        self._stmts: list[str] = []
        self._temps = 0
        #: (reduction, head) -> its temporary, among the statements not taken yet: a sum that several values
        #: (or one value twice) read is computed once where those statements go (one scope)
        self._sums: dict[tuple[Expr, str], str] = {}

    def take_statements(self) -> list[str]:
        """The statements emitted so far (and forget them, and the temporaries they declare)."""
        out, self._stmts = self._stmts, []
        self._sums = {}
        return out

    def _temp(self, prefix: str = "t") -> str:
        name = f"{prefix}{self._temps}"
        self._temps += 1
        return name

    # ------------------------------------------------------------------ elements
    def lvalue(self, e: Load, h: str, d: str) -> str:
        """The C lvalue of element ``(h, d)`` of load ``e``, as stored (a 16-bit element unconverted)."""
        heads, dim = self.buffers[e.buffer]  # the row's width; the load's own heads x dim index within it
        h, d = (h if e.heads > 1 else "0"), (d if e.dim > 1 else "0")
        return f"{e.buffer}[{self._offset(self.index(e.via), heads * dim, e.heads, e.dim, h, d)}]"

    def element(self, e: Expr, h: str, d: str) -> str:
        """C expression of element ``(h, d)`` of ``e`` (``h``/``d`` are C expressions)."""
        hh = h if e.heads > 1 else "0"
        dd = d if e.dim > 1 else "0"
        if isinstance(e, Load):
            load = c_load(self.storage.get(e.buffer, "float32"), self.lvalue(e, hh, dd))
            # a destinations' buffer read at any node: zero past them (the kernel has num_dst_nodes)
            return f"(({self.index(e.via)}) < {DST_ROWS} ? {load} : 0.0f)" if e.guard else load
        if isinstance(e, Acc):
            assert self.acc_shape is not None, "acc outside a GEMM epilogue"
            heads, dim = self.acc_shape
            return f"acc[{_flat(heads, dim, hh, dd)}]"
        if isinstance(e, ParamLoad):
            shape = self.params[e.param]
            size = math.prod(shape) if shape else 1
            within = _flat(e.heads, e.dim, hh, dd) if shape else "0"
            base = "0" if e.via == "none" else f"(long)({self.index(e.via)}) * {size}"
            return f"P_{e.param}[{base} + {within}]"
        if isinstance(e, GraphLoad):
            return f"G_{e.kind}[{self.index('row')}]"
        if isinstance(e, InnerE):
            if (e, hh) in self._sums:
                return self._sums[(e, hh)]
            t, k = self._temp("t"), self._temp("k")
            a = self.element(e.a, hh, k)
            b = self.element(e.b, hh, k)
            n = max(e.a.dim, e.b.dim)
            self._stmts.append(f"float {t} = 0.0f;")
            if self.simd_reductions:
                self._stmts.append(f"#pragma omp simd reduction(+:{t})")
            self._stmts.append(f"for (int {k} = 0; {k} < {n}; ++{k}) {t} += {a} * {b};")
            self._sums[(e, hh)] = t
            return t
        if isinstance(e, BinaryE):
            sym = {"add": "+", "sub": "-", "mul": "*"}[e.op]
            return f"({self.element(e.a, hh, dd)} {sym} {self.element(e.b, hh, dd)})"
        if isinstance(e, UnaryE):
            x = self.element(e.x, hh, dd)
            return _unary(e.op, x, e.alpha)
        if isinstance(e, ReduceE):
            return self._reduce(e, hh, dd)
        if isinstance(e, BroadcastE):  # the operand's single head (feature) at every head (feature)
            return self.element(e.x, hh, dd)
        if isinstance(e, ScaleE):
            return f"({self.element(e.x, hh, dd)} * {c_float(e.scale)})"
        if isinstance(e, GatedE):
            g = self._temp("g")
            self._stmts.append(f"float {g} = rg_sigmoid({self.element(e.gate, '0', '0')});")
            return f"({g} * {self.element(e.h, hh, dd)} + (1.0f - {g}) * {self.element(e.x, hh, dd)})"
        if isinstance(e, ConcatE):
            da = e.a.dim
            return (f"(({dd}) < {da} ? {self.element(e.a, hh, dd)} : "
                    f"{self.element(e.b, hh, f'(({dd}) - {da})')})")
        if isinstance(e, SliceE):
            return self.element(e.x, hh, f"(({dd}) + {e.start})" if e.start else dd)
        raise TypeError(f"no C form for {type(e).__name__}")

    def _reduce(self, e: ReduceE, h: str, d: str) -> str:
        """A sum over the features (a loop into a temporary, before the ``d`` loop: it does not depend on
        ``d``) or over the heads (spelled out: a layer has a few)."""
        if e.over == "heads":
            return "(" + " + ".join(self.element(e.x, str(i), d) for i in range(e.x.heads)) + ")"
        if (e, h) in self._sums:
            return self._sums[(e, h)]
        t, k = self._temp("t"), self._temp("k")
        x = self.element(e.x, h, k)
        self._stmts.append(f"float {t} = 0.0f;")
        if self.simd_reductions:
            self._stmts.append(f"#pragma omp simd reduction(+:{t})")
        self._stmts.append(f"for (int {k} = 0; {k} < {e.x.dim}; ++{k}) {t} += {x};")
        self._sums[(e, h)] = t
        return t

    @staticmethod
    def _offset(row: str, width: int, heads: int, dim: int, h: str, d: str) -> str:
        return f"(long)({row}) * {width} + {_flat(heads, dim, h, d)}"


#: the name of the destinations' row count in a kernel that reads a guarded load (:attr:`Load.guard`)
DST_ROWS = "num_dst_nodes"


def _unary(op: str, x: str, alpha: float) -> str:
    """The C of an elementwise op of the C expression ``x``. The derivatives (a training program's) are
    written out here rather than as helper functions, so that the forward kernels' sources (the helpers
    are part of every source) stay as they were; ``x`` repeats, and the compiler computes it once."""
    forms = {
        "leaky_relu": f"rg_leaky_relu({x}, {c_float(alpha)})",
        "gelu": f"rg_gelu({x})",
        "exp": f"expf({x})",
        "sigmoid": f"rg_sigmoid({x})",
        "relu": f"rg_relu({x})",
        "neg": f"(-{x})",
        "inc_positive": f"(({x}) > 0.0f ? ({x}) + 1.0f : ({x}))",
        "leaky_relu_grad": f"(({x}) > 0.0f ? 1.0f : {c_float(alpha)})",
        "relu_grad": f"(({x}) > 0.0f ? 1.0f : 0.0f)",
        "sigmoid_grad": f"(rg_sigmoid({x}) * (1.0f - rg_sigmoid({x})))",
        # d/dx x Phi(x) = Phi(x) + x phi(x)
        "gelu_grad": (f"(0.5f * (1.0f + erff(({x}) * 0.70710678118654752f)) + "
                      f"({x}) * 0.39894228040143268f * expf(-0.5f * ({x}) * ({x})))"),
    }
    if op not in forms:
        raise TypeError(f"no C form for the unary op {op!r}")
    return forms[op]


def _flat(heads: int, dim: int, h: str, d: str) -> str:
    parts = []
    if heads > 1 and h != "0":
        parts.append(f"({h}) * {dim}" if dim > 1 else f"({h})")
    if dim > 1 and d != "0":
        parts.append(d)
    return " + ".join(parts) or "0"
