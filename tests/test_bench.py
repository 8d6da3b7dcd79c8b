"""rgtune.bench at scale: each implementation in a watched process (time and memory limits give "> N s"
and "OOM" rows, not a crash), memory with every run, the float64 check on sampled rows."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from rgtune.bench import bench, format_table, result_json
from rgtune.bench.isolated import run_isolated
from rgtune.bench.layers import (BenchResult, Impl, _program_expectation, check_impl, impl_of, is_out_of_memory,
                                 sampled_error)
from rgtune.bench.baselines import oracle
from rgtune.bench.report import _row_cells
from rgtune.data import load_dataset
from rgtune.data.neighbourhood import sample_destinations
from rgtune.runtime import Layer

GRAPH = "synthetic:custom,nodes=300,edges=2400,ntypes=3,rels=4,seed=5"
QUICK = dict(in_dim=8, out_dim=8, backend="reference", db=None, repeats=1, warmup=0, threads=1)


# ---------------------------------------------------------------------- the watched child
def test_a_child_over_its_time_limit_is_killed_and_a_timeout():
    out = run_isolated([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.3)
    assert out.status == "timeout" and out.result is None and "0.3 s" in out.message
    assert out.seconds < 10  # killed, not waited for


def test_a_child_over_its_memory_limit_is_killed_and_oom():
    # 200 MB written (a repeated byte: every page touched), against a limit of 60 MB
    code = "import time; b = b'x' * (200 * 10**6); time.sleep(60)"
    out = run_isolated([sys.executable, "-c", code], timeout=30, memory_limit_gb=0.06)
    assert out.status == "oom" and "0.06 GB" in out.message and out.seconds < 20


def test_a_child_killed_by_the_kernel_is_oom_and_one_that_fails_is_failed():
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run_isolated([sys.executable, "-c", kill], timeout=30).status == "oom"  # the OOM killer's signal
    out = run_isolated([sys.executable, "-c", "raise SystemExit('broken layer')"], timeout=30)
    assert (out.status, out.message) == ("failed", "broken layer")
    ok = run_isolated([sys.executable, "-c", "print('rgtune-bench-result ' + '{\"status\": \"ok\", \"x\": 1}')"],
                      timeout=30)
    assert ok.status == "ok" and ok.result == {"status": "ok", "x": 1}


def test_a_child_stopped_in_its_training_step_keeps_its_forward():
    done = {"status": "ok", "name": "a slow layer", "times": {"fwd": [0.002, 0.004], "fwd+bwd": []},
            "peak_mb": {"fwd": 12.0}}
    code = f"import time; print('rgtune-bench-result ' + {json.dumps(json.dumps(done))}, flush=True); time.sleep(60)"
    out = run_isolated([sys.executable, "-c", code], timeout=2)
    assert out.status == "timeout" and out.result == done
    impl = impl_of("torch", out.status, out.result, out.message, 2)
    res = bench_result([impl])
    line = format_table(res).splitlines()[2]
    assert line.startswith("a slow layer") and line.split()[3:5] == ["3", "–"] and line.count("> 2 s") == 2
    assert _row_cells(res)[0][5:8] == ["– / – / 3 / – / –", "– / – / > 2 s / – / –", "– / – / > 2 s / – / –"]


def bench_result(impls: list[Impl]) -> BenchResult:
    return BenchResult("rgcn", "aifb", 8, 8, 1, "cpu", "default", 1, 2, impls, {"cpu": "x", "cores": 2, "threads": 1},
                       {}, "rgtune bench", "2026-11-26", memory_limit_gb=1.0, impl_timeout_s=2)


def test_allocation_errors_count_as_out_of_memory():
    with pytest.raises(RuntimeError) as caught:  # torch's CPU allocator refuses at once: nothing is touched
        torch.empty(2 ** 60, dtype=torch.uint8)
    assert is_out_of_memory(caught.value) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


# ---------------------------------------------------------------------- rows of the bench
def test_bench_rows_say_oom_and_over_time_instead_of_times():
    oom = bench("rgcn", GRAPH, impls=("rgtune", "torch"), memory_limit_gb=0.05, **QUICK)  # torch alone is more
    assert [(i.key, i.status) for i in oom.impls] == [("rgtune", "oom"), ("torch", "oom")]
    table = format_table(oom)
    assert table.count("OOM") == 8 and "0.05 GB" in table  # per row: both modes' times and peaks
    main, _ = _row_cells(oom)
    assert main[5] == "OOM / – / OOM / – / –" and main[7] == "OOM / – / OOM / – / –"
    slow = bench("rgcn", GRAPH, impls=("torch",), impl_timeout=0.5, **QUICK)  # its imports alone take longer
    (impl,) = slow.impls
    assert impl.status == "timeout" and impl.times == {"fwd": [], "fwd+bwd": []}
    assert "> 0.5 s" in format_table(slow) and _row_cells(slow)[0][6] == "– / – / > 0.5 s / – / –"
    assert json.loads(json.dumps(result_json(slow)))["impls"]["torch"]["status"] == "timeout"


def test_bench_measures_memory_and_checks_sampled_rows_in_every_process():
    pytest.importorskip("torch_geometric")
    res = bench("hgt", GRAPH, impls=("rgtune", "pyg"), sample_above=0, check_rows=24, **QUICK)
    by = {i.key: i for i in res.impls}
    assert by["rgtune"].status == "ok" and by["rgtune"].error < 1e-5
    assert set(by["rgtune"].peak_mb) == {"fwd", "fwd+bwd"}  # without --memory
    assert by["rgtune"].checked["sampled"] and by["rgtune"].checked["rows"] >= 24
    # PyG's output leaves node types that no relation points to out: the rows are matched by node id
    assert by["pyg"].status == "ok" and by["pyg"].problem is None and by["pyg"].error < 1e-5
    assert 0 < by["pyg"].checked["rows"] <= by["rgtune"].checked["rows"]
    assert "sampled" in format_table(res)


# ---------------------------------------------------------------------- the sampled check
@pytest.fixture(scope="module")
def layer() -> Layer:
    torch.manual_seed(0)
    return Layer("rgcn", load_dataset(GRAPH), 8, 8, backend="reference")


def test_the_sampled_check_catches_a_wrong_row_it_samples_and_only_checks_the_sample(layer):
    x = torch.randn(layer.graph.num_nodes(), 8)
    right = oracle(layer)(x.double()).float()
    err, checked = sampled_error(right, None, _program_expectation, layer, x, rows=16, seed=3)
    assert err < 1e-6 and checked["sampled"] and checked["rows"] == 16
    sampled = sample_destinations(layer.graph, 16, seed=3)
    outside = next(v for v in range(layer.graph.num_nodes()) if v not in set(sampled.tolist()))
    for row, caught in ((int(sampled[5]), True), (outside, False)):
        wrong = right.clone()
        wrong[row] += 1.0
        err, _ = sampled_error(wrong, None, _program_expectation, layer, x, rows=16, seed=3)
        assert (err > 1e-3) is caught, (row, err)


def test_check_impl_samples_only_above_the_threshold(layer):
    x = torch.randn(layer.graph.num_nodes(), 8)
    wrong_out = oracle(layer)(x.double()).float()
    wrong_out[int(torch.bincount(layer.graph.dst).argmax())] *= 2  # the biggest hub: always sampled
    impl = Impl("fake", "a fake layer", lambda _x: wrong_out, expectation=_program_expectation)
    check_impl(impl, layer, x, sample_above=layer.graph.num_edges(), rows=16)
    assert impl.checked == {"rows": layer.graph.num_nodes()} and impl.error > 1e-3
    check_impl(impl, layer, x, sample_above=0, rows=16)
    assert impl.checked["sampled"] and impl.checked["rows"] == 16 and impl.error > 1e-3
