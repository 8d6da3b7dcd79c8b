"""The scatter template (a training program's): rows add their message into a target row, in CUDA.

A :class:`~rgtune.ir.kernels.ScatterKernel` is the adjoint of gathering sources: every edge adds
``message(e)`` into its source node (``out_via="src"``) or source pair (``"src_pair"``), or every
pair row adds into its node (``rows`` a pair domain, ``out_via="pair_node"``). Rows of one target
are spread over the layout (edges are grouped by destination, or by relation), so two rows may add
into one target at once. Mappings (``scatter.*`` schedule):

``src_parallel`` (no atomics; any layout)
    the host groups the rows by target once per graph (:func:`~.runtime.scatter_groups`: a
    stable permutation of the rows and offsets per target, ``group_perm`` / ``group_off``), and a
    warp takes one target (``coarsening`` targets one after the other): lanes over the target's
    features (``vector_width`` consecutive ones per lane, at most: halved until it divides the
    feature size), the target's rows in turn, the sum in
    registers, one read-add-write per target. Inner products and sums over features in the
    message are computed by the whole warp (lanes over the reduced dimension, shuffles), as in
    the destination-parallel traversal. A target without rows is skipped.

``edge_parallel`` (atomics)
    a thread per (row, chunk of ``vector_width`` features), ``coarsening`` items per thread
    (strided by the block size, so that a warp's accesses stay consecutive), ``atomicAdd`` into
    the target (vector ``atomicAdd`` on ``float2``/``float4`` on sm_90+).

The target buffer is zeroed before the program runs (:attr:`KernelProgram.zero_init`); both
mappings add into it, so another kernel may add into the same buffer too.

Example:
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> from rgtune.ir.kernels import ScatterKernel
    >>> kp = compile_program(build_model("rgcn", 8, 8), training=True).kernels
    >>> k = next(k for k in kp.kernels if isinstance(k, ScatterKernel))
    >>> unit = scatter_unit(k, {"mapping": "src_parallel", "threads": 128, "vector_width": 1, "coarsening": 1}, kp)
    >>> print(unit.code.splitlines()[0])
    // template scatter: out[src] += in0@row over edge rows; warp per source (rows grouped by the host), no atomics
    >>> "atomicAdd" in unit.code, [a.cname for a in unit.launches[0].args if a.kind == "table"]
    (False, ['group_perm', 'group_off'])
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.codegen.cuda._context import Context, kernel_head
from rgtune.codegen.cuda._expr import FIND_PAIR, UnsupportedKernel, prelude
from rgtune.codegen.cuda._lanes import atomic_vec, chunk
from rgtune.codegen.cuda._traversal import _add_message, _DstWarp
from rgtune.codegen.cuda._unit import Arg, Grid, KernelUnit, Launch, comment_block
from rgtune.codegen.cuda.schedule import vector_width
from rgtune.ir.kernels import Expr, KernelProgram, ScatterKernel, expr_str

#: the host-built tables of ``src_parallel`` (see ``runtime.scatter_groups``)
GROUP_TABLES = ("group_perm", "group_off")


def target_domain(k: ScatterKernel, kp: KernelProgram) -> str:
    """The domain of the rows ``k`` adds into: nodes (every one, or the destinations), or source pairs."""
    return kp.buffers[k.out].domain


def scatter_unit(k: ScatterKernel, s: Mapping[str, Any], kp: KernelProgram) -> KernelUnit:
    """The CUDA unit of ``k`` under the ``scatter.*`` schedule ``s``."""
    mapping, threads, coarsening = s["mapping"], s["threads"], s["coarsening"]
    vw = vector_width(s, k)
    if threads % 32:
        raise UnsupportedKernel(f"{k.name}: {threads} threads is not whole warps")
    out = kp.buffers[k.out]
    if (out.heads, out.dim) != (k.message.heads, k.message.dim):
        raise UnsupportedKernel(f"{k.name}: message {k.message.heads}x{k.message.dim} into {out.heads}x{out.dim}")
    ctx = Context(kp, {k.out: "out"})
    message, = ctx.rename([k.message])
    if mapping == "src_parallel":
        body, launch, desc = _grouped(ctx, k, message, threads, vw, coarsening)
    elif mapping == "edge_parallel":
        body, launch, desc = _row_items(ctx, k, message, threads, vw, coarsening)
    else:
        raise UnsupportedKernel(f"{k.name}: unknown scatter mapping {mapping!r}")
    used = set().union(*(ix.arrays for ix in ctx.indices)) if ctx.indices else set()
    extras = [FIND_PAIR] if kp.pair_index == "bsearch" and {"sp_offsets", "dp_offsets"} & used else []
    sched = f"mapping={mapping} threads={threads} vector_width={vw} coarsening={coarsening}"
    code = "\n".join([comment_block([f"template scatter: {desc}", f"schedule: {sched}"]),
                      prelude(kp.index_bits, ctx.storage().values()), *extras, body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})",
                            "  " + k.describe(), f"  buffers: {ctx.mapping_comment()}"])
    return KernelUnit(k, header, code, (launch,), tuple(ctx.temps))


def _what(k: ScatterKernel, message: Expr) -> str:
    return f"out[{k.out_via}] += {expr_str(message)} over {k.rows} rows"


# --------------------------------------------------------------------------- src_parallel
def _grouped(ctx: Context, k: ScatterKernel, message: Expr, threads: int, vw: int,
             coarsening: int) -> tuple[str, Launch, str]:
    """A warp per target row: its rows (``group_perm[group_off[v] .. group_off[v + 1]]``) summed in registers."""
    out = ctx.kp.buffers[k.out]
    chunks = out.width // vw
    lines: list[str] = []
    _warp_per_target_head(lines, threads, coarsening)
    warp = _DstWarp(ctx, lines, out.width, out.dim, vw, chunks_per_lane=-(-chunks // 32), guarded=chunks % 32 != 0,
                    pairs=ctx.index(k.rows, "rid"), rows=k.rows)
    warp.registers(softmax=False)
    lines += ["    for (idx_t i = beg; i < end; ++i) {",
              "      const idx_t rid = group_perm[i];  // the next row adding into v"]
    warp.edge_chunks("      ", [message], _add_message)
    lines.append("    }")
    warp.write_back("    ", "v", False)
    lines += ["  }", "}"]
    text, args = _finish(ctx, lines, GROUP_TABLES, [(target_domain(k, ctx.kp), "num_rows")])
    grid = Grid("items", target_domain(k, ctx.kp), 1, (threads // 32) * coarsening)
    target = {"src": "source", "src_pair": "source pair", "pair_node": "node"}[k.out_via]
    desc = f"{_what(k, message)}; warp per {target} (rows grouped by the host), no atomics"
    return text, Launch("scatter", grid, threads, args), desc


def _warp_per_target_head(lines: list[str], threads: int, coarsening: int) -> None:
    """Opens the kernel: a warp takes ``coarsening`` targets ``v`` in turn, each with its row range
    ``beg .. end`` in the grouping; the caller closes the loop and the kernel."""
    kernel_head(lines, "scatter", threads)
    w = lines.append
    w("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("  const int lane = threadIdx.x & 31;")
    w("#pragma unroll 1")
    w(f"  for (int cc = 0; cc < {coarsening}; ++cc) {{  // coarsening: targets per warp")
    w(f"    const long long v = warp * {coarsening} + cc;")
    w("    if (v >= num_rows) return;  // warp-uniform")
    w("    const idx_t beg = group_off[v], end = group_off[v + 1];")
    w("    if (beg == end) continue;  // nothing adds into v (warp-uniform): leave its row alone")


# --------------------------------------------------------------------------- edge_parallel
def _row_items(ctx: Context, k: ScatterKernel, message: Expr, threads: int, vw: int,
               coarsening: int) -> tuple[str, Launch, str]:
    """A thread per (row, feature chunk), atomicAdd into the row's target."""
    out = ctx.kp.buffers[k.out]
    width, dim, chunks = out.width, out.dim, out.width // vw
    lines: list[str] = []
    w = lines.append
    kernel_head(lines, "scatter", threads)
    w(f"  const long long base = (long long)blockIdx.x * {threads * coarsening} + threadIdx.x;")
    w("#pragma unroll")
    w(f"  for (int cc = 0; cc < {coarsening}; ++cc) {{  // coarsening: items per thread, strided by the block")
    w(f"    const long long item = base + (long long)cc * {threads};")
    w(f"    if (item >= num_rows * {chunks}) return;")
    w(f"    const long long rid = item / {chunks};  // the row ({k.rows})")
    w(f"    const int f0 = (int)(item % {chunks}) * {vw};")
    w(f"    const int h = f0 / {dim}, d0 = f0 % {dim};")
    w("    (void)h; (void)d0;")
    rows = ctx.index(k.rows, "rid")
    stmts, values = chunk(ctx.emitter(k.rows, "rid"), [message], dim, vw, ctx.kp, "    ")
    lines += stmts
    lines += atomic_vec(f"out[(long)({rows(k.out_via)}) * {width} + f0]", values[0], "    ")
    lines += ["  }", "}"]
    text, args = _finish(ctx, lines, (), [(k.rows, "num_rows")])
    grid = Grid("items", k.rows, chunks, threads * coarsening)
    desc = f"{_what(k, message)}; thread per (row, {vw} features), atomicAdd"
    return text, Launch("scatter", grid, threads, args), desc


def _finish(ctx: Context, lines: list[str], tables: tuple[str, ...],
            sizes: list[tuple[str, str]]) -> tuple[str, tuple[Arg, ...]]:
    """The kernel text with its parameter list (tables included), and the arguments the runtime binds."""
    args = ctx.args(tables, sizes)
    return "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args)), args
