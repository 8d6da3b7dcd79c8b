"""The C++ header that lets generated CUDA run on the CPU (see :mod:`.emulate`).

Every CUDA thread of a block is a green thread (``ucontext``) on one OS thread; blocks run one
after the other, so ``__shared__`` becomes ``static`` (one copy, used by one block at a time).
``__syncthreads()`` parks a thread until every live thread of the block is parked; a warp
shuffle parks the lane until every live lane of its warp arrived (twice: write, then read).
Atomics are plain read-modify-writes (nothing runs concurrently). ``__CUDA_ARCH__`` is set
by the caller, so both sides of an architecture test are exercised.
"""

EMU_HEADER = r"""
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <ucontext.h>
#include <functional>
#include <vector>

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
struct Thread { ucontext_t ctx; int state; uint3 idx; char* stack; size_t size; };
static uint3 block_idx, block_dim, grid_dim;
static Thread* cur = nullptr;
static ucontext_t sched;
static std::function<void()>* body = nullptr;
static float exch[32][32];
static void park(int state) { cur->state = state; swapcontext(&cur->ctx, &sched); }
static void entry() { (*body)(); cur->state = DONE; }

// runs one block; returns 0, or 1 on a deadlock (threads parked at different barriers)
static int run_block(std::vector<Thread>& th, unsigned n) {
  for (unsigned t = 0; t < n; ++t) {
    getcontext(&th[t].ctx);
    th[t].ctx.uc_stack.ss_sp = th[t].stack;
    th[t].ctx.uc_stack.ss_size = th[t].size;
    th[t].ctx.uc_link = &sched;
    th[t].state = RUNNABLE;
    th[t].idx.x = t; th[t].idx.y = 0; th[t].idx.z = 0;
    makecontext(&th[t].ctx, entry, 0);
  }
  for (;;) {
    for (unsigned t = 0; t < n; ++t)
      if (th[t].state == RUNNABLE) { cur = &th[t]; swapcontext(&sched, &th[t].ctx); }
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

static int run_grid(unsigned gx, unsigned gy, unsigned gz, unsigned bx, std::function<void()>& f) {
  std::vector<Thread> th(bx);
  for (auto& t : th) { t.size = 256 * 1024; t.stack = (char*)malloc(t.size); }
  body = &f;
  int failed = 0;
  grid_dim.x = gx; grid_dim.y = gy; grid_dim.z = gz;
  block_dim.x = bx; block_dim.y = 1; block_dim.z = 1;
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        block_idx.x = x; block_idx.y = y; block_idx.z = z;
        if (!failed && run_block(th, bx)) failed = 1;
      }
  for (auto& t : th) free(t.stack);
  return failed;
}
}  // namespace rg_emu

#define threadIdx (rg_emu::cur->idx)
#define blockIdx (rg_emu::block_idx)
#define blockDim (rg_emu::block_dim)
#define gridDim (rg_emu::grid_dim)

static inline void __syncthreads() { rg_emu::park(rg_emu::AT_BLOCK); }
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
static inline float atomicAdd(float* a, float v) { float o = *a; *a = o + v; return o; }
static inline float2 atomicAdd(float2* a, float2 v) { float2 o = *a; a->x += v.x; a->y += v.y; return o; }
static inline float4 atomicAdd(float4* a, float4 v) {
  float4 o = *a; a->x += v.x; a->y += v.y; a->z += v.z; a->w += v.w; return o;
}
static inline int atomicMax(int* a, int v) { int o = *a; if (v > o) *a = v; return o; }
static inline unsigned atomicMin(unsigned* a, unsigned v) { unsigned o = *a; if (v < o) *a = v; return o; }
"""
