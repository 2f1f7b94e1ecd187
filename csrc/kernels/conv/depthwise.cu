// Depthwise convolutions (one input channel per group, conv/depthwise.h):
// the plan of a pass (channels a thread, lanes, blocks, wgrad's splits) and
// its launches, on the direct kernels of conv/depthwise_kernels.cuh, wgrad
// on conv/depthwise_sliding_wgrad.cuh's and fprop and dgrad on
// conv/depthwise_sliding_gather.cuh's where the plan says so.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/launch_utils.h"
#include "common/math.h"
#include "conv/depthwise.h"
#include "conv/depthwise_kernels.cuh"
#include "conv/depthwise_sliding_gather.cuh"
#include "conv/depthwise_sliding_wgrad.cuh"
#include "conv/geometry.h"
#include "gemm/splitk_reduce.h"
#include "plan/split_cost.h"
#include "plan/switches.h"

namespace mpgemm::kernels {

namespace {

using depthwise::DepthwiseArgs;
using depthwise::kRun;
using depthwise::kSlidingVector;
using depthwise::kThreads;

constexpr int kMaxLanes = 32;   // a warp across channels
constexpr int64_t kSmemLimit = 48 * 1024;  // no opt-in needed
// The gather grid-strides over runs with at most this many blocks per
// multiprocessor (4 waves of the gather kernel's kMinBlocksPerSM; 8 of the
// sliding gather's kernels built for one block), so that each block stages
// its filters once for many runs.
constexpr int64_t kBlocksPerSM = 8;
// wgrad splits its runs to fill the device with about kSplitBlocksPerSM
// blocks a multiprocessor, in at most plan/split_cost.h's kMaxSplits splits,
// each pixel lane summing at least kMinRunsPerLane runs. (Its partial sums
// are a filter of taps x channels, too small for their traffic to matter.)
constexpr int64_t kSplitBlocksPerSM = 4;
constexpr int64_t kMinRunsPerLane = 4;
// The sliding wgrad: a pixel lane sums whole output rows, at least this many
// pixels of them a split; a block holds at least 8 lanes (so at most 32
// filter rows).
constexpr int64_t kMinSlidingPixelsPerLane = 16;
constexpr int64_t kMaxSlidingRows = kThreads / 8;
constexpr int64_t kMaxGridX = INT_MAX;

// Runs of `g`'s pixel grid (rows x cols of p.n images).
void set_runs(DepthwiseArgs& args, const Conv2dParams& p) {
  const int64_t runs_per_row = ceil_div(args.g.cols, kRun);
  args.runs = {int(runs_per_row), args.g.rows};
  args.run_count = int(p.n * args.g.rows * runs_per_row);
}

template <class Element, class Kernel>
cudaError_t launch_kernel(Kernel* kernel, DepthwiseArgs args, int64_t blocks, const DepthwisePlan& plan,
                          cudaStream_t stream) {
  if (const cudaError_t err = prepare_launch<Element>(kernel, plan.smem_bytes); err != cudaSuccess) return err;
  const dim3 grid(unsigned(std::min(blocks, kMaxGridX)), unsigned(std::min(plan.channel_tiles, kMaxGridY)));
  void* params[] = {&args};
  return cudaLaunchKernel(kernel, grid, dim3(kThreads), params, size_t(plan.smem_bytes), stream);
}

// The sliding gather's kernel for a launch's geometry `g` (its taps in a
// row, column stride and tap step), or null where it has none.
template <class Element, int kTaps>
auto* sliding_gather_kernel(const ConvGemm& g) {
  decltype(&depthwise::depthwise_sliding_gather_kernel<Element, kTaps, 1, 1>) kernel = nullptr;
  if (g.stride_w == 1 && g.tap_w == 1) kernel = &depthwise::depthwise_sliding_gather_kernel<Element, kTaps, 1, 1>;
  if (g.stride_w == 2 && g.tap_w == 1) kernel = &depthwise::depthwise_sliding_gather_kernel<Element, kTaps, 2, 1>;
  if (g.stride_w == 1 && g.tap_w == -1) kernel = &depthwise::depthwise_sliding_gather_kernel<Element, kTaps, 1, -1>;
  return kernel;
}

template <class Element>
auto* sliding_gather_kernel_of(const ConvGemm& g) {
  return g.taps_s == 3   ? sliding_gather_kernel<Element, 3>(g)
         : g.taps_s == 5 ? sliding_gather_kernel<Element, 5>(g)
         : g.taps_s == 7 ? sliding_gather_kernel<Element, 7>(g)
                         : nullptr;
}

// fprop over x, or one dgrad phase over dy: the gather kernel on `args.g`,
// on the sliding window where the plan takes it and the launch's window fits.
template <class Element, int Vector>
cudaError_t launch_gather(DepthwiseArgs args, const Conv2dParams& p, const DepthwisePlan& plan,
                          cudaStream_t stream) {
  set_runs(args, p);
  if (args.run_count == 0) return cudaSuccess;
  const int64_t blocks = std::min(ceil_div(args.run_count, plan.pixel_lanes), plan.gather_blocks);
  if constexpr (Vector == depthwise::kSlidingGatherVector) {
    if (plan.sliding_gather && args.fan == 1) {
      if (const auto kernel = sliding_gather_kernel_of<Element>(args.g); kernel != nullptr)
        return launch_kernel<Element>(kernel, args, blocks, plan, stream);
    }
  }
  return launch_kernel<Element>(&depthwise::depthwise_gather_kernel<Element, Vector>, args, blocks, plan, stream);
}

// dw, (k, r * s), as the sum of wgrad's `splits` partial sums in split order.
cudaError_t reduce_wgrad_splits(const Conv2dParams& p, const float* partials, int splits, cudaStream_t stream) {
  GemmParams reduced;
  reduced.m = p.k, reduced.n = p.r * p.s;
  reduced.d = p.out, reduced.d_type = p.out_type, reduced.d_row_stride = p.r * p.s;
  return launch_splitk_reduce(reduced, partials, splits, stream);
}

template <class Element, int kS>
auto* sliding_wgrad_kernel(int stride_w) {
  return stride_w == 1 ? &depthwise::depthwise_sliding_wgrad_kernel<Element, kS, 1>
                       : &depthwise::depthwise_sliding_wgrad_kernel<Element, kS, 2>;
}

// wgrad on the sliding window, then the splits' reduction.
template <class Element>
cudaError_t launch_sliding_wgrad(const Conv2dParams& p, const DepthwisePlan& plan, void* workspace,
                                 cudaStream_t stream) {
  depthwise::SlidingWgradArgs args{};
  args.x = p.x, args.dy = p.dy, args.out = p.out, args.out_type = p.out_type;
  args.partials = static_cast<float*>(workspace);
  args.images = int(p.n), args.h = int(p.h), args.w = int(p.w), args.p = int(p.p), args.q = int(p.q);
  args.channels = int(p.k), args.r = int(p.r);
  args.stride_h = p.stride_h, args.pad_top = p.pad_top, args.dilation_h = p.dilation_h, args.pad_left = p.pad_left;
  args.lanes = plan.lanes, args.pixel_lanes = plan.pixel_lanes, args.channel_tiles = int(plan.channel_tiles);
  args.splits = plan.splits, args.rows_per_split = int(ceil_div(p.n * p.p, plan.splits));
  const auto kernel = p.s == 3   ? sliding_wgrad_kernel<Element, 3>(p.stride_w)
                      : p.s == 5 ? sliding_wgrad_kernel<Element, 5>(p.stride_w)
                                 : sliding_wgrad_kernel<Element, 7>(p.stride_w);
  if (const cudaError_t err = prepare_launch<Element>(kernel, plan.smem_bytes); err != cudaSuccess) return err;
  const dim3 grid(unsigned(std::min<int64_t>(plan.splits, kMaxGridX)), unsigned(std::min(plan.channel_tiles, kMaxGridY)));
  // Whole warps: the last one's threads past the pixel lanes sum nothing.
  const dim3 block(unsigned(round_up(plan.lanes * p.r * plan.pixel_lanes, int64_t(32))));
  void* params[] = {&args};
  const cudaError_t err = cudaLaunchKernel(kernel, grid, block, params, size_t(plan.smem_bytes), stream);
  if (err != cudaSuccess || plan.splits == 1) return err;
  return reduce_wgrad_splits(p, args.partials, plan.splits, stream);
}

template <class Element, int Vector>
cudaError_t launch_pass(ConvPass pass, const Conv2dParams& p, const DepthwisePlan& plan, void* workspace,
                        cudaStream_t stream) {
  const int64_t kg = p.k / p.groups;
  DepthwiseArgs args{};
  args.bias_type = p.bias_type, args.out = p.out, args.out_type = p.out_type;
  args.filter_taps = int(p.r * p.s);
  args.lanes = plan.lanes, args.pixel_lanes = plan.pixel_lanes, args.channel_tiles = int(plan.channel_tiles);
  args.fan = 1, args.src_div = 1, args.splits = 1;
  if (pass == ConvPass::kDgrad) {
    args.src = p.dy, args.filters = p.wt, args.channels = int(p.c), args.fan = int(kg);
    for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
      for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w) {
        args.g = dgrad_phase_gemm(p, phase_h, phase_w);
        if (const cudaError_t err = launch_gather<Element, Vector>(args, p, plan, stream); err != cudaSuccess)
          return err;
      }
    return cudaSuccess;
  }
  // fprop and wgrad: output pixels over x, every filter tap, in place.
  args.g = fprop_gemm(p, 1);
  args.g.taps_r = int(p.r), args.g.taps_s = int(p.s), args.g.filter_dr = args.g.filter_ds = 1;
  args.g.filter_s = int(p.s);
  args.g.out_h = int(p.p), args.g.out_w = int(p.q);
  args.src = p.x, args.channels = int(p.k), args.src_div = int(kg);
  if (pass == ConvPass::kFprop) {
    args.filters = p.wt, args.bias = p.bias;
    return launch_gather<Element, Vector>(args, p, plan, stream);
  }
  args.dy = p.dy, args.splits = plan.splits;
  set_runs(args, p);
  args.runs_per_split = int(ceil_div(args.run_count, plan.splits));
  args.partials = static_cast<float*>(workspace);
  if (p.k * args.filter_taps == 0) return cudaSuccess;
  const cudaError_t err = launch_kernel<Element>(&depthwise::depthwise_wgrad_kernel<Element, Vector>, args,
                                                 int64_t(args.filter_taps) * plan.splits, plan, stream);
  if (err != cudaSuccess || plan.splits == 1) return err;
  return reduce_wgrad_splits(p, args.partials, plan.splits, stream);
}

// The sliding window's block for `p`, from its shape alone: lanes of 4
// channels by filter rows by pixel lanes, and the lanes' sums in shared memory.
DepthwisePlan sliding_wgrad_block(const Conv2dParams& p) {
  DepthwisePlan plan;
  plan.vector = kSlidingVector, plan.sliding = true;
  const int64_t chunks = p.k / kSlidingVector, max_lanes = std::min<int64_t>(kMaxLanes, kThreads / p.r);
  plan.channel_tiles = ceil_div(chunks, max_lanes);
  plan.lanes = int(ceil_div(chunks, plan.channel_tiles));
  plan.pixel_lanes = int(kThreads / (plan.lanes * p.r));
  plan.smem_bytes = int(int64_t(plan.pixel_lanes) * plan.lanes * p.r * p.s * kSlidingVector * int64_t(sizeof(float)));
  return plan;
}

// wgrad on the sliding window: its block, its output rows split to fill the
// device as the tap-per-block kernel's runs are.
DepthwisePlan plan_sliding_wgrad(const Conv2dParams& p) {
  DepthwisePlan plan = sliding_wgrad_block(p);
  const int64_t rows = p.n * p.p, rows_per_lane = ceil_div(kMinSlidingPixelsPerLane, p.q);
  const int64_t wanted = ceil_div(kSplitBlocksPerSM * device_limits().multiprocessors, plan.channel_tiles);
  plan.splits = int(std::max<int64_t>(1, std::min({wanted, rows / (plan.pixel_lanes * rows_per_lane), kMaxSplits})));
  return plan;
}

// Whether `plan` is the sliding window's for `p`: its block as
// sliding_wgrad_block makes it (no device query at launch), so that it
// covers every channel within its shared memory.
bool sliding_plan_of(const Conv2dParams& p, const DepthwisePlan& plan) {
  if (!depthwise_sliding_wgrad_fits(p)) return false;
  const DepthwisePlan want = sliding_wgrad_block(p);
  return plan.lanes == want.lanes && plan.pixel_lanes == want.pixel_lanes &&
         plan.channel_tiles == want.channel_tiles && plan.smem_bytes == want.smem_bytes && plan.splits >= 1;
}

}  // namespace

