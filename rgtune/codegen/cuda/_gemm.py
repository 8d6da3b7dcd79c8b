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

Tensor cores (:func:`mma_type`): a GEMM that reads or writes a 16-bit buffer (``precision.*``
stores its rows so: its products may round their operands too, as the C generator's bfloat16 dot
products do) multiplies on the tensor cores where its tile allows: the k-slices are staged in that
type (the input and the weight rounded once as they are staged), each warp computes 16x8 output
tiles with PTX ``mma.m16n8k16`` (float32 accumulation), and the block's finished tile goes through
shared memory into the same per-thread micro-tile the store and the epilogue read. On the emulator
(``RG_EMULATED``) the warp's product is computed from every lane's fragment as the PTX ISA lays
them out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from rgtune.codegen.cuda._context import Context
from rgtune.codegen.cuda._expr import FIND_PAIR, UnsupportedKernel, has_acc, inner_products, prelude
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch, Temp, comment_block
from rgtune.codegen.cuda.schedule import MAX_STATIC_SHARED
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
    return {"node": "node_offsets", "dst_node": "node_offsets", "edge": "rel_offsets", "src_pair": "sp_offsets", "dst_pair": "dp_offsets"}[k.rows]


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


#: the host-built tables each ``block_partition`` reads (see ``runtime.gemm_segments``)
_TILE_TABLES = {"static": ("seg_off", "seg_type"), "balanced": ("seg_off", "seg_type", "tile_row0", "tile_seg")}


