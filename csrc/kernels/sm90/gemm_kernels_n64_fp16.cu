// The Hopper GEMM kernels of WgmmaN64Tile, on blocks alone over 128 x 64 tiles
// for narrow outputs, for fp16 inputs: one per pair of operand layouts, and on
// MN-major ones the one that sums A's rows too (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__half, WgmmaN64Tile)
MPGEMM_WGMMA_ROW_SUMS_LAUNCH(__half, WgmmaN64Tile)
