// The sm_90a instructions of the Hopper GEMM (wgmma_gemm.cuh), one thin
// wrapper each: mbarriers (PTX ISA 9.7.13.15), the tensor copy engine's tiled
// loads and stores (cp.async.bulk.tensor, 9.7.9.25; bulk async-groups,
// 9.7.9.26-27; the async proxy fence, 9.7.13.4), named barriers (bar.sync,
// 9.7.13.1), warpgroup MMA (wgmma, 9.7.15),
// register reallocation (setmaxnreg, 9.7.19.6) and thread block clusters
// (%cluster_ctarank 10.13, barrier.cluster 9.7.13.3, mapa 9.7.9.22). Their bodies exist only in
// the sm_90a pass (MPGEMM_SM90A); elsewhere they compile to nothing, the
// kernel that calls them is compiled out and its launcher refuses to run it.
// The host-side kernel simulation runs its models of them instead
// (tests/kernel_sim/hopper_sim.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MPGEMM_SM90A 1
#else
#define MPGEMM_SM90A 0
#endif

// Whether the wrappers emit PTX: in the sm_90a pass, but not in the
// simulation, which models what it must of them (the mbarrier init fence and
// register reallocation it has no need of).
#if defined(MPGEMM_KERNEL_SIM)
#include "kernel_sim/hopper_sim.h"
#define MPGEMM_SM90A_PTX 0
#else
#define MPGEMM_SM90A_PTX MPGEMM_SM90A
#endif

namespace mpgemm::kernels::sm90 {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
#if defined(MPGEMM_KERNEL_SIM)
  return sim::shared_address(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// --- mbarrier: a phase completes when `count` arrivals and every expected
// transaction byte have come in; waiters name the parity of the phase they
// wait for (9.7.13.15.16).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::mbarrier_init(bar, count);
#elif MPGEMM_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
#endif
}

// Makes the initialised barriers visible to the copy engine (async proxy).
__device__ __forceinline__ void fence_barrier_init() {
#if MPGEMM_SM90A_PTX
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::mbarrier_arrive(bar);
#elif MPGEMM_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
#endif
}

// One arrival that also announces `bytes` of copies completing on `bar`.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::mbarrier_arrive(bar, bytes);
#elif MPGEMM_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// Returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::mbarrier_wait(bar, parity);
#else
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
#endif
}

// --- Clusters: the blocks of a cluster run at once, each on its own
// multiprocessor, and reach each other's shared memory.
// This block's rank within its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
#if defined(MPGEMM_KERNEL_SIM)
  return sim::hopper::cluster_rank();
#elif MPGEMM_SM90A
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
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::cluster_sync();
#elif MPGEMM_SM90A
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// One arrival on the mbarrier at `bar`'s offset in the shared memory of
// block `rank` of the cluster (this block's own included), with the default
// release semantics at CTA scope: the stage reads it reports are wgmmas that
// wgmma.wait_group has already retired, and a cluster-scope release would
// put a MEMBAR.GPU before every arrival.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::mbarrier_arrive_cluster(bar, rank);
#elif MPGEMM_SM90A
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

// --- Tensor copy: box (c0, c1, c2) of `map` into shared memory at `dst`,
// its bytes counted against `bar`'s expected transactions. Elements outside
// the tensor arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::tma_load(dst, map, bar, c0, c1, c2);
#elif MPGEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(smem_address(dst)),
      "l"(map), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// The same box into `dst` of every block of the cluster whose rank's bit is
// set in `ranks`, each copy's bytes counted against the mbarrier at `bar`'s
// offset in that block.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const void* map, uint64_t* bar, int c0, int c1,
                                                      int c2, uint16_t ranks) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::tma_load(dst, map, bar, c0, c1, c2, ranks);
#elif MPGEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_address(dst)),
      "l"(map), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(ranks)
      : "memory");
#endif
}

// --- Shared-memory stores at a shared-window address, for what the copy
// engine reads next (the kernel's buffers are reached through a generic
// pointer, which would otherwise compile to generic stores): two fp32, or
// one packed pair of 16-bit elements.
__device__ __forceinline__ void st_shared(uint32_t address, float2 pair) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::st_shared(address, &pair, sizeof pair);
#elif MPGEMM_SM90A
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(pair.x), "f"(pair.y) : "memory");
#endif
}
__device__ __forceinline__ void st_shared(uint32_t address, uint32_t packed) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::st_shared(address, &packed, sizeof packed);
#elif MPGEMM_SM90A
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(address), "r"(packed) : "memory");
#endif
}

