// The Hopper convolution (csrc/kernels/sm90/conv_kernel.cuh) in the
// host-side simulation at sim arch 900, for hopper_cases.cpp: its im2col
// copies placed by hopper_models.h's model of the PTX ISA's im2col mode.
//  - im2col walk: the model against the convolution's own definition: from
//    a tile's first output pixel, with the bounding box the launcher's
//    corners give (the first taps of the first and last windows along each
//    dimension), pixel i of a box at tap (r, s) must read x at output pixel
//    m0 + i's window tap (r, s), for random geometries, padding, strides,
//    dilations, image edges and tiles that run past the last image (whose
//    pixels must read nothing inside x);
//  - conv: random problems of each pass (case i runs pass i % 3) through
//    plan_conv2d and launch_conv2d with MPGEMM_CONV_PATH=wgmma (one in four
//    on the default path, which takes the passes wgmma_conv_by_default
//    names) on 1 to 3
//    multiprocessors (each block then walks several tiles through the
//    ring): channels up to three K slices, 1 to 3 taps a side, stride up to
//    3 (dgrad's strided cases one launch per phase of dx, some of them with
//    phases no tap reaches, which must come out zero), padding, dilation,
//    fprop's bias, outputs in fp32 or the inputs' type with pitches the copy
//    engine can and cannot store, fp16 and bf16 (fp16 alone where pinned:
//    the planted kernels' type); every other wgrad case on images large
//    enough that its sum over output pixels splits, and wgrad's channels
//    whole boxes of 64 in one case in four, padded per tap in the rest
//    (split or not). Every other case of each pass (not where pinned) sets
//    MPGEMM_NARROW_TILES=1, which must put a pass whose N is at most 128 on
//    the narrow tile conv/launch.h names (fprop drawing up to 128 filters,
//    every other time more than 64 on one multiprocessor, so that 128 x 128
//    tiles run); without it every case runs on the 128 x 256 tile. Every
//    case the path takes must run on it; one in five of each pass has
//    channels it does not take (the WMMA kernels do). The reference scatters every product into the
//    pass's output. A bad MPGEMM_CONV_PATH must be refused; taps 254 pixels
//    apart must run on the path and taps 256 apart (past the im2col
//    offsets' 8 bits) must not.
// Inputs are multiples of 1/8, so results must match the reference exactly.
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conv/geometry.h"
#include "conv/launch.h"
#include "kernel_sim/conv_reference.h"
#include "kernel_sim/gemm_cases.h"
#include "kernel_sim/hopper_conv_cases.h"
#include "kernel_sim/hopper_models.h"
#include "kernel_sim/hopper_sim.h"
#include "kernel_sim/sim_common.h"

using namespace mpgemm::kernels;
using sim::rnd;
namespace model = sim::hopper_model;

namespace {

struct Geometry {
  int64_t n, h, w, c, k, r, s, p, q;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
};

// A random geometry whose output has at least one pixel.
Geometry random_geometry(int64_t c, int64_t k) {
  for (;;) {
    Geometry g{rnd(1, 2), rnd(1, 12), rnd(1, 12), c, k, rnd(1, 3), rnd(1, 3), 0, 0,
               int(rnd(1, 3)), int(rnd(1, 3)), int(rnd(0, 2)), int(rnd(0, 2)), int(rnd(1, 2)), int(rnd(1, 2))};
    const int64_t span_h = g.h + 2 * g.pad_top - g.dilation_h * (g.r - 1) - 1;
    const int64_t span_w = g.w + 2 * g.pad_left - g.dilation_w * (g.s - 1) - 1;
    if (span_h < 0 || span_w < 0) continue;
    g.p = span_h / g.stride_h + 1, g.q = span_w / g.stride_w + 1;
    return g;
  }
}

// g at stride 1, its output grown to match.
Geometry with_unit_stride(Geometry g) {
  g.stride_h = g.stride_w = 1;
  g.p = g.h + 2 * g.pad_top - g.dilation_h * (g.r - 1);
  g.q = g.w + 2 * g.pad_left - g.dilation_w * (g.s - 1);
  return g;
}

}  // namespace

