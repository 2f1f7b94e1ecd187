// Host side of the Hopper convolution: per launch, the im2col tensor map of the
// activations it gathers (x, or dy for dgrad: a bounding box of the first taps
// of every output pixel's window, the convolution's traversal strides), the
// tiled map of its other operand (the filters, or dy for wgrad), the output's
// map as the GEMM's D, and the walk of the implicit GEMM (sm90/params.h's
// ConvWalk). fprop and wgrad are one launch each; wgrad's split partial sums
// are reduced in split order, and where its channels are not whole boxes of 64,
// each tap's are padded in its GEMM and copied back to dw; dgrad with a stride
// is one launch per phase of dx, as the WMMA dgrad runs it (conv/geometry.h),
// each an im2col walk of dy at stride 1 over the taps that reach the phase, its
// rows stored to strided pixels of dx (through shared memory by default, or
// from registers), or, where asked (opt-in), all its phases in one launch,
// their rows staged. Each pass runs on the 128 x 256 tile, or where the narrow
// tiles are on (the default) and its N (fprop's filters, dgrad's channels,
// wgrad's columns) is at most 128, on a narrow one, and wgrad of at most 64
// filters where asked (MPGEMM_M64_TILE=1) on the 64-row tile; the kernels are
// instantiated in sm90/conv_kernels_<tile>.cu and, those that stage dgrad's
// rows, sm90/conv_kernels_staged_rows.cu and (its phases in one launch)
// sm90/conv_kernels_dgrad_phases.cu; dgrad at stride 1 adding a second term
// of dx where asked (Conv2dParams::addend), sm90/conv_kernels_dgrad_addend.cu.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "common/element_traits.cuh"
#include "common/launch_utils.h"
#include "common/math.h"
#include "common/tile_configs.h"
#include "conv/geometry.h"
#include "conv/padded_copy.h"
#include "gemm/splitk_reduce.h"
#include "plan/gemm_plan.h"
#include "plan/operand_layout.h"
#include "plan/split_cost.h"
#include "sm90/conv_kernel.cuh"
#include "sm90/conv_launch.h"
#include "sm90/launch.h"
#include "sm90/layout.h"
#include "sm90/tensor_maps.h"

