"""Compile generated CUDA with NVRTC (through ``cupy.cuda.nvrtc``) to cubins; a disk cache.

Only ``createProgram`` / ``compileProgram`` / ``getCUBIN`` are used, which need no GPU, so
every test run compiles the CUDA kernels even on a CPU-only machine. ``ptxas -v`` output is
parsed into per-function :class:`Resources` (registers, spills, static shared memory), which
the launch checks compare with the device's limits.

Cache: ``<dir>/<key>.cubin`` (+ ``.json`` with the log, the resources, and the cubin's size and
sha256), ``key`` = sha256 of the code (the unit's header comments excluded) + NVRTC version +
options. The directory is ``$RGTUNE_KERNEL_CACHE``, else ``$RGTUNE_CACHE_DIR/cuda``, else
``<user cache>/rgtune/cuda``. The cache follows :mod:`rgtune.codegen.kernel_cache`: files are
written to a temporary name, flushed and renamed (the ``.json`` after the cubin), so concurrent
workers never read half a file; a cubin that does not match its ``.json`` is compiled again; the
folder is kept under ``$RGTUNE_KERNEL_CACHE_LIMIT`` (2 GiB) by deleting the least recently used.

Example (needs CuPy and the NVRTC library, no GPU):
    >>> cubin = compile_source('extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }',
    ...                        "k.cu", "sm_80", cache=None)
    >>> cubin.resources["k"].registers > 0
    True
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from rgtune.codegen import kernel_cache
from rgtune.codegen.base import BackendError, CompileError
from rgtune.codegen.cuda._unit import KernelUnit
from rgtune.codegen.cuda.schedule import MAX_REGISTERS_PER_BLOCK, MAX_STATIC_SHARED, MAX_THREADS_PER_BLOCK

#: architectures every generated kernel is compiled for in tests (A100, H100/H200)
ARCHS = ("sm_80", "sm_90")


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one ``__global__`` function."""

    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclass
class Cubin:
    """One compiled unit for one architecture."""

    arch: str
    data: bytes
    log: str
    seconds: float
    cached: bool
    resources: dict[str, Resources] = field(default_factory=dict)
    kind: str = "cubin"  # or "ptx" when the architecture is newer than NVRTC knows (JIT by the driver)


# --------------------------------------------------------------------------- NVRTC
def _nvrtc():
    try:
        from cupy.cuda import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise BackendError(f"CuPy is not installed ({e}); install rgtune[nvrtc] or cupy-cuda12x") from e
    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)``; raises :class:`BackendError` when the library is missing."""
    nv = _nvrtc()
    try:
        return tuple(nv.getVersion())  # type: ignore[return-value]
    except Exception as e:  # noqa: BLE001 - CuPy raises several kinds when the .so is absent
        raise BackendError(f"the NVRTC library cannot be loaded: {e}") from e


def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can emit cubins for (``(80, 86, 90, ...)``)."""
    try:
        return tuple(_nvrtc().getSupportedArchs())
    except Exception:  # noqa: BLE001 - older NVRTC
        return (80, 86, 90)


def options(arch: str) -> list[str]:
    """NVRTC options. No fast-math: fp32 results are checked against a float64 reference.

    ``-minimal`` (NVRTC 12.4+) leaves out the runtime-API declarations the kernels never use,
    which saves a little front-end time on every compile.
    """
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "-Xptxas=-v", "--diag-suppress=177"]
    return opts + (["-minimal"] if nvrtc_version() >= (12, 4) else [])


def cache_dir() -> Path:
    env = os.environ.get("RGTUNE_KERNEL_CACHE")
    if env:
        return Path(env)
    env = os.environ.get("RGTUNE_CACHE_DIR")
    if env:
        return Path(env) / "cuda"
    from rgtune.data._cache import user_cache_dir

    return user_cache_dir() / "cuda"


