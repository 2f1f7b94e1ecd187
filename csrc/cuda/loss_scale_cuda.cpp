// CUDA launcher of update_loss_scale_: torch's tensor ops by default, or with
// MPGEMM_LOSS_SCALE_KERNEL=1 one thread of its own kernel (opt-in until it
// has passed the GPU tests); either on the current stream, with no host
// synchronization.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "amp/loss_scale_launch.h"
#include "../ops.h"

namespace mpgemm {

void update_loss_scale_cuda(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                            const kernels::LossScaleRule& rule) {
  const c10::cuda::CUDAGuard device_guard(scale.device());
  if (!loss_scale_kernel_enabled()) return update_loss_scale_with_tensor_ops(scale, counters, found_inf, rule);
  C10_CUDA_CHECK(kernels::launch_update_loss_scale(scale.data_ptr<float>(), counters.data_ptr<int64_t>(),
                                                   found_inf.data_ptr<float>(), rule,
                                                   c10::cuda::getCurrentCUDAStream(scale.get_device()).stream()));
}

}  // namespace mpgemm
