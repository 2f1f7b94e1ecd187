// CPU implementation of update_loss_scale_: the function the CUDA kernel runs
// (kernels/amp/loss_scale.h), on the CPU tensors.
#include <ATen/ATen.h>

#include "ops.h"

namespace mpgemm {

void update_loss_scale_cpu(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                           const kernels::LossScaleRule& rule) {
  kernels::update_loss_scale(scale.data_ptr<float>(), counters.data_ptr<int64_t>(),
                             found_inf.reshape({}).item<float>(), rule);
}

}  // namespace mpgemm
