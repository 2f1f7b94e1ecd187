// Split-K's reduction, shared by the GEMM and wgrad launchers.
#pragma once

#include <cuda_runtime.h>

#include "common/gemm_params.h"

namespace mpgemm::kernels {

// Enqueues D = activation(sum over s of partials[s] + bias) for p's D (m x n,
// p.d_row_stride apart; bias and activation as p says), the partials being
// split_k fp32 copies of m x n, row stride n, summed in index order.
cudaError_t launch_splitk_reduce(const GemmParams& p, const float* partials, int split_k, cudaStream_t stream);

}  // namespace mpgemm::kernels
