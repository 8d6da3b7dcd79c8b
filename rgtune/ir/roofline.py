"""How far a schedule is from the floor: its counted bytes and FLOPs against a device's bandwidth and FLOP rate.

A schedule cannot run faster than it takes to move its minimum bytes (``bytes_min`` of
:func:`rgtune.ir.counts.count`: each buffer, weight and index array read once, each output written
once) at the device's memory bandwidth, nor faster than it takes to compute its FLOPs at the
device's float32 FLOP rate. The larger of the two is the *floor* (the roofline's bound for the
program as a whole) and says whether the schedule is memory- or compute-bound there; a measured
time's *fraction* of it (``floor / measured``, at most about 1) says how much of the device the
schedule uses, which a speedup over another library does not: a 10x speedup at 2% of the floor
leaves more to find than one at 60%.

The figures of a GPU are its datasheet's (:data:`GPU_PEAKS`, looked up by the name torch reports:
:func:`gpu_peak`); a CPU's are measured on this machine (:func:`cpu_peak`): a STREAM-like copy and
triad over arrays several times the last-level cache, and a float32 matmul, each a fraction of a
second, with the thread count they ran with, once per process. ``RGTUNE_CPU_BANDWIDTH_GBS`` and
``RGTUNE_CPU_GFLOPS`` (or :func:`cpu_peak`'s arguments) replace either measurement: a figure of
record for a report, or deterministic tests. A measured figure is what a simple kernel attains, not
the hardware's theoretical peak, so a tuned schedule can come close to it; a datasheet's is rarely
reached by any kernel (about 90% of HBM bandwidth is a good copy kernel's).

Example:
    >>> h100 = peak_by_name("h100")
    >>> h100.describe()
    'H100 SXM: 3,350 GB/s, 67 TFLOP/s float32 (NVIDIA H100 Tensor Core GPU datasheet)'
    >>> counts = {"bytes_min": 33_500_000, "flops": 67_000_000}   # 10 us of memory, 1 us of FLOPs
    >>> ms, bound = floor_ms(counts, h100)
    >>> round(ms, 6), bound
    (0.01, 'memory')
    >>> f"{fraction_of_floor(ms, 0.04):.0%}"                      # measured 40 us: a quarter of the floor's speed
    '25%'
    >>> gpu_peak("NVIDIA H200 NVL").name, gpu_peak("NVIDIA A100-SXM4-80GB").name, gpu_peak("Tesla K80")
    ('H200 NVL', 'A100 SXM 80GB', None)
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

# torch is imported by the functions that measure or ask the GPU: the command line reads the peaks' names without it

#: environment variables that replace the CPU's measured bandwidth (GB/s) and float32 FLOP rate (GFLOP/s)
BANDWIDTH_ENV = "RGTUNE_CPU_BANDWIDTH_GBS"
FLOPS_ENV = "RGTUNE_CPU_GFLOPS"


@dataclass(frozen=True)
class DevicePeak:
    """What a device can do at best: memory ``bandwidth`` (bytes/s) and float32 ``flop_rate`` (FLOP/s), where
    the figures come from (``source``) and, for a measured CPU, the thread count they were measured with."""

    name: str
    bandwidth: float
    flop_rate: float
    source: str
    threads: int | None = None

    def describe(self) -> str:
        """One line: the device, both figures and their source."""
        threads = "" if self.threads is None else f", {self.threads} thread{'s' if self.threads != 1 else ''}"
        return (f"{self.name}: {self.bandwidth / 1e9:,.4g} GB/s, {_flop_rate_text(self.flop_rate)} float32 "
                f"({self.source}{threads})")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _flop_rate_text(rate: float) -> str:
    return f"{rate / 1e12:.3g} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.3g} GFLOP/s"


# ---------------------------------------------------------------------- GPUs: datasheet figures
# Memory bandwidth and float32 (non-tensor-core) FLOP rate, dense, as NVIDIA's datasheets state them:
#   "NVIDIA H100 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/h100): H100 SXM 3.35 TB/s HBM3,
#     67 TFLOP/s FP32; H100 NVL 3.9 TB/s, 60 TFLOP/s; H100 PCIe (80 GB HBM2e, the first datasheet) 2.0 TB/s,
#     51 TFLOP/s.
#   "NVIDIA H200 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/h200): H200 SXM 4.8 TB/s HBM3e,
#     67 TFLOP/s FP32; H200 NVL 4.8 TB/s, 60 TFLOP/s.
#   "NVIDIA A100 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/a100): 19.5 TFLOP/s FP32 on every
#     board; 80 GB SXM 2,039 GB/s, 80 GB PCIe 1,935 GB/s, 40 GB (SXM and PCIe) 1,555 GB/s.
_H100, _H200, _A100 = ("NVIDIA H100 Tensor Core GPU datasheet", "NVIDIA H200 Tensor Core GPU datasheet",
                       "NVIDIA A100 Tensor Core GPU datasheet")
GPU_PEAKS: dict[str, DevicePeak] = {
    "h100-sxm": DevicePeak("H100 SXM", 3.35e12, 67e12, _H100),
    "h100-nvl": DevicePeak("H100 NVL", 3.9e12, 60e12, _H100),
    "h100-pcie": DevicePeak("H100 PCIe", 2.0e12, 51e12, _H100),
    "h200": DevicePeak("H200 SXM", 4.8e12, 67e12, _H200),
    "h200-nvl": DevicePeak("H200 NVL", 4.8e12, 60e12, _H200),
    "a100-sxm-80gb": DevicePeak("A100 SXM 80GB", 2.039e12, 19.5e12, _A100),
    "a100-pcie-80gb": DevicePeak("A100 PCIe 80GB", 1.935e12, 19.5e12, _A100),
    "a100-40gb": DevicePeak("A100 40GB", 1.555e12, 19.5e12, _A100),
}
#: short names ``--peak`` takes besides the table's keys
ALIASES = {"h100": "h100-sxm", "h200-sxm": "h200", "a100": "a100-sxm-80gb"}
#: the peak assumed for ``cuda`` where no GPU is visible (``rgtune show --backend cuda`` on a CPU machine)
DEFAULT_GPU = "h100-sxm"

# The name torch reports (``torch.cuda.get_device_name``: "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
# "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe",
# "NVIDIA A100-PCIE-40GB", ...), lower-cased, holds every word of the first of these that fits: the most
# specific come first. A MIG slice reports its whole GPU's name (and gets the whole GPU's figures).
_NAME_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("h100-nvl", ("h100", "nvl")), ("h100-pcie", ("h100", "pcie")), ("h100-sxm", ("h100",)),
    ("h200-nvl", ("h200", "nvl")), ("h200", ("h200",)),
    ("a100-pcie-80gb", ("a100", "80gb", "pcie")), ("a100-sxm-80gb", ("a100", "80gb")), ("a100-40gb", ("a100",)),
)


def gpu_peak(device_name: str) -> DevicePeak | None:
    """The datasheet figures of the GPU torch calls ``device_name`` (None: not in :data:`GPU_PEAKS`)."""
    name = device_name.lower()
    key = next((k for k, words in _NAME_WORDS if all(w in name for w in words)), None)
    return None if key is None else GPU_PEAKS[key]


def peak_names() -> list[str]:
    """What :func:`peak_by_name` takes: ``cpu`` (measured here) and the GPUs of :data:`GPU_PEAKS` (and aliases)."""
    return ["cpu", *GPU_PEAKS, *ALIASES]


def peak_by_name(name: str) -> DevicePeak:
    """The peak ``name`` stands for (:func:`peak_names`); a ValueError naming the valid ones otherwise."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key == "cpu":
        return cpu_peak()
    if key not in GPU_PEAKS:
        raise ValueError(f"unknown device peak {name!r}; choose from {', '.join(peak_names())}")
    return GPU_PEAKS[key]


