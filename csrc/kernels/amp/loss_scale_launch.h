// Entry point of the loss scale's update kernel for host code.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "amp/loss_scale.h"

namespace mpgemm::kernels {

// update_loss_scale on device pointers, one thread on `stream`: nothing is
// read back to the host, so a step with it can be captured in a CUDA graph.
cudaError_t launch_update_loss_scale(float* scale, int64_t* counters, const float* found_inf,
                                     const LossScaleRule& rule, cudaStream_t stream);

}  // namespace mpgemm::kernels
