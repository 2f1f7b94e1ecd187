// The batch-norm ops' CPU, CUDA and Meta implementations (their schemas are
// in ops.cpp, with every op's): each checks its arguments once, on every
// backend alike, then hands them to the backend.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>

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

BatchNormForward check_forward(const char* op, const at::Tensor& y, const OptionalTensor& weight,
                               const OptionalTensor& bias, const OptionalTensor& residual,
                               const OptionalTensor& running_mean, const OptionalTensor& running_var,
                               bool batch_stats, double momentum, double eps, bool relu,
                               const OptionalTensor& batch_mean_var) {
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
  return Impl(check_forward("mpgemm.batch_norm_act", y, weight, bias, residual, running_mean, running_var,
                            batch_stats, momentum, eps, relu, batch_mean_var));
}

// torch's checks of a MaxPool2d window (named as its arguments), and the
// fused pool's limits (kernels::max_pool_window_fits).
MaxPoolArgs check_pool(const char* op, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  for (const auto& [values, name] : {std::pair{kernel_size, "kernel_size"}, std::pair{stride, "stride"},
                                     std::pair{padding, "padding"}, std::pair{dilation, "dilation"}})
    TORCH_CHECK_VALUE(values.size() == 2, op, ": expected ", name, " of 2 values (height, width), got ", values);
  for (int d = 0; d < 2; ++d) {
    TORCH_CHECK_VALUE(kernel_size[d] > 0, op, ": expected kernel_size > 0, got ", kernel_size);
    TORCH_CHECK_VALUE(stride[d] > 0, op, ": expected stride > 0, got ", stride);
    TORCH_CHECK_VALUE(dilation[d] > 0, op, ": expected dilation > 0, got ", dilation);
    TORCH_CHECK_VALUE(padding[d] >= 0, op, ": expected padding >= 0, got ", padding);
  }
  TORCH_CHECK_VALUE(kernel_size[0] <= kernels::kMaxPoolTaps && kernel_size[1] <= kernels::kMaxPoolTaps &&
                        kernel_size[0] * kernel_size[1] <= kernels::kMaxPoolTaps,
                    op, ": expected at most ", kernels::kMaxPoolTaps,
                    " taps in the window (a byte names the maximum's), got kernel_size ", kernel_size);
  for (const c10::IntArrayRef steps : {stride, padding, dilation})
    TORCH_CHECK_VALUE(steps[0] <= kernels::kMaxPoolStep && steps[1] <= kernels::kMaxPoolStep, op,
                      ": expected stride, padding and dilation at most ", kernels::kMaxPoolStep, ", got stride ",
                      stride, ", padding ", padding, ", dilation ", dilation);
  MaxPoolArgs pool;
  pool.ceil_mode = ceil_mode;
  for (int d = 0; d < 2; ++d) {
    TORCH_CHECK_VALUE(padding[d] <= kernel_size[d] / 2, op,
                      ": expected padding at most half of kernel_size (as torch's max pool), got padding ", padding,
                      " for kernel_size ", kernel_size);
    pool.kernel[d] = kernel_size[d], pool.stride[d] = stride[d], pool.padding[d] = padding[d];
    pool.dilation[d] = dilation[d];
  }
  return pool;
}

// A size the window's arithmetic needs as a number: symbolic ones (under
// torch.compile) are specialized.
int64_t concrete(const c10::SymInt& size) { return size.guard_int(__FILE__, __LINE__); }

// The window over a batch of height x width pixels, checked against the
// kernels' limits; a symbolic batch stays symbolic (the window's own batch
// is then a placeholder: only the backends, on real tensors, launch it).
kernels::MaxPoolWindow checked_window(const char* op, const MaxPoolArgs& pool, const c10::SymInt& batch,
                                      int64_t channels, int64_t height, int64_t width) {
  const std::optional<int64_t> images = batch.maybe_as_int();
  TORCH_CHECK_VALUE(!images || *images <= INT_MAX, op, ": expected at most INT_MAX images, got ", *images);
  const kernels::MaxPoolWindow window = max_pool_window(pool, images.value_or(1), height, width);
  TORCH_CHECK_VALUE(window.out_height > 0 && window.out_width > 0, op, ": the pooled output of a ", height, " x ",
                    width, " input would be empty (", window.out_height, " x ", window.out_width, ")");
  TORCH_CHECK_VALUE(kernels::max_pool_window_fits(window, channels), op,
                    ": expected an image (and its pooled image) of at most INT_MAX elements, got ", channels, " x ",
                    height, " x ", width);
  return window;
}

