// The Hopper convolution's kernels that run a strided dgrad's phases in one
// launch, their rows staged (the default; MPGEMM_DGRAD_ONE_LAUNCH=0: a launch a phase), on each
// tile, for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__half, WgmmaTile)
MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__nv_bfloat16, WgmmaTile)
MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__half, WgmmaN128Tile)
MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__nv_bfloat16, WgmmaN128Tile)
MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__half, WgmmaN64Tile)
MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(__nv_bfloat16, WgmmaN64Tile)
