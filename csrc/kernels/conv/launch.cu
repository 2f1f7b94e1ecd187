// Host-side dispatch of the convolution kernels: picks the element type, the
// load width, the tile configuration per pass and wgrad's split of K, works
// out each launch's ConvGemm, then launches (dgrad once per phase; a split
// wgrad, then the reduction). One channel per group (depthwise, with up to
// kDepthwiseMaxFiltersPerGroup filters each) runs on the direct kernels of
// conv/depthwise.cu instead. Other channel counts per group that no 8- or
// 16-byte chunk divides (3-channel first layers), and misaligned operands,
// run on a copy of the problem whose channels are padded with zeros to
// whole chunks, in the workspace. Where MPGEMM_CONV_PATH=wgmma asks, the
// Hopper convolution (sm90/conv_launch.h) takes the passes it can (on sm_90
// by default where it measured faster), and fprop and wgrad of few input
// channels through copies with their taps folded into the channels
// (conv/folded_taps.h); where =gemm asks, a 1x1 at stride 1 without padding
// runs as a GEMM (gemm/launch.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/launch_utils.h"
#include "common/math.h"
#include "common/tile_configs.h"
#include "conv/depthwise.h"
#include "conv/folded_taps.h"
#include "conv/implicit_gemm.cuh"
#include "conv/launch.h"
#include "conv/padded_copy.h"
#include "gemm/splitk_reduce.h"
#include "plan/split_cost.h"
#include "plan/switches.h"
#include "sm90/launch.h"