def device_peak(device_type: str, name: str = "auto") -> tuple[DevicePeak, str | None]:
    """The peak of the device a backend runs on (``device_type``: ``cpu`` or ``cuda``), or the one ``name``
    names, and a note where it is not the device's own: a CUDA backend where no GPU is visible, or a GPU
    whose name has no datasheet figures here, gets :data:`DEFAULT_GPU`'s."""
    import torch

    if name != "auto":
        return peak_by_name(name), None
    if device_type != "cuda":
        return cpu_peak(), None
    assumed = GPU_PEAKS[DEFAULT_GPU]
    if not torch.cuda.is_available():
        return assumed, f"no GPU visible here: the floor is an {assumed.name}'s (--peak names another device)"
    found = torch.cuda.get_device_name()
    peak = gpu_peak(found)
    if peak is None:
        return assumed, (f"no datasheet figures for {found!r}: the floor is an {assumed.name}'s (--peak names "
                         "another device)")
    return peak, None


# ---------------------------------------------------------------------- the floor
def floor_terms(counts: Mapping[str, Any], peak: DevicePeak) -> tuple[float, float]:
    """Milliseconds to move ``counts["bytes_min"]`` at the peak's bandwidth and to compute ``counts["flops"]``
    at its FLOP rate."""
    return counts["bytes_min"] / peak.bandwidth * 1e3, counts["flops"] / peak.flop_rate * 1e3


