"""The traversal, scatter and map templates in C.

Traversals, by ``traversal.mapping``:

* ``dst_parallel`` (layout ``csr_dst``: a destination's in-edges are contiguous): OpenMP
  ``schedule(dynamic, traversal.chunk)`` over destinations; each destination is one thread's,
  so nothing is atomic. An aggregation into ``dst`` sums in a local row and adds it once; into
  ``dst_pair`` it adds straight into the pair's row (a pair belongs to one destination). The
  edge softmax takes three passes over the destination's edges (score and max, exp and
  sum, scale); the fused softmax-aggregate is one pass with an online softmax (running max,
  rescaling the running sum and row when the max grows), or two passes (max and sum, then
  weighted sums) when it aggregates into ``dst_pair`` rows. A softmax per (destination,
  relation) (``group="dst_rel"``) does the same over each run of one relation's in-edges (CSR
  groups a destination's in-edges by relation; a run ends where ``e_rel`` changes).
* ``edge_parallel`` (any layout): ``schedule(dynamic, traversal.chunk)`` over edges;
  aggregation with ``#pragma omp atomic`` adds; the edge softmax keeps per-destination max
  (compare-and-swap) and sum (atomic add) arrays, in three passes; per destination pair
  (indexed by the edge's ``dst_pair``) for a softmax per (destination, relation).

An edge store (no reduction) is a parallel loop over edges under either mapping. An aggregation
followed by the edge stores that read its sum (:class:`AggregateStores`) walks a destination's
in-edges twice in its thread, destination-parallel (sum, then stores); edge-parallel it is the two
loops one after the other (every atomic sum lands before a store reads it). Edge loops
prefetch the rows that the edge ``PREFETCH`` positions ahead gathers (through ``src``,
``src_pair``, ...): random row gathers make them latency bound otherwise.
Maps: ``schedule(static, map.chunk)`` over the rows of their domain.

Scatters (a training program's: edges into their sources or source pairs, pairs into their nodes),
by ``scatter.mapping``:

* ``owner``: OpenMP ``schedule(dynamic, scatter.chunk)`` over the *targets*; the runtime groups the
  rows by target once per graph (a permutation ``perm`` and offsets, like a CSR by source), so a
  target's rows are one thread's: it sums them in a local row and adds it once. No atomics, any
  layout; the rows are read through the permutation (their messages' gathered rows are prefetched
  ``PREFETCH`` positions ahead).
* ``atomic``: ``schedule(dynamic, scatter.chunk)`` over the rows in the layout's order, each
  message added with ``#pragma omp atomic`` (a source's edges are spread over any layout that
  groups edges by destination or relation, so two threads may add into one row).

Example:
    >>> from rgtune.ir.kernels import Buffer, Load, MapKernel, UnaryE
    >>> kp = KernelProgram("demo", {"b0": Buffer("b0", "node", 1, 8), "b1": Buffer("b1", "node", 1, 8)}, [], "", "",
    ...                    {}, {})
    >>> k = MapKernel("map", "node", "b0", UnaryE(1, 8, "gelu", Load(1, 8, "b1", "row")))
    >>> print(generate_map(k, {"chunk": 256}, kp).body.text())  # doctest: +NORMALIZE_WHITESPACE
    #pragma omp parallel for schedule(static, 256) num_threads(c->num_threads)
    for (int64_t row = 0; row < num_nodes; ++row) {
        for (int h = 0; h < 1; ++h) {
            #pragma omp simd
            for (int d = 0; d < 8; ++d) b0[row * 8 + d] = rg_gelu(b1[(long)(row) * 8 + d]);
        }
    }
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Mapping

from rgtune.codegen.cfamily import CEmitter
from rgtune.codegen.cpu.cwriter import CFunction, Lines
from rgtune.codegen.cpu.gemm import emit_assign, emit_assigns
from rgtune.codegen.cpu.rows import RowIndex, expr_names
from rgtune.ir.kernels import (AggregateStage, AggregateStores, EdgeSoftmaxStage, EdgeStore, EdgeStores, Expr,
                               KernelProgram, Load, MapKernel, ScatterKernel, SoftmaxAggregate, TraversalKernel)

PREFETCH = 8  # edges ahead whose gathered rows are prefetched
ROW_COUNTS = {"node": "num_nodes", "dst_node": "num_dst_nodes", "edge": "num_edges", "src_pair": "num_src_pairs", "dst_pair": "num_dst_pairs"}


class _Body:
    """Emits one row's body: index locals first, then the statements that use them."""

    def __init__(self, f: CFunction, kp: KernelProgram, domain: str, row: str, known: dict[str, str] | None = None):
        self.f, self.kp = f, kp
        self.rows = RowIndex(domain, row, kp.pair_index, known)
        buffers = {b.name: (b.heads, b.dim) for b in kp.buffers.values()}
        params = {p: tuple(sh) for p, sh in kp.param_shapes.items()}
        self.em = CEmitter(buffers, params, self.rows.var, simd_reductions=True, storage=kp.storage)
        self.lines = Lines(0)

    def flush(self, into: Lines, exprs: list[Expr], prefetch: bool = False) -> None:
        if prefetch:
            into.extend(self._prefetch(exprs))
        into.extend(self.rows.declarations())
        into.extend(self.lines.lines)
        for a in self.rows.arrays:
            self.f.use(a)
        bufs, params, consts = expr_names(exprs)
        for b in bufs:
            self.f.use(b)
        for p in params:
            self.f.use(f"P_{p}")
        for g in consts:
            self.f.use(f"G_{g}")


    def _prefetch(self, exprs: list[Expr]) -> list[str]:
        """Prefetch the rows the edge ``PREFETCH`` positions ahead gathers (random rows: the loop is
        latency bound without it; the hardware prefetcher only follows the index arrays)."""
        arrays = {"src": "e_src", "dst": "e_dst", "src_pair": "e_sp", "dst_pair": "e_dp"}
        if self.kp.pair_index != "direct":
            arrays = {"src": "e_src", "dst": "e_dst"}
        rows: dict[str, list[str]] = {}
        for e in exprs:
            for x in e.walk():
                if isinstance(x, Load) and x.via in arrays and x.via not in self.rows.known:
                    rows.setdefault(x.via, [])
                    if x.buffer not in rows[x.via]:
                        rows[x.via].append(x.buffer)
        if not rows:
            return []
        ne = self.f.use("num_edges")
        out = [f"if ({self.rows.row} + {PREFETCH} < {ne}) {{"]
        for via, bufs in rows.items():
            q = f"q_{via}"
            out.append(f"    const int64_t {q} = {self.f.use(arrays[via])}[{self.rows.row} + {PREFETCH}];")
            for b in bufs:
                width = self.kp.buffers[b].width
                for line in range(0, min(width, 8 * 16), 16):
                    out.append(f"    __builtin_prefetch({b} + {q} * {width} + {line});")
        return out + ["}"]


