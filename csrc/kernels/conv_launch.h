// Entry point of the convolution kernels for host code.
#pragma once

#include <cuda_runtime.h>

#include "conv_params.h"

namespace mpgemm::kernels {

// Enqueues one pass of the convolution described by `params` on `stream`.
// Returns the launch error, cudaErrorInvalidValue for sizes beyond 32-bit
// implicit-GEMM indices or an input_type that is not 16-bit,
// cudaErrorNotSupported for bf16 where the device runs code built for an arch
// below sm_80, cudaSuccess otherwise.
cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& params, cudaStream_t stream);

}  // namespace mpgemm::kernels
