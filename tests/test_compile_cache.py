"""The kernel caches on disk (CPU libraries, CUDA cubins): a damaged entry is compiled again, leftover
temporaries are deleted, the size is bounded (rgtune.codegen.kernel_cache and its two users)."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rgtune.codegen.cpu import CpuBackend
from rgtune.codegen.cpu import compiler as cc

LIMIT_VARIABLE = "RGTUNE_KERNEL_CACHE_LIMIT"
SOURCE = "int rg_answer(void) { return 42; }\n"

needs_cc = pytest.mark.skipif(not CpuBackend.available()[0], reason=f"cpu backend: {CpuBackend.available()[1]}")


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh, empty kernel cache for the test, and a process that has loaded no library from it."""
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cc, "_loaded", {})
    return tmp_path / "cache" / "kernels"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


# ------------------------------------------------------------------ CPU libraries
@needs_cc
def test_a_truncated_library_is_compiled_again_and_the_program_runs(cache: Path) -> None:
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.data.synthetic import random_graph
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    kp = compile_program(build_model("rgcn", 8, 8)).kernels
    # compiled, not loaded: damaging a library that this process has mapped would crash it (SIGBUS)
    libraries = cc.compile_libraries([s.text for s in CpuBackend().generate(kp, {}).kernels])
    victim = libraries[0].path
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # a full disk, a crash mid-copy
    again = CpuBackend().build(kp, g, {})
    assert again.info["compiled"] == 1 and not again.cache_hit
    params = init_params(kp, g, seed=0)
    x = torch.randn(g.num_nodes(), 8)
    ref = ReferenceExecutor(kp, g).run(x.double(), {k: v.double() for k, v in params.items()})
    assert float((again.run(x, params) - ref).abs().max()) < 1e-4
    assert cc.compile_library(victim.with_suffix(".c").read_text()).cache_hit  # whole again