// The model's walk against the convolution's windows; returns how many
// elements it checked, counting mismatches.
int check_im2col_walk(int& mismatches) {
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Geometry g = random_geometry(64, 8);
    // The bounding box: window starts from -pad to (out - 1) * stride - pad,
    // as offsets from the first and last pixels.
    const model::Im2colBox box{{g.c, g.w, g.h, g.n},
                               {-g.pad_left, -g.pad_top},
                               {int32_t((g.q - 1) * g.stride_w - g.pad_left - (g.w - 1)),
                                int32_t((g.p - 1) * g.stride_h - g.pad_top - (g.h - 1))},
                               {uint32_t(g.stride_w), uint32_t(g.stride_h)}};
    const int64_t pixels = g.n * g.p * g.q, m0 = rnd(0, pixels - 1);
    const int64_t image = m0 / (g.p * g.q), p = m0 % (g.p * g.q) / g.q, q = m0 % g.q;
    const int64_t start[4] = {0, q * g.stride_w - g.pad_left, p * g.stride_h - g.pad_top, image};
    const int r = int(rnd(0, g.r - 1)), s = int(rnd(0, g.s - 1));
    for (uint32_t i = 0; i < 128; ++i, ++checked) {
      const model::Im2colElement e =
          model::im2col_element(box, start, s * g.dilation_w, r * g.dilation_h, i, 0);
      const int64_t m = m0 + i;
      const bool inside = e.at[1] >= 0 && e.at[1] < g.w && e.at[2] >= 0 && e.at[2] < g.h && e.at[3] < g.n;
      if (m >= pixels) {  // past the last image: nothing of x
        if (inside && mismatches++ < 5) printf("  im2col pixel %u past the last image reads x\n", i);
        continue;
      }
      const int64_t want[3] = {m % g.q * g.stride_w - g.pad_left + s * g.dilation_w,
                               m / g.q % g.p * g.stride_h - g.pad_top + r * g.dilation_h, m / (g.p * g.q)};
      if ((e.at[1] != want[0] || e.at[2] != want[1] || e.at[3] != want[2]) && mismatches++ < 5)
        printf("  im2col pixel %u of a box from output pixel %ld: (w %ld, h %ld, n %ld), expected (%ld, %ld, %ld)\n",
               i, long(m0), long(e.at[1]), long(e.at[2]), long(e.at[3]), long(want[0]), long(want[1]),
               long(want[2]));
    }
  }
  return checked;
}

// Whether the Hopper convolution should take a case of the drawn kind:
// conv/launch.h's rules, written out for what the cases vary.
static bool path_takes(ConvPass pass, const Geometry& g) {
  switch (pass) {
    case ConvPass::kFprop: return g.c % 8 == 0;
    case ConvPass::kDgrad: return g.c % 8 == 0 && g.k % 8 == 0;
    default: return g.c % 8 == 0 && g.k % 8 == 0;
  }
}

// The tile the Hopper convolution should run a case on: conv/launch.h's
// rule (plan/gemm_plan.h's narrow_wgmma_tile on the pass's N) written out.
static TileConfigId expected_tile(ConvPass pass, const Geometry& g, bool narrow) {
  const int64_t n = pass == ConvPass::kFprop ? g.k : pass == ConvPass::kDgrad ? g.c : g.r * g.s * ((g.c + 63) / 64 * 64);
  const int64_t m = pass == ConvPass::kFprop ? g.n * g.p * g.q : g.n * g.h * g.w;
  if (!narrow || n > 128) return TileConfigId::kWgmma;
  const bool few_tiles = pass != ConvPass::kWgrad && (m + 127) / 128 * ((n + 127) / 128) * 2 <= sim::multiprocessors;
  return n <= 64 || few_tiles ? TileConfigId::kWgmmaN64 : TileConfigId::kWgmmaN128;
}

// Whether some phase of a strided dgrad is reached by no tap (and so is left
// to the zero fill).
static bool has_unreached_phase(const Conv2dParams& p) {
  for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
    for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w)
      if (dgrad_phase_gemm(p, phase_h, phase_w).k == 0) return true;
  return false;
}

