"""The GEMM template in C: tiled segment GEMM with gather, bias, epilogue and (accumulating) store.

Rows come in *tiles* of at most ``gemm.tile_rows`` rows of one type (a relation, a node type;
built per graph by :mod:`rgtune.codegen.cpu.runtime`, rows reordered by type through an
``order`` array). A tile is computed in panels of ``gemm.tile_cols`` output columns: the
panel of the weight (``K x tile_cols`` floats) is read once per tile and stays in L1 while
the tile's rows stream through it, ``RB`` rows at a time, in register blocks of ``RB`` rows
x ``RV`` vectors (GCC vector extensions, 8 floats; sized so the accumulators fit the
machine's vector registers). Input rows are gathered through ``x_via`` (a tile pointer per
row), so the gather costs nothing extra. A short last tile repeats its last row (so the
micro-kernel has constant trip counts) and writes the extra rows to a scratch row.

Then each row is *finished*: bias, epilogue expressions over the fresh row (``acc``), and
the store: in place (the micro-kernel wrote the output row directly), none (output
discarded), or accumulated into ``out[pair_node]``. Accumulating GEMMs get tiles grouped
by owner block (rows whose targets fall in one node range), one block per OpenMP work item,
so no two threads ever add into the same row: race-free, no atomics.

``gemm.impl = "blas"`` generates only the finish step (``<kernel>_finish``): the runtime
gathers and multiplies per segment with torch (MKL) into a staging buffer, this function
adds bias and epilogues and stores rows (accumulation is then torch's ``index_add_``).

Example: 40 output columns in panels of 32, register blocks of 2 vectors (16 columns):

    >>> sub_blocks(40, tile_cols=32, vectors=2)
    [[(0, 2, 0), (16, 2, 0)], [(32, 1, 0)]]
    >>> sub_blocks(10, tile_cols=64, vectors=2)  # 8 columns as a vector, 2 as scalars
    [[(0, 1, 0), (8, 0, 2)]]
    >>> register_block(tile_rows=16, acc_regs=16)
    (8, 2)
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from rgtune.codegen.cfamily import C_TYPES, CEmitter, c_load, c_store
from rgtune.codegen.cpu.cwriter import CFunction, Lines
from rgtune.codegen.cpu.rows import RowIndex, expr_names
from rgtune.ir.kernels import GemmKernel, KernelProgram

VEC = 8  # floats per vector (256 bit): fine on AVX2 and AVX-512 alike

#: the vector types of the bfloat16 dot products (AVX-512 BF16 ``vdpbf16ps`` on 256-bit vectors: 8 float sums,
#: each adding the products of a pair of bfloat16 inputs with a pair of bfloat16 weights)
BF16_DOT_TYPES = """typedef short rg_vbf __attribute__((vector_size(32), aligned(4), may_alias));  /* 16 bfloat16 */
typedef uint32_t rg_vu __attribute__((vector_size(32)));"""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's ISA flags (``/proc/cpuinfo``; empty where unreadable), read once per process: every
    generated kernel asks."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16_dot() -> bool:
    """Whether this CPU has AVX-512 BF16 (the ``vdpbf16ps`` dot products a bfloat16 GEMM uses)."""
    return "avx512_bf16" in cpu_flags()


def bf16_dot(k: GemmKernel, shape: "GemmShape", kp: KernelProgram) -> bool:
    """Whether ``k`` multiplies in bfloat16 pairs: it reads or writes a bfloat16 buffer (the precision knob
    stores its rows so: its products may round their operands too, as a bfloat16 matmul does), the CPU has
    AVX-512 BF16, the reduction length is even (pairs) and the columns fill whole vectors."""
    touches = kp.buffers[k.x].dtype == "bfloat16" or (k.out is not None and kp.buffers[k.out].dtype == "bfloat16")
    return touches and native_bf16_dot() and shape.k % 2 == 0 and shape.n % VEC == 0


@dataclass(frozen=True)
class GemmShape:
    """The compile-time sizes of one GEMM kernel."""

    heads: int  # independent per-head GEMMs (1 unless per_head)
    k: int  # reduction length per head GEMM
    n: int  # output columns per head GEMM
    nout: int  # output row width (heads * n)
    xw: int  # input row width
    wsize: int  # floats per weight slice

    @classmethod
    def of(cls, k: GemmKernel, kp: KernelProgram) -> "GemmShape":
        heads = k.in_heads if k.per_head else 1
        if k.per_head and k.in_heads != k.out_heads:
            raise ValueError(f"{k.name}: per-head GEMM with {k.in_heads} input and {k.out_heads} output heads")
        kk = k.in_dim if k.per_head else k.in_heads * k.in_dim
        n = k.out_dim if k.per_head else k.out_heads * k.out_dim
        xw = kp.buffers[k.x].width
        if xw != k.in_heads * k.in_dim:
            raise ValueError(f"{k.name}: input buffer {k.x} has {xw} features, the GEMM reads {k.in_heads * k.in_dim}")
        wsize = math.prod(kp.param_shapes[k.weight])
        if wsize != heads * kk * n:
            raise ValueError(f"{k.name}: weight slice {kp.param_shapes[k.weight]} does not fit {heads}x{kk}x{n}")
        return cls(heads, kk, n, k.out_heads * k.out_dim, xw, wsize)


def register_block(tile_rows: int, acc_regs: int) -> tuple[int, int]:
    """Rows and vectors of the micro-kernel's register block (``rows * vectors <= acc_regs``)."""
    rows = min(tile_rows, 8 if acc_regs >= 16 else 4)
    return rows, max(1, acc_regs // rows)


def sub_blocks(n: int, tile_cols: int, vectors: int) -> list[list[tuple[int, int, int]]]:
    """Column panels of ``tile_cols``, each a list of ``(first column, vectors, scalars)`` blocks."""
    tc = min(tile_cols, n)
    panels = []
    for c0 in range(0, n, tc):
        width = min(tc, n - c0)
        nvec, blocks = width // VEC, []
        for v0 in range(0, nvec, vectors):
            blocks.append((c0 + v0 * VEC, min(vectors, nvec - v0), 0))
        if width % VEC:
            blocks.append((c0 + nvec * VEC, 0, width % VEC))
        panels.append(blocks)
    return panels


def declare_tile(L: Lines, rows: int, nv: int, ns: int) -> None:
    """A register tile's accumulators, zeroed: ``a{r}_{j}`` (vectors), ``s{r}_{j}`` (scalar tail)."""
    for r in range(rows):
        accs = [f"a{r}_{j} = {{0}}" for j in range(nv)]
        scal = [f"s{r}_{j} = 0.0f" for j in range(ns)]
        if accs:
            L.line("rg_vf " + ", ".join(accs) + ";")
        if scal:
            L.line("float " + ", ".join(scal) + ";")


def accumulate_tile(L: Lines, b: str, row: str, xs: list[str], nv: int, ns: int) -> None:
    """One rank-1 update of the tile: load the ``b`` row at ``row`` (vectors ``{b}{j}``, scalars
    ``{b}s{j}``), then per tile row ``r`` add ``xs[r]`` times it (``xs[r]`` broadcast once)."""
    for j in range(nv):
        L.line(f"const rg_vf {b}{j} = rg_loadu({row} + {j * VEC});")
    for j in range(ns):
        L.line(f"const float {b}s{j} = {row}[{nv * VEC + j}];")
    for r, x in enumerate(xs):
        ops = [f"a{r}_{j} += xv * {b}{j};" for j in range(nv)] + [f"s{r}_{j} += xv * {b}s{j};" for j in range(ns)]
        L.line(f"{{ const float xv = {x}; {' '.join(ops)} }}")


def micro_kernel(name: str, shape: GemmShape, rows: int, nv: int, ns: int, x_storage: str = "float32") -> str:
    """``rows x (nv vectors + ns scalars)`` outputs over the full reduction, accumulators in registers; the
    input rows stored as ``x_storage`` (each element converted to float as it is broadcast)."""
    L = Lines(1)
    xt = C_TYPES[x_storage]
    for r in range(rows):
        L.line(f"const {xt}* restrict x{r} = xr[{r}] + xoff;")
    declare_tile(L, rows, nv, ns)
    with L.block(f"for (int k = 0; k < {shape.k}; ++k)"):
        L.line(f"const float* restrict wk = w + (int64_t)k * {shape.n};")
        accumulate_tile(L, "w", "wk", [c_load(x_storage, f"x{r}[k]") for r in range(rows)], nv, ns)
    for r in range(rows):
        st = [f"rg_storeu(o[{r}] + ooff + {j * VEC}, a{r}_{j});" for j in range(nv)]
        st += [f"o[{r}][ooff + {nv * VEC + j}] = s{r}_{j};" for j in range(ns)]
        L.line(" ".join(st))
    # not inlined: one copy per shape serves every call site (compile time), and a call per
    # rows x K x columns block of FMAs costs nothing measurable
    head = (f"static __attribute__((noinline)) void {name}(const {xt}* const* xr, int64_t xoff, "
            f"const float* restrict w, float* const* o, int64_t ooff)")
    return (f"/* micro-kernel: {rows} rows x {nv * VEC + ns} columns over K = {shape.k} (weight row stride {shape.n}) */"
            f"\n{head}\n{{\n{L.text()}\n}}")


def accumulate_pairs_tile(L: Lines, b: str, row: str, pairs: list[str], nv: int) -> None:
    """One rank-2 update of the tile in bfloat16 pairs: load the ``b`` row at ``row`` (``nv`` vectors of 8 column
    pairs, ``{b}{j}``), then per tile row ``r`` broadcast its input pair ``pairs[r]`` (a 32-bit word) and add its
    dot products with them (``vdpbf16ps``: float32 sums)."""
    for j in range(nv):
        L.line(f"const rg_vbf {b}{j} = *(const rg_vbf*)({row} + {2 * VEC * j});")
    for r, p in enumerate(pairs):
        dots = " ".join(f"a{r}_{j} = __builtin_ia32_dpbf16ps_v8sf(a{r}_{j}, xv, {b}{j});" for j in range(nv))
        L.line(f"{{ const uint32_t p = {p}; const rg_vbf xv = (rg_vbf)(rg_vu){{{', '.join(['p'] * VEC)}}}; {dots} }}")


def bf16_micro_kernel(name: str, shape: GemmShape, rows: int, nv: int) -> str:
    """``rows x nv`` vectors of outputs over the full reduction by bfloat16 pair dot products: input rows of
    bfloat16 (a pair of consecutive inputs is one 32-bit word, broadcast), weights packed as ``[k / 2][n][2]``
    (the pair of weights of one column side by side), float32 accumulators in registers."""
    L = Lines(1)
    for r in range(rows):
        L.line(f"const uint32_t* restrict x{r} = (const uint32_t*)(xr[{r}] + xoff);")
    declare_tile(L, rows, nv, 0)
    with L.block(f"for (int k = 0; k < {shape.k // 2}; ++k)"):
        L.line(f"const rg_bf16* restrict wk = w + (int64_t)k * {2 * shape.n};")
        accumulate_pairs_tile(L, "w", "wk", [f"x{r}[k]" for r in range(rows)], nv)
    for r in range(rows):
        L.line(" ".join(f"rg_storeu(o[{r}] + ooff + {j * VEC}, a{r}_{j});" for j in range(nv)))
    head = (f"static __attribute__((noinline)) void {name}(const rg_bf16* const* xr, int64_t xoff, "
            f"const rg_bf16* restrict w, float* const* o, int64_t ooff)")
    return (f"/* micro-kernel: {rows} rows x {nv * VEC} columns over K = {shape.k} in bfloat16 pairs (packed weight "
            f"row stride {2 * shape.n}) */\n{head}\n{{\n{L.text()}\n}}")


def micro_kernel_name(shape: GemmShape, rows: int, nv: int, ns: int, x_storage: str = "float32") -> str:
    return f"rg_mk_k{shape.k}_n{shape.n}_{rows}x{nv}v{ns}s" + ("" if x_storage == "float32" else f"_{x_storage}")


def generate_gemm(k: GemmKernel, s: Mapping[str, Any], kp: KernelProgram, acc_regs: int) -> CFunction:
    """The tiled kernel (``impl == "generated"``) or the finish kernel (``impl == "blas"``)."""
    shape = GemmShape.of(k, kp)
    if s["impl"] == "blas":
        return _blas_finish(k, shape, kp)
    tr = int(s["tile_rows"])
    rb, rv = register_block(tr, acc_regs)
    panels = sub_blocks(shape.n, int(s["tile_cols"]), rv)
    f = CFunction(f"rg_{k.name}", f"{k.name} (gemm.impl=generated, tile {tr} rows x {min(int(s['tile_cols']), shape.n)} "
                                  f"columns, register block {rb} x {rv * VEC}):\n{k.describe()}")
    dot = bf16_dot(k, shape, kp)
    # a bfloat16 GEMM reads bfloat16 rows: a float32 input is converted as its tile gathers it
    xs = "bfloat16" if dot else kp.buffers[k.x].dtype
    if dot:
        f.statics.append(BF16_DOT_TYPES)
    for nv, ns in sorted({(nv, ns) for p in panels for _, nv, ns in p}):
        name = micro_kernel_name(shape, rb, nv, ns, xs) + ("_dot" if dot else "")
        f.statics.append(bf16_micro_kernel(name, shape, rb, nv) if dot else
                         micro_kernel(name, shape, rb, nv, ns, xs))
    # the micro-kernel stores float rows: an output stored in another type is finished from scratch rows
    converted = k.out is not None and not k.accumulate and kp.buffers[k.out].dtype != "float32"
    direct = not k.accumulate and k.out is not None and not converted
    B, nout = f.body, shape.nout
    order, tiles, groups = (f.use(f"{k.name}_{a}") for a in ("order", "tiles", "groups"))
    ngroups = f.use(f"{k.name}_ngroups")
    x, w = f.use(k.x), f.use(f"{k.name}_wpk" if dot else f"P_{k.weight}")
    convert = dot and kp.buffers[k.x].dtype != "bfloat16"
    out = f.use(k.out, writes=True) if k.out else None
    B.line(f"/* per thread: {'a scratch row for the padding rows of a short tile' if direct else f'{tr} tile rows + a scratch row'} */")
    with B.block("#pragma omp parallel num_threads(c->num_threads)\n"):
        B.line(f"float* scratch = rg_alloc({(1 if direct else tr + 1) * nout});")
        if convert:
            B.line(f"rg_bf16* xcvt = (rg_bf16*)rg_alloc({(tr * shape.xw + 1) // 2});  /* the tile's rows in bfloat16 */")
        B.line(f"const {C_TYPES[xs]}* xr[{tr}];")
        B.line(f"float* orow[{tr}];")
        B.line("#pragma omp for schedule(dynamic, 1)")
        with B.block(f"for (int64_t g = 0; g < {ngroups}; ++g)"):
            with B.block(f"for (int64_t t = {groups}[g]; t < {groups}[g + 1]; ++t)"):
                B.line(f"const int64_t start = {tiles}[3 * t], nr = {tiles}[3 * t + 1] - start;")
                if k.by != "none":
                    B.line(f"const int64_t ty = {tiles}[3 * t + 2];  /* the tile's type: its weight and bias slice */")
                B.line(f"const {'rg_bf16' if dot else 'float'}* restrict wt = "
                       f"{w + ' + ty * ' + str(shape.wsize) if k.by != 'none' else w};")
                _gather(f, k, shape, kp, tr, out if direct else None, convert)
                _panels(f, k, shape, tr, rb, panels, xs, dot)
                if k.bias or k.epilogue or k.accumulate or converted:
                    B.line("/* finish each row: bias, epilogue, store */")
                    with B.block("for (int r = 0; r < nr; ++r)"):
                        B.line("float* restrict acc = orow[r];")
                        _finish_row(f, k, shape, kp, "ty",
                                    "accumulate" if k.accumulate else "copy" if converted else "none",
                                    row=f"{order}[start + r]")
        B.line("free(scratch);")
        if convert:
            B.line("free(xcvt);")
    return f


def _gather(f: CFunction, k: GemmKernel, shape: GemmShape, kp: KernelProgram, tr: int, out: str | None,
            convert: bool = False) -> None:
    """Point ``xr[r]`` at each tile row's input row (``convert``: its bfloat16 copy in ``xcvt``) and ``orow[r]``
    at where its output goes: the output row itself (``out``) or a scratch tile row."""
    B = f.body
    B.line("/* gather: one input row pointer per tile row (a short tile repeats its last row) */")
    B.line("#pragma GCC unroll 1")  # unrolling this loop only costs compile time
    with B.block(f"for (int r = 0; r < {tr}; ++r)"):
        B.line(f"const int64_t row = {k.name}_order[start + (r < nr ? r : nr - 1)];")
        rows = RowIndex(k.rows, "row", kp.pair_index)
        xi = rows.var(k.x_via)
        B.extend(rows.declarations())
        for a in rows.arrays:
            f.use(a)
        if convert:
            B.line(f"const float* restrict src = {k.x} + {xi} * {shape.xw};")
            B.line("#pragma omp simd")
            B.line(f"for (int j = 0; j < {shape.xw}; ++j) xcvt[r * {shape.xw} + j] = rg_to_bf16(src[j]);")
            B.line(f"xr[r] = xcvt + r * {shape.xw};")
        else:
            B.line(f"xr[r] = {k.x} + {xi} * {shape.xw};")
        if out is not None:
            B.line(f"orow[r] = r < nr ? {out} + row * {shape.nout} : scratch;")
        else:
            B.line(f"orow[r] = scratch + (int64_t)(r + 1) * {shape.nout};")


def _panels(f: CFunction, k: GemmKernel, shape: GemmShape, tr: int, rb: int,
            panels: list[list[tuple[int, int, int]]], x_storage: str, dot: bool = False) -> None:
    """The tile's multiply: per head, per column panel, micro-kernel calls over the tile's rows."""
    B = f.body
    multi = shape.heads > 1
    if multi:
        B.line(f"/* per head h: x columns h*{shape.k}.., weight slice h, output columns h*{shape.n}.. */")
        B.line(f"for (int h = 0; h < {shape.heads}; ++h) {{")
        B.indent += 1
    hx, hw, ho = (f"h * {shape.k}", f"h * {shape.k * shape.n} + ", f"h * {shape.n} + ") if multi else ("0", "", "")
    for pi, panel in enumerate(panels):
        c0, c1 = panel[0][0], panel[-1][0] + panel[-1][1] * VEC + panel[-1][2]
        B.line(f"/* panel {pi}: columns {c0}..{c1 - 1}; the weight panel stays in L1 across the tile */")
        with B.block(f"for (int r0 = 0; r0 < {tr}; r0 += {rb})"):
            for col, nv, ns in panel:
                name = micro_kernel_name(shape, rb, nv, ns, x_storage) + ("_dot" if dot else "")
                # a packed weight holds each column's pair of rows side by side: a column starts at 2 * col
                B.line(f"{name}(xr + r0, {hx}, wt + {hw}{2 * col if dot else col}, orow + r0, {ho}{col});")
    if multi:
        B.indent -= 1
        B.line("}")


def _blas_finish(k: GemmKernel, shape: GemmShape, kp: KernelProgram) -> CFunction:
    f = CFunction(f"rg_{k.name}_finish", f"{k.name} (gemm.impl=blas): torch multiplies per segment into "
                                         f"{k.name}_staged (rows in segment order);\nthis adds bias and epilogues "
                                         f"and stores the rows.\n{k.describe()}")
    B = f.body
    order, staged, types, n, inplace = (f"{k.name}_{a}" for a in ("order", "staged", "types", "rows", "inplace"))
    store = "copy" if not k.accumulate and k.out is not None else "none"  # torch accumulates staged rows
    B.line("#pragma omp parallel for schedule(static) num_threads(c->num_threads)")
    with B.block(f"for (int64_t i = 0; i < {n}; ++i)"):
        if k.bias and k.by != "none":
            B.line(f"const int64_t ty = {types}[i];")
        head = len(B.lines)
        B.line(f"float* restrict acc = {staged} + i * {shape.nout};")
        _finish_row(f, k, shape, kp, "ty", store, copy_guard=f"!{inplace}", row=f"{order}[i]")
        rest = B.lines[head + 1:]
    if not any(re.search(r"\bacc\b", ln) for ln in rest):
        # accumulating without bias or epilogue: torch's index_add_ did it all; an empty loop would
        # leave unused locals (-Wall)
        B.lines = ["    /* nothing to finish: torch accumulated the staged rows */"]
    text = B.text()
    for name in (order, types, n, inplace, staged):  # the context fields the body reads, as locals
        if re.search(rf"\b{name}\b", text):
            f.use(name, writes=name == staged)
    return f


def _finish_row(f: CFunction, k: GemmKernel, shape: GemmShape, kp: KernelProgram, ty: str, store: str,
                copy_guard: str | None = None, row: str = "row") -> None:
    """Bias, epilogue and store (``none``, ``copy`` to ``out[row]``, ``accumulate`` into ``out[out_via]``)
    of the row at position ``row`` (a C expression) whose fresh output is ``acc``."""
    B, nout = f.body, shape.nout
    rows = RowIndex(k.rows, "row", kp.pair_index)
    buffers = {b.name: (b.heads, b.dim) for b in kp.buffers.values()}
    params = {p: tuple(sh) for p, sh in kp.param_shapes.items()}
    em = CEmitter(buffers, params, rows.var, acc_shape=(k.out_heads, k.out_dim), simd_reductions=True,
                  storage=kp.storage)
    body = Lines(0)
    if k.bias:
        b = f.use(f"P_{k.bias}")
        if kp.param_by.get(k.bias, "none") != k.by:
            raise ValueError(f"{k.name}: bias {k.bias} is per {kp.param_by.get(k.bias)}, the weight per {k.by}")
        base = f"{b} + {ty} * {nout}" if k.by != "none" else b
        body.line(f"const float* restrict bias = {base};")
        body.line("#pragma omp simd")
        body.line(f"for (int j = 0; j < {nout}; ++j) acc[j] += bias[j];")
    for o, e in k.epilogue:
        ob = kp.buffers[o]
        f.use(o, writes=True)
        body.line(f"/* epilogue: {o} = {_short(e)} */")
        emit_assign(body, em, e, ob.heads, ob.dim, lambda h, d: f"{o}[row * {ob.width} + {_flat(ob.heads, ob.dim, h, d)}]",
                    storage=ob.dtype)
    if store == "copy":
        out = f.use(k.out, writes=True)  # type: ignore[arg-type]
        guard = f"if ({copy_guard}) " if copy_guard else ""
        storage = kp.buffers[out].dtype
        if storage == "float32":
            body.line(f"{guard}memcpy({out} + row * {nout}, acc, {nout} * sizeof(float));")
        else:  # rounded once, as it is stored
            body.line(f"{guard}{{")
            body.line("    #pragma omp simd")
            body.line(f"    for (int j = 0; j < {nout}; ++j) {out}[row * {nout} + j] = {c_store(storage, 'acc[j]')};")
            body.line("}")
    if store == "accumulate":
        out = f.use(k.out, writes=True)  # type: ignore[arg-type]
        target = rows.var(k.out_via)
        body.line(f"/* {k.out}[{k.out_via}] += acc: this thread owns the target (rows grouped by owner block) */")
        body.line(f"float* restrict dst = {out} + {target} * {nout};")
        body.line("#pragma omp simd")
        body.line(f"for (int j = 0; j < {nout}; ++j) dst[j] += acc[j];")
    if any(re.search(r"\brow\b", ln) for ln in rows.declarations() + body.lines):
        B.line(f"const int64_t row = {row};")
    B.extend(rows.declarations())
    for a in rows.arrays:
        f.use(a)
    _use_expr_fields(f, [e for _, e in k.epilogue])
    B.extend(body.lines)


def emit_assign(L: Lines, em: CEmitter, e: Any, heads: int, dim: int, target: Any, op: str = "=",
                storage: str = "float32") -> None:
    """``target(h, d) op e(h, d)`` for every element, the ``d`` loop vectorized; ``storage``: the target's
    storage type (the value is rounded to it as it is stored)."""
    emit_assigns(L, em, [(e, target, storage)], heads, dim, op)


def emit_assigns(L: Lines, em: CEmitter, targets: list[tuple[Any, Any, str]], heads: int, dim: int,
                 op: str = "=") -> None:
    """:func:`emit_assign` of several ``(value, target, storage)`` of one shape in one loop over the heads:
    a reduction the values share is computed once per head (the emitter's temporaries)."""
    for _, _, storage in targets:
        if storage != "float32" and op != "=":
            raise ValueError(f"a {storage} buffer is stored, never accumulated into ({op!r}): sums stay float32")
    with L.block(f"for (int h = 0; h < {heads}; ++h)"):
        values = [c_store(storage, em.element(e, "h", "d" if dim > 1 else "0")) for e, _, storage in targets]
        L.extend(em.take_statements())
        for value, (_, target, _) in zip(values, targets):
            if dim > 1:
                L.line("#pragma omp simd")
                L.line(f"for (int d = 0; d < {dim}; ++d) {target('h', 'd')} {op} {value};")
            else:
                L.line(f"{target('h', '0')} {op} {value};")


def _flat(heads: int, dim: int, h: str, d: str) -> str:
    parts = ([f"{h} * {dim}" if dim > 1 else h] if heads > 1 else []) + ([d] if dim > 1 else [])
    return " + ".join(parts) or "0"


def _use_expr_fields(f: CFunction, exprs: list[Any]) -> None:
    bufs, params, consts = expr_names(exprs)
    for b in bufs:
        f.use(b)
    for p in params:
        f.use(f"P_{p}")
    for g in consts:
        f.use(f"G_{g}")


def _short(e: Any) -> str:
    from rgtune.ir.kernels import expr_str

    return expr_str(e).replace("*/", "* /")