@needs_cc
@pytest.mark.parametrize("damage", ["same size, other bytes", "no record", "garbled record"])
def test_a_library_that_does_not_match_its_record_is_compiled_again(cache: Path, damage: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    lib = cc.compile_library(SOURCE)
    record = lib.path.with_name(lib.path.name + ".sum")
    assert record.is_file()
    if damage == "same size, other bytes":
        data = bytearray(lib.path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        lib.path.write_bytes(bytes(data))
    elif damage == "no record":
        record.unlink()
    else:
        record.write_text("{not json")
    with caplog.at_level(logging.INFO, logger="rgtune.codegen"):
        again = cc.compile_library(SOURCE)
    assert not again.cache_hit and again.load().rg_answer() == 42
    assert str(lib.path) in caplog.text and "compiled again" in caplog.text
    assert cc.compile_library(SOURCE).cache_hit


@needs_cc
def test_a_library_deleted_before_it_loads_is_compiled_again(cache: Path) -> None:
    """Another process's eviction between the check and the dlopen costs a compile, not the trial."""
    lib = cc.compile_library(SOURCE)
    lib.path.unlink()
    assert lib.load().rg_answer() == 42
    assert lib.path.is_file()


@needs_cc
def test_leftover_temporaries_are_deleted_when_the_cache_is_opened(cache: Path) -> None:
    cache.mkdir(parents=True)
    dead, mine = _dead_pid(), os.getpid()
    names = {
        f"{'a' * 24}.so.{dead}.0badc0de.tmp": (600, False),  # a compile killed by a trial's timeout
        f"{'b' * 24}.{dead}.0badc0de.so.tmp": (600, False),  # the same, as older versions named it
        f"{'c' * 24}.c.{dead}.0badc0de.tmp": (30, True),  # its writer may have just died: not yet
        f"{'d' * 24}.so.{mine}.0badc0de.tmp": (600, True),  # a live writer (a long compile)
        f"{'e' * 24}.so.{mine}.0badc0de.tmp": (7200, False),  # far too old, whoever wrote it
        "tmpx8e2a1.tmp": (600, False),  # no writer named
    }
    for name, (age, _) in names.items():
        (cache / name).write_bytes(b"partial")
        _age(cache / name, age)
    cc.compile_library(SOURCE)
    left = {p.name for p in cache.iterdir() if p.name.endswith(".tmp")}
    assert left == {n for n, (_, kept) in names.items() if kept}


@needs_cc
def test_the_cache_is_bounded_least_recently_used_first(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.mkdir(parents=True)
    (cache / "compilers.json").write_text("{}")  # not an entry: never evicted
    ages = {"1" * 24: 5000, "2" * 24: 4000, "3" * 24: 3000, "4" * 24: 60}  # seconds since last use
    for key, age in ages.items():
        for suffix, size in ((".so", 40_000), (".c", 2_000), (".so.sum", 90)):
            (cache / f"{key}{suffix}").write_bytes(b"x" * size)
            _age(cache / f"{key}{suffix}", age)
    monkeypatch.setenv(LIMIT_VARIABLE, "100K")
    lib = cc.compile_library(SOURCE)  # the first use of the folder in this process tidies it
    keys = {p.name.split(".")[0] for p in cache.iterdir()}
    # 4 x 42 KB > 100 KiB: the two least recently used go; the one used a minute ago stays whatever the size
    assert keys == {"compilers", "3" * 24, "4" * 24, lib.key}
    assert lib.load().rg_answer() == 42


@needs_cc
def test_a_bad_limit_names_the_variable(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIMIT_VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"{LIMIT_VARIABLE}='lots' is not a size.*2G"):
        cc.compile_library(SOURCE)


def test_an_entry_used_recently_is_never_evicted(tmp_path: Path) -> None:
    from rgtune.codegen import kernel_cache

    for key, age in (("a" * 16, 30), ("b" * 16, 120)):
        (tmp_path / f"{key}.cubin").write_bytes(b"x" * 1000)
        (tmp_path / f"{key}.json").write_text("{}")
        _age(tmp_path / f"{key}.cubin", age)
        _age(tmp_path / f"{key}.json", age)
    done = kernel_cache.sweep(tmp_path, limit=10)
    assert done.evicted == [] and done.size_after == done.size_before > 10
    done = kernel_cache.sweep(tmp_path, limit=10, now=time.time() + kernel_cache.EVICT_IDLE_S - 60)
    assert done.evicted == ["b" * 16]  # the older one; then every entry left was used within the idle time
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a" * 16 + ".cubin", "a" * 16 + ".json"]


def test_a_file_is_flushed_before_its_rename_and_the_folder_after(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from rgtune.codegen import kernel_cache

    events: list[tuple[str, str]] = []
    real_replace = os.replace
    monkeypatch.setattr(kernel_cache, "_fsync_path",
                        lambda path, directory=False: events.append(("fsync", Path(path).name)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", Path(b).name)), real_replace(a, b)))
    kernel_cache.write_atomic(tmp_path / "entry.so", b"code")
    assert [e[0] for e in events] == ["fsync", "rename", "fsync"]
    assert events[0][1].startswith("entry.so.") and events[1][1] == "entry.so" and events[2][1] == tmp_path.name
    assert (tmp_path / "entry.so").read_bytes() == b"code" and len(list(tmp_path.iterdir())) == 1


# ------------------------------------------------------------------ CUDA cubins (NVRTC needs no GPU)
def _nvrtc() -> Any:
    from rgtune.codegen.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # noqa: BLE001 - no CuPy or no NVRTC library here
        pytest.skip(f"NVRTC unavailable: {e}")
    return nvrtc


CU = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 2.0f; }'


@pytest.mark.parametrize("damage", ["same size, other bytes", "truncated", "record of an older version"])
def test_a_damaged_cubin_is_compiled_again(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    import json

    nvrtc = _nvrtc()
    first = nvrtc.compile_source(CU, "k.cu", "sm_80", cache=tmp_path)
    (blob,) = tmp_path.glob("*.cubin")
    meta = blob.with_suffix(".json")
    if damage == "same size, other bytes":
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
    elif damage == "truncated":
        blob.write_bytes(blob.read_bytes()[:100])
    else:
        info = json.loads(meta.read_text())
        del info["sha256"]
        meta.write_text(json.dumps(info))
    with caplog.at_level(logging.INFO, logger="rgtune.codegen"):
        again = nvrtc.compile_source(CU, "k.cu", "sm_80", cache=tmp_path)
    assert not again.cached and again.data == first.data and blob.read_bytes() == first.data
    assert "compiled again" in caplog.text
    hit = nvrtc.compile_source(CU, "k.cu", "sm_80", cache=tmp_path)
    assert hit.cached and hit.data == first.data and hit.resources == first.resources


def test_cubin_temporaries_are_named_by_their_writer_and_cleaned(tmp_path: Path) -> None:
    nvrtc = _nvrtc()
    tmp_path.mkdir(exist_ok=True)
    stale = tmp_path / "tmp3k2j1x.tmp"  # how older versions named theirs
    stale.write_bytes(b"partial")
    _age(stale, 600)
    nvrtc.compile_source(CU, "k.cu", "sm_80", cache=tmp_path)
    assert not stale.exists()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cubin", ".json"]
