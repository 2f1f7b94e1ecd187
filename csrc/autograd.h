// What the ops' C++ autograd shares (csrc/autograd.cpp: gemm, linear, mlp,
// conv2d; csrc/gated_mlp.cpp: gated_mlp): graph nodes made as torch's
// generated code makes its own, calls of the ops through the dispatcher, a
// linear's gradients, and a backward run once, without a graph.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

namespace mpgemm {

using torch::autograd::AutogradContext;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// How autograd holds a node: std::shared_ptr up to torch 2.11, c10::intrusive_ptr after.
using NodePtr = decltype(torch::autograd::Edge::function);

namespace detail {
// torch::autograd::deleteNode, found by argument-dependent lookup where
// nodes are shared_ptrs (it frees a long graph without deep recursion).
template <class T>
void delete_node(T* node) {
  deleteNode(node);
}
}  // namespace detail

// A new graph node T (a torch::autograd::Node), owned as autograd owns nodes.
template <class T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>)
    return std::shared_ptr<T>(new T(), [](T* node) { detail::delete_node(node); });
  else
    return c10::make_intrusive<T>();
}

// Refuses forward-mode AD, which no op of mpgemm implements, as torch's
// generated code refuses it for its ops without a forward derivative: a
// dual tensor's tangent would otherwise be dropped without a word.
template <class... Tensors>
void refuse_forward_ad(const char* op, const Tensors&... tensors) {
  const bool dual = (torch::autograd::isFwGradDefined(tensors) || ...);
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, op, ": forward-mode AD is not supported (an input is a dual tensor)");
}

at::Tensor call_gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype);
at::Tensor call_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype);

// The dtype of the bias a forward kept under `key` in saved_data, none where it had none.
std::optional<at::ScalarType> saved_bias_dtype(AutogradContext* ctx, const char* key = "bias_dtype");

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
// requiring a gradient), the op runs below autograd without building a
// Function's node and saving its inputs.
bool records_graph(const at::Tensor& first, const at::Tensor& second, const std::optional<at::Tensor>& bias);

// The gradients of a linear's x, weight and bias ({dx, dW, db}, each
// undefined where not wanted) from grad_z, its pre-activation's gradient
// (..., out_features) in any float type: rounded to the products' 16-bit
// type `dtype`; the bias's summed from grad_z as given, in fp32 (or, with
// MPGEMM_EPILOGUE_BIAS_GRAD=1, by dW's product from grad_z as rounded).
variable_list linear_gradients(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                               at::ScalarType dtype, std::optional<at::ScalarType> bias_dtype, bool want_x,
                               bool want_weight, bool want_bias);

// Runs a Function's backward without a graph. Where create_graph asked for
// one, the gradients come back through a node whose own backward raises.
template <class Backward>
variable_list once_differentiable(const char* op, const Backward& backward) {
  variable_list grads;
  {
    const at::NoGradGuard no_grad;
    grads = backward();
  }
  if (!at::GradMode::is_enabled()) return grads;
  const auto raise_on_backward = std::make_shared<torch::autograd::DelayedError>(
      std::string(op) + ": double backward is not supported; its gradients are computed without a graph",
      int64_t(grads.size()));
  variable_list detached;
  detached.reserve(grads.size());
  for (const at::Tensor& g : grads) detached.push_back(g.defined() ? g.detach().requires_grad_() : at::Tensor());
  return (*raise_on_backward)(std::move(detached));
}

}  // namespace mpgemm