namespace mpgemm::kernels {
namespace {

using Config = WgmmaBlockConfig;
// The tiles fprop and dgrad may run on: the wide one, and the narrow ones
// (wgmma_n128, wgmma_n64); wgrad also on the 64-row one (wgmma_m64), whose
// kernels only wgrad has.
using ConvTiles = TileList<WgmmaTile, WgmmaN128Tile, WgmmaN64Tile>;
using WgradTiles = TileList<WgmmaTile, WgmmaN128Tile, WgmmaN64Tile, WgmmaM64Tile>;

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

// The pixel grid a launch's im2col boxes walk, over which source, and at
// which taps: fprop and wgrad, x's windows at the output pixels; dgrad, dy's
// windows at the pixels of dx (stride 1) or of one phase of dx, over the
// taps that reach them.
struct Im2colSource {
  const void* base;
  int64_t channels, w, h;  // the source's
  int64_t out_w, out_h;    // the grid's
  int stride_w, stride_h;
  int64_t pad_left, pad_top;
  int taps_w = 0, taps_h = 0;  // along each dimension
  int tap_w = 0, tap_h = 0;    // the distance between taps, in source pixels
};

Im2colSource x_source(const Conv2dParams& p) {
  Im2colSource g{p.x, p.c, p.w, p.h, p.q, p.p, p.stride_w, p.stride_h, p.pad_left, p.pad_top};
  g.taps_w = int(p.s), g.taps_h = int(p.r), g.tap_w = p.dilation_w, g.tap_h = p.dilation_h;
  return g;
}

// dgrad's phase `g` (conv/geometry.h's dgrad_phase_gemm; at stride 1 the one
// phase, all of dx): its pixel (image, a, b) takes dy's (a + origin_h + i *
// tap_h, b + origin_w + j * tap_w) at phase tap (i, j), the taps stepping
// back through dy (tap_h, tap_w <= 0). The walk takes them from the last,
// so that its taps step forward from the window's first pixel, as an
// im2col box's offsets do: at stride 1, padding dilation * (R - 1) - pad.
Im2colSource dy_source(const Conv2dParams& p, const ConvGemm& g) {
  Im2colSource s{p.dy, p.k, p.q, p.p, g.cols, g.rows, 1, 1};
  s.pad_left = -(g.origin_w + (g.taps_s - 1) * g.tap_w), s.pad_top = -(g.origin_h + (g.taps_r - 1) * g.tap_h);
  s.taps_w = g.taps_s, s.taps_h = g.taps_r, s.tap_w = -g.tap_w, s.tap_h = -g.tap_h;
  return s;
}

bool im2col_describable(const Im2colSource& g) {
  const auto within = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  return within(g.stride_h, 1, kMaxTraversalStride) && within(g.stride_w, 1, kMaxTraversalStride) &&
         in_corner_range(corners(g.w, g.out_w, g.stride_w, g.pad_left)) &&
         in_corner_range(corners(g.h, g.out_h, g.stride_h, g.pad_top)) &&
         within(int64_t(g.taps_h - 1) * g.tap_h, 0, kMaxIm2colOffset) &&
         within(int64_t(g.taps_w - 1) * g.tap_w, 0, kMaxIm2colOffset);
}

// dgrad's phases, (phase_h, phase_w) row-major; a phase no tap reaches has K = 0.
template <class Visit>
void for_each_dgrad_phase(const Conv2dParams& p, const Visit& visit) {
  for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
    for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w)
      visit(phase_h, phase_w, dgrad_phase_gemm(p, phase_h, phase_w));
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

// One launch of a pass's kernel: its GEMM (M, N and the output as D), how
// D's rows lie (strided pixels for a phase of dgrad), the walk of its K
// slices and the im2col source of its activations.
struct ConvLaunch {
  GemmParams gemm;
  sm90::PixelRows rows;
  sm90::ConvWalk walk;
  Im2colSource source;
};

// The walk of output pixel rows (fprop and dgrad) over g: every tap, every
// block of 64 of the source's channels at each.
sm90::ConvWalk pixel_walk(const Im2colSource& g) {
  sm90::ConvWalk walk;
  walk.pixels_per_image = int(g.out_h * g.out_w), walk.q = int(g.out_w);
  walk.stride_h = g.stride_h, walk.stride_w = g.stride_w;
  walk.pad_top = int(g.pad_top), walk.pad_left = int(g.pad_left);
  walk.dilation_h = g.tap_h, walk.dilation_w = g.tap_w;
  walk.r = g.taps_h, walk.s = g.taps_w;
  walk.channel_blocks = int(ceil_div(g.channels, int64_t(Config::kBlockK)));
  walk.k_slices = walk.r * walk.s * walk.channel_blocks;
  return walk;
}

// D of `m` x `n` elements at `d`, rows n apart.
GemmParams output_gemm(const Conv2dParams& c, int64_t m, int64_t n, void* d) {
  GemmParams p;
  p.ab_type = c.input_type;
  p.m = m, p.n = n;
  p.d = d, p.d_type = c.out_type;
  p.d_row_stride = n, p.d_batch_stride = m * n;
  return p;
}

// fprop: y = x * w + bias.
ConvLaunch fprop_launch(const Conv2dParams& c) {
  ConvLaunch l;
  l.gemm = output_gemm(c, c.n * c.p * c.q, c.k, c.out);
  l.gemm.bias = c.bias, l.gemm.bias_type = c.bias_type;
  l.source = x_source(c);
  l.walk = pixel_walk(l.source);
  return l;
}

// wgrad's K slices: its output pixels, 64 a slice.
int64_t wgrad_slices(const Conv2dParams& p) { return ceil_div(p.n * p.p * p.q, int64_t(Config::kBlockK)); }

// wgrad's GEMM columns per tap: C rounded up to whole im2col boxes of 64
// channels, each at one tap.
int64_t wgrad_tap_columns(const Conv2dParams& p) { return round_up(p.c, int64_t(Config::kBlockK)); }

// wgrad's workspace: first its splits' fp32 partial sums (none without a
// split), then, where C is not a whole number of boxes, dw in the GEMM's
// columns (each tap's channels padded), which a copy takes back to dw.
size_t wgrad_partials_bytes(const Conv2dParams& p, int splits) {
  if (splits == 1) return 0;
  return size_t(round_up(int64_t(splits) * p.k * p.r * p.s * wgrad_tap_columns(p) * int64_t(sizeof(float)), 16));
}
size_t wgrad_padded_bytes(const Conv2dParams& p) {
  if (wgrad_tap_columns(p) == p.c) return 0;
  return size_t(p.k * p.r * p.s * wgrad_tap_columns(p) * element_bytes(p.out_type));
}

// Where wgrad's sum lands: dw, or its padded copy in the workspace.
void* wgrad_sum(const Conv2dParams& c, int splits, void* workspace) {
  if (wgrad_padded_bytes(c) == 0) return c.out;
  return workspace == nullptr ? nullptr : static_cast<char*>(workspace) + wgrad_partials_bytes(c, splits);
}

// wgrad: its sum (wgrad_sum), or its `splits` partial sums in fp32 at the
// start of `workspace`.
ConvLaunch wgrad_launch(const Conv2dParams& c, int splits, void* workspace) {
  ConvLaunch l;
  l.gemm = output_gemm(c, c.k, c.r * c.s * wgrad_tap_columns(c), wgrad_sum(c, splits, workspace));
  l.gemm.batch = splits;
  if (splits > 1) l.gemm.d = workspace, l.gemm.d_type = ElementType::kFloat32;
  l.source = x_source(c);
  l.walk = pixel_walk(l.source);
  l.walk.channels = int(wgrad_tap_columns(c));
  l.walk.k_slices = int(ceil_div(wgrad_slices(c), splits));
  return l;
}

// dgrad's phase (phase_h, phase_w), `g`: its pixels of dx, rows * cols an
// image, stride_h rows and stride_w columns apart (at stride 1, all of dx,
// dense), over the taps that reach them, the filters flipped.
ConvLaunch dgrad_launch(const Conv2dParams& c, int phase_h, int phase_w, const ConvGemm& g) {
  ConvLaunch l;
  const int64_t first_pixel = phase_h * c.w + phase_w;
  void* d = static_cast<char*>(c.out) + first_pixel * c.c * element_bytes(c.out_type);
  l.gemm = output_gemm(c, c.n * g.rows * g.cols, c.c, d);
  if (g.rows != c.h || g.cols != c.w)
    l.rows = {g.cols, g.rows * g.cols, c.h * c.w * c.c, c.stride_h * c.w * c.c, c.stride_w * c.c};
  l.source = dy_source(c, g);
  l.walk = pixel_walk(l.source);
  // Walk tap (i, j) is phase tap (taps_r - 1 - i, taps_s - 1 - j).
  const int last_r = g.filter_r0 + (g.taps_r - 1) * g.filter_dr, last_s = g.filter_s0 + (g.taps_s - 1) * g.filter_ds;
  l.walk.filter_tap_last = last_r * int(c.s) + last_s;
  l.walk.filter_row_step = g.filter_dr * int(c.s), l.walk.filter_col_step = g.filter_ds;
  return l;
}

// The filters' map for fprop's and dgrad's boxes on Tile.
template <class Tile, ConvPass Pass>
cudaError_t filter_map(CUtensorMap* map, const Conv2dParams& p) {
  using BTile = typename sm90::ConvSmem<Tile, Pass>::BTile;
  return tiled_map(map, p.input_type, p.wt, p.c, p.r * p.s, p.k, 1, BTile::kBoxRows);
}

// wgrad's dy, its A: (K, N * P * Q, 1) in boxes of 64 filters by 64 pixels.
cudaError_t wgrad_dy_map(CUtensorMap* map, const Conv2dParams& p) {
  return tiled_map(map, p.input_type, p.dy, p.k, p.n * p.p * p.q, 1, Config::kBlockK, 1);
}

// The maps of a launch's two operands, for Tile's boxes.
template <class Tile, ConvPass Pass>
cudaError_t operand_maps(CUtensorMap* a_map, CUtensorMap* b_map, const Conv2dParams& p, const Im2colSource& g) {
  if constexpr (Pass == ConvPass::kWgrad) {
    if (const cudaError_t err = wgrad_dy_map(a_map, p); err != cudaSuccess) return err;
    return im2col_map(b_map, p, g, Config::kBlockK);
  } else {
    if (const cudaError_t err = im2col_map(a_map, p, g, Tile::kBlockM); err != cudaSuccess) return err;
    return filter_map<Tile, Pass>(b_map, p);
  }
}

// Whether the epilogue may store a launch's strided rows through shared
// memory (sm90/epilogue.cuh's store_tile_through_strips): D's base, its
// pixels' pitches and its row of columns whole 16-byte chunks.
bool rows_stageable(const ConvLaunch& l) {
  const int64_t bytes = element_bytes(l.gemm.d_type);
  const auto whole_chunks = [&](int64_t elements) { return elements * bytes % 16 == 0; };
  return l.rows.cols != 0 && aligned16(l.gemm.d) && whole_chunks(l.rows.image_pitch) &&
         whole_chunks(l.rows.row_pitch) && whole_chunks(l.rows.col_pitch) && whole_chunks(l.gemm.n);
}

// One launch; a phase of dgrad's on the kernel that stages its rows where
// the plan asks (WgmmaConvPlan::staged_rows) and rows_stageable allows.
// fprop with Conv2dParams::moments on the kernel that writes them, which
// stores through the copy engine; dgrad at stride 1 with
// Conv2dParams::addend on the kernel that adds it.
template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_one(const Conv2dParams& c, const ConvLaunch& l, cudaStream_t stream, bool staged_rows = false) {
  if (sm90::PersistentTileScheduler<Tile>::tiles(l.gemm) == 0) return cudaSuccess;
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_maps<Tile, Pass>(&a_map, &b_map, c, l.source); err != cudaSuccess) return err;
  const sm90::WgmmaSchedule schedule = sm90::output_schedule(l.gemm, &d_map, l.rows);
  using sm90::ConvKernel;
  if constexpr (Pass == ConvPass::kFprop) {
    if (c.moments != nullptr) {
      if (!schedule.d_copy) return cudaErrorInvalidValue;
      GemmParams gemm = l.gemm;
      gemm.column_moments = c.moments;
      return sm90::launch_wgmma_conv_kernel<Element, Tile, Pass, ConvKernel::kMoments>(a_map, b_map, d_map, gemm,
                                                                                       schedule, l.walk, stream);
    }
  }
  if constexpr (Pass == ConvPass::kDgrad) {
    if (c.addend != nullptr) {
      if (l.rows.cols != 0) return cudaErrorInvalidValue;  // strided rows: wgmma_dgrad_takes_addend says no
      GemmParams gemm = l.gemm;
      gemm.addend = c.addend;
      return sm90::launch_wgmma_conv_kernel<Element, Tile, Pass, ConvKernel::kAddend>(a_map, b_map, d_map, gemm,
                                                                                      schedule, l.walk, stream);
    }
    if (staged_rows && rows_stageable(l))
      return sm90::launch_wgmma_conv_kernel<Element, Tile, Pass, ConvKernel::kStagedRows>(a_map, b_map, d_map, l.gemm,
                                                                                          schedule, l.walk, stream);
  }
  return sm90::launch_wgmma_conv_kernel<Element, Tile, Pass>(a_map, b_map, d_map, l.gemm, schedule, l.walk, stream);
}

// A strided dgrad's launches of its phases, in the order one launch runs
// them: the most K slices first, so that the persistent grid's last tiles
// are the shortest.
struct DgradPhaseLaunches {
  ConvLaunch launch[sm90::kMaxDgradPhases];
  int count = 0;
};

// dgrad's phases as one launch runs them; none (count 0) where one launch
// cannot: fewer than 2 phases or more than it holds, or a phase whose rows
// it cannot stage; or need not: no pixel of dx (an empty batch), or no phase
// a tap reaches (dx all zeros, which a memset writes faster).
DgradPhaseLaunches dgrad_phases_in_one_launch(const Conv2dParams& c) {
  DgradPhaseLaunches phases;
  const int count = dgrad_phases_h(c) * dgrad_phases_w(c);
  if (count < 2 || count > sm90::kMaxDgradPhases || c.n == 0) return phases;
  for_each_dgrad_phase(c, [&](int phase_h, int phase_w, const ConvGemm& g) {
    phases.launch[phases.count++] = dgrad_launch(c, phase_h, phase_w, g);
  });
  ConvLaunch* const end = phases.launch + phases.count;
  const auto reached = [](const ConvLaunch& l) { return l.walk.k_slices > 0; };
  if (!std::all_of(phases.launch, end, rows_stageable) || std::none_of(phases.launch, end, reached)) return {};
  std::stable_sort(phases.launch, end,
                   [](const ConvLaunch& a, const ConvLaunch& b) { return a.walk.k_slices > b.walk.k_slices; });
  return phases;
}

// A strided dgrad's phases in one launch (sm90/conv_kernel.cuh's
// wgmma_dgrad_phases_kernel): each phase's GEMM, rows, walk and map of dy
// (none where no tap reaches it), its tiles after the phases' before it.
template <class Element, class Tile>
cudaError_t launch_dgrad_phases(const Conv2dParams& c, const DgradPhaseLaunches& launches, cudaStream_t stream) {
  sm90::DgradPhases phases;
  CUtensorMap w_map, unused_map{};
  if (const cudaError_t err = filter_map<Tile, ConvPass::kDgrad>(&w_map, c); err != cudaSuccess) return err;
  phases.count = launches.count;
  for (int i = 0; i < phases.count; ++i) {
    const ConvLaunch& l = launches.launch[i];
    phases.gemm[i] = l.gemm;
    phases.schedule[i] = sm90::output_schedule(l.gemm, &unused_map, l.rows);
    phases.walk[i] = l.walk;
    phases.dy_maps[i] = CUtensorMap{};
    if (l.walk.k_slices > 0)
      if (const cudaError_t err = im2col_map(&phases.dy_maps[i], c, l.source, Tile::kBlockM); err != cudaSuccess)
        return err;
    phases.first_tile[i + 1] = phases.first_tile[i] + sm90::PersistentTileScheduler<Tile>::tiles(l.gemm);
  }
  return sm90::launch_wgmma_dgrad_phases_kernel<Element, Tile>(w_map, phases, stream);
}

// dgrad: its phases in one launch where the plan asks
// (WgmmaConvPlan::one_launch_dgrad) and dgrad_phases_in_one_launch allows;
// else one launch per phase that a tap reaches, dx zeroed first where some
// phase none reaches (a 1x1 at stride 2: three of four).
template <class Element, class Tile>
cudaError_t launch_dgrad(const Conv2dParams& c, const WgmmaConvPlan& plan, cudaStream_t stream) {
  if (plan.one_launch_dgrad)
    if (const DgradPhaseLaunches launches = dgrad_phases_in_one_launch(c); launches.count > 0)
      return launch_dgrad_phases<Element, Tile>(c, launches, stream);
  bool unreached = false;
  for_each_dgrad_phase(c, [&](int, int, const ConvGemm& g) { unreached |= g.k == 0; });
  if (unreached)
    if (const cudaError_t err =
            cudaMemsetAsync(c.out, 0, size_t(c.n * c.h * c.w * c.c) * size_t(element_bytes(c.out_type)), stream);
        err != cudaSuccess)
      return err;
  cudaError_t err = cudaSuccess;
  for_each_dgrad_phase(c, [&](int phase_h, int phase_w, const ConvGemm& g) {
    if (err == cudaSuccess && g.k > 0)
      err = launch_one<Element, Tile, ConvPass::kDgrad>(c, dgrad_launch(c, phase_h, phase_w, g), stream,
                                                        plan.staged_rows);
  });
  return err;
}

// After wgrad's launch `l`: its splits summed in split order (deterministic),
// and where its taps' columns are padded, dw copied out of them.
cudaError_t finish_wgrad(const Conv2dParams& c, const ConvLaunch& l, const WgmmaConvPlan& plan, void* workspace,
                         cudaStream_t stream) {
  void* sum = wgrad_sum(c, plan.splits, workspace);
  if (plan.splits > 1) {
    GemmParams out = l.gemm;
    out.batch = 1, out.d = sum, out.d_type = c.out_type;
    if (const cudaError_t err = launch_splitk_reduce(out, static_cast<const float*>(workspace), plan.splits, stream);
        err != cudaSuccess)
      return err;
  }
  if (sum == c.out) return cudaSuccess;
  // dw = each tap's first C columns.
  const int64_t taps = c.r * c.s;
  return launch_padded_copy(copy_between(sum, {1, c.k, taps, wgrad_tap_columns(c)}, c.out, {1, c.k, taps, c.c},
                                         element_bytes(c.out_type)),
                            stream);
}

// How the gathering producer reads `original`'s x as its fold (sm90/params.h).
sm90::FoldedX folded_x(const Conv2dParams& p) {
  sm90::FoldedX f;
  f.x = p.x;
  f.h = int(p.h), f.w = int(p.w), f.c = int(p.c), f.s = int(p.s);
  f.stride_h = p.stride_h, f.stride_w = p.stride_w, f.pad_top = int(p.pad_top), f.pad_left = int(p.pad_left);
  f.folded_channels = int(p.stride_h * p.s * p.c);
  return f;
}

template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_pass(const Conv2dParams& c, const WgmmaConvPlan& plan, void* workspace, cudaStream_t stream) {
  if constexpr (Pass == ConvPass::kFprop) {
    return launch_one<Element, Tile, Pass>(c, fprop_launch(c), stream);
  } else if constexpr (Pass == ConvPass::kDgrad) {
    return launch_dgrad<Element, Tile>(c, plan, stream);
  } else {
    const ConvLaunch l = wgrad_launch(c, plan.splits, workspace);
    if (const cudaError_t err = launch_one<Element, Tile, Pass>(c, l, stream); err != cudaSuccess) return err;
    return finish_wgrad(c, l, plan, workspace, stream);
  }
}

// fprop or wgrad of the folded problem `c` (conv/folded_taps.h) whose x the
// producer gathers from `original`'s (sm90/conv_kernel.cuh's
// wgmma_gathered_fold_kernel), wgrad finished as launch_pass finishes it.
template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_gathered_pass(const Conv2dParams& original, const Conv2dParams& c, const WgmmaConvPlan& plan,
                                 void* workspace, cudaStream_t stream) {
  static_assert(Pass != ConvPass::kDgrad, "dgrad does not fold");
  const ConvLaunch l = Pass == ConvPass::kFprop ? fprop_launch(c) : wgrad_launch(c, plan.splits, workspace);
  if (sm90::PersistentTileScheduler<Tile>::tiles(l.gemm) > 0) {
    CUtensorMap copied, d_map{};
    const cudaError_t mapped =
        Pass == ConvPass::kFprop ? filter_map<Tile, Pass>(&copied, c) : wgrad_dy_map(&copied, c);
    if (mapped != cudaSuccess) return mapped;
    const sm90::WgmmaSchedule schedule = sm90::output_schedule(l.gemm, &d_map, l.rows);
    if (const cudaError_t err = sm90::launch_wgmma_gathered_fold_kernel<Element, Tile, Pass>(
            copied, d_map, l.gemm, schedule, l.walk, folded_x(original), int(c.n * c.p * c.q), stream);
        err != cudaSuccess)
      return err;
  }
  if constexpr (Pass == ConvPass::kWgrad) return finish_wgrad(c, l, plan, workspace, stream);
  return cudaSuccess;
}

// Whether the im2col maps can describe every launch of the pass.
bool im2col_describable(ConvPass pass, const Conv2dParams& p) {
  if (pass != ConvPass::kDgrad) return im2col_describable(x_source(p));
  bool describable = true;
  for_each_dgrad_phase(p, [&](int, int, const ConvGemm& g) {
    describable &= g.k == 0 || im2col_describable(dy_source(p, g));
  });
  return describable;
}

}  // namespace

