"""The weight-gradient template (a training program's): a segment GEMM whose rows are reduced, in CUDA.

A :class:`~rgtune.ir.kernels.WeightGradKernel` computes, per type ``t`` (node type, relation, or one
for ``by="none"``), ``grad[t] (+)= sum over the rows r of type t of x[in(r)]^T dy[r]`` (a weight's
gradient: ``K x N`` per type, or per head for ``per_head``), or with ``x`` None ``sum_r dy[r]`` (a
bias's, an attention vector's, a gate's). The rows are many (every edge of a relation) and the result
small (``K x N``), so the rows are what is split: the host cuts each type's rows (iterated like the
forward GEMM's: edges relation by relation through ``e_rel_order``) into chunks of ``chunk_rows``
(:func:`~.runtime.weightgrad_tables`: ``chunk_row0``, ``chunk_row_end``, ``chunk_type``, chunks
sorted by type), and a block reduces one chunk (``grid.x``). Schedule (``weightgrad.*``):

* ``x^T dy``: ``grid.y`` runs over the gradient's ``tile_m x tile_n`` tiles (per head); the block
  stages ``tile_r`` rows of the chunk at a time in shared memory (the gathered ``x`` rows' tile
  columns and the ``dy`` rows' tile columns, row ids resolved once per slice) and each of its
  ``threads`` threads accumulates a micro-tile of outputs in registers (as the GEMM template);
* ``dy`` summed: threads over (row lane, column), a column's sums combined in shared memory;
* ``reduction=atomic``: the block ``atomicAdd`` s its partial tile into the gradient (zeroed by the
  runtime before the program runs, so accumulating or not is the same code);
  ``reduction=two_pass``: the block stores its partial tile in a ``partials`` scratch buffer (one
  slot per chunk) and a second kernel, a thread per gradient element, sums each type's chunks in
  order and stores (or, ``accumulate``, adds) the gradient: deterministic, no atomics.

Example:
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> from rgtune.ir.kernels import WeightGradKernel
    >>> kp = compile_program(build_model("rgcn", 8, 8), training=True).kernels
    >>> k = next(k for k in kp.kernels if isinstance(k, WeightGradKernel) and k.rows == "edge")
    >>> s = {"reduction": "two_pass", "chunk_rows": 512, "tile_m": 32, "tile_n": 64, "tile_r": 16, "threads": 128}
    >>> unit = weightgrad_unit(k, s, kp)
    >>> print(unit.code.splitlines()[0])
    // template weightgrad: grad[rel] = sum_r x@src[r]^T dy[r] over edge rows [1x8 -> 1x8]
    >>> weightgrad_unit(k, {**s, "chunk_rows": 2048}, kp).key == unit.key  # the host's choice: one compile
    True
    >>> unit.functions, [t.name for t in unit.temps]
    (('weightgrad', 'weightgrad_reduce'), ['partials'])
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from rgtune.codegen.cuda._context import Context
from rgtune.codegen.cuda._expr import FIND_PAIR, UnsupportedKernel, prelude
from rgtune.codegen.cuda._gemm import micro_tile
from rgtune.codegen.cuda._unit import Arg, Grid, KernelUnit, Launch, Temp, comment_block
from rgtune.ir.kernels import KernelProgram, WeightGradKernel

#: the host-built chunk tables the reducing kernel reads (see ``runtime.weightgrad_tables``)
CHUNK_TABLES = ("chunk_row0", "chunk_row_end", "chunk_type")
#: and what the second pass of ``reduction=two_pass`` reads: each type's chunks
TYPE_TABLES = ("type_chunk_off",)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the emitters of one weight-gradient kernel share."""

    kernel: WeightGradKernel
    program: KernelProgram
    ctx: Context
    reduction: str  # "atomic" or "two_pass"
    threads: int
    tile_m: int
    tile_n: int
    tile_r: int
    heads: int  # gradient slices per type: the heads of a per-head weight, else 1
    k_dim: int  # rows of one slice (input features)
    n_dim: int  # columns of one slice (output features)
    x_width: int  # floats per x row
    dy_width: int  # floats per dy row
    size: int  # floats of the gradient per type
    row_id: str  # C: the row id at iteration position ``r``
    x_row: str  # C: the x row of ``rid``

    @property
    def m_tiles(self) -> int:
        return -(-self.k_dim // self.tile_m)

    @property
    def n_tiles(self) -> int:
        return -(-self.n_dim // self.tile_n)

    @property
    def tiles(self) -> int:
        """Gradient tiles per type: ``grid.y`` of the ``x^T dy`` kernel."""
        return self.heads * self.m_tiles * self.n_tiles


def weightgrad_unit(k: WeightGradKernel, s: Mapping[str, Any], kp: KernelProgram) -> KernelUnit:
    """The CUDA unit of ``k`` under the ``weightgrad.*`` schedule ``s``.

    The code names only what shapes it: ``chunk_rows`` is the host's (the chunk table), and a column
    sum has no tiles, so schedules that differ there share one compiled kernel.
    """
    plan = _plan(k, s, kp)
    chunk_rows = s["chunk_rows"]
    if k.x is None:
        lines, col_blocks = _column_sums(plan), 1
        sched = f"reduction={plan.reduction} threads={plan.threads}; dy summed per column"
    else:
        lines, col_blocks = _outer_products(plan), plan.tiles
        rm, rn, tr, tc = micro_tile(plan.tile_m, plan.tile_n, plan.threads)
        sched = (f"reduction={plan.reduction} tile_m={plan.tile_m} tile_n={plan.tile_n} tile_r={plan.tile_r} "
                 f"threads={plan.threads}; tile {plan.tile_m}x{plan.tile_n} of {plan.k_dim}x{plan.n_dim}, "
                 f"micro-tile {rm}x{rn} per thread, threads {tr}x{tc}")
    args = plan.ctx.args(CHUNK_TABLES, [])
    text = "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args))
    launches = [Launch("weightgrad", Grid("chunks", k.rows, tile_rows=chunk_rows, col_blocks=col_blocks),
                       plan.threads, args)]
    if plan.reduction == "two_pass":
        reduce_text, reduce_args = _second_pass(plan)
        text += "\n" + reduce_text
        launches.append(Launch("weightgrad_reduce", Grid("items", "types", plan.size, plan.threads), plan.threads,
                               reduce_args))
    code = "\n".join([comment_block([f"template weightgrad: {_canonical(k, plan.reduction)}", f"schedule: {sched}"]),
                      prelude(kp.index_bits, plan.ctx.storage().values()), *_find_pair_if_needed(plan.ctx), text, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})", "  " + k.describe(),
                            f"  buffers: dy = {k.dy}" + (f", x = {k.x}" if k.x else "") + f"; gradient grad = {k.grad}",
                            f"  chunk_rows={chunk_rows} (rows per block: the host's chunk table)"])
    return KernelUnit(k, header, code, tuple(launches), tuple(plan.ctx.temps))


