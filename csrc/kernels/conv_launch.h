// Entry point of the convolution kernels for host code.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "conv_params.h"

namespace mpgemm::kernels {

// Bytes of device workspace launch_conv2d needs for `pass` of `params` on
// the current device: wgrad's split partial sums (of the implicit GEMM, or of
// the depthwise kernels), and for channels per group that no 8-byte chunk
// divides (or misaligned operands) the copies padded to whole chunks; 0 when
// neither applies. The caller allocates them.
size_t conv2d_workspace_bytes(ConvPass pass, const Conv2dParams& params);

// Enqueues one pass of the convolution described by `params` on `stream`,
// with `workspace` (at least conv2d_workspace_bytes, 16-byte aligned).
// Returns the launch error, cudaErrorInvalidValue for sizes beyond 32-bit
// implicit-GEMM indices, an input_type that is not 16-bit or a missing
// workspace, cudaErrorNotSupported for bf16 where the device runs code built
// for an arch below sm_80, cudaSuccess otherwise.
cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& params, void* workspace, cudaStream_t stream);

}  // namespace mpgemm::kernels
