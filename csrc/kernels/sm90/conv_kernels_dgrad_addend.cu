// The Hopper convolution's dgrad kernels at stride 1 that add a second term
// to dx in their epilogue (Conv2dParams::addend; opt-in:
// MPGEMM_DGRAD_ADDEND=1, conv/launch.h's dgrad_addend), on each tile, for
// fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH_ON_EVERY_TILE(kDgrad, kAddend)
