"""The traversal template (one walk over the edges computing a :class:`Stage`), in CUDA.

Mappings (``traversal.*`` schedule):

``dst_parallel`` (no atomics; edges grouped by destination, layout ``csr_dst``)
    a warp per destination, ``coarsening`` destinations per warp one after the other. Lanes
    run over the destination's features, ``vector_width`` consecutive ones per lane (``float``,
    ``float2``, ``float4`` loads and stores; the knob is an upper bound, halved until it divides the
    stage's feature size: :func:`~rgtune.codegen.cuda.schedule.vector_width`). Inner products in the per-edge expressions are
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
    A softmax per (destination, relation) (``group="dst_rel"``) normalizes over each run of one
    relation's in-edges (CSR groups a destination's in-edges by relation): the fused form
    flushes the normalized sums of a run where the relation changes (one pass, also into
    destination pairs, whose rows the runs are), the edge softmax finds each run's end by a
    binary search on ``e_rel`` and treats the run as the destination's edges above.

``edge_parallel`` (atomics; any layout)
    a thread per (edge, chunk of ``vector_width`` features), ``coarsening`` items per thread
    (strided by the block size, so that a warp's accesses stay consecutive). Aggregations
    ``atomicAdd`` into the destination (vector ``atomicAdd`` on ``float2``/``float4`` where the
    architecture has it, sm_90+). An edge softmax takes three kernels over (edge, channel):
    scores and a per-destination max (``atomicMax`` on floats by the int-ordering trick, see
    ``rg_atomic_max``), then ``exp(score - max)`` and a per-destination ``atomicAdd`` sum, then
    the division (per destination pair instead of per destination for ``group="dst_rel"``). A
    fused ``SoftmaxAggregate`` is destination-parallel only (a constraint of the template).

``vector_width`` does not change the edge-softmax kernels: their per-channel work is scalar.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

from rgtune.codegen.cuda._context import Body, Context, finish_kernel, kernel_head, softmax_fold, warp_per_dst_head
from rgtune.codegen.cuda._expr import ATOMIC_MAX, FIND_PAIR, RowIndex, UnsupportedKernel, prelude
from rgtune.codegen.cuda._lanes import atomic_vec, chunk, store_vec, warp_inner
from rgtune.codegen.cuda._softmax import softmax_dst_lanes, softmax_edge_passes
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch, comment_block
from rgtune.codegen.cuda.schedule import vector_width
from rgtune.ir.kernels import (AggregateStage, AggregateStores, EdgeSoftmaxStage, EdgeStore, EdgeStores, Expr,
                               KernelProgram, SoftmaxAggregate, TraversalKernel, expr_str, softmax_name)


def _features(k: TraversalKernel, kp: KernelProgram, vw: int, output: str | None = None) -> tuple[int, int, int]:
    """``(F, D, chunks)`` of the stage's output row (``output``'s): features, per head, ``vw``-chunks."""
    b = kp.buffers[output or k.stage.outputs()[0]]  # several outputs (EdgeStores) have one shape
    if b.dim % vw:
        raise UnsupportedKernel(f"{k.name}: vector width {vw} does not divide the feature size {b.dim}")
    return b.width, b.dim, b.width // vw


# --------------------------------------------------------------------------- entry
def traversal_unit(k: TraversalKernel, s: Mapping[str, Any], kp: KernelProgram) -> KernelUnit:
    st = k.stage
    mapping = s["mapping"]
    NT, VW, C = s["threads"], vector_width(s, k), s["coarsening"]
    if NT % 32:
        raise UnsupportedKernel(f"{k.name}: {NT} threads is not whole warps")
    if mapping == "dst_parallel" and st.needs_dst_grouping() and k.layout != "csr_dst":
        raise UnsupportedKernel(f"{k.name}: dst_parallel needs layout csr_dst, not {k.layout}")
    outs = st.outputs()
    ctx = Context(kp, {o: "out" if len(outs) == 1 else f"out{i}" for i, o in enumerate(outs)})
    if isinstance(st, (EdgeStore, EdgeStores)):
        values = ctx.rename(list(st.exprs()))
        fn = _edge_warp_store if mapping == "dst_parallel" else _edge_items
        body, launches, desc = fn(ctx, k, values, None, NT, VW, C)
    elif isinstance(st, AggregateStage):
        message, = ctx.rename([st.message])
        if mapping == "dst_parallel":
            body, launches, desc = _dst_warp(ctx, k, None, message, NT, VW, C)
        else:
            body, launches, desc = _edge_items(ctx, k, [message], st.out_via, NT, VW, C)
    elif isinstance(st, AggregateStores):
        message, *values = ctx.rename(list(st.exprs()))
        fn = _sum_then_stores if mapping == "dst_parallel" else _sum_items_then_store_items
        body, launches, desc = fn(ctx, k, message, values, NT, VW, C)
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
                      prelude(kp.index_bits, ctx.storage().values()), *extras, body, ""])
    header = comment_block([f"rgtune CUDA kernel for IR kernel {k.name} (program {kp.name})",
                            "  " + k.describe(), f"  buffers: {ctx.mapping_comment()}"])
    return KernelUnit(k, header, code, launches, tuple(ctx.temps))


# --------------------------------------------------------------------------- dst_parallel
#: a per-chunk update: ``(indent, values) -> lines``, ``values[i][c]`` the C value of the i-th
#: expression at component ``c`` of the lane's chunk
_Update = Callable[[str, list[list[str]]], list[str]]


@dataclasses.dataclass
class _DstWarp:
    """A warp per destination, its lanes over the destination row's feature chunks; emits into ``lines``.

    Lane ``lane`` holds chunks ``q = 0 .. chunks_per_lane - 1`` of ``vector_width`` features
    starting at ``(lane + 32 * q) * vector_width``; the per-chunk registers are ``sum[q][c]``
    (and ``m``, ``den`` for a softmax).
    """

    ctx: Context
    lines: list[str]
    features: int  # floats of the output row, all heads
    head_dim: int  # features per head
    vector_width: int
    chunks_per_lane: int
    guarded: bool  # whether some lanes' last chunk lies past the row
    pairs: RowIndex  # an edge's destination pair
    rows: str = "edge"  # the domain of the rows whose expressions are summed (a scatter's may be pair rows)
    out: str = "out"  # the C name of the output row's buffer

    def registers(self, softmax: bool) -> None:
        """Declares the per-chunk sums (and a softmax's running max and denominator), zeroed."""
        chunks, width = self.chunks_per_lane, self.vector_width
        names = ["sum"] + (["m", "den"] if softmax else [])
        self.lines += [f"    float {name}[{chunks}][{width}];" for name in names]
        init = "sum[q][c] = 0.0f;" + (" m[q][c] = -INFINITY; den[q][c] = 0.0f;" if softmax else "")
        self.lines += [
            "#pragma unroll",
            f"    for (int q = 0; q < {chunks}; ++q)",
            "#pragma unroll",
            f"      for (int c = 0; c < {width}; ++c) {{ {init} }}",
        ]

    def lane_chunks(self, indent: str, body: Callable[[str], None]) -> None:
        """The loop over this lane's chunks: ``f0`` (first feature), ``h`` and ``d0``, then ``body``
        (called with the loop body's indent)."""
        w = self.lines.append
        w(f"{indent}#pragma unroll")
        w(f"{indent}for (int q = 0; q < {self.chunks_per_lane}; ++q) {{")
        w(f"{indent}  const int f0 = (lane + 32 * q) * {self.vector_width};"
          f"  // this lane's features f0 .. f0 + {self.vector_width - 1}")
        if self.guarded:
            w(f"{indent}  if (f0 < {self.features}) {{")
        inner = indent + ("    " if self.guarded else "  ")
        w(f"{inner}const int h = f0 / {self.head_dim}, d0 = f0 % {self.head_dim};")
        w(f"{inner}(void)h; (void)d0;")
        body(inner)
        if self.guarded:
            w(f"{indent}  }}")
        w(f"{indent}}}")

    def write_back(self, indent: str, row: str, normalize: bool) -> None:
        """Adds the sums into output row ``row``, divided by the softmax denominators if ``normalize``."""
        def store(inner: str) -> None:
            values = [f"(den[q][{c}] > 0.0f ? sum[q][{c}] / den[q][{c}] : 0.0f)" if normalize else f"sum[q][{c}]"
                      for c in range(self.vector_width)]
            self.lines.extend(store_vec(f"{self.out}[(long)({row}) * {self.features} + f0]", values, inner, "+="))

        self.lane_chunks(indent, store)

    def edge_chunks(self, indent: str, exprs: list[Expr], update: _Update) -> None:
        """Per edge (row): warp-reduced inner products, then each lane's chunks of ``exprs``, then ``update``."""
        emitter = self.ctx.emitter(self.rows, "rid")
        self.lines.extend(warp_inner(emitter, exprs, indent))

        def values_then_update(inner: str) -> None:
            lines, values = chunk(emitter, exprs, self.head_dim, self.vector_width, self.ctx.kp, inner)
            self.lines.extend(lines)
            self.lines.extend(update(inner, values))

        self.lane_chunks(indent, values_then_update)

    def pair_change(self) -> None:
        """At an edge of a new destination pair: writes the finished pair's sums back, zeroes them for ``p``."""
        self.group_change(self.pairs("dst_pair"), "cur", softmax=False)

    def group_change(self, key: str, row: str, softmax: bool) -> None:
        """At an edge whose group ``key`` (a destination pair, a relation) differs from ``cur``'s: adds the
        finished group's sums into output row ``row`` (``cur``: the group's own row), divided by the
        denominators if ``softmax``; then starts group ``p`` from zero (and a fresh running max)."""
        chunks, width = self.chunks_per_lane, self.vector_width
        reset = "sum[q][c] = 0.0f;"
        if softmax:
            reset = f"{{ {reset} m[q][c] = -INFINITY; den[q][c] = 0.0f; }}"
        self.lines += [f"      const idx_t p = {key};",
                       "      if (p != cur) {",
                       "        if (cur >= 0) {"]
        self.write_back("          ", row, softmax)
        self.lines += [
            "        }",
            "        cur = p;",
            "#pragma unroll",
            f"        for (int q = 0; q < {chunks}; ++q)",
            "#pragma unroll",
            f"          for (int c = 0; c < {width}; ++c) {reset}",
            "      }",
        ]

    def last_pair(self, row: str = "cur", softmax: bool = False) -> None:
        """After the edges: writes the last pair's (group's) sums back into ``row`` (none for a destination
        without edges), divided by the denominators if ``softmax``."""
        self.lines.append("    if (cur >= 0) {")
        self.write_back("      ", row, softmax)
        self.lines.append("    }")


def _dst_warp(ctx: Context, k: TraversalKernel, score: Expr | None, message: Expr, threads: int,
              vector_width: int, coarsening: int) -> Body:
    """A warp per destination: aggregation, or softmax-weighted aggregation (online softmax)."""
    out_via = k.stage.out_via  # type: ignore[attr-defined]
    features, head_dim, chunks = _features(k, ctx.kp, vector_width)
    ctx.arrays.add("csr_indptr")
    lines: list[str] = []
    warp_per_dst_head(lines, "traverse", threads, coarsening)
    warp = _DstWarp(ctx, lines, features, head_dim, vector_width, chunks_per_lane=-(-chunks // 32),
                    guarded=chunks % 32 != 0, pairs=ctx.index("edge", "rid"))
    warp.registers(softmax=score is not None)
    if score is None:
        desc = _sum_messages(warp, message, out_via)
    elif k.stage.group == "dst_rel":  # type: ignore[attr-defined]
        desc = _softmax_online_per_relation(warp, score, message, out_via)
    elif out_via == "dst_pair":
        desc = _softmax_two_passes(warp, score, message)
    else:
        desc = _softmax_online(warp, score, message)
    lines += ["  }", "}"]
    # a warp per destination writes its row back (zeros where it has no in-edges): over the output's rows
    # (every node, or the destinations alone), whose buffer has no others
    rows = ctx.kp.buffers[k.stage.out].domain if out_via == "dst" else "node"  # type: ignore[attr-defined]
    text, args = finish_kernel(ctx, lines, [(rows, "num_rows")])
    grid = Grid("items", rows, 1, (threads // 32) * coarsening)
    return text, (Launch("traverse", grid, threads, args),), desc


def _sum_messages(warp: _DstWarp, message: Expr, out_via: str) -> str:
    """Emits the edge loop summing ``message`` per destination (or per destination pair) and the write-back."""
    to_pairs = out_via == "dst_pair"
    if to_pairs:
        warp.lines.append("    idx_t cur = -1;"
                          "  // the destination pair being summed (edges of a pair are consecutive in CSR)")
    warp.lines.append("    for (idx_t rid = beg; rid < end; ++rid) {")
    if to_pairs:
        warp.pair_change()
    warp.edge_chunks("      ", [message], _add_message)
    warp.lines.append("    }")
    if to_pairs:
        warp.last_pair()
    else:
        warp.write_back("    ", "v", False)
    return f"out[{out_via}] += {expr_str(message)}; warp per destination, no atomics"


def _softmax_online(warp: _DstWarp, score: Expr, message: Expr) -> str:
    """Emits one edge loop keeping an online softmax per feature, then the normalized write-back."""
    warp.lines.append("    for (idx_t rid = beg; rid < end; ++rid) {")
    warp.edge_chunks("      ", [score, message], functools.partial(_online_update, broadcast=score.dim == 1))
    warp.lines.append("    }")
    warp.write_back("    ", "v", True)
    return (f"out[dst] += softmax_dst({expr_str(score)}) * {expr_str(message)}; "
            "warp per destination, online softmax, no atomics")


def _softmax_online_per_relation(warp: _DstWarp, score: Expr, message: Expr, out_via: str) -> str:
    """Emits one edge loop keeping an online softmax per feature over each run of one relation's in-edges
    (CSR groups a destination's in-edges by relation): where the relation changes, the finished group's
    normalized sums are added into the destination's row (or its pair's row: the group is the pair), and
    the next group starts afresh."""
    to_pairs = out_via == "dst_pair"
    key = warp.pairs("dst_pair") if to_pairs else warp.pairs("rel")
    row = "cur" if to_pairs else "v"
    warp.lines += [f"    idx_t cur = -1;  // the {'destination pair' if to_pairs else 'relation'} being folded "
                   "(a destination's in-edges are grouped by relation in CSR)",
                   "    for (idx_t rid = beg; rid < end; ++rid) {"]
    warp.group_change(key, row, softmax=True)
    warp.edge_chunks("      ", [score, message], functools.partial(_online_update, broadcast=score.dim == 1))
    warp.lines.append("    }")
    warp.last_pair(row, softmax=True)
    return (f"out[{out_via}] += {softmax_name('dst_rel')}({expr_str(score)}) * {expr_str(message)}; "
            "warp per destination, online softmax per relation, no atomics")


def _softmax_two_passes(warp: _DstWarp, score: Expr, message: Expr) -> str:
    """Emits the softmax into destination pairs in two edge loops: the softmax normalizes over all
    of the destination's edges but the sums go per pair, so the max and denominator are finished
    first, then the weighted sums are written back pair by pair."""
    broadcast = score.dim == 1
    warp.lines.append("    for (idx_t rid = beg; rid < end; ++rid) {  // pass 1: softmax max and denominator")
    warp.edge_chunks("      ", [score], functools.partial(_max_sum_update, broadcast=broadcast))
    warp.lines += ["    }",
                   "    idx_t cur = -1;",
                   "    for (idx_t rid = beg; rid < end; ++rid) {  // pass 2: alpha * message into destination pairs"]
    warp.pair_change()
    warp.edge_chunks("      ", [score, message], functools.partial(_weighted_update, broadcast=broadcast))
    warp.lines.append("    }")
    warp.last_pair()
    return (f"out[dst_pair] += softmax_dst({expr_str(score)}) * {expr_str(message)}; "
            "warp per destination, two passes, no atomics")


def _score_at(values: list[list[str]], c: int, broadcast: bool) -> str:
    """The score of component ``c``: a one-feature score (``broadcast``) weighs every feature."""
    return values[0][0] if broadcast else values[0][c]


def _add_message(indent: str, values: list[list[str]]) -> list[str]:
    """``sum += message``, per component."""
    return [f"{indent}sum[q][{c}] += {message};" for c, message in enumerate(values[0])]


def _online_update(indent: str, values: list[list[str]], broadcast: bool) -> list[str]:
    """Folds an edge's (score, message) into the running max, denominator and weighted sum."""
    lines: list[str] = []
    for c, message in enumerate(values[1]):
        lines += [f"{indent}{{  // online softmax: rescale the running sums to the new max",
                  f"{indent}  const float x = {_score_at(values, c, broadcast)};",
                  f"{indent}  const float mn = fmaxf(m[q][{c}], x);",
                  f"{indent}  const float r = expf(m[q][{c}] - mn), p = expf(x - mn);",
                  f"{indent}  den[q][{c}] = den[q][{c}] * r + p;",
                  f"{indent}  sum[q][{c}] = fmaf(p, {message}, sum[q][{c}] * r);",
                  f"{indent}  m[q][{c}] = mn;",
                  f"{indent}}}"]
    return lines


def _max_sum_update(indent: str, values: list[list[str]], broadcast: bool) -> list[str]:
    """Folds an edge's score into the running max and denominator (pass 1 of two)."""
    lines: list[str] = []
    for c in range(len(values[0])):
        lines += [f"{indent}{{", f"{indent}  const float x = {_score_at(values, c, broadcast)};"]
        lines += softmax_fold(indent + "  ", f"m[q][{c}]", f"den[q][{c}]", "x")
        lines.append(f"{indent}}}")
    return lines


def _weighted_update(indent: str, values: list[list[str]], broadcast: bool) -> list[str]:
    """Adds ``softmax weight * message`` from the finished max and denominator (pass 2 of two)."""
    return [f"{indent}sum[q][{c}] = fmaf(expf({_score_at(values, c, broadcast)} - m[q][{c}]) / den[q][{c}], "
            f"{message}, sum[q][{c}]);"
            for c, message in enumerate(values[1])]


def _stores(ctx: Context, target: str, values: list[list[str]], indent: str, names: list[str] | None = None) -> list[str]:
    """Each value's chunk stored at ``target`` (a row offset) of its output: ``names``, by default ``out``,
    or ``out0``, ``out1``, ... of several stores (:class:`EdgeStores`, in the order of their values)."""
    names = names or (["out"] if len(values) == 1 else [f"out{i}" for i in range(len(values))])
    return [line for name, vals in zip(names, values)
            for line in store_vec(f"{name}[{target}]", vals, indent, storage=ctx.storage_of(name))]


def _described(values: list[Expr]) -> str:
    if len(values) == 1:
        return f"out[e] = {expr_str(values[0])}"
    return f"{len(values)} stores out0..out{len(values) - 1}[e]"


def _edge_warp_store(ctx: Context, k: TraversalKernel, values: list[Expr], _via: None, NT: int, VW: int,
                     C: int) -> Body:
    """EdgeStore(s), dst_parallel: nothing to reduce, so a warp per edge row with lanes over features (the
    inner products and sums the values share reduced once by the warp)."""
    L: list[str] = []
    w = L.append
    kernel_head(L, "traverse", NT)
    w("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("  const int lane = threadIdx.x & 31;")
    w("#pragma unroll 1")
    w(f"  for (int cc = 0; cc < {C}; ++cc) {{  // coarsening: edges per warp")
    w(f"    const long long rid = warp * {C} + cc;")
    w("    if (rid >= num_rows) return;  // warp-uniform")
    _warp_stores(ctx, k, L, values, None, VW, "    ")
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("edge", "num_rows")])
    grid = Grid("items", "edge", 1, (NT // 32) * C)
    return text, (Launch("traverse", grid, NT, args),), f"{_described(values)}; warp per edge"


def _warp_stores(ctx: Context, k: TraversalKernel, L: list[str], values: list[Expr], names: list[str] | None,
                 VW: int, ind: str, output: str | None = None) -> None:
    """Edge ``rid``'s stores by the warp: its inner products reduced once, then each lane's feature chunks
    of every value, stored into ``names`` (:func:`_stores`), rows of ``output``'s shape (:func:`_features`)."""
    kp = ctx.kp
    F, D, NCH_ALL = _features(k, kp, VW, output)
    NCH = -(-NCH_ALL // 32)
    guard = NCH_ALL % 32 != 0
    w = L.append
    em = ctx.emitter("edge", "rid")
    L.extend(warp_inner(em, values, ind))
    w("#pragma unroll")
    w(f"{ind}for (int q = 0; q < {NCH}; ++q) {{")
    w(f"{ind}  const int f0 = (lane + 32 * q) * {VW};")
    inner = ind + "  "
    if guard:
        w(f"{inner}if (f0 < {F}) {{")
        inner += "  "
    w(f"{inner}const int h = f0 / {D}, d0 = f0 % {D};")
    w(f"{inner}(void)h; (void)d0;")
    lines, chunks = chunk(em, values, D, VW, kp, inner)
    L.extend(lines)
    L.extend(_stores(ctx, f"(long)rid * {F} + f0", chunks, inner, names))
    if guard:
        w(f"{ind}  }}")
    w(f"{ind}}}")


def _sum_then_stores(ctx: Context, k: TraversalKernel, message: Expr, values: list[Expr], NT: int, VW: int,
                     C: int) -> Body:
    """AggregateStores, dst_parallel: a warp per destination sums its in-edges' messages (as an aggregation
    does) and writes the sum, then walks the same in-edges again storing each edge's values, which read
    that sum: its lanes wrote it, ``__syncwarp`` orders their writes before every lane's reads."""
    st = k.stage
    assert isinstance(st, AggregateStores)
    features, head_dim, chunks = _features(k, ctx.kp, VW, st.total.out)
    ctx.arrays.add("csr_indptr")
    lines: list[str] = []
    warp_per_dst_head(lines, "traverse", NT, C)
    warp = _DstWarp(ctx, lines, features, head_dim, VW, chunks_per_lane=-(-chunks // 32),
                    guarded=chunks % 32 != 0, pairs=ctx.index("edge", "rid"), out="out0")
    warp.registers(softmax=False)
    _sum_messages(warp, message, st.total.out_via)
    names = [f"out{i + 1}" for i in range(len(values))]
    lines += ["    __syncwarp();  // the sum's lanes wrote it; every lane reads it below",
              "    for (idx_t rid = beg; rid < end; ++rid) {  // the stores, over the same in-edges"]
    _warp_stores(ctx, k, lines, values, names, VW, "      ", st.stores[0].out)
    lines += ["    }", "  }", "}"]
    rows = ctx.kp.buffers[st.total.out].domain if st.total.out_via == "dst" else "node"  # as _dst_warp's
    text, args = finish_kernel(ctx, lines, [(rows, "num_rows")])
    grid = Grid("items", rows, 1, (NT // 32) * C)
    desc = (f"out0[{st.total.out_via}] += {expr_str(message)}, then {len(values)} stores out1..out{len(values)}[e]; "
            "warp per destination, two walks over its in-edges, no atomics")
    return text, (Launch("traverse", grid, NT, args),), desc


def _sum_items_then_store_items(ctx: Context, k: TraversalKernel, message: Expr, values: list[Expr], NT: int,
                                VW: int, C: int) -> Body:
    """AggregateStores, edge_parallel: two kernels, a thread per (edge, chunk) each: the sum (atomicAdd
    into the destinations), then the stores (every atomic add lands before a store reads the sum)."""
    st = k.stage
    assert isinstance(st, AggregateStores)
    names = [f"out{i + 1}" for i in range(len(values))]
    t1, l1, d1 = _edge_items(ctx, k, [message], st.total.out_via, NT, VW, C, "traverse_sum", ["out0"],
                             st.total.out)
    t2, l2, d2 = _edge_items(ctx, k, values, None, NT, VW, C, "traverse", names, st.stores[0].out)
    return "\n".join([t1, t2]), l1 + l2, f"{d1}; then {d2}"


# --------------------------------------------------------------------------- edge_parallel
def _edge_items(ctx: Context, k: TraversalKernel, values: list[Expr], out_via: str | None, NT: int, VW: int,
                C: int, fname: str = "traverse", names: list[str] | None = None, output: str | None = None) -> Body:
    """A thread per (edge, feature chunk): store per edge (one value, or several of one shape), or atomicAdd
    (one value) into destinations; the kernel ``fname``, its outputs ``names`` (:func:`_stores`), of
    ``output``'s shape (by default the stage's first output)."""
    kp = ctx.kp
    F, D, NCHUNK = _features(k, kp, VW, output)
    L: list[str] = []
    w = L.append
    kernel_head(L, fname, NT)
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
    lines, chunks = chunk(em, values, D, VW, kp, "    ")
    L.extend(lines)
    if out_via is None:
        L.extend(_stores(ctx, f"(long)rid * {F} + f0", chunks, "    ", names))
        desc = f"{_described(values)}; thread per (edge, {VW} features)"
    else:
        row = ctx.index("edge", "rid")(out_via)
        L.extend(atomic_vec(f"{(names or ['out'])[0]}[(long)({row}) * {F} + f0]", chunks[0], "    "))
        desc = f"out[{out_via}] += {expr_str(values[0])}; thread per (edge, {VW} features), atomicAdd"
    w("  }")
    w("}")
    text, args = finish_kernel(ctx, L, [("edge", "num_rows")])
    grid = Grid("items", "edge", NCHUNK, NT * C)
    return text, (Launch(fname, grid, NT, args),), desc
