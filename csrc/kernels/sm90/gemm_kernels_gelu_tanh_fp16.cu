// The Hopper GEMM kernel that stores the pre-activation beside D with GELU's
// tanh form as its activation (GPT-2's first MLP linear; opt-in with mlp's
// MPGEMM_EPILOGUE_PRE_ACTIVATION=1), on ping-pong pairs (one consumer's
// epilogue runs while the other's products do) over K-major operands, for
// fp16 inputs: a unit of its own, so that the units beside it build as
// before (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_PRE_ACTIVATION_GELU_TANH_LAUNCH(__half, WgmmaPingPongTile)
