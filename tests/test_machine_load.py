"""How busy the machine was while the tuner timed (rgtune.tuner.machine_load), and the summary that says so;
the speedup printed is the median of the confirmation's paired rounds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from rgtune.db import TrialDatabase
from rgtune.tuner.confirmation import Confirmed
from rgtune.tuner.machine_load import MachineLoad
from rgtune.tuner.measure import MeasureOptions
from rgtune.tuner.study import TuneOptions, Tuner
from rgtune.tuner.workload import Workload

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load is read from /proc (Linux)")

GRAPH = "synthetic:custom,nodes=300,edges=2500,ntypes=2,rels=4,seed=1"
FAST = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=20.0)


@contextmanager
def _cpu_hog() -> Iterator[int]:
    """A process that spins one core, started through a shell that exits at once: it is not this process's
    descendant (its parent is init), so it counts as another process, as a user's other work would."""
    out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    try:
        time.sleep(0.3)  # running before the window opens
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_window_sees_another_process_spinning_a_core_and_not_its_own_work():
    with _cpu_hog():
        load = MachineLoad.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pass  # this process spins too: its own time never counts as another's
        seen = load.stop()
    assert seen is not None and seen.busy and seen.other_cores > 0.6, seen
    assert "cores busy over" in seen.describe()


def test_a_study_beside_a_busy_core_says_the_machine_was_busy(tmp_path, capsys):
    from rgtune.cli.tune import _print_load

    db = TrialDatabase(f"sqlite:///{tmp_path / 'results.db'}")
    opts = TuneOptions(trials=3, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=2,
                       confirm_rounds=3)
    with _cpu_hog():
        s = Tuner(Workload("rgcn", GRAPH, 8, 8, 1, "cpu"), db, opts).run()
    c = s.confirmation
    assert c is not None and c.load is not None and c.load.busy and c.load.other_cores > 0.6
    _print_load(c)
    assert "the machine was busy while the confirmation timed: other processes kept" in capsys.readouterr().out
    # every ok round's time is kept per schedule, and the summary's speedup is the paired one
    assert all(len(rounds) >= 1 for rounds in c.round_ms.values())
    if s.default_confirmed and not s.default_is_best:
        assert s.paired_speedup is not None and s.speedup == s.paired_speedup


def test_the_paired_speedup_is_the_median_of_each_rounds_ratio():
    # the default's rounds 10, 30, 12 ms against the best's 5, 10, 6: ratios 2, 3, 2 -> 2; medians' ratio 12 / 6 = 2
    c = Confirmed(1, 2, 3, 1.0, True, None, {"d": 12.0, "b": 6.0},
                  round_ms={"d": {0: 10.0, 1: 30.0, 2: 12.0}, "b": {0: 5.0, 1: 10.0, 2: 6.0, 3: 1.0}})
    assert c.paired_speedup("d", "b") == 2.0
    assert c.paired_speedup("d", "nope") is None
