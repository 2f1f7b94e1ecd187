// Host-side dispatch of the convolution kernels: picks the element type, the
// tile configuration and the load width per pass, and wgrad's split of K,
// works out each launch's ConvGemm, then launches (dgrad once per phase; a
// split wgrad, then the reduction).
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
// wgrad's split-K aims at this many blocks per multiprocessor (the Scalar
// tile fits four, the Compact one two or three, on sm_80 and newer);
// each split keeps at least kMinSlicesPerSplit K slices, so that the pipeline
// fills, and there are at most kMaxSplits.
constexpr int64_t kSplitBlocksPerSM = 4;
constexpr int64_t kMinSlicesPerSplit = 4;
constexpr int64_t kMaxSplits = 256;

// One of gemm_plan.h's tiles (Square, Compact, Small or Scalar), and
// wgrad's split of K.
struct ConvPlan {
  TileConfigId tile = TileConfigId::kScalar;
  int split_k = 1;
};

// The pass's GEMM for slices of block_k; dgrad's first phase (its largest).
ConvGemm pass_gemm(ConvPass pass, const Conv2dParams& p, int block_k) {
  switch (pass) {
    case ConvPass::kFprop: return fprop_gemm(p, block_k);
    case ConvPass::kDgrad: return dgrad_phase_gemm(p, 0, 0);
    default: return wgrad_gemm(p, block_k);
  }
}

// The tile: the largest whose tiles fill the device, as for a GEMM of the
// pass's M x N (times the groups); and for wgrad the split of GEMM-K: wgrad's
// M x N is the filters and its K every output pixel, so its tiles alone leave
// most multiprocessors idle (one 64x64 tile for a 64-to-64 1x1 convolution);
// splitting K gives each multiprocessor blocks.
ConvPlan plan_conv2d(ConvPass pass, const Conv2dParams& p) {
  const DeviceLimits device = device_limits();
  const ConvGemm g = pass_gemm(pass, p, 1);
  // 16-byte chunks hold 8 channels of one pixel and one tap.
  const bool vectorized = (p.c / p.groups) % 8 == 0 && (p.k / p.groups) % 8 == 0 && aligned16(p.x) &&
                          aligned16(p.wt) && aligned16(p.dy);
  // Blocks of one split over every group.
  const auto blocks = [&](TileConfigId id) {
    const TileConfigInfo& tile = tile_config(id);
    return (g.m + tile.block_m - 1) / tile.block_m * ((g.n + tile.block_n - 1) / tile.block_n) * p.groups;
  };
  const auto fills = [&](TileConfigId id) { return blocks(id) >= device.multiprocessors; };
  const TileConfigInfo& square = tile_config(TileConfigId::kSquare);
  const bool square_fits = device.arch >= square.min_arch && device.max_smem_per_block >= square.smem_bytes;
  ConvPlan plan;
  if (pass != ConvPass::kWgrad) {
    plan.tile = !vectorized                                 ? TileConfigId::kScalar
                : square_fits && fills(TileConfigId::kSquare) ? TileConfigId::kSquare
                : fills(TileConfigId::kCompact)             ? TileConfigId::kCompact
                                                            : TileConfigId::kSmall;
    return plan;
  }
  // wgrad splits K to fill the device, on the compact tile alone: each pixel
  // row of its B costs a thread about 17 instructions per K slice
  // (bench/NOTES.md), which keeps it to the tiles where a thread holds 2.
  plan.tile = vectorized ? TileConfigId::kCompact : TileConfigId::kScalar;
  const int64_t tiles = blocks(plan.tile);
  const int64_t slices = (g.k + tile_config(plan.tile).block_k - 1) / tile_config(plan.tile).block_k;
  const int64_t wanted = (kSplitBlocksPerSM * device.multiprocessors + tiles - 1) / tiles;
  plan.split_k = int(std::max<int64_t>(1, std::min({wanted, slices / kMinSlicesPerSplit, kMaxSplits})));
  return plan;
}