def cache_key(code: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (code, ".".join(map(str, nvrtc_version())), " ".join(options(arch))):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


_PTXAS_FN = re.compile(r"Function properties for (\w+)")
_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_resources(log: str) -> dict[str, Resources]:
    """Per-function resources from ``ptxas -v`` output.

    >>> log = '''ptxas info    : Compiling entry function 'gemm' for 'sm_90'
    ... ptxas info    : Function properties for gemm
    ... ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ... ptxas info    : Used 48 registers, used 1 barriers, 6720 bytes smem'''
    >>> parse_resources(log)["gemm"]
    Resources(registers=48, shared_bytes=6720, stack_bytes=0, spill_stores=0, spill_loads=0)
    """
    out: dict[str, Resources] = {}
    current: str | None = None
    stack = (0, 0, 0)
    for line in log.splitlines():
        m = _PTXAS_ENTRY.search(line) or _PTXAS_FN.search(line)
        if m:
            if m.group(1) != current:
                stack = (0, 0, 0)
            current = m.group(1)
            continue
        m = _PTXAS_STACK.search(line)
        if m and current:
            stack = tuple(int(g) for g in m.groups())  # type: ignore[assignment]
            continue
        m = _PTXAS_USED.search(line)
        if m and current:
            out[current] = Resources(int(m.group(1)), int(m.group(2) or 0), *stack)
    return out


def _save_failed(source: str, name: str) -> str:
    where = cache_dir() / "failed"
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        where = Path(tempfile.gettempdir()) / "rgtune-cuda-failed"
        where.mkdir(parents=True, exist_ok=True)
    path = where / f"{Path(name).stem}-{hashlib.sha256(source.encode()).hexdigest()[:12]}.cu"
    path.write_text(source)
    return str(path)


def _compile_nvrtc(source: str, name: str, arch: str) -> tuple[bytes, str, str]:
    nv = _nvrtc()
    cc = int(arch.split("_")[1])
    kind = "cubin" if cc in supported_archs() else "ptx"
    opts = options(arch if kind == "cubin" else f"compute_{max(a for a in supported_archs() if a <= cc)}")
    prog = nv.createProgram(source, name, [], [])
    try:
        try:
            nv.compileProgram(prog, opts)
        except nv.NVRTCError as e:
            log = nv.getProgramLog(prog).rstrip("\0")
            path = _save_failed(source, name)
            raise CompileError(f"NVRTC failed to compile {name} for {arch} ({e}); source saved to {path}\n{log}",
                               source_path=path, log=log) from None
        log = nv.getProgramLog(prog).rstrip("\0")
        if kind == "cubin":
            data = nv.getCUBIN(prog)
        else:  # PTX for the driver to JIT: a NUL-terminated string
            ptx = nv.getPTX(prog)
            data = (ptx.encode() if isinstance(ptx, str) else bytes(ptx)).rstrip(b"\0") + b"\0"
    finally:
        nv.destroyProgram(prog)
    return data, log, kind


def compile_source(source: str, name: str, arch: str, key_code: str | None = None,
                   cache: Path | None | bool = True) -> Cubin:
    """Compile ``source`` for ``arch`` (``"sm_90"``); cached by ``key_code`` (default: the source).

    ``cache``: ``True`` for :func:`cache_dir`, a directory, or ``None``/``False`` for no cache.
    Raises :class:`CompileError` (with NVRTC's log; the source is saved to the file it names).
    """
    where = cache_dir() if cache is True else (Path(cache) if cache else None)
    key = cache_key(key_code if key_code is not None else source, arch)
    if where is not None:
        hit = _read_cache(where, key, arch)
        if hit is not None:
            return hit
    t0 = time.perf_counter()
    data, log, kind = _compile_nvrtc(source, name, arch)
    out = Cubin(arch, data, log, time.perf_counter() - t0, False, parse_resources(log), kind)
    if where is not None:
        _write_cache(where, key, out)
    return out


def _read_cache(where: Path, key: str, arch: str) -> Cubin | None:
    """The cached cubin of ``key``, checked against the size and sha256 in its ``.json``; None to compile."""
    kernel_cache.open_cache(where)
    blob, meta = where / f"{key}.cubin", where / f"{key}.json"
    try:
        info = json.loads(meta.read_text())
        data = blob.read_bytes()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        kernel_cache.warn_once(blob, f"its record {meta.name} is unreadable ({e})")
        return None
    why = kernel_cache.check_digest(data, info if isinstance(info, dict) else {})
    if why:
        kernel_cache.warn_once(blob, why)
        return None
    kernel_cache.touch(meta)
    res = {k: Resources(**v) for k, v in info.get("resources", {}).items()}
    return Cubin(arch, data, info.get("log", ""), 0.0, True, res, info.get("kind", "cubin"))


def _write_cache(where: Path, key: str, c: Cubin) -> None:
    try:
        where.mkdir(parents=True, exist_ok=True)
        meta = {**kernel_cache.digest(c.data), "log": c.log, "kind": c.kind, "seconds": c.seconds,
                "resources": {k: asdict(v) for k, v in c.resources.items()}}
        kernel_cache.write_atomic(where / f"{key}.cubin", c.data)  # the cubin first, its record after it
        kernel_cache.write_atomic(where / f"{key}.json", json.dumps(meta).encode())
        kernel_cache.note_written(where, len(c.data))
    except OSError:
        pass  # a cache that cannot be written only costs time


def compile_many(jobs: Iterable[tuple[str, str, str, str | None]], workers: int | None = None,
                 cache: Path | None | bool = True) -> list[Cubin]:
    """Compile ``(source, name, arch, key_code)`` jobs in parallel threads (NVRTC releases the GIL)."""
    jobs = list(jobs)
    workers = workers or min(len(jobs), os.cpu_count() or 1) or 1
    if workers == 1:
        return [compile_source(s, n, a, k, cache) for s, n, a, k in jobs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda j: compile_source(j[0], j[1], j[2], j[3], cache), jobs))


