// CPU implementation of unscale_grads_, with the CUDA kernel's semantics:
// products in fp32, one rounding to the output's dtype, the inf/NaN check on
// the fp32 product.
#include <ATen/ATen.h>

#include "ops.h"

namespace mpgemm {

void unscale_grads_cpu(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor scaled = grads[i].to(at::kFloat).mul(inv_scale);
    if (!scaled.isfinite().all().item<bool>()) found_inf.fill_(1.0f);
    outs[i].copy_(scaled);
  }
}

}  // namespace mpgemm