bool wgmma_conv_writes_moments(const Conv2dParams& p) {
  return tma_describable(p.out, element_bytes(p.out_type), 1, 0, p.k, p.k, p.n * p.p * p.q);
}

bool wgmma_dgrad_takes_addend(const Conv2dParams& p) {
  return p.stride_h == 1 && p.stride_w == 1 && p.out_type == p.input_type && aligned16(p.addend);
}

bool wgmma_conv_takes(ConvPass pass, const Conv2dParams& p) {
  const bool reads_x = pass != ConvPass::kDgrad, reads_w = pass != ConvPass::kWgrad;
  const bool reads_dy = pass != ConvPass::kFprop;
  const bool sum = pass == ConvPass::kFprop ? p.c > 0 : pass == ConvPass::kDgrad ? p.k > 0 : p.n * p.p * p.q > 0;
  return p.groups == 1 && p.c > 0 && p.k > 0 && p.c % 8 == 0 && (!reads_dy || p.k % 8 == 0) && sum &&
         (p.out_type == ElementType::kFloat32 || p.out_type == p.input_type) && (!reads_x || aligned16(p.x)) &&
         (!reads_w || aligned16(p.wt)) && (!reads_dy || aligned16(p.dy)) &&
         im2col_describable(pass, p) &&
         std::max({p.n * p.p * p.q, p.n * p.h * p.w, p.k, p.r * p.s * wgrad_tap_columns(p), p.n * p.h * p.w * p.c,
                   p.n * p.p * p.q * p.k, p.k * p.r * p.s * wgrad_tap_columns(p)}) <= INT_MAX;
}

