// Entry point of the mma.sync ceiling kernel for host code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/tile_configs.h"

namespace mpgemm::kernels {

// Every warp of `blocks` blocks of MmaCeilingTile::kThreads threads computes
// `iterations` * (a @ b) by issuing `iterations` rounds of WMMA mma_sync from
// registers, and writes it to its own (kWarpM, kWarpN) slot of out.
//   a:   (kWarpM, 16) row-major fp16;  b: (16, kWarpN) row-major fp16;
//   out: (blocks, kWarpsM * kWarpsN, kWarpM, kWarpN) row-major fp32.
// All three are device pointers; a and b 16-byte aligned.
cudaError_t launch_mma_ceiling(const __half* a, const __half* b, float* out, int iterations, int blocks,
                               cudaStream_t stream);

}  // namespace mpgemm::kernels
