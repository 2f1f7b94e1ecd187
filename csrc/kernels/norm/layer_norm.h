// Entry points of layer norm's passes for host code (mpgemm.layer_norm):
// x seen as `rows` x `cols` (cols: the normalized dimensions' elements),
// contiguous, every such tensor of one 16-bit type; the weights and every
// statistic fp32. norm/layer_norm_math.h has the arithmetic and the fixed
// order of every sum: the results are bitwise the same on every run, and
// the CPU backend's for tensors aligned alike. The kernels are in
// norm/layer_norm.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "norm/layer_norm_math.h"

namespace mpgemm::kernels {

struct LayerNormTensors {
  int64_t rows = 0, cols = 0;
  ElementType type = ElementType::kFloat16;  // of x, y, dy and dx: fp16 or bf16
  float eps = 0.0f;
  const void* x = nullptr;
  const float* weight = nullptr;  // null: 1
  const float* bias = nullptr;    // null: 0 (forward)
  void* y = nullptr;              // forward's output
  float* mean = nullptr;          // (rows,): written by the forward, read by backward
  float* rstd = nullptr;          // (rows,): 1 / sqrt(var + eps), likewise
  const void* grad = nullptr;     // dy (backward)
  void* grad_x = nullptr;         // dx (backward; null: not computed)
  float* grad_weight = nullptr;   // (cols,): sum of dy * xhat (backward; null with grad_bias: not computed)
  float* grad_bias = nullptr;     // (cols,): sum of dy
  float* workspace = nullptr;     // layer_norm_workspace_floats(rows, cols), where the weights' sums are asked
};

// y, mean and rstd from x.
cudaError_t launch_layer_norm_forward(const LayerNormTensors& t, cudaStream_t stream);
// dx (where grad_x is given) and the weights' gradients (where grad_weight
// and grad_bias are) from dy, x, mean and rstd.
cudaError_t launch_layer_norm_backward(const LayerNormTensors& t, cudaStream_t stream);

}  // namespace mpgemm::kernels
