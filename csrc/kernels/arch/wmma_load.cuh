// The instruction level's one wrinkle: loading a 16x16 operand fragment from
// shared memory. WMMA's load_matrix_sync takes a generic pointer and a
// run-time ldm; ptxas then recomputes each load's per-lane address in the
// mainloop (two integer instructions per LDSM), and for bf16 NVVM does not
// even see that the pointer is shared (generic LD.E, 64-bit addresses). The
// PTX form of the same load, with the .shared state space and the fragment's
// place in the tile as an immediate, compiles to LDSM [R + offset]: the
// per-lane address is worked out once per stage, and every fragment of the
// stage lies a constant away from it.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

namespace mpgemm::kernels {

#if defined(__CUDA_ARCH__)
namespace detail {

// The registers wmma.load writes, as the fragment stores them: eight 32-bit
// words (two fp16 each; sm_80 and newer use four of them) for fp16, four for bf16.
template <class Use, class Layout, class Element, int kOffsetBytes, int kLdm>
__device__ __forceinline__ void wmma_load_shared(unsigned* r, unsigned address) {
  constexpr bool kA = std::is_same_v<Use, nvcuda::wmma::matrix_a>;
  constexpr bool kRow = std::is_same_v<Layout, nvcuda::wmma::row_major>;
  // volatile, and "memory" for the shared memory it reads: a load must stay
  // between the barriers that guard its stage.
#define MPGEMM_WMMA_LOAD_F16(OPERAND, LAYOUT)                                                              \
  asm volatile("wmma.load." OPERAND ".sync.aligned." LAYOUT ".m16n16k16.shared.f16 "                      \
               "{%0, %1, %2, %3, %4, %5, %6, %7}, [%8+%9], %10;\n"                                          \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]) \
               : "r"(address), "n"(kOffsetBytes), "n"(kLdm)                                                \
               : "memory")
#define MPGEMM_WMMA_LOAD_BF16(OPERAND, LAYOUT)                                                \
  asm volatile("wmma.load." OPERAND ".sync.aligned." LAYOUT ".m16n16k16.shared.bf16 "        \
               "{%0, %1, %2, %3}, [%4+%5], %6;\n"                                              \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                               \
               : "r"(address), "n"(kOffsetBytes), "n"(kLdm)                                   \
               : "memory")
  if constexpr (std::is_same_v<Element, __half>) {
    if constexpr (kA && kRow) MPGEMM_WMMA_LOAD_F16("a", "row");
    else if constexpr (kA) MPGEMM_WMMA_LOAD_F16("a", "col");
    else if constexpr (kRow) MPGEMM_WMMA_LOAD_F16("b", "row");
    else MPGEMM_WMMA_LOAD_F16("b", "col");
  } else {
    static_assert(std::is_same_v<Element, __nv_bfloat16>, "fragments hold fp16 or bf16");
    if constexpr (kA && kRow) MPGEMM_WMMA_LOAD_BF16("a", "row");
    else if constexpr (kA) MPGEMM_WMMA_LOAD_BF16("a", "col");
    else if constexpr (kRow) MPGEMM_WMMA_LOAD_BF16("b", "row");
    else MPGEMM_WMMA_LOAD_BF16("b", "col");
  }
#undef MPGEMM_WMMA_LOAD_F16
#undef MPGEMM_WMMA_LOAD_BF16
}

}  // namespace detail
#endif

// Loads the fragment that starts kOffset elements past `base` in a shared
// tile whose rows are kLdm elements apart.
template <int kOffset, int kLdm, class Use, class Element, class Layout>
__device__ __forceinline__ void load_fragment(nvcuda::wmma::fragment<Use, 16, 16, 16, Element, Layout>& f,
                                              const Element* base) {
#if defined(__CUDA_ARCH__)
  detail::wmma_load_shared<Use, Layout, Element, kOffset * int(sizeof(Element)), kLdm>(
      reinterpret_cast<unsigned*>(f.x), static_cast<unsigned>(__cvta_generic_to_shared(base)));
#else
  nvcuda::wmma::load_matrix_sync(f, base + kOffset, kLdm);
#endif
}

}  // namespace mpgemm::kernels
