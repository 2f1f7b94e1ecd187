// Every stand-in CUDA header, which test_kernel_sim.py precompiles once per
// sim arch and set of flags and puts ahead of each unit (-include): parsing
// them was about a third of a small unit's compile.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
