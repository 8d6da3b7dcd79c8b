"""The segment GEMM template: ``out[row] = x[in(row)] @ W[type(row)] + b[type(row)]``, in CUDA.

Mapping (``gemm.*`` schedule):

* a block computes a ``tile_rows x tile_cols`` output tile of rows that share one weight: the
  rows of one type segment (node type, relation, or everything for ``by="none"``); a tile
  never straddles two segments;
* ``block_partition=static``: ``grid.z`` is the segment, ``grid.x`` the tile inside it (a grid
  per segment, blocks past a short segment's end exit); ``balanced``: ``grid.x`` runs over a
  host-built table of (first row, segment) tiles, so every block has work;
* ``grid.y`` runs over column tiles (per head for ``per_head`` weights);
* ``threads`` threads, each computing ``tile_rows * tile_cols / threads`` outputs in registers
  (a ``RM x RN`` micro-tile, rows strided by ``TR``, columns by ``TC`` so that shared-memory
  reads and global stores are consecutive across a warp);
* ``tile_k``-deep slices of the (gathered) input rows and of the weight are staged in shared
  memory; the gather ``x_via`` is resolved once per tile row into shared memory.

Epilogues (``fusion.epilogue``): the block walks all column tiles of its rows itself, so the
whole output row is its own. An inner product with the fresh row (``inner(acc, y)``, the only
form the lowering produces) is summed while the tile is stored (per thread, then by warp shuffles across the threads of a tile
row, then into shared memory: deterministic, no atomics); one thread
per (row, head) then evaluates the rest of the expression. Any other use of ``acc`` reads the
finished row back from global memory (``out``, or a scratch buffer when the output is
discarded or accumulated). ``accumulate`` stores with ``atomicAdd`` (several pair rows add
into one node row).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from rgtune.codegen.cuda._context import Context
from rgtune.codegen.cuda._expr import FIND_PAIR, UnsupportedKernel, has_acc, inner_products, prelude
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch, Temp, comment_block
from rgtune.ir.kernels import Acc, Expr, GemmKernel, InnerE, KernelProgram, expr_str


def micro_tile(tile_rows: int, tile_cols: int, threads: int) -> tuple[int, int, int, int]:
    """``(RM, RN, TR, TC)``: each of ``TR x TC`` threads computes ``RM x RN`` outputs.

    >>> micro_tile(64, 32, 128)
    (4, 4, 16, 8)
    >>> micro_tile(16, 16, 256)
    (1, 1, 16, 16)
    """
    per_thread = tile_rows * tile_cols // threads
    if per_thread < 1 or tile_rows * tile_cols % threads:
        raise UnsupportedKernel(f"tile {tile_rows}x{tile_cols} does not split over {threads} threads")
    rn = min(per_thread, 4, tile_cols)
    tc = tile_cols // rn
    tr = threads // tc
    if tr < 1 or threads % tc or tile_rows % tr or tile_cols % rn or tc > 32 or tc & (tc - 1):
        raise UnsupportedKernel(f"no micro-tile for {tile_rows}x{tile_cols} over {threads} threads")
    return tile_rows // tr, rn, tr, tc


def segments_of(k: GemmKernel) -> str:
    """Which offsets delimit the GEMM's type segments (see ``runtime.gemm_segments``)."""
    if k.by == "none":
        return "all"
    return {"node": "node_offsets", "edge": "rel_offsets", "src_pair": "sp_offsets", "dst_pair": "dp_offsets"}[k.rows]


def _epilogue_strategy(k: GemmKernel, requested: str) -> str:
    if not k.epilogue:
        return "none"
    if requested == "row":
        return "row"
    for _, e in k.epilogue:
        for x in e.walk():
            if isinstance(x, InnerE) and (isinstance(x.a, Acc) or isinstance(x.b, Acc)):
                if x.heads != k.out_heads or (isinstance(x.a, Acc) and has_acc(x.b)) or (
                        isinstance(x.b, Acc) and has_acc(x.a)):
                    return "row"
        acc_outside = _strip_acc_inners(e)
        if has_acc(acc_outside):
            return "row"
    return "inner"


