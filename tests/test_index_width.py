"""32-bit indices on graphs whose per-edge buffers pass 2**31 elements (issue 32, real-size graphs).

ogbn-mag with reverse relations has 42.2M edges: a per-edge buffer at 64 features holds 2.7e9
elements, past ``int32``, while every node and edge *id* still fits one. ``layout.index_bits=32``
stays on offer there (its index arrays halve the index traffic), so every element offset the
kernels compute from an index must be computed in 64 bits. Running such a graph takes more than
8 GiB per buffer, more than a shared test machine has; instead:

* every model's default and random schedules (inference and training, CPU and CUDA) are generated
  with 32-bit indices for a graph reporting ogbn-mag's reverse counts, and the sources are checked
  by :func:`unwidened_products`: no 32-bit index value (an ``idx_t`` variable, an ``idx_t`` array
  element, a CUDA block or thread index) is multiplied before it is widened, except into another
  ``idx_t`` (a row id, bounded by the layout pass's margin);
* the checker itself is tested on snippets that it must flag;
* the C sources compile with the backend's compiler and ``-Wall -Werror``, the CUDA ones (default
  schedules) with NVRTC;
* the graph-size limits: the layout pass offers 32 bits exactly while the counts fit
  (:func:`rgtune.ir.bind.index32_problem`), :func:`graph_arrays` refuses 32-bit arrays that would
  wrap, and a CUDA grid past the device's limits is an error, not a partial launch.
"""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from rgtune.codegen.base import BackendError
from rgtune.codegen.cpu.compiler import find_compiler
from rgtune.codegen.cpu.generate import generate as generate_c
from rgtune.codegen.cuda._unit import Grid
from rgtune.codegen.cuda.generate import generate as generate_cuda
from rgtune.codegen.cuda.runtime import grid_of
from rgtune.data.graph import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.ir.bind import INDEX32_MAX_COUNT, graph_arrays, index32_problem
from rgtune.ir.models import build_model
from rgtune.ir.passes.base import KnobError
from rgtune.ir.passes.layout import LayoutPass
from rgtune.search_spaces.space import SearchSpace

#: ogbn-mag with reverse relations (``synthetic:ogbn-mag,reverse=1``)
MAG_NODES, MAG_EDGES = 1_939_743, 42_182_144
FEATURES = 64
MODELS = ("rgcn", "rgat", "hgt", "film")
RANDOM_SCHEDULES = 6

_WIDE_CASTS = ("(long)", "(long long)", "(int64_t)", "(size_t)", "(unsigned long long)")
_BUILTIN_32 = ("blockIdx", "threadIdx", "blockDim", "gridDim")


# ------------------------------------------------------------------ the checker


