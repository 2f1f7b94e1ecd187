// The instruction level's one wrinkle: loading a 16x16 operand fragment from
// shared memory. WMMA's load_matrix_sync takes a generic pointer. For fp16
// NVVM proves it shared and ptxas emits ldmatrix (LDSM); for bf16 it does not,
// and the loads become generic LD.E with 64-bit addresses: four times as many
// instructions and more live registers in the mainloop. The PTX form of the
// same load with an explicit .shared state space gives bf16 LDSM as well.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <mma.h>

namespace mpgemm::kernels {

template <class Fragment, class Element>
__device__ __forceinline__ void load_fragment(Fragment& f, const Element* smem, unsigned ldm) {
  nvcuda::wmma::load_matrix_sync(f, smem, ldm);
}

// Not in the host-side simulation, which models fragments but runs no PTX.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(MPGEMM_KERNEL_SIM)
template <class Use, class Layout>
__device__ __forceinline__ void load_fragment(nvcuda::wmma::fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f,
                                              const __nv_bfloat16* smem, unsigned ldm) {
  // The fragment's registers as wmma.load writes them: 4 x 32 bits, two bf16 each.
  unsigned* r = reinterpret_cast<unsigned*>(f.x);
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // volatile, and "memory" for the shared memory it reads: the load must stay
  // between the barriers that guard its stage.
#define MPGEMM_WMMA_LOAD_BF16(OPERAND, LAYOUT)                                                         \
  asm volatile("wmma.load." OPERAND ".sync.aligned." LAYOUT ".m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n" \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                        \
               : "r"(address), "r"(ldm)                                                                \
               : "memory")
  constexpr bool kA = std::is_same_v<Use, nvcuda::wmma::matrix_a>;
  constexpr bool kRow = std::is_same_v<Layout, nvcuda::wmma::row_major>;
  if constexpr (kA && kRow) MPGEMM_WMMA_LOAD_BF16("a", "row");
  else if constexpr (kA) MPGEMM_WMMA_LOAD_BF16("a", "col");
  else if constexpr (kRow) MPGEMM_WMMA_LOAD_BF16("b", "row");
  else MPGEMM_WMMA_LOAD_BF16("b", "col");
#undef MPGEMM_WMMA_LOAD_BF16
}
#endif

}  // namespace mpgemm::kernels
