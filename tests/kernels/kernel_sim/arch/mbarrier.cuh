// mbarriers (csrc/kernels/arch/mbarrier.cuh) for the host-side kernel
// simulation, found ahead of them on the include path: ../hopper_sim.h's
// models. The init fence has nothing to order there.
#pragma once

#include <cstdint>

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

inline void mbarrier_init(uint64_t* bar, int count) { sim::hopper::mbarrier_init(bar, count); }
inline void fence_barrier_init() {}
inline void mbarrier_arrive(uint64_t* bar) { sim::hopper::mbarrier_arrive(bar); }
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { sim::hopper::mbarrier_arrive(bar, bytes); }
inline void mbarrier_wait(uint64_t* bar, uint32_t parity) { sim::hopper::mbarrier_wait(bar, parity); }
inline void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) { sim::hopper::mbarrier_arrive_cluster(bar, rank); }

}  // namespace mpgemm::kernels
