// Split-K reduction: D = activation(sum over s of partials[s] + bias), or
// the sum times an activation's derivative at GemmParams::activation_input,
// the partials (split_k x m x n fp32, row stride n) written by the splits of
// wmma_gemm_kernel or of conv2d_kernel's wgrad; and, where a product that
// no epilogue multiplied is stored, the pass that multiplies it in place.
// Each thread finishes one element of D at a time (grid-stride), summing
// the splits in index order, so the result does not depend on which split
// finished first: the reduction is deterministic. Consecutive threads take
// consecutive columns, so loads and stores coalesce. Single matrices only
// (batch 1); D's row stride is honored. The Hopper split-K's partial row
// sums of A are summed the same way, a thread a row.
#include <algorithm>
#include <cstdint>

#include "common/element_traits.cuh"
#include "common/epilogue_math.h"
#include "common/math.h"
#include "gemm/splitk_reduce.h"

namespace mpgemm::kernels {
namespace {

// Blocks of the reduction; a grid-stride loop covers the rest.
constexpr int64_t kMaxReduceBlocks = 4096;
constexpr int kSplitKReduceThreads = 256;

// ActivationGrad: D = sum * p.activation's derivative at p.activation_input
// (the inputs' type, laid out as D), in place of bias and activation; a
// kernel of its own, so that the plain reduction keeps its code.
template <bool ActivationGrad>
__global__ void __launch_bounds__(kSplitKReduceThreads) splitk_reduce_kernel(GemmParams p, const float* partials,
                                                                             int split_k) {
  const int64_t elements = p.m * p.n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < elements; e += int64_t(gridDim.x) * blockDim.x) {
    float sum = partials[e];
    for (int s = 1; s < split_k; ++s) sum += partials[s * elements + e];
    const int64_t row = e / p.n, col = e - row * p.n;
    float v;
    if constexpr (ActivationGrad) {
      v = apply_activation_grad(p.activation, sum,
                                load_as_float(p.activation_input, p.ab_type, row * p.d_row_stride + col));
    } else {
      if (p.bias != nullptr) sum += load_as_float(p.bias, p.bias_type, col);
      v = apply_activation(p.activation, sum);
    }
    visit_element_type(p.d_type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      static_cast<T*>(p.d)[row * p.d_row_stride + col] = ElementTraits<T>::from_float(v);
    });
  }
}

// D = D * p.activation's derivative at p.activation_input, in place, where
// no GEMM epilogue multiplied: D as the plan's product stored it, so rounded
// twice, as torch's gelu_backward of a 16-bit dH is; the same bytes as that
// pass (D read and written, Z read).
__global__ void __launch_bounds__(kSplitKReduceThreads) activation_grad_pass_kernel(GemmParams p) {
  const int64_t elements = p.m * p.n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < elements; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / p.n, at = row * p.d_row_stride + (e - row * p.n);
    const float z = load_as_float(p.activation_input, p.ab_type, at);
    store_from_float(p.d, p.d_type, at, apply_activation_grad(p.activation, load_as_float(p.d, p.d_type, at), z));
  }
}

// One thread a row, summing its splits in index order.
__global__ void __launch_bounds__(kSplitKReduceThreads) row_sums_reduce_kernel(float* sums, const float* partials,
                                                                               int64_t m, int split_k) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m; i += int64_t(gridDim.x) * blockDim.x) {
    float sum = partials[i];
    for (int s = 1; s < split_k; ++s) sum += partials[s * m + i];
    sums[i] = sum;
  }
}

}  // namespace

cudaError_t launch_row_sums_reduce(float* sums, const float* partials, int64_t m, int split_k, cudaStream_t stream) {
  const int64_t blocks = std::min(ceil_div(m, kSplitKReduceThreads), kMaxReduceBlocks);
  void* args[] = {&sums, &partials, &m, &split_k};
  return cudaLaunchKernel(&row_sums_reduce_kernel, dim3(unsigned(blocks)), dim3(kSplitKReduceThreads), args, 0,
                          stream);
}

cudaError_t launch_activation_grad_pass(const GemmParams& p, cudaStream_t stream) {
  const int64_t blocks = std::min(ceil_div(p.m * p.n, kSplitKReduceThreads), kMaxReduceBlocks);
  GemmParams params = p;
  void* args[] = {&params};
  return cudaLaunchKernel(&activation_grad_pass_kernel, dim3(unsigned(blocks)), dim3(kSplitKReduceThreads), args, 0,
                          stream);
}

cudaError_t launch_splitk_reduce(const GemmParams& p, const float* partials, int split_k, cudaStream_t stream) {
  const int64_t blocks = std::min(ceil_div(p.m * p.n, kSplitKReduceThreads), kMaxReduceBlocks);
  GemmParams params = p;
  void* args[] = {&params, &partials, &split_k};
  auto* kernel = p.activation_input != nullptr ? &splitk_reduce_kernel<true> : &splitk_reduce_kernel<false>;
  return cudaLaunchKernel(kernel, dim3(unsigned(blocks)), dim3(kSplitKReduceThreads), args, 0, stream);
}

}  // namespace mpgemm::kernels