def generate_map(k: MapKernel, s: Mapping[str, Any], kp: KernelProgram) -> CFunction:
    f = CFunction(f"rg_{k.name}", f"{k.name} (map.chunk={s['chunk']}):\n{k.describe()}")
    ob = kp.buffers[k.out]
    out = f.use(k.out, writes=True)
    n = f.use(ROW_COUNTS[k.rows])
    f.body.line(f"#pragma omp parallel for schedule(static, {int(s['chunk'])}) num_threads(c->num_threads)")
    with f.body.block(f"for (int64_t row = 0; row < {n}; ++row)"):
        b = _Body(f, kp, k.rows, "row")
        emit_assign(b.lines, b.em, k.value, ob.heads, ob.dim, _row_of(out, ob.heads, ob.dim, "row"), storage=ob.dtype)
        b.flush(f.body, [k.value])
    return f


def generate_traversal(k: TraversalKernel, s: Mapping[str, Any], kp: KernelProgram) -> CFunction:
    st, mapping, chunk = k.stage, s["mapping"], int(s["chunk"])
    f = CFunction(f"rg_{k.name}", f"{k.name} (traversal.mapping={mapping}, chunk={chunk}):\n{k.describe()}")
    if isinstance(st, (EdgeStore, EdgeStores)):
        _edge_store(f, st, kp, chunk)
    elif mapping == "dst_parallel":
        f.use("csr_indptr")
        {EdgeSoftmaxStage: _softmax_dst, AggregateStage: _aggregate_dst,
         SoftmaxAggregate: _softmax_aggregate_dst, AggregateStores: _aggregate_stores_dst}[type(st)](f, st, kp, chunk)
    elif isinstance(st, AggregateStores):  # every sum must be finished before a store reads it: two loops
        _aggregate_edge(f, st.total, kp, chunk)
        _edge_store(f, EdgeStores(st.stores), kp, chunk)
    elif isinstance(st, EdgeSoftmaxStage):
        _softmax_edge(f, k.name, st, kp, chunk)
    elif isinstance(st, AggregateStage):
        _aggregate_edge(f, st, kp, chunk)
    else:
        raise ValueError(f"{k.name}: {type(st).__name__} has no {mapping} form (the mapping constraint forbids it)")
    return f


