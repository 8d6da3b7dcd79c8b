"""Edge softmax kernels (``EdgeSoftmaxStage``): destination-parallel lanes, or three edge-parallel passes.

``dst_parallel``: a warp per destination, lanes over its in-edges (a score has few channels):
each lane keeps an online (max, sum) per channel, the warp combines them by shuffles, and a
second pass writes ``exp(score - max) / sum``. ``edge_parallel``: scores and a per-destination
max (``rg_atomic_max``, the int-ordering trick), then ``exp(score - max)`` and a per-destination
``atomicAdd`` sum, then the division; two scratch arrays per destination and channel.

A softmax per (destination, relation) (``group="dst_rel"``): ``dst_parallel`` does the above
over each run of one relation's in-edges in turn (CSR sorts a destination's in-edges by
relation; a binary search finds where a run ends); ``edge_parallel`` keeps the scratch per
destination pair (the edge's ``dst_pair``) instead of per destination.
"""

from __future__ import annotations

from typing import Callable

from rgtune.codegen.cuda._context import Body, Context, finish_kernel, kernel_head, softmax_fold, warp_per_dst_head
from rgtune.codegen.cuda._unit import Grid, Launch, Temp
from rgtune.ir.kernels import Expr, KernelProgram, TraversalKernel, expr_str, softmax_name


def _channels(k: TraversalKernel, kp: KernelProgram) -> tuple[int, int]:
    """``(channels, per head)`` of the softmax output row (a score per head, usually)."""
    b = kp.buffers[k.stage.out]  # type: ignore[attr-defined]
    return b.width, b.dim


