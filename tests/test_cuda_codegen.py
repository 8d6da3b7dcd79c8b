"""The CUDA backend without a GPU.

* Every model's every IR-knob combination (default kernel schedule; where that default is
  invalid for the configuration, the one valid traversal mapping) and 200 random valid
  schedules per model (the first 20 of them unless ``RGTUNE_EXHAUSTIVE=1``) compile with NVRTC
  to cubins within the launch limits ptxas reports, for sm_90, and for sm_80 where the code
  differs by architecture (every unit for both in the exhaustive run; :mod:`_nvrtc_ledger`).
  Identical kernels are compiled once; the per-program compile times are printed at the end
  of the module (``-s`` not needed in a one-process run).
* NVRTC failures raise ``CompileError`` with the log and a saved source.
* The generated code has the structure the schedule asks for (atomics only where edges add
  into destinations, warp reductions, vector loads, partitions, index width, ...).
* The generated kernels *run* correctly: on the CPU emulator (``rgtune.codegen.cuda.emulate``)
  against the float64 reference, with poisoned buffers, on edge-case graphs.

The GPU half (real launches, timing) is ``tests/test_cuda_gpu.py``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from typing import Any

import pytest
import torch

from rgtune.codegen.base import BackendError, CompileError, available_backends, create
from rgtune.codegen.cuda import nvrtc
from rgtune.codegen.cuda.backend import CudaBackend
from rgtune.codegen.cuda.generate import InvalidSchedule, generate, micro_tile
from rgtune.codegen.cuda.runtime import balanced_tiles, gemm_segments, gemm_tables, grid_of
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.data.synthetic import random_graph
from rgtune.ir.bind import graph_arrays
from rgtune.codegen.schedule import kernel_schedule
from rgtune.ir.kernels import AggregateStage, EdgeSoftmaxStage, GemmKernel, SoftmaxAggregate, TraversalKernel
from rgtune.ir.models import build_model
from rgtune.search_spaces.space import SearchSpace

from _matrix import sampled
from _nvrtc_ledger import Ledger, ledger  # noqa: F401  (``ledger``: the module's compile ledger, a fixture)

_OK, _WHY = CudaBackend.compile_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"NVRTC unavailable: {_WHY}")

MODELS = ("rgcn", "rgat", "hgt")
RANDOM_SCHEDULES = 200
#: what the default run takes of them: 2,000 new kernels for two architectures cost 5 CPU minutes
SAMPLED_SCHEDULES = 20


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def graph():
    """AIFB (the real workload of the knob space), or a synthetic graph with the same knobs."""
    try:
        from rgtune.data import load_dataset

        return load_dataset("aifb")
    except Exception:  # noqa: BLE001 - no dataset here: the knob space is the same on a synthetic graph
        return random_graph((50, 80, 30), num_relations=12, num_edges=800, seed=0)


def _valid_point(space: SearchSpace, cfg: dict[str, Any]):
    """``cfg`` compiled; where the default traversal mapping is invalid, the edge-parallel one."""
    point = space.compile(cfg)
    if not point.valid:
        cfg = {**cfg, "traversal.mapping": "edge_parallel"}
        point = space.compile(cfg)
    assert point.valid, point.problems
    return cfg, point


# ----------------------------------------------------------------------------- the sweeps
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_ir_configuration_compiles(model: str, graph, ledger: Ledger) -> None:
    space = SearchSpace(build_model(model), graph, "cuda")
    programs = []
    for cfg in space.ir_configs():
        cfg, point = _valid_point(space, cfg)
        programs.append(generate(point.kernels, cfg))
    assert programs
    problems = ledger.compile(f"{model} ir-configs", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
@pytest.mark.parametrize("model,count", sampled(MODELS, SAMPLED_SCHEDULES, RANDOM_SCHEDULES))
def test_random_schedules_compile(model: str, count: int, graph, ledger: Ledger) -> None:
    """``count`` random schedules compile (the default run: the first :data:`SAMPLED_SCHEDULES` of the same draws)."""
    space = SearchSpace(build_model(model), graph, "cuda")
    rng = random.Random(f"cuda-{model}")
    programs = []
    for _ in range(count):
        cfg = space.sample(rng)
        programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = ledger.compile(f"{model} random", programs)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.slow
def test_multi_head_and_odd_sizes_compile(ledger: Ledger) -> None:
    """Guards the default-size sweeps never hit: heads 2, feature sizes not multiples of the tiles."""
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    programs = []
    for model, din, dout, heads in (("hgt", 48, 40, 2), ("rgat", 24, 40, 2), ("rgcn", 20, 12, 1)):
        space = SearchSpace(build_model(model, din, dout, heads), g, "cuda")
        rng = random.Random(model)
        for _ in range(4):
            cfg = space.sample(rng)
            programs.append(generate(space.compile(cfg).kernels, cfg))
    problems = ledger.compile("odd sizes", programs)
    assert not problems, "\n".join(problems[:5])


def test_the_gpu_tests_planted_fault_opens_a_launched_kernel_and_compiles(tmp_path, monkeypatch) -> None:
    """tests/test_cuda_gpu.py's faulting kernel (run only on a GPU): the out-of-bounds write is the first
    statement of the last unit's kernel, before anything that could skip it, and the unit still compiles."""
    from _planted_fault import PLANTED, faulting_rgcn

    monkeypatch.setenv("RGTUNE_KERNEL_CACHE", str(tmp_path))
    kp, units, last = faulting_rgcn()
    assert last == len(units) - 1 and len(units) == len(kp.kernels)  # each unit is one launched kernel
    body = units[last].code.split('extern "C" __global__', 1)[1].split("{", 1)[1]
    assert body.lstrip().startswith(PLANTED.split("{", 1)[0]), body[:200]
    nvrtc.compile_source(units[last].source, "planted.cu", "sm_90")


