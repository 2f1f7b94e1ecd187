// Fragment loads (csrc/kernels/arch/wmma_load.cuh) for the host-side kernel
// simulation, found ahead of them on the include path: WMMA's own
// load_matrix_sync, which mock/mma.h models.
#pragma once

#include <mma.h>

namespace mpgemm::kernels {

template <int kOffset, int kLdm, class Use, class Element, class Layout>
void load_fragment(nvcuda::wmma::fragment<Use, 16, 16, 16, Element, Layout>& f, const Element* base) {
  nvcuda::wmma::load_matrix_sync(f, base + kOffset, kLdm);
}

}  // namespace mpgemm::kernels
