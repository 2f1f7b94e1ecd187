// CUDA launchers of the gated MLP's elementwise passes: the kernels on the
// current stream, outputs from torch's allocator. No host synchronization.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gated/gated.h"
#include "../ops.h"

namespace mpgemm {
namespace {

kernels::GatedTensors tensors_of(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& out,
                                 kernels::GateActivation activation) {
  kernels::GatedTensors t;
  t.count = gate.numel();
  t.type = element_type(gate.scalar_type());
  t.activation = activation;
  t.gate = gate.data_ptr(), t.up = up.data_ptr(), t.out = out.data_ptr();
  return t;
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

}  // namespace

at::Tensor gated_activation_cuda(const at::Tensor& gate, const at::Tensor& up, kernels::GateActivation activation) {
  const c10::cuda::CUDAGuard device_guard(gate.device());
  at::Tensor out = at::empty_like(gate, at::MemoryFormat::Contiguous);
  C10_CUDA_CHECK(kernels::launch_gated_forward(tensors_of(gate, up, out, activation), stream_of(gate)));
  return out;
}

GatedGrads gated_activation_backward_cuda(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                          kernels::GateActivation activation) {
  const c10::cuda::CUDAGuard device_guard(gate.device());
  const auto like = [&] { return at::empty_like(gate, at::MemoryFormat::Contiguous); };
  at::Tensor grad_gate = like(), grad_up = like(), out = like();
  kernels::GatedTensors t = tensors_of(gate, up, out, activation);
  t.grad = grad.data_ptr(), t.grad_gate = grad_gate.data_ptr(), t.grad_up = grad_up.data_ptr();
  C10_CUDA_CHECK(kernels::launch_gated_backward(t, stream_of(gate)));
  return {grad_gate, grad_up, out};
}

}  // namespace mpgemm
