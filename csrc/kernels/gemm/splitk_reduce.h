// Split-K's reduction, shared by the GEMM and wgrad launchers.
#pragma once

#include <cuda_runtime.h>

#include "common/gemm_params.h"

namespace mpgemm::kernels {

// Enqueues D = activation(sum over s of partials[s] + bias) for p's D (m x n,
// p.d_row_stride apart; bias and activation as p says), the partials being
// split_k fp32 copies of m x n, row stride n, summed in index order; where
// p.activation_input is set, D = sum * activation'(Z) instead
// (common/gemm_params.h), with no bias.
cudaError_t launch_splitk_reduce(const GemmParams& p, const float* partials, int split_k, cudaStream_t stream);

// Enqueues D = D * activation'(Z) in place for p's D (m x n, p.d_row_stride
// apart, batch 1), Z at p.activation_input laid out as D, of p.ab_type: the
// derivative where the plan's kernels stored the product without it.
cudaError_t launch_activation_grad_pass(const GemmParams& p, cudaStream_t stream);

// Enqueues sums[i] = sum over s of partials[s * m + i] for i in [0, m), in
// index order: the splits' partial row sums of A (sm90/launch.h's
// launch_wgmma_row_sums_gemm).
cudaError_t launch_row_sums_reduce(float* sums, const float* partials, int64_t m, int split_k, cudaStream_t stream);

}  // namespace mpgemm::kernels