WgmmaConvPlan plan_wgmma_conv(ConvPass pass, const Conv2dParams& p, bool staged_rows, bool one_launch_dgrad,
                              bool m64_tile) {
  WgmmaConvPlan plan;
  plan.staged_rows = staged_rows && pass == ConvPass::kDgrad;
  plan.one_launch_dgrad = plan.staged_rows && one_launch_dgrad;
  const int multiprocessors = device_limits().multiprocessors;
  // The pass's GEMM: M x N (dgrad: over all of dx's pixels, whatever its phases).
  const int64_t m = pass == ConvPass::kFprop ? p.n * p.p * p.q : pass == ConvPass::kDgrad ? p.n * p.h * p.w : p.k;
  const int64_t n = pass == ConvPass::kFprop ? p.k : pass == ConvPass::kDgrad ? p.c : p.r * p.s * wgrad_tap_columns(p);
  // wgrad's split fills the device however few its tiles: the narrow tile
  // that fits N, not the one with more tiles.
  const TileConfigInfo& n128 = tile_config(TileConfigId::kWgmmaN128);
  const int64_t tiles_n128 = pass == ConvPass::kWgrad
                                 ? multiprocessors
                                 : ceil_div(m, int64_t(n128.block_m)) * ceil_div(n, int64_t(n128.block_n));
  const TileConfigId narrow = narrow_wgmma_tile(n, tiles_n128, multiprocessors);
  if (narrow != TileConfigId::kCount) plan.tile = narrow;
  if (pass != ConvPass::kWgrad) return plan;
  // At most 64 filters over more than 128 columns: 64-row tiles, none of
  // whose rows are zeros (narrower outputs keep the narrow tiles, whose
  // 128 x 64 and 128 x 128 waste no more than a 64 x 256 tile's columns
  // would).
  const TileConfigInfo& m64 = tile_config(TileConfigId::kWgmmaM64);
  if (m64_tile && m <= m64.block_m && n > tile_config(TileConfigId::kWgmmaN128).block_n)
    plan.tile = TileConfigId::kWgmmaM64;
  // As the WMMA wgrad does: the split plan/split_cost.h's model says is fastest.
  const GemmParams gemm = wgrad_launch(p, 1, nullptr).gemm;
  SplitProblem split;
  split.tile = tile_config(plan.tile);
  split.tiles = with_tile(
      WgradTiles{}, plan.tile, [&](auto tile) { return sm90::PersistentTileScheduler<decltype(tile)>::tiles(gemm); },
      int64_t(1));
  split.slices = wgrad_slices(p);
  split.multiprocessors = multiprocessors;
  split.output_elements = gemm.m * gemm.n;
  plan.splits = cheapest_split(split);
  plan.workspace_bytes = wgrad_partials_bytes(p, plan.splits) + wgrad_padded_bytes(p);
  return plan;
}

