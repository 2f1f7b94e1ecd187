// Hopper's warpgroup instructions: wgmma, the asynchronous warpgroup MMA
// that reads both operands from shared memory through matrix descriptors
// (PTX ISA 9.7.15), and setmaxnreg, which moves registers between the
// warpgroups of a block (9.7.19.6).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "arch/sm90a.h"

namespace mpgemm::kernels {

// Register reallocation between warpgroups (all threads of the warpgroup);
// the count must be a multiple of 8 in [24, 256] (9.7.19.6).
template <int Registers>
inline constexpr bool kValidRegisterCount = Registers % 8 == 0 && Registers >= 24 && Registers <= 256;

template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if MPGEMM_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
#endif
}
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kValidRegisterCount<Registers>, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if MPGEMM_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
#endif
}

// wgmma: asynchronous warpgroup MMA. fence before the first wgmma that
// touches accumulators the warpgroup wrote otherwise; commit closes a group;
// wait<N> returns once at most N groups are pending (9.7.15.6).
__device__ __forceinline__ void wgmma_fence() {
#if MPGEMM_SM90A
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MPGEMM_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if MPGEMM_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

// D (64 x N, fp32, N / 2 registers per thread) = A (64 x 16) * B (16 x N)
// + (accumulate ? D : 0), for N = 256, 128, 64 or 8, both operands read from
// shared memory through their descriptors (sm90/layout.h). TransA / TransB:
// 1 where the operand is stored M- or N-major rather than K-major
// (9.7.15.5.1).
#define MPGEMM_ACC8(i)                                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define MPGEMM_WGMMA_M64N256K16(TYPES)                                                                  \
  asm volatile(                                                                                         \
      "{\n"                                                                                             \
      "  .reg .pred accumulate;\n"                                                                      \
      "  setp.ne.b32 accumulate, %130, 0;\n"                                                            \
      "  wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES " {"                                       \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "    \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}" \
      ", %128, %129, accumulate, 1, 1, %131, %132;\n"                                                   \
      "}\n"                                                                                             \
      : MPGEMM_ACC8(0), MPGEMM_ACC8(8), MPGEMM_ACC8(16), MPGEMM_ACC8(24),                               \
        MPGEMM_ACC8(32), MPGEMM_ACC8(40), MPGEMM_ACC8(48), MPGEMM_ACC8(56),                             \
        MPGEMM_ACC8(64), MPGEMM_ACC8(72), MPGEMM_ACC8(80), MPGEMM_ACC8(88),                             \
        MPGEMM_ACC8(96), MPGEMM_ACC8(104), MPGEMM_ACC8(112), MPGEMM_ACC8(120)                           \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TransA), "n"(TransB))
#define MPGEMM_WGMMA_M64N128K16(TYPES)                                                   \
  asm volatile(                                                                          \
      "{\n"                                                                              \
      "  .reg .pred accumulate;\n"                                                       \
      "  setp.ne.b32 accumulate, %66, 0;\n"                                              \
      "  wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " {"                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"  \
      ", %64, %65, accumulate, 1, 1, %67, %68;\n"                                        \
      "}\n"                                                                              \
      : MPGEMM_ACC8(0), MPGEMM_ACC8(8), MPGEMM_ACC8(16), MPGEMM_ACC8(24),                \
        MPGEMM_ACC8(32), MPGEMM_ACC8(40), MPGEMM_ACC8(48), MPGEMM_ACC8(56)               \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TransA), "n"(TransB))
#define MPGEMM_WGMMA_M64N64K16(TYPES)                                                   \
  asm volatile(                                                                         \
      "{\n"                                                                             \
      "  .reg .pred accumulate;\n"                                                      \
      "  setp.ne.b32 accumulate, %34, 0;\n"                                             \
      "  wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " {"                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}" \
      ", %32, %33, accumulate, 1, 1, %35, %36;\n"                                       \
      "}\n"                                                                             \
      : MPGEMM_ACC8(0), MPGEMM_ACC8(8), MPGEMM_ACC8(16), MPGEMM_ACC8(24)                \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TransA), "n"(TransB))
#define MPGEMM_WGMMA_M64N8K16(TYPES)                                         \
  asm volatile(                                                              \
      "{\n"                                                                  \
      "  .reg .pred accumulate;\n"                                           \
      "  setp.ne.b32 accumulate, %6, 0;\n"                                   \
      "  wgmma.mma_async.sync.aligned.m64n8k16.f32." TYPES " {%0, %1, %2, %3}" \
      ", %4, %5, accumulate, 1, 1, %7, %8;\n"                                \
      "}\n"                                                                  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                       \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TransA), "n"(TransB))

template <int N, class Element, int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 256 || N == 128 || N == 64 || N == 8, "the widths the kernels issue");
#if MPGEMM_SM90A
  constexpr bool kHalf = std::is_same_v<Element, __half>;
  if constexpr (N == 256 && kHalf) MPGEMM_WGMMA_M64N256K16("f16.f16");
  else if constexpr (N == 256) MPGEMM_WGMMA_M64N256K16("bf16.bf16");
  else if constexpr (N == 128 && kHalf) MPGEMM_WGMMA_M64N128K16("f16.f16");
  else if constexpr (N == 128) MPGEMM_WGMMA_M64N128K16("bf16.bf16");
  else if constexpr (N == 64 && kHalf) MPGEMM_WGMMA_M64N64K16("f16.f16");
  else if constexpr (N == 64) MPGEMM_WGMMA_M64N64K16("bf16.bf16");
  else if constexpr (kHalf) MPGEMM_WGMMA_M64N8K16("f16.f16");
  else MPGEMM_WGMMA_M64N8K16("bf16.bf16");
#endif
}

#undef MPGEMM_WGMMA_M64N256K16
#undef MPGEMM_WGMMA_M64N128K16
#undef MPGEMM_WGMMA_M64N64K16
#undef MPGEMM_WGMMA_M64N8K16
#undef MPGEMM_ACC8

}  // namespace mpgemm::kernels