namespace mpgemm::kernels {
namespace {

// The padded copy rounds channels per group up to whole 8-byte chunks (4
// channels: a 3-channel first layer does 4/3 of its products, not 8/3), and
// from this many channels on to 16-byte ones (at most 1/8 more products, and
// the large tile).
constexpr int64_t kPadToSixteenBytesFrom = 64;

// Elements per chunk of the gathers: 8 (16 bytes) or 4 (8 bytes), the widest
// that divides the channels per group on both sides and to whose size the
// base of every operand the pass reads is aligned; 0 if neither does (the
// padded copy's case).
int conv_vector_width(ConvPass pass, const Conv2dParams& p) {
  const int64_t cg = p.c / p.groups, kg = p.k / p.groups;
  for (int vector : {8, 4})
    if (cg % vector == 0 && kg % vector == 0 && (pass == ConvPass::kDgrad || aligned_to(p.x, 2 * vector)) &&
        (pass == ConvPass::kWgrad || aligned_to(p.wt, 2 * vector)) &&
        (pass == ConvPass::kFprop || aligned_to(p.dy, 2 * vector)))
      return vector;
  return 0;
}

// The pass's GEMM for slices of block_k; dgrad's first phase (its largest).
ConvGemm pass_gemm(ConvPass pass, const Conv2dParams& p, int block_k) {
  switch (pass) {
    case ConvPass::kFprop: return fprop_gemm(p, block_k);
    case ConvPass::kDgrad: return dgrad_phase_gemm(p, 0, 0);
    default: return wgrad_gemm(p, block_k);
  }
}

// For a problem conv_vector_width takes: the tile, the largest whose tiles
// fill the device, as for a GEMM of the pass's M x N (times the groups), or
// with `n16` (n16_tile()) the 128 x 16 one where N is at most 16 a group
// (the wider tiles' columns past N multiply zeros, however many tiles there
// are); for wgrad the largest that runs here, and the split of GEMM-K:
// wgrad's M x N is the filters and its K every output pixel, so its tiles
// alone leave most multiprocessors idle (one tile for a 64-to-64 1x1
// convolution); splitting K gives each multiprocessor blocks.
ConvTilePlan plan_tiles(ConvPass pass, const Conv2dParams& p, bool n16) {
  const DeviceLimits device = device_limits();
  const ConvGemm g = pass_gemm(pass, p, 1);
  // Blocks of one split over every group.
  const auto blocks = [&](TileConfigId id) {
    const TileConfigInfo& tile = tile_config(id);
    return ceil_div(g.m, tile.block_m) * ceil_div(g.n, tile.block_n) * p.groups;
  };
  const auto fills = [&](TileConfigId id) { return blocks(id) >= device.multiprocessors; };
  ConvTilePlan plan;
  plan.vector = conv_vector_width(pass, p);
  const bool square_fits = wmma_tile_runs(tile_config(TileConfigId::kSquare), device, plan.vector);
  if (pass != ConvPass::kWgrad) {
    const TileConfigInfo& n16_config = tile_config(TileConfigId::kN16);
    const bool on_n16 = n16 && g.n <= n16_config.block_n && wmma_tile_runs(n16_config, device, plan.vector);
    plan.tile = on_n16                                        ? TileConfigId::kN16
                : square_fits && fills(TileConfigId::kSquare) ? TileConfigId::kSquare
                : fills(TileConfigId::kCompact)               ? TileConfigId::kCompact
                                                              : TileConfigId::kSmall;
    return plan;
  }
  // wgrad splits K as plan/split_cost.h's model says is fastest, on the
  // largest tile that runs here.
  plan.tile = square_fits ? TileConfigId::kSquare : TileConfigId::kCompact;
  SplitProblem split;
  split.tile = tile_config(plan.tile);
  split.tiles = blocks(plan.tile);
  split.slices = ceil_div(g.k, split.tile.block_k);
  split.multiprocessors = device.multiprocessors;
  split.output_elements = g.m * g.n * p.groups;
  plan.split_k = cheapest_split(split);
  return plan;
}

// wgrad's partial sums: split_k copies of dw in fp32.
size_t partials_bytes(const Conv2dParams& p, const ConvTilePlan& plan) {
  if (plan.split_k == 1) return 0;
  return size_t(plan.split_k) * size_t(p.k) * size_t(p.r * p.s * (p.c / p.groups)) * sizeof(float);
}

template <class Element, class Tile, ConvPass Pass, int Vector, bool WithMoments = false>
cudaError_t launch(const Conv2dParams& p, const ConvGemm& g, const GemmGrid& work, cudaStream_t stream) {
  using Traits = ConvPassTraits<Pass>;
  constexpr int kSmemBytes = WmmaSmem<Element, Tile, Traits::kAKMajor, Traits::kBKMajor>::kBytes;
  auto* kernel = [] {
    if constexpr (WithMoments) return &conv2d_fprop_moments_kernel<Element, Tile, Vector>;
    else return &conv2d_kernel<Element, Tile, Pass, Vector>;
  }();
  if (const cudaError_t err = check_tile_arch<Tile>(kernel); err != cudaSuccess) return err;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t blocks = TileScheduler<Tile>::tiles(g.m, g.n) * work.split_k;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.groups < kMaxGridY ? p.groups : kMaxGridY));
  Conv2dParams params = p;
  ConvGemm gemm = g;
  GemmGrid grid_args = work;
  void* args[] = {&params, &gemm, &grid_args};
  return cudaLaunchKernel(kernel, grid, dim3(Tile::kThreads), args, kSmemBytes, stream);
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

// One pass on Tile's tiles: fprop and wgrad (then its reduction) are one
// GEMM; dgrad is one per phase, each writing its own pixels of dx.
template <class Element, class Tile, ConvPass Pass, int Vector>
cudaError_t launch_pass(const Conv2dParams& p, const GemmGrid& work, cudaStream_t stream) {
  if constexpr (Pass == ConvPass::kDgrad) {
    for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
      for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w)
        if (const cudaError_t err =
                launch<Element, Tile, Pass, Vector>(p, dgrad_phase_gemm(p, phase_h, phase_w), work, stream);
            err != cudaSuccess)
          return err;
    return cudaSuccess;
  } else {
    const ConvGemm g = Pass == ConvPass::kFprop ? fprop_gemm(p, Tile::kBlockK) : wgrad_gemm(p, Tile::kBlockK);
    // An empty GEMM-K still launches: its output is zeros (wgrad of an empty batch).
    if (g.m == 0 || g.n == 0) return cudaSuccess;
    // fprop's moments: on 16-byte chunks only (plan_conv2d's moment_rows).
    if constexpr (Pass == ConvPass::kFprop && Vector == 8)
      if (p.moments != nullptr) return launch<Element, Tile, Pass, Vector, true>(p, g, work, stream);
    if (p.moments != nullptr) return cudaErrorInvalidValue;
    const cudaError_t err = launch<Element, Tile, Pass, Vector>(p, g, work, stream);
    if (err != cudaSuccess || work.split_k == 1) return err;
    return launch_wgrad_reduce(p, work, stream);
  }
}

