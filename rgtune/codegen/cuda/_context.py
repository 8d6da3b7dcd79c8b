"""Per-kernel bookkeeping shared by the templates: role names, emitters, the parameter list.

A template names its outputs (``out``, ``ep0``), hands its expressions to :meth:`Context.rename`
(every other buffer becomes ``in0``, ``in1``, ... in first-use order), emits code with
:meth:`Context.emitter`, and finally asks :meth:`Context.params` for the C parameter list:
outputs, inputs, params, graph arrays, per-edge constants, temporaries, tables, sizes, in that
order, each exactly once.

Example:
    >>> from rgtune.ir.kernels import Buffer, KernelProgram, Load, MapKernel
    >>> kp = KernelProgram("p", {"a": Buffer("a", "node", 1, 4), "b": Buffer("b", "node", 1, 4)},
    ...                    [], "a", "b", {}, {}, index_bits=32)
    >>> ctx = Context(kp, outputs={"b": "out"})
    >>> [str(e.buffer) for e in ctx.rename([Load(1, 4, "a", "row")])[0].walk()]
    ['in0']
    >>> print(ctx.params(sizes=[("node", "num_rows")]))
    float* __restrict__ out, const float* __restrict__ in0, long long num_rows
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from rgtune.codegen.cuda._expr import (GRAPH_ARRAYS, Emitter, RowIndex, constants_in, loads_in, params_in,
                                       rename_buffers)
from rgtune.codegen.cuda._unit import Arg, Launch, Signature, Temp
from rgtune.codegen.cfamily import C_TYPES, DST_ROWS, c_load, c_store
from rgtune.ir.kernels import DST_NODE, Expr, KernelProgram, Load


class Context:
    def __init__(self, kp: KernelProgram, outputs: Mapping[str, str]) -> None:
        self.kp = kp
        self.outputs = dict(outputs)  # IR buffer -> C name
        self.inputs: dict[str, str] = {}
        self.exprs: list[Expr] = []
        self.indices: list[RowIndex] = []
        self.arrays: set[str] = set()
        self.extra: list[Arg] = []  # explicit inputs added by the template (x, W, bias, ...)
        self.temps: list[Temp] = []

    # ---------------------------------------------------------------- names
    def rename(self, exprs: Sequence[Expr]) -> list[Expr]:
        for b in loads_in(list(exprs)):
            if b not in self.outputs and b not in self.inputs:
                self.inputs[b] = f"in{len(self.inputs)}"
        names = {**self.inputs, **self.outputs}
        out = [rename_buffers(e, names) for e in exprs]
        self.exprs.extend(out)
        return out

    def buffer_shapes(self) -> dict[str, tuple[int, int]]:
        shapes = {}
        for ir, c in {**self.inputs, **self.outputs}.items():
            b = self.kp.buffers[ir]
            shapes[c] = (b.heads, b.dim)
        return shapes

    def storage(self) -> dict[str, str]:
        """C name -> storage type of the kernel's buffers (outputs, inputs, those the template added) not stored
        as float32: what a load converts and a store rounds."""
        named = {c: ir for ir, c in {**self.inputs, **self.outputs}.items()}
        named.update((a.cname, a.ref) for a in self.extra if a.kind == "buffer")
        return {c: t for c, ir in named.items() if (t := self.kp.buffers[ir].dtype) != "float32"}

    def storage_of(self, cname: str) -> str:
        """The storage type of the buffer named ``cname`` in the kernel (``float32`` for anything else)."""
        return self.storage().get(cname, "float32")

    def load(self, cname: str, element: str) -> str:
        """The float value of ``element`` of buffer ``cname`` (converted from its storage type)."""
        return c_load(self.storage_of(cname), element)

    def store(self, cname: str, value: str) -> str:
        """``value`` as an element of buffer ``cname`` (rounded to its storage type)."""
        return c_store(self.storage_of(cname), value)

    def _pointer(self, ir: str, const: bool) -> str:
        return ("const " if const else "") + C_TYPES[self.kp.buffers[ir].dtype] + "*"

    def mapping_comment(self) -> str:
        parts = [f"{c} = {ir}" for ir, c in {**self.outputs, **self.inputs}.items()]
        return ", ".join(parts)

    # ---------------------------------------------------------------- emission
    def index(self, domain: str, rid: str = "rid") -> RowIndex:
        ix = RowIndex(domain, self.kp.index_bits, self.kp.pair_index, rid)
        self.indices.append(ix)
        return ix

    def emitter(self, domain: str, rid: str = "rid", acc_shape: tuple[int, int] | None = None,
                extra_buffers: Mapping[str, tuple[int, int]] | None = None) -> Emitter:
        shapes = {**self.buffer_shapes(), **(extra_buffers or {})}
        return Emitter(shapes, dict(self.kp.param_shapes), self.index(domain, rid), acc_shape, self.storage())

    def add_input(self, kind: str, ref: str, cname: str, ctype: str | None = None) -> str:
        """Adds argument ``cname`` (a buffer: of its storage type; else ``const float*`` unless ``ctype``)."""
        if ctype is None:
            ctype = self._pointer(ref, True) if kind == "buffer" else "const float*"
        self.extra.append(Arg(kind, ref, cname, ctype))  # type: ignore[arg-type]
        return cname

    def add_temp(self, temp: Temp) -> str:
        self.temps.append(temp)
        return temp.name

    # ---------------------------------------------------------------- signature
    def args(self, tables: Iterable[str] = (), sizes: Iterable[tuple[str, str]] = ()) -> tuple[Arg, ...]:
        sig = Signature()
        for ir, c in self.outputs.items():
            sig.add("buffer", ir, c, self._pointer(ir, False))
        for ir, c in self.inputs.items():
            sig.add("buffer", ir, c, self._pointer(ir, True))
        for a in self.extra:
            sig.add(a.kind, a.ref, a.cname, a.ctype)
        for p in params_in(self.exprs):
            sig.add("param", p, f"P_{p}", "const float*")
        used = set(self.arrays)
        for ix in self.indices:
            used |= ix.arrays
        for name in GRAPH_ARRAYS:
            if name in used:
                sig.add("graph", name, name, "const idx_t*")
        unknown = used - set(GRAPH_ARRAYS)
        if unknown:  # pragma: no cover - RowIndex only names known arrays
            raise ValueError(f"unknown graph arrays {sorted(unknown)}")
        for kind in constants_in(self.exprs):
            sig.add("const", kind, f"G_{kind}", "const float*")
        for t in self.temps:
            sig.add("temp", t.name, t.name, "float*")
        for t in tables:
            sig.add("table", t, t, "const idx_t*")
        for domain, cname in sizes:
            sig.add("size", domain, cname, "long long")
        if any(isinstance(x, Load) and x.guard for e in self.exprs for x in e.walk()):
            sig.add("size", DST_NODE, DST_ROWS, "long long")  # what a guarded load tests its row against
        return tuple(sig.args)

    def params(self, tables: Iterable[str] = (), sizes: Iterable[tuple[str, str]] = ()) -> str:
        return ", ".join(a.c_decl() for a in self.args(tables, sizes))


#: what a traversal body generator returns: the code, its launches, a one-line description
Body = tuple[str, tuple[Launch, ...], str]


def kernel_head(lines: list[str], fname: str, threads: int) -> None:
    """Opens ``extern "C" __global__ void fname(PARAMS)``; :func:`finish_kernel` fills PARAMS in."""
    lines.append(f"extern \"C\" __global__ void __launch_bounds__({threads}) {fname}(PARAMS) {{")


def warp_per_dst_head(lines: list[str], fname: str, threads: int, coarsening: int) -> None:
    """Opens a kernel in which a warp takes ``coarsening`` destinations in turn; each iteration
    has ``v`` (the destination row), ``lane`` and ``beg``/``end`` (its CSR in-edge range) and is
    closed by the caller."""
    kernel_head(lines, fname, threads)
    w = lines.append
    w("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;")
    w("  const int lane = threadIdx.x & 31;")
    w("#pragma unroll 1")
    w(f"  for (int cc = 0; cc < {coarsening}; ++cc) {{  // coarsening: destinations per warp")
    w(f"    const long long v = warp * {coarsening} + cc;")
    w("    if (v >= num_rows) return;  // warp-uniform")
    w("    const idx_t beg = csr_indptr[v], end = csr_indptr[v + 1];")


def softmax_fold(ind: str, m: str, den: str, x: str) -> list[str]:
    """Fold score ``x`` into a running max ``m`` and sum ``den`` of exp(score - m) (online softmax)."""
    return [f"{ind}const float mn = fmaxf({m}, {x});",
            f"{ind}{den} = {den} * expf({m} - mn) + expf({x} - mn);",
            f"{ind}{m} = mn;"]


def finish_kernel(ctx: Context, lines: list[str], sizes: list[tuple[str, str]]) -> tuple[str, tuple[Arg, ...]]:
    """The kernel text with its parameter list, and the arguments the runtime binds."""
    args = ctx.args((), sizes)
    return "\n".join(lines).replace("PARAMS", ", ".join(a.c_decl() for a in args)), args

