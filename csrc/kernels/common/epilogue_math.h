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

}  // namespace mpgemm::kernels
