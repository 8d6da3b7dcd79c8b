"""The CUDA backend on a GPU: real launches of the generated kernels, checked and timed.

Needs a CUDA GPU, a CUDA build of torch and CuPy (``pip install -e '.[nvrtc]'``); every test
here is skipped, with the reason, anywhere else. Run with::

    python -m pytest tests/test_cuda_gpu.py -q -m gpu -ra

It takes a few minutes (mostly NVRTC; the cubin cache makes a second run faster). What it checks:

* every model, under IR configurations and schedules that together use every template variant
  (and a few random schedules), matches the float64 reference executor on AIFB, MUTAG and
  edge-case synthetic graphs: fp32 output, relative error ``max|out - ref| / max|ref| < 1e-4``;
* every output element is written: buffers are filled with NaN before the run;
* a replayed CUDA graph (the default) computes what kernel-by-kernel launches compute, for new
  inputs, params changed in place and new param tensors; the torch lowering runs on the GPU;
* device facts, resource checks, CUDA-event timing, and that a faulting kernel surfaces as an
  exception (in a child process: a CUDA fault is sticky and poisons its process).

A failure message names the model, graph and configuration; ``rgtune.codegen.cuda.emulate``
runs the same kernels on the CPU to debug them without a GPU.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from rgtune.codegen.cuda.backend import CudaBackend
from rgtune.codegen.cuda.runtime import program_of

_OK, _WHY = CudaBackend.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=f"needs a CUDA GPU with CuPy: {_WHY}")]

REL_TOL = 1e-4
RANDOM_PER_MODEL = 4

# IR knobs + schedule values that, per model, reach every template variant at the default sizes
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "rgcn": [
        {},
        {"gemm.block_partition": "static", "gemm.tile_rows": 16, "gemm.tile_k": 32, "gemm.threads": 64,
         "traversal.vector_width": 4, "traversal.coarsening": 4},
        {"reorder.aggregate_first": "on", "layout.edges": "coo_rel_src", "layout.index_bits": 64,
         "traversal.mapping": "edge_parallel", "traversal.vector_width": 2},
        {"reorder.aggregate_first": "on", "compact.src": "pair", "traversal.threads": 32},
        {"compact.src": "pair", "compact.pair_index": "bsearch", "traversal.mapping": "edge_parallel",
         "traversal.vector_width": 4, "traversal.coarsening": 2, "gemm.tile_rows": 128, "gemm.tile_cols": 64,
         "gemm.threads": 256},
    ],
    "rgat": [
        {},
        {"fusion.softmax": "full"},
        {"fusion.softmax": "none", "fusion.epilogue": "on", "compact.dst": "pair", "gemm.tile_cols": 64,
         "gemm.threads": 256},
        {"fusion.softmax": "none", "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_dst",
         "compact.src": "pair", "compact.pair_index": "bsearch", "traversal.coarsening": 4},
        {"fusion.softmax": "aggregate", "reorder.fold_attention": "on", "traversal.threads": 256,
         "gemm.block_partition": "static"},
    ],
    "hgt": [
        {},
        {"fusion.softmax": "full", "compact.src": "pair", "compact.pair_index": "bsearch",
         "traversal.vector_width": 2, "gemm.tile_rows": 128, "gemm.tile_cols": 64, "gemm.threads": 128},
        {"reorder.aggregate_first": "on", "fusion.softmax": "aggregate", "fusion.epilogue": "on",
         "gemm.block_partition": "static"},
        {"reorder.attention_side": "dst", "compact.dst": "pair", "fusion.epilogue": "on",
         "traversal.mapping": "edge_parallel", "layout.edges": "coo_rel_dst"},
        {"reorder.compose": "on", "layout.index_bits": 64, "traversal.coarsening": 2, "fusion.softmax": "full",
         "traversal.vector_width": 4},
    ],
}


def _graphs() -> dict[str, Any]:
    from rgtune.data.synthetic import random_graph

    out: dict[str, Any] = {}
    for name in ("aifb", "mutag"):
        try:
            from rgtune.data import load_dataset

            out[name] = load_dataset(name)
        except Exception as e:  # noqa: BLE001 - recorded as a skip below
            out[name] = e
    out["edge_cases"] = random_graph((60, 90, 50), num_relations=7, num_edges=900, seed=1, empty_relations=2,
                                     isolated_nodes=3, hub_in_degree=300, degree_skew=1.0)
    out["tiny"] = random_graph((3, 2), num_relations=2, num_edges=5, seed=2)
    return out


@pytest.fixture(scope="module")
def graphs() -> dict[str, Any]:
    return _graphs()


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def _check(backend: CudaBackend, graph: Any, model: str, cfg: dict[str, Any], heads: int = 1,
           dims: tuple[int, int] = (64, 64)) -> float:
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.ir.models import build_model
    from rgtune.search_spaces.space import SearchSpace

    heads = 1 if model == "rgcn" else heads  # no attention heads
    space = SearchSpace(build_model(model, dims[0], dims[1], heads), graph, "cuda")
    point = space.compile({**space.default(), **cfg})
    assert point.valid, f"{model} {cfg}: {point.problems}"
    kp = point.kernels
    params = init_params(kp, graph, dtype=torch.float64, seed=0)
    x = torch.randn(graph.num_nodes(), dims[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = ReferenceExecutor(kp, graph).run(x, params)
    built = backend.build(kp, graph, point.config)
    program = program_of(built)
    dev_params = {k: v.float().cuda() for k, v in params.items()}
    out = program.run(x.float().cuda(), dev_params, fill=float("nan"))
    program.synchronize()
    where = f"{model} heads={heads} on {getattr(graph, 'name', '?')} with {cfg}"
    assert not out.isnan().any(), f"{where}: {int(out.isnan().sum())} output elements never written"
    err = ((out.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert err < REL_TOL, f"{where}: relative error {err:.2e}"
    return err


def _graph_or_skip(graphs: dict[str, Any], name: str) -> Any:
    g = graphs[name]
    if isinstance(g, Exception):
        pytest.skip(f"dataset {name} not available: {str(g).splitlines()[0]}")
    return g


@pytest.mark.parametrize("graph_name", ["aifb", "mutag", "edge_cases", "tiny"])
@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_matches_reference(backend: CudaBackend, graphs: dict[str, Any], model: str, graph_name: str) -> None:
    g = _graph_or_skip(graphs, graph_name)
    for cfg in CONFIGS[model]:
        _check(backend, g, model, cfg)


@pytest.mark.parametrize("model", ["rgat", "hgt"])
def test_matches_reference_with_two_heads(backend: CudaBackend, graphs: dict[str, Any], model: str) -> None:
    for cfg in CONFIGS[model]:
        _check(backend, graphs["edge_cases"], model, cfg, heads=2)
    _check(backend, graphs["edge_cases"], model, CONFIGS[model][2], heads=2, dims=(24, 40))


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_random_schedules_match_reference(backend: CudaBackend, graphs: dict[str, Any], model: str) -> None:
    from rgtune.ir.models import build_model
    from rgtune.search_spaces.space import SearchSpace

    g = graphs["aifb"] if not isinstance(graphs["aifb"], Exception) else graphs["edge_cases"]
    space = SearchSpace(build_model(model), g, "cuda")
    rng = random.Random(f"gpu-{model}")
    for _ in range(RANDOM_PER_MODEL):
        _check(backend, g, model, space.sample(rng))


def test_general_epilogue_path(graphs: dict[str, Any]) -> None:
    """The GEMM epilogue that reads finished rows back from global memory (forced)."""
    _check(CudaBackend(epilogue="row"), graphs["edge_cases"], "hgt", {"fusion.epilogue": "on"}, heads=2)
    _check(CudaBackend(epilogue="row"), graphs["edge_cases"], "rgat", {"fusion.epilogue": "on",
                                                                        "fusion.softmax": "none"})


def test_a_recorded_graph_computes_what_the_launches_compute(backend: CudaBackend, graphs: dict[str, Any]) -> None:
    """Graph replays (the default) against kernel-by-kernel launches: a new input each run, params
    changed in place (seen by the replay), other param tensors (recorded again), and an earlier
    output left as it was."""
    from rgtune.codegen.reference import init_params
    from rgtune.ir.models import build_model
    from rgtune.search_spaces.space import SearchSpace

    g = graphs["edge_cases"]
    for model, cfg in (("hgt", {"reorder.compose": "on", "fusion.softmax": "full"}), ("rgat", {}),
                       ("rgcn", {"reorder.aggregate_first": "on"})):
        heads = 1 if model == "rgcn" else 2
        space = SearchSpace(build_model(model, 32, 32, heads), g, "cuda")
        point = space.compile({**space.default(), **cfg})
        program = program_of(backend.build(point.kernels, g, point.config))
        params = {k: v.cuda() for k, v in init_params(point.kernels, g, seed=3).items()}
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step in range(3):
            if step == 1:
                for t in params.values():
                    t.mul_(1.5)
            if step == 2:
                params = {k: v * 0.5 for k, v in params.items()}
            x = torch.randn(g.num_nodes(), 32, device="cuda")
            replayed = program.run(x, params)
            launched = program.run(x, params, fill=float("nan"))  # fill: kernel by kernel
            program.synchronize()
            assert program.graph_failure is None and program._captured is not None, program.graph_failure
            err = ((replayed - launched).abs().max() / launched.abs().max()).item()
            assert err < 1e-5, f"{model} step {step}: replay differs from the launches by {err:.2e}"
            kept.append((replayed, launched))
        for replayed, launched in kept:  # a later replay does not overwrite what an earlier run returned
            assert ((replayed - launched).abs().max() / launched.abs().max()).item() < 1e-5


def test_the_torch_lowering_runs_on_the_gpu(graphs: dict[str, Any]) -> None:
    """The executor behind a tuned layer's backward (and ``bench``'s lowering) with its arrays on the GPU."""
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = graphs["edge_cases"]
    kp = compile_program(build_model("hgt", 16, 16, 2), {"compact.src": "pair", "reorder.aggregate_first": "on"}).kernels
    params = init_params(kp, g, dtype=torch.float64, seed=1)
    x = torch.randn(g.num_nodes(), 16, dtype=torch.float64)
    on_cpu = ReferenceExecutor(kp, g).run(x, params)
    executor = ReferenceExecutor(kp, g).to("cuda")
    assert executor.device.type == "cuda" and executor.to("cuda") is executor
    on_gpu = executor.run(x.cuda(), {k: v.cuda() for k, v in params.items()})
    assert ((on_gpu.cpu() - on_cpu).abs().max() / on_cpu.abs().max()).item() < 1e-12


def test_device_info_and_resources(backend: CudaBackend, graphs: dict[str, Any]) -> None:
    info = backend.device_info()
    for key in ("device", "compute_capability", "arch", "driver_version", "runtime_version", "runtime", "nvrtc",
                "compiler"):
        assert info.get(key), f"device_info lacks {key}: {info}"
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    kp = compile_program(build_model("hgt")).kernels
    built = backend.build(kp, graphs["edge_cases"], {"gemm.tile_rows": 128, "gemm.tile_cols": 64,
                                                     "gemm.threads": 256})
    assert program_of(built).resource_problems() == []
    json.dumps(built.info)  # the tuner stores it with the trial
    assert built.info["arch"] == info["arch"] and built.sources and built.compile_seconds >= 0


def test_timing_with_cuda_events(backend: CudaBackend, graphs: dict[str, Any]) -> None:
    from rgtune.codegen.cuda.runtime import time_cuda
    from rgtune.codegen.reference import init_params
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = graphs["aifb"] if not isinstance(graphs["aifb"], Exception) else graphs["edge_cases"]
    kp = compile_program(build_model("rgat")).kernels
    built = backend.build(kp, g, {})
    params = {k: v.cuda() for k, v in init_params(kp, g).items()}
    x = torch.randn(g.num_nodes(), 64, device="cuda")
    t = time_cuda(lambda: built.run(x, params), warmup=3, repeat=10)
    assert 0 < t["min_ms"] <= t["median_ms"] and len(t["times_ms"]) == 10
    again = backend.build(kp, g, {})
    assert again.cache_hit and again.source_hash == built.source_hash
    seconds = backend.time_runs(built, x, params, 2, 5)  # what the tuner calls
    assert len(seconds) == 5 and all(0 < s < 10 for s in seconds)


_FAULT_SCRIPT = textwrap.dedent("""
    import json, torch
    from rgtune.codegen.cuda import nvrtc
    from rgtune.codegen.cuda.runtime import CudaProgram, LaunchError, device_arch
    from rgtune.codegen.reference import init_params
    from rgtune.data.synthetic import random_graph
    from _planted_fault import faulting_rgcn
    g = random_graph((50, 50), num_relations=3, num_edges=500, seed=0)
    kp, units, _ = faulting_rgcn()  # the last unit writes far out of bounds first thing (tests/_planted_fault.py)
    arch = device_arch()
    cubins = {u: c[arch] for u, c in nvrtc.compile_program(units, (arch,), cache=False).cubins.items()}
    prog = CudaProgram(kp, units, cubins, g)
    params = {k: v.cuda() for k, v in init_params(kp, g).items()}
    try:
        prog.run(torch.randn(100, 16, device="cuda"), params)
        prog.synchronize()
        print(json.dumps({"raised": None}))
    except LaunchError as e:
        print(json.dumps({"raised": "LaunchError", "message": str(e)}))
