"""What the on-disk kernel caches share: verified entries, safe writes, stale temporaries, a size bound.

Both compiled-kernel caches (the CPU backend's ``.so`` libraries, the CUDA backend's cubins) keep
one *entry* per key: a few files named ``<key>.<suffix>``, one of them the compiled code. The rules:

* **Verified before use.** Each entry has a record of the code file's size and sha256 (a sidecar
  ``<file>.sum``, or the cubin's ``.json``), written after the file. A reader checks both before it
  loads the code; an entry that fails (truncated by a full disk or a crash, edited, its record
  missing) is compiled again and replaced, and the first failure of each entry is logged.
* **Written safely.** Every file is written under a temporary name in the cache folder
  (``<name>.<pid>.<random>.tmp``), flushed to disk (``fsync``), renamed into place (the code, then
  its record), and the folder is flushed after the renames, so a crash leaves the old file or the
  new one, never half of one (the CPU cache's copy of the C source, only kept to be read, is not
  flushed).
* **Temporaries cleaned.** When a process first uses a cache folder, it deletes temporaries left
  by processes that no longer run (older than :data:`STALE_TEMP_S`) and any older than
  :data:`ABANDONED_TEMP_S` (e.g. a compile killed by a trial's timeout).
* **Bounded.** A cache folder is kept under ``$RGTUNE_KERNEL_CACHE_LIMIT`` bytes (default 2 GiB;
  ``500M``, ``4G``, a number of bytes; ``0`` or ``none`` for no bound): when it is larger, whole
  entries are deleted, least recently used first (a hit refreshes an entry's time at most once a
  minute). Entries used in the last :data:`EVICT_IDLE_S` seconds are never deleted, so a process
  that is about to load an entry keeps it; one that loses an entry anyway compiles it again. The
  check runs when a process first uses the folder and after every eighth of the limit it writes.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_atomic(folder / "0123456789abcdef.so", b"code")
    >>> write_sidecar(folder / "0123456789abcdef.so")
    >>> check_entry(folder / "0123456789abcdef.so")
    ''
    >>> (folder / "0123456789abcdef.so").write_bytes(b"cod")
    3
    >>> check_entry(folder / "0123456789abcdef.so")
    'its size is 3 bytes, 4 expected'
    >>> parse_size("2G") == 2 * 1024 ** 3, parse_size("none")
    (True, None)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["LIMIT_VARIABLE", "DEFAULT_LIMIT", "MISSING", "cache_limit", "parse_size", "temp_path", "write_temp",
           "commit", "write_atomic", "digest", "check_digest", "write_sidecar", "commit_entry", "check_entry", "touch",
           "warn_once",
           "open_cache", "note_written", "sweep", "Sweep"]

log = logging.getLogger("rgtune.codegen")

LIMIT_VARIABLE = "RGTUNE_KERNEL_CACHE_LIMIT"
DEFAULT_LIMIT = 2 * 1024 ** 3
#: an entry used this recently (seconds) is never evicted: a process may be about to load it
EVICT_IDLE_S = 600.0
#: a hit refreshes the entry's last-use time when it is older than this (seconds)
TOUCH_EVERY_S = 60.0
#: a temporary whose writer no longer runs is deleted once it is this old (seconds)
STALE_TEMP_S = 300.0
#: any temporary this old is deleted (a writer on another host, a reused pid)
ABANDONED_TEMP_S = 3600.0
SIDECAR_SUFFIX = ".sum"
MISSING = "missing"

_ENTRY_STEM = re.compile(r"^[0-9a-f]{16,}$")
_TEMP_PID = re.compile(r"\.(\d+)\.[0-9a-f]+(?:\.so)?\.tmp$")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}

_lock = threading.Lock()
_opened: set[str] = set()
_written: dict[str, int] = {}
_warned: set[str] = set()


def parse_size(text: str) -> int | None:
    """Bytes from ``"2G"``, ``"500M"``, ``"64K"``, ``"1048576"`` (binary units, an optional ``B``/``iB``);
    None for ``0``/``none``/``off`` (no bound). A ValueError says what is accepted."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    if value in ("0", "NONE", "OFF", "UNLIMITED"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", value)
    if not m:
        raise ValueError(f"{text!r} is not a size: give bytes with an optional unit (500M, 2G, 1048576), "
                         f"or 0/none for no bound")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def cache_limit() -> int | None:
    """The bound of each kernel cache folder: ``$RGTUNE_KERNEL_CACHE_LIMIT``, else 2 GiB; None: unbounded."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LIMIT
    try:
        return parse_size(text)
    except ValueError as e:
        raise ValueError(f"{LIMIT_VARIABLE}={e}") from None


# ----------------------------------------------------------------------------- writing
def temp_path(dest: Path) -> Path:
    """A fresh temporary name next to ``dest`` that says which process writes it."""
    return dest.with_name(f"{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return  # a platform that cannot open folders: the rename is still atomic
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def write_temp(dest: Path, data: bytes) -> Path:
    """``data`` in a new temporary file next to ``dest`` (see :func:`commit`)."""
    tmp = temp_path(dest)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def commit(*moves: tuple[Path, Path], sync: bool = True) -> None:
    """Rename each ``(temporary, destination)`` in order, all in one folder; with ``sync``, each file
    is flushed to disk before its rename and the folder after the last: every destination is whole,
    or as before. A temporary left by an error is deleted."""
    try:
        if sync:
            for tmp, _ in moves:
                _fsync_path(tmp)
        for tmp, dest in moves:
            os.replace(tmp, dest)
    except BaseException:
        for tmp, _ in moves:
            tmp.unlink(missing_ok=True)
        raise
    if sync and moves:
        _fsync_path(moves[-1][1].parent, directory=True)


def write_atomic(dest: Path, data: bytes, sync: bool = True) -> None:
    """Write ``data`` to ``dest`` through a temporary file in the same folder and :func:`commit`."""
    commit((write_temp(dest, data), dest), sync=sync)


# ----------------------------------------------------------------------------- verifying
def digest(data: bytes) -> dict[str, Any]:
    """``{"size": ..., "sha256": ...}`` of ``data``."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def check_digest(data: bytes, expected: Mapping[str, Any]) -> str:
    """Why ``data`` is not what ``expected`` (a :func:`digest`) describes, or ``""``."""
    if "sha256" not in expected:
        return "it has no size and checksum record (an older cache, or an interrupted write)"
    if expected.get("size") != len(data):
        return f"its size is {len(data)} bytes, {expected.get('size')} expected"
    if expected.get("sha256") != hashlib.sha256(data).hexdigest():
        return "its sha256 differs from the one recorded when it was written"
    return ""