def _index_names(source: str) -> tuple[set[str], set[str]]:
    """The ``idx_t`` scalars and the ``idx_t`` arrays (pointers, shared arrays) ``source`` declares."""
    scalars, arrays = set(), set()
    for m in re.finditer(r"\bidx_t\b(\s*\*)?([^;{)]*)", source):
        if m.group(1):  # const idx_t* restrict e_src = ..., const idx_t* __restrict__ e_src
            name = re.findall(r"\w+", m.group(2).replace("__restrict__", "").replace("restrict", ""))
            if name:
                arrays.add(name[0])
            continue
        for decl in _top_level_split(m.group(2)):
            name = re.match(r"\s*(\w+)\s*(\[)?", decl)
            if name:
                (arrays if name.group(2) else scalars).add(name.group(1))
    return scalars, arrays


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside any brackets (one declaration's declarators)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


_CASTS = _WIDE_CASTS + ("(idx_t)",)


def _opening(s: str, close_at: int) -> int:
    """The position of the bracket that the ``)`` or ``]`` at ``close_at`` closes."""
    close = s[close_at]
    open_ = "(" if close == ")" else "["
    depth = 0
    for k in range(close_at, -1, -1):
        depth += s[k] == close
        depth -= s[k] == open_
        if depth == 0:
            return k
    raise ValueError(f"unbalanced {close!r} in {s!r}")


def _left_operand(s: str, end: int) -> tuple[str, str]:
    """The primary expression that ends at ``s[end]`` (an identifier with subscripts, a call, a
    parenthesized group) and the text before it (which may end in a cast)."""
    j = end
    while j > 0 and s[j - 1] in ")]":
        j = _opening(s, j - 1)
        if s[j] == "(":
            if not s[:j].endswith(_CASTS):
                call = re.search(r"[A-Za-z_][\w.]*$", s[:j])
                j = call.start() if call else j
            break
    else:
        name = re.search(r"[\w.]+$", s[:j])
        j = name.start() if name else j
    return s[j:end], s[:j]


def _right_operand(s: str, start: int) -> tuple[str, str]:
    """The cast (if any) and the primary expression that starts at ``s[start]``."""
    cast = next((c for c in _CASTS if s.startswith(c, start)), "")
    i = start + len(cast)
    name = re.match(r"[\w.]*", s[i:])
    i += name.end() if name else 0
    while i < len(s) and s[i] in "([":
        close, depth, k = {"(": ")", "[": "]"}[s[i]], 0, i
        while k < len(s):
            depth += s[k] == s[i]
            depth -= s[k] == close
            if depth == 0:
                break
            k += 1
        i = k + 1
    return cast, s[start + len(cast):i]


def _outer_text(operand: str) -> str:
    """``operand`` without what subscripts and call arguments hold (``G[e_src[rid]]`` -> ``G[]``,
    ``f(rid)`` -> ``f()``): the value of ``x * G[rid]`` is a float, not the index ``rid``."""
    out, depth = [], 0
    for i, ch in enumerate(operand):
        opens = ch == "[" or (ch == "(" and i > 0 and (operand[i - 1].isalnum() or operand[i - 1] == "_"))
        if depth:
            depth += ch in "[("
            depth -= ch in ")]"
            if depth == 0:
                out.append(ch)
            continue
        out.append(ch)
        depth += opens
    return "".join(out)


def _is_index_value(operand: str, scalars: set[str], arrays: set[str]) -> bool:
    """Whether ``operand`` may be a 32-bit index: it reads an ``idx_t`` variable, an element of an
    ``idx_t`` array, an ``idx_t`` function's result, or a CUDA block/thread index (outside any
    subscript or call argument: those are indices of other values)."""
    outer = _outer_text(operand)
    words = set(re.findall(r"[A-Za-z_]\w*", outer))
    elements = set(re.findall(r"([A-Za-z_]\w*)\s*\[", outer))
    return bool(words & scalars or elements & arrays or words & set(_BUILTIN_32))


def unwidened_products(source: str) -> list[str]:
    """The lines of ``source`` (C or CUDA, 32-bit ``idx_t``) that multiply a 32-bit index value
    without widening it first: each is an element offset that wraps past 2**31.

    A product assigned to an ``idx_t`` (a row id: ``row0 = seg_off[seg] + (idx_t)blockIdx.x *
    tile_rows``) is allowed: it stays below the layout pass's limit on counts.

    >>> unwidened_products("const idx_t* restrict e_src = c->e_src;\\nout[e_src[e] * 64 + d] = 1;")
    ['out[e_src[e] * 64 + d] = 1;']
    >>> unwidened_products("const idx_t* restrict e_src = c->e_src;\\nout[(long)(e_src[e]) * 64 + d] = 1;")
    []
    """
    code = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    scalars, arrays = _index_names(code)
    bad = []
    for line in code.splitlines():
        text = line.strip()
        if not text or text.startswith("#") or re.match(r"(const\s+)?idx_t\s+\w+\s*=", text):
            continue
        for m in re.finditer(r"(?<=[\w)\]]) \* (?=[\w(])", text):
            left, before = _left_operand(text, m.start())
            cast_r, right = _right_operand(text, m.end())
            widened = before.endswith(_WIDE_CASTS) or cast_r in _WIDE_CASTS
            left_ix = _is_index_value(left, scalars, arrays) or before.endswith("(idx_t)")
            right_ix = _is_index_value(right, scalars, arrays) or cast_r == "(idx_t)"
            if (left_ix or right_ix) and not widened:
                bad.append(text)
                break
    return bad


@pytest.mark.parametrize("snippet", [
    "const idx_t* restrict e_dst = c->e_dst;\nb0[e_dst[e] * 64 + d] += v;",
    "const idx_t* __restrict__ e_src, float* out) {\n  out[e_src[rid] * 64 + f0] = v;",
    "idx_t rid = -1, xr = -1;\n  x[xr * 32 + k] = 0.0f;",
    "__shared__ idx_t s_rid[64];\n  ep[s_rid[lr] * 2 + h] = v;",
    "  const long long i = blockIdx.x * 256 + threadIdx.x;",
    "const idx_t* restrict order = c->order;\nmemcpy(pack, b0 + order[r] * 64, 256);",
    "idx_t rid = 0;\n  y[(rid + 1) * 16] = 0.0f;",
    "idx_t rid = 0;\n  y[16 * rid] = 0.0f;",
    "const idx_t* restrict node_type = c->node_type;\n  y[node_type[(long)e] * 16] = 0.0f;",
    "idx_t rg_find_pair(const idx_t* n, idx_t r) { return r; }\n  y[rg_find_pair(n, 3) * 16] = 0.0f;",
])
def test_checker_flags_32_bit_offsets(snippet: str) -> None:
    assert unwidened_products(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "const idx_t* restrict e_dst = c->e_dst;\nb0[(long)(e_dst[e]) * 64 + d] += v;",
    "idx_t rid = -1;\n  out[(long)rid * 64 + col] = v;",
    "const idx_t* restrict order = c->order;\nconst float* d = b0 + (int64_t)order[r] * 64;",
    "  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
    "  const idx_t row0 = seg_off[seg] + (idx_t)blockIdx.x * 64;",  # a row id in idx_t: bounded by the margin
    "const int64_t e = 0;\n  y[e * 64] = 0.0f;",  # 64-bit locals are not index values
    "idx_t rid = 0;\n  y[16 * (long)rid] = 0.0f;",
    "idx_t rid = 0;\n  s += (L0.x * G_inv_dst_rel_degree[rid]);",  # a float read at an index
])
def test_checker_accepts_64_bit_offsets(snippet: str) -> None:
    assert unwidened_products(snippet) == [], snippet


