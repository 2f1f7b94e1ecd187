// Entry points of the GEMM kernels for host code.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "gemm_params.h"
#include "gemm_plan.h"

namespace mpgemm::kernels {

// The problem as the tile choice sees it: sizes, and whether both operands
// allow 16-byte loads.
GemmShape gemm_shape(const GemmParams& params);

// The plan launch_gemm should run `params` with on the current device
// (plan_gemm of gemm_plan.h with the device's limits).
GemmPlan plan_gemm(const GemmParams& params);

// Bytes of device workspace `plan` needs for `params` (0 without split-K):
// the caller allocates them and passes them to launch_gemm.
size_t gemm_workspace_bytes(const GemmParams& params, const GemmPlan& plan);

// Enqueues the GEMM described by `params` on `stream` with `plan`, using
// `workspace` (at least gemm_workspace_bytes, 16-byte aligned) for split-K's
// partial sums. Returns the launch error, cudaErrorInvalidValue for an
// operand that is neither row- nor column-major, an ab_type that is not
// 16-bit, a plan the operands or the problem do not allow (16-byte loads of
// unaligned operands, split-K of a batch) or a missing workspace,
// cudaErrorNotSupported for bf16, or a tile whose min_arch is sm_80
// (gemm_plan.h), where the device runs code built for an arch below sm_80,
// cudaSuccess otherwise.
cudaError_t launch_gemm(const GemmParams& params, const GemmPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace mpgemm::kernels
