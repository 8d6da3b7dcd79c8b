"""Kernel IR -> C/OpenMP: one source file (and one small library) per kernel.

Each kernel of a :class:`~rgtune.ir.kernels.KernelProgram` becomes one C file with one entry
point, ``void rg_<template>(const rg_ctx* c)`` (``rg_gemm_finish`` for a BLAS GEMM), where
``rg_ctx`` holds the graph's sizes and index arrays, the kernel's buffers and params and its
per-graph arrays (GEMM tiles). Buffer and param names in the file are *canonical* (``b0,
b1, ...`` and ``p0, ...`` in order of use; the kernel IR comment is written with them), so the
same kernel with the same schedule gives the same text in every program that contains it:
the compile cache then shares it between programs (a tuner's trials, a test's
configurations), and a cold program only compiles the kernels no earlier program had. The
program's manifest (``program.txt`` in :attr:`GeneratedProgram.sources`) maps them back.

What defines the kernel (heads, feature sizes, tiles, chunks) is a compile-time constant,
so loops over features have constant trip counts and vectorize; what defines the graph
(rows, edges, number of relations and node types) comes at run time, so one library serves
every graph. ``float`` data, ``idx_t`` indices (``int32_t``/``int64_t`` per ``kp.index_bits``).

Example:
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> kp = compile_program(build_model("rgcn", 8, 8)).kernels
    >>> gen = generate(kp, {})
    >>> [(s.kernel, s.entry) for s in gen.kernels][:2]
    [('gemm1', 'rg_gemm'), ('gemm2', 'rg_gemm')]
    >>> gen.kernels[0].buffers, gen.kernels[0].params
    ({'b0': 'x', 'b1': 'v1'}, {'p0': 'weight'})
    >>> "typedef int32_t idx_t;" in gen.kernels[0].text
    True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from rgtune.codegen.cfamily import C_TYPES, DST_ROWS, LOW_PRECISION_C, helper_functions
from rgtune.codegen.cpu.cwriter import CFunction
from rgtune.codegen.cpu.edges import generate_map, generate_scatter, generate_traversal
from rgtune.codegen.cpu.gemm import VEC, cpu_flags, generate_gemm
from rgtune.codegen.cpu.rows import GRAPH_CONSTANTS, INDEX_ARRAYS
from rgtune.codegen.cpu.schedule import CPU_SCHEDULE
from rgtune.codegen.cpu.weightgrad import generate_weightgrad
from rgtune.ir.kernels import (AggregateStores, EdgeStores, Expr, GemmKernel, Kernel, KernelProgram, Load, MapKernel,
                               ParamLoad, ScatterKernel, Stage, TraversalKernel, WeightGradKernel, WeightKernel,
                               reads_guarded)

SIZES = ("num_nodes", "num_dst_nodes", "num_edges", "num_src_pairs", "num_dst_pairs", "num_threads")
ABI_VERSION = 1


@dataclass(frozen=True)
class KernelSource:
    """One kernel's C file: its text, context fields ``(name, C type)``, entry point, and name maps."""

    kernel: str  # the kernel's name in the program
    file: str  # its file name in BuiltProgram.sources
    text: str
    fields: tuple[tuple[str, str], ...]
    entry: str
    buffers: dict[str, str]  # canonical name -> program buffer
    params: dict[str, str]  # canonical name -> program param


@dataclass(frozen=True)
class GeneratedProgram:
    """Every kernel's source (weight kernels have none: torch folds them) and the program manifest."""

    kernels: list[KernelSource]
    manifest: str
    acc_regs: int

    @property
    def sources(self) -> dict[str, str]:
        return {"program.txt": self.manifest, **{s.file: s.text for s in self.kernels}}


def native_acc_regs() -> int:
    """Vector accumulators a GEMM micro-kernel may keep in registers on this CPU (16 with AVX-512)."""
    return 16 if "avx512f" in cpu_flags() else 8


def generate(kp: KernelProgram, schedule: Mapping[str, Any], acc_regs: int | None = None) -> GeneratedProgram:
    """The C sources of ``kp`` under ``schedule`` (template parameters, ``"gemm.tile_rows" -> 32``)."""
    acc_regs = native_acc_regs() if acc_regs is None else acc_regs
    out = [generate_kernel(k, kp, schedule, acc_regs) for k in kp.kernels if has_source(k, schedule)]
    return GeneratedProgram(out, _manifest(kp, schedule, out), acc_regs)


