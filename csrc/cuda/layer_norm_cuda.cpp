// CUDA launchers of layer norm's passes (kernels/norm/layer_norm.cu): on the
// current stream, outputs and the weights' workspace from torch's caching
// allocator. No host synchronization.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "norm/layer_norm.h"
#include "../ops.h"

namespace mpgemm {
namespace {

kernels::LayerNormTensors tensors_of(const at::Tensor& x, const at::Tensor& weight, int64_t rows, int64_t cols) {
  kernels::LayerNormTensors t;
  t.rows = rows, t.cols = cols;
  t.type = element_type(x.scalar_type());
  t.x = x.data_ptr();
  t.weight = weight.defined() ? weight.const_data_ptr<float>() : nullptr;
  return t;
}

at::Tensor row_floats(const at::Tensor& x, int64_t count) { return at::empty({count}, x.options().dtype(at::kFloat)); }

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

}  // namespace

LayerNormResult layer_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                        int64_t rows, int64_t cols, double eps) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous), mean = row_floats(x, rows),
             rstd = row_floats(x, rows);
  kernels::LayerNormTensors t = tensors_of(x, weight, rows, cols);
  t.eps = static_cast<float>(eps);
  t.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  t.y = y.data_ptr(), t.mean = mean.data_ptr<float>(), t.rstd = rstd.data_ptr<float>();
  C10_CUDA_CHECK(kernels::launch_layer_norm_forward(t, stream_of(x)));
  return {y, mean, rstd};
}

LayerNormResult layer_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                                         const at::Tensor& rstd, const at::Tensor& weight, int64_t rows, int64_t cols,
                                         bool want_x, bool want_weights) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  kernels::LayerNormTensors t = tensors_of(x, weight, rows, cols);
  t.grad = grad.data_ptr();
  t.mean = const_cast<float*>(mean.const_data_ptr<float>()), t.rstd = const_cast<float*>(rstd.const_data_ptr<float>());
  // What is not asked for is an empty tensor (_layer_norm_backward's schema).
  at::Tensor grad_x = want_x ? at::empty_like(x, at::MemoryFormat::Contiguous) : at::empty({0}, x.options());
  at::Tensor grad_weight = row_floats(x, want_weights ? cols : 0), grad_bias = row_floats(x, want_weights ? cols : 0);
  at::Tensor workspace;
  if (want_x) t.grad_x = grad_x.data_ptr();
  if (want_weights) {
    workspace = row_floats(x, kernels::layer_norm_workspace_floats(rows, cols));
    t.grad_weight = grad_weight.data_ptr<float>(), t.grad_bias = grad_bias.data_ptr<float>();
    t.workspace = workspace.data_ptr<float>();
  }
  C10_CUDA_CHECK(kernels::launch_layer_norm_backward(t, stream_of(x)));
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace mpgemm
