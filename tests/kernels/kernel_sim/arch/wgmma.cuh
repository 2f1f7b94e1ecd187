// Warpgroup MMA (csrc/kernels/arch/wgmma.cuh) for the host-side kernel
// simulation, found ahead of it on the include path: ../hopper_sim.h's
// models of wgmma and its groups. Register reallocation has nothing to do there.
#pragma once

#include <cstdint>

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

template <int Registers>
void setmaxnreg_dec() {}
template <int Registers>
void setmaxnreg_inc() {}

inline void wgmma_fence() { sim::hopper::wgmma_fence(); }
inline void wgmma_commit() { sim::hopper::warpgroup_step(-1); }
template <int N>
void wgmma_wait() {
  sim::hopper::warpgroup_step(N);
}

template <int N, class Element, int TransA, int TransB>
void wgmma_m64nNk16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  sim::hopper::wgmma<Element, N>(d, desc_a, desc_b, accumulate, TransA, TransB);
}

}  // namespace mpgemm::kernels
