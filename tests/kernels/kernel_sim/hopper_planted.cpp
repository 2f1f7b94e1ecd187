// One Hopper kernel from a copy of the kernels with a bug planted in it
// (test_kernel_sim.py): PLANTED_TILE's, fp16 inputs, A row-major and B
// column-major (both K-major), the layouts `hopper_cases ... pinned` runs;
// with PLANTED_SPLIT_K, WgmmaTile's split-K and pre-activation kernels of
// those too, and its whole-K kernel that sums A's rows, on the layouts it
// takes (A column-major, B row-major), which the pinned run's row sums case
// keeps, and its kernel that multiplies by an activation's derivative, on
// its layouts (A and B row-major), which that case keeps, and its stream-K
// kernel on the pinned layouts, and the 128 x 128 tile's stream-K kernel
// on those.
// Linked ahead of the unplanted kernels, its definitions of the kernel and of
// every function it shares with them are the ones the linker keeps, so that a
// planted build compiles this one unit rather than every Hopper kernel.
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH_ONE(__half, PLANTED_TILE, true, true)
#ifdef PLANTED_SPLIT_K
MPGEMM_WGMMA_LAUNCH_KIND(__half, WgmmaTile, true, true, GemmKernel::kSplitK)
MPGEMM_WGMMA_PRE_ACTIVATION_LAUNCH(__half, WgmmaTile)
MPGEMM_WGMMA_LAUNCH_KIND(__half, WgmmaTile, false, false, GemmKernel::kRowSums)
MPGEMM_WGMMA_ACTIVATION_GRAD_LAUNCH(__half, WgmmaTile)
MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(__half, WgmmaTile, true, true)
MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(__half, WgmmaN128Tile, true, true)
#endif
