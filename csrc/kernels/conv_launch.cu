// Host-side dispatch of the convolution kernels: picks the element type, the
// tile configuration and the load width per pass, and wgrad's split of K,
// then launches (and, for a split wgrad, the reduction).
#include <algorithm>
#include <climits>

#include "conv_implicit_gemm.cuh"
#include "conv_launch.h"
#include "gemm_config.h"
#include "launch_utils.h"
#include "splitk_reduce.h"

namespace mpgemm::kernels {
namespace {

constexpr int64_t kMaxGridY = 65535;
// wgrad's split-K aims at this many blocks per multiprocessor (the Small and
// Scalar tiles fit four, the Compact one two or three, on sm_80 and newer);
// each split keeps at least kMinSlicesPerSplit K slices, so that the pipeline
// fills, and there are at most kMaxSplits.
constexpr int64_t kSplitBlocksPerSM = 4;
constexpr int64_t kMinSlicesPerSplit = 4;
constexpr int64_t kMaxSplits = 256;

// One of gemm_plan.h's tiles (Compact, Small or Scalar), and wgrad's split of K.
struct ConvPlan {
  TileConfigId tile = TileConfigId::kScalar;
  int split_k = 1;
};

// The tile, and for wgrad the split of GEMM-K: wgrad's M x N is the filters
// and its K every output pixel, so its tiles alone leave most multiprocessors
// idle (one 64x64 tile for a 64-to-64 1x1 convolution); splitting K gives
// each multiprocessor blocks.
template <ConvPass Pass>
ConvPlan plan_pass(const Conv2dParams& p, const DeviceLimits& device) {
  using Traits = ConvPassTraits<Pass>;
  // 16-byte chunks hold 8 channels of one pixel and one tap.
  const bool vectorized = (p.c / p.groups) % 8 == 0 && (p.k / p.groups) % 8 == 0 && aligned16(p.x) &&
                          aligned16(p.wt) && aligned16(p.dy);
  ConvPlan plan;
  plan.tile = !vectorized ? TileConfigId::kScalar
              : TileScheduler<CompactTileConfig>::tiles(Traits::m(p), Traits::n(p)) * p.groups >= device.multiprocessors
                  ? TileConfigId::kCompact
                  : TileConfigId::kSmall;
  if (Pass != ConvPass::kWgrad) return plan;
  const TileConfigInfo& tile = tile_config(plan.tile);
  const int64_t tiles = (Traits::m(p) + tile.block_m - 1) / tile.block_m *
                        ((Traits::n(p) + tile.block_n - 1) / tile.block_n) * p.groups;
  const int64_t slices = (Traits::k(p) + tile.block_k - 1) / tile.block_k;
  const int64_t wanted = (kSplitBlocksPerSM * device.multiprocessors + tiles - 1) / tiles;
  plan.split_k = int(std::max<int64_t>(1, std::min({wanted, slices / kMinSlicesPerSplit, kMaxSplits})));
  return plan;
}

ConvPlan plan_conv2d(ConvPass pass, const Conv2dParams& p) {
  const DeviceLimits device = device_limits();
  switch (pass) {
    case ConvPass::kFprop: return plan_pass<ConvPass::kFprop>(p, device);
    case ConvPass::kDgrad: return plan_pass<ConvPass::kDgrad>(p, device);
    default: return plan_pass<ConvPass::kWgrad>(p, device);
  }
}

// wgrad's partial sums: split_k copies of dw in fp32.
size_t partials_bytes(const Conv2dParams& p, const ConvPlan& plan) {
  if (plan.split_k == 1) return 0;
  return size_t(plan.split_k) * size_t(ConvPassTraits<ConvPass::kWgrad>::n(p) * p.k) * sizeof(float);
}

template <class Element, class Config, ConvPass Pass, int Vector>
cudaError_t launch(const Conv2dParams& p, const GemmGrid& work, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  constexpr int kSmemBytes = WmmaSmem<Element, Config, Traits::kARowMajor, Traits::kBRowMajor>::kBytes;
  auto* kernel = &conv2d_kernel<Element, Config, Pass, Vector>;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t blocks = TileScheduler<Config>::tiles(Traits::m(p), Traits::n(p)) * work.split_k;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.groups < kMaxGridY ? p.groups : kMaxGridY));
  Conv2dParams params = p;
  GemmGrid grid_args = work;
  void* args[] = {&params, &grid_args};
  return cudaLaunchKernel(kernel, grid, dim3(Config::kThreads), args, kSmemBytes, stream);
}

// dw = the sum of wgrad's splits, in split order (deterministic).
cudaError_t launch_wgrad_reduce(const Conv2dParams& p, const GemmGrid& work, cudaStream_t stream) {
  GemmParams out;
  out.m = p.k;
  out.n = ConvPassTraits<ConvPass::kWgrad>::n(p);
  out.d = p.out;
  out.d_type = p.out_type;
  out.d_row_stride = out.n;
  return launch_splitk_reduce(out, work.partials, work.split_k, stream);
}

template <class Element, ConvPass Pass>
cudaError_t launch_pass(const Conv2dParams& p, const ConvPlan& plan, const GemmGrid& work, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  // An empty GEMM-K still launches: its output is zeros (wgrad of an empty batch).
  if (Traits::m(p) == 0 || Traits::n(p) == 0) return cudaSuccess;
  cudaError_t err;
  switch (plan.tile) {
    case TileConfigId::kCompact: err = launch<Element, CompactTileConfig, Pass, 8>(p, work, stream); break;
    case TileConfigId::kSmall: err = launch<Element, SmallTileConfig, Pass, 8>(p, work, stream); break;
    default: err = launch<Element, ScalarTileConfig, Pass, 1>(p, work, stream); break;
  }
  if (err != cudaSuccess || work.split_k == 1) return err;
  return launch_wgrad_reduce(p, work, stream);
}

}  // namespace

size_t conv2d_workspace_bytes(ConvPass pass, const Conv2dParams& p) {
  return partials_bytes(p, plan_conv2d(pass, p));
}

cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& p, void* workspace, cudaStream_t stream) {
  if (p.groups <= 0) return cudaErrorInvalidValue;
  // The gathers index in 32 bits.
  const int64_t largest = std::max({p.n * p.h * p.w * p.c, p.n * p.p * p.q * p.k, p.k * p.r * p.s * p.c});
  if (largest > INT_MAX) return cudaErrorInvalidValue;
  const ConvPlan plan = plan_conv2d(pass, p);
  if (plan.split_k > 1 && (workspace == nullptr || !aligned16(workspace))) return cudaErrorInvalidValue;
  const GemmGrid work{1, plan.split_k, static_cast<float*>(workspace)};
  return with_input_element(p.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    switch (pass) {
      case ConvPass::kFprop: return launch_pass<Element, ConvPass::kFprop>(p, plan, work, stream);
      case ConvPass::kDgrad: return launch_pass<Element, ConvPass::kDgrad>(p, plan, work, stream);
      case ConvPass::kWgrad: return launch_pass<Element, ConvPass::kWgrad>(p, plan, work, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mpgemm::kernels
