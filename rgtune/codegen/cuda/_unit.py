"""What a generated CUDA kernel is: source text plus what the runtime must launch and bind.

One IR kernel becomes one :class:`KernelUnit`: a self-contained CUDA source (its own module)
with one or more ``extern "C" __global__`` functions, launched in order. Each function's
parameters are described by :class:`Arg` s, so the runtime binds them by name without parsing C.

The unit's text is ``header`` (comments naming the IR kernel, its buffers and the schedule)
followed by ``code``. Only ``code`` is hashed for caching and deduplication: the code names
buffers by role (``x``, ``out``, ``in0``), so the same kernel in two programs is one compile.

Example:
    >>> sig = Signature()
    >>> sig.add("buffer", "v3", "out", "float*")
    'out'
    >>> sig.add("size", "edge", "num_rows", "long long")
    'num_rows'
    >>> print(sig.c_params())
    float* __restrict__ out, long long num_rows
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from rgtune.ir.kernels import Kernel

ArgKind = Literal["buffer", "param", "graph", "const", "temp", "table", "size"]


@dataclass(frozen=True)
class Arg:
    """One kernel parameter.

    ``kind``/``ref`` say what the runtime passes: an IR buffer (``ref`` = its name), a param
    (name; a training program's gradient params are written), a graph index array (``GraphArrays``
    field), a per-edge graph constant (``G_<kind>``, fp32), a temporary of the unit, a host-built
    table (a GEMM's ``seg_off``, ``seg_type``, ``tile_row0``, ``tile_seg``; a scatter's grouping; a
    weight gradient's chunks) or a size (``ref`` = the row domain whose count is passed).
    """

    kind: ArgKind
    ref: str
    cname: str
    ctype: str

    def c_decl(self) -> str:
        if self.ctype.endswith("*"):
            return f"{self.ctype} __restrict__ {self.cname}"
        return f"{self.ctype} {self.cname}"


@dataclass(frozen=True)
class Temp:
    """Scratch memory of a unit: ``rows(domain) x width`` floats, filled with ``fill`` before launch."""

    name: str
    domain: str
    width: int
    fill: float


@dataclass(frozen=True)
class Grid:
    """How the runtime sizes a launch.

    ``kind="items"``: ``rows(domain) * items_per_row`` work items, ``per_block`` per block.
    ``kind="gemm"``: tiles of ``tile_rows`` rows inside each type segment (``partition``
    ``static``: ``grid = (max tiles of a segment, col_blocks, segments)``; ``balanced``:
    ``grid = (tiles, col_blocks)`` over a host-built tile -> segment table).
    ``kind="chunks"``: ``grid = (chunks, col_blocks)`` over a host-built table of row chunks (a
    weight gradient's). A unit's own counts (``chunks``, ``types``) are domains of its ``items``
    grids and temps too.
    """

    kind: Literal["items", "gemm", "chunks"]
    domain: str
    items_per_row: int = 1
    per_block: int = 1
    tile_rows: int = 0
    col_blocks: int = 1
    partition: str = ""


@dataclass(frozen=True)
class Launch:
    function: str
    grid: Grid
    threads: int
    args: tuple[Arg, ...]


@dataclass
class KernelUnit:
    """The generated CUDA for one IR kernel."""

    kernel: Kernel
    header: str
    code: str
    launches: tuple[Launch, ...]
    temps: tuple[Temp, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def source(self) -> str:
        """The full text compiled (header comments, then the code)."""
        return self.header + "\n" + self.code

    @property
    def key(self) -> str:
        """Hash of the code (not the header): equal keys compile to the same cubin."""
        return hashlib.sha256(self.code.encode()).hexdigest()

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(launch.function for launch in self.launches))


class Signature:
    """Collects a kernel's parameters as the template emits code that uses them."""

    def __init__(self) -> None:
        self.args: list[Arg] = []

    def add(self, kind: ArgKind, ref: str, cname: str, ctype: str) -> str:
        for a in self.args:
            if a.cname == cname:
                if (a.kind, a.ref) != (kind, ref):
                    raise ValueError(f"parameter {cname} bound twice: {a.kind}:{a.ref} and {kind}:{ref}")
                return cname
        self.args.append(Arg(kind, ref, cname, ctype))
        return cname

    def c_params(self) -> str:
        return ", ".join(a.c_decl() for a in self.args)


def comment_block(lines: list[str]) -> str:
    """``lines`` as ``//`` comments (a line with line breaks, a kernel's multi-line description, as several)."""
    return "\n".join("// " + line if line else "//" for text in lines for line in text.split("\n"))