// Tile's kernels at the plan's load width: 16- or 8-byte chunks, those Tile takes.
template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_width(const Conv2dParams& p, const ConvTilePlan& plan, const GemmGrid& work, cudaStream_t stream) {
  if (plan.vector == 8) return launch_pass<Element, Tile, Pass, 8>(p, work, stream);
  if constexpr (Tile::kNarrowestLoad <= 4) return launch_pass<Element, Tile, Pass, 4>(p, work, stream);
  return cudaErrorInvalidValue;
}

// The tiles each pass runs on (plan_tiles): fprop and dgrad also on the 128
// x 16 one where asked; wgrad on the largest that runs here.
using ConvTiles = TileList<SquareTile, CompactTile, SmallTile, N16Tile>;
using WgradTiles = TileList<SquareTile, CompactTile>;

template <class Element, ConvPass Pass>
cudaError_t launch_tile(const Conv2dParams& p, const ConvTilePlan& plan, const GemmGrid& work, cudaStream_t stream) {
  using Tiles = std::conditional_t<Pass == ConvPass::kWgrad, WgradTiles, ConvTiles>;
  return with_tile(
      Tiles{}, plan.tile,
      [&](auto tile) { return launch_width<Element, decltype(tile), Pass>(p, plan, work, stream); },
      cudaErrorInvalidValue);
}

// The gathers index x, dy and the filters in 32 bits.
bool indexes_in_32_bits(const Conv2dParams& p) {
  return std::max({p.n * p.h * p.w * p.c, p.n * p.p * p.q * p.k, p.k * p.r * p.s * (p.c / p.groups)}) <= INT_MAX;
}