# ------------------------------------------------------------------------ helpers


def _row_of(buf: str, heads: int, dim: int, row: str) -> Callable[[str, str], str]:
    width = heads * dim

    def at(h: str, d: str) -> str:
        parts = ([f"{h} * {dim}" if dim > 1 else h] if heads > 1 else []) + ([d] if dim > 1 else [])
        return f"{buf}[{row} * {width} + {' + '.join(parts) or '0'}]"
    return at


def _dst_loop(f: CFunction, chunk: int) -> Any:
    f.body.line(f"#pragma omp parallel for schedule(dynamic, {chunk}) num_threads(c->num_threads)")
    return f.body.block("for (int64_t dn = 0; dn < num_nodes; ++dn)")


@contextmanager
def _dst_edges(f: CFunction, chunk: int) -> Iterator[Lines]:
    """The parallel loop over destinations ``dn`` with ``e0..e1``, the CSR range of its in-edges
    (a destination without any is skipped); yields the function body to write the loop's body to."""
    f.use("num_nodes")
    with _dst_loop(f, chunk):
        f.body.line("const int64_t e0 = csr_indptr[dn], e1 = csr_indptr[dn + 1];")
        f.body.line("if (e0 == e1) continue;")
        yield f.body


@contextmanager
def _softmax_groups(f: CFunction, B: Lines, group: str) -> Iterator[tuple[str, str]]:
    """Inside a destination's loop: the in-edge ranges one softmax normalizes over, as the names of their
    bounds. ``dst``: the destination's ``e0..e1``; ``dst_rel``: each relation's run ``g0..g1`` of them
    (CSR groups a destination's in-edges by relation), the body emitted once inside the loop over runs."""
    if group == "dst":
        yield "e0", "e1"
        return
    rel = f.use("e_rel")
    with B.block("for (int64_t g0 = e0, g1; g0 < e1; g0 = g1)"):
        B.line("g1 = g0 + 1;")
        B.line(f"while (g1 < e1 && {rel}[g1] == {rel}[g0]) ++g1;  /* g0..g1: the in-edges of one relation */")
        yield "g0", "g1"


def _edge_store(f: CFunction, st: EdgeStore | EdgeStores, kp: KernelProgram, chunk: int) -> None:
    """One store per edge, or several of one shape (:class:`EdgeStores`)."""
    stores = st.stores if isinstance(st, EdgeStores) else (st,)
    ne = f.use("num_edges")
    f.body.line(f"#pragma omp parallel for schedule(dynamic, {chunk}) num_threads(c->num_threads)")
    with f.body.block(f"for (int64_t e = 0; e < {ne}; ++e)"):
        _store_edge(f, f.body, stores, kp)


def _store_edge(f: CFunction, B: Lines, stores: tuple[EdgeStore, ...], kp: KernelProgram,
                known: dict[str, str] | None = None) -> None:
    """Edge ``e``'s stores: one loop over the heads computes what the values share once (the emitter's
    temporaries), then stores each. ``known``: index variables the enclosing loop has (``dst``)."""
    b = _Body(f, kp, "edge", "e", known)
    targets = []
    for one in stores:
        ob = kp.buffers[one.out]
        targets.append((one.value, _row_of(f.use(one.out, writes=True), ob.heads, ob.dim, "e"), ob.dtype))
    first = kp.buffers[stores[0].out]
    emit_assigns(b.lines, b.em, targets, first.heads, first.dim)
    b.flush(B, [one.value for one in stores], prefetch=True)


def _aggregate_dst(f: CFunction, st: AggregateStage, kp: KernelProgram, chunk: int) -> None:
    f.use(st.out, writes=True)
    with _dst_edges(f, chunk) as B:
        _sum_into_dst(f, B, st, kp)


