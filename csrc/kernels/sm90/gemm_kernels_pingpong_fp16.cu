// The Hopper GEMM kernels of WgmmaPingPongTile, on pairs of blocks whose
// consumers take tiles in turn, for fp16 inputs: one per pair of operand
// layouts, on MN-major ones the one that sums A's rows too, and on a
// K-major A and an MN-major B the one that multiplies by an activation's
// derivative, and on K-major ones the one that stores the pre-activation
// with GELU's tanh form as its activation (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__half, WgmmaPingPongTile)
MPGEMM_WGMMA_ROW_SUMS_LAUNCH(__half, WgmmaPingPongTile)
MPGEMM_WGMMA_ACTIVATION_GRAD_LAUNCH(__half, WgmmaPingPongTile)
MPGEMM_WGMMA_PRE_ACTIVATION_GELU_TANH_LAUNCH(__half, WgmmaPingPongTile)
