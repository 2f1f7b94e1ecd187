// The batch-norm ops' CPU, CUDA and Meta implementations (their schemas are
// in ops.cpp, with every op's): each checks its arguments once, on every
// backend alike, then hands them to the backend.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "ops.h"

namespace mpgemm {
namespace {

using OptionalTensor = std::optional<at::Tensor>;

// The tensors that are given, by name.
std::vector<NamedTensor> given(std::initializer_list<std::pair<const OptionalTensor*, const char*>> tensors) {
  std::vector<NamedTensor> present;
  for (const auto& [t, name] : tensors)
    if (*t) present.push_back({&**t, name});
  return present;
}

BatchNormForward check_forward(const at::Tensor& y, const OptionalTensor& weight, const OptionalTensor& bias,
                               const OptionalTensor& residual, const OptionalTensor& running_mean,
                               const OptionalTensor& running_var, bool batch_stats, double momentum, double eps,
                               bool relu, const OptionalTensor& batch_mean_var) {
  constexpr const char* op = "mpgemm.batch_norm_act";
  check_batch_norm_args(op, y, {}, given({{&residual, "residual"}}));
  for (const NamedTensor& t : given({{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"},
                                     {&running_var, "running_var"}}))
    check_batch_norm_args(op, y, {t});
  TORCH_CHECK_VALUE(running_mean.has_value() == running_var.has_value(), op,
                    ": expected running_mean and running_var both given or both None");
  TORCH_CHECK_VALUE(batch_stats || running_mean, op,
                    ": expected running_mean and running_var without batch statistics (batch_stats=False)");
  TORCH_CHECK_VALUE(eps >= 0, op, ": expected eps >= 0, got ", eps);
  if (batch_mean_var) {
    TORCH_CHECK_VALUE(batch_stats, op, ": expected batch_mean_var only with batch statistics (batch_stats=True)");
    TORCH_CHECK_TYPE(batch_mean_var->scalar_type() == at::kFloat, op,
                     ": expected batch_mean_var to be torch.float32, got ", batch_mean_var->scalar_type());
    TORCH_CHECK_VALUE(batch_mean_var->dim() == 2 && batch_mean_var->sym_size(0) == 2 &&
                          batch_mean_var->sym_size(1) == y.sym_size(1),
                      op, ": expected batch_mean_var of shape (2, ", y.sym_size(1), ") (mean, variance), got ",
                      batch_mean_var->sym_sizes());
    TORCH_CHECK_VALUE(batch_mean_var->device() == y.device(), op, ": expected batch_mean_var on y's device (",
                      y.device(), "), got ", batch_mean_var->device());
  }
  return {y, weight, bias, residual, running_mean, running_var, batch_stats, relu, momentum, eps, batch_mean_var};
}

template <BatchNormForwardResult (*Impl)(const BatchNormForward&)>
BatchNormForwardResult batch_norm_act(const at::Tensor& y, const OptionalTensor& weight, const OptionalTensor& bias,
                                      const OptionalTensor& residual, const OptionalTensor& running_mean,
                                      const OptionalTensor& running_var, bool batch_stats, double momentum,
                                      double eps, bool relu, const OptionalTensor& batch_mean_var) {
  return Impl(check_forward(y, weight, bias, residual, running_mean, running_var, batch_stats, momentum, eps, relu,
                            batch_mean_var));
}

template <BatchNormBackwardResult (*Impl)(const BatchNormBackward&)>
BatchNormBackwardResult batch_norm_act_backward(const at::Tensor& grad_out, const OptionalTensor& out,
                                                const OptionalTensor& relu_mask, const at::Tensor& y,
                                                const at::Tensor& mean, const at::Tensor& invstd,
                                                const at::Tensor& scale, bool batch_stats,
                                                std::array<bool, 3> output_mask) {
  constexpr const char* op = "mpgemm.batch_norm_act_backward";
  const OptionalTensor grad = grad_out;
  check_batch_norm_args(op, y, {{&mean, "mean"}, {&invstd, "invstd"}, {&scale, "scale"}},
                        given({{&grad, "grad_out"}, {&out, "out"}}));
  TORCH_CHECK_VALUE(!(out && relu_mask), op, ": expected the ReLU's out or its relu_mask, not both");
  if (relu_mask) {
    TORCH_CHECK_TYPE(relu_mask->scalar_type() == at::kByte, op, ": expected relu_mask to be torch.uint8, got ",
                     relu_mask->scalar_type());
    TORCH_CHECK_VALUE(relu_mask->dim() == 1 && relu_mask->sym_size(0) * 8 == y.sym_numel() &&
                          y.sym_size(1) % 8 == 0 && relu_mask->is_contiguous(),
                      op, ": expected relu_mask to be y's elements as contiguous bits (", y.sym_numel(),
                      " / 8 bytes, 8 | C), got shape ", relu_mask->sym_sizes());
    TORCH_CHECK_VALUE(relu_mask->device() == y.device(), op, ": expected relu_mask on y's device");
  }
  return Impl({grad_out, out, relu_mask, y, mean, invstd, scale, batch_stats, output_mask});
}

template <at::Tensor (*Impl)(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>
at::Tensor batch_norm_apply(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift, bool relu) {
  check_batch_norm_args("mpgemm.batch_norm_apply", y, {{&scale, "scale"}, {&shift, "shift"}});
  return Impl(y, scale, shift, relu);
}

// Meta: results of the backends' shapes, types and formats.
at::Tensor like_y(const at::Tensor& y) {
  return at::empty_symint(y.sym_sizes(), y.options().memory_format(y.suggest_memory_format()));
}

at::Tensor per_channel(const at::Tensor& y) { return at::empty_symint({y.sym_size(1)}, y.options().dtype(at::kFloat)); }

BatchNormForwardResult batch_norm_act_meta(const BatchNormForward& a) {
  const auto bytes = a.relu && batch_norm_relu_mask_shape(a.y) ? a.y.sym_numel() / 8 : c10::SymInt(0);
  return {like_y(a.y), per_channel(a.y), per_channel(a.y), per_channel(a.y), per_channel(a.y),
          at::empty_symint({bytes}, a.y.options().dtype(at::kByte))};
}

at::Tensor batch_norm_apply_meta(const at::Tensor& y, const at::Tensor&, const at::Tensor&, bool) { return like_y(y); }

BatchNormBackwardResult batch_norm_act_backward_meta(const BatchNormBackward& a) {
  const auto empty = [&] { return at::empty({0}, a.y.options()); };
  const auto [grad_y, sums, grad_z] = a.output_mask;
  return {grad_y ? like_y(a.y) : empty(), sums ? per_channel(a.y) : empty(), sums ? per_channel(a.y) : empty(),
          grad_z ? like_y(a.y) : empty()};
}

}  // namespace

bool batch_norm_relu_mask_shape(const at::Tensor& y) {
  return (y.scalar_type() == at::kHalf || y.scalar_type() == at::kBFloat16) && y.sym_size(1) % 8 == 0;
}

TORCH_LIBRARY_IMPL(mpgemm, CPU, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_cpu>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_cpu>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_cpu>);
}

TORCH_LIBRARY_IMPL(mpgemm, Meta, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_meta>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_meta>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_meta>);
}

#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_cuda>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_cuda>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_cuda>);
}
#endif

}  // namespace mpgemm
