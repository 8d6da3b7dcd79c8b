"""Who is still alive: worker ids, and the rule that declares a ``running`` trial abandoned.

A worker id is ``"host:pid"`` of the process that measures. A trial left ``running`` is
**abandoned** (and :meth:`TrialDatabase.mark_stale_running` turns it ``failed``) when:

1. its worker ran on *this* host (same host name) and that process is gone: the pid does not
   exist, or it exists but started after the trial did (the pid was reused, e.g. ``tune``
   restarted as PID 1 of a container after a ``kill -9``). Decided at once, no timeout: a local
   worker that is alive is never touched, however old its heartbeat;
2. otherwise (another host, or no worker recorded, as in rows from schema 0001): its last sign
   of life (``heartbeat_at``, else ``started_at``) is older than ``stale_after`` seconds. A live
   remote worker keeps its trials by calling :meth:`TrialDatabase.heartbeat` more often than
   that, or by never running a trial longer than ``stale_after``. The times are the workers' own
   clocks (UTC), so machines sharing a PostgreSQL database need roughly synchronized clocks
   (NTP); ``stale_after`` is minutes, skew is milliseconds.

Host names must be unique among the machines (or containers) sharing one database.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

__all__ = ["worker_id", "split_worker", "local_process_alive", "worker_alive", "abandoned_reason"]

_START_SLACK_S = 2.0  # /proc start times have 1 s (boot time) + 10 ms (clock tick) resolution


def worker_id() -> str:
    """This process's worker id, ``"host:pid"``.

    Example:
        >>> worker_id().rsplit(":", 1)[1] == str(os.getpid())
        True
    """
    return f"{socket.gethostname()}:{os.getpid()}"


def split_worker(worker: str | None) -> tuple[str | None, int | None]:
    """``("host", pid)`` of a worker id; ``(None, None)`` for a missing or foreign one."""
    if not worker:
        return None, None
    host, sep, pid = worker.rpartition(":")
    if not sep or not pid.isdigit():
        return worker, None
    return host, int(pid)


def _process_start_epoch(pid: int) -> float | None:
    # Linux only; elsewhere a pid's existence is all we can tell.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f.read().decode().splitlines() if line.startswith("btime"))
        fields_after_comm = stat.rsplit(")", 1)[1].split()
        start_ticks = int(fields_after_comm[19])  # field 22 of /proc/<pid>/stat; comm (field 2) may hold spaces
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def local_process_alive(pid: int, since: datetime) -> bool:
    """Whether process ``pid`` of this host exists and already existed at ``since`` (naive UTC)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OverflowError:
        return False
    started = _process_start_epoch(pid)
    if started is None:
        return True
    return started <= since.replace(tzinfo=UTC).timestamp() + _START_SLACK_S


def abandoned_reason(
    worker: str | None,
    started_at: datetime,
    heartbeat_at: datetime | None,
    *,
    host: str,
    now: datetime,
    stale_after: float,
) -> str | None:
    """Why a ``running`` trial is abandoned under the module's rule, or None if it may be alive."""
    w_host, w_pid = split_worker(worker)
    if w_host == host and w_pid is not None:
        if local_process_alive(w_pid, started_at):
            return None
        return f"abandoned: worker {worker} is no longer running (process gone or pid reused)"
    last = heartbeat_at or started_at
    age = (now - last).total_seconds()
    if age <= stale_after:
        return None
    who = f"worker {worker}" if worker else "an unknown worker"
    return f"abandoned: no sign of life from {who} for {age:.0f}s (> {stale_after:.0f}s)"


def worker_alive(worker: str | None, since: datetime) -> bool:
    """Whether a worker may still be running: a process of this host that exists and existed at
    ``since`` (naive UTC); another host's worker, or an id that is not ours, is not ours to judge."""
    host, pid = split_worker(worker)
    if host != socket.gethostname() or pid is None:
        return True
    return local_process_alive(pid, since)