def floor_ms(counts: Mapping[str, Any], peak: DevicePeak) -> tuple[float, str]:
    """The floor of a program with these counts (:func:`rgtune.ir.counts.count`) on ``peak``'s device, in
    milliseconds, and what bounds it: ``"memory"`` or ``"compute"``.

    Example:
        >>> slow = DevicePeak("slow", bandwidth=1e9, flop_rate=1e9, source="made up")
        >>> floor_ms({"bytes_min": 2_000_000, "flops": 5_000_000}, slow)   # 2 ms of bytes, 5 ms of FLOPs
        (5.0, 'compute')
    """
    memory, compute = floor_terms(counts, peak)
    return (memory, "memory") if memory >= compute else (compute, "compute")


def fraction_of_floor(floor: float, measured: float) -> float:
    """How much of the device's speed a measured time reaches: ``floor / measured`` (same units)."""
    if measured <= 0:
        raise ValueError(f"a measured time must be > 0, got {measured}")
    return floor / measured


# ---------------------------------------------------------------------- the CPU: measured
def cpu_peak(threads: int | None = None, bandwidth: float | None = None,
             flop_rate: float | None = None) -> DevicePeak:
    """This machine's CPU: ``bandwidth`` (bytes/s) and ``flop_rate`` (FLOP/s) where given, else
    :data:`BANDWIDTH_ENV` / :data:`FLOPS_ENV` where set, else measured with ``threads`` threads (default:
    torch's), once per process and thread count (:func:`measure_cpu`)."""
    import torch

    threads = threads or torch.get_num_threads()
    overrides = cpu_overrides()

    def figure(given: float | None, variable: str, key: str, how: str) -> tuple[float, str]:
        from_env = overrides[key]
        if given is not None:
            return given, "given"
        if from_env is not None:
            return from_env, f"from ${variable}"
        return measure_cpu(threads)[key], f"measured by {how}"  # cached: measured once for both figures

    bw, bw_how = figure(bandwidth, BANDWIDTH_ENV, "bandwidth", "a STREAM-like copy and triad")
    rate, rate_how = figure(flop_rate, FLOPS_ENV, "flop_rate", "a float32 matmul")
    return DevicePeak(f"CPU ({_cpu_model()})", bw, rate, f"bandwidth {bw_how}, FLOP rate {rate_how}", threads)


def cpu_overrides() -> dict[str, float | None]:
    """``{"bandwidth": bytes/s, "flop_rate": FLOP/s}`` as :data:`BANDWIDTH_ENV` and :data:`FLOPS_ENV` give them
    (None: unset); a ValueError naming the variable for a value that is not a positive number."""
    return {"bandwidth": _env_rate(BANDWIDTH_ENV), "flop_rate": _env_rate(FLOPS_ENV)}


def _env_rate(variable: str) -> float | None:
    """The figure an environment variable gives, in units per second (it holds G-units per second)."""
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise ValueError(f"{variable}={text!r}: expected a positive number (GB/s or GFLOP/s)")
    return value * 1e9


@functools.cache
def measure_cpu(threads: int) -> dict[str, float]:
    """``{"bandwidth": bytes/s, "flop_rate": FLOP/s}`` measured with ``threads`` torch threads (once per process
    and thread count): the better of a copy and a triad over float32 arrays of several times the last-level
    cache (bytes counted as STREAM counts them: each array read or written once), and a float32 matmul. Each
    takes the best of its runs: the floor is what the machine can do, not what it did on average."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return {"bandwidth": _stream_bandwidth(), "flop_rate": _matmul_flop_rate()}
    finally:
        torch.set_num_threads(before)


def _stream_bandwidth(runs: int = 5) -> float:
    import torch

    elems = _stream_bytes() // 4
    a, b, c = torch.zeros(elems), torch.ones(elems), torch.ones(elems)  # written: every page is resident
    kernels: tuple[tuple[Callable[[], Any], int], ...] = (
        (lambda: a.copy_(b), 2), (lambda: torch.add(b, c, alpha=3.0, out=a), 3))
    return max(arrays * elems * 4 / _best_seconds(kernel, runs) for kernel, arrays in kernels)


def _matmul_flop_rate(n: int = 1024, min_seconds: float = 0.05) -> float:
    import torch

    x, y = torch.rand(n, n), torch.rand(n, n)
    out = torch.empty(n, n)
    torch.mm(x, y, out=out)  # the BLAS's threads and buffers start here, not in a timed run
    runs = max(3, int(min_seconds / max(_best_seconds(lambda: torch.mm(x, y, out=out), 1), 1e-6)))
    return 2 * n ** 3 / _best_seconds(lambda: torch.mm(x, y, out=out), min(runs, 50))


def _best_seconds(run: Callable[[], Any], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def _stream_bytes() -> int:
    """One array's bytes: 4x the last-level cache, at least 64 MiB and at most 256 MiB (three are allocated)."""
    return min(max(4 * _last_level_cache_bytes(), 64 << 20), 256 << 20)


def _last_level_cache_bytes() -> int:
    """The largest cache sysfs lists for CPU 0 (0 where it lists none)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "this machine")
    except OSError:
        return "this machine"