# ----------------------------------------------------------------------------- compile errors
def test_broken_source_raises_compile_error_with_log_and_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RGTUNE_KERNEL_CACHE", str(tmp_path))
    src = 'extern "C" __global__ void broken(float* y) { y[threadIdx.x] = undefined_name; }\n'
    with pytest.raises(CompileError) as info:
        nvrtc.compile_source(src, "broken.cu", "sm_90")
    err = info.value
    assert "undefined_name" in err.log and "undefined_name" in str(err)
    assert err.source_path and err.source_path in str(err)
    with open(err.source_path) as f:
        assert f.read() == src


def test_cubin_cache_hits_and_ignores_the_ir_header(tmp_path) -> None:
    kp = _kernels("rgcn", {})
    a = CudaBackend().generate(kp, {}).units[0]
    first = nvrtc.compile_source(a.source, "a.cu", "sm_80", a.code, cache=tmp_path)
    renamed = "// another program's name for the same kernel\n" + a.code
    again = nvrtc.compile_source(renamed, "b.cu", "sm_80", a.code, cache=tmp_path)
    assert not first.cached and again.cached and again.data == first.data
    assert first.data[:4] == b"\x7fELF" and first.resources["gemm"].registers > 0


# ----------------------------------------------------------------------------- structure
def _kernels(model: str, cfg: dict[str, Any], dims: tuple[int, int, int] = (64, 64, 1)):
    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    space = SearchSpace(build_model(model, *dims), g, "cuda")
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    return point.kernels


def _reduces_into_destinations(k) -> bool:
    return isinstance(k, TraversalKernel) and isinstance(k.stage, (AggregateStage, EdgeSoftmaxStage))


@pytest.mark.parametrize("model,cfg", [
    ("rgcn", {}),
    ("rgcn", {"reorder.aggregate_first": "on", "traversal.mapping": "edge_parallel"}),
    ("rgat", {"fusion.softmax": "none", "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_src"}),
    ("rgat", {"fusion.softmax": "full", "fusion.epilogue": "on"}),
    ("hgt", {"reorder.aggregate_first": "on", "fusion.softmax": "aggregate"}),
    ("hgt", {"fusion.epilogue": "on", "compact.src": "pair", "traversal.mapping": "edge_parallel",
             "layout.edges": "coo_rel_dst"}),
])
def test_atomics_exactly_where_edges_add_into_destinations(model: str, cfg: dict[str, Any]) -> None:
    kp = _kernels(model, cfg)
    for u in generate(kp, {**cfg}).units:
        k = u.kernel
        mapping = kernel_schedule(k, cfg, "cuda").get("mapping")
        expect = (isinstance(k, GemmKernel) and k.accumulate) or (
            mapping == "edge_parallel" and _reduces_into_destinations(k))
        has = bool(re.search(r"\batomic(Add|Max|Min)\(", u.code))
        assert has == expect, f"{k.describe()}\n{u.code}"


