// CUDA launcher of _mma_ceiling: one block per slot of out, on the current
// stream of a's device.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/math.h"
#include "wmma/mma_ceiling.h"
#include "../ops.h"

namespace mpgemm {

void mma_ceiling_cuda(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  // 16-byte chunks; any tensor the caching allocator hands out qualifies.
  TORCH_CHECK_VALUE(kernels::aligned16(a.data_ptr()) && kernels::aligned16(b.data_ptr()),
                    "mpgemm._mma_ceiling: expected a and b to start on 16-byte boundaries");
  C10_CUDA_CHECK(kernels::launch_mma_ceiling(
      static_cast<const __half*>(a.data_ptr()), static_cast<const __half*>(b.data_ptr()), out.data_ptr<float>(),
      static_cast<int>(iterations), static_cast<int>(out.size(0)),
      c10::cuda::getCurrentCUDAStream(a.get_device()).stream()));
}

}  // namespace mpgemm
