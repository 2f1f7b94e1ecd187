// Shared memory: the block's dynamic shared memory, the shared-window address
// of a pointer into it (what mbarriers, copies and wgmma descriptors take),
// and stores and loads through that window.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "arch/sm90a.h"

namespace mpgemm::kernels {

// The block's dynamic shared memory, which every kernel names.
extern __shared__ __align__(128) unsigned char smem[];

// The same, as the kernels that run on clusters of blocks take it: the
// running block's own, where a cluster's blocks each have theirs. (The
// kernels of lone blocks name `smem` itself; reached through a function, it
// compiles to other code for them.)
__device__ __forceinline__ unsigned char* block_shared_memory() { return smem; }

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Stores at a shared-window address, for what the copy engine reads next
// (a generic pointer would compile to generic stores): two fp32, or one
// packed pair of 16-bit elements.
__device__ __forceinline__ void st_shared(uint32_t address, float2 pair) {
#if MPGEMM_SM90A
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(pair.x), "f"(pair.y) : "memory");
#endif
}
__device__ __forceinline__ void st_shared(uint32_t address, uint32_t packed) {
#if MPGEMM_SM90A
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(address), "r"(packed) : "memory");
#endif
}

// A 4-byte load from a shared-window address: a word of a strip the
// warpgroup wrote (its column moments, sm90/epilogue.cuh).
__device__ __forceinline__ uint32_t ld_shared_4(uint32_t address) {
  uint32_t v = 0;
#if MPGEMM_SM90A
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(address) : "memory");
#endif
  return v;
}

// A 16-byte load from a shared-window address: what a thread reads back of a
// strip the warpgroup wrote.
__device__ __forceinline__ uint4 ld_shared_16(uint32_t address) {
  uint4 v{};
#if MPGEMM_SM90A
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
#endif
  return v;
}

}  // namespace mpgemm::kernels
