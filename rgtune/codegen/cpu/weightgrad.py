"""The weight-gradient template in C: per type, ``sum_r x[in_index(r)]^T dy[r]`` (or ``sum_r dy[r]``).

A weight's gradient is a GEMM whose *rows* are reduced: per type (a relation, a node type, or one
for all rows) a ``K x N`` matrix summed over up to ``|E_r|`` rows. The runtime orders the rows by
type (an ``order`` array) and cuts each type's rows into *chunks* of at most
``weightgrad.chunk_rows`` rows, and each type's chunks into at most a few *groups* per thread
(:func:`weightgrad_tables`). A group is one OpenMP work item (``schedule(dynamic, 1)``): it packs
each of its chunks (the chunk's input rows, gathered through ``x_via``, and its ``dy`` rows, one
after the other, so the multiply reads them with constant strides from L1/L2) and adds the chunk's
outer products into the group's sum, in register blocks of ``RK`` input columns x ``RV`` vectors of
output columns summed over the chunk's rows (the accumulators stay in registers for the whole
chunk). Where a group's sum goes is ``weightgrad.reduce``:

* ``split``: each group writes its own partial sum (a workspace of ``groups x slice`` floats), and a
  second parallel pass sums each type's partials in group order into the gradient: no atomics, and
  the result does not depend on which thread ran what (deterministic).
* ``atomic``: the gradient is zeroed first (unless the kernel accumulates), and each group adds its
  sum with ``#pragma omp atomic``: one pass, one atomic add per element and group.

Capping groups per type (not one partial per chunk) bounds the workspace by ``types x groups x
slice`` whatever the graph's size; a type with fewer chunks than that gets a group per chunk.
A bias-like gradient (``x`` None: ``sum_r dy[r]``) adds the ``dy`` rows straight into the group's sum.
Every element of the gradient is written (a type without rows gets zeros), so the runtime may hand
an uninitialized tensor to a kernel that does not accumulate.

``weightgrad.impl = "blas"`` generates nothing: the runtime calls torch per type segment
(``X_t^T @ DY_t``, MKL; see :mod:`rgtune.codegen.cpu.runtime`).

Example:
    >>> wg_blocks(10, acc_regs=8)  # 4 input columns x 2 vectors (16 output columns) per register block
    (4, 2)
    >>> order, chunks, groups, type_groups = weightgrad_tables(np.array([1, 0, 1, 1, 1]), 5, 2, 3, 2)
    >>> order.tolist(), chunks.tolist()
    ([1, 0, 2, 3, 4], [[0, 1, 0], [1, 3, 1], [3, 5, 1]])
    >>> groups.tolist(), type_groups.tolist()  # type 1's two chunks: two groups; type 2 has none
    ([0, 1, 2, 3], [0, 1, 3, 3])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rgtune.codegen.cfamily import C_TYPES, c_load, c_store
from rgtune.codegen.cpu.cwriter import CFunction, Lines
from rgtune.codegen.cpu.gemm import (BF16_DOT_TYPES, VEC, accumulate_pairs_tile, accumulate_tile, declare_tile,
                                     native_bf16_dot, sub_blocks)
from rgtune.codegen.cpu.rows import RowIndex
from rgtune.ir.kernels import KernelProgram, WeightGradKernel

#: floats per work item of the reduction pass (split): a type's gradient is summed in blocks of this many
REDUCE_BLOCK = 256


@dataclass(frozen=True)
class WeightGradShape:
    """The compile-time sizes of one weight-gradient kernel."""

    heads: int  # independent per-head products (1 unless per_head)
    k: int  # input columns per head (rows of the gradient slice)
    n: int  # output columns per head
    xw: int  # input row width (0: no input, a sum of dy)
    dw: int  # dy row width
    wsize: int  # floats per gradient slice (per type)

    @classmethod
    def of(cls, k: WeightGradKernel, kp: KernelProgram) -> "WeightGradShape":
        dw = kp.buffers[k.dy].width
        if dw != k.out_heads * k.out_dim:
            raise ValueError(f"{k.name}: dy buffer {k.dy} has {dw} features, the kernel reads {k.out_heads * k.out_dim}")
        wsize = math.prod(kp.param_shapes[k.grad])
        if k.x is None:
            if wsize != dw:
                raise ValueError(f"{k.name}: gradient slice {kp.param_shapes[k.grad]} of {k.grad} is not the "
                                 f"{dw} features of {k.dy}")
            return cls(1, 1, dw, 0, dw, wsize)
        heads = k.in_heads if k.per_head else 1
        if k.per_head and k.in_heads != k.out_heads:
            raise ValueError(f"{k.name}: per-head weight gradient with {k.in_heads} input and {k.out_heads} output heads")
        kk = k.in_dim if k.per_head else k.in_heads * k.in_dim
        n = k.out_dim if k.per_head else dw
        xw = kp.buffers[k.x].width
        if xw != k.in_heads * k.in_dim:
            raise ValueError(f"{k.name}: input buffer {k.x} has {xw} features, the kernel reads {k.in_heads * k.in_dim}")
        if wsize != heads * kk * n:
            raise ValueError(f"{k.name}: gradient slice {kp.param_shapes[k.grad]} of {k.grad} does not fit "
                             f"{heads}x{kk}x{n}")
        return cls(heads, kk, n, xw, dw, wsize)


def wg_blocks(k: int, acc_regs: int) -> tuple[int, int]:
    """Input columns and output vectors of the outer-product register block (``rows * vectors <= acc_regs``)."""
    vectors = 2
    return max(1, min(k, acc_regs // vectors)), vectors


def weightgrad_tables(types: np.ndarray | None, n: int, chunk_rows: int, num_types: int,
                      groups_per_type: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row order (by type, stable), chunks ``(start, end, type)`` of at most ``chunk_rows`` rows of one
    type, groups (chunk ranges ``groups[g]..groups[g + 1]`` within one type, at most ``groups_per_type``
    per type, of about equal chunk counts) and each type's group range, for ``n`` rows of ``types``
    (None: one type)."""
    types = np.zeros(n, np.int64) if types is None else types.astype(np.int64)
    order = np.argsort(types, kind="stable")
    row_bounds = np.searchsorted(types[order], np.arange(num_types + 1)).tolist()
    chunks: list[tuple[int, int, int]] = []
    groups, type_groups = [0], [0]
    for t in range(num_types):
        lo, hi, first = row_bounds[t], row_bounds[t + 1], len(chunks)
        chunks += [(s, min(s + chunk_rows, hi), t) for s in range(lo, hi, chunk_rows)]
        count = len(chunks) - first
        if count:
            g = min(count, groups_per_type)
            groups += [first + (i * count) // g for i in range(1, g + 1)]
        type_groups.append(len(groups) - 1)
    return (order, np.array(chunks, np.int64).reshape(-1, 3), np.array(groups, np.int64),
            np.array(type_groups, np.int64))


def generate_weightgrad(k: WeightGradKernel, s: Mapping[str, Any], kp: KernelProgram, acc_regs: int) -> CFunction:
    """The generated weight gradient (``impl == "generated"``; BLAS has no C)."""
    if s["impl"] != "generated":
        raise ValueError(f"{k.name}: weightgrad.impl={s['impl']!r} has no generated C (torch runs it)")
    shape = WeightGradShape.of(k, kp)
    reduce, ch = s["reduce"], int(s["chunk_rows"])
    rk, rv = wg_blocks(shape.k, acc_regs)
    what = "sum of dy rows" if k.x is None else f"register block {rk} x {rv * VEC}"
    f = CFunction(f"rg_{k.name}", f"{k.name} (weightgrad.impl=generated, reduce={reduce}, chunk_rows={ch}, "
                                  f"{what}):\n{k.describe()}")
    B = f.body
    grad = f.use(f"P_{k.grad}", writes=True)
    ng = f.use(f"{k.name}_ngroups")
    ws = shape.wsize
    partial = f.use(f"{k.name}_partial", writes=True) if reduce == "split" else None
    dot = wg_bf16_dot(k, shape, kp)
    if dot:
        f.statics.append(BF16_DOT_TYPES)
    if k.x is not None:
        for name, text in _micro_kernels(shape, rk, rv, dot):
            f.statics.append(text)
    with B.block("#pragma omp parallel num_threads(c->num_threads)\n"):
        if reduce == "atomic":
            B.line("float* sum = rg_alloc(" + str(ws) + ");  /* this thread's group sum, added atomically */")
            if not k.accumulate:
                B.line("/* the gradient starts at zero (the barrier after this loop orders it before the adds) */")
                B.line("#pragma omp for schedule(static)")
                # the type count only here (and in the split reduction): an unused local is a -Wall warning
                B.line(f"for (int64_t i = 0; i < {f.use(f'{k.name}_ntypes')} * {ws}; ++i) {grad}[i] = 0.0f;")
        if k.x is not None:
            B.line(f"/* per thread: a chunk's input rows ({ch} x {shape.xw}) then its dy rows ({ch} x {shape.dw}), packed */")
            B.line(f"float* pack = rg_alloc({ch * (shape.xw + shape.dw)});")
        B.line("#pragma omp for schedule(dynamic, 1)")
        with B.block(f"for (int64_t g = 0; g < {ng}; ++g)"):
            _group(f, k, shape, kp, ch, rk, rv, partial, dot)
        if k.x is not None:
            B.line("free(pack);")
        if reduce == "atomic":
            B.line("free(sum);")
    if reduce == "split":
        _reduce(f, k, shape)
    return f


def _group(f: CFunction, k: WeightGradKernel, shape: WeightGradShape, kp: KernelProgram, ch: int, rk: int, rv: int,
           partial: str | None, dot: bool = False) -> None:
    """One group: zero its sum, add each chunk's products into it, then (atomic) add it into the gradient."""
    B, ws = f.body, shape.wsize
    groups, chunks, order = (f.use(f"{k.name}_{a}") for a in ("groups", "chunks", "order"))
    B.line(f"const int64_t c0 = {groups}[g], c1 = {groups}[g + 1];")
    if partial is not None:
        B.line(f"float* restrict sum = {partial} + g * {ws};  /* this group's partial sum */")
    B.line(f"for (int j = 0; j < {ws}; ++j) sum[j] = 0.0f;")
    with B.block("for (int64_t ch = c0; ch < c1; ++ch)"):
        B.line(f"const int64_t start = {chunks}[3 * ch], nr = {chunks}[3 * ch + 1] - start;")
        dy = f.use(k.dy)
        if k.x is None:
            B.line("/* a bias-like gradient: the dy rows summed */")
            with B.block("for (int64_t r = 0; r < nr; ++r)"):
                dt = kp.buffers[k.dy].dtype
                B.line(f"const {C_TYPES[dt]}* restrict d = {dy} + (int64_t){order}[start + r] * {shape.dw};")
                B.line("#pragma omp simd")
                B.line(f"for (int j = 0; j < {shape.dw}; ++j) sum[j] += {c_load(dt, 'd[j]')};")
        else:
            if dot:
                _pack_pairs(f, k, shape, kp, ch, order, dy)
            else:
                _pack(f, k, shape, kp, ch, order, dy)
            _products(f, shape, ch, rk, rv, dot)
    if partial is None:
        B.line(f"float* restrict out = P_{k.grad} + {chunks}[3 * c0 + 2] * {ws};  /* the group's type's slice */")
        with B.block(f"for (int j = 0; j < {ws}; ++j)"):
            B.line("#pragma omp atomic")
            B.line("out[j] += sum[j];")


def _pack(f: CFunction, k: WeightGradKernel, shape: WeightGradShape, kp: KernelProgram, ch: int, order: str,
          dy: str) -> None:
    """Copy the chunk's input rows (through ``x_via``) and dy rows into the thread's pack: the products then
    read them at constant strides, ``chunk_rows`` rows that stay in cache across the register blocks."""
    B = f.body
    x = f.use(k.x)  # type: ignore[arg-type]
    rows = RowIndex(k.rows, "row", kp.pair_index)
    xi = rows.var(k.x_via)
    B.line("/* pack: the chunk's input rows (gathered), then its dy rows */")
    B.line("#pragma GCC unroll 1")  # a loop of two copies; unrolling it only costs compile time
    with B.block("for (int64_t r = 0; r < nr; ++r)"):
        B.line(f"const int64_t row = {order}[start + r];")
        B.extend(rows.declarations())
        for a in rows.arrays:
            f.use(a)
        _copy_row(B, f"pack + r * {shape.xw}", f"{x} + {xi} * {shape.xw}", shape.xw, kp.buffers[x].dtype)
        _copy_row(B, f"pack + {ch * shape.xw} + r * {shape.dw}", f"{dy} + row * {shape.dw}", shape.dw, kp.buffers[dy].dtype)


def _copy_row(B: Any, to: str, row: str, n: int, storage: str) -> None:
    """``n`` floats from ``row`` (a buffer stored as ``storage``: converted) to ``to``."""
    if storage == "float32":
        B.line(f"memcpy({to}, {row}, {n} * sizeof(float));")
        return
    B.line(f"{{ float* restrict t = {to}; const {C_TYPES[storage]}* restrict s = {row};")
    B.line("  #pragma omp simd")
    B.line(f"  for (int j = 0; j < {n}; ++j) t[j] = {c_load(storage, 's[j]')}; }}")


def wg_bf16_dot(k: WeightGradKernel, shape: WeightGradShape, kp: KernelProgram) -> bool:
    """Whether ``k`` sums its products over pairs of rows by bfloat16 dot products: it reads a bfloat16 buffer
    (see :func:`~rgtune.codegen.cpu.gemm.bf16_dot`), has an input, the CPU has AVX-512 BF16 and the output
    columns fill whole vectors."""
    if k.x is None or not (kp.buffers[k.x].dtype == "bfloat16" or kp.buffers[k.dy].dtype == "bfloat16"):
        return False
    return native_bf16_dot() and shape.n % VEC == 0


def _pack_pairs(f: CFunction, k: WeightGradKernel, shape: WeightGradShape, kp: KernelProgram, ch: int, order: str,
                dy: str) -> None:
    """The chunk's rows into the pack in bfloat16, two rows interleaved: each column holds its values of rows
    ``2i`` and ``2i + 1`` side by side (input rows, then dy rows), a missing last partner row zero."""
    B = f.body
    x = f.use(k.x)  # type: ignore[arg-type]
    half = (ch + 1) // 2
    B.line(f"/* pack: the chunk's rows in bfloat16 pairs (input rows: {half} x {shape.xw} pairs, then dy rows) */")
    B.line("rg_bf16* restrict px = (rg_bf16*)pack;")
    B.line(f"rg_bf16* restrict pd = px + {2 * half * shape.xw};")
    B.line("#pragma GCC unroll 1")
    with B.block("for (int64_t r = 0; r < nr; r += 2)"):
        B.line("const int64_t row0 = " + order + "[start + r], row1 = " + order + "[start + (r + 1 < nr ? r + 1 : r)];")
        B.line("const int pair = r + 1 < nr;  /* 0: the last row's partner is zeros */")
        xt = C_TYPES[kp.buffers[x].dtype]
        B.line(f"const {xt}* x0; const {xt}* x1;")
        for end in ("0", "1"):  # each row's input row, found in a scope of its own (the index locals repeat)
            rows = RowIndex(k.rows, f"row{end}", kp.pair_index)
            xi = rows.var(k.x_via)
            with B.block(""):
                B.extend(rows.declarations())
                B.line(f"x{end} = {x} + {xi} * {shape.xw};")
            for a in rows.arrays:
                f.use(a)
        for name, srcs, width, dt in (("px", ["x0", "x1"], shape.xw, kp.buffers[x].dtype),
                                      ("pd", [f"{dy} + row{e} * {shape.dw}" for e in "01"], shape.dw,
                                       kp.buffers[dy].dtype)):
            B.line(f"{{ const {C_TYPES[dt]}* restrict s0 = {srcs[0]}; const {C_TYPES[dt]}* restrict s1 = {srcs[1]};")
            B.line(f"  rg_bf16* restrict t = {name} + (r >> 1) * {2 * width};")
            B.line("  #pragma omp simd")
            B.line(f"  for (int j = 0; j < {width}; ++j) {{ t[2 * j] = {c_store('bfloat16', c_load(dt, 's0[j]'))}; "
                   f"t[2 * j + 1] = pair ? {c_store('bfloat16', c_load(dt, 's1[j]'))} : 0; }} }}")


def _products(f: CFunction, shape: WeightGradShape, ch: int, rk: int, rv: int, dot: bool = False) -> None:
    """The chunk's outer products, added into ``sum``: per head, per block of ``rk`` input columns, one
    micro-kernel call per column block."""
    B = f.body
    blocks = sub_blocks(shape.n, shape.n, rv)[0]
    full, rest = shape.k - shape.k % rk, shape.k % rk
    dp = f"pack + {ch * shape.xw}"
    if dot:  # bfloat16 pairs: a column's pair at twice its index
        dp = "pd"
    multi = shape.heads > 1
    if multi:
        B.line(f"/* per head h: input columns h*{shape.k}.., dy columns h*{shape.n}.., gradient slice h */")
        B.line(f"for (int h = 0; h < {shape.heads}; ++h) {{")
        B.indent += 1
    hx, hd, ho = (f"h * {shape.k} + ", f"h * {shape.n} + ", f"h * {shape.k * shape.n} + ") if multi else ("", "", "")

    def calls(rows: int, kb: str) -> None:
        for col, nv, ns in blocks:
            if dot:
                B.line(f"{_mk_name(shape, rows, nv, ns, dot)}(px + 2 * ({hx}{kb}), pd + 2 * ({hd}{col}), nr, "
                       f"sum + {ho}({kb}) * {shape.n} + {col});")
            else:
                B.line(f"{_mk_name(shape, rows, nv, ns)}(pack + {hx}{kb}, {dp} + {hd}{col}, nr, "
                       f"sum + {ho}({kb}) * {shape.n} + {col});")

    B.line(f"/* outer products: {rk} input columns x the column blocks, summed over the chunk's rows */")
    if full:
        with B.block(f"for (int kb = 0; kb < {full}; kb += {rk})"):
            calls(rk, "kb")
    if rest:
        calls(rest, str(full))
    if multi:
        B.indent -= 1
        B.line("}")


def _micro_kernels(shape: WeightGradShape, rk: int, rv: int, dot: bool = False) -> list[tuple[str, str]]:
    """The micro-kernels this shape calls: ``(name, C text)``."""
    blocks = sub_blocks(shape.n, shape.n, rv)[0]
    heights = sorted({rk, shape.k % rk} - {0})  # full blocks, and the last one's rows
    make = _dot_micro_kernel if dot else _micro_kernel
    return [(_mk_name(shape, r, nv, ns, dot), make(shape, r, nv, ns))
            for r in heights for nv, ns in sorted({(nv, ns) for _, nv, ns in blocks})]


def _mk_name(shape: WeightGradShape, rows: int, nv: int, ns: int, dot: bool = False) -> str:
    return f"rg_wg_x{shape.xw}_d{shape.dw}_n{shape.n}_{rows}x{nv}v{ns}s" + ("_dot" if dot else "")


def _dot_micro_kernel(shape: WeightGradShape, rows: int, nv: int, ns: int) -> str:
    """:func:`_micro_kernel` over bfloat16 row pairs (:func:`_pack_pairs`): per pair of rows, a broadcast pair of
    inputs times the vectors of dy pairs, one ``vdpbf16ps`` each (float32 sums)."""
    assert ns == 0, "a bfloat16 weight gradient's columns fill whole vectors"
    L = Lines(1)
    declare_tile(L, rows, nv, 0)
    with L.block("for (int64_t r = 0; r < (nr + 1) >> 1; ++r)"):
        L.line(f"const uint32_t* restrict xr = (const uint32_t*)(xp + r * {2 * shape.xw});")
        L.line(f"const rg_bf16* restrict dr = dp + r * {2 * shape.dw};")
        accumulate_pairs_tile(L, "d", "dr", [f"xr[{i}]" for i in range(rows)], nv)
    for i in range(rows):
        L.line(" ".join(f"rg_storeu(o + {i * shape.n + j * VEC}, rg_loadu(o + {i * shape.n + j * VEC}) + a{i}_{j});"
                        for j in range(nv)))
    head = (f"static __attribute__((noinline)) void {_mk_name(shape, rows, nv, ns, True)}(const rg_bf16* restrict xp, "
            f"const rg_bf16* restrict dp, int64_t nr, float* restrict o)")
    return (f"/* micro-kernel: {rows} input columns x {nv * VEC} output columns, summed over nr rows in bfloat16 "
            f"pairs (input pair stride {2 * shape.xw}, dy pair stride {2 * shape.dw}), added into o */"
            f"\n{head}\n{{\n{L.text()}\n}}")


def _micro_kernel(shape: WeightGradShape, rows: int, nv: int, ns: int) -> str:
    """``rows`` input columns x (``nv`` vectors + ``ns`` scalars) output columns, summed over ``nr`` packed
    rows in registers, then added into ``o`` (row stride ``n``)."""
    L = Lines(1)
    declare_tile(L, rows, nv, ns)
    with L.block("for (int64_t r = 0; r < nr; ++r)"):
        L.line(f"const float* restrict xr = xp + r * {shape.xw};")
        L.line(f"const float* restrict dr = dp + r * {shape.dw};")
        accumulate_tile(L, "d", "dr", [f"xr[{i}]" for i in range(rows)], nv, ns)
    for i in range(rows):
        st = [f"rg_storeu(o + {i * shape.n + j * VEC}, rg_loadu(o + {i * shape.n + j * VEC}) + a{i}_{j});"
              for j in range(nv)]
        st += [f"o[{i * shape.n + nv * VEC + j}] += s{i}_{j};" for j in range(ns)]
        L.line(" ".join(st))
    # not inlined: one copy per shape serves every call site (compile time); a call per chunk and block
    # of rows x columns costs nothing measurable
    head = (f"static __attribute__((noinline)) void {_mk_name(shape, rows, nv, ns)}(const float* restrict xp, "
            f"const float* restrict dp, int64_t nr, float* restrict o)")
    return (f"/* micro-kernel: {rows} input columns x {nv * VEC + ns} output columns, summed over nr packed rows "
            f"(input stride {shape.xw}, dy stride {shape.dw}), added into o (row stride {shape.n}) */"
            f"\n{head}\n{{\n{L.text()}\n}}")


def _reduce(f: CFunction, k: WeightGradKernel, shape: WeightGradShape) -> None:
    """``reduce=split``'s second pass: per type and block of the slice, the type's group partials summed
    in group order into the gradient (zeros for a type without rows)."""
    B, ws = f.body, shape.wsize
    nb = -(-ws // REDUCE_BLOCK)
    rb = min(ws, REDUCE_BLOCK)
    nt, tg, partial = f.use(f"{k.name}_ntypes"), f.use(f"{k.name}_type_groups"), f"{k.name}_partial"
    grad = f"P_{k.grad}"
    op = "+=" if k.accumulate else "="
    B.line(f"/* reduction: each type's group partials, in group order, {'added' if k.accumulate else 'stored'} "
           "into its gradient slice */")
    B.line("#pragma omp parallel for schedule(dynamic, 1) num_threads(c->num_threads)")
    with B.block(f"for (int64_t q = 0; q < {nt}{f' * {nb}' if nb > 1 else ''}; ++q)"):
        if nb > 1:
            B.line(f"const int64_t t = q / {nb}, j0 = (q % {nb}) * {rb};")
            B.line(f"const int jn = j0 + {rb} <= {ws} ? {rb} : (int)({ws} - j0);")
        else:
            B.line(f"const int64_t t = q, j0 = 0;  /* the slice is one block of {ws} floats */")
            B.line(f"const int jn = {ws};")
        B.line(f"float s[{rb}];")
        B.line("for (int j = 0; j < jn; ++j) s[j] = 0.0f;")
        with B.block(f"for (int64_t g = {tg}[t]; g < {tg}[t + 1]; ++g)"):
            B.line(f"const float* restrict p = {partial} + g * {ws} + j0;")
            B.line("#pragma omp simd")
            B.line("for (int j = 0; j < jn; ++j) s[j] += p[j];")
        B.line(f"float* restrict out = {grad} + t * {ws} + j0;")
        B.line("#pragma omp simd")
        B.line(f"for (int j = 0; j < jn; ++j) out[j] {op} s[j];")