// A problem conv_vector_width takes, on plan_tiles's `plan`, with `workspace`
// for its partials.
cudaError_t launch_in_place(ConvPass pass, const Conv2dParams& p, const ConvTilePlan& plan, void* workspace,
                            cudaStream_t stream) {
  if (!indexes_in_32_bits(p)) return cudaErrorInvalidValue;
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

// A problem on whole chunks: `padded` reads the copies below, and writes its
// output into the workspace where that needs padding too; `copies_in` make
// the operands (and fprop's bias) from the caller's, zero in the added
// channels; `copy_out` takes the caller's channels of the padded output back
// to p.out. An operand whose channels need no padding is read in place if
// its base is 16-byte aligned, and an output whose channels need none is
// written in place. Built with a null workspace, the copies' pointers are
// null but the sizes, and so the padded problem's tiles, are the same.
struct PaddedConv {
  Conv2dParams padded;
  ConvTilePlan tiles;  // the padded problem's
  PaddedCopy copies_in[4];
  int copy_count = 0;
  bool copies_out = false;
  PaddedCopy copy_out;
  void* inner_workspace = nullptr;  // the padded problem's own (wgrad's partials)
  size_t bytes = 0;                 // all of the workspace
};

// `tiles`: the padded problem's plan where already known (the launch), or
// null to work it out (the plan: plan_tiles, with `n16`). The padding does
// not depend on either, so plan and launch pad alike.
PaddedConv pad_channels(ConvPass pass, const Conv2dParams& p, const ConvTilePlan* tiles, bool n16,
                        void* workspace) {
  const int64_t g = p.groups, cg = p.c / g, kg = p.k / g, taps = p.r * p.s;
  const auto padded_channels = [](int64_t channels) {
    return round_up(channels, channels >= kPadToSixteenBytesFrom ? 8 : 4);
  };
  const int64_t cgp = padded_channels(cg), kgp = padded_channels(kg);
  const int64_t x_pixels = p.n * p.h * p.w, y_pixels = p.n * p.p * p.q;
  PaddedConv conv;
  conv.padded = p;
  conv.padded.c = g * cgp, conv.padded.k = g * kgp;
  // The next 16-byte aligned region of the workspace, for a tensor of `dims`.
  const auto take = [&](const int64_t (&dims)[4], int bytes) -> void* {
    void* at = workspace == nullptr ? nullptr : static_cast<char*>(workspace) + conv.bytes;
    conv.bytes += size_t(round_up(dims[0] * dims[1] * dims[2] * dims[3] * bytes, 16));
    return at;
  };
  const auto same = [](const int64_t (&from)[4], const int64_t (&to)[4]) { return std::equal(from, from + 4, to); };
  const auto pad = [&](const void*& operand, int bytes, const int64_t (&from)[4], const int64_t (&to)[4]) {
    if (same(from, to) && aligned16(operand)) return;
    void* copy = take(to, bytes);
    conv.copies_in[conv.copy_count++] = copy_between(operand, from, copy, to, bytes);
    operand = copy;
  };
  // x and dy as (pixels, groups, 1, channels per group), the filters as
  // (groups, filters per group, taps, channels per group), the bias as (1, groups, 1, filters per group).
  if (pass != ConvPass::kDgrad) pad(conv.padded.x, 2, {x_pixels, g, 1, cg}, {x_pixels, g, 1, cgp});
  if (pass != ConvPass::kWgrad) pad(conv.padded.wt, 2, {g, kg, taps, cg}, {g, kgp, taps, cgp});
  if (pass != ConvPass::kFprop) pad(conv.padded.dy, 2, {y_pixels, g, 1, kg}, {y_pixels, g, 1, kgp});
  if (pass == ConvPass::kFprop && p.bias != nullptr)
    pad(conv.padded.bias, element_bytes(p.bias_type), {1, g, 1, kg}, {1, g, 1, kgp});

  const int out_bytes = element_bytes(p.out_type);
  const auto take_back = [&](const int64_t (&padded)[4], const int64_t (&out)[4]) {
    if (same(padded, out)) return;
    conv.copies_out = true;
    conv.padded.out = take(padded, out_bytes);
    conv.copy_out = copy_between(conv.padded.out, padded, p.out, out, out_bytes);
  };
  if (pass == ConvPass::kFprop) take_back({y_pixels, g, 1, kgp}, {y_pixels, g, 1, kg});
  if (pass == ConvPass::kDgrad) take_back({x_pixels, g, 1, cgp}, {x_pixels, g, 1, cg});
  if (pass == ConvPass::kWgrad) take_back({g, kgp, taps, cgp}, {g, kg, taps, cg});

  conv.tiles = tiles != nullptr ? *tiles : plan_tiles(pass, conv.padded, n16);
  conv.inner_workspace = take({1, 1, 1, int64_t(partials_bytes(conv.padded, conv.tiles))}, 1);
  return conv;
}

cudaError_t launch_padded(ConvPass pass, const Conv2dParams& p, const ConvTilePlan& tiles, void* workspace,
                          cudaStream_t stream) {
  const PaddedConv conv = pad_channels(pass, p, &tiles, tiles.tile == TileConfigId::kN16, workspace);
  // An empty problem needs no workspace.
  if (conv.bytes > 0 && (workspace == nullptr || !aligned16(workspace))) return cudaErrorInvalidValue;
  if (!indexes_in_32_bits(conv.padded)) return cudaErrorInvalidValue;
  for (int i = 0; i < conv.copy_count; ++i)
    if (const cudaError_t err = launch_padded_copy(conv.copies_in[i], stream); err != cudaSuccess) return err;
  if (const cudaError_t err = launch_in_place(pass, conv.padded, conv.tiles, conv.inner_workspace, stream);
      err != cudaSuccess)
    return err;
  return conv.copies_out ? launch_padded_copy(conv.copy_out, stream) : cudaSuccess;
}

// The folded problem (conv/folded_taps.h) in the workspace: the folded x
// (none where the producer gathers it: `gathered`), then the folded filters
// (fprop) or their gradient (wgrad), then the Hopper convolution's own
// workspace.
struct FoldedConv {
  Conv2dParams folded;
  void* x_folded;
  void* w_folded;
  void* inner_workspace;
};

size_t folded_copy_bytes(ConvPass pass, const Conv2dParams& p, bool gathered) {
  return (gathered ? 0 : folded_input_bytes(p)) + folded_filter_bytes(pass, p);
}

FoldedConv fold_taps(ConvPass pass, const Conv2dParams& p, void* workspace, bool gathered) {
  char* at = static_cast<char*>(workspace);
  FoldedConv conv;
  conv.x_folded = gathered ? nullptr : at;
  conv.w_folded = at == nullptr ? nullptr : at + (gathered ? 0 : folded_input_bytes(p));
  conv.inner_workspace = at == nullptr ? nullptr : at + folded_copy_bytes(pass, p, gathered);
  conv.folded = folded_problem(pass, p, conv.x_folded, conv.w_folded);
  return conv;
}

cudaError_t launch_folded(ConvPass pass, const Conv2dParams& p, const Conv2dPlan& plan, void* workspace,
                          cudaStream_t stream) {
  if (!folds_taps(pass, p) || workspace == nullptr || !aligned16(workspace)) return cudaErrorInvalidValue;
  const FoldedConv conv = fold_taps(pass, p, workspace, plan.gathered_fold);
  if (!plan.gathered_fold)
    if (const cudaError_t err = launch_fold_input(p, conv.x_folded, plan.chunked_fold, stream); err != cudaSuccess)
      return err;
  if (pass == ConvPass::kFprop)
    if (const cudaError_t err = launch_fold_filters(p, conv.w_folded, stream); err != cudaSuccess) return err;
  const cudaError_t err =
      plan.gathered_fold
          ? launch_wgmma_gathered_fold(pass, p, conv.folded, plan.wgmma, conv.inner_workspace, stream)
          : launch_wgmma_conv(pass, conv.folded, plan.wgmma, conv.inner_workspace, stream);
  if (err != cudaSuccess) return err;
  return pass == ConvPass::kWgrad ? launch_unfold_filter_gradient(p, conv.w_folded, stream) : cudaSuccess;
}

}  // namespace