// --- Tensor store: the box of `map` at (c0, c1, c2) from shared memory at
// `src`, in this thread's open bulk async-group. Elements outside the tensor
// are not written.
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::tma_store(map, src, c0, c1, c2);
#elif MPGEMM_SM90A
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map),
               "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}

// Closes this thread's open bulk async-group.
__device__ __forceinline__ void bulk_commit_group() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::bulk_commit_group();
#elif MPGEMM_SM90A
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Returns once at most N of this thread's bulk async-groups are pending
// their reads of shared memory (the source may then be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::bulk_wait_group(N);
#elif MPGEMM_SM90A
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}

// Returns once at most N of this thread's bulk async-groups are pending at all.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::bulk_wait_group(N);
#elif MPGEMM_SM90A
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Orders this thread's ordinary shared-memory writes before what the async
// proxy (the copy engine) reads after the next barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::fence_proxy_async_shared();
#elif MPGEMM_SM90A
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Barrier `id` (1 to 15; 0 is __syncthreads') of `threads` threads, a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::named_barrier_sync(id, threads);
#elif MPGEMM_SM90A
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Arrives at barrier `id` of `threads` threads without waiting (bar.arrive):
// the threads that meet there with named_barrier_sync wait for these too.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::named_barrier_arrive(id, threads);
#elif MPGEMM_SM90A
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#endif
}

// --- Register reallocation between warpgroups (all threads of the warpgroup).
// The count must be a multiple of 8 in [24, 256] (9.7.19.6).
template <int Registers>
inline constexpr bool kValidRegisterCount = Registers % 8 == 0 && Registers >= 24 && Registers <= 256;

template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if MPGEMM_SM90A_PTX
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
#endif
}
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if MPGEMM_SM90A_PTX
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
#endif
}

// --- wgmma: asynchronous warpgroup MMA. fence before the first wgmma that
// touches accumulators the warpgroup wrote otherwise; commit closes a group;
// wait<N> returns once at most N groups are pending (9.7.15.6).
__device__ __forceinline__ void wgmma_fence() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::wgmma_fence();
#elif MPGEMM_SM90A
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::warpgroup_step(-1);
#elif MPGEMM_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::warpgroup_step(N);
#elif MPGEMM_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

// D (64 x 256, fp32, 128 registers per thread) = A (64 x 16) * B (16 x 256)
// + (accumulate ? D : 0), both operands read from shared memory through their
// descriptors (wgmma_layout.h). TransA / TransB: 1 where the operand is stored
// M- or N-major rather than K-major (9.7.15.5.1).
#define MPGEMM_ACC8(i)                                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define MPGEMM_ACC64(i)                                                                                     \
  MPGEMM_ACC8(i), MPGEMM_ACC8(i + 8), MPGEMM_ACC8(i + 16), MPGEMM_ACC8(i + 24), MPGEMM_ACC8(i + 32), \
      MPGEMM_ACC8(i + 40), MPGEMM_ACC8(i + 48), MPGEMM_ACC8(i + 56)
#define MPGEMM_WGMMA_M64N256K16(TYPES)                                                                       \
  asm volatile(                                                                                              \
      "{\n"                                                                                                  \
      "  .reg .pred accumulate;\n"                                                                          \
      "  setp.ne.b32 accumulate, %130, 0;\n"                                                                \
      "  wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES                                                 \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, " \
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, " \
      "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, " \
      "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "   \
      "%122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, %131, %132;\n"                     \
      "}\n"                                                                                                  \
      : MPGEMM_ACC64(0), MPGEMM_ACC64(64)                                                                    \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TransA), "n"(TransB))

template <class Element, int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(MPGEMM_KERNEL_SIM)
  sim::hopper::wgmma<Element, 256>(d, desc_a, desc_b, accumulate, TransA, TransB);
#elif MPGEMM_SM90A
  if constexpr (std::is_same_v<Element, __half>) MPGEMM_WGMMA_M64N256K16("f16.f16");
  else MPGEMM_WGMMA_M64N256K16("bf16.bf16");
#endif
}

#undef MPGEMM_WGMMA_M64N256K16
#undef MPGEMM_ACC64
#undef MPGEMM_ACC8

}  // namespace mpgemm::kernels::sm90