bool wgmma_gathers_fold(ConvPass pass, const Conv2dParams& original, const Conv2dParams& folded) {
  return pass != ConvPass::kDgrad && wgmma_conv_takes(pass, folded) &&
         original.groups == 1 && original.dilation_h == 1 && original.dilation_w == 1 &&
         original.stride_h * original.s * original.c <= Config::kBlockK &&
         original.n * original.h * original.w * original.c <= INT_MAX / 2;
}

cudaError_t launch_wgmma_gathered_fold(ConvPass pass, const Conv2dParams& original, const Conv2dParams& folded,
                                       const WgmmaConvPlan& plan, void* workspace, cudaStream_t stream) {
  if (!wgmma_gathers_fold(pass, original, folded) || plan.splits < 1 ||
      (pass != ConvPass::kWgrad && plan.splits != 1) || folded.moments != nullptr)
    return cudaErrorInvalidValue;
  if (plan.workspace_bytes > 0 && (workspace == nullptr || !aligned16(workspace))) return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return with_input_element(folded.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    return with_tile(
        WgradTiles{}, plan.tile,
        [&](auto tile) {
          using Tile = decltype(tile);
          if (pass == ConvPass::kWgrad)
            return launch_gathered_pass<Element, Tile, ConvPass::kWgrad>(original, folded, plan, workspace, stream);
          if constexpr (std::is_same_v<Tile, WgmmaM64Tile>) return cudaErrorInvalidValue;  // wgrad's alone
          else return launch_gathered_pass<Element, Tile, ConvPass::kFprop>(original, folded, plan, workspace, stream);
        },
        cudaErrorInvalidValue);
  });
}

