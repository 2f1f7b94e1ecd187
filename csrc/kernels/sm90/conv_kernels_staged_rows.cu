// The Hopper convolution's dgrad kernels that store a strided phase's rows
// through shared memory (the default; not with MPGEMM_STAGED_ROW_STORES=0),
// on each tile, for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH_ONE(__half, WgmmaTile, kDgrad, true)
MPGEMM_WGMMA_CONV_LAUNCH_ONE(__nv_bfloat16, WgmmaTile, kDgrad, true)
MPGEMM_WGMMA_CONV_LAUNCH_ONE(__half, WgmmaN128Tile, kDgrad, true)
MPGEMM_WGMMA_CONV_LAUNCH_ONE(__nv_bfloat16, WgmmaN128Tile, kDgrad, true)
MPGEMM_WGMMA_CONV_LAUNCH_ONE(__half, WgmmaN64Tile, kDgrad, true)
MPGEMM_WGMMA_CONV_LAUNCH_ONE(__nv_bfloat16, WgmmaN64Tile, kDgrad, true)