bool depthwise_sliding_wgrad_enabled() { return switch_on("MPGEMM_DEPTHWISE_SLIDING_WGRAD", false); }

bool depthwise_sliding_gather_enabled() { return switch_on("MPGEMM_DEPTHWISE_SLIDING_GATHER", false); }

bool depthwise_sliding_gather_fits(ConvPass pass, const Conv2dParams& p) {
  const bool fprop = pass == ConvPass::kFprop, dgrad = pass == ConvPass::kDgrad;
  return (fprop || dgrad) && p.groups == p.c && p.k == p.c && p.c % depthwise::kSlidingGatherVector == 0 &&
         (p.s == 3 || p.s == 5 || p.s == 7) && p.dilation_w == 1 &&
         (p.stride_w == 1 || (fprop && p.stride_w == 2)) && aligned16(fprop ? p.x : p.dy);
}

bool depthwise_sliding_wgrad_fits(const Conv2dParams& p) {
  return p.groups == p.c && p.k == p.c && (p.s == 3 || p.s == 5 || p.s == 7) && (p.stride_w == 1 || p.stride_w == 2) &&
         p.dilation_w == 1 && p.r >= 1 && p.r <= kMaxSlidingRows && p.c % kSlidingVector == 0 &&
         p.n * p.p * p.q > 0 && aligned_to(p.x, 8) && aligned_to(p.dy, 8);
}

