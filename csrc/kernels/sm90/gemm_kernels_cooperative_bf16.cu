// The Hopper GEMM kernels of WgmmaTile, on blocks alone, for bf16 inputs: one
// per pair of operand layouts, each tile's whole K and split-K, on K-major
// operands the one that stores the pre-activation too, on a K-major A and an
// MN-major B the one that multiplies by an activation's derivative, and on
// MN-major ones the two that sum A's rows too (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_SPLITK_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_PRE_ACTIVATION_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_ROW_SUMS_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_SPLITK_ROW_SUMS_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_ACTIVATION_GRAD_LAUNCH(__nv_bfloat16, WgmmaTile)
