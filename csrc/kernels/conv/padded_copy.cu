// PaddedCopy (conv/padded_copy.h): one thread per destination element at a time
// (grid-stride), consecutive threads on consecutive elements so that both
// sides coalesce along the channels. Each index is split into (i0, i1, i2,
// i3) by 32-bit divisions: a copy moves a few bytes per element, and the
// convolutions it serves (3-channel first layers, odd or misaligned channels)
// spend orders of magnitude longer in their GEMM.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/math.h"
#include "conv/padded_copy.h"

namespace mpgemm::kernels {
namespace {

constexpr int kCopyThreads = 256;
constexpr int64_t kMaxCopyBlocks = 8192;

template <class Word>
__global__ void __launch_bounds__(kCopyThreads) padded_copy_kernel(PaddedCopy copy) {
  const unsigned to1 = unsigned(copy.to[1]), to2 = unsigned(copy.to[2]), to3 = unsigned(copy.to[3]);
  const unsigned from1 = unsigned(copy.from[1]), from3 = unsigned(copy.from[3]);
  const unsigned elements = unsigned(copy.to[0]) * to1 * to2 * to3;
  const Word* src = static_cast<const Word*>(copy.src);
  Word* dst = static_cast<Word*>(copy.dst);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < elements; e += gridDim.x * blockDim.x) {
    const unsigned i3 = e % to3, row = e / to3, i2 = row % to2, i1 = row / to2 % to1, i0 = row / to2 / to1;
    dst[e] = i1 < from1 && i3 < from3 ? src[((i0 * from1 + i1) * to2 + i2) * from3 + i3] : Word(0);
  }
}

int64_t elements(const int64_t (&dims)[4]) { return dims[0] * dims[1] * dims[2] * dims[3]; }

}  // namespace

cudaError_t launch_padded_copy(const PaddedCopy& copy, cudaStream_t stream) {
  if ((copy.element_bytes != 2 && copy.element_bytes != 4) || copy.from[0] != copy.to[0] ||
      copy.from[2] != copy.to[2] || elements(copy.from) > INT_MAX || elements(copy.to) > INT_MAX)
    return cudaErrorInvalidValue;
  if (elements(copy.to) == 0) return cudaSuccess;
  const dim3 grid(unsigned(std::min(ceil_div(elements(copy.to), kCopyThreads), kMaxCopyBlocks)));
  PaddedCopy params = copy;
  void* args[] = {&params};
  return copy.element_bytes == 2
             ? cudaLaunchKernel(&padded_copy_kernel<uint16_t>, grid, dim3(kCopyThreads), args, 0, stream)
             : cudaLaunchKernel(&padded_copy_kernel<uint32_t>, grid, dim3(kCopyThreads), args, 0, stream);
}

}  // namespace mpgemm::kernels
