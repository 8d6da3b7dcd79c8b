"""One process at a time runs kernels on a GPU while it verifies and times a trial.

Several tuner workers on one GPU (``tune`` started twice, the PostgreSQL many-workers setup on a
one-GPU host, an experiment running studies side by side) would otherwise time each other's
kernels: CUDA events around a launch measure whatever the GPU did meanwhile, and contexts of
different processes share the GPU by time slices. The expensive parts of a trial run on the host
(generating and compiling kernels, the float64 reference), so the workers hold an exclusive lock
on the device only from the first launch of the trial's kernels to the end of its timing; the
rest overlaps. The time a trial waited for the lock is recorded with it (``device_wait_s``), so
that wall-time comparisons can leave it out.

The lock is an advisory ``flock`` on a file named after the device (CUDA's visible devices and
the current device's index) in ``$RGTUNE_DEVICE_LOCK_DIR`` (default: the system's temporary
directory), so it spans every process of one host and dies with its holder.
``RGTUNE_DEVICE_LOCK=0`` turns it off. CPU backends do not take it: their timing shares the cores
with everything on the machine anyway, lock or not.

Example:
    >>> import tempfile
    >>> from rgtune._environ import scoped_env
    >>> with scoped_env("RGTUNE_DEVICE_LOCK_DIR", tempfile.mkdtemp()):
    ...     with device_lock("cuda:0") as waited:
    ...         waited() >= 0.0
    True
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from rgtune._environ import env_flag

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None  # type: ignore[assignment]

ENABLE_VARIABLE = "RGTUNE_DEVICE_LOCK"
DIR_VARIABLE = "RGTUNE_DEVICE_LOCK_DIR"


def lock_enabled() -> bool:
    """False when ``RGTUNE_DEVICE_LOCK`` is 0/false/off/no, or where ``flock`` does not exist."""
    return env_flag(ENABLE_VARIABLE, default=True) and fcntl is not None


def lock_path(device: str) -> Path:
    """The lock file of ``device`` (a name such as ``cuda:0``; CUDA_VISIBLE_DEVICES is part of it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{device}-visible-{visible}")
    return Path(os.environ.get(DIR_VARIABLE) or tempfile.gettempdir()) / f"rgtune-device-{name}.lock"


@contextlib.contextmanager
def device_lock(device: str | None) -> Iterator[Callable[[], float]]:
    """Hold ``device``'s lock inside the block (None: no lock); yields a function giving the seconds
    waited for it."""
    waited = 0.0
    if device is None or not lock_enabled():
        yield lambda: waited
        return
    path = lock_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    # read-only: flock needs no write access, so a lock file another user created serves too
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        t0 = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        waited = time.perf_counter() - t0
        try:
            yield lambda: waited
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
