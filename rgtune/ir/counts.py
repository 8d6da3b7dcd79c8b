"""What a schedule costs on a graph, counted from its kernels: FLOPs, bytes, launches, atomics.

The derived weights of linear operator reordering (:class:`~rgtune.ir.kernels.WeightKernel`,
folded with torch once per call) count too: their work grows with the number of relations,
not with the graph's size, so on a graph with many relations and few edges per relation a
reordering that saves GEMM rows can cost more in folding than it saves. ``weight_flops`` is
that part of ``flops`` and ``weight_folds`` the number of folds; ``kernels`` counts the
generated kernels only.

A lookup of an edge's pair row costs nothing extra with ``compact.pair_index=direct`` (it reads
the edge -> pair index, counted in the bytes) and a binary search with ``bsearch``: for an edge
of relation ``r`` about ``ceil(log2(pairs_r + 1))`` dependent reads of the relation's block of
pairs. ``index_probes`` counts those reads over every kernel that finds pairs from edges: work
no byte count shows, since the block is small and cached, but each probe waits for the last.

A tiled GEMM (``gemm.tile_rows``, a schedule knob of both generated backends) computes its rows in tiles of at most
``tile_rows`` rows of one type (relation or node type), none straddling two types, and a short
tile costs as much as a full one (the CPU micro-kernel repeats its last row, a CUDA block idles
its lanes). So a type with ``r`` rows takes ``ceil(r / tile_rows)`` tiles: ``gemm_tiles`` over
every GEMM, and ``gemm_rows_computed`` the rows they compute (``tiles * tile_rows``; the rows
themselves with ``gemm.impl=blas``, whose per-type calls do not pad). On a graph with many small
relations large tiles compute mostly padding; on one with large relations they read each weight
panel for more rows (``gemm_tile_weight_bytes``: a type's weight slice read once per tile). FLOPs
and bytes count the rows themselves, so without these a model cannot tell how a tile size that
fits one graph's relation sizes fares on another's. (The CPU's race-free accumulation splits
tiles further at owner-block boundaries, which depend on the thread count: not counted.)

A training program (:mod:`rgtune.ir.autodiff`) counts its backward's kernels like the forward's:
a scatter into sources as a traversal whose every write is an atomic add unless the schedule
groups edges by source (``scatter.mapping``), a weight gradient as its GEMM (the same FLOPs; the
gradient written once per type). ``saved_bytes`` is the memory the forward hands to the backward
(:attr:`KernelProgram.saved`: what ``autodiff.save`` trades against recomputation) and
``backward_kernels`` how many of the kernels are the backward's.

Two byte counts: ``bytes_min`` reads every buffer, weight and index array a kernel touches
once and writes its outputs once (the floor a perfect cache would reach: the roofline's
minimum bytes), ``bytes_gathered`` counts a gathered row every time a row reads it (what a
cache-less kernel moves). FLOPs count multiply-adds as two.

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> g = random_graph((10, 20), num_relations=2, num_edges=50, seed=0)
    >>> kp = compile_program(build_model("rgcn", 4, 4)).kernels
    >>> count(kp, g)["kernels"]  # edge GEMM, root GEMM, the aggregation into the root's rows
    3
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from rgtune.ir.bind import any_graph_arrays, row_types
from rgtune.ir.op_rules import rules_of
from rgtune.ir.passes.precision import element_bytes
from rgtune.ir.program import EDGE_WEIGHT
from rgtune.ir.kernels import (AggregateStage, AggregateStores, GemmKernel, GraphLoad, KernelProgram, MapKernel,
                               ScatterKernel, SoftmaxAggregate, TraversalKernel, WeightGradKernel, WeightKernel, expr_loads)

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph
    from rgtune.ir.program import Program

FLOAT_BYTES = 4


def count(kp: KernelProgram, graph: "HeteroGraph", schedule: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """FLOPs, bytes (minimum and gathered), kernels launched, atomic updates, GEMM rows and tiles.

    ``schedule`` is a whole configuration (every knob set, as :meth:`SearchSpace.default` fills it):
    the GEMM tiles come from its ``gemm.tile_rows`` and ``gemm.impl``; without a tile size a GEMM
    counts a tile per type, as a per-type BLAS call does."""
    g = graph_counts(graph)
    idx_bytes = kp.index_bits // 8
    rows = g.rows
    num_types = g.num_types
    # a row's size in float32 words: a buffer stored in 16 bits (precision.*) moves half the bytes
    width = {name: b.width * element_bytes(b.dtype) / FLOAT_BYTES for name, b in kp.buffers.items()}
    schedule = schedule or {}
    flops = bytes_min = bytes_gathered = atomics = launches = weight_flops = folds = probes = 0
    tiles = rows_computed = tile_weight_bytes = 0
    probes_per_lookup = g.bsearch_probes if kp.pair_index == "bsearch" else {}

    def lookups(vias: Iterable[str]) -> int:  # binary-search reads of one kernel over edge rows
        return sum(probes_per_lookup.get(via, 0) for via in set(vias))

    gemm_rows: dict[str, int] = {}
    for k in kp.kernels:
        if isinstance(k, WeightKernel):
            f, moved, gathered = _fold_cost(k, kp, num_types)
            folds += 1
            weight_flops += f
            flops += f
            bytes_min += moved
            bytes_gathered += gathered
            continue
        launches += 1
        if isinstance(k, GemmKernel):
            n = rows[k.rows]
            gemm_rows[k.name] = n
            flops += n * k.flops_per_row()
            weight_bytes = num_types[k.by] * _param_elems(kp, k.weight) * FLOAT_BYTES
            in_row = width[k.x] * FLOAT_BYTES
            src_rows = n if k.x_via == "row" else rows[kp.buffers[k.x].domain]
            out_bytes = sum(n * width[o] for o, _ in k.epilogue) * FLOAT_BYTES
            if k.out is not None:
                out_bytes += (rows[kp.buffers[k.out].domain] if k.accumulate else n) * width[k.out] * FLOAT_BYTES
            index = 0 if k.x_via == "row" else n * idx_bytes
            bytes_min += min(src_rows, n) * in_row + weight_bytes + out_bytes + index
            bytes_gathered += n * in_row + weight_bytes + out_bytes + index
            if k.accumulate:
                atomics += n * k.out_heads * k.out_dim
            weight_read = _edge_weight_bytes([e for _, e in k.epilogue], n)  # the caller's weights, per call
            bytes_min += weight_read
            bytes_gathered += weight_read
            if k.rows == "edge":
                probes += lookups([k.x_via, *(via for _, e in k.epilogue for _, via in expr_loads(e))])
            t, computed = _gemm_tiles(g, k, schedule)
            tiles += t
            rows_computed += computed
            tile_weight_bytes += t * _param_elems(kp, k.weight) * FLOAT_BYTES
        elif isinstance(k, TraversalKernel):
            e = rows["edge"]
            flops += e * k.flops_per_edge()
            st = k.stage
            loads = {(b, via) for ex in st.exprs() for b, via in expr_loads(ex)}
            vias = {via for _, via in loads if via != "row"} | {"dst"}
            mapping = schedule.get("traversal.mapping", "dst_parallel")
            if getattr(st, "group", "dst") == "dst_rel":  # a softmax per destination pair finds each edge's group:
                vias.add("dst_pair" if mapping == "edge_parallel" else "rel")  # its pair's scratch row / relation
            bytes_min += sum(rows[kp.buffers[b].domain] * width[b] for b, _ in loads) * FLOAT_BYTES
            bytes_gathered += sum(e * width[b] for b, _ in loads) * FLOAT_BYTES
            # each output's rows: edges for a store, destinations (or pairs) for a sum
            out = sum(rows[kp.buffers[o].domain] * width[o] for o in st.outputs()) * FLOAT_BYTES
            index = e * idx_bytes * len(vias)
            weight_read = _edge_weight_bytes(st.exprs(), e)
            bytes_min += out + index + weight_read
            bytes_gathered += out + index + weight_read
            probes += lookups(vias)
            total = st.total if isinstance(st, AggregateStores) else st
            if isinstance(total, (AggregateStage, SoftmaxAggregate)) and mapping == "edge_parallel":
                atomics += e * kp.buffers[total.out].width
        elif isinstance(k, ScatterKernel):
            n = rows[k.rows]
            flops += n * k.flops_per_edge()
            loads = expr_loads(k.message)
            out = rows[kp.buffers[k.out].domain] * width[k.out] * FLOAT_BYTES
            index = n * idx_bytes * (1 + len({via for _, via in loads if via != "row"}))
            index += _edge_weight_bytes([k.message], n)  # (with the caller's weights)
            bytes_min += sum(rows[kp.buffers[b].domain] * width[b] for b, _ in loads) * FLOAT_BYTES + out + index
            bytes_gathered += sum(n * width[b] for b, _ in loads) * FLOAT_BYTES + out + index
            if schedule.get("scatter.mapping", "atomic") == "atomic":
                atomics += n * kp.buffers[k.out].width
            if k.rows == "edge":
                probes += lookups([k.out_via, *(via for _, via in loads)])
        elif isinstance(k, WeightGradKernel):
            n = rows[k.rows]
            flops += n * k.flops_per_row()
            grad_bytes = num_types[k.by] * _param_elems(kp, k.param) * FLOAT_BYTES
            dy_bytes = n * width[k.dy] * FLOAT_BYTES
            in_row = width[k.x] * FLOAT_BYTES if k.x is not None else 0
            src_rows = n if k.x_via == "row" else rows[kp.buffers[k.x].domain] if k.x is not None else 0
            index = 0 if k.x is None or k.x_via == "row" else n * idx_bytes
            bytes_min += min(src_rows, n) * in_row + dy_bytes + grad_bytes + index
            bytes_gathered += n * in_row + dy_bytes + grad_bytes + index
            if k.rows == "edge" and k.x is not None:
                probes += lookups([k.x_via])
        elif isinstance(k, MapKernel):
            n = rows[k.rows]
            flops += n * k.value.flops()
            loads = expr_loads(k.value)
            moved = (sum(n * width[b] for b, _ in loads) + n * width[k.out]) * FLOAT_BYTES
            moved += _edge_weight_bytes([k.value], n)  # the caller's weights
            bytes_min += moved
            bytes_gathered += moved
            if k.rows == "edge":
                probes += lookups(via for _, via in loads)
    saved = sum(rows[kp.buffers[b].domain] * width[b] for b in kp.saved) * FLOAT_BYTES
    backward = len(kp.kernels) - (kp.forward_kernels if kp.is_training else len(kp.kernels))
    return {"flops": int(flops), "bytes_min": int(bytes_min), "bytes_gathered": int(bytes_gathered),
            "saved_bytes": int(saved), "backward_kernels": int(backward),
            "kernels": launches, "atomics": int(atomics), "gemm_rows": gemm_rows,
            "gemm_rows_total": int(sum(gemm_rows.values())), "weight_flops": int(weight_flops),
            "weight_folds": folds, "index_probes": int(probes), "gemm_tiles": int(tiles),
            "gemm_rows_computed": int(rows_computed), "gemm_tile_weight_bytes": int(tile_weight_bytes)}


def _edge_weight_bytes(exprs: Iterable[Any], rows: int) -> int:
    """The bytes a kernel over ``rows`` rows reads of the caller's per-edge weight (a float32 per row where
    an expression reads it; the graph's own constants are not counted, as before the weight existed)."""
    reads = any(isinstance(x, GraphLoad) and x.kind == EDGE_WEIGHT for e in exprs for x in e.walk())
    return rows * FLOAT_BYTES if reads else 0


