// Totals per-block column moments (norm/column_moments.h): a block per
// column; thread t takes blocks t, t + 256, ... in fp64, then thread 0 the
// threads' totals in thread order (a fixed order, the same every run), twice: the mean first, then M2 about it (each
// block's M2 plus its count times its mean's squared distance from the
// mean). A few hundred adds a column, once per batch norm: cheaper than a
// tree's barriers, and in a fixed order.
#include <cstdint>

#include "arch/smem.cuh"
#include "norm/column_moments.h"

namespace mpgemm::kernels {
namespace {

constexpr int kThreads = 256;

struct TotalArgs {
  int64_t rows, channels, block_rows, blocks;
  const float* moments;
  float* mean_var;
};

// The threads' values summed in thread order by thread 0, then seen by every thread.
__device__ double total_in_order(double value, double* sums) {
  sums[threadIdx.x] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int t = 0; t < kThreads; ++t) total += sums[t];
    sums[kThreads] = total;
  }
  __syncthreads();
  const double total = sums[kThreads];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kThreads) total_kernel(TotalArgs a) {
  const int64_t c = blockIdx.x;
  double* sums = reinterpret_cast<double*>(smem);  // [kThreads + 1]
  const auto count = [&](int64_t b) {
    const int64_t left = a.rows - b * a.block_rows;
    return double(left < a.block_rows ? left : a.block_rows);
  };
  const auto mean_of = [&](int64_t b) { return double(a.moments[b * a.channels + c]); };
  double weighted = 0.0;
  for (int64_t b = threadIdx.x; b < a.blocks; b += kThreads) weighted += count(b) * mean_of(b);
  const double mean = total_in_order(weighted, sums) / double(a.rows);
  double m2 = 0.0;
  for (int64_t b = threadIdx.x; b < a.blocks; b += kThreads) {
    const double delta = mean_of(b) - mean;
    m2 += double(a.moments[(a.blocks + b) * a.channels + c]) + count(b) * delta * delta;
  }
  const double variance = total_in_order(m2, sums) / double(a.rows);
  if (threadIdx.x == 0) {
    a.mean_var[c] = float(mean);
    a.mean_var[a.channels + c] = float(variance);
  }
}

}  // namespace

cudaError_t launch_column_moments_total(int64_t rows, int64_t channels, int64_t block_rows, const float* moments,
                                        float* mean_var, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  if (block_rows <= 0 || moments == nullptr || mean_var == nullptr || channels > 0x7fffffff)
    return cudaErrorInvalidValue;
  TotalArgs args{rows, channels, block_rows, column_moment_blocks(rows, block_rows), moments, mean_var};
  void* params[] = {&args};
  return cudaLaunchKernel(&total_kernel, dim3(unsigned(channels)), dim3(kThreads), params,
                          size_t(kThreads + 1) * sizeof(double), stream);
}

}  // namespace mpgemm::kernels
