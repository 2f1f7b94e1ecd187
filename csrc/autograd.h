// What the ops' C++ autograd shares (csrc/autograd.cpp: gemm, linear, mlp,
// conv2d; csrc/gated_mlp.cpp: gated_mlp; csrc/layer_norm.cpp: layer_norm)
// besides their nodes (op_node.h): calls of the ops through the dispatcher
// and a linear's gradients.
#pragma once

#include <optional>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "op_node.h"

namespace mpgemm {

at::Tensor call_gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype);
at::Tensor call_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype);

// The product of sizes (a tensor's rows, all dimensions but the last).
c10::SymInt product(c10::SymIntArrayRef sizes);

// torch's `approximate` argument of gelu for mpgemm's name of a GELU form:
// "tanh" for "gelu_tanh", else "none".
inline std::string_view gelu_approximate(std::string_view activation) {
  return activation == "gelu_tanh" ? "tanh" : "none";
}

// The 16-bit type linear and conv2d compute in (checks.cpp has the rule).
at::ScalarType product_dtype(const at::Tensor& x, const at::Tensor& weight);

// A weight as a block's product (mlp's, gated_mlp's) takes it: rounded to
// the block's product type `dtype` where linear's rule on x and w alone
// would pick the other (both fp32 beside a bf16 weight of another product).
at::Tensor block_weight(const at::Tensor& x, const at::Tensor& w, at::ScalarType dtype);

// Whether a call records a graph: where none is (no_grad, inference, no input
// requiring a gradient), the op runs below autograd without making a node
// and saving its inputs.
bool records_graph(const at::Tensor& first, const at::Tensor& second, const std::optional<at::Tensor>& bias);

// The gradients of a linear's x, weight and bias ({dx, dW, db}, each
// undefined where not wanted) from grad_z, its pre-activation's gradient
// (..., out_features) in any float type: rounded to the products' 16-bit
// type `dtype`; the bias's summed from grad_z as given, in fp32 (or, with
// MPGEMM_EPILOGUE_BIAS_GRAD=1, by dW's product from grad_z as rounded).
variable_list linear_gradients(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                               at::ScalarType dtype, std::optional<at::ScalarType> bias_dtype, bool want_x,
                               bool want_weight, bool want_bias);

}  // namespace mpgemm
