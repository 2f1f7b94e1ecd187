// Entry points of training batch norm's passes for host code, over a
// channels-innermost (NHWC) activation seen as `rows` x `channels` (rows =
// N * H * W), every such tensor of one element type (fp32, fp16 or bf16),
// the per-channel vectors fp32. Every per-channel sum is reduced in a fixed
// order (row blocks that depend on the shape alone, then the blocks in order,
// no atomics): the results are bitwise the same on every run. The kernels
// are in norm/batch_norm_kernels.cuh.
#pragma once

#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "norm/max_pool_window.h"

namespace mpgemm::kernels {

struct BatchNormShape {
  int64_t rows = 0, channels = 0;
  ElementType type = ElementType::kFloat16;  // of every rows x channels tensor
};

// How many row blocks the per-channel sums take: a function of the shape
// alone (never of the device), so that the order of every sum is too.
int batch_norm_row_blocks(BatchNormShape shape);

// fp32 floats of workspace a pass takes: two per channel per row block, and
// two per channel (backward's sums where the caller takes none).
int64_t batch_norm_workspace_floats(BatchNormShape shape);

// Which kernels run a pass where it has two ways, each opt-in until its
// kernels pass the GPU tests. loads_ahead: the sums and backward's input
// gradient on norm/batch_norm_ahead_kernels.cuh's kernels
// (MPGEMM_BATCH_NORM_LOADS_AHEAD; the same bits). finish_by_lines: the sums'
// totals on norm/batch_norm_line_finish.cuh's kernel
// (MPGEMM_BATCH_NORM_FINISH_BY_LINES; the same fp64 sums in another fixed
// order, so their last fp64 bits, and rarely an fp32 result's, differ).
struct BatchNormKernelChoice {
  bool loads_ahead = false;
  bool finish_by_lines = false;
};

// The forward's per-channel vectors, as torch's BatchNorm2d holds them.
struct BatchNormChannels {
  const float* weight = nullptr;  // gamma; null: 1
  const float* bias = nullptr;    // beta; null: 0
  float* running_mean = nullptr;  // updated with batch statistics where given; read without them
  float* running_var = nullptr;
  float momentum = 0.0f;
  double eps = 0.0;
  float* mean = nullptr;    // written (it and the next three required): the statistics used (batch or running)
  float* invstd = nullptr;  // written: 1 / sqrt(var + eps)
  float* scale = nullptr;   // written: gamma * invstd
  float* shift = nullptr;   // written: beta - mean * scale
};

// out = relu?(y * scale[c] + shift[c] + residual), shift = beta - mean *
// scale, each step rounded in fp32, then once to the element type; residual
// may be null. With batch statistics (the biased variance normalizes), the
// running ones become momentum * batch + (1 - momentum) * running, the
// variance unbiased; without, the running ones normalize. batch_mean_var
// (with batch statistics, or null): the batch's mean and biased variance
// per channel ([2][channels], as norm/column_moments.h totals a
// convolution's epilogue moments), used instead of a pass over y.
// relu_mask (with relu, where batch_norm_relu_mask_fits): out > 0 as bits,
// bit e of byte j for element 8j + e in memory order.
cudaError_t launch_batch_norm_forward(BatchNormShape shape, const void* y, const void* residual, bool relu,
                                      bool batch_stats, const float* batch_mean_var,
                                      const BatchNormChannels& channels, float* workspace, void* out,
                                      uint8_t* relu_mask, BatchNormKernelChoice choice, cudaStream_t stream);

// The forward's elementwise pass alone, from the scale and shift a forward
// wrote: out = relu?(y * scale[c] + shift[c]), the forward's bits where it
// had no residual. A fused chain recomputes its output with it in backward
// instead of keeping it (mpgemm/fusion/recompute.py).
cudaError_t launch_batch_norm_apply(BatchNormShape shape, const void* y, const float* scale, const float* shift,
                                    bool relu, void* out, cudaStream_t stream);

// The forward with the pool: the statistics as launch_batch_norm_forward
// computes them, then out = the max over each window of relu(y * scale[c] +
// shift[c]) rounded to the element type, the first maximum (the last NaN)
// as torch's pool keeps it; window: a byte per element of out, the tap's
// number in its window (row * kernel_w + column) | 0x80 where the maximum
// is above zero (the ReLU passed). The chain's output is not written.
cudaError_t launch_batch_norm_relu_max_pool(BatchNormShape shape, const void* y, bool batch_stats,
                                            const float* batch_mean_var, const BatchNormChannels& channels,
                                            float* workspace, MaxPoolWindow pool, void* out, uint8_t* window,
                                            BatchNormKernelChoice choice, cudaStream_t stream);

// Its backward before batch norm's: grad_input (the pool's input's shape,
// `shape`) = for each element, the sum over the windows whose byte names it
// with the ReLU passed of grad_out there, in fp32, windows by row then
// column (torch's order), rounded once; zero where none does.
cudaError_t launch_max_pool_grad(BatchNormShape shape, MaxPoolWindow pool, const void* grad_out,
                                 const uint8_t* window, void* grad_input, cudaStream_t stream);

// Whether the forward writes the ReLU's mask as bits for these tensors (y,
// residual, out): 16-bit elements in 16-byte runs (a byte a thread), the
// channel count a multiple of 8 and every pointer 16-byte aligned.
bool batch_norm_relu_mask_fits(BatchNormShape shape, std::initializer_list<const void*> tensors);

// What backward reads: dz = grad_out, masked by out > 0 where the chain ends
// in a ReLU (from relu_mask's bits, or out, whichever is non-null); xhat =
// (y - mean) * invstd.
struct BatchNormGrad {
  const void* grad_out = nullptr;
  const void* out = nullptr;
  const uint8_t* relu_mask = nullptr;
  const void* y = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  const float* scale = nullptr;
};

// sum_dz[c] = sum of dz and sum_dz_xhat[c] = sum of dz * xhat (gamma's and
// beta's gradients) where they are non-null, or where grad_y needs them;
// grad_y = scale * (dz - sum_dz / rows - xhat * sum_dz_xhat / rows) with batch
// statistics, scale * dz with running ones; grad_z = dz (the residual's
// gradient). Null outputs are not computed.
cudaError_t launch_batch_norm_backward(BatchNormShape shape, const BatchNormGrad& g, bool batch_stats,
                                       float* workspace, float* sum_dz, float* sum_dz_xhat, void* grad_y,
                                       void* grad_z, BatchNormKernelChoice choice, cudaStream_t stream);

}  // namespace mpgemm::kernels
