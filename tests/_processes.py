"""A ``tune`` process's measurement workers, found through ``/proc`` (Linux): the fault tests kill them, the
reliability tests check that they die with ``tune``.

A CPU backend's worker is forked by a fork server, ``tune``'s child (its command line is the server's); a
device backend's is ``tune``'s spawned child (``spawn_main``). :mod:`rgtune.tuner.measure` says why.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["children", "measurement_workers", "fork_servers", "alive"]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> bytes:
    try:  # a short-lived child (the resource tracker, a compiler) may exit between listing and reading
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def fork_servers(pid: int) -> list[int]:
    """``pid``'s fork servers (:mod:`multiprocessing.forkserver`)."""
    return [p for p in children(pid) if b"forkserver" in _cmdline(p)]


def measurement_workers(pid: int) -> list[int]:
    """The measurement workers of ``tune`` process ``pid``: forked by its fork server, or spawned by it."""
    return ([p for p in children(pid) if b"spawn_main" in _cmdline(p)]
            + [w for s in fork_servers(pid) for w in children(s)])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
