"""The floor of a schedule (rgtune.ir.roofline): its minimum bytes and FLOPs against a device's bandwidth and
FLOP rate, in ``rgtune show`` and in the bench's rgtune row."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from rgtune.bench import bench, format_table, result_json
from rgtune.bench.layers import BenchResult, Impl
from rgtune.bench.report import _MAIN_HEADER, _MAIN_HEADER_V2, BEGIN, END, _md_row, _row_cells, write_benchmarks
from rgtune.cli import main
from rgtune.data import load_dataset
from rgtune.ir.counts import count
from rgtune.ir.registry import build_model
from rgtune.ir.roofline import (BANDWIDTH_ENV, FLOPS_ENV, GPU_PEAKS, DevicePeak, cpu_peak, device_peak, floor_ms,
                                floor_terms, fraction_of_floor, gpu_peak, measure_cpu, peak_by_name)
from rgtune.search_spaces import SearchSpace

GRAPH = "synthetic:custom,nodes=120,edges=700,ntypes=2,rels=3,seed=2"
#: a CPU of given figures: 10 GB/s, 100 GFLOP/s (so no test depends on this machine's speed)
FIXED = {BANDWIDTH_ENV: "10", FLOPS_ENV: "100"}


@pytest.fixture
def fixed_cpu(monkeypatch: pytest.MonkeyPatch) -> DevicePeak:
    for name, value in FIXED.items():
        monkeypatch.setenv(name, value)
    return cpu_peak()


# ---------------------------------------------------------------------- the formula
def test_the_floor_is_the_slower_of_moving_the_bytes_and_computing_the_flops():
    peak = DevicePeak("made up", bandwidth=2e9, flop_rate=8e9, source="hand-made")
    assert floor_terms({"bytes_min": 4e6, "flops": 8e6}, peak) == (2.0, 1.0)
    assert floor_ms({"bytes_min": 4e6, "flops": 8e6}, peak) == (2.0, "memory")
    assert floor_ms({"bytes_min": 4e6, "flops": 32e6}, peak) == (4.0, "compute")
    assert floor_ms({"bytes_min": 4e6, "flops": 16e6}, peak) == (2.0, "memory")  # a tie: the bytes
    assert floor_ms({"bytes_min": 0, "flops": 0}, peak) == (0.0, "memory")
    assert fraction_of_floor(2.0, 8.0) == 0.25
    with pytest.raises(ValueError, match="> 0"):
        fraction_of_floor(2.0, 0.0)


def test_a_16_bit_schedule_moves_fewer_bytes_so_its_floor_is_lower():
    graph = load_dataset(GRAPH)
    floors = {}
    for precision in ("fp32", "bf16"):
        space = SearchSpace(build_model("rgat", 16, 16), graph, "cpu", precision=precision)
        config = space.default()
        floors[precision] = floor_ms(count(space.compile(config).kernels, graph, config), GPU_PEAKS["h100-sxm"])
    assert floors["bf16"][1] == floors["fp32"][1] == "memory"
    assert floors["bf16"][0] < floors["fp32"][0]


# ---------------------------------------------------------------------- the devices
@pytest.mark.parametrize("torch_name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200-nvl"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-sxm")])
def test_a_gpu_is_found_by_the_name_torch_reports(torch_name, key):
    assert gpu_peak(torch_name) is GPU_PEAKS[key]


def test_the_datasheet_figures_and_the_names_peak_takes():
    h100, h200, a100 = peak_by_name("h100"), peak_by_name("H200"), peak_by_name("a100")
    assert (h100.bandwidth, h100.flop_rate) == (3.35e12, 67e12)
    assert (h200.bandwidth, h200.flop_rate) == (4.8e12, 67e12)
    assert (a100.bandwidth, a100.flop_rate) == (2.039e12, 19.5e12)
    assert all("datasheet" in p.source for p in GPU_PEAKS.values())
    assert gpu_peak("Tesla V100-SXM2-16GB") is None
    with pytest.raises(ValueError, match=r"unknown device peak 'v100'; choose from cpu, h100-sxm, .*h200"):
        peak_by_name("v100")


def test_cuda_without_a_visible_gpu_is_an_h100_with_a_note():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the floor is its own")
    peak, note = device_peak("cuda")
    assert peak is GPU_PEAKS["h100-sxm"] and "no GPU visible" in note and "--peak" in note
    assert device_peak("cuda", "a100") == (GPU_PEAKS["a100-sxm-80gb"], None)


def test_the_cpu_is_measured_once_per_process_and_thread_count():
    measured = measure_cpu(1)
    assert set(measured) == {"bandwidth", "flop_rate"}
    assert all(math.isfinite(v) and v > 0 for v in measured.values())
    assert measure_cpu(1) is measured  # cached: a second call measures nothing
    peak = cpu_peak(threads=1)
    assert (peak.bandwidth, peak.flop_rate, peak.threads) == (measured["bandwidth"], measured["flop_rate"], 1)
    assert "measured" in peak.source and "1 thread)" in peak.describe()


def test_the_cpu_figures_can_be_given(fixed_cpu, monkeypatch):
    assert (fixed_cpu.bandwidth, fixed_cpu.flop_rate) == (10e9, 100e9)
    assert fixed_cpu.source == f"bandwidth from ${BANDWIDTH_ENV}, FLOP rate from ${FLOPS_ENV}"
    given = cpu_peak(bandwidth=5e9, flop_rate=7e9)  # arguments before the environment
    assert (given.bandwidth, given.flop_rate, given.source) == (5e9, 7e9, "bandwidth given, FLOP rate given")
    assert device_peak("cpu") == (fixed_cpu, None)
    monkeypatch.setenv(FLOPS_ENV, "-3")
    with pytest.raises(ValueError, match=f"{FLOPS_ENV}='-3': expected a positive number"):
        cpu_peak()


# ---------------------------------------------------------------------- rgtune show
def test_show_prints_the_floor_on_the_backends_device(fixed_cpu, capsys):
    args = ["show", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "# floor: " in out and f"  peak            {fixed_cpu.describe()}" in out
    graph = load_dataset(GRAPH)
    space = SearchSpace(build_model("rgcn", 8, 8), graph, "cpu")
    ms, bound = floor_ms(count(space.compile(space.default()).kernels, graph, space.default()), fixed_cpu)
    assert f"  floor           {ms:.3g} ms, {bound}-bound" in out

    assert main([*args, "--backend", "cuda", "--peak", "h200"]) == 0
    out = capsys.readouterr().out
    assert "H200 SXM: 4,800 GB/s, 67 TFLOP/s float32 (NVIDIA H200 Tensor Core GPU datasheet)" in out
    assert "no GPU visible" not in out
    if not torch.cuda.is_available():
        assert main([*args, "--backend", "cuda"]) == 0
        assert "note            no GPU visible here: the floor is an H100 SXM's" in capsys.readouterr().out


def test_show_refuses_an_unknown_peak_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["show", "--model", "rgcn", "--dataset", GRAPH, "--peak", "v100"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown device 'v100'; choose from auto, cpu, h100-sxm" in err and "Traceback" not in err


# ---------------------------------------------------------------------- the bench
def test_the_bench_row_of_rgtune_carries_its_floor_and_the_share_reached(fixed_cpu):
    res = bench("rgcn", GRAPH, in_dim=8, out_dim=8, backend="reference", db=None, impls=("rgtune", "torch"),
                repeats=2, warmup=0, threads=1)
    assert res.peak == cpu_peak(threads=1) and res.peak_note is None  # the given figures, the bench's threads
    mine, torch_row = res.impls
    assert set(mine.counts) == {"fwd", "fwd+bwd"} and not torch_row.counts
    assert mine.counts["fwd+bwd"]["flops"] > mine.counts["fwd"]["flops"]  # the step's program: forward and backward
    for mode in ("fwd", "fwd+bwd"):
        ms, bound, fraction = mine.floor(mode, res.peak)
        assert (ms, bound) == floor_ms(mine.counts[mode], res.peak)
        assert fraction == pytest.approx(ms / mine.median_ms(mode))
    table = format_table(res)
    assert "floor of rgtune's schedules: fwd " in table and "% reached" in table and res.peak.describe() in table
    main_cells, env_cells = _row_cells(res)
    assert re.fullmatch(r"\S+ (mem|com) \(\S+%\) / \S+ (mem|com) \(\S+%\)", main_cells[8])
    assert "floor at CPU" in env_cells[4]
    js = json.loads(json.dumps(result_json(res)))
    assert js["peak"]["bandwidth"] == 10e9 and js["impls"]["rgtune"]["floor"]["fwd"]["bound"] in ("memory", "compute")
    assert js["impls"]["torch"]["floor"] == {"fwd": None, "fwd+bwd": None}


def test_bench_rows_written_before_the_floor_column_are_kept(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    old_row = ["hgt", "aifb", "64→64", "cuda", "trial 3", "1 / 2 / 3 / 4 / –", "5 / 6 / 7 / 8 / –",
               "9 / – / – / – / –", "16", "2026-11-24"]
    md.write_text(f"intro\n\n{BEGIN}\n{_md_row(_MAIN_HEADER_V2)}\n|---|\n{_md_row(old_row)}\n{END}\n")
    impl = Impl("rgtune", "rgtune tuned", None, counts={"fwd": {"bytes_min": 10**6, "flops": 10**6}})
    impl.times = {"fwd": [1e-3], "fwd+bwd": [2e-3]}
    res = BenchResult("rgcn", "aifb", 64, 64, 1, "cpu", "default", 2, 1, [impl], {"cpu": "x", "cores": 2, "threads": 2},
                      {}, "rgtune bench", "2026-11-26", peak=DevicePeak("a CPU", 1e10, 1e11, "given"))
    write_benchmarks(md, res)
    lines = md.read_text().splitlines()
    assert _md_row(_MAIN_HEADER) in lines and _md_row(_MAIN_HEADER_V2) not in lines
    assert next(ln for ln in lines if ln.startswith("| hgt |")) == _md_row(old_row[:8] + ["– / –"] + old_row[8:])
    assert "| 0.1 mem (10%) / – |" in next(ln for ln in lines if ln.startswith("| rgcn |"))
