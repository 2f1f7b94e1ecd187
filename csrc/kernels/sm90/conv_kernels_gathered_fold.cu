// The Hopper convolution's kernels that gather a few-channel fprop's or
// wgrad's folded taps themselves (sm90/conv_kernel.cuh's
// wgmma_gathered_fold_kernel), on every tile the folded problem's plan may
// name: fprop on the wide and narrow tiles, wgrad on those and the 64-row
// one; fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

#define MPGEMM_GATHERED_FOLD_TILE(TILE)                             \
  MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__half, TILE, kFprop)           \
  MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__half, TILE, kWgrad)           \
  MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__nv_bfloat16, TILE, kFprop)    \
  MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__nv_bfloat16, TILE, kWgrad)

MPGEMM_GATHERED_FOLD_TILE(WgmmaTile)
MPGEMM_GATHERED_FOLD_TILE(WgmmaN128Tile)
MPGEMM_GATHERED_FOLD_TILE(WgmmaN64Tile)
MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__half, WgmmaM64Tile, kWgrad)
MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(__nv_bfloat16, WgmmaM64Tile, kWgrad)