def test_fused_softmax_is_one_warp_per_destination_without_atomics() -> None:
    kp = _kernels("hgt", {"fusion.softmax": "full"}, (64, 64, 2))
    units = [u for u in generate(kp, {}).units if isinstance(u.kernel, TraversalKernel)]
    fused = [u for u in units if isinstance(u.kernel.stage, SoftmaxAggregate)]
    assert len(fused) == 1
    code = fused[0].code
    assert not re.search(r"\batomic\w*\(", code)
    assert "rg_warp_sum" in code and "__shfl_xor_sync" in code  # the score's inner product, warp-reduced
    assert "online softmax" in code and "csr_indptr" in code
    assert code.count('extern "C" __global__') == 1


def test_schedule_shows_in_the_code() -> None:
    kp = _kernels("hgt", {"compact.src": "pair", "compact.pair_index": "bsearch", "layout.index_bits": 64,
                          "fusion.softmax": "full"})
    sched = {"gemm.block_partition": "static", "gemm.tile_rows": 128, "gemm.tile_cols": 64, "gemm.threads": 256,
             "traversal.vector_width": 4}
    prog = generate(kp, sched)
    gemm = next(u for u in prog.units if isinstance(u.kernel, GemmKernel))
    assert "blockIdx.z" in gemm.code and "tile_seg" not in gemm.code
    assert "__launch_bounds__(256)" in gemm.code and "float c[8][4]" in gemm.code  # 128*64/256 outputs
    assert "typedef long long idx_t" in gemm.code
    fused = next(u for u in prog.units if isinstance(u.kernel, TraversalKernel))
    assert "float4" in fused.code and "rg_find_pair" in fused.code and "e_sp" not in fused.code
    balanced = generate(kp, {}).units[0]
    assert "tile_seg[blockIdx.x]" in balanced.code and "blockIdx.z" not in balanced.code


def test_units_are_self_contained_and_named_by_role() -> None:
    kp = _kernels("rgat", {"fusion.epilogue": "on", "traversal.mapping": "edge_parallel",
                           "layout.edges": "coo_rel_dst"})
    for u in generate(kp, {"traversal.mapping": "edge_parallel"}).units:
        for f in u.functions:
            assert f'__global__ void __launch_bounds__' in u.code and f" {f}(" in u.code
        assert u.kernel.name in u.header and u.kernel.name not in u.code
        assert not re.search(r"\bv\d+\b", u.code), "IR value names leak into the code (breaks deduplication)"
        params = re.search(r"\((.*?)\) \{", u.code.split("__global__")[1]).group(1)
        assert [a.cname for a in u.launches[0].args] == [p.split()[-1] for p in params.split(", ")]


def test_same_kernel_in_two_programs_is_one_compile() -> None:
    a = generate(_kernels("rgcn", {"layout.edges": "coo_rel_dst", "traversal.mapping": "edge_parallel"}),
                 {"traversal.mapping": "edge_parallel"})
    b = generate(_kernels("rgcn", {"layout.edges": "coo_rel_src", "traversal.mapping": "edge_parallel"}),
                 {"traversal.mapping": "edge_parallel"})
    assert [u.key for u in a.units] == [u.key for u in b.units]
    assert a.units[2].header != b.units[2].header  # the header still says which layout


def test_invalid_schedule_is_never_compiled() -> None:
    kp = _kernels("rgcn", {"layout.edges": "coo_rel_dst", "traversal.mapping": "edge_parallel"})
    with pytest.raises(InvalidSchedule, match="dst_parallel needs edges grouped by destination"):
        generate(kp, {"traversal.mapping": "dst_parallel"})
    with pytest.raises(InvalidSchedule, match="shared memory|outputs per thread"):
        generate(kp, {"gemm.tile_rows": 128, "gemm.tile_cols": 64, "gemm.threads": 64})


def test_micro_tiles_cover_every_valid_gemm_schedule() -> None:
    for tm in (16, 32, 64, 128):
        for tn in (16, 32, 64):
            for nt in (64, 128, 256):
                if not 1 <= tm * tn / nt <= 64:
                    continue
                rm, rn, tr, tc = micro_tile(tm, tn, nt)
                assert (rm * tr, rn * tc, tr * tc) == (tm, tn, nt) and tc <= 32


