// The Hopper GEMM kernels of WgmmaPairTile, on pairs of blocks that share B's
// copies, for fp16 inputs: one per pair of operand layouts, and on MN-major
// ones the one that sums A's rows too (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__half, WgmmaPairTile)
MPGEMM_WGMMA_ROW_SUMS_LAUNCH(__half, WgmmaPairTile)