DepthwisePlan plan_depthwise(ConvPass pass, const Conv2dParams& p, bool sliding_wgrad, bool sliding_gather) {
  if (p.groups <= 0 || p.c != p.groups || p.k % p.groups != 0) return {};
  const int64_t kg = p.k / p.groups, taps = p.r * p.s;
  if (kg < 1 || kg > kDepthwiseMaxFiltersPerGroup || taps < 1) return {};
  // As the implicit GEMM's gathers, the launch geometry (conv/geometry.h)
  // counts elements in int; runs are int too, and a run's stride may pass
  // their count by a grid's width.
  if (std::max({p.n * p.h * p.w * p.c, p.n * p.p * p.q * p.k, p.k * taps}) > INT_MAX / 2) return {};
  const bool dgrad = pass == ConvPass::kDgrad, wgrad = pass == ConvPass::kWgrad;
  if (wgrad && sliding_wgrad && depthwise_sliding_wgrad_fits(p)) return plan_sliding_wgrad(p);
  const bool wide = kg == 1 && p.c % 8 == 0 && (dgrad || aligned16(p.x)) && (pass == ConvPass::kFprop || aligned16(p.dy));
  // A lane's share of shared memory: its filters at every tap and its bias
  // (fprop, dgrad), or its running sums (wgrad, at most 8 KB for the block).
  // A window too large for 8 channels a lane may still fit at one.
  DepthwisePlan plan;
  int64_t lane_bytes = 0, max_lanes = 0;
  for (const int vector : {8, 1}) {
    if (vector == 8 && !wide) continue;
    plan.vector = vector;
    lane_bytes = wgrad ? 0 : (taps + 1) * vector * (dgrad ? kg : 1) * int64_t(sizeof(float));
    max_lanes = wgrad ? kMaxLanes : std::min<int64_t>(kMaxLanes, kSmemLimit / lane_bytes);
    if (max_lanes > 0) break;
  }
  if (max_lanes == 0) return {};
  const int64_t chunks = (dgrad ? p.c : p.k) / plan.vector;
  plan.channel_tiles = ceil_div(chunks, max_lanes);
  plan.lanes = int(ceil_div(chunks, plan.channel_tiles));
  plan.pixel_lanes = kThreads / plan.lanes;
  plan.smem_bytes = int(wgrad ? int64_t(kThreads) * plan.vector * sizeof(float) : plan.lanes * lane_bytes);
  const int64_t multiprocessors = device_limits().multiprocessors;
  plan.gather_blocks = std::max<int64_t>(1, ceil_div(kBlocksPerSM * multiprocessors, plan.channel_tiles));
  // The same block as the gather kernel's: only the kernel differs.
  plan.sliding_gather = sliding_gather && plan.vector == depthwise::kSlidingGatherVector &&
                        depthwise_sliding_gather_fits(pass, p);
  if (wgrad) {
    const int64_t runs = p.n * p.p * ceil_div(p.q, kRun);
    const int64_t wanted = ceil_div(kSplitBlocksPerSM * multiprocessors, taps * plan.channel_tiles);
    plan.splits = int(std::max<int64_t>(1, std::min({wanted, runs / (plan.pixel_lanes * kMinRunsPerLane), kMaxSplits})));
  }
  return plan;
}

size_t depthwise_workspace_bytes(const Conv2dParams& p, const DepthwisePlan& plan) {
  if (plan.splits == 1) return 0;
  return size_t(plan.splits) * size_t(p.k) * size_t(p.r * p.s) * sizeof(float);
}

cudaError_t launch_depthwise(ConvPass pass, const Conv2dParams& p, const DepthwisePlan& plan, void* workspace,
                             cudaStream_t stream) {
  if (plan.vector == 0) return cudaErrorInvalidValue;
  if (depthwise_workspace_bytes(p, plan) > 0 && (workspace == nullptr || !aligned16(workspace)))
    return cudaErrorInvalidValue;
  return with_input_element(p.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    if (plan.sliding)  // a plan of another pass or shape is refused
      return pass == ConvPass::kWgrad && sliding_plan_of(p, plan)
                 ? launch_sliding_wgrad<Element>(p, plan, workspace, stream)
                 : cudaErrorInvalidValue;
    return plan.vector == 8 ? launch_pass<Element, 8>(pass, p, plan, workspace, stream)
                            : launch_pass<Element, 1>(pass, p, plan, workspace, stream);
  });
}

}  // namespace mpgemm::kernels