def has_source(k: Kernel, schedule: Mapping[str, Any]) -> bool:
    """Whether ``k`` has a C file: weight folds and BLAS weight gradients are torch's alone (a BLAS GEMM
    has its generated finish step)."""
    if isinstance(k, WeightKernel):
        return False
    return not (isinstance(k, WeightGradKernel) and CPU_SCHEDULE.kernel_schedule(k, schedule)["impl"] == "blas")


def generate_kernel(k: Kernel, kp: KernelProgram, schedule: Mapping[str, Any], acc_regs: int) -> KernelSource:
    """One kernel's C file, with canonical buffer and param names."""
    ck, ckp, bufs, params = canonical(k, kp)
    s = CPU_SCHEDULE.kernel_schedule(k, schedule)
    if isinstance(ck, GemmKernel):
        fn = generate_gemm(ck, s, ckp, acc_regs)
    elif isinstance(ck, TraversalKernel):
        fn = generate_traversal(ck, s, ckp)
    elif isinstance(ck, MapKernel):
        fn = generate_map(ck, s, ckp)
    elif isinstance(ck, ScatterKernel):
        fn = generate_scatter(ck, s, ckp)
    elif isinstance(ck, WeightGradKernel):
        fn = generate_weightgrad(ck, s, ckp, acc_regs)
    else:
        raise TypeError(f"the cpu backend has no template for {type(k).__name__}")
    if reads_guarded(ck):
        fn.use(DST_ROWS)
    types = field_types(ckp)
    used = {"num_threads"} | set(fn.fields)
    fields = tuple((n, types[n]) for n in list(SIZES) + sorted(set(types) - set(SIZES)) if n in used)
    text = _assemble(ck, ckp, s, fn, fields)
    return KernelSource(k.name, f"{k.name}.c", text, fields, fn.name, bufs, params)


def field_types(kp: KernelProgram) -> dict[str, str]:
    """C type of every context field a kernel of ``kp`` may use."""
    t: dict[str, str] = {s: "int64_t" for s in SIZES}
    t.update({a: "idx_t*" for a in INDEX_ARRAYS})
    t.update({f"G_{g}": "float*" for g in GRAPH_CONSTANTS})
    t.update({n: C_TYPES[b.dtype] + "*" for n, b in kp.buffers.items()})
    t.update({f"P_{p}": "float*" for p in kp.param_shapes})
    for k in kp.kernels:
        if isinstance(k, GemmKernel):
            t.update({f"{k.name}_order": "idx_t*", f"{k.name}_tiles": "int64_t*", f"{k.name}_groups": "int64_t*",
                      f"{k.name}_ngroups": "int64_t", f"{k.name}_staged": "float*", f"{k.name}_types": "int64_t*",
                      f"{k.name}_rows": "int64_t", f"{k.name}_inplace": "int64_t",
                      f"{k.name}_wpk": "rg_bf16*"})  # the weight packed in bfloat16 pairs (gemm.bf16_dot)
        elif isinstance(k, TraversalKernel):
            t.update({f"{k.name}_max": "float*", f"{k.name}_sum": "float*"})
        elif isinstance(k, ScatterKernel):
            t.update({f"{k.name}_perm": "idx_t*", f"{k.name}_offsets": "int64_t*"})
        elif isinstance(k, WeightGradKernel):
            t.update({f"{k.name}_order": "idx_t*", f"{k.name}_chunks": "int64_t*", f"{k.name}_groups": "int64_t*",
                      f"{k.name}_ngroups": "int64_t", f"{k.name}_type_groups": "int64_t*",
                      f"{k.name}_ntypes": "int64_t", f"{k.name}_partial": "float*"})
    for name in t:
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(f"name {name!r} is not a C identifier")
    return t


# ------------------------------------------------------------------ canonical names