@dataclasses.dataclass(frozen=True)
class _GemmPlan:
    """What the emitters of one GEMM kernel share: the kernel, its schedule, and the sizes derived from them."""

    kernel: GemmKernel
    program: KernelProgram
    ctx: Context
    epilogue_exprs: list[Expr]  # the epilogue expressions with buffers renamed
    strategy: str  # "none", "inner" or "row", see _epilogue_strategy
    tile_rows: int
    tile_cols: int
    tile_k: int
    threads: int
    partition: str
    # micro_tile: thread_rows x thread_cols threads, each rows_per_thread x cols_per_thread outputs
    rows_per_thread: int
    cols_per_thread: int
    thread_rows: int
    thread_cols: int
    x_width: int  # floats per input row, all heads
    out_width: int  # floats per output row, all heads
    weight_heads: int  # weights per type: one per head for per_head, else 1
    reduce_dim: int  # the k extent of one weight
    weight_cols: int  # columns of one weight
    col_tiles: int  # column tiles per weight
    weight_size: int  # floats of W per type
    row_id: str  # C: the row id at layout position ``r``
    x_row: str  # C: the input row of ``rid``
    out_row: str  # C: the output row of ``rid``
    acc_rows: str | None  # the row strategy's finished rows: ``out`` or a scratch temp
    acc_terms: list[tuple[InnerE, Expr]]  # each ``inner(acc, y)`` of the epilogue, with its ``y``
    mma: str | None = None  # the tensor cores' operand type (bfloat16, float16), or None: float32 FMAs

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def mma_tiles_per_warp(self) -> int:
        """16x8 output tiles of the block tile each warp computes on the tensor cores."""
        return (self.tile_rows // 16) * (self.tile_cols // 8) // self.warps

    @property
    def uniform_head(self) -> bool:
        """Whether all columns of a column tile lie in one head of the output row."""
        k = self.kernel
        return k.per_head or k.out_heads == 1 or k.out_dim % self.tile_cols == 0

    @property
    def heads_per_thread(self) -> int:
        """Partial sums a thread keeps per epilogue term: one per head its columns touch."""
        return 1 if self.uniform_head else self.kernel.out_heads

    @property
    def term_slots(self) -> int:
        """Floats of ``ep_s``: one per epilogue term, tile row and head."""
        return len(self.acc_terms) * self.tile_rows * self.kernel.out_heads

    @property
    def partial_cols(self) -> bool:
        """Whether the last column tile of a weight runs past its columns."""
        return self.weight_cols % self.tile_cols != 0

    @property
    def partial_k(self) -> bool:
        """Whether the last k-slice runs past the reduced dimension."""
        return self.reduce_dim % self.tile_k != 0


def gemm_unit(k: GemmKernel, s: Mapping[str, Any], kp: KernelProgram, epilogue: str = "auto") -> KernelUnit:
    """The CUDA unit of ``k`` under the ``gemm.*`` schedule ``s``.

    ``epilogue``: ``auto`` picks the inner-product strategy where the epilogue allows it;
    ``row`` always reads finished rows back from global memory.
    """
    plan = _plan(k, s, kp, epilogue)
    lines = [*_kernel_open(plan), *_block_rows(plan), *_weight_base(plan), *_tile_row_ids(plan),
             *_column_tiles(plan), *_epilogue(plan), "}"]
    return _unit(plan, lines)


# --------------------------------------------------------------------------- plan
def _plan(k: GemmKernel, s: Mapping[str, Any], kp: KernelProgram, epilogue: str) -> _GemmPlan:
    """Checks the schedule, binds the kernel's buffers and derives every size the emitters use."""
    tile_rows, tile_cols, tile_k, threads = s["tile_rows"], s["tile_cols"], s["tile_k"], s["threads"]
    partition = s["block_partition"]
    rows_per_thread, cols_per_thread, thread_rows, thread_cols = micro_tile(tile_rows, tile_cols, threads)
    if k.per_head and k.in_heads != k.out_heads:
        raise UnsupportedKernel(f"{k.name}: per-head GEMM with {k.in_heads} input and {k.out_heads} output heads")
    x_width = k.in_heads * k.in_dim
    out_width = k.out_heads * k.out_dim
    weight_cols = k.out_dim if k.per_head else out_width
    weight_size = math.prod(kp.param_shapes[k.weight])
    strategy = _epilogue_strategy(k, epilogue)
    ctx, epilogue_exprs = _bind_buffers(k, kp)

    rows = ctx.index(k.rows, "rid")
    # a typed GEMM's edge segments (rel_offsets) index e_rel_order, not the edge layout
    row_id = rows.array("e_rel_order", "r") if (k.rows == "edge" and k.by != "none") else "r"
    x_row = rows(k.x_via)
    out_row = rows(k.out_via) if k.out is not None else "rid"
    if k.accumulate and k.out is None:
        raise UnsupportedKernel(f"{k.name}: accumulate without an output")
    acc_terms = _acc_terms(epilogue_exprs) if strategy == "inner" else []
    mma = mma_type(k, kp, s, len(acc_terms) * tile_rows * k.out_heads)
    return _GemmPlan(
        kernel=k, program=kp, ctx=ctx, epilogue_exprs=epilogue_exprs, strategy=strategy, mma=mma,
        tile_rows=tile_rows, tile_cols=tile_cols, tile_k=tile_k, threads=threads, partition=partition,
        rows_per_thread=rows_per_thread, cols_per_thread=cols_per_thread,
        thread_rows=thread_rows, thread_cols=thread_cols,
        x_width=x_width, out_width=out_width, weight_heads=k.out_heads if k.per_head else 1,
        reduce_dim=k.in_dim if k.per_head else x_width, weight_cols=weight_cols,
        col_tiles=-(-weight_cols // tile_cols), weight_size=weight_size,
        row_id=row_id, x_row=x_row, out_row=out_row,
        acc_rows=_acc_rows(k, ctx, strategy, out_width),
        acc_terms=acc_terms)


#: PTX ``mma`` operand type of each 16-bit storage type, and its conversion from float
MMA_TYPES = {"bfloat16": ("bf16", "rg_to_bf16"), "float16": ("f16", "rg_to_f16")}


def mma_type(k: GemmKernel, kp: KernelProgram, s: Mapping[str, Any], term_slots: int = 0) -> str | None:
    """The storage type whose tensor-core products ``k`` computes (its input's if 16-bit, else its output's),
    or None: it touches no 16-bit buffer, or its tile does not split into whole ``mma.m16n8k16`` tiles per
    warp (rows a multiple of 16, columns of 8, the K slice of 16), or the staged tiles and the finished
    tile do not fit the block's shared memory.

    >>> from rgtune.ir.kernels import Buffer
    >>> kp = KernelProgram("p", {"x": Buffer("x", "node", 1, 32, "bfloat16"), "y": Buffer("y", "node", 1, 32)},
    ...                    [], "x", "y", {"w": (32, 32)}, {"w": "none"})
    >>> g = GemmKernel("g", rows="node", x="x", weight="w", in_dim=32, out_dim=32, out="y")
    >>> s = {"tile_rows": 64, "tile_cols": 32, "tile_k": 16, "threads": 128}
    >>> mma_type(g, kp, s), mma_type(g, kp, {**s, "tile_k": 8})
    ('bfloat16', None)
    """
    types = [kp.buffers[k.x].dtype] + ([kp.buffers[k.out].dtype] if k.out is not None else [])
    low = [t for t in types if t in MMA_TYPES]
    if not low:
        return None
    tm, tn, tk, threads = s["tile_rows"], s["tile_cols"], s["tile_k"], s["threads"]
    if tm % 16 or tn % 8 or tk % 16 or ((tm // 16) * (tn // 8)) % (threads // 32):
        return None
    idx = 4 if kp.index_bits == 32 else 8
    smem = (tm + tn) * (tk + 8) * 2 + tm * (tn + 1) * 4 + 2 * tm * idx + term_slots * 4
    if smem > MAX_STATIC_SHARED:
        return None
    return low[0]


def _bind_buffers(k: GemmKernel, kp: KernelProgram) -> tuple[Context, list[Expr]]:
    """The context with the outputs (``out``, ``ep0``, ...) and inputs (``x``, ``W``, ``bias``) named,
    and the epilogue expressions renamed to match."""
    outputs: dict[str, str] = {}
    if k.out is not None:
        outputs[k.out] = "out"
    for i, (name, _) in enumerate(k.epilogue):
        outputs[name] = f"ep{i}"
    ctx = Context(kp, outputs)
    epilogue_exprs = ctx.rename([e for _, e in k.epilogue])
    if k.x not in outputs:
        ctx.add_input("buffer", k.x, "x")
    ctx.add_input("param", k.weight, "W")
    if k.bias:
        ctx.add_input("param", k.bias, "bias")
    return ctx, epilogue_exprs


def _acc_rows(k: GemmKernel, ctx: Context, strategy: str, out_width: int) -> str | None:
    """Where the row strategy reads finished rows from: ``out`` when it holds them as computed,
    else a scratch temp (the output is discarded, accumulated or stored elsewhere)."""
    if strategy != "row":
        return None
    # a 16-bit output row holds the value rounded: the epilogue reads the float32 one (as the CPU's does)
    if k.out is not None and not k.accumulate and k.out_via == "row" and ctx.storage_of("out") == "float32":
        return "out"
    return ctx.add_temp(Temp("acc_rows", k.rows, out_width, 0.0))


def _acc_terms(epilogue_exprs: list[Expr]) -> list[tuple[InnerE, Expr]]:
    """Each distinct ``inner(acc, y)`` of the epilogue, in first-use order, with its ``y``."""
    terms: list[tuple[InnerE, Expr]] = []
    for e in epilogue_exprs:
        for product in inner_products(e):
            if isinstance(product.a, Acc) or isinstance(product.b, Acc):
                if product not in [t for t, _ in terms]:
                    terms.append((product, product.b if isinstance(product.a, Acc) else product.a))
    return terms


# --------------------------------------------------------------------------- kernel: setup
def _kernel_open(plan: _GemmPlan) -> list[str]:
    """The signature (``PARAMS`` filled in by :func:`_unit`) and the shared-memory tiles."""
    if plan.mma:
        tiles = [
            f"  alignas(16) __shared__ unsigned short As[{plan.tile_rows}][{plan.tile_k} + 8];"
            f"  // input slice in {plan.mma}, row-major (+8: fewer bank conflicts)",
            f"  alignas(16) __shared__ unsigned short Bs[{plan.tile_cols}][{plan.tile_k} + 8];"
            f"  // weight slice in {plan.mma}, column-major",
            f"  __shared__ float Cs[{plan.tile_rows}][{plan.tile_cols} + 1];  // the finished tile",
        ]
    else:
        tiles = [
            f"  __shared__ float As[{plan.tile_k}][{plan.tile_rows} + 1];"
            "  // input slice, k-major (+1: no bank conflicts on stores)",
            f"  __shared__ float Bs[{plan.tile_k}][{plan.tile_cols}];      // weight slice",
        ]
    lines = [
        f"extern \"C\" __global__ void __launch_bounds__({plan.threads}) gemm(PARAMS) {{",
        *tiles,
        f"  __shared__ idx_t s_rid[{plan.tile_rows}];         // row id of each tile row, -1 past the segment's end",
        f"  __shared__ idx_t s_xrow[{plan.tile_rows}];        // input row of each tile row ({plan.kernel.x_via})",
    ]
    if plan.acc_terms:
        lines.append(f"  __shared__ float ep_s[{plan.term_slots}];  // inner(acc, y) per epilogue term, tile row, head")
    return lines


def _block_rows(plan: _GemmPlan) -> list[str]:
    """``tid`` and the block's segment and row range ``row0 .. row_end``, per ``block_partition``."""
    lines = ["  const int tid = threadIdx.x;"]
    if plan.partition == "static":
        return lines + [
            "  // block_partition = static: grid.z is the type segment, grid.x the tile inside it",
            "  const idx_t seg = (idx_t)blockIdx.z;",
            f"  const idx_t row0 = seg_off[seg] + (idx_t)blockIdx.x * {plan.tile_rows};",
            "  const idx_t row_end = seg_off[seg + 1];",
            "  if (row0 >= row_end) return;  // a shorter segment: block-uniform exit",
        ]
    if plan.partition == "balanced":
        return lines + [
            "  // block_partition = balanced: grid.x runs over a host-built tile table, every tile inside one segment",
            "  const idx_t seg = tile_seg[blockIdx.x];",
            "  const idx_t row0 = tile_row0[blockIdx.x];",
            "  const idx_t row_end = seg_off[seg + 1];",
        ]
    raise UnsupportedKernel(f"unknown block_partition {plan.partition!r}")


def _weight_base(plan: _GemmPlan) -> list[str]:
    """The segment's type and its weight (and bias) slice ``Wt`` (``bt``)."""
    lines = ["  const idx_t type = seg_type[seg];  // the weight slice all rows of the tile share",
             f"  const float* __restrict__ Wt = W + (long)type * {plan.weight_size};"]
    if plan.kernel.bias:
        lines.append(f"  const float* __restrict__ bt = bias + (long)type * {plan.out_width};")
    return lines


def _tile_row_ids(plan: _GemmPlan) -> list[str]:
    """``s_rid``/``s_xrow``: each tile row's id and gathered input row, resolved once per block;
    the epilogue's partial sums zeroed."""
    lines = [
        f"  for (int i = tid; i < {plan.tile_rows}; i += {plan.threads}) {{",
        "    const idx_t r = row0 + i;",
        "    idx_t rid = -1, xr = -1;",
        f"    if (r < row_end) {{ rid = {plan.row_id}; xr = {plan.x_row}; }}",
        "    s_rid[i] = rid;",
        "    s_xrow[i] = xr;",
        "  }",
    ]
    if plan.acc_terms:
        lines.append(f"  for (int i = tid; i < {plan.term_slots}; i += {plan.threads}) ep_s[i] = 0.0f;")
    lines.append("  __syncthreads();")
    return lines


# --------------------------------------------------------------------------- kernel: column tiles
def _column_tiles(plan: _GemmPlan) -> list[str]:
    """The loop over the block's column tiles: zeroed accumulators, the k-slices, the store."""
    tiles = plan.weight_heads * plan.col_tiles
    loop_note = ("the block walks every column tile (epilogue needs whole rows)" if plan.kernel.epilogue
                 else "one column tile per block (grid.y)")
    return [
        f"  const int tr = tid / {plan.thread_cols}, tc = tid % {plan.thread_cols};  "
        f"// this thread: rows tr + i*{plan.thread_rows}, columns tc + j*{plan.thread_cols}",
        f"  for (int ct = blockIdx.y; ct < {tiles}; ct += gridDim.y) {{  // {loop_note}",
        f"    const int hb = ct / {plan.col_tiles};  // head of a per-head weight (0 otherwise)",
        f"    const int n0 = (ct % {plan.col_tiles}) * {plan.tile_cols};",
        f"    const float* __restrict__ Wh = Wt + (long)hb * {plan.reduce_dim * plan.weight_cols};",
        *(_mma_tile(plan) if plan.mma else [
            *_zeroed_accumulators(plan),
            f"    for (int k0 = 0; k0 < {plan.reduce_dim}; k0 += {plan.tile_k}) {{",
            *_input_slice(plan),
            *_weight_slice(plan),
            "      __syncthreads();",
            *_slice_product(plan),
            "      __syncthreads();",
            "    }"]),
        *_store(plan),
        "  }",
    ]


def _mma_tile(plan: _GemmPlan) -> list[str]:
    """The block tile on the tensor cores: the k-slices staged in ``plan.mma``, each warp's 16x8 tiles
    (``d``, tile ``warp + warps * p`` of the block's, row-major over 16-row by 8-column tiles) summed by
    ``mma.m16n8k16``; then the tile through ``Cs`` into the thread's micro-tile ``c`` (what the store reads)."""
    per_warp, cols8 = plan.mma_tiles_per_warp, plan.tile_cols // 8
    to16 = MMA_TYPES[plan.mma][1]  # type: ignore[index]
    stride = plan.tile_k + 8
    return [
        "    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;  // the fragments' layout",
        f"    float d[{per_warp}][4];",
        "#pragma unroll",
        f"    for (int p = 0; p < {per_warp}; ++p) d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.0f;",
        f"    for (int k0 = 0; k0 < {plan.reduce_dim}; k0 += {plan.tile_k}) {{",
        *_input_slice(plan, to16),
        *_weight_slice(plan, to16),
        "      __syncthreads();",
        "#pragma unroll",
        f"      for (int ks = 0; ks < {plan.tile_k}; ks += 16) {{",
        "#pragma unroll",
        f"        for (int p = 0; p < {per_warp}; ++p) {{",
        f"          const int t = warp + {plan.warps} * p, m0 = (t / {cols8}) * 16, c0 = (t % {cols8}) * 8;",
        "          const unsigned short* ar = &As[m0 + g][ks + 2 * q];  // rows g and g + 8, k pairs 2q and 2q + 8",
        "          const unsigned short* br = &Bs[c0 + g][ks + 2 * q];  // column g, k pairs 2q and 2q + 8",
        f"          const unsigned a[4] = {{rg_ld32(ar), rg_ld32(ar + 8 * {stride}), rg_ld32(ar + 8), "
        f"rg_ld32(ar + 8 * {stride} + 8)}};",
        "          const unsigned b[2] = {rg_ld32(br), rg_ld32(br + 8)};",
        "          rg_mma_16816(d[p], a, b);",
        "        }",
        "      }",
        "      __syncthreads();",
        "    }",
        "#pragma unroll",
        f"    for (int p = 0; p < {per_warp}; ++p) {{  // d[p]: rows g and g + 8, columns 2q and 2q + 1",
        f"      const int t = warp + {plan.warps} * p, m0 = (t / {cols8}) * 16, c0 = (t % {cols8}) * 8;",
        "      Cs[m0 + g][c0 + 2 * q] = d[p][0];",
        "      Cs[m0 + g][c0 + 2 * q + 1] = d[p][1];",
        "      Cs[m0 + g + 8][c0 + 2 * q] = d[p][2];",
        "      Cs[m0 + g + 8][c0 + 2 * q + 1] = d[p][3];",
        "    }",
        "    __syncthreads();",
        f"    float c[{plan.rows_per_thread}][{plan.cols_per_thread}];",
        "#pragma unroll",
        f"    for (int i = 0; i < {plan.rows_per_thread}; ++i)",
        "#pragma unroll",
        f"      for (int j = 0; j < {plan.cols_per_thread}; ++j)"
        f" c[i][j] = Cs[tr + i * {plan.thread_rows}][tc + j * {plan.thread_cols}];",
    ]


#: the tensor-core product of a unit whose GEMM uses it (``TYPE``: the PTX operand type); on the emulator the
#: header's warp-wide emulation of the same fragments
MMA_16816 = """\
#ifdef RG_EMULATED
#define rg_mma_16816(d, a, b) rg_emu_mma_16816(d, a, b, RG_MMA_F16)
static inline unsigned rg_ld32(const unsigned short* p) { unsigned v; memcpy(&v, p, 4); return v; }
#else
// d += a * b for one warp: a 16x16 (row-major), b 16x8 (column-major), float32 accumulation (PTX mma.m16n8k16)
__device__ __forceinline__ static void rg_mma_16816(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.TYPE.TYPE.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ static unsigned rg_ld32(const unsigned short* p) {
  return *reinterpret_cast<const unsigned*>(p);  // two 16-bit elements, 4-byte aligned
}
#endif"""


def _zeroed_accumulators(plan: _GemmPlan) -> list[str]:
    """The thread's micro-tile of outputs ``c``, in registers."""
    return [
        f"    float c[{plan.rows_per_thread}][{plan.cols_per_thread}];",
        "#pragma unroll",
        f"    for (int i = 0; i < {plan.rows_per_thread}; ++i)",
        "#pragma unroll",
        f"      for (int j = 0; j < {plan.cols_per_thread}; ++j) c[i][j] = 0.0f;",
    ]


def _input_slice(plan: _GemmPlan, to16: str | None = None) -> list[str]:
    """``As``: the k-slice of the tile's gathered input rows, zero past the rows and the k extent; ``to16``:
    rounded by that conversion into the tensor cores' row-major 16-bit tile."""
    in_bounds = "xr >= 0" + (f" && k0 + kk < {plan.reduce_dim}" if plan.partial_k else "")
    head_offset = f"(long)hb * {plan.reduce_dim} + " if plan.kernel.per_head else ""
    x_element = plan.ctx.load("x", f"x[(long)xr * {plan.x_width} + {head_offset}k0 + kk]")
    target = "As[kk][lr]" if to16 is None else "As[lr][kk]"
    value = f"({in_bounds}) ? {x_element} : 0.0f"
    return [
        f"      for (int i = tid; i < {plan.tile_rows * plan.tile_k}; i += {plan.threads}) {{"
        "  // gathered input rows, consecutive k per thread",
        f"        const int lr = i / {plan.tile_k}, kk = i % {plan.tile_k};",
        "        const idx_t xr = s_xrow[lr];",
        f"        {target} = {value if to16 is None else f'{to16}({value})'};",
        "      }",
    ]


def _weight_slice(plan: _GemmPlan, to16: str | None = None) -> list[str]:
    """``Bs``: the k-slice of the column tile's weight, zero past the k extent and the columns; ``to16``:
    rounded by that conversion into the tensor cores' column-major 16-bit tile."""
    in_bounds = (([f"k0 + kk < {plan.reduce_dim}"] if plan.partial_k else [])
                 + ([f"n0 + n < {plan.weight_cols}"] if plan.partial_cols else []))
    load = f"Wh[(long)(k0 + kk) * {plan.weight_cols} + n0 + n]"
    value = f"({' && '.join(in_bounds)}) ? {load} : 0.0f" if in_bounds else load
    return [
        f"      for (int i = tid; i < {plan.tile_k * plan.tile_cols}; i += {plan.threads}) {{",
        f"        const int kk = i / {plan.tile_cols}, n = i % {plan.tile_cols};",
        f"        Bs[kk][n] = {value};" if to16 is None else f"        Bs[n][kk] = {to16}({value});",
        "      }",
    ]


def _slice_product(plan: _GemmPlan) -> list[str]:
    """The micro-tile's outer products over the k-slice in shared memory."""
    rows, cols = plan.rows_per_thread, plan.cols_per_thread
    # unrolled by 8, not fully: a full 32-deep unroll quadruples ptxas time on the large tiles
    return [
        f"#pragma unroll {min(plan.tile_k, 8)}",
        f"      for (int kk = 0; kk < {plan.tile_k}; ++kk) {{",
        f"        float a[{rows}], b[{cols}];",
        "#pragma unroll",
        f"        for (int i = 0; i < {rows}; ++i) a[i] = As[kk][tr + i * {plan.thread_rows}];",
        "#pragma unroll",
        f"        for (int j = 0; j < {cols}; ++j) b[j] = Bs[kk][tc + j * {plan.thread_cols}];",
        "#pragma unroll",
        f"        for (int i = 0; i < {rows}; ++i)",
        "#pragma unroll",
        f"          for (int j = 0; j < {cols}; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);",
        "      }",
    ]


# --------------------------------------------------------------------------- kernel: store
def _store(plan: _GemmPlan) -> list[str]:
    """The micro-tile (plus bias) into the output, and the epilogue's partial inner products.

    With inner-product terms every lane runs every ``(i, j)``, so that the shuffles of
    :func:`_term_reductions` see the whole warp; rows past the segment add zeros and store nothing.
    """
    lines = [
        "#pragma unroll",
        f"    for (int i = 0; i < {plan.rows_per_thread}; ++i) {{",
        f"      const int lr = tr + i * {plan.thread_rows};",
        "      const idx_t rid = s_rid[lr];",
    ]
    if not plan.acc_terms:
        lines.append("      if (rid < 0) continue;")
    zeros = ", ".join(["0.0f"] * plan.heads_per_thread)
    lines += [f"      float part{t}[{plan.heads_per_thread}] = {{{zeros}}};" for t in range(len(plan.acc_terms))]
    skip = (["rid >= 0"] if plan.acc_terms else []) + ([f"n < {plan.weight_cols}"] if plan.partial_cols else [])
    lines += [
        "#pragma unroll",
        f"      for (int j = 0; j < {plan.cols_per_thread}; ++j) {{",
        f"        const int n = n0 + tc + j * {plan.thread_cols};",
    ]
    if skip:
        lines.append(f"        if (!({' && '.join(skip)})) continue;")
    lines += [
        f"        const int col = hb * {plan.weight_cols} + n;  // column of the output row",
        "        const float v = c[i][j]" + (" + bt[col];" if plan.kernel.bias else ";"),
        "        (void)col;",
        *_store_value(plan),
        *_term_partials(plan),
        "      }",
        *_term_reductions(plan),
        "    }",
    ]
    return lines


def _store_value(plan: _GemmPlan) -> list[str]:
    """``v`` into the output row (``atomicAdd`` when accumulating) and into the row strategy's scratch."""
    k = plan.kernel
    lines: list[str] = []
    if k.out is not None:
        if k.accumulate:
            lines.append(f"        atomicAdd(&out[(long)({plan.out_row}) * {plan.out_width} + col], v);"
                         f"  // accumulate: rows add into {k.out_via}")
        elif k.out_via == "row":
            lines.append(f"        out[(long)rid * {plan.out_width} + col] = {plan.ctx.store('out', 'v')};")
        else:  # pragma: no cover - the lowering stores at "row" unless accumulating
            raise UnsupportedKernel(f"{k.name}: store at {k.out_via} without accumulate")
    if plan.acc_rows == "acc_rows":
        lines.append(f"        acc_rows[(long)rid * {plan.out_width} + col] = v;  // finished rows for the epilogue")
    return lines


def _term_partials(plan: _GemmPlan) -> list[str]:
    """Per epilogue term: ``v * y`` at this column, added to the thread's partial sum of its head."""
    if not plan.acc_terms:
        return []
    k = plan.kernel
    emitter = plan.ctx.emitter(k.rows, "rid")
    head, feature = ("hb", "n") if k.per_head else (f"(col / {k.out_dim})", f"(col % {k.out_dim})")
    lines: list[str] = []
    for t, (_, y) in enumerate(plan.acc_terms):
        stmts, y_value = emitter.block(y, head, feature)
        lines.append("        {")
        lines += ["          " + st for st in stmts]
        if plan.uniform_head:
            lines.append(f"          part{t}[0] += v * {y_value};")
        else:
            lines += [
                f"          const float pv = v * {y_value};",
                "#pragma unroll",
                f"          for (int hh = 0; hh < {k.out_heads}; ++hh) part{t}[hh] += ({head} == hh) ? pv : 0.0f;",
            ]
        lines.append("        }")
    return lines


def _term_reductions(plan: _GemmPlan) -> list[str]:
    """The partial sums of a tile row's threads, added into ``ep_s``.

    The ``thread_cols`` threads of a tile row are consecutive lanes of one warp (at most 32, a
    power of 2): a shuffle reduction over them, then the group's first lane adds into shared
    memory, so the sum is deterministic without atomics.
    """
    k = plan.kernel
    tile_head = "hb" if k.per_head else ("0" if k.out_heads == 1 else f"(n0 / {k.out_dim})")
    head = tile_head if plan.uniform_head else "hh"
    lines: list[str] = []
    for t in range(len(plan.acc_terms)):
        lines += [
            "#pragma unroll",
            f"      for (int hh = 0; hh < {plan.heads_per_thread}; ++hh) {{",
            f"        float p = part{t}[hh];",
        ]
        if plan.thread_cols > 1:
            lines += [
                "#pragma unroll",
                f"        for (int o = {plan.thread_cols // 2}; o > 0; o >>= 1)"
                " p += __shfl_xor_sync(0xffffffffu, p, o);",
            ]
        lines += [
            f"        if (tc == 0 && rid >= 0) ep_s[({t} * {plan.tile_rows} + lr) * {k.out_heads} + {head}] += p;",
            "      }",
        ]
    return lines


# --------------------------------------------------------------------------- kernel: epilogue
def _epilogue(plan: _GemmPlan) -> list[str]:
    """Every epilogue output, after the block's whole rows are done."""
    k = plan.kernel
    if not k.epilogue:
        return []
    lines = ["  __syncthreads();  // every column of the block's rows is done (shared and global writes visible)"]
    for i, ((name, _), e) in enumerate(zip(k.epilogue, plan.epilogue_exprs)):
        lines += _epilogue_output(plan, i, name, e)
    return lines


def _epilogue_output(plan: _GemmPlan, i: int, name: str, e: Expr) -> list[str]:
    """Epilogue output ``ep<i>`` (IR buffer ``name``) = ``e``: a thread per (row, head, feature);
    its ``inner(acc, y)`` terms read ``ep_s``, other uses of ``acc`` the finished row."""
    k = plan.kernel
    out = plan.program.buffers[name]
    heads, dim = out.heads, out.dim
    emitter = plan.ctx.emitter(k.rows, "rid", acc_shape=(k.out_heads, k.out_dim))
    for t, (product, _) in enumerate(plan.acc_terms):
        emitter.subst[product] = _shared_term(t, plan.tile_rows, k.out_heads)
    stmts, value = emitter.block(e, "h", "d")
    lines = [
        f"  for (int i = tid; i < {plan.tile_rows * heads * dim}; i += {plan.threads}) {{"
        f"  // epilogue ep{i}: one thread per row x head x feature",
        f"    const int lr = i / {heads * dim}, h = (i / {dim}) % {heads}, d = i % {dim};",
        "    (void)h; (void)d;",
        "    const idx_t rid = s_rid[lr];",
        "    if (rid < 0) continue;",
    ]
    if plan.strategy == "row":
        lines.append(f"    const float* acc = {plan.acc_rows} + (long)rid * {plan.out_width};"
                     "  // the finished output row")
    lines += ["    " + st for st in stmts]
    lines += [f"    ep{i}[(long)rid * {heads * dim} + h * {dim} + d] = {plan.ctx.store(f'ep{i}', value)};", "  }"]
    return lines


def _shared_term(t: int, tile_rows: int, heads: int) -> Callable[[str, str], str]:
    """The C element of epilogue term ``t``'s inner product at head ``h``, summed in ``ep_s``."""
    return lambda h, d: f"ep_s[({t} * {tile_rows} + lr) * {heads} + {h}]"


# --------------------------------------------------------------------------- unit
def _unit(plan: _GemmPlan, lines: list[str]) -> KernelUnit:
    """The kernel with its parameter list, its comments, and its launch."""
    k = plan.kernel
    args = plan.ctx.args(_TILE_TABLES[plan.partition], [])
    body = "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args))
    sched = (f"tile_rows={plan.tile_rows} tile_cols={plan.tile_cols} tile_k={plan.tile_k} threads={plan.threads} "
             f"block_partition={plan.partition}")
    desc = _canonical(k, plan.epilogue_exprs)
    code = "\n".join([
        comment_block([f"template gemm: {desc[0]}"] + [f"  {line}" for line in desc[1:]] + [
            f"schedule: {sched}; micro-tile {plan.rows_per_thread}x{plan.cols_per_thread} per thread, "
            f"threads {plan.thread_rows}x{plan.thread_cols}",
            f"epilogue strategy: {plan.strategy}" if k.epilogue else "no epilogue",
            (f"tensor cores: mma.m16n8k16 in {plan.mma}, {plan.mma_tiles_per_warp} tiles of 16x8 per warp"
             if plan.mma else "float32 FMAs"),
        ]),
        prelude(plan.program.index_bits, plan.ctx.storage().values()),
        _find_pair_if_needed(plan.ctx),
        *([f"#define RG_MMA_F16 {int(plan.mma == 'float16')}",
           MMA_16816.replace("TYPE", MMA_TYPES[plan.mma][0])] if plan.mma else []),
        body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {plan.program.name})"]
                           + ["  " + line for line in k.describe().splitlines()]
                           + [f"  buffers: {plan.ctx.mapping_comment()}; weight W = {k.weight}"
                              + (f", bias = {k.bias}" if k.bias else "")])
    col_blocks = 1 if k.epilogue else plan.weight_heads * plan.col_tiles
    grid = Grid("gemm", k.rows, tile_rows=plan.tile_rows, col_blocks=col_blocks, partition=plan.partition)
    return KernelUnit(k, header, code, (Launch("gemm", grid, plan.threads, args),), tuple(plan.ctx.temps),
                      notes=[f"epilogue={plan.strategy}"] if k.epilogue else [])


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
