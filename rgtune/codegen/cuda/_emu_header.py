"""The C++ header that lets generated CUDA run on the CPU (see :mod:`.emulate`).

Every CUDA thread of a block is a green thread (``ucontext``) on one OS thread; blocks run one
after the other, so ``__shared__`` becomes ``static`` (one copy, used by one block at a time).
A thread enters its own stack once per launch through ``setcontext`` and runs the kernel for one
block after the other (it waits, finished, for the next block); every later switch (a barrier, a
shuffle, the scheduler, the next block) is ``_setjmp``/``_longjmp``, which unlike ``swapcontext``
saves and restores no signal mask (a system call per switch, which made warp shuffles most of the
time).
Jumping between stacks so is what ``_FORTIFY_SOURCE``'s ``longjmp`` check forbids, so the header
turns it off.
``__syncthreads()`` parks a thread until every live thread of the block is parked; a warp
shuffle parks the lane until every live lane of its warp arrived (twice: write, then read), as
``__syncwarp()`` does once.
Atomics are plain read-modify-writes (nothing runs concurrently). ``__CUDA_ARCH__`` is set
by the caller, so both sides of an architecture test are exercised.

The header includes C headers only and declares the C math functions kernels call instead of
including ``<math.h>`` (which in C++ pulls in ``<cmath>``): a unit then compiles in about a third
of the time, which is most of what checking many kernels on the emulator costs.
"""

