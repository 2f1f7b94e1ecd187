// The convolution launcher's copies between a tensor and a copy of it whose
// channels per group are padded with zeros to whole 8- or 16-byte chunks:
// operands on the way in, the pass's output on the way out.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace mpgemm::kernels {

// Both tensors contiguous, 4-D: src of dims `from`, dst of dims `to`, which
// differ in dims 1 and 3 at most (for the convolutions: groups or filters
// per group, and channels). dst's element (i0, i1, i2, i3) is src's at the
// same index where that lies within `from`, zero elsewhere: a longer `to`
// pads, a shorter one takes the padded tensor's leading rows and channels back.
struct PaddedCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int element_bytes = 2;  // 2 (fp16, bf16) or 4 (fp32)
  int64_t from[4] = {0, 0, 0, 0};
  int64_t to[4] = {0, 0, 0, 0};
};

// A copy from `src`, of dims `from`, to `dst`, of dims `to`, of elements of `bytes`.
inline PaddedCopy copy_between(const void* src, const int64_t (&from)[4], void* dst, const int64_t (&to)[4],
                               int bytes) {
  PaddedCopy copy;
  copy.src = src, copy.dst = dst, copy.element_bytes = bytes;
  std::copy(from, from + 4, copy.from);
  std::copy(to, to + 4, copy.to);
  return copy;
}

// Enqueues the copy on `stream`; cudaErrorInvalidValue for an element size
// other than 2 or 4, dims 0 or 2 that differ, or more than INT_MAX elements
// on either side.
cudaError_t launch_padded_copy(const PaddedCopy& copy, cudaStream_t stream);

}  // namespace mpgemm::kernels