ConvPath conv_path() {
  const char* path = std::getenv("MPGEMM_CONV_PATH");
  if (path == nullptr || *path == '\0' || std::strcmp(path, "auto") == 0) return ConvPath::kAuto;
  if (std::strcmp(path, "wgmma") == 0) return ConvPath::kWgmma;
  if (std::strcmp(path, "wmma") == 0) return ConvPath::kWmma;
  if (std::strcmp(path, "gemm") == 0) return ConvPath::kGemm;
  throw std::invalid_argument(std::string("MPGEMM_CONV_PATH must be 'auto', 'wgmma', 'wmma' or 'gemm', got '") + path +
                              "'");
}

bool staged_row_stores() { return switch_on("MPGEMM_STAGED_ROW_STORES", true); }

bool one_launch_dgrad() { return switch_on("MPGEMM_DGRAD_ONE_LAUNCH", true); }

bool chunked_fold() { return switch_on("MPGEMM_CHUNKED_FOLD", true); }

bool gathered_fold() { return switch_on("MPGEMM_GATHERED_FOLD", false); }

bool dgrad_addend() { return switch_on("MPGEMM_DGRAD_ADDEND", false); }

bool n16_tile() { return switch_on("MPGEMM_CONV_N16_TILE", false); }

bool is_one_by_one_gemm(const Conv2dParams& p) {
  return p.groups == 1 && p.r == 1 && p.s == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_top == 0 &&
         p.pad_left == 0 && p.p == p.h && p.q == p.w;
}