def _sum_into_dst(f: CFunction, B: Lines, st: AggregateStage, kp: KernelProgram) -> None:
    """Inside destination ``dn``'s loop: the sum of its in-edges' messages, added into its row once, or into
    its pairs' rows."""
    ob = kp.buffers[st.out]
    w, out = ob.width, f.use(st.out, writes=True)
    if st.out_via == "dst":
        B.line(f"float acc[{w}] = {{0}};  /* this destination's sum, kept in registers / L1 */")
        with B.block("for (int64_t e = e0; e < e1; ++e)"):
            b = _Body(f, kp, "edge", "e", {"dst": "dn"})
            emit_assign(b.lines, b.em, st.message, ob.heads, ob.dim, _row_of("acc", ob.heads, ob.dim, "0"), "+=")
            b.flush(B, [st.message], prefetch=True)
        B.line("#pragma omp simd")
        B.line(f"for (int j = 0; j < {w}; ++j) {out}[dn * {w} + j] += acc[j];")
        return
    # dst_pair rows belong to one destination: no other thread touches them
    with B.block("for (int64_t e = e0; e < e1; ++e)"):
        b = _Body(f, kp, "edge", "e", {"dst": "dn"})
        tgt = b.rows.var(st.out_via)
        emit_assign(b.lines, b.em, st.message, ob.heads, ob.dim, _row_of(out, ob.heads, ob.dim, tgt), "+=")
        b.flush(B, [st.message], prefetch=True)


def _aggregate_stores_dst(f: CFunction, st: AggregateStores, kp: KernelProgram, chunk: int) -> None:
    """A destination's sum (or its pairs' sums), then its in-edges' stores that read it: both walks by the
    destination's thread, the second over edges whose rows the first just loaded."""
    f.use(st.total.out, writes=True)
    with _dst_edges(f, chunk) as B:
        _sum_into_dst(f, B, st.total, kp)
        B.line("/* the stores, reading the sum just finished */")
        with B.block("for (int64_t e = e0; e < e1; ++e)"):
            _store_edge(f, B, st.stores, kp, {"dst": "dn"})


def _softmax_dst(f: CFunction, st: EdgeSoftmaxStage, kp: KernelProgram, chunk: int) -> None:
    ob = kp.buffers[st.out]
    w, out = ob.width, f.use(st.out, writes=True)
    with _dst_edges(f, chunk) as B, _softmax_groups(f, B, st.group) as (lo, hi):
        B.line(f"float mx[{w}], sm[{w}];")
        B.line(f"for (int j = 0; j < {w}; ++j) {{ mx[j] = -INFINITY; sm[j] = 0.0f; }}")
        B.line("/* pass 1: scores and their max */")
        with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
            b = _Body(f, kp, "edge", "e", {"dst": "dn"})
            emit_assign(b.lines, b.em, st.score, ob.heads, ob.dim, _row_of(out, ob.heads, ob.dim, "e"))
            b.flush(B, [st.score], prefetch=True)
            B.line("#pragma omp simd")
            B.line(f"for (int j = 0; j < {w}; ++j) mx[j] = {out}[e * {w} + j] > mx[j] ? {out}[e * {w} + j] : mx[j];")
        B.line("/* pass 2: exp and sum */")
        with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
            with B.block(f"for (int j = 0; j < {w}; ++j)"):
                B.line(f"const float ex = expf({out}[e * {w} + j] - mx[j]);")
                B.line(f"{out}[e * {w} + j] = ex;")
                B.line("sm[j] += ex;")
        B.line("/* pass 3: normalize */")
        B.line(f"for (int j = 0; j < {w}; ++j) sm[j] = 1.0f / sm[j];")
        with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
            B.line("#pragma omp simd")
            B.line(f"for (int j = 0; j < {w}; ++j) {out}[e * {w} + j] *= sm[j];")


def _softmax_aggregate_dst(f: CFunction, st: SoftmaxAggregate, kp: KernelProgram, chunk: int) -> None:
    f.use(st.out, writes=True)
    f.use("num_nodes")
    with _dst_loop(f, chunk):
        f.body.line("const int64_t e0 = csr_indptr[dn], e1 = csr_indptr[dn + 1];")
        f.body.line("if (e0 == e1) continue;")
        with _softmax_groups(f, f.body, st.group) as (lo, hi):
            _softmax_weighted_sums(f, st, kp, lo, hi)


