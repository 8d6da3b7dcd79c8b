"""The system C compiler and the on-disk cache of compiled kernel libraries.

A generated source is compiled once per (source, compiler, flags, machine): the library lands
in ``$RGTUNE_CACHE_DIR/kernels`` (else ``~/.cache/rgtune/kernels``) as ``<key>.so`` next to
``<key>.c``, the source it came from (kept, also when compilation fails, for inspection), and
``<key>.so.sum``, the library's size and sha256. ``key`` hashes the source text, the compiler's
resolved path and ``--version`` line, the flags, and the CPU (``-march=native`` code is only
valid on the CPU that built it). The cache follows :mod:`rgtune.codegen.kernel_cache`: files are
written under a temporary name, flushed and renamed, so concurrent compilers (test workers, tuner
processes) never see half a file; a hit checks the library against its record before the
``dlopen`` (a truncated or edited one is compiled again), and the folder is kept under
``$RGTUNE_KERNEL_CACHE_LIMIT`` (2 GiB) by deleting the least recently used libraries.

The compiler is ``$CC`` if set, else ``cc``, else ``gcc``.

Example:
    >>> src = "int rg_answer(void) { return 42; }"
    >>> lib = compile_library(src)
    >>> lib.load().rg_answer()
    42
    >>> compile_library(src).cache_hit
    True
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rgtune.codegen import kernel_cache
from rgtune.codegen.base import BackendError, CompileError

log = logging.getLogger("rgtune.codegen")

#: what every library is compiled with (recorded in ``BuiltProgram.info``)
FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared")
LIBS: tuple[str, ...] = ("-lm",)

_INSTALL_HINT = ("the cpu backend needs a C compiler with OpenMP: install gcc (Debian/Ubuntu: "
                 "`apt-get install gcc`; Fedora: `dnf install gcc`; macOS: `brew install gcc`) "
                 "or set CC to one (e.g. CC=gcc-12)")

_lock = threading.Lock()
_compilers: dict[tuple[str, str], "Compiler"] = {}
_loaded: dict[str, ctypes.CDLL] = {}
_openmp_ok: dict[str, tuple[bool, str]] = {}


@dataclass(frozen=True)
class Compiler:
    """A C compiler: how it was named, where it resolved to, and its version line."""

    command: str
    path: str
    version: str
    flags: tuple[str, ...] = FLAGS

    def identity(self) -> str:
        return f"{self.path}\n{self.version}\n{' '.join(self.flags + LIBS)}"


@dataclass(frozen=True)
class CompiledLibrary:
    """A compiled shared library in the cache."""

    key: str
    path: Path
    source_path: Path
    cache_hit: bool
    seconds: float
    compiler: Compiler
    source: str | None = field(default=None, repr=False, compare=False)  # to compile it again if it is lost

    def load(self) -> ctypes.CDLL:
        """The library, loaded once per process. One that does not load (deleted by another process's
        cache eviction, damaged since it was checked) is compiled again, once."""
        name = str(self.path)
        with _lock:
            lib = _loaded.get(name)
        if lib is None:
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                if self.source is None:
                    raise
                log.warning("kernel cache: %s does not load (%s); compiling it again", name, exc)
                compile_library(self.source, self.compiler, rebuild=True)
                lib = ctypes.CDLL(name)
            with _lock:
                lib = _loaded.setdefault(name, lib)
        return lib


def find_compiler() -> Compiler:
    """The C compiler to use (``$CC``, else ``cc``, else ``gcc``), or :class:`BackendError` saying how to get one."""
    requested = os.environ.get("CC", "").strip()
    key = (requested, os.environ.get("PATH", ""))
    with _lock:
        if key in _compilers:
            return _compilers[key]
    names = [requested] if requested else ["cc", "gcc"]
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        real = os.path.realpath(path)
        comp = Compiler(name, real, _version(name, real))
        with _lock:
            _compilers[key] = comp
        return comp
    what = f"CC={requested!r} is not an executable C compiler" if requested else "no C compiler (cc, gcc) on PATH"
    raise BackendError(f"{what}; {_INSTALL_HINT}")


def _version(name: str, path: str) -> str:
    """The compiler's ``--version`` line, remembered on disk per binary (path, size, mtime): a
    warm process finds its libraries without starting the compiler."""
    st = os.stat(path)
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    memo = cache_dir() / "compilers.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if stamp in known:
        return str(known[stamp])
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"C compiler {name!r} ({path}) does not run: {exc}; {_INSTALL_HINT}") from exc
    text = (out.stdout or out.stderr).strip()
    version = text.splitlines()[0].strip() if text else "unknown"
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(memo, json.dumps({**known, stamp: version}, indent=1).encode())
    except OSError:
        pass  # a read-only cache only costs the --version call next time
    return version


def check_openmp(compiler: Compiler | None = None) -> tuple[bool, str]:
    """Whether ``compiler`` builds and loads an OpenMP shared library here (memoized per compiler)."""
    try:
        compiler = compiler or find_compiler()
    except BackendError as exc:
        return False, str(exc)
    if compiler.path in _openmp_ok:
        return _openmp_ok[compiler.path]
    src = ("#include <omp.h>\nint rg_probe(void) { int n = 0;\n#pragma omp parallel reduction(+:n)\n"
           "n += 1;\nreturn n > 0 ? omp_get_max_threads() : -1; }\n")
    with tempfile.TemporaryDirectory(prefix="rgtune-probe-") as tmp:
        c, so = Path(tmp) / "probe.c", Path(tmp) / "probe.so"
        c.write_text(src)
        res = subprocess.run([compiler.path, *compiler.flags, "-o", str(so), str(c), *LIBS],
                             capture_output=True, text=True)
        if res.returncode != 0:
            result = (False, f"{compiler.command} ({compiler.version}) cannot build OpenMP code "
                             f"({' '.join(compiler.flags)}):\n{res.stderr.strip()}\n{_INSTALL_HINT}")
        else:
            try:
                ok = ctypes.CDLL(str(so)).rg_probe() > 0
                result = (ok, "" if ok else "the OpenMP probe library returned no threads")
            except OSError as exc:
                result = (False, f"the OpenMP probe library does not load: {exc}")
    _openmp_ok[compiler.path] = result
    return result


def cache_dir() -> Path:
    """Where compiled kernels live: ``$RGTUNE_CACHE_DIR/kernels``, else ``~/.cache/rgtune/kernels``."""
    root = os.environ.get("RGTUNE_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rgtune"
    return base / "kernels"


def machine_fingerprint() -> str:
    """The CPU model and ISA flags (``-march=native`` output is only valid on such a CPU)."""
    global _fingerprint
    if _fingerprint is None:
        parts = [platform.machine()]
        try:
            with open("/proc/cpuinfo") as f:  # the first processor block is enough
                for line in f:
                    if not line.strip():
                        break
                    if line.startswith(("model name", "flags", "Features", "CPU part")):
                        parts.append(line.split(":", 1)[1].strip())
        except OSError:
            parts.append(platform.processor())
        _fingerprint = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _fingerprint


_fingerprint: str | None = None


def library_key(source: str, compiler: Compiler) -> str:
    h = hashlib.sha256()
    for part in (source, compiler.identity(), machine_fingerprint()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


def _cached(source: str, compiler: Compiler, t0: float) -> CompiledLibrary | None:
    """The cached library of ``source`` if it matches its record; else None (and a damaged one is logged)."""
    key = library_key(source, compiler)
    folder = cache_dir()
    kernel_cache.open_cache(folder)
    so_path = folder / f"{key}.so"
    why = kernel_cache.check_entry(so_path)
    if not why:
        return CompiledLibrary(key, so_path, folder / f"{key}.c", True, time.perf_counter() - t0, compiler, source)
    if why != kernel_cache.MISSING:
        kernel_cache.warn_once(so_path, why)
    return None


def compile_library(source: str, compiler: Compiler | None = None, rebuild: bool = False) -> CompiledLibrary:
    """Compile ``source`` into a shared library, or find it, checked, in the cache (``rebuild``: compile
    in any case). Thread- and process-safe."""
    t0 = time.perf_counter()
    compiler = compiler or find_compiler()
    key = library_key(source, compiler)
    folder = cache_dir()
    kernel_cache.open_cache(folder)
    so_path, c_path = folder / f"{key}.so", folder / f"{key}.c"
    if not rebuild:
        hit = _cached(source, compiler, t0)
        if hit is not None:
            return hit
    folder.mkdir(parents=True, exist_ok=True)
    kernel_cache.write_atomic(c_path, source.encode(), sync=False)  # for people to read; never loaded
    tmp = kernel_cache.temp_path(so_path)
    cmd = [compiler.path, *compiler.flags, "-o", str(tmp), str(c_path), *LIBS]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise BackendError(f"cannot run {compiler.path}: {exc}; {_INSTALL_HINT}") from exc
    if res.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        output = (res.stderr + res.stdout).strip()
        raise CompileError(f"{compiler.command} failed (exit {res.returncode}) on the generated source "
                           f"{c_path}\ncommand: {' '.join(cmd)}\n{output}", str(c_path), output)
    kernel_cache.commit_entry(tmp, so_path)
    kernel_cache.note_written(folder, so_path.stat().st_size + len(source))
    return CompiledLibrary(key, so_path, c_path, False, time.perf_counter() - t0, compiler, source)


def compile_libraries(sources: list[str], compiler: Compiler | None = None,
                      jobs: int | None = None) -> list[CompiledLibrary]:
    """:func:`compile_library` for each source, the missing ones in parallel (``jobs``: CPU count)."""
    t0 = time.perf_counter()
    compiler = compiler or find_compiler()
    unique = list(dict.fromkeys(sources))
    done: dict[str, CompiledLibrary] = {}
    for s in unique:
        hit = _cached(s, compiler, t0)
        if hit is not None:
            done[s] = hit
    missing = [s for s in unique if s not in done]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(missing)))
    if jobs > 1:
        with ThreadPoolExecutor(jobs) as pool:  # the compilers are processes: threads are enough
            for s, lib in zip(missing, pool.map(lambda s: compile_library(s, compiler, rebuild=True), missing)):
                done[s] = lib
    for s in missing:
        if s not in done:
            done[s] = compile_library(s, compiler, rebuild=True)
    return [done[s] for s in sources]


def _write_atomic(path: Path, data: bytes) -> None:
    kernel_cache.write_atomic(path, data)
