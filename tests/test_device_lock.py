"""The GPU's cross-process lock around verifying and timing a trial (rgtune.tuner.device_lock)."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rgtune._environ import scoped_env
from rgtune.codegen.base import ReferenceBackend
from rgtune.tuner import device_lock as dl
from rgtune.tuner.device_lock import DIR_VARIABLE, ENABLE_VARIABLE, device_lock, lock_enabled, lock_path

TIMEOUT_VARIABLE = "RGTUNE_DEVICE_LOCK_TIMEOUT"

HOLD_S = 1.0  # long enough that a holder started late by a loaded machine still overlaps an unlocked one


def _hold(lock_dir: str, enabled: str, device: str, started: object, out: object) -> None:
    import os

    os.environ[DIR_VARIABLE], os.environ[ENABLE_VARIABLE] = lock_dir, enabled
    started.wait()  # type: ignore[attr-defined]
    asked = time.time()
    with device_lock(device) as waited:
        t0 = time.time()
        time.sleep(HOLD_S)
        t1 = time.time()
    out.put((t0, t1, waited(), asked))  # type: ignore[attr-defined]


def _two_holders(tmp_path: Path, enabled: str, devices: tuple[str, str]) -> list[tuple[float, float, float, float]]:
    """Each holder's (got the lock, let it go, the wait it reports, asked for it), by when it got the lock."""
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


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_two_processes_never_hold_one_device_at_once(tmp_path: Path) -> None:
    first, second = _two_holders(tmp_path, "1", ("cuda:0", "cuda:0"))
    assert _overlap(first, second) <= 0, "the second holder ran while the first held the lock"
    # it says how long it waited (a loaded machine may start it late: then its wait is short, and says so)
    assert second[2] == pytest.approx(second[0] - second[3], abs=0.25), second
    if second[3] < first[1] - 0.3:  # it asked while the first held the lock: it waited until the first let go
        assert second[2] > (first[1] - second[3]) * 0.5, (first, second)


def test_the_lock_is_per_device_and_can_be_turned_off(tmp_path: Path) -> None:
    # any overlap shows that neither waited for the other; a loaded machine may start one holder only after the
    # other let go (no overlap, and nothing to show): only a later holder that asked while the first held and
    # still did not overlap it waited for it
    a, b = _two_holders(tmp_path, "1", ("cuda:0", "cuda:1"))
    assert _overlap(a, b) > 0 or b[3] >= a[1], f"two devices' holders wait for each other: {a}, {b}"
    a, b = _two_holders(tmp_path, "0", ("cuda:0", "cuda:0"))
    assert _overlap(a, b) > 0 or b[3] >= a[1], f"RGTUNE_DEVICE_LOCK=0 still locks: {a}, {b}"


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
    from rgtune.tuner.measure import MeasureOptions, MeasureWorker
    from rgtune.tuner.workload import Workload

    w = Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3", 8, 8, 1, "reference")
    with scoped_env(DIR_VARIABLE, str(tmp_path)), MeasureWorker(w, MeasureOptions(repeats=2, warmup=1)) as worker:
        r = worker.measure({}, seed=0)
    assert r.status == "ok" and r.details.device_wait_s == 0.0
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ where the lock lives, and how it is opened
@pytest.fixture
def default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No RGTUNE_DEVICE_LOCK_DIR: the per-user folder under a runtime folder of this test's own."""
    monkeypatch.delenv(DIR_VARIABLE, raising=False)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime / "rgtune"


def test_the_default_folder_is_private_to_the_user(default_dir: Path) -> None:
    path = lock_path("cuda:0")
    assert path.parent == default_dir
    st = os.lstat(default_dir)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