def _strip_acc_inners(e: Expr) -> Expr:
    """``e`` with every ``inner(acc, y)`` replaced by ``y`` (to see whether ``acc`` occurs elsewhere)."""
    if isinstance(e, InnerE) and isinstance(e.a, Acc):
        return e.b
    if isinstance(e, InnerE) and isinstance(e.b, Acc):
        return e.a
    changes = {f.name: _strip_acc_inners(getattr(e, f.name))
               for f in dataclasses.fields(e) if isinstance(getattr(e, f.name), Expr)}
    return dataclasses.replace(e, **changes) if changes else e


def gemm_unit(k: GemmKernel, s: Mapping[str, Any], kp: KernelProgram, epilogue: str = "auto") -> KernelUnit:
    TM, TN, TK, NT = s["tile_rows"], s["tile_cols"], s["tile_k"], s["threads"]
    partition = s["block_partition"]
    RM, RN, TR, TC = micro_tile(TM, TN, NT)
    if k.per_head and k.in_heads != k.out_heads:
        raise UnsupportedKernel(f"{k.name}: per-head GEMM with {k.in_heads} input and {k.out_heads} output heads")
    XW = k.in_heads * k.in_dim
    OW = k.out_heads * k.out_dim
    OD = k.out_dim
    HB = k.out_heads if k.per_head else 1
    KE = k.in_dim if k.per_head else XW
    NE = k.out_dim if k.per_head else OW
    CT = -(-NE // TN)
    WSZ = math.prod(kp.param_shapes[k.weight])
    strategy = _epilogue_strategy(k, epilogue)

    outputs: dict[str, str] = {}
    if k.out is not None:
        outputs[k.out] = "out"
    for i, (o, _) in enumerate(k.epilogue):
        outputs[o] = f"ep{i}"
    ctx = Context(kp, outputs)
    epi = ctx.rename([e for _, e in k.epilogue])
    ctx.add_input("buffer", k.x, "x") if k.x not in outputs else None
    ctx.add_input("param", k.weight, "W")
    if k.bias:
        ctx.add_input("param", k.bias, "bias")

    ix = ctx.index(k.rows, "rid")
    row_id = f"{ix.array('e_rel_order', 'r')}" if (k.rows == "edge" and k.by != "none") else "r"
    x_row = ix(k.x_via)
    out_row = ix(k.out_via) if k.out is not None else "rid"
    if k.accumulate and k.out is None:
        raise UnsupportedKernel(f"{k.name}: accumulate without an output")

    acc_rows = None  # where the row strategy reads finished rows from
    if strategy == "row":
        if k.out is not None and not k.accumulate and k.out_via == "row":
            acc_rows = "out"
        else:
            acc_rows = ctx.add_temp(Temp("acc_rows", k.rows, OW, 0.0))

    terms: list[tuple[InnerE, Expr]] = []  # inner(acc, y): (the product, y)
    if strategy == "inner":
        for e in epi:
            for x in inner_products(e):
                if isinstance(x.a, Acc) or isinstance(x.b, Acc):
                    if x not in [t for t, _ in terms]:
                        terms.append((x, x.b if isinstance(x.a, Acc) else x.a))
    HT = k.out_heads
    uniform_head = k.per_head or k.out_heads == 1 or OD % TN == 0

    L: list[str] = []
    w = L.append
    w(f"extern \"C\" __global__ void __launch_bounds__({NT}) gemm(PARAMS) {{")
    w(f"  __shared__ float As[{TK}][{TM} + 1];  // input slice, k-major (+1: no bank conflicts on stores)")
    w(f"  __shared__ float Bs[{TK}][{TN}];      // weight slice")
    w(f"  __shared__ idx_t s_rid[{TM}];         // row id of each tile row, -1 past the segment's end")
    w(f"  __shared__ idx_t s_xrow[{TM}];        // input row of each tile row ({k.x_via})")
    if terms:
        w(f"  __shared__ float ep_s[{len(terms) * TM * HT}];  // inner(acc, y) per epilogue term, tile row, head")
    w("  const int tid = threadIdx.x;")
    if partition == "static":
        w("  // block_partition = static: grid.z is the type segment, grid.x the tile inside it")
        w("  const idx_t seg = (idx_t)blockIdx.z;")
        w(f"  const idx_t row0 = seg_off[seg] + (idx_t)blockIdx.x * {TM};")
        w("  const idx_t row_end = seg_off[seg + 1];")
        w("  if (row0 >= row_end) return;  // a shorter segment: block-uniform exit")
        tables = ["seg_off", "seg_type"]
    elif partition == "balanced":
        w("  // block_partition = balanced: grid.x runs over a host-built tile table, every tile inside one segment")
        w("  const idx_t seg = tile_seg[blockIdx.x];")
        w("  const idx_t row0 = tile_row0[blockIdx.x];")
        w("  const idx_t row_end = seg_off[seg + 1];")
        tables = ["seg_off", "seg_type", "tile_row0", "tile_seg"]
    else:
        raise UnsupportedKernel(f"unknown block_partition {partition!r}")
    w("  const idx_t type = seg_type[seg];  // the weight slice all rows of the tile share")
    w(f"  const float* __restrict__ Wt = W + (long)type * {WSZ};")
    if k.bias:
        w(f"  const float* __restrict__ bt = bias + (long)type * {OW};")
    w(f"  for (int i = tid; i < {TM}; i += {NT}) {{")
    w("    const idx_t r = row0 + i;")
    w("    idx_t rid = -1, xr = -1;")
    w(f"    if (r < row_end) {{ rid = {row_id}; xr = {x_row}; }}")
    w("    s_rid[i] = rid;")
    w("    s_xrow[i] = xr;")
    w("  }")
    if terms:
        w(f"  for (int i = tid; i < {len(terms) * TM * HT}; i += {NT}) ep_s[i] = 0.0f;")
    w("  __syncthreads();")
    w(f"  const int tr = tid / {TC}, tc = tid % {TC};  // this thread: rows tr + i*{TR}, columns tc + j*{TC}")
    loop_note = "the block walks every column tile (epilogue needs whole rows)" if k.epilogue else \
        "one column tile per block (grid.y)"
    w(f"  for (int ct = blockIdx.y; ct < {HB * CT}; ct += gridDim.y) {{  // {loop_note}")
    w(f"    const int hb = ct / {CT};  // head of a per-head weight (0 otherwise)")
    w(f"    const int n0 = (ct % {CT}) * {TN};")
    w(f"    const float* __restrict__ Wh = Wt + (long)hb * {KE * NE};")
    w(f"    float c[{RM}][{RN}];")
    w("#pragma unroll")
    w(f"    for (int i = 0; i < {RM}; ++i)")
    w("#pragma unroll")
    w(f"      for (int j = 0; j < {RN}; ++j) c[i][j] = 0.0f;")
    w(f"    for (int k0 = 0; k0 < {KE}; k0 += {TK}) {{")
    kguard = KE % TK != 0
    w(f"      for (int i = tid; i < {TM * TK}; i += {NT}) {{  // gathered input rows, consecutive k per thread")
    w(f"        const int lr = i / {TK}, kk = i % {TK};")
    w("        const idx_t xr = s_xrow[lr];")
    cond = "xr >= 0" + (f" && k0 + kk < {KE}" if kguard else "")
    xoff = f"(long)hb * {KE} + " if k.per_head else ""
    w(f"        As[kk][lr] = ({cond}) ? x[(long)xr * {XW} + {xoff}k0 + kk] : 0.0f;")
    w("      }")
    w(f"      for (int i = tid; i < {TK * TN}; i += {NT}) {{")
    w(f"        const int kk = i / {TN}, n = i % {TN};")
    bconds = ([f"k0 + kk < {KE}"] if kguard else []) + ([f"n0 + n < {NE}"] if NE % TN else [])
    bload = f"Wh[(long)(k0 + kk) * {NE} + n0 + n]"
    w(f"        Bs[kk][n] = {'(' + ' && '.join(bconds) + ') ? ' + bload + ' : 0.0f' if bconds else bload};")
    w("      }")
    w("      __syncthreads();")
    # unrolled by 8, not fully: a full 32-deep unroll quadruples ptxas time on the large tiles
    w(f"#pragma unroll {min(TK, 8)}")
    w(f"      for (int kk = 0; kk < {TK}; ++kk) {{")
    w(f"        float a[{RM}], b[{RN}];")
    w("#pragma unroll")
    w(f"        for (int i = 0; i < {RM}; ++i) a[i] = As[kk][tr + i * {TR}];")
    w("#pragma unroll")
    w(f"        for (int j = 0; j < {RN}; ++j) b[j] = Bs[kk][tc + j * {TC}];")
    w("#pragma unroll")
    w(f"        for (int i = 0; i < {RM}; ++i)")
    w("#pragma unroll")
    w(f"          for (int j = 0; j < {RN}; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);")
    w("      }")
    w("      __syncthreads();")
    w("    }")
    # ---- store (and epilogue partial sums)
    # With inner-product terms, every lane runs every (i, j) so that the tc-group shuffles below
    # see the whole warp; rows past the segment contribute zeros and store nothing.
    heads_here = 1 if uniform_head else HT  # partial sums per thread: one per head the tile touches
    w("#pragma unroll")
    w(f"    for (int i = 0; i < {RM}; ++i) {{")
    w(f"      const int lr = tr + i * {TR};")
    w("      const idx_t rid = s_rid[lr];")
    if not terms:
        w("      if (rid < 0) continue;")
    for t in range(len(terms)):
        w(f"      float part{t}[{heads_here}] = {{{', '.join(['0.0f'] * heads_here)}}};")
    w("#pragma unroll")
    w(f"      for (int j = 0; j < {RN}; ++j) {{")
    w(f"        const int n = n0 + tc + j * {TC};")
    conds = (["rid >= 0"] if terms else []) + ([f"n < {NE}"] if NE % TN else [])
    if conds:
        w(f"        if (!({' && '.join(conds)})) continue;")
    w(f"        const int col = hb * {NE} + n;  // column of the output row")
    w("        const float v = c[i][j]" + (" + bt[col];" if k.bias else ";"))
    w("        (void)col;")
    if k.out is not None:
        if k.accumulate:
            w(f"        atomicAdd(&out[(long)({out_row}) * {OW} + col], v);  // accumulate: rows add into {k.out_via}")
        elif k.out_via == "row":
            w(f"        out[(long)rid * {OW} + col] = v;")
        else:  # pragma: no cover - the lowering stores at "row" unless accumulating
            raise UnsupportedKernel(f"{k.name}: store at {k.out_via} without accumulate")
    if acc_rows == "acc_rows":
        w(f"        acc_rows[(long)rid * {OW} + col] = v;  // finished rows for the epilogue")
    if terms:
        em = ctx.emitter(k.rows, "rid")
        hx, dx = ("hb", "n") if k.per_head else (f"(col / {OD})", f"(col % {OD})")
        for t, (_, y) in enumerate(terms):
            stmts, val = em.block(y, hx, dx)
            w("        {")
            for st in stmts:
                w("          " + st)
            if uniform_head:
                w(f"          part{t}[0] += v * {val};")
            else:
                w(f"          const float pv = v * {val};")
                w("#pragma unroll")
                w(f"          for (int hh = 0; hh < {HT}; ++hh) part{t}[hh] += ({hx} == hh) ? pv : 0.0f;")
            w("        }")
    w("      }")
    if terms:
        # the TC threads of a tile row are consecutive lanes of one warp (TC <= 32, a power of 2):
        # a shuffle reduction over them, then the group's first lane adds into shared memory
        head = "hb" if k.per_head else ("0" if HT == 1 else f"(n0 / {OD})")
        for t in range(len(terms)):
            w("#pragma unroll")
            w(f"      for (int hh = 0; hh < {heads_here}; ++hh) {{")
            w("        float p = part{t}[hh];".format(t=t))
            if TC > 1:
                w("#pragma unroll")
                w(f"        for (int o = {TC // 2}; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);")
            target = head if uniform_head else "hh"
            w(f"        if (tc == 0 && rid >= 0) ep_s[({t} * {TM} + lr) * {HT} + {target}] += p;")
            w("      }")
    w("    }")
    w("  }")
    # ---- epilogue: one thread per (row, head, feature) of each epilogue output
    if k.epilogue:
        w("  __syncthreads();  // every column of the block's rows is done (shared and global writes visible)")
        for i, ((o, _), e) in enumerate(zip(k.epilogue, epi)):
            b = kp.buffers[o]
            EH, ED = b.heads, b.dim
            em = ctx.emitter(k.rows, "rid", acc_shape=(k.out_heads, k.out_dim))
            for t, (prod, _) in enumerate(terms):
                em.subst[prod] = (lambda t: lambda h, d: f"ep_s[({t} * {TM} + lr) * {HT} + {h}]")(t)
            stmts, val = em.block(e, "h", "d")
            w(f"  for (int i = tid; i < {TM * EH * ED}; i += {NT}) {{  // epilogue ep{i}: one thread per row x head x feature")
            w(f"    const int lr = i / {EH * ED}, h = (i / {ED}) % {EH}, d = i % {ED};")
            w("    (void)h; (void)d;")
            w("    const idx_t rid = s_rid[lr];")
            w("    if (rid < 0) continue;")
            if strategy == "row":
                w(f"    const float* acc = {acc_rows} + (long)rid * {OW};  // the finished output row")
            for st in stmts:
                w("    " + st)
            w(f"    ep{i}[(long)rid * {EH * ED} + h * {ED} + d] = {val};")
            w("  }")
    w("}")

    sizes: list[tuple[str, str]] = []
    args = ctx.args(tables, sizes)
    body = "\n".join(L).replace("PARAMS", ", ".join(a.c_decl() for a in args))
    sched = f"tile_rows={TM} tile_cols={TN} tile_k={TK} threads={NT} block_partition={partition}"
    desc = _canonical(k, epi)
    code = "\n".join([
        comment_block([f"template gemm: {desc[0]}"] + [f"  {line}" for line in desc[1:]] + [
            f"schedule: {sched}; micro-tile {RM}x{RN} per thread, threads {TR}x{TC}",
            f"epilogue strategy: {strategy}" if k.epilogue else "no epilogue",
        ]),
        prelude(kp.index_bits),
        _find_pair_if_needed(ctx),
        body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})"]
                           + ["  " + line for line in k.describe().splitlines()]
                           + [f"  buffers: {ctx.mapping_comment()}; weight W = {k.weight}"
                              + (f", bias = {k.bias}" if k.bias else "")])
    grid = Grid("gemm", k.rows, tile_rows=TM, col_blocks=1 if k.epilogue else HB * CT, partition=partition)
    return KernelUnit(k, header, code, (Launch("gemm", grid, NT, args),), tuple(ctx.temps),
                      notes=[f"epilogue={strategy}"] if k.epilogue else [])


def _canonical(k: GemmKernel, epi: list[Expr]) -> list[str]:
    src = "x" if k.x_via == "row" else f"x@{k.x_via}"
    target = "(discarded)" if k.out is None else (f"out@{k.out_via} +=" if k.accumulate else "out =")
    line = (f"over {k.rows} rows: {target} {src} @ W[{k.by}{'/' + k.weight_end if k.weight_end else ''}]"
            f"{' + bias' if k.bias else ''}{' per_head' if k.per_head else ''} "
            f"[{k.in_heads}x{k.in_dim} -> {k.out_heads}x{k.out_dim}]")
    return [line] + [f"ep{i} = {expr_str(e)}" for i, e in enumerate(epi)]


def _find_pair_if_needed(ctx: Context) -> str:
    used = set()
    for ix in ctx.indices:
        used |= ix.arrays
    return FIND_PAIR if ctx.kp.pair_index == "bsearch" and ({"sp_offsets", "dp_offsets"} & used) else ""