# ----------------------------------------------------------------------------- host tables
def test_gemm_segments_and_tiles_match_the_reference_types() -> None:
    g = random_graph((7, 5, 9), num_relations=5, num_edges=120, seed=3, empty_relations=2, isolated_nodes=1)
    a = graph_arrays(g, "coo_rel_src", 32)
    for model, cfg in (("hgt", {}), ("rgcn", {"compact.src": "pair"}), ("rgcn", {"reorder.aggregate_first": "on"})):
        kp = _kernels(model, {**cfg, "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_src"})
        for u in generate(kp, {"traversal.mapping": "edge_parallel"}).units:
            k = u.kernel
            if not isinstance(k, GemmKernel):
                continue
            seg_off, seg_type = gemm_segments(k, a)
            assert int(seg_off[0]) == 0 and int(seg_off[-1]) == a.rows(k.rows)
            tables = gemm_tables(u, a)
            row0, seg = tables["tile_row0"].long(), tables["tile_seg"].long()
            covered = torch.cat([torch.arange(int(r), min(int(r) + 64, int(seg_off[s + 1])))
                                 for r, s in zip(row0, seg)]) if len(row0) else torch.zeros(0)
            assert torch.equal(covered.long(), torch.arange(a.rows(k.rows)))  # every row once, in order
    off = torch.tensor([0, 3, 3, 10])
    assert [t.tolist() for t in balanced_tiles(off, 4)] == [[0, 3, 7], [0, 2, 2]]
    from rgtune.codegen.cuda._unit import Grid

    static = Grid("gemm", "edge", tile_rows=4, col_blocks=2, partition="static")
    assert grid_of(static, {"edge": 10}, {"seg_off": off}) == (2, 2, 3)
    assert grid_of(Grid("items", "edge", 16, 256), {"edge": 100}) == (7, 1, 1)


# ----------------------------------------------------------------------------- backend surface
def test_backend_is_registered_and_explains_why_it_cannot_run() -> None:
    assert "cuda" in available_backends()
    backend = create("cuda")
    ok, why = backend.available()
    info = backend.device_info()
    assert info["nvrtc"] == ".".join(map(str, nvrtc.nvrtc_version()))
    if not ok:
        assert why and why in info["device"]
        with pytest.raises(BackendError, match="cannot run here"):
            backend.build(_kernels("rgcn", {}), random_graph((4, 4), 2, 10, seed=0), {})


def test_graph_replay_is_part_of_the_device_fingerprint(monkeypatch) -> None:
    """Timings with and without CUDA-graph replay are kept apart in the trial database."""
    from rgtune.db import DeviceInfo

    monkeypatch.setenv("RGTUNE_CUDA_GRAPHS", "0")
    assert not CudaBackend().graphs and CudaBackend(graphs=True).graphs
    monkeypatch.setenv("RGTUNE_CUDA_GRAPHS", "maybe")
    with pytest.raises(BackendError, match="RGTUNE_CUDA_GRAPHS.*'maybe'"):
        CudaBackend()
    monkeypatch.delenv("RGTUNE_CUDA_GRAPHS")

    replayed, launched = CudaBackend().device_info(), CudaBackend(graphs=False).device_info()
    assert (replayed["launch"], launched["launch"]) == ("cuda graph", "kernel by kernel")
    assert DeviceInfo.from_mapping(replayed).fingerprint != DeviceInfo.from_mapping(launched).fingerprint