def canonical(k: Kernel, kp: KernelProgram) -> tuple[Kernel, KernelProgram, dict[str, str], dict[str, str]]:
    """``k`` with buffers renamed ``b0, b1, ...`` and params ``p0, ...`` (in order of use), named
    after its template, in a one-kernel program; and the maps canonical -> original names."""
    buf_order: list[str] = []
    par_order: list[str] = []

    def note(names: list[str], *xs: str | None) -> None:
        for x in xs:
            if x and x not in names:
                names.append(x)

    def note_expr(e: Expr) -> None:
        for x in e.walk():
            if isinstance(x, Load):
                note(buf_order, x.buffer)
            elif isinstance(x, ParamLoad):
                note(par_order, x.param)

    if isinstance(k, GemmKernel):
        note(buf_order, k.x, k.out, *(o for o, _ in k.epilogue))
        note(par_order, k.weight, k.bias)
        for _, e in k.epilogue:
            note_expr(e)
    elif isinstance(k, TraversalKernel):
        note(buf_order, *k.stage.outputs())
        for e in k.stage.exprs():
            note_expr(e)
    elif isinstance(k, MapKernel):
        note(buf_order, k.out)
        note_expr(k.value)
    elif isinstance(k, ScatterKernel):
        note(buf_order, k.out)
        note_expr(k.message)
    elif isinstance(k, WeightGradKernel):
        note(buf_order, k.x, k.dy)
        note(par_order, k.grad, k.param)  # the param only for its slice shape
    bmap = {b: f"b{i}" for i, b in enumerate(buf_order)}
    pmap = {p: f"p{i}" for i, p in enumerate(par_order)}
    name = k.template
    if isinstance(k, GemmKernel):
        ck: Kernel = dataclasses.replace(
            k, name=name, x=bmap[k.x], out=bmap.get(k.out) if k.out else None, weight=pmap[k.weight],  # type: ignore[arg-type]
            bias=pmap[k.bias] if k.bias else None, epilogue=[(bmap[o], _rename(e, bmap, pmap)) for o, e in k.epilogue])
    elif isinstance(k, TraversalKernel):
        ck = dataclasses.replace(k, name=name, stage=_rename_stage(k.stage, bmap, pmap))
    elif isinstance(k, MapKernel):
        ck = dataclasses.replace(k, name=name, out=bmap[k.out], value=_rename(k.value, bmap, pmap))
    elif isinstance(k, ScatterKernel):
        ck = dataclasses.replace(k, name=name, out=bmap[k.out], message=_rename(k.message, bmap, pmap))
    else:
        assert isinstance(k, WeightGradKernel), type(k)
        ck = dataclasses.replace(k, name=name, x=bmap[k.x] if k.x else None, dy=bmap[k.dy], grad=pmap[k.grad],
                                 param=pmap[k.param])
    buffers = {bmap[b]: dataclasses.replace(kp.buffers[b], name=bmap[b]) for b in buf_order}
    ckp = KernelProgram(
        name=name, buffers=buffers, kernels=[ck], input="", output="",
        param_shapes={pmap[p]: kp.param_shapes[p] for p in par_order},
        param_by={pmap[p]: kp.param_by[p] for p in par_order},
        layout=kp.layout, index_bits=kp.index_bits, pair_index=kp.pair_index)
    return ck, ckp, {v: b for b, v in bmap.items()}, {v: p for p, v in pmap.items()}


def _rename_stage(st: Stage, bmap: Mapping[str, str], pmap: Mapping[str, str]) -> Stage:
    """A traversal's stage with the canonical names of its buffers and params."""
    if isinstance(st, EdgeStores):
        return EdgeStores(tuple(_rename_stage(one, bmap, pmap) for one in st.stores))  # type: ignore[misc]
    if isinstance(st, AggregateStores):
        return AggregateStores(_rename_stage(st.total, bmap, pmap),  # type: ignore[arg-type]
                               tuple(_rename_stage(one, bmap, pmap) for one in st.stores))  # type: ignore[misc]
    changes: dict[str, Any] = {"out": bmap[st.out]}  # type: ignore[attr-defined]
    for f in dataclasses.fields(st):
        v = getattr(st, f.name)
        if isinstance(v, Expr):
            changes[f.name] = _rename(v, bmap, pmap)
    return dataclasses.replace(st, **changes)


def _rename(e: Expr, bmap: Mapping[str, str], pmap: Mapping[str, str]) -> Expr:
    changes: dict[str, Any] = {}
    if isinstance(e, Load):
        changes["buffer"] = bmap[e.buffer]
    elif isinstance(e, ParamLoad):
        changes["param"] = pmap[e.param]
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if isinstance(v, Expr):
            changes[f.name] = _rename(v, bmap, pmap)
    return dataclasses.replace(e, **changes)


# ------------------------------------------------------------------ assembling text