def _plan(k: WeightGradKernel, s: Mapping[str, Any], kp: KernelProgram) -> _Plan:
    """Checks the kernel's shapes, binds its buffers and derives every size the emitters use."""
    if k.per_head and k.in_heads != k.out_heads:
        raise UnsupportedKernel(f"{k.name}: per-head weight with {k.in_heads} input and {k.out_heads} output heads")
    heads = k.out_heads if k.per_head else 1
    k_dim = k.in_dim if k.per_head else k.in_heads * k.in_dim
    n_dim = k.out_dim if k.per_head else k.out_heads * k.out_dim
    dy_width = k.out_heads * k.out_dim
    size = math.prod(kp.param_shapes[k.param])
    expect = dy_width if k.x is None else heads * k_dim * n_dim
    if size != expect:
        raise UnsupportedKernel(f"{k.name}: gradient slice of {size} floats, expected {expect}")
    if kp.buffers[k.dy].width != dy_width:
        raise UnsupportedKernel(f"{k.name}: dy rows of {kp.buffers[k.dy].width} floats, expected {dy_width}")
    ctx = Context(kp, {})
    if k.x is not None:
        ctx.add_input("buffer", k.x, "x")
    ctx.add_input("buffer", k.dy, "dy")
    ctx.add_input("param", k.grad, "grad", "float*")
    if s["reduction"] == "two_pass":
        ctx.add_temp(Temp("partials", "chunks", size, 0.0))
    elif s["reduction"] != "atomic":
        raise UnsupportedKernel(f"{k.name}: unknown reduction {s['reduction']!r}")
    rows = ctx.index(k.rows, "rid")
    # a typed edge gradient iterates its rows relation by relation (rel_offsets index e_rel_order), as the GEMM
    row_id = rows.array("e_rel_order", "r") if (k.rows == "edge" and k.by != "none") else "r"
    x_row = rows(k.x_via) if k.x is not None else "rid"
    return _Plan(kernel=k, program=kp, ctx=ctx, reduction=s["reduction"], threads=s["threads"],
                 tile_m=s["tile_m"], tile_n=s["tile_n"], tile_r=s["tile_r"], heads=heads, k_dim=k_dim, n_dim=n_dim,
                 x_width=k.in_heads * k.in_dim, dy_width=dy_width, size=size, row_id=row_id, x_row=x_row)


