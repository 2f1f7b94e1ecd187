// The tensor copy engine (TMA): box copies between a tensor in global memory,
// described by a tensor map, and shared memory (cp.async.bulk.tensor, PTX ISA
// 9.7.9.25), in tiled mode and in im2col mode (a column of pixels of an NHWC
// tensor, PTX ISA 5.5.4), the bulk async-groups that track its stores (9.7.9.26-27), and
// the fence that orders a thread's shared-memory writes before the copy
// engine reads them (the async proxy, 9.7.13.4).
#pragma once

#include <cstdint>

#include "arch/sm90a.h"
#include "arch/smem.cuh"

namespace mpgemm::kernels {

// Box (c0, c1, c2) of `map` into shared memory at `dst`, its bytes counted
// against `bar`'s expected transactions. Elements outside the tensor arrive
// as zeros (and still count).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
#if MPGEMM_SM90A
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
#if MPGEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_address(dst)),
      "l"(map), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(ranks)
      : "memory");
#endif
}

// An im2col box of `map` (an NHWC tensor, cuTensorMapEncodeIm2col) into
// shared memory at `dst`, its bytes counted against `bar`'s expected
// transactions: the map's pixels-per-column pixels from pixel (w, h, n) on,
// stepping through its bounding box, each as its channels-per-pixel channels
// from c, read at (w + w_offset, h + h_offset). Elements outside the tensor
// arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_im2col_4d(void* dst, const void* map, uint64_t* bar, int c, int w, int h,
                                                   int n, uint16_t w_offset, uint16_t h_offset) {
#if MPGEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%3, %4, %5, %6}], [%2], {%7, %8};" ::"r"(smem_address(dst)),
      "l"(map), "r"(smem_address(bar)), "r"(c), "r"(w), "r"(h), "r"(n), "h"(w_offset), "h"(h_offset)
      : "memory");
#endif
}

// The box of `map` at (c0, c1, c2) from shared memory at `src`, in this
// thread's open bulk async-group. Elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
#if MPGEMM_SM90A
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map),
               "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}

// Closes this thread's open bulk async-group.
__device__ __forceinline__ void bulk_commit_group() {
#if MPGEMM_SM90A
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Returns once at most N of this thread's bulk async-groups are pending
// their reads of shared memory (the source may then be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
#if MPGEMM_SM90A
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}

// Returns once at most N of this thread's bulk async-groups are pending at all.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
#if MPGEMM_SM90A
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Orders this thread's ordinary shared-memory writes before what the async
// proxy (the copy engine) reads after the next barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if MPGEMM_SM90A
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

}  // namespace mpgemm::kernels
