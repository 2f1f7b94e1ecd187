// Flags between a grid's blocks (csrc/kernels/arch/grid_flags.cuh) for the
// host-side kernel simulation, found ahead of them on the include path.
// mock/cuda_runtime.h runs a grid's blocks one after another in ascending
// order, so a wait must find its flag already raised: one that is not waits
// on a block that has yet to run (on a GPU, on a block of a higher index,
// which need not be resident: a deadlock), and fails the run. Each wait is
// counted (sim::hopper::grid_flag_waits, ../hopper_sim.h), so that the cases can tell that a
// fix-up ran.
#pragma once

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

inline void grid_flag_add_release(int* flag, int value) { *flag += value; }

inline void grid_flag_wait(const int* flag, int value) {
  SIM_CHECK(*flag >= value, "block %u waits for a flag at %d (it holds %d) that only a block yet to run can raise",
            blockIdx.x, value, *flag);
  ++sim::hopper::grid_flag_waits;
}

inline void store_l2(float4* to, const float4& v) { *to = v; }
inline float4 load_l2(const float4* from) { return *from; }

}  // namespace mpgemm::kernels