def _assemble(k: Kernel, kp: KernelProgram, s: Mapping[str, Any], fn: CFunction,
              fields: tuple[tuple[str, str], ...]) -> str:
    sched = {f"{k.template}.{name}": v for name, v in sorted(s.items())}
    lines = [f"/* rgtune generated CPU kernel (C + OpenMP), ABI {ABI_VERSION}.",
             f" * {k.template} kernel; schedule {json.dumps(sched)}",
             f" * graph side: layout={kp.layout} index_bits={kp.index_bits} pair_index={kp.pair_index}",
             " * buffers and params have canonical names (the program's manifest maps them):"]
    lines += [f" *   buffer {b.name}: {b.domain}[{b.heads}x{b.dim}]{'' if b.dtype == 'float32' else ' ' + b.dtype}"
              for b in kp.buffers.values()]
    lines += [f" *   param {p}: per {kp.param_by[p]}, slice {list(sh)}" for p, sh in kp.param_shapes.items()]
    lines += [" *", *[f" * {ln}" for ln in k.describe().replace("*/", "* /").splitlines()], " */"]
    idx = "int32_t" if kp.index_bits == 32 else "int64_t"
    struct = "\n".join(["typedef struct {", *[f"    {t} {n};" for n, t in fields], "} rg_ctx;"])
    # the 16-bit types only where a buffer has one: every other source stays as it was (and cached)
    low = [LOW_PRECISION_C] if kp.storage else []
    parts = ["\n".join(lines), _PRELUDE.format(idx=idx, vec_bytes=VEC * 4, bits=kp.index_bits), *low,
             helper_functions("static inline", vector_math=True), struct, *dict.fromkeys(fn.statics),
             fn.render(dict(fields)),
             f"int64_t rg_ctx_size(void) {{ return (int64_t)sizeof(rg_ctx); }}\n"
             f"int64_t rg_abi_version(void) {{ return {ABI_VERSION}; }}\n"]
    return "\n\n".join(parts)


def _manifest(kp: KernelProgram, schedule: Mapping[str, Any], sources: list[KernelSource]) -> str:
    # a training program's backward templates join the forward's (a forward manifest stays as it was)
    templates = ("gemm", "traversal", "map") + (("scatter", "weightgrad") if kp.is_training else ())
    sched = {k: v for k, v in sorted(schedule.items()) if k.split(".")[0] in templates}
    lines = [f"program {kp.name}; schedule {json.dumps(sched)}", "", kp.describe(), "", "kernel files:"]
    for s in sources:
        names = ", ".join(f"{c}={o}" for c, o in {**s.buffers, **s.params}.items())
        lines.append(f"  {s.file}: {s.entry}({names})")
    for k in kp.kernels:
        if isinstance(k, WeightKernel):
            lines.append(f"  {k.name}: torch (rgtune.codegen.weights.fold_weights)")
        elif not has_source(k, schedule):
            lines.append(f"  {k.name}: torch (weightgrad.impl=blas: per-type matmuls)")
    return "\n".join(lines) + "\n"


_PRELUDE = """/* No system headers: parsing them costs more than compiling a kernel. What is needed: */
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __SIZE_TYPE__ size_t;
#define NULL ((void*)0)
#define INFINITY (__builtin_inff())
#define memcpy __builtin_memcpy
float expf(float);
float erff(float);
int posix_memalign(void** ptr, size_t alignment, size_t size);
void free(void* ptr);
void abort(void);

typedef {idx} idx_t;  /* layout.index_bits = {bits} */

/* {vec_bytes}-byte float vectors (GCC/Clang vector extensions); unaligned, may alias float */
typedef float rg_vf __attribute__((vector_size({vec_bytes}), aligned(4), may_alias));
static inline rg_vf rg_loadu(const float* p) {{ return *(const rg_vf*)p; }}
static inline void rg_storeu(float* p, rg_vf v) {{ *(rg_vf*)p = v; }}

/* per-thread scratch, allocated once per kernel call and thread (never in a loop) */
static inline float* rg_alloc(int64_t n) {{
    void* p = NULL;
    if (posix_memalign(&p, 64, (size_t)(n > 0 ? n : 1) * sizeof(float))) abort();
    return (float*)p;
}}

/* the position of `key` in the sorted block a[lo..hi) (edge -> pair row by binary search) */
static inline int64_t rg_find(const idx_t* restrict a, int64_t lo, int64_t hi, int64_t key) {{
    while (lo < hi) {{
        const int64_t mid = lo + ((hi - lo) >> 1);
        if ((int64_t)a[mid] < key) lo = mid + 1; else hi = mid;
    }}
    return lo;
}}

/* atomic float max by compare-and-swap on the bits */
static inline void rg_atomic_max(float* p, float v) {{
    uint32_t* q = (uint32_t*)p;
    uint32_t old = __atomic_load_n(q, __ATOMIC_RELAXED), nv;
    memcpy(&nv, &v, sizeof nv);
    for (;;) {{
        float cur;
        memcpy(&cur, &old, sizeof cur);
        if (cur >= v) return;
        if (__atomic_compare_exchange_n(q, &old, nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    }}
}}"""
