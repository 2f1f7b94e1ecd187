// Shared memory (csrc/kernels/arch/smem.cuh) for the host-side kernel
// simulation, found ahead of it on the include path: `smem`, the storage the
// drivers define, which the blocks that run one at a time share; each
// block's own in a cluster, whose blocks run at once (block_shared_memory:
// the driver's for the first); addresses as offsets into it; and stores
// and loads through the shared window, modelled (../hopper_sim.h).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

extern unsigned char smem[];

inline unsigned char* block_shared_memory() { return sim::shared_memory; }

inline uint32_t smem_address(const void* p) { return sim::shared_address(p); }

inline void st_shared(uint32_t address, float2 pair) { sim::hopper::st_shared(address, &pair, sizeof pair); }
inline void st_shared(uint32_t address, uint32_t packed) { sim::hopper::st_shared(address, &packed, sizeof packed); }
inline uint32_t ld_shared_4(uint32_t address) {
  uint32_t v;
  sim::hopper::ld_shared(address, &v, sizeof v);
  return v;
}
inline uint4 ld_shared_16(uint32_t address) {
  uint4 v;
  sim::hopper::ld_shared(address, &v, sizeof v);
  return v;
}

}  // namespace mpgemm::kernels
