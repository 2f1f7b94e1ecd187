// Activations of the GEMM epilogue, in fp32. Shared by the CUDA kernels and the
// CPU reference so both backends compute the same function.
#pragma once

#include <cmath>

#include "common/gemm_params.h"
#include "common/host_device.h"

namespace mpgemm::kernels {

MPGEMM_HOST_DEVICE float apply_activation(Activation activation, float x) {
  switch (activation) {
    case Activation::kRelu:
      // Written so that NaN propagates, as torch.relu does.
      return x < 0.0f ? 0.0f : x;
    case Activation::kGelu:
      // The exact (erf) form, torch.nn.functional.gelu's default.
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    default:
      return x;
  }
}

// GELU's tanh form (GPT-2's, torch's approximate="tanh"), whose derivative
// apply_activation_grad gives: one forward epilogue applies it, the Hopper
// pre-activation kernel built for it (sm90/epilogue.cuh's
// activate_gelu_tanh; adding it to apply_activation's cases would change
// every default kernel's code), and the gated MLP's passes do
// (gated/gated_math.h).
constexpr float kGeluTanhBeta = 0.79788456080286536f, kGeluTanhKappa = 0.044715f;  // sqrt(2 / pi), GPT-2's

MPGEMM_HOST_DEVICE float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluTanhBeta * (x + kGeluTanhKappa * x * x * x)));
}

// grad * activation'(z): the gradient of the activation's input from its
// output's (GemmParams::activation_input). ReLU's selects, as torch's
// threshold_backward does (a NaN z passes grad on, an infinite grad times a
// zero slope gives 0, not NaN); GELU's is Phi(z) + z * phi(z) for the erf
// form, and for the tanh form, with u = sqrt(2 / pi) * (z + 0.044715 z^3),
// 0.5 (1 + tanh u) + 0.5 z (1 - tanh^2 u) du/dz, as torch's gelu_backward.
MPGEMM_HOST_DEVICE float apply_activation_grad(Activation activation, float grad, float z) {
  switch (activation) {
    case Activation::kRelu:
      return z <= 0.0f ? 0.0f : grad;
    case Activation::kGelu: {
      const float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752f));
      const float pdf = 0.39894228040143268f * expf(-0.5f * z * z);
      return grad * (cdf + z * pdf);
    }
    case Activation::kGeluTanh: {
      constexpr float kBeta = kGeluTanhBeta, kKappa = kGeluTanhKappa;
      const float z_sq = z * z, t = tanhf(kBeta * (z + kKappa * z_sq * z));
      return grad * (0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * z_sq));
    }
    default:
      return grad;
  }
}

}  // namespace mpgemm::kernels