// wgrad's partial sums: split_k copies of dw in fp32.
size_t partials_bytes(const Conv2dParams& p, const ConvPlan& plan) {
  if (plan.split_k == 1) return 0;
  return size_t(plan.split_k) * size_t(p.k) * size_t(p.r * p.s * (p.c / p.groups)) * sizeof(float);
}

template <class Element, class Config, ConvPass Pass, int Vector>
cudaError_t launch(const Conv2dParams& p, const ConvGemm& g, const GemmGrid& work, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  constexpr int kSmemBytes = WmmaSmem<Element, Config, Traits::kARowMajor, Traits::kBRowMajor>::kBytes;
  auto* kernel = &conv2d_kernel<Element, Config, Pass, Vector>;
  if (const cudaError_t err = check_tile_arch<Config>(kernel); err != cudaSuccess) return err;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t blocks = TileScheduler<Config>::tiles(g.m, g.n) * work.split_k;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.groups < kMaxGridY ? p.groups : kMaxGridY));
  Conv2dParams params = p;
  ConvGemm gemm = g;
  GemmGrid grid_args = work;
  void* args[] = {&params, &gemm, &grid_args};
  return cudaLaunchKernel(kernel, grid, dim3(Config::kThreads), args, kSmemBytes, stream);
}

// dw = the sum of wgrad's splits, in split order (deterministic).
cudaError_t launch_wgrad_reduce(const Conv2dParams& p, const GemmGrid& work, cudaStream_t stream) {
  GemmParams out;
  out.m = p.k;
  out.n = p.r * p.s * (p.c / p.groups);
  out.d = p.out;
  out.d_type = p.out_type;
  out.d_row_stride = out.n;
  return launch_splitk_reduce(out, work.partials, work.split_k, stream);
}

// One pass on Config's tiles: fprop and wgrad (then its reduction) are one
// GEMM; dgrad is one per phase, each writing its own pixels of dx.
template <class Element, class Config, ConvPass Pass, int Vector>
cudaError_t launch_pass(const Conv2dParams& p, const GemmGrid& work, cudaStream_t stream) {
  if constexpr (Pass == ConvPass::kDgrad) {
    for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
      for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w)
        if (const cudaError_t err =
                launch<Element, Config, Pass, Vector>(p, dgrad_phase_gemm(p, phase_h, phase_w), work, stream);
            err != cudaSuccess)
          return err;
    return cudaSuccess;
  } else {
    const ConvGemm g = Pass == ConvPass::kFprop ? fprop_gemm(p, Config::kBlockK) : wgrad_gemm(p, Config::kBlockK);
    // An empty GEMM-K still launches: its output is zeros (wgrad of an empty batch).
    if (g.m == 0 || g.n == 0) return cudaSuccess;
    const cudaError_t err = launch<Element, Config, Pass, Vector>(p, g, work, stream);
    if (err != cudaSuccess || work.split_k == 1) return err;
    return launch_wgrad_reduce(p, work, stream);
  }
}

template <class Element, ConvPass Pass>
cudaError_t launch_tile(const Conv2dParams& p, const ConvPlan& plan, const GemmGrid& work, cudaStream_t stream) {
  if constexpr (Pass == ConvPass::kWgrad) {
    if (plan.tile == TileConfigId::kCompact) return launch_pass<Element, CompactTileConfig, Pass, 8>(p, work, stream);
  } else {
    switch (plan.tile) {
      case TileConfigId::kSquare: return launch_pass<Element, SquareTileConfig, Pass, 8>(p, work, stream);
      case TileConfigId::kCompact: return launch_pass<Element, CompactTileConfig, Pass, 8>(p, work, stream);
      case TileConfigId::kSmall: return launch_pass<Element, SmallTileConfig, Pass, 8>(p, work, stream);
      default: break;
    }
  }
  return launch_pass<Element, ScalarTileConfig, Pass, 1>(p, work, stream);
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
      case ConvPass::kFprop: return launch_tile<Element, ConvPass::kFprop>(p, plan, work, stream);
      case ConvPass::kDgrad: return launch_tile<Element, ConvPass::kDgrad>(p, plan, work, stream);
      case ConvPass::kWgrad: return launch_tile<Element, ConvPass::kWgrad>(p, plan, work, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mpgemm::kernels
