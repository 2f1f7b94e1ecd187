// CUDA launchers of batch norm with its residual add and ReLU: tensors to
// channels_last (no copy where they are already; the kernels read NHWC as
// rows x channels), the kernels on the current stream with a workspace from
// torch's allocator, results back in y's memory format. No host
// synchronization.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "norm/batch_norm.h"
#include "../ops.h"
#include "../workspace.h"

namespace mpgemm {
namespace {

at::Tensor nhwc(const at::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); }

kernels::BatchNormShape shape_of(const at::Tensor& y) {
  return {y.size(1) ? y.numel() / y.size(1) : 0, y.size(1), element_type(y.scalar_type())};
}

// A result of y's shape, in y's memory format.
at::Tensor in_format_of(const at::Tensor& y, const at::Tensor& result) {
  return result.contiguous(y.suggest_memory_format());
}

float* floats(const at::Tensor& t) { return t.data_ptr<float>(); }
const float* floats_or_null(const std::optional<at::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

at::Tensor workspace_for(kernels::BatchNormShape shape, const at::Tensor& anchor) {
  return allocate_workspace(size_t(kernels::batch_norm_workspace_floats(shape)) * sizeof(float), anchor);
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  return t ? std::optional(t->contiguous()) : std::nullopt;
}

// The opt-in kernels (norm/batch_norm.h's BatchNormKernelChoice), each until
// it passes the GPU tests: the sums and backward's input gradient with their
// loads issued rows ahead (the same bits), and the finish reading its
// partials by whole sectors.
kernels::BatchNormKernelChoice kernel_choice() {
  return {environment_switch("MPGEMM_BATCH_NORM_LOADS_AHEAD"), environment_switch("MPGEMM_BATCH_NORM_FINISH_BY_LINES")};
}

// The forward's per-channel vectors for the kernels: the results (mean,
// invstd, scale, shift), and contiguous copies of the parameters and
// running statistics where they are strided (the kernels update the
// running ones in place: copied back by finish()).
struct ForwardChannels {
  at::Tensor mean, invstd, scale, shift;
  std::optional<at::Tensor> weight, bias, running_mean, running_var;
  kernels::BatchNormChannels channels;

  explicit ForwardChannels(const BatchNormForward& a)
      : mean(at::empty({a.y.size(1)}, a.y.options().dtype(at::kFloat))),
        invstd(at::empty_like(mean)),
        scale(at::empty_like(mean)),
        shift(at::empty_like(mean)),
        weight(contiguous(a.weight)),
        bias(contiguous(a.bias)),
        running_mean(contiguous(a.running_mean)),
        running_var(contiguous(a.running_var)) {
    channels.weight = floats_or_null(weight);
    channels.bias = floats_or_null(bias);
    channels.running_mean = running_mean ? floats(*running_mean) : nullptr;
    channels.running_var = running_var ? floats(*running_var) : nullptr;
    channels.momentum = float(a.momentum);
    channels.eps = a.eps;
    channels.mean = floats(mean), channels.invstd = floats(invstd), channels.scale = floats(scale);
    channels.shift = floats(shift);
  }

  // torch's statistics of nothing.
  void fill_nan() { mean.fill_(NAN), invstd.fill_(NAN), scale.fill_(NAN), shift.fill_(NAN); }

  void finish(const BatchNormForward& a) {
    if (running_mean && !running_mean->is_same(*a.running_mean)) a.running_mean->copy_(*running_mean);
    if (running_var && !running_var->is_same(*a.running_var)) a.running_var->copy_(*running_var);
  }
};

}  // namespace

BatchNormForwardResult batch_norm_act_cuda(const BatchNormForward& a) {
  const c10::cuda::CUDAGuard device_guard(a.y.device());
  at::Tensor y = nhwc(a.y);
  const auto shape = shape_of(a.y);
  ForwardChannels ch(a);
  at::Tensor out = at::empty_like(y);
  const bool bits = a.relu && batch_norm_relu_mask_shape(a.y);
  at::Tensor relu_mask = at::empty({bits ? y.numel() / 8 : 0}, a.y.options().dtype(at::kByte));
  if (shape.rows == 0 && a.batch_stats) {
    ch.fill_nan();
    return {in_format_of(a.y, out), ch.mean, ch.invstd, ch.scale, ch.shift, relu_mask};
  }
  std::optional<at::Tensor> residual = a.residual ? std::optional(nhwc(*a.residual)) : std::nullopt;
  // The bits are written by the 16-byte runs: a view that starts off a
  // 16-byte boundary is copied (torch's allocations are aligned).
  if (bits && !kernels::batch_norm_relu_mask_fits(shape, {y.data_ptr(), residual ? residual->data_ptr() : nullptr})) {
    y = y.clone(at::MemoryFormat::ChannelsLast);
    if (residual) residual = residual->clone(at::MemoryFormat::ChannelsLast);
  }
  const at::Tensor workspace = workspace_for(shape, a.y);
  const std::optional<at::Tensor> batch_mean_var = contiguous(a.batch_mean_var);
  C10_CUDA_CHECK(kernels::launch_batch_norm_forward(
      shape, y.data_ptr(), residual ? residual->data_ptr() : nullptr, a.relu, a.batch_stats,
      batch_mean_var ? floats(*batch_mean_var) : nullptr, ch.channels,
      static_cast<float*>(workspace.data_ptr()), out.data_ptr(), bits ? relu_mask.data_ptr<uint8_t>() : nullptr,
      kernel_choice(), stream_of(a.y)));
  ch.finish(a);
  return {in_format_of(a.y, out), ch.mean, ch.invstd, ch.scale, ch.shift, relu_mask};
}

BatchNormForwardResult batch_norm_relu_max_pool_cuda(const BatchNormForward& a, const MaxPoolArgs& pool) {
  const c10::cuda::CUDAGuard device_guard(a.y.device());
  const at::Tensor y = nhwc(a.y);
  const auto shape = shape_of(a.y);
  const kernels::MaxPoolWindow window = max_pool_window(pool, y.size(0), y.size(2), y.size(3));
  ForwardChannels ch(a);
  const auto pooled = [&](at::ScalarType type) {
    return at::empty({y.size(0), y.size(1), window.out_height, window.out_width},
                     y.options().dtype(type).memory_format(at::MemoryFormat::ChannelsLast));
  };
  at::Tensor out = pooled(y.scalar_type()), taps = pooled(at::kByte);
  if (shape.rows == 0 && a.batch_stats) {
    ch.fill_nan();
    return {in_format_of(a.y, out), ch.mean, ch.invstd, ch.scale, ch.shift, taps};
  }
  const at::Tensor workspace = workspace_for(shape, a.y);
  const std::optional<at::Tensor> batch_mean_var = contiguous(a.batch_mean_var);
  C10_CUDA_CHECK(kernels::launch_batch_norm_relu_max_pool(
      shape, y.data_ptr(), a.batch_stats, batch_mean_var ? floats(*batch_mean_var) : nullptr, ch.channels,
      static_cast<float*>(workspace.data_ptr()), window, out.data_ptr(), taps.data_ptr<uint8_t>(), kernel_choice(),
      stream_of(a.y)));
  ch.finish(a);
  return {in_format_of(a.y, out), ch.mean, ch.invstd, ch.scale, ch.shift, taps};
}

at::Tensor max_pool_window_backward_cuda(const at::Tensor& grad_out, const at::Tensor& window,
                                         kernels::MaxPoolWindow pool) {
  const c10::cuda::CUDAGuard device_guard(grad_out.device());
  const at::Tensor grad = nhwc(grad_out), taps = nhwc(window);
  at::Tensor grad_input = at::empty({grad.size(0), grad.size(1), pool.height, pool.width},
                                    grad.options().memory_format(at::MemoryFormat::ChannelsLast));
  const kernels::BatchNormShape shape{int64_t(pool.batch) * pool.height * pool.width, grad.size(1),
                                      element_type(grad.scalar_type())};
  C10_CUDA_CHECK(kernels::launch_max_pool_grad(shape, pool, grad.data_ptr(), taps.data_ptr<uint8_t>(),
                                               grad_input.data_ptr(), stream_of(grad_out)));
  return grad_input;
}

at::Tensor batch_norm_apply_cuda(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift, bool relu) {
  const c10::cuda::CUDAGuard device_guard(y.device());
  const at::Tensor rows = nhwc(y), scales = scale.contiguous(), shifts = shift.contiguous();
  at::Tensor out = at::empty_like(rows);
  C10_CUDA_CHECK(kernels::launch_batch_norm_apply(shape_of(y), rows.data_ptr(), floats(scales), floats(shifts), relu,
                                                  out.data_ptr(), stream_of(y)));
  return in_format_of(y, out);
}

BatchNormBackwardResult batch_norm_act_backward_cuda(const BatchNormBackward& a) {
  const c10::cuda::CUDAGuard device_guard(a.y.device());
  const auto shape = shape_of(a.y);
  const auto [want_grad_y, want_sums, want_grad_z] = a.output_mask;
  const at::Tensor grad_out = nhwc(a.grad_out), y = nhwc(a.y);
  const std::optional<at::Tensor> out = a.out ? std::optional(nhwc(*a.out)) : std::nullopt;
  const at::Tensor mean = a.mean.contiguous(), invstd = a.invstd.contiguous(), scale = a.scale.contiguous();
  // What is not asked for: an empty tensor each (outputs must not alias).
  const auto empty = [&] { return at::empty({0}, a.y.options()); };
  at::Tensor grad_y = want_grad_y ? at::empty_like(y) : empty(), grad_z = want_grad_z ? at::empty_like(y) : empty();
  // The sums: the finish writes every channel's; those of no rows are zero
  // (a fill launched only then).
  const bool has_rows = shape.rows > 0 && shape.channels > 0;
  const auto sums = [&] {
    const at::TensorOptions options = a.y.options().dtype(at::kFloat);
    if (!want_sums) return empty();
    return has_rows ? at::empty({shape.channels}, options) : at::zeros({shape.channels}, options);
  };
  at::Tensor sum_dz = sums(), sum_dz_xhat = sums();
  if (has_rows) {
    const kernels::BatchNormGrad g{grad_out.data_ptr(), out ? out->data_ptr() : nullptr,
                                   a.relu_mask ? a.relu_mask->data_ptr<uint8_t>() : nullptr, y.data_ptr(),
                                   floats(mean), floats(invstd), floats(scale)};
    const at::Tensor workspace = workspace_for(shape, a.y);
    C10_CUDA_CHECK(kernels::launch_batch_norm_backward(
        shape, g, a.batch_stats, static_cast<float*>(workspace.data_ptr()), want_sums ? floats(sum_dz) : nullptr,
        want_sums ? floats(sum_dz_xhat) : nullptr, want_grad_y ? grad_y.data_ptr() : nullptr,
        want_grad_z ? grad_z.data_ptr() : nullptr, kernel_choice(), stream_of(a.y)));
  }
  return {want_grad_y ? in_format_of(a.y, grad_y) : grad_y, sum_dz, sum_dz_xhat,
          want_grad_z ? in_format_of(a.y, grad_z) : grad_z};
}

}  // namespace mpgemm
