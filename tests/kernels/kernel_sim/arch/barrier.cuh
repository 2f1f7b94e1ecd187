// Named barriers and clusters (csrc/kernels/arch/barrier.cuh) for the
// host-side kernel simulation, found ahead of them on the include path:
// ../hopper_sim.h's models (mock/cuda_runtime.h runs a cluster's blocks at once).
#pragma once

#include <cstdint>

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

inline void named_barrier_sync(int id, int threads) { sim::hopper::named_barrier_sync(id, threads); }
inline void named_barrier_arrive(int id, int threads) { sim::hopper::named_barrier_arrive(id, threads); }
inline uint32_t cluster_rank() { return sim::hopper::cluster_rank(); }
inline void cluster_sync() { sim::hopper::cluster_sync(); }

}  // namespace mpgemm::kernels
