"""Precision: the storage type of the per-edge (and per-pair) and per-node intermediates, sums kept in float32.

Knobs:

* ``precision.edges`` (``float32`` | ``bfloat16`` | ``float16``): how the buffers of edge and pair
  rows that a kernel writes row by row are stored. They are what a layer moves most of on a big
  graph (``E x heads x dim`` per message, per per-edge linear, per gradient of one), so halving
  their bytes halves the traffic of the kernels that stream them and the memory a training step
  holds between its forward and its backward. Every kernel converts a loaded element to float32,
  computes and sums in float32 (inner products, aggregations, GEMM reductions, softmax
  statistics), and rounds once when it stores (round to nearest even). On a CPU with AVX-512 BF16
  a GEMM or weight gradient that reads or writes bfloat16 rows also multiplies in bfloat16 pairs
  (its other operand and the weight rounded too, as a bfloat16 matmul does; sums in float32):
  the step's per-edge GEMMs are compute-bound, and ``vdpbf16ps`` does twice the float32 FMA's
  products (:func:`rgtune.codegen.cpu.gemm.bf16_dot`). The CUDA kernels load and store the same
  buffers in the same type and round bfloat16 the same way (:data:`rgtune.codegen.cuda._expr.LOW_PRECISION_CUDA`);
  their GEMMs multiply in float32 (no tensor-core path yet).
* ``precision.nodes`` (the same choices): the same for the per-node intermediates (HGT's keys,
  queries and values, a GEMM's input computed by an earlier kernel, their gradients), never the
  layer's input, output or gradients, which are the caller's float32 tensors.

Which buffers qualify (:func:`low_precision_buffers`, per domain class): written only by row-wise stores (a map,
an edge store, a GEMM's output row or epilogue), never accumulated into (an aggregation's
target, a scatter's, an accumulating GEMM's, a zeroed buffer), not the caller's (input,
output, gradients in and out), and holding rows of features rather than one scalar per head:
attention logits, softmax outputs and their gradients stay float32. Those are ``1 / dim`` of a
message's bytes, and ``exp`` turns a rounding of a logit ``s`` into a relative error of ``|s|``
roundings (measured: RGAT's input gradient on AIFB 4.8e-2 off float32's with bfloat16 logits).

bfloat16 keeps float32's range with 8 bits of precision; float16 has 11 bits but overflows at
65504 (a message of a layer's raw inputs is far below; an overflow would show as inf and fail
verification). Verification's tolerance for such a program is derived from the same program
rounded to the type at every op (:mod:`rgtune.tuner.verification`).

Example:
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> kp = compile_program(build_model("rgat", 8, 8, 2), {"precision.edges": "bfloat16"}).kernels
    >>> for line in kp.describe().splitlines():
    ...     if "bfloat16" in line:
    ...         print(line)
      buffer v1: edge[2x4] bfloat16
      buffer v3: edge[2x4] bfloat16
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

import torch

from rgtune.ir.kernels import NODE_ROWS, AggregateStores, EdgeStore, EdgeStores, GemmKernel, KernelProgram, MapKernel, TraversalKernel
from rgtune.ir.passes.base import Knob, Pass
from rgtune.ir.program import NODE, Program

if TYPE_CHECKING:
    from rgtune.ir.plan import LoweringPlan

#: storage types of a buffer, by name; float32 is every buffer's unless a knob says otherwise
STORAGE_TYPES = ("float32", "bfloat16", "float16")
EDGE_STORAGE = Knob("precision.edges", STORAGE_TYPES, "float32",
                    "storage type of per-edge and per-pair intermediates (sums stay float32)")
NODE_STORAGE = Knob("precision.nodes", STORAGE_TYPES, "float32",
                    "storage type of per-node intermediates, not the layer's input, output or gradients "
                    "(sums stay float32)")
#: the knobs of this pass: the storage of one class of buffers each
STORAGE_KNOBS = (EDGE_STORAGE, NODE_STORAGE)
#: the storage type's unit roundoff (half the distance from 1 to the next number): what one rounding costs
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: a policy's name (``tune --precision``, what a layer's dtype asks for) -> the storage types it allows
POLICIES = {"fp32": ("float32",), "bf16": ("bfloat16",), "fp16": ("float16",), "any": STORAGE_TYPES}


def check_policy(precision: str) -> str:
    """``precision`` if it is a policy's name (:data:`POLICIES`), else a ValueError naming the valid ones.

    >>> check_policy("bf16")
    'bf16'
    """
    if precision not in POLICIES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {list(POLICIES)}")
    return precision


def torch_dtype(storage: str) -> torch.dtype:
    """The torch dtype of a storage type name (``"bfloat16"`` -> ``torch.bfloat16``)."""
    if storage not in STORAGE_TYPES:
        raise ValueError(f"unknown storage type {storage!r}; choose one of {list(STORAGE_TYPES)}")
    return getattr(torch, storage)


def element_bytes(storage: str) -> int:
    """Bytes of one element stored as ``storage`` (4, or 2 for the 16-bit types)."""
    return torch_dtype(storage).itemsize


def lowest_storage(kp: KernelProgram) -> str:
    """The storage type of ``kp``'s least precise buffer (``float32`` when all are)."""
    return max((b.dtype for b in kp.buffers.values()), key=lambda t: UNIT_ROUNDOFF[t], default="float32")


