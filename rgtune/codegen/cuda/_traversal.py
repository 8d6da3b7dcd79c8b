"""The traversal template (one walk over the edges computing a :class:`Stage`), in CUDA.

Mappings (``traversal.*`` schedule):

``dst_parallel`` (no atomics; edges grouped by destination, layout ``csr_dst``)
    a warp per destination, ``coarsening`` destinations per warp one after the other. Lanes
    run over the destination's features, ``vector_width`` consecutive ones per lane (``float``,
    ``float2``, ``float4`` loads and stores). Inner products in the per-edge expressions are
    computed by the whole warp (lanes over the reduced dimension, then a ``__shfl_xor_sync``
    reduction), so a 64-wide score keeps every lane busy. Sums stay in registers and are
    written once per destination (per destination pair: flushed when the pair changes, which
    in CSR order, relation-sorted within a destination, is once per pair).
    ``SoftmaxAggregate`` keeps an *online softmax* per feature (running max, rescaled sum and
    rescaled weighted message), so scores are computed once and nothing is materialized;
    aggregating into destination pairs takes two passes (max/sum, then the weighted sums).
    ``EdgeSoftmaxStage`` (a few channels per edge, so lanes run over *edges* instead): each
    lane keeps an online (max, sum) per channel, the warp combines them by shuffles, and a
    second pass writes ``exp(score - max) / sum``. ``EdgeStore`` has nothing to reduce: a warp
    per edge, lanes over its features (any layout).

``edge_parallel`` (atomics; any layout)
    a thread per (edge, chunk of ``vector_width`` features), ``coarsening`` items per thread
    (strided by the block size, so that a warp's accesses stay consecutive). Aggregations
    ``atomicAdd`` into the destination (vector ``atomicAdd`` on ``float2``/``float4`` where the
    architecture has it, sm_90+). An edge softmax takes three kernels over (edge, channel):
    scores and a per-destination max (``atomicMax`` on floats by the int-ordering trick, see
    ``rg_atomic_max``), then ``exp(score - max)`` and a per-destination ``atomicAdd`` sum, then
    the division. A fused ``SoftmaxAggregate`` is destination-parallel only (a constraint of
    the template).

``vector_width`` does not change the edge-softmax kernels: their per-channel work is scalar.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from rgtune.codegen.cuda._context import Body, Context, finish_kernel, kernel_head, softmax_fold, warp_per_dst_head
from rgtune.codegen.cuda._expr import ATOMIC_MAX, FIND_PAIR, UnsupportedKernel, prelude
from rgtune.codegen.cuda._lanes import atomic_vec, chunk, store_vec, warp_inner
from rgtune.codegen.cuda._softmax import softmax_dst_lanes, softmax_edge_passes
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch, comment_block
from rgtune.ir.kernels import (AggregateStage, EdgeSoftmaxStage, EdgeStore, Expr, KernelProgram, SoftmaxAggregate,
                               TraversalKernel, expr_str)


def _features(k: TraversalKernel, kp: KernelProgram, vw: int) -> tuple[int, int, int]:
    """``(F, D, chunks)`` of the stage's output row: features, per head, ``vw``-chunks."""
    b = kp.buffers[k.stage.out]  # type: ignore[attr-defined]
    if b.dim % vw:
        raise UnsupportedKernel(f"{k.name}: vector width {vw} does not divide the feature size {b.dim}")
    return b.width, b.dim, b.width // vw


