// Typed handles of mpgemm's own ops, for C++ code that calls an op through
// the dispatcher (autocast's casts, autograd's backward formulas): each is
// looked up once, then called like a function.
#pragma once

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace mpgemm {

// gemm and linear: (a or x, b or weight, bias, activation, out_dtype).
using GemmSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                 std::optional<std::string_view>, std::optional<at::ScalarType>);
// _gemm_pre_activation and _linear_pre_activation: gemm's and linear's
// arguments -> (y, pre_activation).
using GemmPreActivationSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                      const std::optional<at::Tensor>&,
                                                                      std::optional<std::string_view>,
                                                                      std::optional<at::ScalarType>);
// _gemm_row_sums: (a, b, out_dtype) -> (a @ b, a's row sums).
using GemmRowSumsSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                std::optional<at::ScalarType>);
// _gemm_activation_grad: (a, b, activation_input, activation) -> (a @ b) * activation'(activation_input).
using GemmActivationGradSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               std::string_view);
// mlp: (x, w1, b1, w2, b2, activation).
using MlpSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                const at::Tensor&, const std::optional<at::Tensor>&, std::string_view);
// gated_mlp: (x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation).
using GatedMlpSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                     const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
                                     const std::optional<at::Tensor>&, std::string_view);
// _gated_activation: (gate, up, activation) -> act(gate) * up.
using GatedActivationSignature = at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view);
// _gated_activation_backward: (grad, gate, up, activation) -> (grad_gate, grad_up, act(gate) * up).
using GatedActivationBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, std::string_view);
// layer_norm: (x, normalized_shape, weight, bias, eps).
using LayerNormSignature = at::Tensor(const at::Tensor&, at::IntArrayRef, const std::optional<at::Tensor>&,
                                      const std::optional<at::Tensor>&, double);
// _layer_norm_forward: (x, normalized_shape, weight, bias, eps) -> (y, mean, rstd).
using LayerNormForwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, at::IntArrayRef, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double);
// _layer_norm_backward: (grad, x, mean, rstd, normalized_shape, weight, output_mask)
// -> (dx, sum of dy * xhat, sum of dy).
using LayerNormBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::IntArrayRef,
    const std::optional<at::Tensor>&, std::array<bool, 3>);
// conv2d: (x, weight, bias, stride, padding, dilation, groups, out_dtype).
using ConvSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                 at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t,
                                 std::optional<at::ScalarType>);
// conv2d_grad_input and conv2d_grad_weight: (grad_out, x, weight, stride, padding, dilation, groups).
using ConvGradientSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::IntArrayRef,
                                         at::IntArrayRef, at::IntArrayRef, int64_t);
// conv2d_backward: both of them from one call.
using ConvGradientsSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, at::IntArrayRef,
                                                                  at::IntArrayRef, at::IntArrayRef, int64_t);

// conv2d_batch_stats: (x, weight, bias, stride, padding, dilation, groups) -> (y, batch_mean_var).
using ConvBatchStatsSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                   const std::optional<at::Tensor>&, at::IntArrayRef,
                                                                   at::IntArrayRef, at::IntArrayRef, int64_t);

template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Signature>();
}

}  // namespace mpgemm
