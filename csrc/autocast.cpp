// The ops under torch.autocast: gemm, linear, mlp, gated_mlp and conv2d (and
// conv2d_batch_stats, conv2d's with its batch statistics) follow autocast's
// dtype as torch's matmul, linear and conv2d do (the lower_precision_fp
// policy): every floating-point tensor argument is cast to the autocast dtype
// (fp16 or bf16), through autocast's cache of weight casts, then the op runs
// with autocast off. The casts are ordinary ops, so autograd sees them.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "op_handles.h"

namespace mpgemm {
namespace {

using at::autocast::cached_cast;

template <c10::DeviceType Device>
struct AutocastScope {
  // Autocast is off for what this op calls, as it is for torch's own ops.
  c10::impl::ExcludeDispatchKeyGuard no_autocast{at::autocast::get_autocast_dispatch_key_from_device_type(Device)};
  at::ScalarType dtype = at::autocast::get_autocast_dtype(Device);
};

// gemm and linear share a signature (op_handles.h).
template <c10::DeviceType Device, const char* Name>
at::Tensor gemm_like(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<GemmSignature>(Name);
  const AutocastScope<Device> scope;
  return op.call(cached_cast(scope.dtype, a, Device), cached_cast(scope.dtype, b, Device),
                 cached_cast(scope.dtype, bias, Device), activation, out_dtype);
}

template <c10::DeviceType Device>
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                  std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<ConvSignature>("mpgemm::conv2d");
  const AutocastScope<Device> scope;
  return op.call(cached_cast(scope.dtype, x, Device), cached_cast(scope.dtype, weight, Device),
                 cached_cast(scope.dtype, bias, Device), stride, padding, dilation, groups, out_dtype);
}

template <c10::DeviceType Device>
std::tuple<at::Tensor, at::Tensor> conv2d_batch_stats(const at::Tensor& x, const at::Tensor& weight,
                                                      const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                                      at::IntArrayRef padding, at::IntArrayRef dilation,
                                                      int64_t groups) {
  static const auto op = op_handle<ConvBatchStatsSignature>("mpgemm::conv2d_batch_stats");
  const AutocastScope<Device> scope;
  return op.call(cached_cast(scope.dtype, x, Device), cached_cast(scope.dtype, weight, Device),
                 cached_cast(scope.dtype, bias, Device), stride, padding, dilation, groups);
}

template <c10::DeviceType Device>
at::Tensor mlp(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
               const std::optional<at::Tensor>& b2, std::string_view activation) {
  static const auto op = op_handle<MlpSignature>("mpgemm::mlp");
  const AutocastScope<Device> scope;
  return op.call(cached_cast(scope.dtype, x, Device), cached_cast(scope.dtype, w1, Device),
                 cached_cast(scope.dtype, b1, Device), cached_cast(scope.dtype, w2, Device),
                 cached_cast(scope.dtype, b2, Device), activation);
}

template <c10::DeviceType Device>
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
                     const at::Tensor& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w_down,
                     const std::optional<at::Tensor>& b_down, std::string_view activation) {
  static const auto op = op_handle<GatedMlpSignature>("mpgemm::gated_mlp");
  const AutocastScope<Device> scope;
  const auto cast = [&](const auto& t) { return cached_cast(scope.dtype, t, Device); };
  return op.call(cast(x), cast(w_gate), cast(b_gate), cast(w_up), cast(b_up), cast(w_down), cast(b_down),
                 activation);
}

constexpr char kGemm[] = "mpgemm::gemm";
constexpr char kLinear[] = "mpgemm::linear";

}  // namespace

TORCH_LIBRARY_IMPL(mpgemm, AutocastCPU, m) {
  m.impl("gemm", &gemm_like<c10::DeviceType::CPU, kGemm>);
  m.impl("linear", &gemm_like<c10::DeviceType::CPU, kLinear>);
  m.impl("conv2d", &conv2d<c10::DeviceType::CPU>);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats<c10::DeviceType::CPU>);
  m.impl("mlp", &mlp<c10::DeviceType::CPU>);
  m.impl("gated_mlp", &gated_mlp<c10::DeviceType::CPU>);
}

TORCH_LIBRARY_IMPL(mpgemm, AutocastCUDA, m) {
  m.impl("gemm", &gemm_like<c10::DeviceType::CUDA, kGemm>);
  m.impl("linear", &gemm_like<c10::DeviceType::CUDA, kLinear>);
  m.impl("conv2d", &conv2d<c10::DeviceType::CUDA>);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats<c10::DeviceType::CUDA>);
  m.impl("mlp", &mlp<c10::DeviceType::CUDA>);
  m.impl("gated_mlp", &gated_mlp<c10::DeviceType::CUDA>);
}

}  // namespace mpgemm
