// Entry point of the GEMM kernels for host code.
#pragma once

#include <cuda_runtime.h>

#include "gemm_params.h"

namespace mpgemm::kernels {

// Enqueues the GEMM described by `params` on `stream`. Returns the launch
// error, cudaErrorInvalidValue for an operand that is neither row- nor
// column-major or an ab_type that is not 16-bit, cudaErrorNotSupported for
// bf16 where the device runs code built for an arch below sm_80, cudaSuccess
// otherwise.
cudaError_t launch_gemm(const GemmParams& params, cudaStream_t stream);

}  // namespace mpgemm::kernels
