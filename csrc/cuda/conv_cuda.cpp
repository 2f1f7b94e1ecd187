// CUDA launchers of conv2d and its gradients: tensors to NHWC/KRSC in the
// product's input type, fp16 or bf16 (no copy for channels_last tensors of
// that type, one otherwise), the implicit-GEMM kernels, and the result back in
// the caller's memory format.
#include <stdexcept>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "conv/launch.h"
#include "norm/column_moments.h"
#include "../ops.h"
#include "../workspace.h"
#include "tensor_core_support.h"

namespace mpgemm {
namespace {

// NHWC (activations) or KRSC (filters) in the product's input type:
// channels_last memory of an NCHW tensor.
at::Tensor channels_innermost(const ConvProblem<int64_t>& problem, const at::Tensor& t) {
  return t.to(problem.input_dtype).contiguous(at::MemoryFormat::ChannelsLast);
}

// The problem as the kernels see it, once the device is known to run it;
// operands and output are left to each pass.
kernels::Conv2dParams geometry(const ConvProblem<int64_t>& problem, const at::Tensor& anchor) {
  check_tensor_cores_take(problem.op, problem.input_dtype, anchor);
  kernels::Conv2dParams p;
  p.input_type = element_type(problem.input_dtype);
  p.n = problem.n;
  p.h = problem.h;
  p.w = problem.w;
  p.c = problem.c;
  p.k = problem.k;
  p.r = problem.r;
  p.s = problem.s;
  p.p = problem.p;
  p.q = problem.q;
  p.groups = problem.groups;
  p.stride_h = static_cast<int>(problem.stride[0]);
  p.stride_w = static_cast<int>(problem.stride[1]);
  p.pad_top = static_cast<int>(problem.padding[0]);
  p.pad_left = static_cast<int>(problem.padding[2]);
  p.dilation_h = static_cast<int>(problem.dilation[0]);
  p.dilation_w = static_cast<int>(problem.dilation[1]);
  return p;
}

// Runs one pass into a fresh channels_last tensor of `shape` and `dtype` on
// anchor's device, returned in `format`; with `batch_mean_var` (fprop), also
// its batch statistics (conv2d_batch_stats_cuda), from the epilogue's column
// moments where the plan's kernels write them; with `addend` (dgrad: dx's
// shape and dtype, channels_last, p.addend its data), dx plus it, added by
// the epilogue where the plan's kernels add it and after the pass
// otherwise.
at::Tensor run(kernels::ConvPass pass, kernels::Conv2dParams p, at::IntArrayRef shape, const at::Tensor& anchor,
               at::ScalarType dtype, at::MemoryFormat format, at::Tensor* batch_mean_var = nullptr,
               const at::Tensor* addend = nullptr) {
  const c10::cuda::CUDAGuard device_guard(anchor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(anchor.get_device()).stream();
  at::Tensor out = at::empty(shape, anchor.options().dtype(dtype).memory_format(at::MemoryFormat::ChannelsLast));
  p.out = out.data_ptr();
  p.out_type = element_type(dtype);
  kernels::Conv2dPlan plan;
  try {
    plan = kernels::plan_conv2d(pass, p);
  } catch (const std::invalid_argument& e) {
    // A bad MPGEMM_CONV_PATH or switch (plan/switches.h).
    TORCH_CHECK_VALUE(false, e.what());
  }
  const bool add_after = addend != nullptr && !plan.addend_in_epilogue;
  if (add_after) p.addend = nullptr;
  at::Tensor workspace, moments;
  if (plan.workspace_bytes > 0) workspace = allocate_workspace(plan.workspace_bytes, anchor);
  const int64_t rows = p.n * p.p * p.q;
  const bool epilogue_moments = batch_mean_var != nullptr && plan.moment_rows > 0 && rows > 0 && p.k > 0;
  if (epilogue_moments) {
    moments = at::empty({2, kernels::column_moment_blocks(rows, plan.moment_rows), p.k},
                        anchor.options().dtype(at::kFloat));
    p.moments = moments.data_ptr<float>();
  }
  C10_CUDA_CHECK(kernels::launch_conv2d(pass, p, plan, plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                                        stream));
  if (batch_mean_var != nullptr) {
    if (epilogue_moments) {
      *batch_mean_var = at::empty({2, p.k}, anchor.options().dtype(at::kFloat));
      const at::Tensor totals = allocate_workspace(
          size_t(kernels::column_moments_total_workspace_bytes(rows, p.k, plan.moment_rows)), anchor);
      C10_CUDA_CHECK(kernels::launch_column_moments_total(rows, p.k, plan.moment_rows, moments.data_ptr<float>(),
                                                          totals.data_ptr(), batch_mean_var->data_ptr<float>(),
                                                          stream));
    } else {
      *batch_mean_var = batch_mean_var_of(out);
    }
  }
  if (add_after) out.add_(*addend);
  return out.contiguous(format);
}

// fprop's operands; with batch_mean_var, y's batch statistics too.
at::Tensor fprop(const ConvProblem<int64_t>& problem, const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, at::Tensor* batch_mean_var) {
  kernels::Conv2dParams p = geometry(problem, x);
  const at::Tensor x_nhwc = channels_innermost(problem, x), w_krsc = channels_innermost(problem, weight);
  at::Tensor bias_contiguous;
  p.x = x_nhwc.data_ptr();
  p.wt = w_krsc.data_ptr();
  if (bias) {
    bias_contiguous = bias->contiguous();
    p.bias = bias_contiguous.data_ptr();
    p.bias_type = element_type(bias_contiguous.scalar_type());
  }
  return run(kernels::ConvPass::kFprop, p, {problem.n, problem.k, problem.p, problem.q}, x, problem.out_dtype,
             memory_format_of(problem), batch_mean_var);
}

}  // namespace

at::Tensor conv2d_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  return fprop(problem, x, weight, bias, nullptr);
}

ConvWithBatchStats conv2d_batch_stats_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& x,
                                           const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  at::Tensor batch_mean_var;
  at::Tensor y = fprop(problem, x, weight, bias, &batch_mean_var);
  return {std::move(y), std::move(batch_mean_var)};
}

