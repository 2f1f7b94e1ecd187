// Batch statistics from the per-block column moments an epilogue wrote
// (common/column_moments.cuh): the mean and the biased variance of each
// column of a rows x channels output, for training batch norm
// (launch_batch_norm_forward's batch_mean_var).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace mpgemm::kernels {

// Blocks of block_rows rows (the last one what is left) in `rows` rows.
inline int64_t column_moment_blocks(int64_t rows, int64_t block_rows) {
  return block_rows > 0 ? (rows + block_rows - 1) / block_rows : 0;
}

// The scratch launch_column_moments_total takes: each split's moments of
// each column, in fp64 (0 for an empty shape).
int64_t column_moments_total_workspace_bytes(int64_t rows, int64_t channels, int64_t block_rows);

// mean_var[c] = the mean of column c, mean_var[channels + c] its biased
// variance, from `moments` ([2][blocks][channels]: each block's means, then
// its M2s). Combined in fp64 in a fixed order: the same bits on every run.
// workspace: column_moments_total_workspace_bytes of device memory, 8-byte
// aligned.
cudaError_t launch_column_moments_total(int64_t rows, int64_t channels, int64_t block_rows, const float* moments,
                                        void* workspace, float* mean_var, cudaStream_t stream);

}  // namespace mpgemm::kernels
