// Loss-scaling's unscale pass: every gradient of a model (fp32, fp16 or bf16)
// converted to fp32 (or kept in its type, in place), multiplied by 1/scale
// and checked for inf/NaN, in a single launch over a table of chunks so that
// the cost does not grow with the number of parameters. Each block takes chunks in grid-stride order and
// its threads stride through the chunk's elements (memory-bound, coalesced).
#include "amp/unscale.h"
#include "common/element_traits.cuh"

namespace mpgemm::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__global__ void __launch_bounds__(kThreads) unscale_kernel(const UnscaleChunk* chunks, int64_t num_chunks,
                                                           const float* inv_scale, float* found_inf) {
  const float factor = *inv_scale;
  bool non_finite = false;
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const UnscaleChunk chunk = chunks[c];
    for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
      const float v = load_as_float(chunk.src, chunk.src_type, i) * factor;
      non_finite |= !isfinite(v);
      store_from_float(chunk.dst, chunk.dst_type, i, v);
    }
  }
  // Every writer stores the same value, so no atomic is needed.
  if (non_finite) *found_inf = 1.0f;
}

}  // namespace

cudaError_t launch_unscale(const UnscaleChunk* chunks, int64_t num_chunks, const float* inv_scale,
                           float* found_inf, cudaStream_t stream) {
  if (num_chunks <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(num_chunks < kMaxBlocks ? num_chunks : kMaxBlocks);
  void* args[] = {&chunks, &num_chunks, &inv_scale, &found_inf};
  return cudaLaunchKernel(unscale_kernel, dim3(blocks), dim3(kThreads), args, 0, stream);
}

}  // namespace mpgemm::kernels