GemmParams one_by_one_gemm(ConvPass pass, const Conv2dParams& c) {
  const int64_t pixels = c.n * c.h * c.w;
  GemmParams g;
  g.ab_type = c.input_type;
  g.d = c.out, g.d_type = c.out_type;
  switch (pass) {
    case ConvPass::kFprop:
      g.m = pixels, g.n = c.k, g.k = c.c;
      g.a = c.x, g.a_row_stride = c.c, g.a_col_stride = 1;
      g.b = c.wt, g.b_row_stride = 1, g.b_col_stride = c.c;
      g.bias = c.bias, g.bias_type = c.bias_type;
      break;
    case ConvPass::kDgrad:
      g.m = pixels, g.n = c.c, g.k = c.k;
      g.a = c.dy, g.a_row_stride = c.k, g.a_col_stride = 1;
      g.b = c.wt, g.b_row_stride = c.c, g.b_col_stride = 1;
      break;
    case ConvPass::kWgrad:
      g.m = c.k, g.n = c.c, g.k = pixels;
      g.a = c.dy, g.a_row_stride = 1, g.a_col_stride = c.k;
      g.b = c.x, g.b_row_stride = c.c, g.b_col_stride = 1;
      break;
  }
  g.d_row_stride = g.n, g.d_batch_stride = g.m * g.n;
  return g;
}

bool wgmma_conv_by_default(ConvPass pass, const Conv2dParams& p, bool narrow_tiles) {
  if (pass != ConvPass::kWgrad || p.r * p.s > 1 || narrow_tiles) return true;
  return p.k / p.groups * (p.c / p.groups) >= (int64_t(1) << 19);
}

bool folded_taps_by_default(ConvPass pass) { return pass == ConvPass::kFprop || pass == ConvPass::kWgrad; }

