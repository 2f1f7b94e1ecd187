// The Hopper convolution's fprop kernels that also write each 64-row
// block's column moments of y (for training batch norm, conv/launch.h's
// Conv2dPlan::moment_rows), on each tile, for fp16 and bf16 inputs
// (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH_ON_EVERY_TILE(kFprop, kMoments)