// One random problem of pass index % 3; whether it failed. Counts the cases
// on the Hopper path, wgrad's that split the sum, dgrad's with a stride (one
// launch per phase) and those of them with a phase no tap reaches.
bool hopper_conv_case(int index, ConvCaseCounts& counts) {
  const auto pass = ConvPass(index % 3);
  const bool other = index / 3 % 5 == 4;  // channels the path does not take
  const auto channels = [&]() -> int64_t {
    if (other) return 8 * rnd(0, 2) + (rnd(0, 1) ? 4 : 2);
    if (pass != ConvPass::kWgrad) return 8 * rnd(1, 24);
    // wgrad: whole boxes of 64 channels a tap in every fourth case; in the
    // rest each tap's channels padded to whole boxes in its GEMM.
    if (index / 3 % 4 == 0) return 64 * rnd(1, 2);
    const int64_t c = 8 * rnd(1, 16);
    return c % 64 == 0 ? c + 8 : c;
  };
  const bool narrow = index / 3 % 2 == 1 && !sim::pinned.on, wide_narrow = narrow && index / 6 % 2 == 1;
  const int64_t c = channels();
  const int64_t k = pass == ConvPass::kFprop && narrow ? (wide_narrow ? rnd(65, 128) : rnd(1, 64))
                    : pass == ConvPass::kFprop || other ? rnd(1, 40)
                                                        : 8 * rnd(1, 5);
  // dgrad in turn at stride 1 (one launch, dx's rows dense), at drawn
  // strides other than 1 x 1, and as a 1x1 at stride 2 on images of at
  // least 2 x 2 (a phase in each dimension that no tap reaches); every other
  // wgrad case on two 24 x 24 images at stride 1, enough output pixels (18
  // slices) to split their sum.
  Geometry g = random_geometry(c, k);
  if (pass == ConvPass::kDgrad && index / 3 % 3 == 0) g = with_unit_stride(g);
  while (pass == ConvPass::kDgrad && index / 3 % 3 == 1 && g.stride_h == 1 && g.stride_w == 1)
    g = random_geometry(c, k);
  if (pass == ConvPass::kDgrad && index / 3 % 3 == 2) {
    g.h = rnd(2, 12), g.w = rnd(2, 12), g.r = g.s = 1, g.stride_h = g.stride_w = 2;
    g.p = (g.h + 2 * g.pad_top - 1) / 2 + 1, g.q = (g.w + 2 * g.pad_left - 1) / 2 + 1;
  }
  if (pass == ConvPass::kWgrad && index / 3 % 2 == 0) {
    g.n = 2, g.h = g.w = 24, g.pad_top = g.pad_left = int(rnd(0, 1));
    g = with_unit_stride(g);
  }
  const ElementType in = rnd(0, 1) && !sim::pinned.on ? ElementType::kBFloat16 : ElementType::kFloat16;
  const ElementType out = rnd(0, 1) ? ElementType::kFloat32 : in;
  sim::use_multiprocessors(wide_narrow ? 1 : int(rnd(1, 3)));
  const int64_t x_size = g.n * g.h * g.w * g.c, w_size = g.k * g.r * g.s * g.c, y_size = g.n * g.p * g.q * g.k;
  const int64_t out_size = pass == ConvPass::kFprop ? y_size : pass == ConvPass::kDgrad ? x_size : w_size;
  sim::Buffer x(x_size * 2), w(w_size * 2), dy(y_size * 2), result(out_size * sim::bytes_of(out));
  for (auto [buffer, size] : {std::pair{&x, x_size}, {&w, w_size}, {&dy, y_size}})
    for (int64_t i = 0; i < size; ++i) sim::set(buffer->p, in, i, rnd(-8, 8) / 8.0f);
  const sim::Bias bias(pass == ConvPass::kFprop && rnd(0, 1), g.k);
  Conv2dParams p;
  p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.k = g.k, p.r = g.r, p.s = g.s, p.p = g.p, p.q = g.q;
  p.stride_h = g.stride_h, p.stride_w = g.stride_w, p.pad_top = g.pad_top, p.pad_left = g.pad_left;
  p.dilation_h = g.dilation_h, p.dilation_w = g.dilation_w;
  p.input_type = in, p.out = result.p, p.out_type = out;
  if (pass != ConvPass::kDgrad) p.x = x.p;
  if (pass != ConvPass::kWgrad) p.wt = w.p;
  if (pass != ConvPass::kFprop) p.dy = dy.p;
  p.bias = bias.data(), p.bias_type = bias.type;
  // One case in four on the default path, which takes the Hopper
  // convolution only where wgmma_conv_by_default says so.
  const bool by_default = index % 4 == 1;
  if (!by_default) setenv("MPGEMM_CONV_PATH", "wgmma", 1);
  if (narrow) setenv("MPGEMM_NARROW_TILES", "1", 1);
  const Conv2dPlan plan = plan_conv2d(pass, p);
  std::unique_ptr<sim::Buffer> workspace;
  if (plan.workspace_bytes > 0) workspace = std::make_unique<sim::Buffer>(plan.workspace_bytes);
  const cudaError_t err = launch_conv2d(pass, p, plan, workspace ? workspace->p : nullptr, nullptr);
  unsetenv("MPGEMM_CONV_PATH");
  unsetenv("MPGEMM_NARROW_TILES");
  const bool wgmma = plan.path == Conv2dPlan::Path::kWgmma;
  const TileConfigId tile = expected_tile(pass, g, narrow);
  counts.on_n128 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaN128;
  counts.on_n64 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaN64;
  const bool strided = pass == ConvPass::kDgrad && (g.stride_h > 1 || g.stride_w > 1);
  counts.on_wgmma += wgmma;
  counts.by_default += wgmma && by_default;
  counts.split += wgmma && plan.wgmma.splits > 1;
  counts.strided_dgrad += wgmma && strided;
  counts.unreached_phase += wgmma && strided && has_unreached_phase(p);
  const auto element = [in](const sim::Buffer& t) {
    return [&t, in](int64_t i) { return double(sim::get(t.p, in, i)); };
  };
  std::vector<double> want = sim::conv_reference(pass, p, element(x), element(w), element(dy), out_size);
  for (int64_t i = 0; pass == ConvPass::kFprop && i < out_size; ++i) want[i] += bias.values[i % g.k];
  int64_t wrong = 0;
  for (int64_t i = 0; i < out_size; ++i) wrong += !(sim::get(result.p, out, i) == sim::rounded(float(want[i]), out));
  const bool should = path_takes(pass, g) && (!by_default || wgmma_conv_by_default(pass, p));
  const bool bad = err != cudaSuccess || wrong > 0 || wgmma != should || (wgmma && plan.wgmma.tile != tile);
  static const char* const kPasses[] = {"fprop", "dgrad", "wgrad"};
  if (bad)
    printf("conv case %d FAILED: %s n %ld h %ld w %ld c %ld k %ld r %ld s %ld stride %d,%d pad %d,%d dilation %d,%d "
           "%s -> %s%s: err=%d, on the Hopper path: %d (expected %d, %d splits, tile %s, expected %s), %ld of %ld "
           "wrong\n",
           index, kPasses[int(pass)], long(g.n), long(g.h), long(g.w), long(g.c), long(g.k), long(g.r), long(g.s),
           g.stride_h, g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w,
           in == ElementType::kBFloat16 ? "bf16" : "fp16", out == ElementType::kFloat32 ? "fp32" : "16-bit",
           bias.present ? " + bias" : "", int(err), int(wgmma), int(should), plan.wgmma.splits,
           tile_config(plan.wgmma.tile).name, tile_config(tile).name, long(wrong), long(out_size));
  return bad;
}

