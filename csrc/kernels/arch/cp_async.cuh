// cp.async (sm_80+): global -> shared copies that bypass registers, tracked in
// per-thread commit groups. On older archs these compile to nothing; callers
// only issue copies on sm_80+.
#pragma once

namespace mpgemm::kernels {

// Copies Bytes (16, 8 or 4; both addresses aligned to Bytes). With valid =
// false nothing is read and the destination is zero-filled. 16-byte copies
// bypass L1 (.cg: every byte is used once per block); the narrower ones, only
// allowed through L1 (.ca), serve operands whose rows are merely 4- or 8-byte
// aligned (odd leading dimensions). The zero-fill predicate is formed inside
// the asm, next to its one use: predicates hoisted out of the mainloop would
// outnumber the 7 predicate registers and be spilled and restored instead.
template <int Bytes>
__device__ __forceinline__ void cp_async(void* smem_dst, const void* global_src, bool valid) {
  static_assert(Bytes == 16 || Bytes == 8 || Bytes == 4, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
#define MPGEMM_CP_ASYNC(CACHE)                                     \
  asm volatile(                                                    \
      "{\n"                                                        \
      "  .reg .pred ignore_src;\n"                                 \
      "  setp.eq.u32 ignore_src, %2, 0;\n"                         \
      "  cp.async." CACHE ".shared.global [%0], [%1], %3, ignore_src;\n" \
      "}\n" ::"r"(dst),                                            \
      "l"(global_src), "r"(unsigned(valid)), "n"(Bytes))
  if constexpr (Bytes == 16)
    MPGEMM_CP_ASYNC("cg");
  else
    MPGEMM_CP_ASYNC("ca");
#undef MPGEMM_CP_ASYNC
#endif
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

}  // namespace mpgemm::kernels
