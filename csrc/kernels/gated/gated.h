// Entry points of the gated MLP's elementwise passes for host code
// (mpgemm.gated_mlp unless MPGEMM_GATED_KERNEL=0): over `count` contiguous
// elements of one 16-bit type, the forward p = act(g) * u and the backward
// (dg, du, p) from dp, g and u, in fp32 (gated/gated_math.h), each result
// rounded once. The kernels are in gated/gated.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "gated/gated_math.h"

namespace mpgemm::kernels {

struct GatedTensors {
  int64_t count = 0;
  ElementType type = ElementType::kFloat16;  // of every tensor: fp16 or bf16
  GateActivation activation = GateActivation::kSilu;
  const void* gate = nullptr;  // g
  const void* up = nullptr;    // u
  const void* grad = nullptr;  // dp (backward)
  void* out = nullptr;         // p
  void* grad_gate = nullptr;   // dg (backward)
  void* grad_up = nullptr;     // du (backward)
};

cudaError_t launch_gated_forward(const GatedTensors& t, cudaStream_t stream);
cudaError_t launch_gated_backward(const GatedTensors& t, cudaStream_t stream);

}  // namespace mpgemm::kernels