EMU_HEADER = r"""
#define RG_EMULATED 1  // the 16-bit conversions without PTX (rgtune.codegen.cuda._expr.LOW_PRECISION_CUDA)
#undef _FORTIFY_SOURCE  // its longjmp check refuses the switches between the green threads' stacks
#include <setjmp.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <ucontext.h>

extern "C" {  // the C math library, declared rather than included (see the module's docstring)
float expf(float); float expm1f(float); float logf(float); float log1pf(float); float sqrtf(float);
float erff(float); float erfcf(float); float tanhf(float); float fabsf(float); float powf(float, float);
float fmaxf(float, float); float fminf(float, float); float fmaf(float, float, float);
float floorf(float); float ceilf(float);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static

struct uint3 { unsigned x, y, z; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { float2 r = {x, y}; return r; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = {x, y, z, w}; return r; }

namespace rg_emu {
enum { RUNNABLE = 0, AT_BLOCK = 1, AT_WARP = 2, DONE = 3 };
struct Thread { ucontext_t ctx; jmp_buf jb; int state; int started; uint3 idx; char* stack; size_t size; };
static uint3 block_idx, block_dim, grid_dim;
static Thread* cur = nullptr;
static jmp_buf sched;  // where a parked or finished thread returns to: the scheduler in run_block
static void (*body)(void**) = nullptr;  // the kernel call of a launch, and its arguments
static void** body_args = nullptr;
static float exch[32][32];
static void park(int state) { cur->state = state; if (!_setjmp(cur->jb)) _longjmp(sched, 1); }
static void entry() {  // a thread's life in a launch: the kernel for each block it is resumed for
  for (;;) {
    body(body_args);
    park(DONE);  // resumed at the next block's start
  }
}
// runs thread t until it parks or finishes: the first time onto its own stack, later where it parked
static void resume(Thread* t) {
  cur = t;
  if (_setjmp(sched)) return;
  if (!t->started) { t->started = 1; setcontext(&t->ctx); }
  _longjmp(t->jb, 1);
}

// runs one block (its threads finished the previous one); returns 0, or 1 on a deadlock (threads parked at
// different barriers)
static int run_block(Thread* th, unsigned n) {
  for (unsigned t = 0; t < n; ++t) th[t].state = RUNNABLE;
  for (;;) {
    for (unsigned t = 0; t < n; ++t)
      if (th[t].state == RUNNABLE) resume(&th[t]);
    bool all_done = true, released = false;
    for (unsigned t = 0; t < n; ++t) all_done = all_done && th[t].state == DONE;
    if (all_done) return 0;
    for (unsigned w = 0; w * 32 < n; ++w) {  // a warp whose live lanes all wait at a shuffle
      bool ready = true, any = false;
      for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t) {
        if (th[t].state == DONE) continue;
        any = true;
        ready = ready && th[t].state == AT_WARP;
      }
      if (any && ready) {
        for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t) if (th[t].state == AT_WARP) th[t].state = RUNNABLE;
        released = true;
      }
    }
    if (!released) {  // the block barrier: every live thread waits there
      bool ready = true;
      for (unsigned t = 0; t < n; ++t) ready = ready && (th[t].state == DONE || th[t].state == AT_BLOCK);
      if (!ready) return 1;
      for (unsigned t = 0; t < n; ++t) if (th[t].state == AT_BLOCK) th[t].state = RUNNABLE;
    }
  }
}

static int run_grid(unsigned gx, unsigned gy, unsigned gz, unsigned bx, void (*f)(void**), void** args) {
  Thread* th = (Thread*)calloc(bx, sizeof(Thread));
  for (unsigned t = 0; t < bx; ++t) {
    th[t].size = 256 * 1024;
    th[t].stack = (char*)malloc(th[t].size);
    getcontext(&th[t].ctx);
    th[t].ctx.uc_stack.ss_sp = th[t].stack;
    th[t].ctx.uc_stack.ss_size = th[t].size;
    th[t].ctx.uc_link = nullptr;  // entry never returns: it parks between blocks
    th[t].idx.x = t; th[t].idx.y = 0; th[t].idx.z = 0;
    makecontext(&th[t].ctx, entry, 0);
  }
  body = f;
  body_args = args;
  int failed = 0;
  grid_dim.x = gx; grid_dim.y = gy; grid_dim.z = gz;
  block_dim.x = bx; block_dim.y = 1; block_dim.z = 1;
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        block_idx.x = x; block_idx.y = y; block_idx.z = z;
        if (!failed && run_block(th, bx)) failed = 1;
      }
  for (unsigned t = 0; t < bx; ++t) free(th[t].stack);
  free(th);
  return failed;
}
}  // namespace rg_emu

#define threadIdx (rg_emu::cur->idx)
#define blockIdx (rg_emu::block_idx)
#define blockDim (rg_emu::block_dim)
#define gridDim (rg_emu::grid_dim)

static inline void __syncthreads() { rg_emu::park(rg_emu::AT_BLOCK); }
static inline void __syncwarp(unsigned = 0xffffffffu) { rg_emu::park(rg_emu::AT_WARP); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
  const unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  rg_emu::exch[w][lane] = v;
  rg_emu::park(rg_emu::AT_WARP);
  const float r = rg_emu::exch[w][lane ^ (unsigned)o];
  rg_emu::park(rg_emu::AT_WARP);
  return r;
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline float atomicAdd(float* a, float v) { float o = *a; *a = o + v; return o; }
static inline float2 atomicAdd(float2* a, float2 v) { float2 o = *a; a->x += v.x; a->y += v.y; return o; }
static inline float4 atomicAdd(float4* a, float4 v) {
  float4 o = *a; a->x += v.x; a->y += v.y; a->z += v.z; a->w += v.w; return o;
}
static inline int atomicMax(int* a, int v) { int o = *a; if (v > o) *a = v; return o; }
static inline unsigned atomicMin(unsigned* a, unsigned v) { unsigned o = *a; if (v < o) *a = v; return o; }

// PTX mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 for the warp: every lane hands in its
// fragments (parks until the whole warp has), each reads the warp's A (16x16) and B (16x8) back as the PTX ISA
// lays them out (groupID = lane / 4, q = lane % 4; a0..a7: rows g, g, g + 8, g + 8, g, g, g + 8, g + 8 at
// columns 2q + (i & 1), + 8 from a4; b0..b3: rows 2q + (i & 1), + 8 from b2, column g) and adds its four
// elements of A * B (rows g, g, g + 8, g + 8, columns 2q, 2q + 1) to d
namespace rg_emu { static unsigned mma_exch[32][32][6]; }
static inline float rg_emu_half(unsigned bits, int f16) {
  if (!f16) { const unsigned u = bits << 16; float f; memcpy(&f, &u, 4); return f; }
  _Float16 h; const unsigned short v = (unsigned short)bits; memcpy(&h, &v, 2); return (float)h;
}
static inline void rg_emu_mma_16816(float* d, const unsigned* a, const unsigned* b, int f16) {
  const unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  for (int i = 0; i < 4; ++i) rg_emu::mma_exch[w][lane][i] = a[i];
  for (int i = 0; i < 2; ++i) rg_emu::mma_exch[w][lane][4 + i] = b[i];
  rg_emu::park(rg_emu::AT_WARP);
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, q = l % 4;
    for (int i = 0; i < 8; ++i) {
      const unsigned bits = (rg_emu::mma_exch[w][l][i / 2] >> (16 * (i % 2))) & 0xffffu;
      A[g + ((i / 2) % 2) * 8][2 * q + (i & 1) + (i >= 4 ? 8 : 0)] = rg_emu_half(bits, f16);
    }
    for (int i = 0; i < 4; ++i) {
      const unsigned bits = (rg_emu::mma_exch[w][l][4 + i / 2] >> (16 * (i % 2))) & 0xffffu;
      B[2 * q + (i & 1) + (i >= 2 ? 8 : 0)][g] = rg_emu_half(bits, f16);
    }
  }
  rg_emu::park(rg_emu::AT_WARP);  // every lane has read the warp's fragments before any hands in new ones
  const unsigned g = lane / 4, q = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum = fmaf(A[row][k], B[k][col], sum);
    d[i] = sum;
  }
}
"""
