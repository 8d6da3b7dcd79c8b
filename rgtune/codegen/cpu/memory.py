"""Big kernel buffers from memory that is already mapped: a pool of blocks that a freed buffer goes back to.

Why: a training step on a mini-batch needs buffers of tens to hundreds of MB (an ogbn-mag block's
first layer: 337k nodes x 64 floats is 86 MB; a per-edge value over 567k edges, 145 MB), and every
step's batch has new ones. glibc maps an allocation that big afresh each time and unmaps it on
free, so each step pays a page fault per 4 KB page of every buffer: 22 ms for 86 MB here, where
writing the same memory again takes 3 ms. (Transparent huge pages are no cure: with defrag on
``madvise`` they made the first touch slower.) PyTorch caches GPU memory but not CPU memory; this
is that cache for the CPU backend's own buffers: saved values, outputs, gradients, workspaces.

How: a buffer of at least :data:`MIN_POOLED_BYTES` is a view of a pooled block (a numpy byte array,
64-byte aligned). ``torch.from_numpy`` keeps the view array alive as long as any tensor shares the
buffer's memory, whoever holds it (autograd's saved tensors, ``.grad``, a user's output), and a
``weakref.finalize`` on that array hands the block back to the pool when it dies: exactly when
torch has let go of the memory, never earlier. A request takes the smallest free block that holds
it (and is at most twice its size); a new block has 1/8 headroom, for the next batch that is a
little bigger. Free blocks beyond the most memory the pool ever had in use are dropped (the oldest
first), so the pool never holds more than twice its peak.

Example:
    >>> pool = BufferPool(min_bytes=1024)
    >>> a = pool.tensor((1000,))
    >>> pool.stats()["in_use_bytes"] >= 4000
    True
    >>> address = a.data_ptr(); del a
    >>> b = pool.tensor((900,), zero=True)   # the freed block again, zeroed as asked
    >>> b.data_ptr() == address, float(b.abs().sum())
    (True, 0.0)
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["BufferPool", "POOL", "MIN_POOLED_BYTES"]

#: smaller buffers come from torch's allocator (glibc serves them from its heap without faults)
MIN_POOLED_BYTES = 1 << 20
_ALIGN = 64
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.int32: np.int32, torch.int64: np.int64}


class BufferPool:
    """Tensors on pooled, already mapped memory (see the module docstring). Thread-safe."""

    def __init__(self, min_bytes: int = MIN_POOLED_BYTES) -> None:
        self.min_bytes = min_bytes
        self._free: list[np.ndarray] = []  # oldest first
        self._free_bytes = 0
        self._lock = threading.RLock()  # a release may run inside a request (a collected view)
        self._in_use = 0
        self._peak = 0
        self.hits = 0
        self.misses = 0

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, zero: bool = False) -> torch.Tensor:
        """A new tensor of ``shape`` (zeroed with ``zero``, else its contents are undefined)."""
        nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
        if nbytes < self.min_bytes or dtype not in _NUMPY:
            return torch.zeros(shape, dtype=dtype) if zero else torch.empty(shape, dtype=dtype)
        block = self._take(nbytes)
        start = (-block.ctypes.data) % _ALIGN
        view = block[start:start + nbytes].view(_NUMPY[dtype]).reshape(shape)
        weakref.finalize(view, self._give_back, block)
        t = torch.from_numpy(view)
        if zero:
            t.zero_()
        return t

    def stats(self) -> dict[str, Any]:
        """Bytes in use and held free, the most ever in use, and how many requests found a free block."""
        with self._lock:
            return {"in_use_bytes": self._in_use, "free_bytes": self._free_bytes,
                    "peak_bytes": self._peak, "hits": self.hits, "misses": self.misses}

    def clear(self) -> None:
        """Drop the free blocks (their memory goes back to the system)."""
        with self._lock:
            self._free.clear()
            self._free_bytes = 0

    def _take(self, nbytes: int) -> np.ndarray:
        need = nbytes + _ALIGN
        with self._lock:
            fits = [(b.nbytes, i) for i, b in enumerate(self._free) if need <= b.nbytes <= 2 * need]
            if fits:
                block = self._free.pop(min(fits)[1])
                self._free_bytes -= block.nbytes
                self.hits += 1
            else:
                block = np.empty(need + need // 8, dtype=np.uint8)
                self.misses += 1
            self._in_use += block.nbytes
            self._peak = max(self._peak, self._in_use)
            return block

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            self._in_use -= block.nbytes
            self._free.append(block)
            self._free_bytes += block.nbytes
            while self._free and self._free_bytes > self._peak:
                self._free_bytes -= self._free.pop(0).nbytes


#: the process's pool: the CPU backend's buffers of every layer share it
POOL = BufferPool()