def softmax_dst_lanes(ctx: Context, k: TraversalKernel, score: Expr, NT: int, C: int) -> Body:
    """Edge softmax, dst_parallel: a warp per destination, lanes over its in-edges (over each relation's
    run of them, one after the other, for a softmax per (destination, relation))."""
    CH, DS = _channels(k, ctx.kp)
    group = k.stage.group  # type: ignore[attr-defined]
    ctx.arrays.add("csr_indptr")
    L: list[str] = []
    w = L.append
    warp_per_dst_head(L, "traverse", NT, C)
    beg, end, ind = "beg", "end", "    "
    if group == "dst_rel":
        beg, end, ind = "g0", "g1", "      "
        _relation_runs(ctx, L)
    w(f"{ind}float m[{CH}], den[{CH}];  // per channel: running max and rescaled sum of this lane's edges")
    w("#pragma unroll")
    w(f"{ind}for (int ch = 0; ch < {CH}; ++ch) {{ m[ch] = -INFINITY; den[ch] = 0.0f; }}")

    def lane_edges(body: Callable[[str], list[str]]) -> None:
        """Each lane over every 32nd in-edge, per channel: the score as ``x``, then ``body(x)``."""
        stmts, x = ctx.emitter("edge", "rid").block(score, "h", "d")
        w(f"{ind}for (idx_t rid = {beg} + lane; rid < {end}; rid += 32) {{")
        w("#pragma unroll")
        w(f"{ind}  for (int ch = 0; ch < {CH}; ++ch) {{")
        w(f"{ind}    const int h = ch / {DS}, d = ch % {DS};")
        w(f"{ind}    (void)h; (void)d;")
        L.extend(f"{ind}    " + s for s in stmts)
        L.extend(f"{ind}    " + line for line in body(x))
        w(f"{ind}  }}")
        w(f"{ind}}}")

    lane_edges(lambda x: [f"const float x = {x};", *softmax_fold("", "m[ch]", "den[ch]", "x")])
    w("#pragma unroll")
    w(f"{ind}for (int ch = 0; ch < {CH}; ++ch) {{  // combine the lanes' (max, sum) pairs")
    w("#pragma unroll")
    w(f"{ind}  for (int o = 16; o > 0; o >>= 1) {{")
    w(f"{ind}    const float m2 = __shfl_xor_sync(0xffffffffu, m[ch], o);")
    w(f"{ind}    const float s2 = __shfl_xor_sync(0xffffffffu, den[ch], o);")
    w(f"{ind}    const float mn = fmaxf(m[ch], m2);")
    w(f"{ind}    if (mn != -INFINITY) den[ch] = den[ch] * expf(m[ch] - mn) + s2 * expf(m2 - mn);")
    w(f"{ind}    m[ch] = mn;")
    w(f"{ind}  }}")
    w(f"{ind}}}")
    lane_edges(lambda x: [f"out[(long)rid * {CH} + ch] = expf({x} - m[ch]) / den[ch];"])
    if group == "dst_rel":
        w("    }")
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("node", "num_rows")])
    grid = Grid("items", "node", 1, (NT // 32) * C)
    runs = ", a relation's run at a time" if group == "dst_rel" else ""
    desc = f"out[e] = {softmax_name(group)}({expr_str(score)}); warp per destination, lanes over in-edges{runs}"
    return text, (Launch("traverse", grid, NT, args),), desc


def _relation_runs(ctx: Context, L: list[str]) -> None:
    """Opens the loop over a destination's runs of one relation's in-edges, ``g0 .. g1`` (the caller closes
    it): CSR sorts a destination's in-edges by relation, so a run ends at the first larger relation, found
    by a binary search that every lane does alike (the loop stays warp-uniform for the shuffles)."""
    ctx.arrays.add("e_rel")
    L += ["    for (idx_t g0 = beg, g1; g0 < end; g0 = g1) {  // one softmax per relation's in-edges",
          "      const idx_t r0 = e_rel[g0];",
          "      idx_t lo = g0 + 1, hi = end;",
          "      while (lo < hi) {",
          "        const idx_t mid = lo + ((hi - lo) >> 1);",
          "        if (e_rel[mid] <= r0) lo = mid + 1; else hi = mid;",
          "      }",
          "      g1 = lo;"]


def softmax_edge_passes(ctx: Context, k: TraversalKernel, score: Expr, NT: int, C: int) -> Body:
    """Edge softmax, edge_parallel: max (atomic), exp and sum (atomic), normalize: three kernels. The max and
    sum are kept per destination, or per destination pair for a softmax per (destination, relation)."""
    CH, DS = _channels(k, ctx.kp)
    group = k.stage.group  # type: ignore[attr-defined]
    rows = "node" if group == "dst" else "dst_pair"
    ctx.add_temp(Temp("smax", rows, CH, float("-inf")))
    ctx.add_temp(Temp("ssum", rows, CH, 0.0))
    dst = ctx.index("edge", "rid")("dst" if group == "dst" else "dst_pair")
    em = ctx.emitter("edge", "rid")
    stmts, x = em.block(score, "h", "d")
    L: list[str] = []
    w = L.append
    parts = {
        "softmax_max": stmts + [f"const float x = {x};", "out[i] = x;",
                                f"rg_atomic_max(&smax[(long)({dst}) * {CH} + ch], x);"],
        "softmax_sum": [f"const float ex = expf(out[i] - smax[(long)({dst}) * {CH} + ch]);", "out[i] = ex;",
                        f"atomicAdd(&ssum[(long)({dst}) * {CH} + ch], ex);"],
        "softmax_norm": [f"out[i] = out[i] / ssum[(long)({dst}) * {CH} + ch];"],
    }
    per = "per-destination" if group == "dst" else "per-destination-pair"
    notes = {"softmax_max": f"pass 1: scores, {per} max (atomic)",
             "softmax_sum": f"pass 2: exp(score - max), {per} sum (atomic)",
             "softmax_norm": "pass 3: divide by the sum"}
    for fname, body in parts.items():
        w(f"// {notes[fname]}; a thread per (edge, channel)")
        kernel_head(L, fname, NT)
        w(f"  const long long base = (long long)blockIdx.x * {NT * C} + threadIdx.x;")
        w("#pragma unroll")
        w(f"  for (int cc = 0; cc < {C}; ++cc) {{")
        w(f"    const long long i = base + (long long)cc * {NT};")
        w(f"    if (i >= num_rows * {CH}) return;")
        w(f"    const long long rid = i / {CH};")
        w(f"    const int ch = (int)(i % {CH}), h = ch / {DS}, d = ch % {DS};")
        w("    (void)h; (void)d;")
        L.extend("    " + s for s in body)
        w("  }")
        w("}")
    text, args = finish_kernel(ctx, L, [("edge", "num_rows")])
    grid = Grid("items", "edge", CH, NT * C)
    launches = tuple(Launch(f, grid, NT, args) for f in parts)
    desc = f"out[e] = {softmax_name(group)}({expr_str(score)}); edge-parallel, three passes with atomics"
    return text, launches, desc
