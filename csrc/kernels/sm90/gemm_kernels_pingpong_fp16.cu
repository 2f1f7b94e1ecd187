// The Hopper GEMM kernels of WgmmaPingPongTile, on pairs of blocks whose
// consumers take tiles in turn, for fp16 inputs: one per pair of operand
// layouts, on MN-major ones the one that sums A's rows too, and on a
// K-major A and an MN-major B the one that multiplies by an activation's
// derivative (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__half, WgmmaPingPongTile)
MPGEMM_WGMMA_ROW_SUMS_LAUNCH(__half, WgmmaPingPongTile)
MPGEMM_WGMMA_ACTIVATION_GRAD_LAUNCH(__half, WgmmaPingPongTile)