cudaError_t launch_wgmma_conv(ConvPass pass, const Conv2dParams& p, const WgmmaConvPlan& plan, void* workspace,
                              cudaStream_t stream) {
  if (!wgmma_conv_takes(pass, p) || plan.splits < 1 || (pass != ConvPass::kWgrad && plan.splits != 1))
    return cudaErrorInvalidValue;
  if (p.moments != nullptr && (pass != ConvPass::kFprop || !wgmma_conv_writes_moments(p))) return cudaErrorInvalidValue;
  if (p.addend != nullptr && (pass != ConvPass::kDgrad || !wgmma_dgrad_takes_addend(p))) return cudaErrorInvalidValue;
  if (plan.workspace_bytes > 0 && (workspace == nullptr || !aligned16(workspace))) return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return with_input_element(p.input_type, [&](auto element) {
    using Element = typename decltype(element)::type;
    const auto on_plan_tile = [&](auto tiles, auto pass_tag) {
      return with_tile(
          tiles, plan.tile,
          [&](auto tile) {
            return launch_pass<Element, decltype(tile), decltype(pass_tag)::value>(p, plan, workspace, stream);
          },
          cudaErrorInvalidValue);
    };
    using Pass = ConvPass;
    switch (pass) {
      case Pass::kFprop: return on_plan_tile(ConvTiles{}, std::integral_constant<Pass, Pass::kFprop>{});
      case Pass::kDgrad: return on_plan_tile(ConvTiles{}, std::integral_constant<Pass, Pass::kDgrad>{});
      case Pass::kWgrad: return on_plan_tile(WgradTiles{}, std::integral_constant<Pass, Pass::kWgrad>{});
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mpgemm::kernels