# --------------------------------------------------------------------------- entry
def traversal_unit(k: TraversalKernel, s: Mapping[str, Any], kp: KernelProgram) -> KernelUnit:
    st = k.stage
    mapping = s["mapping"]
    NT, VW, C = s["threads"], s["vector_width"], s["coarsening"]
    if NT % 32:
        raise UnsupportedKernel(f"{k.name}: {NT} threads is not whole warps")
    if mapping == "dst_parallel" and st.needs_dst_grouping() and k.layout != "csr_dst":
        raise UnsupportedKernel(f"{k.name}: dst_parallel needs layout csr_dst, not {k.layout}")
    ctx = Context(kp, {st.out: "out"})  # type: ignore[attr-defined]
    if isinstance(st, EdgeStore):
        value, = ctx.rename([st.value])
        fn = _edge_warp_store if mapping == "dst_parallel" else _edge_items
        body, launches, desc = fn(ctx, k, value, None, NT, VW, C)
    elif isinstance(st, AggregateStage):
        message, = ctx.rename([st.message])
        if mapping == "dst_parallel":
            body, launches, desc = _dst_warp(ctx, k, None, message, NT, VW, C)
        else:
            body, launches, desc = _edge_items(ctx, k, message, st.out_via, NT, VW, C)
    elif isinstance(st, SoftmaxAggregate):
        if mapping != "dst_parallel":
            raise UnsupportedKernel(f"{k.name}: a fused softmax-aggregate is destination-parallel only")
        score, message = ctx.rename([st.score, st.message])
        body, launches, desc = _dst_warp(ctx, k, score, message, NT, VW, C)
    elif isinstance(st, EdgeSoftmaxStage):
        score, = ctx.rename([st.score])
        fn = softmax_dst_lanes if mapping == "dst_parallel" else softmax_edge_passes
        body, launches, desc = fn(ctx, k, score, NT, C)
    else:  # pragma: no cover
        raise UnsupportedKernel(f"{k.name}: no CUDA form for stage {type(st).__name__}")
    extras = []
    used = set().union(*(ix.arrays for ix in ctx.indices)) if ctx.indices else set()
    if kp.pair_index == "bsearch" and {"sp_offsets", "dp_offsets"} & used:
        extras.append(FIND_PAIR)
    if "rg_atomic_max" in body:
        extras.append(ATOMIC_MAX)
    sched = f"mapping={mapping} threads={NT} vector_width={VW} coarsening={C}"
    code = "\n".join([comment_block([f"template traversal: {desc}",
                                     f"schedule: {sched}"]),
                      prelude(kp.index_bits), *extras, body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})",
                            "  " + k.describe(), f"  buffers: {ctx.mapping_comment()}"])
    return KernelUnit(k, header, code, launches, tuple(ctx.temps))