# ------------------------------------------------------------------ generated sources


@pytest.fixture(scope="module")
def mag_sized() -> HeteroGraph:
    """A small graph that reports ogbn-mag's reverse counts: knob discovery (32-bit indices offered?)
    sees the real sizes; the sources do not depend on sizes (they are kernel arguments)."""
    g = random_graph((30, 50, 20), num_relations=6, num_edges=400, seed=3)
    g.num_nodes = lambda ntype=None: MAG_NODES  # type: ignore[method-assign]
    g.num_edges = lambda etype=None: MAG_EDGES  # type: ignore[method-assign]
    return g


def test_mag_sized_edge_buffers_pass_int32_and_keep_32_bit_indices(mag_sized: HeteroGraph) -> None:
    assert MAG_EDGES * FEATURES > 2**31  # the case this file is about
    space = SearchSpace(build_model("rgcn", FEATURES, FEATURES), mag_sized, "cpu")
    assert space.knob("layout.index_bits").choices == (32, 64)


def _points(graph: HeteroGraph, target: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """``(label, kernels, config)`` with 32-bit indices: every model's default and random schedules,
    inference and training."""
    for model in MODELS:
        heads = 1 if model in ("rgcn", "film") else 2
        for mode in ("inference", "training"):
            space = SearchSpace(build_model(model, FEATURES, FEATURES, heads), graph, target, mode=mode)
            rng = random.Random(f"{model}-{mode}-{target}")
            configs = [space.default()] + [space.sample(rng) for _ in range(RANDOM_SCHEDULES)]
            for i, cfg in enumerate(configs):
                cfg = {**cfg, "layout.index_bits": 32}
                point = space.compile(cfg)
                if not point.valid:  # the forced width may clash with nothing; a mapping may
                    cfg = {**cfg, "traversal.mapping": "edge_parallel"}
                    point = space.compile(cfg)
                assert point.valid, point.problems
                yield f"{model}/{mode}/{'default' if i == 0 else f'random{i}'}", point.kernels, cfg


@pytest.fixture(scope="module")
def c_sources(mag_sized: HeteroGraph) -> dict[str, str]:
    out = {}
    for label, kp, cfg in _points(mag_sized, "cpu"):
        assert kp.index_bits == 32
        for s in generate_c(kp, cfg, acc_regs=16).kernels:
            out.setdefault(s.text, f"{label}/{s.file}")
    return {name: text for text, name in out.items()}


@pytest.fixture(scope="module")
def cuda_sources(mag_sized: HeteroGraph) -> dict[str, str]:
    out = {}
    for label, kp, cfg in _points(mag_sized, "cuda"):
        assert kp.index_bits == 32
        for u in generate_cuda(kp, cfg).units:
            out.setdefault(u.source, f"{label}/{u.name}.cu")
    return {name: text for text, name in out.items()}


def test_c_offsets_are_64_bit(c_sources: dict[str, str]) -> None:
    assert len(c_sources) > 20 and all("typedef int32_t idx_t;" in t for t in c_sources.values())
    problems = {name: bad for name, text in c_sources.items() if (bad := unwidened_products(text))}
    assert not problems, problems


def test_cuda_offsets_are_64_bit(cuda_sources: dict[str, str]) -> None:
    assert len(cuda_sources) > 20 and all("typedef int idx_t;" in t for t in cuda_sources.values())
    problems = {name: bad for name, text in cuda_sources.items() if (bad := unwidened_products(text))}
    assert not problems, problems


def test_checker_sees_narrowed_real_sources(c_sources: dict[str, str], cuda_sources: dict[str, str]) -> None:
    """The checker is not vacuous on generated code: with the widening casts taken out (and, in C, the
    row locals declared ``idx_t`` as a 32-bit template would), most units are flagged."""
    narrowed_cuda = [t.replace("(long)", "") for t in cuda_sources.values() if "(long)" in t]
    narrowed_c = [t.replace("(long)", "").replace("(int64_t)", "").replace("const int64_t i_", "const idx_t i_")
                  .replace("const int64_t row =", "const idx_t row =") for t in c_sources.values()]
    for narrowed in (narrowed_cuda, narrowed_c):
        flagged = sum(bool(unwidened_products(t)) for t in narrowed)
        assert flagged > len(narrowed) // 2, (flagged, len(narrowed))


@pytest.mark.slow
def test_c_sources_compile_with_all_warnings(c_sources: dict[str, str], tmp_path: Path) -> None:
    try:
        compiler = find_compiler()
    except BackendError as exc:
        pytest.skip(str(exc))
    # the backend's flags (its -march=native decides the vector ABI), every warning an error; syntax only:
    # the backend compiles the same sources for real in tests/test_cpu_backend.py
    flags = [f for f in compiler.flags if f not in ("-shared", "-fPIC")]
    failures = []
    for i, (name, text) in enumerate(sorted(c_sources.items())):
        path = tmp_path / f"k{i}.c"
        path.write_text(text)
        res = subprocess.run([compiler.path, *flags, "-fsyntax-only", "-Wall", "-Werror", str(path)],
                             capture_output=True, text=True)
        if res.returncode:
            failures.append(f"{name}: {res.stderr.strip()[:400]}")
    assert not failures, "\n".join(failures[:5])


@pytest.mark.slow
def test_cuda_sources_compile_with_nvrtc(cuda_sources: dict[str, str], tmp_path: Path) -> None:
    from rgtune.codegen.cuda.backend import CudaBackend

    ok, why = CudaBackend.compile_available()
    if not ok:
        pytest.skip(f"NVRTC unavailable: {why}")
    from rgtune.codegen.cuda import nvrtc

    names = sorted(n for n in cuda_sources if "/default/" in n)  # the random ones: test_cuda_codegen's sweeps
    assert names
    cubins = nvrtc.compile_many([(cuda_sources[n], n.replace("/", "_"), "sm_90", None) for n in names],
                                cache=tmp_path)
    assert all(c.data[:4] == b"\x7fELF" for c in cubins)


# ------------------------------------------------------------------ limits


def _sized(nodes: int, edges: int) -> SimpleNamespace:
    return SimpleNamespace(num_nodes=lambda: nodes, num_edges=lambda: edges, name="sized")


def test_index32_limit_is_at_the_margin() -> None:
    assert index32_problem(INDEX32_MAX_COUNT, INDEX32_MAX_COUNT) is None
    assert "edges" in (index32_problem(5, INDEX32_MAX_COUNT + 1) or "")
    assert "nodes" in (index32_problem(INDEX32_MAX_COUNT + 1, 5) or "")
    # the margin covers the furthest an idx_t loop counter steps past its end: a tile of 128 rows
    assert 2**31 - 1 - INDEX32_MAX_COUNT >= 128


@pytest.mark.parametrize("edges, bits", [(MAG_EDGES, (32, 64)), (INDEX32_MAX_COUNT, (32, 64)),
                                         (INDEX32_MAX_COUNT + 1, (64,)), (2**31 - 1, (64,)), (3 * 2**31, (64,))])
def test_layout_offers_32_bits_while_counts_fit(edges: int, bits: tuple[int, ...]) -> None:
    knob = LayoutPass().knobs(None, _sized(1000, edges))[1]  # type: ignore[arg-type]
    assert knob.name == "layout.index_bits" and knob.choices == bits and knob.default == bits[0]
    if bits == (64,):
        assert str(edges) in knob.doc and "64 only" in knob.doc


def test_too_large_graph_refuses_32_bits_by_name() -> None:
    huge = random_graph((30, 50, 20), num_relations=6, num_edges=400, seed=3)
    huge.num_edges = lambda etype=None: 2**31 + 5  # type: ignore[method-assign]
    space = SearchSpace(build_model("rgcn", 8, 8), huge, "cpu")
    assert space.default()["layout.index_bits"] == 64
    with pytest.raises(KnobError, match=r"layout.index_bits.*\[64\]"):
        space.compile({"layout.index_bits": 32})
    # the arrays themselves: a silent int32 cast would wrap the ids
    with pytest.raises(ValueError, match=r"2147483653 edges exceed .*layout.index_bits=64"):
        graph_arrays(huge, "csr_dst", 32)


def test_grid_past_the_device_limits_is_an_error() -> None:
    assert grid_of(Grid("items", "edge", FEATURES, 128), {"edge": MAG_EDGES}) == (MAG_EDGES * FEATURES // 128, 1, 1)
    assert grid_of(Grid("items", "edge", 1, 1), {"edge": 2**31 - 1}) == (2**31 - 1, 1, 1)
    with pytest.raises(BackendError, match=r"grid.x 2147483648 exceeds 2147483647"):
        grid_of(Grid("items", "edge", 1, 1), {"edge": 2**31})
    with pytest.raises(BackendError, match=r"grid.y 70000 exceeds 65535"):
        grid_of(Grid("chunks", "edge", col_blocks=70000), {"edge": 10}, {"chunk_row0": torch.zeros(3)})