def check_resources(res: Resources, threads: int, function: str,
                    max_threads: int = MAX_THREADS_PER_BLOCK, max_registers: int = MAX_REGISTERS_PER_BLOCK,
                    max_shared: int = MAX_STATIC_SHARED) -> list[str]:
    """Why ``function`` cannot launch with ``threads`` per block, or ``[]``."""
    problems = []
    if threads > max_threads:
        problems.append(f"{function}: {threads} threads per block > {max_threads}")
    if res.registers * threads > max_registers:
        problems.append(f"{function}: {res.registers} registers x {threads} threads > {max_registers}")
    if res.shared_bytes > max_shared:
        problems.append(f"{function}: {res.shared_bytes} B static shared memory > {max_shared}")
    return problems


def arch_list(archs: Sequence[str] | None = None) -> tuple[str, ...]:
    return tuple(archs) if archs else ARCHS


# --------------------------------------------------------------------------- programs
@dataclass
class CompiledProgram:
    """Every unit of a generated program compiled for ``archs``."""

    units: list[KernelUnit]
    cubins: dict[str, dict[str, Cubin]]  # unit name -> arch -> cubin
    seconds: float  # wall-clock, compiles that hit the cache included

    def resource_problems(self) -> list[str]:
        """Launch-resource violations found from ptxas' report (threads, registers, shared memory)."""
        problems = []
        for u in self.units:
            for arch, cubin in self.cubins[u.name].items():
                for launch in u.launches:
                    res = cubin.resources.get(launch.function)
                    if res is not None:
                        problems += [f"{u.name} ({arch}): {p}" for p in check_resources(res, launch.threads,
                                                                                        launch.function)]
        return problems


def compile_program(units: Sequence[KernelUnit], archs: Sequence[str] | None = None, workers: int | None = None,
                    cache: Path | None | bool = True) -> CompiledProgram:
    """Compile every unit for every architecture; units with equal code are compiled once."""
    t0 = time.perf_counter()
    archs = arch_list(archs)
    todo: dict[tuple[str, str], tuple[str, str, str, str]] = {}
    for u in units:
        for a in archs:
            todo.setdefault((u.key, a), (u.source, f"{u.name}.cu", a, u.code))
    done = dict(zip(todo, compile_many(todo.values(), workers, cache)))
    cubins = {u.name: {a: done[(u.key, a)] for a in archs} for u in units}
    return CompiledProgram(list(units), cubins, time.perf_counter() - t0)
