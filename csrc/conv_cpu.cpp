// CPU reference of conv2d and its gradients, with the kernels' semantics:
// every input rounded to the product's input type (fp16 or bf16), products
// summed in fp32 (torch's fp32
// convolution on the rounded values), bias added in fp32, one rounding to the
// output dtype. Asymmetric padding ("same" with an even kernel) is applied as
// explicit zero padding.
#include <array>

#include <ATen/core/Tensor.h>
#include <ATen/ops/batch_norm_stats.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include "ops.h"

namespace mpgemm {
namespace {

// t's values rounded to the product's input type, held in fp32 for torch's convolution.
at::Tensor input_values(const at::Tensor& t, const ConvProblem<int64_t>& problem) {
  return t.to(problem.input_dtype).to(at::kFloat);
}

// Symmetric padding is torch's convolution's own (no padded copy of x);
// asymmetric padding ("same" with an even kernel) is explicit zeros around
// x, and torch's convolution then pads nothing. Either way the products
// summed are the same. An x of no rows or columns is padded explicitly
// too: torch's convolution refuses it (mpgemm's convolves its padding).
bool torch_pads(const ConvProblem<int64_t>& problem) {
  const auto& p = problem.padding;
  return p[0] == p[1] && p[2] == p[3] && problem.h > 0 && problem.w > 0;
}

// The padding torch's convolution applies, (top, left).
std::array<int64_t, 2> implicit_padding(const ConvProblem<int64_t>& problem) {
  if (!torch_pads(problem)) return {0, 0};
  return {problem.padding[0], problem.padding[2]};
}

// The padding applied explicitly, (top, bottom, left, right).
std::array<int64_t, 4> explicit_padding(const ConvProblem<int64_t>& problem) {
  if (torch_pads(problem)) return {0, 0, 0, 0};
  const auto& p = problem.padding;
  return {p[0], p[1], p[2], p[3]};
}

// t with the explicit padding; at::constant_pad_nd takes (left, right, top, bottom).
at::Tensor pad(const at::Tensor& t, const ConvProblem<int64_t>& problem) {
  const auto p = explicit_padding(problem);
  if (p == std::array<int64_t, 4>{}) return t;
  return at::constant_pad_nd(t, {p[2], p[3], p[0], p[1]});
}

// Gradients of the convolution of the explicitly padded input.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const ConvProblem<int64_t>& problem,
                                                        const at::Tensor& grad_out, const at::Tensor& padded_x,
                                                        const at::Tensor& weight, bool input, bool filters) {
  return at::convolution_backward(input_values(grad_out, problem), padded_x, weight, std::nullopt,
                                  at::IntArrayRef(problem.stride), implicit_padding(problem),
                                  at::IntArrayRef(problem.dilation), false, at::IntArrayRef({0, 0}), problem.groups,
                                  {input, filters, false});
}

}  // namespace

at::Tensor conv2d_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias) {
  const std::optional<at::Tensor> no_bias;  // added below in fp32, after the products
  at::Tensor out = at::conv2d(pad(input_values(x, problem), problem), input_values(weight, problem), no_bias,
                              at::IntArrayRef(problem.stride), implicit_padding(problem),
                              at::IntArrayRef(problem.dilation), problem.groups);
  if (bias) out.add_(bias->to(at::kFloat).view({1, -1, 1, 1}));
  return out.to(problem.out_dtype).contiguous(memory_format_of(problem));
}

ConvWithBatchStats conv2d_batch_stats_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& x,
                                          const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  at::Tensor y = conv2d_cpu(problem, x, weight, bias);
  at::Tensor stats = batch_mean_var_of(y);
  return {std::move(y), std::move(stats)};
}

at::Tensor batch_mean_var_of(const at::Tensor& y) {
  if (y.numel() == 0) return at::full({2, y.size(1)}, NAN, y.options().dtype(at::kFloat));  // torch's mean of nothing
  if (y.is_cuda()) {
    // torch's own statistics pass (Welford's, in fp32, one read of y, any
    // memory format): the variance from its 1 / sqrt(var + 0), which is 0,
    // not infinite, where the variance is 0 (a constant channel).
    const auto [mean, invstd] = at::batch_norm_stats(y, 0.0);
    return at::stack({mean, at::where(invstd.eq(0), at::zeros_like(invstd), invstd.pow(-2))});
  }
  const auto [var, mean] = at::var_mean(y.to(at::kDouble), {0, 2, 3}, /*correction=*/0);
  return at::stack({mean, var}).to(at::kFloat);
}

namespace {

// dgrad in fp32, x's shape (NCHW strides).
at::Tensor grad_input_fp32(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out, const at::Tensor& x,
                           const at::Tensor& weight) {
  const auto p = explicit_padding(problem);
  const at::Tensor padded_shape = at::empty({problem.n, problem.c, problem.h + p[0] + p[1], problem.w + p[2] + p[3]},
                                            x.options().dtype(at::kFloat));
  const at::Tensor grad_padded =
      std::get<0>(backward(problem, grad_out, padded_shape, input_values(weight, problem), true, false));
  if (p == std::array<int64_t, 4>{}) return grad_padded;
  return grad_padded.slice(2, p[0], p[0] + problem.h).slice(3, p[2], p[2] + problem.w);
}

}  // namespace

at::Tensor conv2d_grad_input_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out, const at::Tensor& x,
                                 const at::Tensor& weight) {
  return grad_input_fp32(problem, grad_out, x, weight).to(x.scalar_type()).contiguous(memory_format_of(problem));
}

at::Tensor conv2d_grad_input_add_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                     const at::Tensor& x, const at::Tensor& weight, const at::Tensor& addend) {
  return grad_input_fp32(problem, grad_out, x, weight)
      .add(addend.to(at::kFloat))
      .to(x.scalar_type())
      .contiguous(memory_format_of(problem));
}

at::Tensor conv2d_grad_weight_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                  const at::Tensor& x, const at::Tensor& weight) {
  const at::Tensor grad = std::get<1>(backward(problem, grad_out, pad(input_values(x, problem), problem),
                                               input_values(weight, problem), false, true));
  return grad.to(weight.scalar_type()).contiguous(weight.suggest_memory_format());
}

}  // namespace mpgemm