Conv2dPlan plan_conv2d(ConvPass pass, const Conv2dParams& p) {
  Conv2dPlan plan;
  const ConvPath path = conv_path();
  const bool staged_rows = staged_row_stores(), one_launch = one_launch_dgrad(), in_chunks = chunked_fold();
  const bool gathered = gathered_fold();
  const bool m64_tile = m64_tile_enabled();
  const bool sliding_wgrad = depthwise_sliding_wgrad_enabled(), sliding_gather = depthwise_sliding_gather_enabled();
  const bool n16 = n16_tile();
  const bool addend = p.addend != nullptr && pass == ConvPass::kDgrad && dgrad_addend();
  if (p.groups <= 0) return plan;
  if (path == ConvPath::kGemm && is_one_by_one_gemm(p)) {
    plan.path = Conv2dPlan::Path::kGemm;
    plan.gemm = plan_gemm(one_by_one_gemm(pass, p));
    plan.workspace_bytes = plan.gemm.workspace_bytes;
    return plan;
  }
  const bool by_default = path == ConvPath::kAuto || path == ConvPath::kGemm;
  const bool hopper =
      path == ConvPath::kWgmma || (by_default && wgmma_conv_by_default(pass, p, narrow_tiles_enabled()));
  if (hopper && wgmma_conv_takes(pass, p) && wgmma_available()) {
    plan.path = Conv2dPlan::Path::kWgmma;
    plan.wgmma = plan_wgmma_conv(pass, p, staged_rows, one_launch, m64_tile);
    plan.workspace_bytes = plan.wgmma.workspace_bytes;
    if (pass == ConvPass::kFprop && wgmma_conv_writes_moments(p)) plan.moment_rows = WgmmaBlockConfig::kInstrM;
    plan.addend_in_epilogue = addend && wgmma_dgrad_takes_addend(p);
    return plan;
  }
  const bool fold = path == ConvPath::kWgmma || (by_default && folded_taps_by_default(pass));
  if (fold && folds_taps(pass, p) && wgmma_available()) {
    const Conv2dParams folded = fold_taps(pass, p, nullptr, false).folded;
    if (wgmma_conv_takes(pass, folded)) {
      plan.path = Conv2dPlan::Path::kFoldedTaps;
      plan.wgmma = plan_wgmma_conv(pass, folded, false, false, m64_tile);
      plan.gathered_fold = gathered && wgmma_gathers_fold(pass, p, folded);
      plan.chunked_fold = in_chunks && !plan.gathered_fold;
      plan.workspace_bytes = folded_copy_bytes(pass, p, plan.gathered_fold) + plan.wgmma.workspace_bytes;
      // The gathering kernels write no moments.
      if (pass == ConvPass::kFprop && !plan.gathered_fold && wgmma_conv_writes_moments(folded))
        plan.moment_rows = WgmmaBlockConfig::kInstrM;
      return plan;
    }
  }
  plan.depthwise = plan_depthwise(pass, p, sliding_wgrad, sliding_gather);
  if (plan.depthwise.vector > 0) {
    plan.path = Conv2dPlan::Path::kDepthwise;
    plan.workspace_bytes = depthwise_workspace_bytes(p, plan.depthwise);
  } else if (conv_vector_width(pass, p) == 0) {
    const PaddedConv conv = pad_channels(pass, p, nullptr, n16, nullptr);
    plan.path = Conv2dPlan::Path::kPadded;
    plan.tiles = conv.tiles;
    plan.workspace_bytes = conv.bytes;
  } else {
    plan.path = Conv2dPlan::Path::kImplicitGemm;
    plan.tiles = plan_tiles(pass, p, n16);
    plan.workspace_bytes = partials_bytes(p, plan.tiles);
    if (pass == ConvPass::kFprop && plan.tiles.vector == 8) plan.moment_rows = tile_config(plan.tiles.tile).block_m;
  }
  return plan;
}

cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& p, const Conv2dPlan& plan, void* workspace,
                          cudaStream_t stream) {
  if (p.groups <= 0) return cudaErrorInvalidValue;
  if (p.moments != nullptr && (pass != ConvPass::kFprop || plan.moment_rows == 0)) return cudaErrorInvalidValue;
  if (p.addend != nullptr && (pass != ConvPass::kDgrad || !plan.addend_in_epilogue)) return cudaErrorInvalidValue;
  switch (plan.path) {
    case Conv2dPlan::Path::kDepthwise: return launch_depthwise(pass, p, plan.depthwise, workspace, stream);
    case Conv2dPlan::Path::kPadded: return launch_padded(pass, p, plan.tiles, workspace, stream);
    case Conv2dPlan::Path::kImplicitGemm: return launch_in_place(pass, p, plan.tiles, workspace, stream);
    case Conv2dPlan::Path::kWgmma: return launch_wgmma_conv(pass, p, plan.wgmma, workspace, stream);
    case Conv2dPlan::Path::kFoldedTaps: return launch_folded(pass, p, plan, workspace, stream);
    case Conv2dPlan::Path::kGemm:
      if (!is_one_by_one_gemm(p)) return cudaErrorInvalidValue;
      return launch_gemm(one_by_one_gemm(pass, p), plan.gemm, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace mpgemm::kernels
