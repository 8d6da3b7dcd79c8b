"""Memory as a measured quantity of a trial: a budget checked before a candidate runs, its peak after.

**Budget.** Before a candidate is built, its buffers are estimated
(:func:`~rgtune.codegen.buffer_plan.footprint_bytes`: per-edge and per-pair buffers, slots shared where
the backend plans them, params, index arrays). A candidate is refused, and recorded as
``out_of_memory`` (with ``details.memory.refused``), when

* its buffers are over the user's limit (``MeasureOptions.memory_limit``, bytes; ``tune
  --memory-limit GB``): what the schedule may take where it will run, in a training loop, say. So a
  study under a limit searches the fastest schedule that fits in it;
* or its buffers and the verification's inputs and expected results
  (:meth:`~rgtune.tuner.verification.Case.resident_bytes`) are over :data:`DEFAULT_SHARE` of the
  memory free when the worker started, its graph loaded (on the CPU ``MemAvailable``, on a GPU the
  device's free memory): what a trial may add to what the worker and the tuning process already
  hold. On a big graph one careless candidate (a per-edge buffer per head and feature materialized
  for a 42M-edge graph) would otherwise take the machine's memory and the study with it.

**Peak.** A trial records its peak memory (``details.memory.peak_bytes``: growth over the worker's memory
when the trial started, compiled kernels, workspace, verification and timing included):

* CPU: the resident set's high-water mark (``VmHWM``), reset at the trial's start through
  ``/proc/self/clear_refs`` (Linux; elsewhere nothing is recorded);
* CUDA: ``torch.cuda.max_memory_allocated`` over what was allocated at the start.

Example:
    >>> import gc, mmap
    >>> m = MemoryBudget("cpu", limit=10**12)
    >>> _ = gc.collect()  # garbage freed after start() would lower the resident set under the baseline
    >>> m.start()
    >>> buf = mmap.mmap(-1, 50_000_000)  # fresh pages: a heap block could reuse pages already resident
    >>> _ = buf.write(b"x" * 50_000_000)  # written, so resident
    >>> peak = m.peak()   # None where it cannot be measured
    >>> peak is None or peak >= 40_000_000
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["MemoryBudget", "DEFAULT_SHARE", "available_bytes", "gib", "is_out_of_memory", "reset_peak", "status_bytes"]

#: the default memory limit: this share of what is free when the worker starts
DEFAULT_SHARE = 0.8
_CLEAR_REFS = Path("/proc/self/clear_refs")


def gib(n: int) -> str:
    """Bytes in GiB, three significant digits.

    Example:
        >>> gib(3 * 2**29)
        '1.5 GiB'
    """
    return f"{n / 2**30:.3g} GiB"


def available_bytes(device: str = "cpu") -> int | None:
    """Memory free for a new allocation: ``MemAvailable`` on the CPU, the device's free memory on CUDA
    (None where it cannot be read)."""
    if device != "cpu":
        import torch

        return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failing: Python's MemoryError, torch's CUDA out-of-memory error, or
    an allocator's "can't / cannot allocate memory" (torch's CPU allocator, NumPy).

    Example:
        >>> is_out_of_memory(MemoryError()), is_out_of_memory(ValueError("x"))
        (True, False)
    """
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``) in bytes; None where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's resident-set high-water mark (``VmHWM``) to its resident set (Linux >= 4.0)."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class MemoryBudget:
    """The worker's memory limits and each trial's peak (see the module docstring).

    ``limit``: the user's limit on a schedule's buffers (None: none); ``free_limit``: what a trial may
    add, the check included (None: :data:`DEFAULT_SHARE` of the memory free now).

    Example:
        >>> m = MemoryBudget("cpu", limit=2**30, free_limit=3 * 2**30)
        >>> m.refusal(2**29, 2**30) is None, m.fits(2**29), m.fits(2**31)
        (True, True, False)
        >>> m.refusal(2**31, 0)
        'its buffers need about 2 GiB (estimated), over the memory limit of 1 GiB'
        >>> m.refusal(2**29, 3 * 2**30)
        "its buffers need about 0.5 GiB (estimated) and the verification's inputs and results 3 GiB, over 3 GiB (80% of the memory free when the measuring process started)"
    """

    def __init__(self, device: str, limit: int | None = None, share_slots: bool = True,
                 free_limit: int | None = None) -> None:
        self.device, self.share_slots = device, share_slots
        if limit is not None and limit <= 0:
            raise ValueError(f"the memory limit must be a positive number of bytes, got {limit}")
        if free_limit is None:
            free = available_bytes(device)
            free_limit = int(DEFAULT_SHARE * free) if free is not None else 2**62
        self.limit = None if limit is None else int(limit)
        self.free_limit = int(free_limit)

    @property
    def buffer_limit(self) -> int:
        """The most a candidate's buffers may take (either limit)."""
        return self.free_limit if self.limit is None else min(self.limit, self.free_limit)

    def fits(self, buffers: int) -> bool:
        """Whether buffers of this many bytes pass both limits (the check's own memory aside)."""
        return buffers <= self.buffer_limit

    def refusal(self, buffers: int, check_bytes: int) -> str | None:
        """Why a candidate with these buffers, beside a check holding ``check_bytes``, is refused (None: it is not)."""
        if self.limit is not None and buffers > self.limit:
            return f"its buffers need about {gib(buffers)} (estimated), over the memory limit of {gib(self.limit)}"
        if buffers + check_bytes > self.free_limit:
            return (f"its buffers need about {gib(buffers)} (estimated) and the verification's inputs and results "
                    f"{gib(check_bytes)}, over {gib(self.free_limit)} ({DEFAULT_SHARE:.0%} of the memory free when "
                    "the measuring process started)")
        return None

    def estimate(self, kernels: Any, graph: Any) -> int:
        """The bytes a candidate's kernels hold at their peak (estimated before building them)."""
        from rgtune.codegen.buffer_plan import footprint_bytes

        return footprint_bytes(kernels, graph, share_slots=self.share_slots)

    def start(self) -> None:
        """A trial starts: reset the high-water mark; the memory now is its baseline."""
        if self.device == "cpu":
            self._base = status_bytes("VmRSS") if reset_peak() else None
        else:
            import torch

            if not torch.cuda.is_available():  # a device backend without torch's CUDA: nothing to measure
                self._base = None
                return
            torch.cuda.reset_peak_memory_stats()
            self._base = int(torch.cuda.memory_allocated())

    def peak(self) -> int | None:
        """Bytes of growth over the baseline since :meth:`start` (None where unmeasurable)."""
        if self._base is None:
            return None
        if self.device == "cpu":
            high = status_bytes("VmHWM")
            return None if high is None else max(0, high - self._base)
        import torch

        return max(0, int(torch.cuda.max_memory_allocated()) - self._base)
