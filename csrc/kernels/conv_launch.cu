// Host-side dispatch of the convolution kernels: picks the element type, the
// tile configuration and the load width per pass, then launches.
#include <algorithm>
#include <climits>

#include "conv_implicit_gemm.cuh"
#include "conv_launch.h"
#include "gemm_config.h"
#include "launch_utils.h"

namespace mpgemm::kernels {
namespace {

constexpr int64_t kMaxGridY = 65535;

template <class Element, class Config, ConvPass Pass, int Vector>
cudaError_t launch(const Conv2dParams& p, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  constexpr int kSmemBytes = WmmaSmem<Element, Config, Traits::kARowMajor, Traits::kBRowMajor>::kBytes;
  auto* kernel = &conv2d_kernel<Element, Config, Pass, Vector>;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t tiles = TileScheduler<Config>::tiles(Traits::m(p), Traits::n(p));
  if (tiles > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.groups < kMaxGridY ? p.groups : kMaxGridY));
  Conv2dParams params = p;
  void* args[] = {&params};
  return cudaLaunchKernel(kernel, grid, dim3(Config::kThreads), args, kSmemBytes, stream);
}

template <class Element, ConvPass Pass>
cudaError_t launch_pass(const Conv2dParams& p, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  // An empty GEMM-K still launches: its output is zeros (wgrad of an empty batch).
  if (Traits::m(p) == 0 || Traits::n(p) == 0) return cudaSuccess;
  // 16-byte chunks hold 8 channels of one pixel and one tap.
  const bool vectorized = (p.c / p.groups) % 8 == 0 && (p.k / p.groups) % 8 == 0 && aligned16(p.x) &&
                          aligned16(p.wt) && aligned16(p.dy);
  const DeviceLimits device = device_limits();
  const int64_t large_tiles = TileScheduler<CompactTileConfig>::tiles(Traits::m(p), Traits::n(p)) * p.groups;
  if (vectorized && large_tiles >= device.multiprocessors)
    return launch<Element, CompactTileConfig, Pass, 8>(p, stream);
  if (vectorized) return launch<Element, SmallTileConfig, Pass, 8>(p, stream);
  return launch<Element, ScalarTileConfig, Pass, 1>(p, stream);
}

}  // namespace

cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& p, cudaStream_t stream) {
  if (p.groups <= 0) return cudaErrorInvalidValue;
  // The gathers index in 32 bits.
  const int64_t largest = std::max({p.n * p.h * p.w * p.c, p.n * p.p * p.q * p.k, p.k * p.r * p.s * p.c});
  if (largest > INT_MAX) return cudaErrorInvalidValue;
  return with_input_element(p.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    switch (pass) {
      case ConvPass::kFprop: return launch_pass<Element, ConvPass::kFprop>(p, stream);
      case ConvPass::kDgrad: return launch_pass<Element, ConvPass::kDgrad>(p, stream);
      case ConvPass::kWgrad: return launch_pass<Element, ConvPass::kWgrad>(p, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mpgemm::kernels
