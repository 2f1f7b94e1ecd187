// Flags between the blocks of one grid in global memory: a block publishes
// what it wrote (its threads' stores, ordered before the flag by a barrier
// among them) with a release add (PTX ISA 9.7.12.7 red, .release.gpu), and
// another waits for the count it needs with acquire loads (9.7.9.8,
// .acquire.gpu), after which a barrier hands what it saw to its threads;
// their reads of the data then go to L2 (ld.global.cg, 9.7.9.8), where the
// other multiprocessor's writes are, not to a line this one may hold.
// Stream-K's fix-up (sm90/stream_k.cuh) waits this way.
#pragma once

#include <cstdint>

#include "arch/sm90a.h"

namespace mpgemm::kernels {

// Adds `value` to *flag once every write this thread has seen is visible
// at the device's scope.
__device__ __forceinline__ void grid_flag_add_release(int* flag, int value) {
#if MPGEMM_SM90A
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
#endif
}

// Waits until *flag is at least `value`; what the adds up to it published
// is then visible to this thread.
__device__ __forceinline__ void grid_flag_wait(const int* flag, int value) {
#if MPGEMM_SM90A
  int seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
  } while (seen < value);
#endif
}

// 16 bytes to and from global memory through L2 alone (.cg): the partial
// sums one block writes and another reads.
__device__ __forceinline__ void store_l2(float4* to, const float4& v) {
#if MPGEMM_SM90A
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(to), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#endif
}

__device__ __forceinline__ float4 load_l2(const float4* from) {
  float4 v{};
#if MPGEMM_SM90A
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(from)
               : "memory");
#endif
  return v;
}

}  // namespace mpgemm::kernels
