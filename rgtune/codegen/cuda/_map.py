"""The map template: ``out[row] = value`` elementwise, a thread per (row, feature).

``map.threads`` threads per block; consecutive threads take consecutive features of a row,
so loads and stores of row-major buffers are coalesced. Inner products inside ``value`` are
computed by each thread (a map's rows are node or pair rows, whose values are cheap).
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.codegen.cuda._context import Context
from rgtune.codegen.cuda._expr import FIND_PAIR, prelude
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch, comment_block
from rgtune.ir.kernels import KernelProgram, MapKernel, expr_str


def map_unit(k: MapKernel, s: Mapping[str, Any], kp: KernelProgram) -> KernelUnit:
    NT = s["threads"]
    b = kp.buffers[k.out]
    F, D = b.width, b.dim
    ctx = Context(kp, {k.out: "out"})
    value, = ctx.rename([k.value])
    em = ctx.emitter(k.rows, "rid")
    stmts, val = em.block(value, "h", "d")
    lines = [
        f"extern \"C\" __global__ void __launch_bounds__({NT}) map(PARAMS) {{",
        f"  const long long i = (long long)blockIdx.x * {NT} + threadIdx.x;",
        f"  if (i >= num_rows * {F}) return;",
        f"  const long long rid = i / {F};",
        f"  const int f = (int)(i % {F}), h = f / {D}, d = f % {D};",
        "  (void)h; (void)d;",
        *["  " + st for st in stmts],
        f"  out[i] = {ctx.store('out', val)};",
        "}",
    ]
    args = ctx.args((), [(k.rows, "num_rows")])
    body = "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args))
    used = set().union(*(ix.arrays for ix in ctx.indices))
    extras = [FIND_PAIR] if kp.pair_index == "bsearch" and {"sp_offsets", "dp_offsets"} & used else []
    code = "\n".join([comment_block([f"template map over {k.rows} rows: out = {expr_str(value)}",
                                     f"schedule: threads={NT}; a thread per (row, feature)"]),
                      prelude(kp.index_bits, ctx.storage().values()), *extras, body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})",
                            "  " + k.describe(), f"  buffers: {ctx.mapping_comment()}"])
    return KernelUnit(k, header, code, (Launch("map", Grid("items", k.rows, F, NT), NT, args),))
