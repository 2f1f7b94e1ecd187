// Host side of the Hopper convolution: per pass, the im2col tensor map of
// the activations it gathers (x, or dy for dgrad: a bounding box of the first
// taps of every output pixel's window, the convolution's traversal
// strides), the tiled map of its other operand (the filters, or dy for
// wgrad), the output's map as the GEMM's D, and the walk of the implicit
// GEMM (sm90/params.h's ConvWalk); wgrad's split partial sums are reduced in
// split order. The kernels are instantiated here, one per pass and input
// type.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda.h>

#include "common/element_traits.cuh"
#include "common/launch_utils.h"
#include "common/math.h"
#include "common/tile_configs.h"
#include "gemm/splitk_reduce.h"
#include "plan/gemm_plan.h"
#include "sm90/conv_kernel.cuh"
#include "sm90/conv_launch.h"
#include "sm90/launch_kernel.cuh"
#include "sm90/layout.h"
#include "sm90/tensor_maps.h"

namespace mpgemm::kernels {
namespace {

using Config = WgmmaBlockConfig;
using ConvTile = WgmmaTile;
template <ConvPass Pass>
using ConvSmem = sm90::WgmmaSmem<ConvTile, sm90::kConvAKMajor<Pass>, sm90::kConvBKMajor<Pass>>;

// The im2col mode's ranges for a 4-D tensor: bounding-box corners in [-128,
// 127] and traversal strides in [1, 8] (cuTensorMapEncodeIm2col, CUDA driver
// API, "Tensor Map Object Management"); the instruction's 16 bits of im2col
// offsets shared by its two spatial dimensions, 8 bits each (PTX ISA,
// "Tensors": "Im2col mode"), so taps at most 255 apart.
constexpr int kCornerMin = -128, kCornerMax = 127, kMaxTraversalStride = 8, kMaxIm2colOffset = 255;

// The bounding box along one spatial dimension of a source of `extent`
// pixels: from the first window's first tap (-pad) to the last one's, (out -
// 1) * stride - pad, given as offsets from the source's first and last
// pixels, so that the box holds exactly `out` window starts `stride` apart.
struct Corners {
  int64_t lower, upper;
};
Corners corners(int64_t extent, int64_t out, int stride, int64_t pad) {
  return {-pad, (out - 1) * stride - pad - (extent - 1)};
}

bool in_corner_range(const Corners& c) {
  return c.lower >= kCornerMin && c.lower <= kCornerMax && c.upper >= kCornerMin && c.upper <= kCornerMax;
}

// The pixel grid a pass's im2col boxes walk, over which source: fprop and
// wgrad x's windows at the output pixels; dgrad (stride 1) dy's windows at
// dx's pixels, padded by dilation * (taps - 1) - pad.
struct Im2colSource {
  const void* base;
  int64_t channels, w, h;   // the source's
  int64_t out_w, out_h;     // the grid's
  int stride_w, stride_h;
  int64_t pad_left, pad_top;
};

Im2colSource im2col_source(ConvPass pass, const Conv2dParams& p) {
  if (pass == ConvPass::kDgrad)
    return {p.dy, p.k, p.q, p.p, p.w, p.h, 1, 1, p.dilation_w * (p.s - 1) - p.pad_left,
            p.dilation_h * (p.r - 1) - p.pad_top};
  return {p.x, p.c, p.w, p.h, p.q, p.p, p.stride_w, p.stride_h, p.pad_left, p.pad_top};
}

bool im2col_describable(const Im2colSource& g, const Conv2dParams& p) {
  const auto within = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  return within(g.stride_h, 1, kMaxTraversalStride) && within(g.stride_w, 1, kMaxTraversalStride) &&
         in_corner_range(corners(g.w, g.out_w, g.stride_w, g.pad_left)) &&
         in_corner_range(corners(g.h, g.out_h, g.stride_h, g.pad_top)) &&
         within((p.r - 1) * p.dilation_h, 0, kMaxIm2colOffset) && within((p.s - 1) * p.dilation_w, 0, kMaxIm2colOffset);
}

// The source (N, H, W, channels) as its im2col map: dimensions (channels, W,
// H, N), boxes of 64 channels (128 bytes, 128-byte swizzle) by `pixels`.
cudaError_t im2col_map(CUtensorMap* map, const Conv2dParams& p, const Im2colSource& g, int pixels) {
  const sm90::EncodeIm2col encode = sm90::encode_im2col();
  if (encode == nullptr) return cudaErrorNotSupported;
  const Corners w = corners(g.w, g.out_w, g.stride_w, g.pad_left), h = corners(g.h, g.out_h, g.stride_h, g.pad_top);
  const cuuint64_t dims[4] = {cuuint64_t(g.channels), cuuint64_t(g.w), cuuint64_t(g.h), cuuint64_t(p.n)};
  const cuuint64_t strides[3] = {cuuint64_t(g.channels * 2), cuuint64_t(g.w * g.channels * 2),
                                 cuuint64_t(g.h * g.w * g.channels * 2)};
  const int lower[2] = {int(w.lower), int(h.lower)}, upper[2] = {int(w.upper), int(h.upper)};
  const cuuint32_t traversal[4] = {1, cuuint32_t(g.stride_w), cuuint32_t(g.stride_h), 1};
  const CUresult err = encode(map, sm90::map_type(p.input_type), 4, const_cast<void*>(g.base), dims, strides, lower,
                              upper, sm90::kSwizzleElements, cuuint32_t(pixels), traversal,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return err == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A 16-bit tensor of dimensions (inner, middle, outer), dense, in boxes of 64
// inner elements (128 bytes, 128-byte swizzle) by 1 by `box_outer`: the
// filters (C, R * S, K), or wgrad's dy (K, N * P * Q, 1) in boxes of 64 by 64.
cudaError_t tiled_map(CUtensorMap* map, ElementType type, const void* base, int64_t inner, int64_t middle,
                      int64_t outer, int box_middle, int box_outer) {
  const sm90::EncodeTiled encode = sm90::encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(middle), cuuint64_t(outer)};
  const cuuint64_t strides[2] = {cuuint64_t(inner * 2), cuuint64_t(inner * middle * 2)};
  const cuuint32_t box[3] = {cuuint32_t(sm90::kSwizzleElements), cuuint32_t(box_middle), cuuint32_t(box_outer)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult err = encode(map, sm90::map_type(type), 3, const_cast<void*>(base), dims, strides, box,
                              element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return err == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The pass's GEMM sizes (M, N) and its output as D: y with fprop's bias, dx,
// or wgrad's split partial sums in `workspace` (dw itself without a split).
GemmParams output_gemm(ConvPass pass, const Conv2dParams& c, int splits, void* workspace) {
  GemmParams p;
  p.ab_type = c.input_type;
  p.d = c.out, p.d_type = c.out_type;
  switch (pass) {
    case ConvPass::kFprop:
      p.m = c.n * c.p * c.q, p.n = c.k;
      p.bias = c.bias, p.bias_type = c.bias_type;
      break;
    case ConvPass::kDgrad: p.m = c.n * c.h * c.w, p.n = c.c; break;
    case ConvPass::kWgrad:
      p.m = c.k, p.n = c.r * c.s * c.c, p.batch = splits;
      if (splits > 1) p.d = workspace, p.d_type = ElementType::kFloat32;
      break;
  }
  p.d_row_stride = p.n, p.d_batch_stride = p.m * p.n;
  return p;
}

// wgrad's K slices: its output pixels, 64 a slice.
int64_t wgrad_slices(const Conv2dParams& p) { return ceil_div(p.n * p.p * p.q, int64_t(Config::kBlockK)); }

sm90::ConvWalk conv_walk(ConvPass pass, const Conv2dParams& p, int splits) {
  const Im2colSource g = im2col_source(pass, p);
  sm90::ConvWalk walk;
  walk.pixels_per_image = int(g.out_h * g.out_w), walk.q = int(g.out_w);
  walk.stride_h = g.stride_h, walk.stride_w = g.stride_w;
  walk.pad_top = int(g.pad_top), walk.pad_left = int(g.pad_left);
  walk.dilation_h = p.dilation_h, walk.dilation_w = p.dilation_w;
  walk.r = int(p.r), walk.s = int(p.s);
  walk.channel_blocks = int(ceil_div(g.channels, int64_t(Config::kBlockK)));
  walk.channels = int(p.c);
  walk.k_slices = pass == ConvPass::kWgrad ? int(ceil_div(wgrad_slices(p), splits))
                                           : walk.r * walk.s * walk.channel_blocks;
  return walk;
}

// The maps of the pass's two operands.
template <ConvPass Pass>
cudaError_t operand_maps(CUtensorMap* a_map, CUtensorMap* b_map, const Conv2dParams& p) {
  using BTile = typename ConvSmem<Pass>::BTile;
  const Im2colSource g = im2col_source(Pass, p);
  if constexpr (Pass == ConvPass::kWgrad) {
    if (const cudaError_t err = tiled_map(a_map, p.input_type, p.dy, p.k, p.n * p.p * p.q, 1, Config::kBlockK, 1);
        err != cudaSuccess)
      return err;
    return im2col_map(b_map, p, g, Config::kBlockK);
  } else {
    if (const cudaError_t err = im2col_map(a_map, p, g, ConvTile::kBlockM); err != cudaSuccess) return err;
    return tiled_map(b_map, p.input_type, p.wt, p.c, p.r * p.s, p.k, 1, BTile::kBoxRows);
  }
}

template <class Element, ConvPass Pass>
cudaError_t launch_pass(const Conv2dParams& c, const WgmmaConvPlan& plan, void* workspace, cudaStream_t stream) {
  const GemmParams p = output_gemm(Pass, c, plan.splits, workspace);
  const int64_t tiles = sm90::PersistentTileScheduler<ConvTile>::tiles(p);
  if (tiles == 0) return cudaSuccess;
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_maps<Pass>(&a_map, &b_map, c); err != cudaSuccess) return err;
  const sm90::WgmmaSchedule schedule = sm90::output_schedule(p, &d_map);
  static PerDeviceFact resident_clusters;  // blocks alone: never asked
  const cudaError_t err = sm90::launch_persistent<Element, ConvTile>(
      &sm90::wgmma_conv_kernel<Element, ConvTile, Pass>, ConvSmem<Pass>::kBytes, tiles, resident_clusters, stream,
      a_map, b_map, d_map, p, schedule, conv_walk(Pass, c, plan.splits));
  if (err != cudaSuccess || Pass != ConvPass::kWgrad || plan.splits == 1) return err;
  // dw = the sum of the splits, in split order (deterministic).
  GemmParams out = p;
  out.batch = 1, out.d = c.out, out.d_type = c.out_type;
  return launch_splitk_reduce(out, static_cast<const float*>(workspace), plan.splits, stream);
}

}  // namespace

bool wgmma_conv_takes(ConvPass pass, const Conv2dParams& p) {
  const bool reads_x = pass != ConvPass::kDgrad, reads_w = pass != ConvPass::kWgrad;
  const bool reads_dy = pass != ConvPass::kFprop;
  const bool channels = pass == ConvPass::kWgrad ? p.c % Config::kBlockK == 0 : p.c % 8 == 0;
  const bool sum = pass == ConvPass::kFprop ? p.c > 0 : pass == ConvPass::kDgrad ? p.k > 0 : p.n * p.p * p.q > 0;
  return p.groups == 1 && p.c > 0 && p.k > 0 && channels && (!reads_dy || p.k % 8 == 0) && sum &&
         (pass != ConvPass::kDgrad || (p.stride_h == 1 && p.stride_w == 1)) &&
         (p.out_type == ElementType::kFloat32 || p.out_type == p.input_type) && (!reads_x || aligned16(p.x)) &&
         (!reads_w || aligned16(p.wt)) && (!reads_dy || aligned16(p.dy)) &&
         im2col_describable(im2col_source(pass, p), p) &&
         std::max({p.n * p.p * p.q, p.n * p.h * p.w, p.k, p.r * p.s * p.c, p.n * p.h * p.w * p.c,
                   p.n * p.p * p.q * p.k, p.k * p.r * p.s * p.c}) <= INT_MAX;
}

WgmmaConvPlan plan_wgmma_conv(ConvPass pass, const Conv2dParams& p) {
  WgmmaConvPlan plan;
  if (pass != ConvPass::kWgrad) return plan;
  // As the WMMA wgrad does: about kSplitBlocksPerSM blocks per multiprocessor, each split at least
  // kMinSlicesPerSplit slices, at most kMaxSplits splits.
  const int64_t tiles = sm90::PersistentTileScheduler<ConvTile>::tiles(output_gemm(pass, p, 1, nullptr));
  const int64_t wanted = ceil_div(kSplitBlocksPerSM * device_limits().multiprocessors, std::max<int64_t>(tiles, 1));
  const int64_t slices = wgrad_slices(p);
  const int64_t splits = std::max<int64_t>(1, std::min({wanted, slices / kMinSlicesPerSplit, kMaxSplits}));
  // As many splits as whole runs of ceil(slices / splits) slices take: none left empty.
  plan.splits = int(ceil_div(slices, ceil_div(slices, splits)));
  if (plan.splits > 1) plan.workspace_bytes = size_t(plan.splits) * size_t(p.k * p.r * p.s * p.c) * sizeof(float);
  return plan;
}

cudaError_t launch_wgmma_conv(ConvPass pass, const Conv2dParams& p, const WgmmaConvPlan& plan, void* workspace,
                              cudaStream_t stream) {
  if (!wgmma_conv_takes(pass, p) || plan.splits < 1 || (pass != ConvPass::kWgrad && plan.splits != 1))
    return cudaErrorInvalidValue;
  if (plan.splits > 1 && (workspace == nullptr || !aligned16(workspace))) return cudaErrorInvalidValue;
  return with_input_element(p.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    switch (pass) {
      case ConvPass::kFprop: return launch_pass<Element, ConvPass::kFprop>(p, plan, workspace, stream);
      case ConvPass::kDgrad: return launch_pass<Element, ConvPass::kDgrad>(p, plan, workspace, stream);
      case ConvPass::kWgrad: return launch_pass<Element, ConvPass::kWgrad>(p, plan, workspace, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mpgemm::kernels