def _gemm_tiles(g: "GraphCounts", k: GemmKernel, schedule: Mapping[str, Any]) -> tuple[int, int]:
    """(tiles, rows computed) of one GEMM under ``schedule`` (see the module docstring)."""
    per_type = g.rows_per_type(k.rows, k.by, k.weight_end)
    per_type = per_type[per_type > 0]
    tile_rows = schedule.get("gemm.tile_rows")
    if schedule.get("gemm.impl") == "blas" or tile_rows is None:  # a call per type: no tiles, no padding
        return int(per_type.size), int(per_type.sum())
    t = int(((per_type + tile_rows - 1) // tile_rows).sum())
    return t, t * int(tile_rows)


@dataclass(frozen=True)
class GraphCounts:
    """What :func:`count` reads of a graph: rows per domain, types, the binary search's reads and the rows of
    every weight slice. They are the same in every layout and index width (a layout orders rows, it adds or
    drops none), so a graph has one, made from one layout's arrays that are not kept: the cost model counts
    every candidate of a study in the tuning process, and a layout's arrays of a 21M-edge graph are a
    gigabyte each (several layouts' worth held there took the process to 7.6 GB on ogbn-mag)."""

    rows: dict[str, int]
    num_types: dict[str, int]
    bsearch_probes: dict[str, int]
    per_type: dict[tuple[str, str, str | None], np.ndarray]

    def rows_per_type(self, rows: str, by: str, end: str | None) -> np.ndarray:
        """How many of a GEMM's rows each weight slice (type) multiplies."""
        if by == "none":
            return np.array([self.rows[rows]], dtype=np.int64)
        return self.per_type[(rows, by, (end or "dst") if rows == "edge" and by == "ntype" else None)]


def graph_counts(graph: "HeteroGraph") -> GraphCounts:
    """``graph``'s :class:`GraphCounts` (cached on the graph)."""
    cached = graph.__dict__.get("_rgtune_counts")
    if cached is None:
        a = any_graph_arrays(graph)
        keys = [(r, by, None) for r in ("node", "dst_node", "src_pair", "dst_pair") for by in ("ntype", "rel") if
                not (r in ("node", "dst_node") and by == "rel")]
        keys += [("edge", "rel", None), ("edge", "ntype", "src"), ("edge", "ntype", "dst")]
        per_type = {key: np.bincount(row_types(a, *key).numpy(), minlength=1).astype(np.int64) for key in keys}
        cached = GraphCounts({d: a.rows(d) for d in ("node", "dst_node", "edge", "src_pair", "dst_pair")},
                             {"ntype": a.num_ntypes, "rel": a.num_rels, "none": 1}, dict(a.bsearch_probes), per_type)
        graph.__dict__["_rgtune_counts"] = cached
    return cached


def program_flops(program: "Program", graph: "HeteroGraph") -> int:
    """The FLOPs of ``program`` as written, op by op (each op's :meth:`OpRules.flops
    <rgtune.ir.op_rules.OpRules.flops>`) on ``graph``: what the model computes before any schedule; a
    schedule's :func:`count` against it shows what reordering and compaction saved or added (weight
    folds, computed once per call, are the schedule's own).

    Example:
        >>> from rgtune.data.synthetic import random_graph
        >>> from rgtune.ir.models import build_model
        >>> g = random_graph((10, 20), num_relations=2, num_edges=50, seed=0)
        >>> program_flops(build_model("rgcn", 4, 4), g)  # GEMMs 50x4x4x2 and 30x4x(4x2+1), 4 per edge twice, 4 a node
        3200
    """
    rows = graph_counts(graph).rows.__getitem__
    return sum(rules_of(op).flops(op, rows) for op in program.ops)


def _param_elems(kp: KernelProgram, name: str) -> int:
    """Elements of one type's slice of a param (a weight of one relation or node type)."""
    return math.prod(kp.param_shapes[name])


def _fold_cost(k: WeightKernel, kp: KernelProgram, num_types: dict[str, int]) -> tuple[int, int, int]:
    """(FLOPs, minimum bytes, gathered bytes) of one weight fold, as :func:`rgtune.codegen.weights.fold_weights`
    computes it: one output slice per type of the derived param (per relation, in every fold mode)."""
    def slices(name: str) -> int:
        return num_types.get(kp.param_by.get(name, "none"), 1)

    out_slices, a_slice = slices(k.out), _param_elems(kp, k.a)
    out_elems = out_slices * _param_elems(kp, k.out)
    a_elems = slices(k.a) * a_slice
    b_elems = 0 if k.b is None else slices(k.b) * _param_elems(kp, k.b)
    a_gathered = a_elems  # each slice of the source read once ...
    if k.mode in ("transpose", "split_heads", "join_heads"):  # data movement only
        flops = 0
    elif k.mode == "bases":  # per relation, B scaled (Din, Dout) bases summed
        assert k.b is not None
        flops = 2 * out_elems * kp.param_shapes[k.b][-1]
    elif k.mode == "vec":  # per slice (Din, H*D) . (H, D) -> (Din, H)
        flops = 2 * out_slices * a_slice
    elif k.mode in ("compose", "compose_bias"):  # per output element, a length-D dot product
        assert k.b is not None
        flops = 2 * out_elems * kp.param_shapes[k.b][-1]
        a_gathered = out_slices * a_slice  # ... but compose gathers the end node type's slice per relation
    else:
        raise ValueError(f"unknown weight fold mode {k.mode!r}")
    moved = (a_elems + b_elems + out_elems) * FLOAT_BYTES
    return int(flops), int(moved), int((a_gathered + b_elems + out_elems) * FLOAT_BYTES)