def _sidecar(entry: Path) -> Path:
    return entry.with_name(entry.name + SIDECAR_SUFFIX)


def write_sidecar(entry: Path) -> None:
    """Record ``entry``'s size and sha256 next to it (after it is in place)."""
    write_atomic(_sidecar(entry), json.dumps(digest(entry.read_bytes())).encode())


def commit_entry(tmp: Path, entry: Path) -> None:
    """Put the finished temporary ``tmp`` in place as ``entry``, then its sidecar (one folder flush)."""
    try:
        record = json.dumps(digest(tmp.read_bytes())).encode()
        sidecar_tmp = write_temp(_sidecar(entry), record)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    commit((tmp, entry), (sidecar_tmp, _sidecar(entry)))


def check_entry(entry: Path) -> str:
    """``""`` when ``entry`` matches its sidecar (then its last-use time is refreshed), :data:`MISSING`
    when there is no entry, else why it cannot be trusted."""
    try:
        data = entry.read_bytes()
    except FileNotFoundError:
        return MISSING
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    try:
        expected = json.loads(_sidecar(entry).read_bytes())
    except FileNotFoundError:
        return "it has no size and checksum record (an older cache, or an interrupted write)"
    except (OSError, ValueError):
        return "its size and checksum record is unreadable"
    why = check_digest(data, expected if isinstance(expected, dict) else {})
    if not why:
        touch(_sidecar(entry))
    return why


