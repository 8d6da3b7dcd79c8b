"""The GPU's cross-process lock around verifying and timing a trial (rgtune.tuner.device_lock)."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from rgtune._environ import scoped_env
from rgtune.tuner.device_lock import DIR_VARIABLE, ENABLE_VARIABLE, device_lock, lock_enabled, lock_path

HOLD_S = 0.4


def _hold(lock_dir: str, enabled: str, device: str, started: object, out: object) -> None:
    import os

    os.environ[DIR_VARIABLE], os.environ[ENABLE_VARIABLE] = lock_dir, enabled
    started.wait()  # type: ignore[attr-defined]
    with device_lock(device) as waited:
        t0 = time.time()
        time.sleep(HOLD_S)
        t1 = time.time()
    out.put((t0, t1, waited()))  # type: ignore[attr-defined]


def _two_holders(tmp_path: Path, enabled: str, devices: tuple[str, str]) -> list[tuple[float, float, float]]:
    ctx = mp.get_context("spawn")
    started, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), enabled, d, started, out)) for d in devices]
    for p in procs:
        p.start()
    time.sleep(1.0)  # both children imported and waiting
    started.set()
    results = sorted(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(10)
    return results


def _overlap(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_two_processes_never_hold_one_device_at_once(tmp_path: Path) -> None:
    first, second = _two_holders(tmp_path, "1", ("cuda:0", "cuda:0"))
    assert _overlap(first, second) <= 0, "the second holder ran while the first held the lock"
    assert second[2] > HOLD_S / 2, "the second holder waited and says so"


def test_the_lock_is_per_device_and_can_be_turned_off(tmp_path: Path) -> None:
    a, b = _two_holders(tmp_path, "1", ("cuda:0", "cuda:1"))
    assert _overlap(a, b) > HOLD_S / 2, "two devices' holders do not wait for each other"
    a, b = _two_holders(tmp_path, "0", ("cuda:0", "cuda:0"))
    assert _overlap(a, b) > HOLD_S / 2, "RGTUNE_DEVICE_LOCK=0: no lock"


def test_no_device_means_no_lock_and_no_file(tmp_path: Path) -> None:
    with scoped_env(DIR_VARIABLE, str(tmp_path)):
        with device_lock(None) as waited:
            assert waited() == 0.0
    assert not list(tmp_path.iterdir())


def test_lock_file_names_the_visible_devices(tmp_path: Path) -> None:
    with scoped_env(DIR_VARIABLE, str(tmp_path)), scoped_env("CUDA_VISIBLE_DEVICES", "2,3"):
        path = lock_path("cuda:0")
    assert path.parent == tmp_path and "cuda_0" in path.name and "2_3" in path.name


def test_a_bad_setting_names_the_choices() -> None:
    with scoped_env(ENABLE_VARIABLE, "maybe"), pytest.raises(ValueError, match="give 1 .* or 0"):
        lock_enabled()


def test_a_cpu_trial_takes_no_lock(tmp_path: Path) -> None:
    from rgtune.tuner.measure import MeasureOptions, MeasureWorker, Workload

    w = Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3", 8, 8, 1, "reference")
    with scoped_env(DIR_VARIABLE, str(tmp_path)), MeasureWorker(w, MeasureOptions(repeats=2, warmup=1)) as worker:
        r = worker.measure({}, seed=0)
    assert r.status == "ok" and "device_wait_s" not in r.info
    assert not list(tmp_path.iterdir())
