// Entry points of the GEMM for host code: plan a problem on the current
// device, then launch it (the WMMA tiles or the Hopper kernels, and split-K's
// reduction).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "plan/gemm_plan.h"

namespace mpgemm::kernels {

// How launch_gemm runs one problem: its shape as the tile choice sees it
// (worked out once per call), the plan, and the bytes of device workspace
// the plan needs (0 without split-K or padded operands), which the caller
// allocates.
struct GemmLaunch {
  GemmShape shape;
  GemmPlan plan;
  size_t workspace_bytes = 0;
};

// The launch of `params` on the current device: the heuristic's plan, or a
// tuned one (plan_gemm of plan/gemm_plan.h with the device's limits).
GemmLaunch plan_gemm(const GemmParams& params);
// The launch of `params` with a given plan (a tuner's candidate); launch_gemm
// refuses it where the problem does not allow it.
GemmLaunch plan_gemm(const GemmParams& params, const GemmPlan& plan);

// Whether launch_gemm writes `params.pre_activation` from the GEMM's own
// epilogue (WgmmaTile's whole-K plan on K-major operands, as nn.Linear's
// forward has them) rather than by running the product again with no
// activation. GELU's tanh form (params.activation kGeluTanh) has its
// kernel on WgmmaPingPongTile instead: on a whole-K plan of that tile (the
// one plan_gemm takes for it where the heuristic's is a whole-K Hopper plan
// of K-major operands and MPGEMM_GEMM_PATH is unset or "auto"; also where
// that path or a tuned entry names the tile), and no other way:
// launch_gemm refuses it where this does not hold, and the ops then store
// the product as the pre-activation and run torch's GELU over it.
bool pre_activation_from_epilogue(const GemmParams& params, const GemmLaunch& launch);

// Whether launch_gemm multiplies A @ B by the activation's derivative at
// `params.activation_input` (common/gemm_params.h) in the GEMM's own
// epilogue: a whole-K plan of WgmmaTile or WgmmaPingPongTile (whose
// consumers multiply one tile while the other's wgmmas run:
// MPGEMM_GEMM_PATH=wgmma_pingpong, or the heuristic's for few tiles) on a
// K-major A and an MN-major B (an MLP's dgrad, dH = dY @ W2 with W2
// row-major), D of the inputs' type, rounding once. Elsewhere split-K's
// reduction multiplies the partial sums (rounding once), or a pass
// multiplies D in place after the plan's product
// (gemm/splitk_reduce.h: rounding twice, the bytes of torch's gelu_backward
// pass). Either way a single matrix (batch 1) with no bias, no
// pre-activation and no row sums.
bool activation_grad_from_epilogue(const GemmParams& params, const GemmLaunch& launch);

// Whether launch_gemm writes `params.a_row_sums` (A's row sums over K),
// which it does from the mainloop of any Hopper tile's plan (whole K, or
// WgmmaTile's split K), on MN-major operands (A column-major, B row-major:
// linear's wgrad, whose A is dZ^T), a single matrix of N and K at least 1,
// not padded, no pre-activation asked for; elsewhere (the WMMA tiles, padded
// copies) it refuses a_row_sums, and the caller sums A itself. The
// plan_gemm calls count the split's partial row sums in the workspace where
// this holds.
bool a_row_sums_from_mainloop(const GemmParams& params, const GemmLaunch& launch);

// Enqueues the GEMM described by `params` on `stream` as `launch` says,
// using `workspace` (at least launch.workspace_bytes, 16-byte aligned) for
// a padded plan's copies of the operands and split-K's partial sums (the
// copies made on `stream` first), and where params.pre_activation is set,
// the sums before the activation there too (pre_activation_from_epilogue
// says how), and where params.a_row_sums is set, A's row sums there
// (a_row_sums_from_mainloop must hold), and where params.activation_input
// is set, the product times the activation's derivative there
// (activation_grad_from_epilogue says how). `launch` must be planned for these
// params: its
// shape, which the checks below read, is theirs (a launch of other sizes is
// refused).
// Returns the launch error, cudaErrorInvalidValue for an operand that is
// neither row- nor column-major, an ab_type that is not 16-bit, a plan the
// operands or the problem do not allow (16-byte loads of unaligned operands,
// split-K of a batch) or a missing workspace, cudaErrorNotSupported for
// bf16, or a tile whose min_arch is sm_80 (common/tile_configs.h), where the
// device runs code built for an arch below sm_80, cudaSuccess otherwise.
cudaError_t launch_gemm(const GemmParams& params, const GemmLaunch& launch, void* workspace, cudaStream_t stream);

}  // namespace mpgemm::kernels
