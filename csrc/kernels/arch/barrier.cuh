// Barriers among groups of threads beyond __syncthreads: named barriers of
// part of a block (bar.sync / bar.arrive, PTX ISA 9.7.13.1), and the blocks of
// a thread block cluster (%cluster_ctarank 10.13, barrier.cluster 9.7.13.3),
// which run at once, each on its own multiprocessor, and reach each other's
// shared memory.
#pragma once

#include <cstdint>

#include "arch/sm90a.h"

namespace mpgemm::kernels {

// Barrier `id` (1 to 15; 0 is __syncthreads') of `threads` threads, a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#if MPGEMM_SM90A
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Arrives at barrier `id` of `threads` threads without waiting (bar.arrive):
// the threads that meet there with named_barrier_sync wait for these too.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#if MPGEMM_SM90A
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// This block's rank within its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
#if MPGEMM_SM90A
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
#else
  return 0;
#endif
}

// Every thread of every block of the cluster meets here; what each wrote
// before (mbarrier.init included) is visible to all after.
__device__ __forceinline__ void cluster_sync() {
#if MPGEMM_SM90A
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

}  // namespace mpgemm::kernels