def _softmax_weighted_sums(f: CFunction, st: SoftmaxAggregate, kp: KernelProgram, lo: str, hi: str) -> None:
    """The softmax over the in-edges ``lo..hi`` of destination ``dn`` and its weighted sums of messages,
    added into ``dn``'s row or into its pairs' rows."""
    ob = kp.buffers[st.out]
    heads, dim, w, out = ob.heads, ob.dim, ob.width, st.out
    B = f.body

    def score(b: _Body) -> str:
        value = b.em.element(st.score, "h", "0")
        b.lines.extend(b.em.take_statements())
        return value

    def weighted(b: _Body, target: Callable[[str, str], str]) -> None:
        value = b.em.element(st.message, "h", "d" if dim > 1 else "0")
        b.lines.extend(b.em.take_statements())
        if dim > 1:
            b.lines.line("#pragma omp simd")
        loop = f"for (int d = 0; d < {dim}; ++d) " if dim > 1 else ""
        b.lines.line(f"{loop}{target('h', 'd' if dim > 1 else '0')} += p * {value};")

    B.line(f"float mx[{heads}], sm[{heads}];")
    B.line(f"for (int h = 0; h < {heads}; ++h) {{ mx[h] = -INFINITY; sm[h] = 0.0f; }}")
    if st.out_via == "dst":
        B.line(f"float acc[{w}] = {{0}};")
        B.line("/* one pass, online softmax: when the running max grows, rescale the sum and the row */")
        with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
            b = _Body(f, kp, "edge", "e", {"dst": "dn"})
            with b.lines.block(f"for (int h = 0; h < {heads}; ++h)"):
                b.lines.line(f"const float sc = {score(b)};")
                with b.lines.block("if (sc > mx[h])"):
                    b.lines.line("const float f = expf(mx[h] - sc);")
                    b.lines.line("sm[h] *= f;")
                    b.lines.line(f"for (int d = 0; d < {dim}; ++d) acc[h * {dim} + d] *= f;")
                    b.lines.line("mx[h] = sc;")
                b.lines.line("const float p = expf(sc - mx[h]);")
                b.lines.line("sm[h] += p;")
                weighted(b, lambda h, d: f"acc[{h} * {dim} + {d}]")
            b.flush(B, [st.score, st.message], prefetch=True)
        with B.block(f"for (int h = 0; h < {heads}; ++h)"):
            B.line("const float inv = 1.0f / sm[h];")
            B.line("#pragma omp simd")
            B.line(f"for (int d = 0; d < {dim}; ++d) {out}[dn * {w} + h * {dim} + d] += acc[h * {dim} + d] * inv;")
        return
    B.line("/* pass 1: running max and sum of exp per head */")
    with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
        b = _Body(f, kp, "edge", "e", {"dst": "dn"})
        with b.lines.block(f"for (int h = 0; h < {heads}; ++h)"):
            b.lines.line(f"const float sc = {score(b)};")
            b.lines.line("if (sc > mx[h]) { sm[h] = sm[h] * expf(mx[h] - sc) + 1.0f; mx[h] = sc; }")
            b.lines.line("else sm[h] += expf(sc - mx[h]);")
        b.flush(B, [st.score], prefetch=True)
    B.line(f"for (int h = 0; h < {heads}; ++h) sm[h] = 1.0f / sm[h];")
    B.line("/* pass 2: add softmax-weighted messages into this destination's pair rows */")
    with B.block(f"for (int64_t e = {lo}; e < {hi}; ++e)"):
        b = _Body(f, kp, "edge", "e", {"dst": "dn"})
        tgt = b.rows.var(st.out_via)
        with b.lines.block(f"for (int h = 0; h < {heads}; ++h)"):
            b.lines.line(f"const float p = expf({score(b)} - mx[h]) * sm[h];")
            weighted(b, lambda h, d: _row_of(out, heads, dim, tgt)(h, d))
        b.flush(B, [st.score, st.message], prefetch=True)


def _aggregate_edge(f: CFunction, st: AggregateStage, kp: KernelProgram, chunk: int) -> None:
    _atomic_rows(f, kp, st.out, "edge", "e", "num_edges", st.out_via, st.message, chunk, prefetch=True)