def test_without_a_runtime_folder_it_is_a_per_user_folder_in_the_temp_dir(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    monkeypatch.delenv(DIR_VARIABLE, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert lock_path("cuda:0").parent == tmp_path / f"rgtune-{os.getuid()}"
    assert stat.S_IMODE(os.lstat(tmp_path / f"rgtune-{os.getuid()}").st_mode) == 0o700


@pytest.mark.parametrize("made_by", ["others can write", "another user", "a symbolic link"])
def test_a_default_folder_someone_else_controls_is_refused(default_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, made_by: str) -> None:
    if made_by == "a symbolic link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        default_dir.symlink_to(tmp_path / "elsewhere")
    else:
        default_dir.mkdir(mode=0o700)
        if made_by == "others can write":
            default_dir.chmod(0o777)
        else:
            monkeypatch.setattr(dl, "_my_uid", lambda: os.getuid() + 1)
    with pytest.raises(dl.DeviceLockError, match=f"{default_dir}.*(written by others|not to you|symbolic link)"
                                                 f".*{DIR_VARIABLE}"):
        with device_lock("cuda:0"):
            pass


def test_a_lock_file_that_is_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    with scoped_env(DIR_VARIABLE, str(tmp_path)):
        lock_path("cuda:0").symlink_to(target)
        with pytest.raises(dl.DeviceLockError, match="symbolic link"):
            with device_lock("cuda:0"):
                pass
    assert not target.exists()


def test_a_held_lock_times_out_naming_the_file_the_holder_and_what_to_do(tmp_path: Path) -> None:
    """Another holder that never lets go (here: this process, through another open file) costs the
    waiter its timeout, then an error that says what to do, instead of a stall."""
    outcome: list[BaseException | float] = []

    def wait() -> None:
        try:
            with device_lock("cuda:0") as waited:
                outcome.append(waited())
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    with scoped_env(DIR_VARIABLE, str(tmp_path)), scoped_env(TIMEOUT_VARIABLE, "0.3"):
        path = lock_path("cuda:0")
        with device_lock("cuda:0"):
            t0 = time.perf_counter()
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            waiter.join(10)
            elapsed = time.perf_counter() - t0
            assert outcome, "the waiter was still waiting 10 s later: no timeout"
        waiter.join(10)
    err = outcome[0]
    assert isinstance(err, dl.DeviceLockTimeout), err
    assert 0.3 <= elapsed < 5
    text = str(err)
    assert str(path) in text and "timeout 0.3 s" in text
    assert f"pid {os.getpid()}" in text and TIMEOUT_VARIABLE in text and "RGTUNE_DEVICE_LOCK=0" in text


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_timeout_names_the_variable(text: str) -> None:
    with scoped_env(TIMEOUT_VARIABLE, text), pytest.raises(ValueError, match=f"{TIMEOUT_VARIABLE}='{text}'"):
        dl.lock_timeout()


# ------------------------------------------------------------------ a timeout costs one trial, not the study
class _NotCpu(str):
    """"cpu" to torch, yet not "cpu" to the worker: a host backend that takes the device's lock."""

    def __eq__(self, other: object) -> bool:
        return False if other == "cpu" else str.__eq__(self, other)

    __hash__ = str.__hash__


class LockedHostBackend(ReferenceBackend):
    """The reference executor, measured as a device backend would be (under the lock of "cpu:0")."""

    name = "locked-host"
    device_type = _NotCpu("cpu")


@pytest.mark.parametrize("setting", ["variable", "half the trial timeout"])
def test_a_lock_timeout_fails_one_trial_with_its_error_and_the_worker_goes_on(tmp_path: Path,
                                                                             setting: str) -> None:
    from rgtune.tuner.measure import MeasureOptions, MeasureWorker
    from rgtune.tuner.workload import Workload

    w = Workload("rgcn", "synthetic:custom,nodes=300,edges=2000,ntypes=2,rels=3", 8, 8, 1,
                 f"{__name__}:LockedHostBackend")
    timeout = "0.5" if setting == "variable" else ""
    opts = MeasureOptions(repeats=2, warmup=1, timeout=4.0)
    with scoped_env(DIR_VARIABLE, str(tmp_path)), scoped_env(TIMEOUT_VARIABLE, timeout), \
            MeasureWorker(w, opts) as worker:
        worker.start()
        with device_lock("cpu:0"):
            t0 = time.perf_counter()
            r: Any = worker.measure({}, seed=0)
            elapsed = time.perf_counter() - t0
        after = worker.measure({}, seed=1)
    assert r.status == "runtime_error", (r.status, r.error)
    assert "DeviceLockTimeout" in r.error and str(tmp_path) in r.error and "RGTUNE_DEVICE_LOCK=0" in r.error
    assert elapsed < 4.0
    assert after.status == "ok" and worker.restarts == 0