def test_resource_check_rejects_what_cannot_launch() -> None:
    res = nvrtc.Resources(registers=255, shared_bytes=50 * 1024)
    problems = nvrtc.check_resources(res, 512, "f")
    assert any("registers" in p for p in problems) and any("shared memory" in p for p in problems)
    assert nvrtc.check_resources(nvrtc.Resources(registers=64), 256, "f") == []


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not found and home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        found = os.path.join(home, "bin", "nvcc")
    return found


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not on PATH (nor in $CUDA_HOME/bin)")
def test_nvcc_also_accepts_the_generated_code(tmp_path) -> None:
    kp = _kernels("hgt", {"fusion.softmax": "full", "fusion.epilogue": "on", "compact.src": "pair",
                          "compact.pair_index": "bsearch"}, (64, 64, 2))
    prog = generate(kp, {"traversal.vector_width": 2})
    for u in prog.units[:6]:
        src = tmp_path / f"{u.name}.cu"
        src.write_text(u.source)
        proc = subprocess.run([_nvcc(), "-cubin", "-arch=sm_90", "-o", str(tmp_path / f"{u.name}.cubin"), str(src)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- emulated runs
def _edge_case_graph():
    """Empty relations, isolated nodes, a hub destination (in-degree > 32: several lanes' worth)."""
    return random_graph((6, 9, 5), num_relations=4, num_edges=60, seed=1, empty_relations=1, isolated_nodes=1,
                        hub_in_degree=40)


_EMULATED = [
    # (model, in, out, heads, IR knobs + schedule, arch)
    ("rgcn", 24, 40, 1, {"gemm.tile_rows": 16, "gemm.tile_cols": 32, "gemm.tile_k": 32, "gemm.threads": 64,
                         "gemm.block_partition": "static", "traversal.vector_width": 4, "traversal.coarsening": 2},
     "sm_90"),
    ("rgcn", 16, 16, 1, {"reorder.aggregate_first": "on", "layout.edges": "coo_rel_src", "layout.index_bits": 64,
                         "traversal.mapping": "edge_parallel", "traversal.vector_width": 2}, "sm_90"),
    ("rgcn", 16, 16, 1, {"reorder.aggregate_first": "on", "compact.src": "pair", "traversal.threads": 32}, "sm_90"),
    ("rgat", 16, 16, 2, {"fusion.softmax": "none", "fusion.epilogue": "on", "compact.dst": "pair",
                         "gemm.tile_cols": 64, "gemm.threads": 256}, "sm_90"),
    ("rgat", 16, 32, 2, {"fusion.softmax": "none", "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_dst",
                         "compact.src": "pair", "compact.pair_index": "bsearch", "traversal.coarsening": 4}, "sm_80"),
    ("rgat", 16, 16, 1, {"fusion.softmax": "full", "reorder.fold_attention": "on", "traversal.coarsening": 4,
                         "traversal.threads": 256}, "sm_90"),
    ("hgt", 16, 16, 2, {"fusion.softmax": "full", "compact.src": "pair", "compact.pair_index": "bsearch",
                        "traversal.vector_width": 2, "gemm.tile_rows": 128, "gemm.tile_cols": 64,
                        "gemm.threads": 128}, "sm_90"),
    ("hgt", 16, 16, 1, {"reorder.aggregate_first": "on", "fusion.softmax": "aggregate", "fusion.epilogue": "on",
                        "gemm.block_partition": "static"}, "sm_80"),
    ("hgt", 16, 16, 2, {"reorder.attention_side": "dst", "compact.dst": "pair", "fusion.epilogue": "on",
                        "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_dst",
                        "traversal.coarsening": 2}, "sm_80"),
    ("hgt", 16, 16, 1, {"reorder.compose": "on", "layout.index_bits": 64, "traversal.coarsening": 2}, "sm_80"),
]


def _emulate(model: str, din: int, dout: int, heads: int, cfg: dict[str, Any], arch: str, epilogue: str = "auto"):
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    g = _edge_case_graph()
    space = SearchSpace(build_model(model, din, dout, heads), g, "cuda")
    point = space.compile({**space.default(), **cfg})
    assert point.valid, point.problems
    kp = point.kernels
    params = init_params(kp, g, dtype=torch.float64, seed=1)
    x = torch.randn(g.num_nodes(), din, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref = ReferenceExecutor(kp, g).run(x, params)
    units = generate(kp, point.config, epilogue).units
    out = EmulatedProgram(kp, units, g, arch).run(x, params, fill=float("nan"))
    return kp, out, ref


def _needs_cxx() -> None:
    from rgtune.codegen.cuda.emulate import find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")


@pytest.mark.slow
@pytest.mark.parametrize("case", _EMULATED, ids=lambda c: f"{c[0]}-{c[5]}-" + "-".join(
    f"{k.split('.')[-1]}={v}" for k, v in list(c[4].items())[:3]))
def test_emulated_kernels_match_the_float64_reference(case) -> None:
    _needs_cxx()
    model, din, dout, heads, cfg, arch = case
    kp, out, ref = _emulate(model, din, dout, heads, cfg, arch)
    assert not out.isnan().any(), "an output element was never written (buffers were poisoned with NaN)"
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-4, f"relative error {err:.2e}\n{kp.describe()}"


@pytest.mark.slow
def test_emulated_general_epilogue_path() -> None:
    """The GEMM epilogue that reads finished rows back (used when ``acc`` is not only in inner products)."""
    _needs_cxx()
    kp, out, ref = _emulate("hgt", 16, 16, 2, {"fusion.epilogue": "on", "gemm.tile_cols": 16}, "sm_90", "row")
    assert any("epilogue=row" in n for u in generate(kp, {"gemm.tile_cols": 16}, "row").units for n in u.notes)
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert not out.isnan().any() and err < 1e-4, err
