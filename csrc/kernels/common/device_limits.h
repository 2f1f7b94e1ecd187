// What the plans need to know of a device, free of CUDA so that the CPU
// build plans too.
#pragma once

namespace mpgemm::kernels {

// How many multiprocessors a problem should fill, the most shared memory one
// block may opt into, and the compute capability (10 * major + minor). Zeros
// if the device cannot be asked.
struct DeviceLimits {
  int multiprocessors = 0;
  int max_smem_per_block = 0;
  int arch = 0;
};

// An H100 SXM: the profile used where no GPU can be asked.
inline constexpr DeviceLimits kH100Limits{132, 227 * 1024, 90};

}  // namespace mpgemm::kernels
