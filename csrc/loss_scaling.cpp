// CPU implementations of loss scaling's ops.
//
// unscale_grads_, with the CUDA kernel's semantics: products in fp32, one
// rounding to the output's dtype, the inf/NaN check on the fp32 product.
//
// update_loss_scale_ on the CPU as the one function (kernels/amp/loss_scale.h)
// that the CUDA kernel runs, by default: one launch a step on a GPU, where
// the tensor ops took about 25. MPGEMM_LOSS_SCALE_KERNEL=0 runs those tensor
// ops on any device instead. Both follow the same rule step for step, in
// fp32, and never read a value back to the host.
#include <cfloat>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include "ops.h"

namespace mpgemm {

void unscale_grads_cpu(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor scaled = grads[i].to(at::kFloat).mul(inv_scale);
    if (!scaled.isfinite().all().item<bool>()) found_inf.fill_(1.0f);
    outs[i].copy_(scaled);
  }
}

void update_loss_scale_with_tensor_ops(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                                       const kernels::LossScaleRule& rule) {
  using kernels::kGrowthTracker, kernels::kOverflowsInARow, kernels::kSkippedSteps, kernels::kLastStepSkipped;
  const at::Tensor overflow = found_inf.reshape({}).ne(0);
  const at::Tensor overflows = overflow.to(at::kLong);
  at::Tensor next = counters.clone();
  next[kLastStepSkipped].copy_(overflows);
  next[kSkippedSteps].add_(overflows);
  if (rule.dynamic) {
    const at::Tensor zero = at::zeros({}, counters.options());
    const at::Tensor overflows_in_a_row = counters[kOverflowsInARow] + 1, clean_steps = counters[kGrowthTracker] + 1;
    const at::Tensor back_off = overflow.logical_and(overflows_in_a_row.ge(rule.hysteresis));
    const at::Tensor grow = overflow.logical_not().logical_and(clean_steps.eq(rule.growth_interval));
    next[kGrowthTracker].copy_(at::where(overflow.logical_or(grow), zero, clean_steps));
    next[kOverflowsInARow].copy_(at::where(overflow.logical_and(back_off.logical_not()), overflows_in_a_row, zero));
    // fp32 products, as the kernel's; a grown scale past fp32's largest is not taken.
    const at::Tensor backed_off = scale.mul(rule.backoff_factor).clamp_min(rule.min_scale);
    const at::Tensor grown = scale.mul(rule.growth_factor);
    scale.copy_(at::where(back_off, backed_off, at::where(grow.logical_and(grown.le(FLT_MAX)), grown, scale)));
  }
  counters.copy_(next);
}

void update_loss_scale_cpu(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                           const kernels::LossScaleRule& rule) {
  if (!loss_scale_kernel_enabled()) return update_loss_scale_with_tensor_ops(scale, counters, found_inf, rule);
  kernels::update_loss_scale(scale.data_ptr<float>(), counters.data_ptr<int64_t>(),
                             found_inf.reshape({}).item<float>(), rule);
}

}  // namespace mpgemm