# --------------------------------------------------------------------------- x^T dy
def _outer_products(plan: _Plan) -> list[str]:
    """The kernel summing ``x[in(r)]^T dy[r]`` over one chunk's rows, for one tile of the gradient."""
    return [*_tile_open(plan), *_slices(plan), *_tile_store(plan), "}"]


def _tile_open(plan: _Plan) -> list[str]:
    """Shared tiles, the block's chunk and gradient tile, the zeroed micro-tile."""
    rm, rn, tr, tc = micro_tile(plan.tile_m, plan.tile_n, plan.threads)
    return [
        f"extern \"C\" __global__ void __launch_bounds__({plan.threads}) weightgrad(PARAMS) {{",
        f"  __shared__ float Xs[{plan.tile_r}][{plan.tile_m}];  // a slice of rows: x's tile columns",
        f"  __shared__ float Ds[{plan.tile_r}][{plan.tile_n}];  // and dy's tile columns",
        f"  __shared__ idx_t s_rid[{plan.tile_r}];   // row id of each slice row, -1 past the chunk's end",
        f"  __shared__ idx_t s_xrow[{plan.tile_r}];  // its x row ({plan.kernel.x_via})",
        "  const int tid = threadIdx.x;",
        "  // grid.x: a chunk of rows of one type (host table); grid.y: a tile of that type's gradient",
        "  const idx_t row0 = chunk_row0[blockIdx.x], row_end = chunk_row_end[blockIdx.x];",
        f"  const int hb = blockIdx.y / {plan.m_tiles * plan.n_tiles};  // head of a per-head weight (0 otherwise)",
        f"  const int m0 = (blockIdx.y / {plan.n_tiles}) % {plan.m_tiles} * {plan.tile_m};",
        f"  const int n0 = blockIdx.y % {plan.n_tiles} * {plan.tile_n};",
        f"  const int tr = tid / {tc}, tc = tid % {tc};  // this thread: rows tr + i*{tr}, columns tc + j*{tc}",
        f"  float c[{rm}][{rn}];",
        "#pragma unroll",
        f"  for (int i = 0; i < {rm}; ++i)",
        "#pragma unroll",
        f"    for (int j = 0; j < {rn}; ++j) c[i][j] = 0.0f;",
    ]


def _slices(plan: _Plan) -> list[str]:
    """The loop over the chunk's rows, ``tile_r`` at a time: row ids, the two tiles, the outer products."""
    x_ok = "xr >= 0" + (f" && m0 + m < {plan.k_dim}" if plan.k_dim % plan.tile_m else "")
    d_ok = "rid >= 0" + (f" && n0 + n < {plan.n_dim}" if plan.n_dim % plan.tile_n else "")
    x_head = f"(long)hb * {plan.k_dim} + " if plan.heads > 1 else ""
    d_head = f"(long)hb * {plan.n_dim} + " if plan.heads > 1 else ""
    return [
        f"  for (idx_t r0 = row0; r0 < row_end; r0 += {plan.tile_r}) {{",
        f"    for (int i = tid; i < {plan.tile_r}; i += {plan.threads}) {{  // row ids, resolved once per slice",
        "      const idx_t r = r0 + i;",
        "      idx_t rid = -1, xr = -1;",
        f"      if (r < row_end) {{ rid = {plan.row_id}; xr = {plan.x_row}; }}",
        "      s_rid[i] = rid;",
        "      s_xrow[i] = xr;",
        "    }",
        "    __syncthreads();",
        f"    for (int i = tid; i < {plan.tile_r * plan.tile_m}; i += {plan.threads}) {{"
        "  // consecutive threads: consecutive features of a row",
        f"      const int rr = i / {plan.tile_m}, m = i % {plan.tile_m};",
        "      const idx_t xr = s_xrow[rr];",
        f"      Xs[rr][m] = ({x_ok}) ? {plan.ctx.load('x', f'x[(long)xr * {plan.x_width} + {x_head}m0 + m]')} : 0.0f;",
        "    }",
        f"    for (int i = tid; i < {plan.tile_r * plan.tile_n}; i += {plan.threads}) {{",
        f"      const int rr = i / {plan.tile_n}, n = i % {plan.tile_n};",
        "      const idx_t rid = s_rid[rr];",
        f"      Ds[rr][n] = ({d_ok}) ? {plan.ctx.load('dy', f'dy[(long)rid * {plan.dy_width} + {d_head}n0 + n]')} : 0.0f;",
        "    }",
        "    __syncthreads();",
        *_slice_product(plan),
        "    __syncthreads();  // the slice is consumed before the next one overwrites it",
        "  }",
    ]


