"""A kernel made to fault on a GPU, for tests/test_cuda_gpu.py's faulting-kernel test (and its CPU-side check).

The fault is an out-of-bounds write planted as the first statement of a generated kernel's body, through its
first pointer parameter, by thread 0 of block 0: it runs whatever the template does after it (an early return
of idle threads, a store that a later change of the generator moves or renames), which a replacement of one of
the template's own stores did not (RGCN's last unit stopped matching once the addend fold changed it, and the
planted fault silently stopped landing).
"""

from __future__ import annotations

import re

#: the kernel's signature up to its body's brace; group 1: the first pointer parameter's name
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?\w+\([^*)]*\*\s*'
                     r'(?:__restrict__\s+)?(\w+)[^)]*\)\s*\{')
#: what is planted: 2^40 floats past the buffer, far beyond any allocation
PLANTED = "if (blockIdx.x == 0 && threadIdx.x == 0) {{ ((volatile float*){name})[1LL << 40] = 1.0f; }}"


def plant_out_of_bounds_write(code: str) -> str:
    """``code`` with the write planted at the start of its (first) kernel's body; ValueError if it has none.

    Example:
        >>> src = 'extern "C" __global__ void k(float* __restrict__ out, long long n) {\\n  out[0] = 1.0f;\\n}'
        >>> print(plant_out_of_bounds_write(src))
        extern "C" __global__ void k(float* __restrict__ out, long long n) {
          if (blockIdx.x == 0 && threadIdx.x == 0) { ((volatile float*)out)[1LL << 40] = 1.0f; }
          out[0] = 1.0f;
        }
    """
    m = _KERNEL.search(code)
    if m is None:
        raise ValueError("no kernel with a pointer parameter in this unit: nothing to plant the fault in")
    return code[:m.end()] + "\n  " + PLANTED.format(name=m.group(1)) + code[m.end():]


def faulting_rgcn() -> tuple[object, list, int]:
    """RGCN's kernel program on a small random graph's sizes, its CUDA units with the fault planted in the last
    one, and that unit's index."""
    from rgtune.codegen.cuda.generate import generate
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    kp = compile_program(build_model("rgcn", 16, 16)).kernels
    units = generate(kp, {}).units
    last = len(units) - 1
    units[last].code = plant_out_of_bounds_write(units[last].code)
    return kp, units, last