# --------------------------------------------------------------------------- dst_parallel
def _dst_warp(ctx: Context, k: TraversalKernel, score: Expr | None, message: Expr, NT: int, VW: int,
              C: int) -> Body:
    """A warp per destination: aggregation, or softmax-weighted aggregation (online softmax)."""
    kp = ctx.kp
    st = k.stage
    out_via = st.out_via  # type: ignore[attr-defined]
    F, D, NCH_ALL = _features(k, kp, VW)
    NCH = -(-NCH_ALL // 32)  # chunks per lane
    guard = NCH_ALL % 32 != 0
    ctx.arrays.add("csr_indptr")
    L: list[str] = []
    w = L.append
    warp_per_dst_head(L, "traverse", NT, C)
    softmax = score is not None
    to_pairs = out_via == "dst_pair"
    pair_ix = ctx.index("edge", "rid")
    arrays = [f"sum[{NCH}][{VW}]"] + ([f"m[{NCH}][{VW}]", f"den[{NCH}][{VW}]"] if softmax else [])
    for a in arrays:
        w(f"    float {a};")
    w("#pragma unroll")
    w(f"    for (int q = 0; q < {NCH}; ++q)")
    w("#pragma unroll")
    init = "sum[q][c] = 0.0f;" + (" m[q][c] = -INFINITY; den[q][c] = 0.0f;" if softmax else "")
    w(f"      for (int c = 0; c < {VW}; ++c) {{ {init} }}")

    def chunk_loop(indent: str, body: Callable[[str], None]) -> None:
        w(f"{indent}#pragma unroll")
        w(f"{indent}for (int q = 0; q < {NCH}; ++q) {{")
        w(f"{indent}  const int f0 = (lane + 32 * q) * {VW};  // this lane's features f0 .. f0 + {VW - 1}")
        if guard:
            w(f"{indent}  if (f0 < {F}) {{")
        inner = indent + ("    " if guard else "  ")
        w(f"{inner}const int h = f0 / {D}, d0 = f0 % {D};")
        w(f"{inner}(void)h; (void)d0;")
        body(inner)
        if guard:
            w(f"{indent}  }}")
        w(f"{indent}}}")

    def flush(indent: str, row: str, scale: bool) -> None:
        def body(ind: str) -> None:
            vals = []
            for c in range(VW):
                vals.append(f"(den[q][{c}] > 0.0f ? sum[q][{c}] / den[q][{c}] : 0.0f)" if scale else f"sum[q][{c}]")
            L.extend(store_vec(f"out[(long)({row}) * {F} + f0]", vals, ind, "+="))
        chunk_loop(indent, body)

    def edge_values(indent: str, exprs: list[Expr], update: Callable[[str, list[list[str]]], None]) -> None:
        """Per edge: warp-reduced inner products, then each lane's chunks of ``exprs``, then ``update``."""
        em = ctx.emitter("edge", "rid")
        L.extend(warp_inner(em, exprs, indent))

        def body(ind: str) -> None:
            lines, values = chunk(em, exprs, D, VW, kp, ind)
            L.extend(lines)
            update(ind, values)

        chunk_loop(indent, body)

    def next_pair() -> None:
        """At an edge of a new destination pair: flush the finished pair's sums, start the next."""
        w(f"      const idx_t p = {pair_ix('dst_pair')};")
        w("      if (p != cur) {")
        w("        if (cur >= 0) {")
        flush("          ", "cur", False)
        w("        }")
        w("        cur = p;")
        w("#pragma unroll")
        w(f"        for (int q = 0; q < {NCH}; ++q)")
        w("#pragma unroll")
        w(f"          for (int c = 0; c < {VW}; ++c) sum[q][c] = 0.0f;")
        w("      }")

    if not softmax:
        def add(ind: str, values: list[list[str]]) -> None:
            for c in range(VW):
                w(f"{ind}sum[q][{c}] += {values[0][c]};")

        if to_pairs:
            w("    idx_t cur = -1;  // the destination pair being summed (edges of a pair are consecutive in CSR)")
        w("    for (idx_t rid = beg; rid < end; ++rid) {")
        if to_pairs:
            next_pair()
        edge_values("      ", [message], add)
        w("    }")
        if to_pairs:
            w("    if (cur >= 0) {")
            flush("      ", "cur", False)
            w("    }")
        else:
            flush("    ", "v", False)
        desc = f"out[{out_via}] += {expr_str(message)}; warp per destination, no atomics"
    else:
        assert score is not None
        sc_broadcast = score.dim == 1

        if not to_pairs:
            def online(ind: str, values: list[list[str]]) -> None:
                for c in range(VW):
                    x = values[0][0] if sc_broadcast else values[0][c]
                    w(f"{ind}{{  // online softmax: rescale the running sums to the new max")
                    w(f"{ind}  const float x = {x};")
                    w(f"{ind}  const float mn = fmaxf(m[q][{c}], x);")
                    w(f"{ind}  const float r = expf(m[q][{c}] - mn), p = expf(x - mn);")
                    w(f"{ind}  den[q][{c}] = den[q][{c}] * r + p;")
                    w(f"{ind}  sum[q][{c}] = fmaf(p, {values[1][c]}, sum[q][{c}] * r);")
                    w(f"{ind}  m[q][{c}] = mn;")
                    w(f"{ind}}}")

            w("    for (idx_t rid = beg; rid < end; ++rid) {")
            edge_values("      ", [score, message], online)
            w("    }")
            flush("    ", "v", True)
            desc = (f"out[dst] += softmax_dst({expr_str(score)}) * {expr_str(message)}; "
                    "warp per destination, online softmax, no atomics")
        else:
            # pass 1: max and denominator per feature; pass 2: weighted sums flushed per pair
            def max_sum(ind: str, values: list[list[str]]) -> None:
                for c in range(VW):
                    x = values[0][0] if sc_broadcast else values[0][c]
                    w(f"{ind}{{")
                    w(f"{ind}  const float x = {x};")
                    L.extend(softmax_fold(ind + "  ", f"m[q][{c}]", f"den[q][{c}]", "x"))
                    w(f"{ind}}}")

            w("    for (idx_t rid = beg; rid < end; ++rid) {  // pass 1: softmax max and denominator")
            edge_values("      ", [score], max_sum)
            w("    }")

            def weighted(ind: str, values: list[list[str]]) -> None:
                for c in range(VW):
                    x = values[0][0] if sc_broadcast else values[0][c]
                    w(f"{ind}sum[q][{c}] = fmaf(expf({x} - m[q][{c}]) / den[q][{c}], {values[1][c]}, sum[q][{c}]);")

            w("    idx_t cur = -1;")
            w("    for (idx_t rid = beg; rid < end; ++rid) {  // pass 2: alpha * message into destination pairs")
            next_pair()
            edge_values("      ", [score, message], weighted)
            w("    }")
            w("    if (cur >= 0) {")
            flush("      ", "cur", False)
            w("    }")
            desc = (f"out[dst_pair] += softmax_dst({expr_str(score)}) * {expr_str(message)}; "
                    "warp per destination, two passes, no atomics")
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("node", "num_rows")])
    grid = Grid("items", "node", 1, (NT // 32) * C)
    return text, (Launch("traverse", grid, NT, args),), desc


def _edge_warp_store(ctx: Context, k: TraversalKernel, value: Expr, _via: None, NT: int, VW: int,
                     C: int) -> Body:
    """EdgeStore, dst_parallel: nothing to reduce, so a warp per edge row with lanes over features."""
    kp = ctx.kp
    F, D, NCH_ALL = _features(k, kp, VW)
    NCH = -(-NCH_ALL // 32)
    guard = NCH_ALL % 32 != 0
    L: list[str] = []
    w = L.append
    kernel_head(L, "traverse", NT)
    w("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("  const int lane = threadIdx.x & 31;")
    w("#pragma unroll 1")
    w(f"  for (int cc = 0; cc < {C}; ++cc) {{  // coarsening: edges per warp")
    w(f"    const long long rid = warp * {C} + cc;")
    w("    if (rid >= num_rows) return;  // warp-uniform")
    em = ctx.emitter("edge", "rid")
    L.extend(warp_inner(em, [value], "    "))
    w("#pragma unroll")
    w(f"    for (int q = 0; q < {NCH}; ++q) {{")
    w(f"      const int f0 = (lane + 32 * q) * {VW};")
    ind = "      "
    if guard:
        w(f"      if (f0 < {F}) {{")
        ind = "        "
    w(f"{ind}const int h = f0 / {D}, d0 = f0 % {D};")
    w(f"{ind}(void)h; (void)d0;")
    lines, values = chunk(em, [value], D, VW, kp, ind)
    L.extend(lines)
    L.extend(store_vec(f"out[(long)rid * {F} + f0]", values[0], ind))
    if guard:
        w("      }")
    w("    }")
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("edge", "num_rows")])
    grid = Grid("items", "edge", 1, (NT // 32) * C)
    return text, (Launch("traverse", grid, NT, args),), f"out[e] = {expr_str(value)}; warp per edge"


# --------------------------------------------------------------------------- edge_parallel
def _edge_items(ctx: Context, k: TraversalKernel, value: Expr, out_via: str | None, NT: int, VW: int,
                C: int) -> Body:
    """A thread per (edge, feature chunk): store per edge, or atomicAdd into destinations."""
    kp = ctx.kp
    F, D, NCHUNK = _features(k, kp, VW)
    L: list[str] = []
    w = L.append
    kernel_head(L, "traverse", NT)
    w(f"  const long long base = (long long)blockIdx.x * {NT * C} + threadIdx.x;")
    w("#pragma unroll")
    w(f"  for (int cc = 0; cc < {C}; ++cc) {{  // coarsening: items per thread, strided by the block")
    w(f"    const long long item = base + (long long)cc * {NT};")
    w(f"    if (item >= num_rows * {NCHUNK}) return;")
    w(f"    const long long rid = item / {NCHUNK};  // the edge (layout position)")
    w(f"    const int f0 = (int)(item % {NCHUNK}) * {VW};")
    w(f"    const int h = f0 / {D}, d0 = f0 % {D};")
    w("    (void)h; (void)d0;")
    em = ctx.emitter("edge", "rid")
    lines, values = chunk(em, [value], D, VW, kp, "    ")
    L.extend(lines)
    if out_via is None:
        L.extend(store_vec(f"out[(long)rid * {F} + f0]", values[0], "    "))
        desc = f"out[e] = {expr_str(value)}; thread per (edge, {VW} features)"
    else:
        row = ctx.index("edge", "rid")(out_via)
        L.extend(atomic_vec(f"out[(long)({row}) * {F} + f0]", values[0], "    "))
        desc = f"out[{out_via}] += {expr_str(value)}; thread per (edge, {VW} features), atomicAdd"
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("edge", "num_rows")])
    grid = Grid("items", "edge", NCHUNK, NT * C)
    return text, (Launch("traverse", grid, NT, args),), desc