def _slice_product(plan: _Plan) -> list[str]:
    """The micro-tile's outer products over the slice's rows (the reduced dimension here)."""
    rm, rn, tr, tc = micro_tile(plan.tile_m, plan.tile_n, plan.threads)
    return [
        f"#pragma unroll {min(plan.tile_r, 8)}",
        f"    for (int rr = 0; rr < {plan.tile_r}; ++rr) {{",
        f"      float a[{rm}], b[{rn}];",
        "#pragma unroll",
        f"      for (int i = 0; i < {rm}; ++i) a[i] = Xs[rr][tr + i * {tr}];",
        "#pragma unroll",
        f"      for (int j = 0; j < {rn}; ++j) b[j] = Ds[rr][tc + j * {tc}];",
        "#pragma unroll",
        f"      for (int i = 0; i < {rm}; ++i)",
        "#pragma unroll",
        f"        for (int j = 0; j < {rn}; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);",
        "    }",
    ]


def _tile_store(plan: _Plan) -> list[str]:
    """The micro-tile into the gradient (atomicAdd) or into the chunk's slot of ``partials``."""
    rm, rn, tr, tc = micro_tile(plan.tile_m, plan.tile_n, plan.threads)
    lines = [
        "#pragma unroll",
        f"  for (int i = 0; i < {rm}; ++i) {{",
        f"    const int m = m0 + tr + i * {tr};",
    ]
    if plan.k_dim % plan.tile_m:
        lines.append(f"    if (m >= {plan.k_dim}) continue;")
    lines += [
        "#pragma unroll",
        f"    for (int j = 0; j < {rn}; ++j) {{",
        f"      const int n = n0 + tc + j * {tc};",
    ]
    if plan.n_dim % plan.tile_n:
        lines.append(f"      if (n >= {plan.n_dim}) continue;")
    lines += [f"      const long o = (long)hb * {plan.k_dim * plan.n_dim} + (long)m * {plan.n_dim} + n;",
              *_partial_out(plan, "o", "c[i][j]", "      "),
              "    }",
              "  }"]
    return lines


def _partial_out(plan: _Plan, offset: str, value: str, indent: str) -> list[str]:
    """A block's partial sum at ``offset`` of the gradient slice: added into the gradient, or stored."""
    if plan.reduction == "atomic":
        return [f"{indent}atomicAdd(&grad[(long)chunk_type[blockIdx.x] * {plan.size} + {offset}], {value});"]
    return [f"{indent}partials[(long)blockIdx.x * {plan.size} + {offset}] = {value};  // this chunk's slot"]