// Taps 254 pixels apart (3 taps, dilation 127, padding 127) run on the path,
// right against the reference; 256 apart (dilation 128) are past the im2col
// offsets' 8 bits and must be refused. Whether either went wrong.
bool far_taps_wrong() {
  bool bad = false;
  for (const int dilation : {127, 128}) {
    const Geometry g{1, 3, 2, 8, 8, 3, 1, 3, 2, 1, 1, dilation, 0, dilation, 1};
    const bool should = dilation < 128;
    sim::Buffer x(g.n * g.h * g.w * g.c * 2), w(g.k * g.r * g.s * g.c * 2), y(g.n * g.p * g.q * g.k * 4);
    for (int64_t i = 0; i < g.n * g.h * g.w * g.c; ++i) sim::set(x.p, ElementType::kFloat16, i, rnd(-8, 8) / 8.0f);
    for (int64_t i = 0; i < g.k * g.r * g.s * g.c; ++i) sim::set(w.p, ElementType::kFloat16, i, rnd(-8, 8) / 8.0f);
    Conv2dParams p;
    p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.k = g.k, p.r = g.r, p.s = g.s, p.p = g.p, p.q = g.q;
    p.pad_top = g.pad_top, p.dilation_h = g.dilation_h;
    p.x = x.p, p.wt = w.p, p.out = y.p;
    setenv("MPGEMM_CONV_PATH", "wgmma", 1);
    const Conv2dPlan plan = plan_conv2d(ConvPass::kFprop, p);
    const cudaError_t err = launch_conv2d(ConvPass::kFprop, p, plan, nullptr, nullptr);
    unsetenv("MPGEMM_CONV_PATH");
    const auto element = [](const sim::Buffer& t) {
      return [&t](int64_t i) { return double(sim::get(t.p, ElementType::kFloat16, i)); };
    };
    const std::vector<double> want = sim::conv_reference(ConvPass::kFprop, p, element(x), element(w), element(x),
                                                         g.n * g.p * g.q * g.k);
    int64_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) wrong += !(sim::get(y.p, ElementType::kFloat32, i) == float(want[i]));
    if (err != cudaSuccess || wrong || (plan.path == Conv2dPlan::Path::kWgmma) != should) {
      printf("  taps %d apart: err=%d, on the Hopper path: %d (expected %d), %ld wrong\n", 2 * dilation, int(err),
             int(plan.path == Conv2dPlan::Path::kWgmma), int(should), long(wrong));
      bad = true;
    }
  }
  return bad;
}

// A value of MPGEMM_CONV_PATH that names no path is refused; whether it was not.
bool bad_conv_path_accepted() {
  setenv("MPGEMM_CONV_PATH", "hopper", 1);
  bool refused = false;
  try {
    plan_conv2d(ConvPass::kFprop, Conv2dParams{});
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("MPGEMM_CONV_PATH") != std::string::npos;
  }
  unsetenv("MPGEMM_CONV_PATH");
  if (!refused) printf("  MPGEMM_CONV_PATH=hopper was not refused\n");
  return !refused;
}