def _softmax_edge(f: CFunction, name: str, st: EdgeSoftmaxStage, kp: KernelProgram, chunk: int) -> None:
    ob = kp.buffers[st.out]
    w, out, ne = ob.width, f.use(st.out, writes=True), f.use("num_edges")
    groups = f.use("num_nodes") if st.group == "dst" else f.use("num_dst_pairs")
    mx, sm = f.use(f"{name}_max", writes=True), f.use(f"{name}_sum", writes=True)
    B = f.body
    what = "per-destination" if st.group == "dst" else "per-(destination, relation) pair"
    B.line(f"/* {what} max (compare-and-swap) and sum (atomic add), then normalize: any edge order */")
    with B.block("#pragma omp parallel num_threads(c->num_threads)\n"):
        B.line("#pragma omp for schedule(static)")
        B.line(f"for (int64_t i = 0; i < {groups} * {w}; ++i) {{ {mx}[i] = -INFINITY; {sm}[i] = 0.0f; }}")
        B.line(f"#pragma omp for schedule(dynamic, {chunk})")
        with B.block(f"for (int64_t e = 0; e < {ne}; ++e)"):
            b = _Body(f, kp, "edge", "e")
            emit_assign(b.lines, b.em, st.score, ob.heads, ob.dim, _row_of(out, ob.heads, ob.dim, "e"))
            t = _group_offset(f, b.rows, st.group, w)
            b.flush(B, [st.score], prefetch=True)
            B.line(t)
            B.line(f"for (int j = 0; j < {w}; ++j) rg_atomic_max(&{mx}[t + j], {out}[e * {w} + j]);")
        B.line(f"#pragma omp for schedule(dynamic, {chunk})")
        with B.block(f"for (int64_t e = 0; e < {ne}; ++e)"):
            _group_row(f, kp, B, st.group, w)
            with B.block(f"for (int j = 0; j < {w}; ++j)"):
                B.line(f"const float ex = expf({out}[e * {w} + j] - {mx}[t + j]);")
                B.line(f"{out}[e * {w} + j] = ex;")
                B.line("#pragma omp atomic")
                B.line(f"{sm}[t + j] += ex;")
        B.line(f"#pragma omp for schedule(dynamic, {chunk})")
        with B.block(f"for (int64_t e = 0; e < {ne}; ++e)"):
            _group_row(f, kp, B, st.group, w)
            B.line(f"for (int j = 0; j < {w}; ++j) {out}[e * {w} + j] /= {sm}[t + j];")


def _group_offset(f: CFunction, rows: RowIndex, group: str, w: int) -> str:
    """``t``, the scratch offset of edge ``e``'s softmax group: its destination's row, or its destination
    pair's (found as the program finds pairs: ``e_dp`` or a binary search; declared by ``rows``)."""
    if group == "dst":
        return f"const int64_t t = (int64_t){f.use('e_dst')}[e] * {w};"
    return f"const int64_t t = {rows.var('dst_pair')} * {w};"


def _group_row(f: CFunction, kp: KernelProgram, B: Lines, group: str, w: int) -> None:
    """Declares ``t`` (:func:`_group_offset`) at the top of an edge loop that reads nothing else."""
    rows = RowIndex("edge", "e", kp.pair_index)
    t = _group_offset(f, rows, group, w)
    B.extend(rows.declarations())
    for a in rows.arrays:
        f.use(a)
    B.line(t)


# ------------------------------------------------------------------------ scatter


def generate_scatter(k: ScatterKernel, s: Mapping[str, Any], kp: KernelProgram) -> CFunction:
    """``out[target(r)] += message(r)`` over the rows ``r`` of ``k.rows`` (edges, or pairs into their nodes)."""
    mapping, chunk = s["mapping"], int(s["chunk"])
    f = CFunction(f"rg_{k.name}", f"{k.name} (scatter.mapping={mapping}, chunk={chunk}):\n{k.describe()}")
    if mapping == "owner":
        _scatter_owner(f, k, kp, chunk)
    elif mapping == "atomic":
        _scatter_atomic(f, k, kp, chunk)
    else:
        raise ValueError(f"{k.name}: unknown scatter.mapping {mapping!r}; choose owner or atomic")
    return f


