// mbarriers (PTX ISA 9.7.13.15): a phase completes when `count` arrivals and
// every expected transaction byte have come in; waiters name the parity of
// the phase they wait for (9.7.13.15.16). The Hopper kernels' ring of stages
// is guarded by them, the copy engine's loads completing on them.
#pragma once

#include <cstdint>

#include "arch/sm90a.h"
#include "arch/smem.cuh"

namespace mpgemm::kernels {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
#if MPGEMM_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the copy engine (async proxy).
__device__ __forceinline__ void fence_barrier_init() {
#if MPGEMM_SM90A
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if MPGEMM_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
#endif
}

// One arrival that also announces `bytes` of copies completing on `bar`.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if MPGEMM_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// Returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = smem_address(bar);
  uint32_t done = 0;
  do {
#if MPGEMM_SM90A
    asm volatile(
        "{\n"
        "  .reg .pred complete;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
#endif
  } while (!done);
}

// One arrival on the mbarrier at `bar`'s offset in the shared memory of
// block `rank` of the cluster (this block's own included), with the default
// release semantics at CTA scope: the stage reads it reports are wgmmas that
// wgmma.wait_group has already retired, and a cluster-scope release would
// put a MEMBAR.GPU before every arrival.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
#if MPGEMM_SM90A
  asm volatile(
      "{\n"
      "  .reg .b32 remote;\n"
      "  mapa.shared::cluster.u32 remote, %0, %1;\n"
      "  mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(rank)
      : "memory");
#endif
}

}  // namespace mpgemm::kernels
