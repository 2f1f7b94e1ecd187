// The loss scale's update after a step (amp/loss_scale.h), on the device:
// one thread reads found_inf and updates the scale and its counters in place,
// so that the host never waits for the step's overflow flag.
#include "amp/loss_scale_launch.h"

namespace mpgemm::kernels {
namespace {

__global__ void update_loss_scale_kernel(float* scale, int64_t* counters, const float* found_inf,
                                         LossScaleRule rule) {
  update_loss_scale(scale, counters, *found_inf, rule);
}

}  // namespace

cudaError_t launch_update_loss_scale(float* scale, int64_t* counters, const float* found_inf,
                                     const LossScaleRule& rule, cudaStream_t stream) {
  LossScaleRule by_value = rule;
  void* args[] = {&scale, &counters, &found_inf, &by_value};
  return cudaLaunchKernel(update_loss_scale_kernel, dim3(1), dim3(1), args, 0, stream);
}

}  // namespace mpgemm::kernels
