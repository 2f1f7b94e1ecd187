// Entry point of the gradient-unscaling kernel for host code.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/gemm_params.h"

namespace mpgemm::kernels {

// A contiguous run of one gradient: elements [begin, end) of src, unscaled into dst.
struct UnscaleChunk {
  const void* src;
  void* dst;
  int64_t begin, end;
  ElementType src_type, dst_type;  // each fp32, fp16 or bf16
};

// dst = src * inv_scale for every chunk, in one launch, and *found_inf = 1
// if any result is inf or NaN (it is never reset here). `chunks` lives in
// device memory; inv_scale and found_inf are device pointers, so the host
// never waits.
cudaError_t launch_unscale(const UnscaleChunk* chunks, int64_t num_chunks, const float* inv_scale,
                           float* found_inf, cudaStream_t stream);

}  // namespace mpgemm::kernels