def _scatter_owner(f: CFunction, k: ScatterKernel, kp: KernelProgram, chunk: int) -> None:
    """Targets in parallel; target ``tn``'s rows are ``perm[offsets[tn]..offsets[tn + 1])`` (built per graph)."""
    ob = kp.buffers[k.out]
    w, out = ob.width, f.use(k.out, writes=True)
    perm, offsets = f.use(f"{k.name}_perm"), f.use(f"{k.name}_offsets")
    targets, rows = f.use(ROW_COUNTS[ob.domain]), ROW_COUNTS[k.rows]  # rows: a field only if prefetching
    B = f.body
    B.line(f"#pragma omp parallel for schedule(dynamic, {chunk}) num_threads(c->num_threads)")
    with B.block(f"for (int64_t tn = 0; tn < {targets}; ++tn)"):
        B.line(f"const int64_t i0 = {offsets}[tn], i1 = {offsets}[tn + 1];")
        B.line("if (i0 == i1) continue;")
        B.line(f"float acc[{w}] = {{0}};  /* this target's sum: its rows are this thread's alone */")
        with B.block("for (int64_t i = i0; i < i1; ++i)"):
            B.line(f"const int64_t r = {perm}[i];")
            b = _Body(f, kp, k.rows, "r", {k.out_via: "tn"})
            emit_assign(b.lines, b.em, k.message, ob.heads, ob.dim, _row_of("acc", ob.heads, ob.dim, "0"), "+=")
            B.extend(_permuted_prefetch(f, kp, k.message, perm, rows))
            b.flush(B, [k.message])
        B.line("#pragma omp simd")
        B.line(f"for (int j = 0; j < {w}; ++j) {out}[tn * {w} + j] += acc[j];")


def _permuted_prefetch(f: CFunction, kp: KernelProgram, message: Expr, perm: str, rows: str) -> list[str]:
    """Prefetch the rows of the row ``PREFETCH`` positions ahead in the permutation that the message reads
    at that row (its own buffers: the permutation makes them random reads)."""
    bufs = list(dict.fromkeys(x.buffer for x in message.walk() if isinstance(x, Load) and x.via == "row"))
    if not bufs:
        return []
    out = [f"if (i + {PREFETCH} < {f.use(rows)}) {{", f"    const int64_t q_row = {perm}[i + {PREFETCH}];"]
    for b in bufs:
        width = kp.buffers[b].width
        for line in range(0, min(width, 8 * 16), 16):
            out.append(f"    __builtin_prefetch({b} + q_row * {width} + {line});")
    return out + ["}"]


def _scatter_atomic(f: CFunction, k: ScatterKernel, kp: KernelProgram, chunk: int) -> None:
    """Rows in parallel in their order; each element added atomically (two rows may share a target)."""
    # the prefetch reads edge index arrays: only edge rows have them
    _atomic_rows(f, kp, k.out, k.rows, "r", ROW_COUNTS[k.rows], k.out_via, k.message, chunk,
                 prefetch=k.rows == "edge")


def _atomic_rows(f: CFunction, kp: KernelProgram, out_name: str, rows: str, var: str, count_field: str, via: str,
                 message: Expr, chunk: int, prefetch: bool) -> None:
    """``out[via(r)] += message(r)`` over ``rows`` in parallel in their order, each element added
    atomically (two rows may share a target): an aggregation over edges, a scatter into sources."""
    ob = kp.buffers[out_name]
    out, count = f.use(out_name, writes=True), f.use(count_field)  # a context field's place: its first use
    B = f.body
    B.line(f"#pragma omp parallel for schedule(dynamic, {chunk}) num_threads(c->num_threads)")
    with B.block(f"for (int64_t {var} = 0; {var} < {count}; ++{var})"):
        b = _Body(f, kp, rows, var)
        at = _row_of(out, ob.heads, ob.dim, b.rows.var(via))
        with b.lines.block(f"for (int h = 0; h < {ob.heads}; ++h)"):
            d = "d" if ob.dim > 1 else "0"
            value = b.em.element(message, "h", d)
            b.lines.extend(b.em.take_statements())
            with b.lines.block(f"for (int d = 0; d < {ob.dim}; ++d)"):
                b.lines.line(f"const float val = {value};")
                b.lines.line("#pragma omp atomic")
                b.lines.line(f"{at('h', d)} += val;")
        b.flush(B, [message], prefetch=prefetch)