at::Tensor conv2d_grad_input_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                  const at::Tensor& x, const at::Tensor& weight) {
  kernels::Conv2dParams p = geometry(problem, x);
  const at::Tensor dy_nhwc = channels_innermost(problem, grad_out), w_krsc = channels_innermost(problem, weight);
  p.dy = dy_nhwc.data_ptr();
  p.wt = w_krsc.data_ptr();
  return run(kernels::ConvPass::kDgrad, p, x.sizes(), x, x.scalar_type(), memory_format_of(problem));
}

at::Tensor conv2d_grad_input_add_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                      const at::Tensor& x, const at::Tensor& weight, const at::Tensor& addend) {
  kernels::Conv2dParams p = geometry(problem, x);
  const at::Tensor dy_nhwc = channels_innermost(problem, grad_out), w_krsc = channels_innermost(problem, weight);
  const at::Tensor addend_nhwc = addend.contiguous(at::MemoryFormat::ChannelsLast);
  p.dy = dy_nhwc.data_ptr();
  p.wt = w_krsc.data_ptr();
  p.addend = addend_nhwc.data_ptr();
  return run(kernels::ConvPass::kDgrad, p, x.sizes(), x, x.scalar_type(), memory_format_of(problem), nullptr,
             &addend_nhwc);
}

at::Tensor conv2d_grad_weight_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                   const at::Tensor& x, const at::Tensor& weight) {
  kernels::Conv2dParams p = geometry(problem, x);
  const at::Tensor dy_nhwc = channels_innermost(problem, grad_out), x_nhwc = channels_innermost(problem, x);
  p.dy = dy_nhwc.data_ptr();
  p.x = x_nhwc.data_ptr();
  return run(kernels::ConvPass::kWgrad, p, weight.sizes(), x, weight.scalar_type(), weight.suggest_memory_format());
}

}  // namespace mpgemm