template <BatchNormForwardResult (*Impl)(const BatchNormForward&, const MaxPoolArgs&)>
BatchNormForwardResult batch_norm_relu_max_pool(const at::Tensor& y, const OptionalTensor& weight,
                                                const OptionalTensor& bias, const OptionalTensor& running_mean,
                                                const OptionalTensor& running_var, bool batch_stats,
                                                double momentum, double eps, c10::IntArrayRef kernel_size,
                                                c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                c10::IntArrayRef dilation, bool ceil_mode,
                                                const OptionalTensor& batch_mean_var) {
  constexpr const char* op = "mpgemm.batch_norm_relu_max_pool";
  const BatchNormForward args = check_forward(op, y, weight, bias, std::nullopt, running_mean, running_var,
                                              batch_stats, momentum, eps, /*relu=*/true, batch_mean_var);
  const MaxPoolArgs pool = check_pool(op, kernel_size, stride, padding, dilation, ceil_mode);
  checked_window(op, pool, y.sym_size(0), concrete(y.sym_size(1)), concrete(y.sym_size(2)), concrete(y.sym_size(3)));
  return Impl(args, pool);
}

template <at::Tensor (*Impl)(const at::Tensor&, const at::Tensor&, kernels::MaxPoolWindow)>
at::Tensor max_pool_window_backward(const at::Tensor& grad_out, const at::Tensor& window,
                                    c10::IntArrayRef input_size, c10::IntArrayRef kernel_size,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                    bool ceil_mode) {
  constexpr const char* op = "mpgemm.max_pool_window_backward";
  TORCH_CHECK_VALUE(grad_out.dim() == 4, op, ": expected a 4-D grad_out (N, C, H, W), got ", grad_out.dim(), "-D");
  TORCH_CHECK_TYPE(grad_out.scalar_type() == at::kFloat || grad_out.scalar_type() == at::kHalf ||
                       grad_out.scalar_type() == at::kBFloat16,
                   op, ": expected grad_out to be torch.float32, torch.float16 or torch.bfloat16, got ",
                   grad_out.scalar_type());
  TORCH_CHECK_TYPE(window.scalar_type() == at::kByte, op, ": expected window to be torch.uint8, got ",
                   window.scalar_type());
  TORCH_CHECK_VALUE(window.sym_sizes() == grad_out.sym_sizes(), op, ": expected window of grad_out's shape ",
                    grad_out.sym_sizes(), ", got ", window.sym_sizes());
  TORCH_CHECK_VALUE(window.device() == grad_out.device(), op, ": expected window on grad_out's device (",
                    grad_out.device(), "), got ", window.device());
  const MaxPoolArgs pool = check_pool(op, kernel_size, stride, padding, dilation, ceil_mode);
  TORCH_CHECK_VALUE(input_size.size() == 2 && input_size[0] > 0 && input_size[1] > 0, op,
                    ": expected input_size (height, width) > 0, got ", input_size);
  const kernels::MaxPoolWindow window_of = checked_window(op, pool, grad_out.sym_size(0),
                                                          concrete(grad_out.sym_size(1)), input_size[0],
                                                          input_size[1]);
  const int64_t height = concrete(grad_out.sym_size(2)), width = concrete(grad_out.sym_size(3));
  TORCH_CHECK_VALUE(window_of.out_height == height && window_of.out_width == width, op, ": expected grad_out of ",
                    window_of.out_height, " x ", window_of.out_width, " pixels (the window over input_size ",
                    input_size, "), got ", height, " x ", width);
  return Impl(grad_out, window, window_of);
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

BatchNormForwardResult batch_norm_relu_max_pool_meta(const BatchNormForward& a, const MaxPoolArgs& pool) {
  const kernels::MaxPoolWindow w = max_pool_window(pool, 1, concrete(a.y.sym_size(2)), concrete(a.y.sym_size(3)));
  const auto pooled = [&](at::ScalarType type) {
    return at::empty_symint({a.y.sym_size(0), a.y.sym_size(1), w.out_height, w.out_width},
                            a.y.options().dtype(type).memory_format(at::MemoryFormat::ChannelsLast));
  };
  at::Tensor out = pooled(a.y.scalar_type());
  return {out.contiguous(a.y.suggest_memory_format()), per_channel(a.y), per_channel(a.y), per_channel(a.y),
          per_channel(a.y), pooled(at::kByte)};
}

at::Tensor max_pool_window_backward_meta(const at::Tensor& grad_out, const at::Tensor&, kernels::MaxPoolWindow w) {
  return at::empty_symint({grad_out.sym_size(0), grad_out.sym_size(1), w.height, w.width},
                          grad_out.options().memory_format(at::MemoryFormat::ChannelsLast));
}

at::Tensor batch_norm_apply_meta(const at::Tensor& y, const at::Tensor&, const at::Tensor&, bool) { return like_y(y); }

BatchNormBackwardResult batch_norm_act_backward_meta(const BatchNormBackward& a) {
  const auto empty = [&] { return at::empty({0}, a.y.options()); };
  const auto [grad_y, sums, grad_z] = a.output_mask;
  return {grad_y ? like_y(a.y) : empty(), sums ? per_channel(a.y) : empty(), sums ? per_channel(a.y) : empty(),
          grad_z ? like_y(a.y) : empty()};
}

}  // namespace

