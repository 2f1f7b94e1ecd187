// CUDA launchers of loss scaling's ops, on the current stream, with no host
// synchronization: unscale_grads_ as one chunk table and one kernel launch;
// update_loss_scale_ as one thread of its own kernel (it passed the GPU
// tests and sanitizers on an H200 at fe39419), or with
// MPGEMM_LOSS_SCALE_KERNEL=0 as torch's tensor ops.
#include <cstring>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "amp/loss_scale_launch.h"
#include "amp/unscale.h"
#include "../ops.h"

namespace mpgemm {
namespace {

constexpr int64_t kChunkElements = 1 << 16;

// A CUDA graph captures the table's copy as a read of its pinned host buffer
// at every replay, so a table copied during a capture is kept for the
// process's life: the host allocator must never hand its buffer to another
// table. (Tables copied outside captures go back to the allocator as usual.)
void keep_for_replays(const at::Tensor& host_table) {
  static std::mutex mutex;
  static std::vector<at::Tensor> captured_tables;
  const std::lock_guard<std::mutex> lock(mutex);
  captured_tables.push_back(host_table);
}

}  // namespace

void unscale_grads_cuda(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf,
                        const at::Tensor& inv_scale) {
  const c10::cuda::CUDAGuard device_guard(found_inf.device());
  std::vector<at::Tensor> sources;  // keeps layout copies alive until launch
  std::vector<kernels::UnscaleChunk> chunks;
  for (size_t i = 0; i < grads.size(); ++i) {
    // Both are walked in memory order, so the source must share the output's strides.
    const bool same_layout = grads[i].strides() == outs[i].strides() && grads[i].is_non_overlapping_and_dense();
    sources.push_back(same_layout ? grads[i] : at::empty_like(outs[i], grads[i].options()).copy_(grads[i]));
    const int64_t numel = outs[i].numel();
    for (int64_t begin = 0; begin < numel; begin += kChunkElements) {
      chunks.push_back({sources.back().data_ptr(), outs[i].data_ptr(), begin, std::min(numel, begin + kChunkElements),
                        element_type(grads[i].scalar_type()), element_type(outs[i].scalar_type())});
    }
  }
  if (chunks.empty()) return;
  const int64_t bytes = static_cast<int64_t>(chunks.size() * sizeof(kernels::UnscaleChunk));
  at::Tensor host_table = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host_table.data_ptr(), chunks.data(), bytes);
  const at::Tensor table = host_table.to(found_inf.device(), /*non_blocking=*/true);
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
    keep_for_replays(host_table);
  C10_CUDA_CHECK(kernels::launch_unscale(static_cast<const kernels::UnscaleChunk*>(table.data_ptr()),
                                         static_cast<int64_t>(chunks.size()), inv_scale.data_ptr<float>(),
                                         found_inf.data_ptr<float>(),
                                         c10::cuda::getCurrentCUDAStream(found_inf.get_device()).stream()));
}

void update_loss_scale_cuda(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                            const kernels::LossScaleRule& rule) {
  const c10::cuda::CUDAGuard device_guard(scale.device());
  if (!loss_scale_kernel_enabled()) return update_loss_scale_with_tensor_ops(scale, counters, found_inf, rule);
  C10_CUDA_CHECK(kernels::launch_update_loss_scale(scale.data_ptr<float>(), counters.data_ptr<int64_t>(),
                                                   found_inf.data_ptr<float>(), rule,
                                                   c10::cuda::getCurrentCUDAStream(scale.get_device()).stream()));
}

}  // namespace mpgemm
