// A 2-D convolution as the kernels see it, torch-free: NHWC activations and
// KRSC filters (K output channels, R x S taps, C / groups input channels
// each), dense, all of input_type (fp16, or bf16 on sm_80+), with sizes and
// raw pointers.
#pragma once

#include <cstdint>

#include "common/gemm_params.h"

namespace mpgemm::kernels {

// Each pass is an implicit GEMM (per group):
//   fprop  y  = x * w      M = N*P*Q  N = K/groups  K = R*S*C/groups
//   dgrad  dx = dy * w^T   M = N*H*W  N = C/groups  K = R*S*K/groups
//   wgrad  dw = dy^T * x   M = K/groups  N = R*S*C/groups  K = N*P*Q
enum class ConvPass : int { kFprop = 0, kDgrad = 1, kWgrad = 2 };

struct Conv2dParams {
  int64_t n = 0, h = 0, w = 0, c = 0;  // input (n, h, w, c)
  int64_t k = 0, r = 0, s = 0;         // filters (k, r, s, c / groups)
  int64_t p = 0, q = 0;                // output (n, p, q, k)
  int64_t groups = 1;
  int stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dilation_h = 1, dilation_w = 1;

  ElementType input_type = ElementType::kFloat16;  // of x, wt and dy
  const void* x = nullptr;   // fprop, wgrad
  const void* wt = nullptr;  // the filters: fprop, dgrad
  const void* dy = nullptr;  // the output's gradient: dgrad, wgrad
  // fprop: y (n, p, q, k); dgrad: dx (n, h, w, c); wgrad: dw (k, r, s, c / groups).
  void* out = nullptr;
  ElementType out_type = ElementType::kFloat32;
  const void* bias = nullptr;  // fprop only: (k,), added in the epilogue
  ElementType bias_type = ElementType::kFloat32;
  // fprop only, where the plan writes them (Conv2dPlan::moment_rows > 0):
  // each block of moment_rows rows' per-channel moments of y as stored,
  // [2][blocks][k] (common/column_moments.cuh), for training batch norm.
  float* moments = nullptr;
  // dgrad only, where the plan adds it (Conv2dPlan::addend_in_epilogue):
  // a second term of dx, of dx's type and layout (n, h, w, c), added to the
  // products in fp32 before dx's one rounding: dx = dy * w^T + addend.
  const void* addend = nullptr;
};

}  // namespace mpgemm::kernels