kernels::MaxPoolWindow max_pool_window(const MaxPoolArgs& pool, int64_t batch, int64_t height, int64_t width) {
  // torch's pooling_output_shape: floor or ceil, and with ceil_mode no
  // window that starts in the right or bottom padding.
  const auto outputs = [&](int64_t size, int d) {
    const int64_t span = size + 2 * pool.padding[d] - pool.dilation[d] * (pool.kernel[d] - 1) - 1 +
                         (pool.ceil_mode ? pool.stride[d] - 1 : 0);
    int64_t out = (span >= 0 ? span / pool.stride[d] : -((-span + pool.stride[d] - 1) / pool.stride[d])) + 1;
    if (pool.ceil_mode && (out - 1) * pool.stride[d] >= size + pool.padding[d]) --out;
    return out;
  };
  kernels::MaxPoolWindow w;
  const auto narrow = [](int64_t v) { return int(std::min<int64_t>(v, INT_MAX)); };
  w.batch = narrow(batch), w.height = narrow(height), w.width = narrow(width);
  w.out_height = narrow(outputs(height, 0)), w.out_width = narrow(outputs(width, 1));
  w.kernel_h = int(pool.kernel[0]), w.kernel_w = int(pool.kernel[1]);
  w.stride_h = narrow(pool.stride[0]), w.stride_w = narrow(pool.stride[1]);
  w.pad_h = narrow(pool.padding[0]), w.pad_w = narrow(pool.padding[1]);
  w.dilation_h = narrow(pool.dilation[0]), w.dilation_w = narrow(pool.dilation[1]);
  return w;
}

bool batch_norm_relu_mask_shape(const at::Tensor& y) {
  return (y.scalar_type() == at::kHalf || y.scalar_type() == at::kBFloat16) && y.sym_size(1) % 8 == 0;
}

TORCH_LIBRARY_IMPL(mpgemm, CPU, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_cpu>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_cpu>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_cpu>);
  m.impl("batch_norm_relu_max_pool", &batch_norm_relu_max_pool<batch_norm_relu_max_pool_cpu>);
  m.impl("max_pool_window_backward", &max_pool_window_backward<max_pool_window_backward_cpu>);
}

TORCH_LIBRARY_IMPL(mpgemm, Meta, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_meta>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_meta>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_meta>);
  m.impl("batch_norm_relu_max_pool", &batch_norm_relu_max_pool<batch_norm_relu_max_pool_meta>);
  m.impl("max_pool_window_backward", &max_pool_window_backward<max_pool_window_backward_meta>);
}

#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) {
  m.impl("batch_norm_act", &batch_norm_act<batch_norm_act_cuda>);
  m.impl("batch_norm_act_backward", &batch_norm_act_backward<batch_norm_act_backward_cuda>);
  m.impl("batch_norm_apply", &batch_norm_apply<batch_norm_apply_cuda>);
  m.impl("batch_norm_relu_max_pool", &batch_norm_relu_max_pool<batch_norm_relu_max_pool_cuda>);
  m.impl("max_pool_window_backward", &max_pool_window_backward<max_pool_window_backward_cuda>);
}
#endif

}  // namespace mpgemm
