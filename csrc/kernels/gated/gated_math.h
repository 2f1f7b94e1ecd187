// The gated MLP's elementwise math (mpgemm.gated_mlp: p = act(g) * u, g the
// gate's product, u the up projection's), in fp32, shared by the CUDA
// kernels (gated/gated.cu) and the CPU backend (csrc/gated_mlp.cpp) so both
// compute the same function. Each result is rounded once, by its caller.
#pragma once

#include <cmath>

#include "common/epilogue_math.h"
#include "common/host_device.h"

namespace mpgemm::kernels {

// The gate's activation: SiLU (SwiGLU: Llama, Mistral, Qwen), GELU's erf
// form, or its tanh form (GeGLU: Gemma's).
enum class GateActivation : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

// act(g), as torch computes it in fp32 (silu: g / (1 + exp(-g))).
MPGEMM_HOST_DEVICE float gate_value(GateActivation activation, float g) {
  switch (activation) {
    case GateActivation::kSilu: return g / (1.0f + expf(-g));
    case GateActivation::kGelu: return apply_activation(Activation::kGelu, g);
    default: return gelu_tanh(g);
  }
}

// act'(g): SiLU's s (1 + g (1 - s)), s = sigmoid(g), as torch's
// silu_backward; GELU's as epilogue_math.h's apply_activation_grad.
MPGEMM_HOST_DEVICE float gate_slope(GateActivation activation, float g) {
  switch (activation) {
    case GateActivation::kSilu: {
      const float s = 1.0f / (1.0f + expf(-g));
      return s * (1.0f + g * (1.0f - s));
    }
    case GateActivation::kGelu: return apply_activation_grad(Activation::kGelu, 1.0f, g);
    default: return apply_activation_grad(Activation::kGeluTanh, 1.0f, g);
  }
}

// Backward of p = act(g) * u from dp: dg = dp * u * act'(g), du = dp *
// act(g), and p again (the down projection's weight gradient reads it,
// which the forward did not keep).
struct GatedGrads {
  float grad_gate, grad_up, out;
};

MPGEMM_HOST_DEVICE GatedGrads gated_grads(GateActivation activation, float grad, float g, float u) {
  const float value = gate_value(activation, g);
  return {grad * u * gate_slope(activation, g), grad * value, value * u};
}

}  // namespace mpgemm::kernels