""")


def test_a_faulting_kernel_raises_in_its_own_process() -> None:
    """The planted write lands (tests/test_cuda_codegen.py checks, without a GPU, that it is in a launched kernel
    and compiles), and the fault surfaces as a LaunchError that names it sticky."""
    import os
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _FAULT_SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["raised"] == "LaunchError", result
    assert "sticky" in result["message"]


def test_a_gpu_trial_verifies_and_times_under_the_devices_lock(tmp_path: Any) -> None:
    """While another process holds the GPU's lock, a CUDA trial waits for it before its kernels run
    (studies side by side on one GPU never time each other), and records the wait."""
    import threading
    import time

    from rgtune._environ import scoped_env
    from rgtune.tuner.device_lock import DIR_VARIABLE, device_lock
    from rgtune.tuner.measure import MeasureOptions, MeasureWorker
    from rgtune.tuner.workload import Workload

    hold_s = 3.0
    w = Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3", 16, 16, 1, "cuda")
    with scoped_env(DIR_VARIABLE, str(tmp_path)), MeasureWorker(w, MeasureOptions(repeats=3, warmup=1)) as worker:
        first = worker.measure({}, seed=0)  # CUDA context, compile cache: not part of the wait below
        assert first.status == "ok", first.error
        results: list[Any] = []
        with device_lock(f"cuda:{torch.cuda.current_device()}"):
            thread = threading.Thread(target=lambda: results.append(worker.measure({}, seed=1)))
            thread.start()
            time.sleep(hold_s)
        thread.join(120)
    assert results and results[0].status == "ok", results
    assert results[0].details.device_wait_s > hold_s / 3, results[0].details


def test_garbage_collected_during_a_recording_does_not_break_it(backend: CudaBackend, graphs: dict[str, Any]) -> None:
    """An earlier program left in a reference cycle is freed by the collector; were that to happen
    while the next program records its graph, its module's unload would break the recording."""
    import gc
    import warnings

    from rgtune.codegen.reference import init_params
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = graphs["edge_cases"]
    kp = compile_program(build_model("rgcn", 16, 16)).kernels
    params = {k: v.cuda() for k, v in init_params(kp, g).items()}
    x = torch.randn(g.num_nodes(), 16, device="cuda")
    threshold = gc.get_threshold()
    try:
        gc.set_threshold(1)  # a collection at nearly every allocation, the recording's included
        for i in range(4):
            built = backend.build(kp, g, {"traversal.vector_width": 2 ** (i % 3)})
            program = program_of(built)
            program.cycle = program  # garbage only the collector frees, once the next one records
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                built.run(x, params)
            assert program.graphs and program.graph_failure is None, program.graph_failure
            del built, program
    finally:
        gc.set_threshold(*threshold)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_layer_as_called_records_its_cuda_graphs_and_is_the_trials_time(tmp_path: Any, mode: str) -> None:
    """Every model's default and random schedules, as a trial measures them: the kernels verified, then the layer
    as called (forward; in training its backward through autograd) verified and timed, and its time the trial's
    (objective "auto" on a GPU). No recording of a CUDA graph may fail: its warning is kept with the trial."""
    from rgtune._environ import scoped_env
    from rgtune.data import load_dataset
    from rgtune.ir.models import build_model
    from rgtune.search_spaces.space import SearchSpace
    from rgtune.tuner.device_lock import DIR_VARIABLE
    from rgtune.tuner.measure import MeasureOptions, MeasureWorker
    from rgtune.tuner.workload import Workload

    spec = "synthetic:custom,nodes=400,edges=3000,ntypes=3,rels=5,seed=4"
    g = load_dataset(spec)
    with scoped_env(DIR_VARIABLE, str(tmp_path)):
        for model in ("rgcn", "rgat", "hgt"):
            heads = 1 if model == "rgcn" else 2
            space = SearchSpace(build_model(model, 32, 32, heads), g, "cuda", mode=mode)
            rng = random.Random(f"call-{model}-{mode}")
            configs = [{}] + [space.sample(rng) for _ in range(4)]
            with MeasureWorker(Workload(model, spec, 32, 32, heads, "cuda", mode=mode),
                               MeasureOptions(repeats=3, warmup=1)) as worker:
                for i, cfg in enumerate(configs):
                    r = worker.measure(cfg, seed=i)
                    if r.status == "invalid":
                        continue
                    where = f"{model} {mode} {cfg}"
                    assert r.status == "ok", f"{where}: {r.status} {r.error}"
                    d = r.details
                    assert d.call_warnings == [], f"{where}: {d.call_warnings}"
                    assert d.objective == "call" and r.median * 1e3 == pytest.approx(d.call_ms), where
                    assert d.kernel_ms is not None and d.kernel_ms > 0, where
