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
the current device's index), so it spans every process of one host and dies with its holder.

* Where: ``$RGTUNE_DEVICE_LOCK_DIR`` if set (a folder you choose, e.g. one a group of users shares
  on purpose), else a per-user folder, ``$XDG_RUNTIME_DIR/rgtune`` or ``<temp dir>/rgtune-<uid>``.
  The per-user folder is created with mode 0700 and used only while it is a real folder owned by
  this user that nobody else can write to: a folder at a predictable path in ``/tmp`` that someone
  else made, or made writable, is refused with a message (otherwise another local user could hold
  the lock, or swap the file, and stall every GPU trial). The file is opened without following a
  symbolic link and must be a regular file.
* How long: a trial waits at most ``$RGTUNE_DEVICE_LOCK_TIMEOUT`` seconds (default
  :data:`DEFAULT_TIMEOUT_S`; the tuner's worker uses half its trial timeout instead, unless the
  variable is set; ``inf`` waits for ever), then :class:`DeviceLockTimeout` names the file, the
  wait and the process that holds it: one trial fails with that error, the study goes on.
* ``RGTUNE_DEVICE_LOCK=0`` turns it off. CPU backends do not take it: their timing shares the
  cores with everything on the machine anyway, lock or not.

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
import math
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from rgtune._environ import env_flag

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["DeviceLockError", "DeviceLockTimeout", "device_lock", "lock_dir", "lock_enabled", "lock_path",
           "lock_timeout", "DEFAULT_TIMEOUT_S"]

ENABLE_VARIABLE = "RGTUNE_DEVICE_LOCK"
DIR_VARIABLE = "RGTUNE_DEVICE_LOCK_DIR"
TIMEOUT_VARIABLE = "RGTUNE_DEVICE_LOCK_TIMEOUT"
#: seconds a caller that names no timeout waits for the lock (a trial holds it while it verifies and times)
DEFAULT_TIMEOUT_S = 300.0
_POLL_S = (0.005, 0.1)  # the first and the longest sleep between tries


class DeviceLockError(RuntimeError):
    """The lock's folder or file is not safe to use (someone else's, writable by others, a link)."""


class DeviceLockTimeout(TimeoutError):
    """Another process held the device's lock for longer than the timeout."""


def lock_enabled() -> bool:
    """False when ``RGTUNE_DEVICE_LOCK`` is 0/false/off/no, or where ``flock`` does not exist."""
    return env_flag(ENABLE_VARIABLE, default=True) and fcntl is not None


def lock_timeout(default: float | None = None) -> float:
    """Seconds to wait for the lock: ``$RGTUNE_DEVICE_LOCK_TIMEOUT`` if set, else ``default``, else
    :data:`DEFAULT_TIMEOUT_S`.

    Example:
        >>> from rgtune._environ import scoped_env
        >>> with scoped_env("RGTUNE_DEVICE_LOCK_TIMEOUT", "inf"):
        ...     lock_timeout(30.0)
        inf
        >>> lock_timeout(30.0)
        30.0
    """
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S if default is None else float(default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r}: give the seconds to wait for the GPU's lock "
                         f"(a number >= 0, or inf to wait for ever)")
    return value


def _my_uid() -> int:
    return os.getuid()


def _default_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "rgtune"
    return Path(tempfile.gettempdir()) / f"rgtune-{_my_uid()}"


def lock_dir() -> Path:
    """The folder of the lock files: ``$RGTUNE_DEVICE_LOCK_DIR`` as given, else the per-user folder,
    created (mode 0700) and checked (:class:`DeviceLockError` when it is not safe)."""
    chosen = os.environ.get(DIR_VARIABLE)
    if chosen:
        folder = Path(chosen).expanduser()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder
    folder = _default_dir()
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    _check_private(folder)
    return folder


def _check_private(folder: Path) -> None:
    st = os.lstat(folder)
    problem = ""
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder"
    elif st.st_uid != _my_uid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {_my_uid()})"
    elif st.st_mode & 0o022:
        problem = f"can be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise DeviceLockError(
            f"the GPU lock folder {folder} {problem}, so another user could hold or replace its lock; "
            f"remove it (rgtune recreates it with mode 0700) or set {DIR_VARIABLE} to a folder of yours")


def lock_path(device: str) -> Path:
    """The lock file of ``device`` (a name such as ``cuda:0``; CUDA_VISIBLE_DEVICES is part of it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{device}-visible-{visible}")
    return lock_dir() / f"rgtune-device-{name}.lock"


def _open_lock_file(path: Path) -> int:
    """A read-only descriptor of ``path`` (created if missing): never through a symbolic link, never
    a FIFO or device that would block or misbehave. flock needs no write access."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise DeviceLockError(f"the GPU lock file {path} is a symbolic link; remove it") from None
        raise DeviceLockError(f"cannot open the GPU lock file {path} ({e.strerror or e}); "
                              f"set {DIR_VARIABLE} to a folder of yours") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DeviceLockError(f"the GPU lock file {path} is not a regular file; remove it")
    return fd


def _holders(fd: int) -> list[str]:
    """The processes that hold a ``flock`` on ``fd``'s file, from ``/proc/locks`` (Linux; else [])."""
    inode = os.fstat(fd).st_ino
    found = []
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue  # "->" marks a waiter, not a holder
        pid, where = parts[4], parts[5]
        if where.rsplit(":", 1)[-1] == str(inode):
            found.append(f"pid {pid}{_command(pid)}")
    return found


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return ""
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return f" ({text[:120]})" if text else ""


def _acquire(fd: int, path: Path, timeout: float) -> float:
    """Take the exclusive lock on ``fd`` within ``timeout`` seconds; the seconds waited."""
    t0 = time.perf_counter()
    pause = _POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.perf_counter() - t0
        except BlockingIOError:
            pass
        waited = time.perf_counter() - t0
        if waited >= timeout:
            holders = _holders(fd)
            who = f"it is held by {', '.join(holders)}" if holders else "another process holds it"
            raise DeviceLockTimeout(
                f"waited {waited:.1f} s for the GPU lock {path} (timeout {timeout:g} s); {who}. Wait for that "
                f"process or end it; set {TIMEOUT_VARIABLE} to wait longer, or {ENABLE_VARIABLE}=0 to run "
                f"without the lock (then studies sharing this GPU may time each other's kernels)")
        time.sleep(min(pause, timeout - waited))
        pause = min(pause * 2, _POLL_S[1])


@contextlib.contextmanager
def device_lock(device: str | None, timeout: float | None = None) -> Iterator[Callable[[], float]]:
    """Hold ``device``'s lock inside the block (None: no lock); yields a function giving the seconds
    waited for it. ``timeout``: seconds (default :func:`lock_timeout`); :class:`DeviceLockTimeout`
    after it, :class:`DeviceLockError` for an unsafe folder or file."""
    waited = 0.0
    if device is None or not lock_enabled():
        yield lambda: waited
        return
    limit = lock_timeout() if timeout is None else timeout
    path = lock_path(device)
    fd = _open_lock_file(path)
    try:
        waited = _acquire(fd, path, limit)
        try:
            yield lambda: waited
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
