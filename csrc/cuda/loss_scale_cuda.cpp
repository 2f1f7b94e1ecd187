// CUDA launcher of update_loss_scale_: one thread on the current stream, no
// host synchronization.
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
  C10_CUDA_CHECK(kernels::launch_update_loss_scale(scale.data_ptr<float>(), counters.data_ptr<int64_t>(),
                                                   found_inf.data_ptr<float>(), rule,
                                                   c10::cuda::getCurrentCUDAStream(scale.get_device()).stream()));
}

}  // namespace mpgemm
