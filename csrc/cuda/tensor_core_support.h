// Whether the current GPU's Tensor Cores take a product's input type: the one
// check that gemm, linear and the conv2d passes make before any launch.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>

#include "common/element_traits.cuh"

namespace mpgemm {

// bf16 WMMA needs sm_80. Below it the bf16 kernels are compiled out and their
// launchers return cudaErrorNotSupported; this says why, naming the op.
inline void check_tensor_cores_take(const char* op, at::ScalarType input_dtype, const at::Tensor& anchor) {
  if (input_dtype != at::kBFloat16) return;
  constexpr int kMinArch = kernels::ElementTraits<__nv_bfloat16>::kMinArch;
  const cudaDeviceProp* device = at::cuda::getDeviceProperties(anchor.get_device());
  TORCH_CHECK(device->major * 100 + device->minor * 10 >= kMinArch, op,
              ": torch.bfloat16 inputs need bf16 Tensor Cores (compute capability ", kMinArch / 100, ".",
              kMinArch / 10 % 10, " or newer); ", anchor.device(), " (", device->name, ") is ", device->major, ".",
              device->minor);
}

}  // namespace mpgemm