def touch(path: Path, now: float | None = None) -> None:
    """Mark ``path``'s entry as used now (at most once per :data:`TOUCH_EVERY_S`)."""
    now = time.time() if now is None else now
    try:
        if now - os.stat(path).st_mtime > TOUCH_EVERY_S:
            os.utime(path, (now, now))
    except OSError:
        pass  # a read-only cache: eviction order is only a heuristic


def warn_once(entry: Path, why: str) -> None:
    """Log that ``entry`` is compiled again because of ``why`` (once per entry and process)."""
    with _lock:
        if str(entry) in _warned:
            return
        _warned.add(str(entry))
    level = logging.INFO if why.startswith("it has no size") else logging.WARNING
    log.log(level, "kernel cache: %s is compiled again: %s", entry, why)


# ----------------------------------------------------------------------------- housekeeping
@dataclass
class Sweep:
    """What :func:`sweep` deleted."""

    temporaries: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)  # entry keys
    size_before: int = 0
    size_after: int = 0


def open_cache(folder: Path) -> None:
    """Run :func:`sweep` on ``folder`` the first time this process uses it."""
    key = str(folder)
    with _lock:
        if key in _opened:
            return
        _opened.add(key)
    _safe_sweep(folder)


def note_written(folder: Path, nbytes: int) -> None:
    """Count bytes this process wrote to ``folder``; sweep after every eighth of the limit."""
    limit = cache_limit()
    if limit is None:
        return
    key = str(folder)
    with _lock:
        _written[key] = _written.get(key, 0) + nbytes
        due = _written[key] >= limit // 8
        if due:
            _written[key] = 0
    if due:
        _safe_sweep(folder)


def _safe_sweep(folder: Path) -> None:
    try:
        done = sweep(folder)
    except OSError as e:  # housekeeping never fails a build
        log.debug("kernel cache: cannot tidy %s (%s)", folder, e)
        return
    if done.evicted:
        log.info("kernel cache: %s was %.0f MiB, over its limit; deleted %d least recently used entries (%s)",
                 folder, done.size_before / 2 ** 20, len(done.evicted), LIMIT_VARIABLE)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, someone else's
    return True


def _stale(name: str, age: float) -> bool:
    if age > ABANDONED_TEMP_S:
        return True
    if age <= STALE_TEMP_S:
        return False
    m = _TEMP_PID.search(name)
    return m is None or not _pid_alive(int(m.group(1)))


def sweep(folder: Path, limit: int | None | str = "env", now: float | None = None) -> Sweep:
    """Delete stale temporaries from ``folder``, then, while it is larger than ``limit`` bytes
    (``"env"``: :func:`cache_limit`), its least recently used entries idle for :data:`EVICT_IDLE_S`."""
    now = time.time() if now is None else now
    limit = cache_limit() if limit == "env" else limit
    out = Sweep()
    entries: dict[str, list[tuple[Path, int, float]]] = {}
    try:
        listing = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    for item in listing:
        try:
            st = item.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not item.is_file(follow_symlinks=False):
            continue
        if item.name.endswith(".tmp"):
            if _stale(item.name, now - st.st_mtime):
                _unlink(Path(item.path))
                out.temporaries.append(item.name)
            continue
        out.size_before += st.st_size
        stem = item.name.split(".", 1)[0]
        if _ENTRY_STEM.match(stem):
            entries.setdefault(stem, []).append((Path(item.path), st.st_size, st.st_mtime))
    out.size_after = out.size_before
    if limit is None or out.size_before <= limit:
        return out
    by_use = sorted(entries.items(), key=lambda kv: max(m for _, _, m in kv[1]))
    for stem, files in by_use:
        if out.size_after <= limit:
            break
        if now - max(m for _, _, m in files) < EVICT_IDLE_S:
            break  # everything after this one was used at least as recently
        # the records first: a reader that comes now finds no record and compiles, never half an entry
        for path, size, _ in sorted(files, key=lambda f: not f[0].name.endswith((SIDECAR_SUFFIX, ".json"))):
            _unlink(path)
            out.size_after -= size
        out.evicted.append(stem)
    return out


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass  # another process got there first