class PrecisionPass(Pass):
    name = "precision"

    def knobs(self, program: Program, graph: Any) -> list[Knob]:
        # a program whose every value is per node has no per-edge intermediates (its node values have a knob)
        per_edge = any(op.out.domain != NODE for op in program.ops if hasattr(op, "out"))
        return [EDGE_STORAGE, NODE_STORAGE] if per_edge else [NODE_STORAGE]

    def apply(self, program: Program, config: Mapping[str, Any], graph: Any) -> Program:
        return program  # the program computes the same; lowering stores some buffers differently (plan)

    def plan(self, plan: "LoweringPlan", config: Mapping[str, Any]) -> "LoweringPlan":
        return dataclasses.replace(plan, edge_storage=config.get(EDGE_STORAGE.name, EDGE_STORAGE.default),
                                   node_storage=config.get(NODE_STORAGE.name, NODE_STORAGE.default))


def low_precision_buffers(kp: KernelProgram, nodes: bool = False) -> list[str]:
    """The buffers of ``kp`` that ``precision.edges`` (``nodes``: ``precision.nodes``) stores in its type (see
    the module docstring)."""
    caller = {kp.input, kp.output, kp.dout, kp.input_grad}
    plain: set[str] = set()  # written by a row-wise store somewhere
    other: set[str] = set()  # written any other way (accumulated, normalized in place)
    for k in kp.kernels:
        if isinstance(k, MapKernel) or (isinstance(k, TraversalKernel)
                                        and isinstance(k.stage, (EdgeStore, EdgeStores))):
            plain |= k.writes()
        elif isinstance(k, TraversalKernel) and isinstance(k.stage, AggregateStores):
            plain |= {s.out for s in k.stage.stores}
            other.add(k.stage.total.out)
        elif isinstance(k, GemmKernel):
            plain |= {o for o, _ in k.epilogue}
            if k.out is not None:
                (other if k.accumulate else plain).add(k.out)
        else:
            other |= k.writes()
    return [name for name, b in kp.buffers.items()
            if (b.domain in NODE_ROWS) == nodes and b.dim > 1 and name in plain and name not in other and name not in caller
            and name not in kp.zero_init]


def store_in(kp: KernelProgram, edges: str, nodes: str = "float32") -> KernelProgram:
    """``kp`` with its :func:`low_precision_buffers` stored as ``edges`` (per edge and pair) and ``nodes`` (per
    node); ``kp`` itself when both are float32."""
    chosen = {}
    for storage, per_node in ((edges, False), (nodes, True)):
        torch_dtype(storage)  # an unknown name is an error here, not in a code generator
        if storage != "float32":
            chosen.update(dict.fromkeys(low_precision_buffers(kp, per_node), storage))
    if not chosen:
        return kp
    buffers = {n: dataclasses.replace(b, dtype=chosen[n]) if n in chosen else b for n, b in kp.buffers.items()}
    return dataclasses.replace(kp, buffers=buffers)