# --------------------------------------------------------------------------- dy summed
def _column_sums(plan: _Plan) -> list[str]:
    """The kernel summing one chunk's ``dy`` rows: ``cols`` threads over columns (a power of 2 covering
    the row, at most the block), the other factor over rows; a column's partial sums combined in shared
    memory by a tree; several passes when the row is wider than the block."""
    cols = min(1 << max(plan.n_dim - 1, 0).bit_length(), plan.threads)
    lanes = plan.threads // cols
    tree = [
        "#pragma unroll",
        f"    for (int o = {lanes // 2}; o > 0; o >>= 1) {{  // the row lanes' sums, by a tree",
        "      if (tr < o) part[tid] += part[tid + o * " + str(cols) + "];",
        "      __syncthreads();",
        "    }",
    ] if lanes > 1 else []
    return [
        f"extern \"C\" __global__ void __launch_bounds__({plan.threads}) weightgrad(PARAMS) {{",
        f"  __shared__ float part[{plan.threads}];  // per thread: its column's sum over its rows",
        "  const int tid = threadIdx.x;",
        f"  const int tr = tid / {cols}, tc = tid % {cols};  // row lane, column",
        "  // grid.x: a chunk of rows of one type (host table)",
        "  const idx_t row0 = chunk_row0[blockIdx.x], row_end = chunk_row_end[blockIdx.x];",
        f"  for (int n0 = 0; n0 < {plan.dy_width}; n0 += {cols}) {{  // a pass over {cols} columns",
        "    const int n = n0 + tc;",
        "    float s = 0.0f;",
        f"    if (n < {plan.dy_width})",
        f"      for (idx_t r = row0 + tr; r < row_end; r += {lanes}) {{",
        f"        const idx_t rid = {plan.row_id};",
        f"        s += {plan.ctx.load('dy', f'dy[(long)rid * {plan.dy_width} + n]')};",
        "      }",
        "    part[tid] = s;",
        "    __syncthreads();",
        *tree,
        f"    if (tr == 0 && n < {plan.dy_width}) {{",
        *_partial_out(plan, "n", "part[tc]", "      "),
        "    }",
        "    __syncthreads();  // part is reused by the next pass",
        "  }",
        "}",
    ]


# --------------------------------------------------------------------------- two_pass
def _second_pass(plan: _Plan) -> tuple[str, tuple[Arg, ...]]:
    """``reduction=two_pass``: a thread per gradient element sums its type's chunks' partials in order."""
    k = plan.kernel
    ctx = Context(plan.program, {})
    ctx.add_input("param", k.grad, "grad", "float*")
    ctx.add_temp(Temp("partials", "chunks", plan.size, 0.0))
    args = ctx.args(TYPE_TABLES, [("types", "num_types")])
    op = "+=" if k.accumulate else "="
    lines = [
        "// pass 2: a thread per gradient element, its type's chunks summed in order (deterministic)",
        f"extern \"C\" __global__ void __launch_bounds__({plan.threads}) weightgrad_reduce(PARAMS) {{",
        f"  const long long i = (long long)blockIdx.x * {plan.threads} + threadIdx.x;",
        f"  if (i >= num_types * {plan.size}) return;",
        f"  const long long t = i / {plan.size}, j = i % {plan.size};",
        "  float s = 0.0f;",
        f"  for (idx_t c = type_chunk_off[t]; c < type_chunk_off[t + 1]; ++c) s += partials[(long)c * {plan.size} + j];",
        f"  grad[i] {op} s;" + ("  // accumulate: a param used twice adds up" if k.accumulate else ""),
        "}",
    ]
    return "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args)), args


# --------------------------------------------------------------------------- text
def _canonical(k: WeightGradKernel, reduction: str) -> str:
    """The kernel in one line, without IR names. With atomics a gradient is added into (the runtime zeroed
    it), whether it accumulates or not; the second pass stores or adds."""
    src = "1" if k.x is None else ("x" if k.x_via == "row" else f"x@{k.x_via}")
    by = k.by if k.by != "ntype" or not k.weight_end else k.weight_end + "_ntype"
    op = "+=" if k.accumulate or reduction == "atomic" else "="
    term = "dy[r]" if k.x is None else f"{src}[r]^T dy[r]"
    return (f"grad[{by}] {op} sum_r {term} over {k.rows} rows{' per_head' if k.per_head else ''} "
            f"[{k.in_heads}x{k.in_dim} -> {k.out_heads}x{k.out_dim}]")


def _find_pair_if_needed(ctx: Context) -> list[str]:
    used: set[str] = set()
    for ix in ctx.indices:
        used |= ix.arrays
    return [FIND_PAIR] if ctx.kp.pair_index == "bsearch" and ({"sp_offsets", "dp_offsets"} & used) else []
