// Device workspaces of the CUDA launchers (split-K partial sums, wgrad's
// partial sums, padded copies, the epilogue statistics' split totals): taken from torch's caching allocator, one per
// call and released when the call returns (the allocator reuses a block only
// after the stream's queued kernels), and counted so that benchmarks can say
// how many bytes mpgemm added beyond its outputs.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace mpgemm {

struct WorkspaceStats {
  int64_t calls = 0;          // launches that took a workspace
  int64_t bytes = 0;          // all of their workspaces
  int64_t largest_bytes = 0;  // the largest one call took
};

// `bytes` (> 0) on anchor's device from the caching allocator, 16-byte
// aligned (the allocator's blocks are 512-byte aligned), counted.
at::Tensor allocate_workspace(size_t bytes, const at::Tensor& anchor);

// Since the process started or the last reset.
WorkspaceStats workspace_stats();
void reset_workspace_stats();

}  // namespace mpgemm
