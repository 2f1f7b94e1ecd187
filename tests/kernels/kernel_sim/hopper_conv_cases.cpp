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
//    names) on 1 to 3 multiprocessors (each block then walks several tiles
//    through the ring; wgrad's split cases on 16): channels up to three K
//    slices, 1 to 3 taps a side, stride up to 3 (dgrad's strided cases one
//    launch per phase of dx, some of them with phases no tap reaches, which
//    must come out zero; two in three with their rows staged, the default
//    (MPGEMM_STAGED_ROW_STORES=0 in the rest), whose epilogue must then, and
//    only then, read its rows back from shared memory; half of those (a 1x1
//    at stride 2 early in a run, a 3x3 at stride 2 later) with
//    MPGEMM_DGRAD_ONE_LAUNCH unset (the default; "0" in the rest), which must
//    then run their phases, 2 to 4 of them, in one launch and no memset, a
//    phase no tap reaches stored as zeros by that launch), padding,
//    dilation, fprop's
//    bias, outputs in fp32 or the inputs' type with pitches the copy
//    engine can and cannot store, fp16 and bf16 (fp16 alone where pinned:
//    the planted kernels' type); every other wgrad case on images large
//    enough that its sum over output pixels splits, and wgrad's channels
//    whole boxes of 64 in one case in four, padded per tap in the rest
//    (split or not). Every other case of each pass (not where pinned) runs
//    with the narrow tiles (the default; MPGEMM_NARROW_TILES=0 in the
//    rest), which must put a pass whose N is at most 128 on
//    the narrow tile conv/launch.h names (fprop drawing up to 128 filters,
//    every other time more than 64 on one multiprocessor, so that 128 x 128
//    tiles run); without it every case runs on the 128 x 256 tile. The
//    wgrad cases on the default path and 4 of the others in each run ask
//    for the 64-row tile (MPGEMM_M64_TILE=1), which must take them
//    (over more than 128 columns where the sum splits, more than 256 on one
//    multiprocessor where it does not, each block's consumers then taking
//    tiles in turn). Every
//    case the path takes must run on it; one in five of each pass has
//    channels it does not take (the WMMA kernels do, or fprop and wgrad on
//    folded taps where those fold). The reference scatters every
//    product into the pass's output. Every other pair of fprop cases, and
//    every folded one, asks for column moments where its path writes them
//    (the consumers' strips stored by the copy engine, the WMMA kernels on
//    16-byte chunks): the batch statistics they total to must match those
//    of the output as stored. dgrad cases 1 and 19 (at stride 1, dx of the
//    inputs' type) and 4, 7, 22 and 25 (strided) ask for an addend to dx
//    (MPGEMM_DGRAD_ADDEND=1): the first two on the Hopper path must add it
//    in the epilogue, the rest must not, and launch_conv2d must then
//    refuse it;
//  - folded taps: random few-channel fprop and wgrad (first layers: up to 7
//    channels, up to 7x7 taps, strides up to 3) with the path forced, which
//    must run on copies with their taps folded into the channels, x folded
//    in 16-byte chunks (MPGEMM_CHUNKED_FOLD unset, the default; "0" in the
//    rest) in every third case of a pass, its launch then a thread per
//    chunk, wgrad in others asking for the 64-row tile, which its folded
//    problem must run on where it has more than 128 columns, and every third
//    gathered by the producer (MPGEMM_GATHERED_FOLD=1), with no copy of x
//    nor its launch; and x's fold on its own, a thread per element and in
//    chunks, against the fold's definition;
//  - wgrad's split counts for ResNet-50 on 132 multiprocessors, on both
//    convolutions, against the cost model's worked out apart;
//  - fprop's column moments on each tile (tile_moments_wrong).
// A bad MPGEMM_CONV_PATH, MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH,
// MPGEMM_CHUNKED_FOLD or MPGEMM_M64_TILE must be refused; taps 254 pixels
// apart must run on the path and taps 256 apart (past the im2col offsets' 8
// bits) must not.
// Inputs are multiples of 1/8, so results must match the reference exactly.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conv/folded_taps.h"
#include "conv/geometry.h"
#include "conv/launch.h"
#include "kernel_sim/conv_reference.h"
#include "kernel_sim/gemm_cases.h"
#include "kernel_sim/hopper_conv_cases.h"
#include "kernel_sim/hopper_models.h"
#include "kernel_sim/hopper_sim.h"
#include "kernel_sim/sim_common.h"
#include "norm/column_moments.h"

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

// wgrad's GEMM columns: each tap's channels rounded up to whole boxes of 64.
static int64_t wgrad_columns(const Geometry& g) { return g.r * g.s * ((g.c + 63) / 64 * 64); }

// The tile the Hopper convolution should run a case on: conv/launch.h's
// rule (plan/gemm_plan.h's narrow_wgmma_tile on the pass's N; wgrad of at
// most 64 filters over more than 128 columns on the 64-row tile where
// MPGEMM_M64_TILE=1, `m64`) written out.
static TileConfigId expected_tile(ConvPass pass, const Geometry& g, bool narrow, bool m64) {
  const int64_t n = pass == ConvPass::kFprop ? g.k : pass == ConvPass::kDgrad ? g.c : wgrad_columns(g);
  const int64_t m = pass == ConvPass::kFprop ? g.n * g.p * g.q : g.n * g.h * g.w;
  if (m64 && pass == ConvPass::kWgrad && g.k <= 64 && n > 128) return TileConfigId::kWgmmaM64;
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

// A strided dgrad's phases.
static int dgrad_phases(const Conv2dParams& p) { return dgrad_phases_h(p) * dgrad_phases_w(p); }

// Whether some phase of a strided dgrad has pixels, a tap that reaches them,
// and rows that are not all of dx's: one that stores strided rows.
static bool has_strided_phase(const Conv2dParams& p) {
  for (int phase_h = 0; phase_h < dgrad_phases_h(p); ++phase_h)
    for (int phase_w = 0; phase_w < dgrad_phases_w(p); ++phase_w) {
      const ConvGemm g = dgrad_phase_gemm(p, phase_h, phase_w);
      if (g.k > 0 && g.m > 0 && (g.rows != p.h || g.cols != p.w)) return true;
    }
  return false;
}

// Whether the Hopper convolution should take fprop or wgrad of a few-channel
// case through folded taps (conv/folded_taps.h's rule, written out): no
// dilation, the folded channels (stride_h x S x C) within a box of 64,
// fewer K slices folded, ceil(R / stride_h), than unfolded, and for wgrad dy
// in whole 16 bytes (filters a multiple of 8), as the Hopper convolution
// reads it.
static bool folds(ConvPass pass, const Geometry& g) {
  const int64_t folded_taps = (g.r + g.stride_h - 1) / g.stride_h, boxes = (g.c + 63) / 64;
  return pass != ConvPass::kDgrad && g.dilation_h == 1 && g.dilation_w == 1 && g.stride_h * g.s * g.c <= 64 &&
         folded_taps < g.r * g.s * boxes && (pass == ConvPass::kFprop || g.k % 8 == 0);
}

namespace {

// One pass of a problem through plan_conv2d and launch_conv2d (the Hopper
// convolution forced where `forced`, the narrow tiles where `narrow`, the
// 64-row tile where `m64`),
// on random multiples of 1/8, against the reference: its plan, launch error
// and wrong elements.
struct ConvRun {
  Conv2dParams params;  // its pointers dangle once run_conv returns
  Conv2dPlan plan;
  cudaError_t err = cudaSuccess;
  int64_t wrong = 0, size = 0;
  bool bias = false;
  uint64_t shared_loads = 0;  // ld.shared by the launch's threads: an epilogue that staged its rows
  uint64_t launches = 0, memsets = 0;  // kernels launched and memsets, of every kind
  std::vector<uint64_t> launch_threads;  // the threads each launch asked for, in order
  bool moments = false;       // fprop wrote its column moments (whose sums load from shared memory too)
  int64_t moments_wrong = 0;  // channels whose batch statistics, totalled from them, are off
  bool addend = false;          // dgrad's epilogue added the addend asked for
  bool addend_refused = true;   // where it did not, launch_conv2d refused the addend
};

// A random problem run through plan_conv2d and launch_conv2d, with
// MPGEMM_CONV_PATH=wgmma (forced), the narrow tiles (narrow), staged rows
// (staged) and a strided dgrad's phases in one launch (one_launch) where
// asked, fprop's column moments where asked and its path writes them, and
// dgrad's addend (MPGEMM_DGRAD_ADDEND=1) where asked and its plan adds it
// (where not, launch_conv2d must refuse it, and the pass runs without),
// against the reference.
ConvRun run_conv(ConvPass pass, const Geometry& g, ElementType in, ElementType out, bool with_bias, bool forced,
                 bool narrow, bool staged = false, bool ask_moments = false, bool one_launch = false,
                 bool m64 = false, bool ask_addend = false) {
  const int64_t x_size = g.n * g.h * g.w * g.c, w_size = g.k * g.r * g.s * g.c, y_size = g.n * g.p * g.q * g.k;
  const int64_t out_size = pass == ConvPass::kFprop ? y_size : pass == ConvPass::kDgrad ? x_size : w_size;
  sim::Buffer x(x_size * 2), w(w_size * 2), dy(y_size * 2), result(out_size * sim::bytes_of(out));
  sim::Buffer addend(ask_addend ? x_size * 2 : 0);
  for (auto [buffer, size] : {std::pair{&x, x_size}, {&w, w_size}, {&dy, y_size}, {&addend, ask_addend ? x_size : 0}})
    for (int64_t i = 0; i < size; ++i) sim::set(buffer->p, in, i, rnd(-8, 8) / 8.0f);
  const sim::Bias bias(with_bias, g.k);
  ConvRun run;
  Conv2dParams& p = run.params;
  p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.k = g.k, p.r = g.r, p.s = g.s, p.p = g.p, p.q = g.q;
  p.stride_h = g.stride_h, p.stride_w = g.stride_w, p.pad_top = g.pad_top, p.pad_left = g.pad_left;
  p.dilation_h = g.dilation_h, p.dilation_w = g.dilation_w;
  p.input_type = in, p.out = result.p, p.out_type = out;
  if (pass != ConvPass::kDgrad) p.x = x.p;
  if (pass != ConvPass::kWgrad) p.wt = w.p;
  if (pass != ConvPass::kFprop) p.dy = dy.p;
  p.bias = bias.data(), p.bias_type = bias.type;
  // The narrow tiles, staged rows and one launch's phases are the defaults:
  // the first two asked for by name where forced, left to the default on the
  // default path, and "0" where not wanted; the phases' launch left to the
  // default where wanted (so that the default is what is checked), "0" where
  // not.
  if (forced) setenv("MPGEMM_CONV_PATH", "wgmma", 1);
  if (!narrow || forced) setenv("MPGEMM_NARROW_TILES", narrow ? "1" : "0", 1);
  if (!staged || forced) setenv("MPGEMM_STAGED_ROW_STORES", staged ? "1" : "0", 1);
  if (!one_launch) setenv("MPGEMM_DGRAD_ONE_LAUNCH", "0", 1);
  setenv("MPGEMM_M64_TILE", m64 ? "1" : "0", 1);
  if (ask_addend) setenv("MPGEMM_DGRAD_ADDEND", "1", 1), p.addend = addend.p;
  run.plan = plan_conv2d(pass, p);
  run.addend = ask_addend && run.plan.addend_in_epilogue;
  if (ask_addend && !run.addend) {
    run.addend_refused = launch_conv2d(pass, p, run.plan, nullptr, nullptr) == cudaErrorInvalidValue;
    p.addend = nullptr;
  }
  // Poisoned: every block's moments must be written.
  const int64_t rows = g.n * g.p * g.q;
  run.moments = ask_moments && pass == ConvPass::kFprop && run.plan.moment_rows > 0 && rows > 0;
  std::vector<float> moments(run.moments ? 2 * column_moment_blocks(rows, run.plan.moment_rows) * g.k : 0, NAN);
  if (run.moments) p.moments = moments.data();
  // Poisoned (sim::Buffer): the launch must read only what it wrote there.
  std::unique_ptr<sim::Buffer> workspace;
  if (run.plan.workspace_bytes > 0) workspace = std::make_unique<sim::Buffer>(run.plan.workspace_bytes);
  const uint64_t loads = sim::hopper::shared_loads, launches = sim::launches, memsets = sim::memsets;
  sim::launch_threads.clear();
  sim::recording_launch_threads = true;
  run.err = launch_conv2d(pass, p, run.plan, workspace ? workspace->p : nullptr, nullptr);
  sim::recording_launch_threads = false;
  run.launch_threads = sim::launch_threads;
  run.shared_loads = sim::hopper::shared_loads - loads;
  run.launches = sim::launches - launches, run.memsets = sim::memsets - memsets;
  unsetenv("MPGEMM_CONV_PATH");
  unsetenv("MPGEMM_NARROW_TILES");
  unsetenv("MPGEMM_STAGED_ROW_STORES");
  unsetenv("MPGEMM_DGRAD_ONE_LAUNCH");
  unsetenv("MPGEMM_M64_TILE");
  unsetenv("MPGEMM_DGRAD_ADDEND");
  const auto element = [in](const sim::Buffer& t) {
    return [&t, in](int64_t i) { return double(sim::get(t.p, in, i)); };
  };
  std::vector<double> want = sim::conv_reference(pass, p, element(x), element(w), element(dy), out_size);
  for (int64_t i = 0; pass == ConvPass::kFprop && i < out_size; ++i) want[i] += bias.values[i % g.k];
  for (int64_t i = 0; run.addend && i < out_size; ++i) want[i] += sim::get(addend.p, in, i);
  for (int64_t i = 0; i < out_size; ++i)
    run.wrong += !(sim::get(result.p, out, i) == sim::rounded(float(want[i]), out));
  if (run.moments) run.moments_wrong = sim::statistics_off(result.p, out, rows, g.k, moments, run.plan.moment_rows);
  p.moments = nullptr, p.addend = nullptr;
  run.size = out_size, run.bias = with_bias;
  return run;
}

std::string describe(ConvPass pass, const Geometry& g, ElementType in, ElementType out, const ConvRun& run) {
  static const char* const kPasses[] = {"fprop", "dgrad", "wgrad"};
  char text[400];
  snprintf(text, sizeof text,
           "%s n %ld h %ld w %ld c %ld k %ld r %ld s %ld stride %d,%d pad %d,%d dilation %d,%d %s -> %s%s: err=%d, "
           "%ld of %ld wrong, %ld channels' statistics off",
           kPasses[int(pass)], long(g.n), long(g.h), long(g.w), long(g.c), long(g.k), long(g.r), long(g.s),
           g.stride_h, g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w,
           in == ElementType::kBFloat16 ? "bf16" : "fp16", out == ElementType::kFloat32 ? "fp32" : "16-bit",
           run.bias ? " + bias" : "", int(run.err), long(run.wrong), long(run.size), long(run.moments_wrong));
  return text;
}

}  // namespace

// A random few-channel geometry whose pass folds its taps (first layers: up
// to 7 channels, up to 7x7 taps, strides up to 3, padding).
static Geometry random_folding_geometry(ConvPass pass) {
  Geometry g;
  do {
    const int64_t c = rnd(1, 7), k = pass == ConvPass::kFprop ? rnd(1, 40) : 8 * rnd(1, 5);
    g = random_geometry(c, k);
    g.r = rnd(1, 7), g.s = rnd(1, 7), g.h = rnd(g.r, 16), g.w = rnd(g.s, 16), g.dilation_h = g.dilation_w = 1;
    g.pad_top = int(rnd(0, g.r / 2)), g.pad_left = int(rnd(0, g.s / 2));
    g.p = (g.h + 2 * g.pad_top - g.r) / g.stride_h + 1, g.q = (g.w + 2 * g.pad_left - g.s) / g.stride_w + 1;
  } while (!folds(pass, g));
  return g;
}

// Elements of x's fold: N x J x Q pixels of 64 channels, J = P + R' - 1.
static int64_t folded_elements(const Geometry& g) {
  return g.n * (g.p + (g.r + g.stride_h - 1) / g.stride_h - 1) * g.q * 64;
}

// A random few-channel problem (random_folding_geometry, its fold more than
// one block's elements, so that a fold by elements and one in chunks launch
// different numbers of threads), fprop or wgrad in turn, with the Hopper
// convolution forced: it must run on folded taps, right. Cases 0-3 of every
// 6 copy x's fold first: in 16-byte chunks in cases 2 and 3
// (MPGEMM_CHUNKED_FOLD unset, the default: the fold's launch then a thread
// per chunk), a thread per element in 0 and 1 (MPGEMM_CHUNKED_FOLD=0), and
// wgrad in case 1 asking for the 64-row tile (MPGEMM_M64_TILE=1) on 3
// folded taps or more (more than 128 columns), which the folded problem
// must then run on (the others on the wide tile). Cases 4 and 5 ask the
// producer to gather the fold itself (MPGEMM_GATHERED_FOLD=1): no copy of x
// in the workspace and no launch of its fold, one launch fewer than the
// copying way's; case 4 at a row stride of 2 or more (more than one run of x
// a folded pixel); case 5's wgrad asks for the 64-row tile one time in two.
// fp16 where pinned (the planted kernels' type).
// Whether it failed.
bool folded_conv_case(int index, ConvCaseCounts& counts) {
  const auto pass = index % 2 == 0 ? ConvPass::kFprop : ConvPass::kWgrad;
  const int kind = index % 6;
  const bool gathered = kind >= 4, in_chunks = kind == 2 || kind == 3;
  const bool m64 = pass == ConvPass::kWgrad && (kind == 1 || (kind == 5 && rnd(0, 1) && !sim::pinned.on));
  // Those asking for the 64-row tile fold into 3 taps or more (more than 128 columns).
  // Case 4's rows stride 2 or more, so that its folded pixels hold more than one run of x.
  Geometry g;
  do g = random_folding_geometry(pass);
  while (folded_elements(g) <= 256 || (m64 && (g.r + g.stride_h - 1) / g.stride_h < 3) ||
         (kind == 4 && g.stride_h < 2));
  const ElementType in = rnd(0, 1) && !sim::pinned.on ? ElementType::kBFloat16 : ElementType::kFloat16;
  const ElementType out = rnd(0, 1) ? ElementType::kFloat32 : in;
  sim::use_multiprocessors(int(rnd(1, 3)));
  if (!in_chunks && !gathered) setenv("MPGEMM_CHUNKED_FOLD", "0", 1);  // in chunks: the default's
  if (gathered) setenv("MPGEMM_GATHERED_FOLD", "1", 1);
  const ConvRun run = run_conv(pass, g, in, out, pass == ConvPass::kFprop && rnd(0, 1), true, false, false, true,
                               false, m64);
  unsetenv("MPGEMM_CHUNKED_FOLD");
  unsetenv("MPGEMM_GATHERED_FOLD");
  const bool folded = run.plan.path == Conv2dPlan::Path::kFoldedTaps;
  const Conv2dParams folded_params = folded_problem(pass, run.params, nullptr, nullptr);
  const bool wide_fold = folded_params.r * folded_params.s * ((folded_params.c + 63) / 64 * 64) > 128;
  const TileConfigId tile = m64 && wide_fold ? TileConfigId::kWgmmaM64 : TileConfigId::kWgmma;
  counts.folded_on_m64 += folded && run.plan.wgmma.tile == TileConfigId::kWgmmaM64;
  // The launches: x's fold unless gathered, the filters' fold (fprop), the
  // convolution, its splits' sum (wgrad split) and the filter gradient's
  // unfold (wgrad).
  const uint64_t launches = uint64_t(!gathered) + 1 +
                            (pass == ConvPass::kWgrad ? uint64_t(run.plan.wgmma.splits > 1) + 1 : 1);
  // The fold's threads, the first launch's: one per element of the folded x,
  // or one per 16 bytes, in blocks of 256 (at most 8192 of them: beyond
  // the simulation's sizes). Gathered, the workspace holds no copy of x.
  const int64_t fold_threads = run.launch_threads.empty() ? 0 : int64_t(run.launch_threads[0]);
  const bool fold_right =
      gathered ? run.plan.gathered_fold && !run.plan.chunked_fold && run.plan.moment_rows == 0 &&
                     run.plan.workspace_bytes == folded_filter_bytes(pass, run.params) + run.plan.wgmma.workspace_bytes
               : !run.plan.gathered_fold &&
                     fold_threads == (folded_elements(g) / (in_chunks ? 8 : 1) + 255) / 256 * 256;
  counts.folded += folded;
  counts.folded_in_chunks += folded && in_chunks;
  counts.folded_gathered += folded && gathered;
  counts.moments += run.moments;
  const bool bad = run.err != cudaSuccess || run.wrong > 0 || run.moments_wrong > 0 || !folded || !fold_right ||
                   run.launches != launches || run.plan.wgmma.tile != tile;
  if (bad)
    printf("folded conv case %d FAILED: %s, on folded taps: %d, gathered: %d, x folded by %ld threads (in chunks: "
           "%d), %lu launches (expected %lu), tile %s (expected %s)\n",
           index, describe(pass, g, in, out, run).c_str(), int(folded), int(run.plan.gathered_fold),
           long(fold_threads), int(in_chunks), (unsigned long)run.launches, (unsigned long)launches,
           tile_config(run.plan.wgmma.tile).name, tile_config(tile).name);
  return bad;
}

// Few-channel geometries whose folds the random ones seldom reach, their
// outputs' sizes worked out: ResNet's first layer's, shrunk (runs of 21
// channels, so chunks that cross from one run to the next and into the zeros
// past them); 7x7 taps of one channel at a stride of 8 (56 folded channels)
// over 3 x 2 pixels padded by 6 rows and 9 columns: windows from rows above
// x to rows below it, one wholly in the left padding, one wider than x on
// both sides.
static Geometry fixed_folding_geometry(int index) {
  Geometry g = index == 0 ? Geometry{2, 15, 14, 3, 8, 7, 7, 0, 0, 2, 2, 3, 3, 1, 1}
                          : Geometry{1, 3, 2, 1, 8, 7, 7, 0, 0, 8, 8, 6, 9, 1, 1};
  g.p = (g.h + 2 * g.pad_top - g.r) / g.stride_h + 1, g.q = (g.w + 2 * g.pad_left - g.s) / g.stride_w + 1;
  return g;
}

// x's fold (conv/folded_taps.h's launch_fold_input), a thread per element
// and in 16-byte chunks, of the fixed geometries, then random few-channel
// ones (random_folding_geometry), into poisoned copies, against the fold's
// definition: folded x at (image, j, q, channel (r2 * S + s) * C + c) is x
// at (image, stride_h * j - pad_top + r2, stride_w * q - pad_left + s, c),
// zero outside x and past stride_h * S * C channels. Every other geometry
// on a grid of 1 or 2 blocks, whose threads must stride. Whether any element
// went wrong.
bool folds_of_x_wrong(int geometries) {
  int64_t wrong = 0;
  for (int i = 0; i < geometries; ++i) {
    const Geometry g = i < 2 ? fixed_folding_geometry(i) : random_folding_geometry(ConvPass::kFprop);
    const int64_t rows = g.p + (g.r + g.stride_h - 1) / g.stride_h - 1;
    const int64_t x_size = g.n * g.h * g.w * g.c, folded_size = folded_elements(g);
    sim::Buffer x(x_size * 2);
    for (int64_t e = 0; e < x_size; ++e) sim::set(x.p, ElementType::kFloat16, e, rnd(1, 4096) / 8.0f);
    const auto* x_elements = reinterpret_cast<const uint16_t*>(x.p);
    Conv2dParams p;
    p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.k = g.k, p.r = g.r, p.s = g.s, p.p = g.p, p.q = g.q;
    p.stride_h = g.stride_h, p.stride_w = g.stride_w, p.pad_top = g.pad_top, p.pad_left = g.pad_left;
    p.x = x.p, p.input_type = ElementType::kFloat16;
    if (i % 2 == 1) sim::max_grid.x = unsigned(rnd(1, 2));
    for (const bool in_chunks : {false, true}) {
      sim::Buffer folded(folded_size * 2);  // poisoned
      const cudaError_t err = launch_fold_input(p, folded.p, in_chunks, nullptr);
      int64_t off = err != cudaSuccess ? folded_size : 0;
      for (int64_t e = 0; err == cudaSuccess && e < folded_size; ++e) {
        const int64_t ch = e % 64, q = e / 64 % g.q, j = e / 64 / g.q % rows, image = e / 64 / g.q / rows;
        const int64_t r2 = ch / (g.s * g.c), s = ch / g.c % g.s, c = ch % g.c;
        const int64_t row = g.stride_h * j - g.pad_top + r2, col = g.stride_w * q - g.pad_left + s;
        const bool inside = r2 < g.stride_h && row >= 0 && row < g.h && col >= 0 && col < g.w;
        const uint16_t want = inside ? x_elements[((image * g.h + row) * g.w + col) * g.c + c] : uint16_t(0);
        off += reinterpret_cast<const uint16_t*>(folded.p)[e] != want;
      }
      if (off > 0)
        printf("  x's fold %s: %ld of %ld elements wrong (err=%d): n %ld h %ld w %ld c %ld r %ld s %ld stride %d,%d "
               "pad %d,%d\n",
               in_chunks ? "in chunks" : "by elements", long(off), long(folded_size), int(err), long(g.n), long(g.h),
               long(g.w), long(g.c), long(g.r), long(g.s), g.stride_h, g.stride_w, g.pad_top, g.pad_left);
      wrong += off;
    }
    sim::max_grid.x = 1u << 31;
  }
  return wrong > 0;
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
  // Two strided dgrad cases in three (some on narrow tiles, some on the
  // default path) store their phases' rows through shared memory; of those,
  // the 1x1s in the first 18 cases and the other strides in the next 18 run
  // their phases in one launch (a planted run meets one by its eighth case).
  const bool staged = pass == ConvPass::kDgrad && index / 3 % 3 != 0 && index / 9 % 2 == 0;
  const bool one_launch = staged && (index / 3 % 3 == 2) != (index / 18 % 2 == 1);
  // dgrad in turn at stride 1 (one launch, dx's rows dense), at drawn
  // strides other than 1 x 1 (in one launch, a 3x3 at stride 2 x 2 with
  // padding 1: four phases of 1, 2, 2 and 4 taps), and as a 1x1 at stride 2
  // on images of at least 2 x 2 (a phase in each dimension that no tap
  // reaches); every other wgrad case on two 24 x 24 images at stride 1,
  // enough output pixels (18 slices) to split their sum.
  // wgrad cases 2 and 3, 6 and 7, ... of each run, and those on the default
  // path, ask for the 64-row tile (not where pinned), which takes them
  // (every wgrad case has at most 40 filters): over more than 128 columns
  // where the sum splits, else over more than 256 on one multiprocessor,
  // whose block then walks two tiles or more, its consumers in turn.
  const bool by_default = index % 4 == 1;
  const bool split_sum = pass == ConvPass::kWgrad && index / 3 % 2 == 0;
  const bool m64 = pass == ConvPass::kWgrad && (index / 6 % 2 == 1 || by_default) && !sim::pinned.on;
  Geometry g = random_geometry(c, k);
  while (m64 && wgrad_columns(g) <= (split_sum ? 128 : 256)) g = random_geometry(c, k);
  if (pass == ConvPass::kDgrad && index / 3 % 3 == 0) g = with_unit_stride(g);
  while (pass == ConvPass::kDgrad && index / 3 % 3 == 1 && g.stride_h == 1 && g.stride_w == 1)
    g = random_geometry(c, k);
  if (pass == ConvPass::kDgrad && index / 3 % 3 == 2) {
    g.h = rnd(2, 12), g.w = rnd(2, 12), g.r = g.s = 1, g.stride_h = g.stride_w = 2;
    g.p = (g.h + 2 * g.pad_top - 1) / 2 + 1, g.q = (g.w + 2 * g.pad_left - 1) / 2 + 1;
  }
  if (one_launch && index / 3 % 3 == 1) {
    g.h = rnd(3, 12), g.w = rnd(3, 12), g.r = g.s = 3, g.stride_h = g.stride_w = 2;
    g.pad_top = g.pad_left = 1, g.dilation_h = g.dilation_w = 1;
    g.p = (g.h - 1) / 2 + 1, g.q = (g.w - 1) / 2 + 1;
  }
  if (split_sum) {
    g.n = 2, g.h = g.w = 24, g.pad_top = g.pad_left = int(rnd(0, 1));
    g = with_unit_stride(g);
  }
  // dgrad cases 1 and 19 of each run (at stride 1, their dx of the inputs'
  // type) and 4, 7, 22 and 25 (strided) ask for the addend
  // (MPGEMM_DGRAD_ADDEND=1): the first two must add it in the epilogue,
  // those strided or off the Hopper path must not.
  const bool ask_addend = pass == ConvPass::kDgrad && index / 9 % 2 == 0;
  const ElementType in = rnd(0, 1) && !sim::pinned.on ? ElementType::kBFloat16 : ElementType::kFloat16;
  const ElementType out = rnd(0, 1) && !(ask_addend && index / 3 % 3 == 0) ? ElementType::kFloat32 : in;
  // The split cases on 16 multiprocessors, more than their tiles (at most
  // 5), so that the split's cost model (plan/split_cost.h) finds a split
  // that pays.
  sim::use_multiprocessors(wide_narrow || (m64 && !split_sum) ? 1 : split_sum ? 16 : int(rnd(1, 3)));
  // One case in four (by_default) on the default path, which takes the
  // Hopper convolution only where wgmma_conv_by_default says so.
  // fprop cases 0 and 1, 4 and 5, ... of each run ask for column moments: on the narrow tiles and not.
  const bool ask_moments = index / 3 / 2 % 2 == 0;
  const ConvRun run = run_conv(pass, g, in, out, pass == ConvPass::kFprop && rnd(0, 1), !by_default, narrow, staged,
                               ask_moments, one_launch, m64, ask_addend);
  const Conv2dPlan& plan = run.plan;
  const bool wgmma = plan.path == Conv2dPlan::Path::kWgmma, folded = plan.path == Conv2dPlan::Path::kFoldedTaps;
  const TileConfigId tile = expected_tile(pass, g, narrow, m64);
  counts.on_n128 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaN128;
  counts.on_n64 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaN64;
  counts.on_m64 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaM64;
  counts.split_on_m64 += wgmma && plan.wgmma.tile == TileConfigId::kWgmmaM64 && plan.wgmma.splits > 1;
  const bool strided = pass == ConvPass::kDgrad && (g.stride_h > 1 || g.stride_w > 1);
  counts.on_wgmma += wgmma;
  counts.by_default += wgmma && by_default;
  counts.split += wgmma && plan.wgmma.splits > 1;
  counts.strided_dgrad += wgmma && strided;
  counts.unreached_phase += wgmma && strided && has_unreached_phase(run.params);
  counts.folded += folded;
  // Only a strided dgrad asked to stage its rows loads from shared memory
  // (its epilogue's strips), where a tap reaches a phase of strided rows.
  const bool should_stage = wgmma && strided && staged && has_strided_phase(run.params);
  const bool did_stage = run.shared_loads > 0 && !run.moments;
  counts.moments += run.moments;
  counts.addend += run.addend;
  counts.staged_rows += did_stage;
  // A strided dgrad asked for one launch runs its phases, 2 to 4 of them
  // (more fall back to a launch a phase), where a tap reaches some phase,
  // in one launch and no memset: one that does not launches once a phase a
  // tap reaches, zeroing dx first where a phase is left.
  const bool should_launch_once = should_stage && one_launch && dgrad_phases(run.params) >= 2 &&
                                  dgrad_phases(run.params) <= 4;
  const bool launched_once = strided && run.launches == 1 && run.memsets == 0 && dgrad_phases(run.params) >= 2;
  counts.one_launch += launched_once;
  counts.one_launch_unreached += launched_once && has_unreached_phase(run.params);
  const bool should = path_takes(pass, g) && (!by_default || wgmma_conv_by_default(pass, run.params, narrow));
  const bool should_fold = !path_takes(pass, g) && (!by_default || folded_taps_by_default(pass)) && folds(pass, g);
  const bool should_add = ask_addend && wgmma && !strided && out == in;
  const bool bad = run.err != cudaSuccess || run.wrong > 0 || run.moments_wrong > 0 || wgmma != should ||
                   run.addend != should_add || !run.addend_refused ||
                   folded != should_fold ||
                   (wgmma && plan.wgmma.tile != tile) || did_stage != should_stage ||
                   launched_once != should_launch_once;
  if (bad)
    printf("conv case %d FAILED: %s: on the Hopper path: %d (expected %d), folded %d (expected %d), %d splits, "
           "tile %s (expected %s), rows staged %d (expected %d), phases in one launch %d (expected %d), "
           "addend added %d (expected %d, refused where not %d)\n",
           index, describe(pass, g, in, out, run).c_str(), int(wgmma), int(should), int(folded), int(should_fold),
           plan.wgmma.splits, tile_config(plan.wgmma.tile).name, tile_config(tile).name, int(did_stage),
           int(should_stage), int(launched_once), int(should_launch_once), int(run.addend), int(should_add),
           int(run.addend_refused));
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
    const ConvRun run = run_conv(ConvPass::kFprop, g, ElementType::kFloat16, ElementType::kFloat32, false, true, false);
    const bool wgmma = run.plan.path == Conv2dPlan::Path::kWgmma;
    if (run.err != cudaSuccess || run.wrong || wgmma != should) {
      printf("  taps %d apart: err=%d, on the Hopper path: %d (expected %d), %ld wrong\n", 2 * dilation,
             int(run.err), int(wgmma), int(should), long(run.wrong));
      bad = true;
    }
  }
  return bad;
}

// fprop's column moments on each tile (64, 128 and 192 filters: the narrow
// tiles and the wide one's partial columns), over 3 x 81 output pixels (a
// partial last block of 64 rows), into fp16 and fp32 outputs: the statistics
// they total to must match those of the output as stored, on the Hopper
// path. Counted with the random cases'. Whether any went wrong.
bool tile_moments_wrong(ConvCaseCounts& counts) {
  bool bad = false;
  for (const int64_t k : {64, 128, 192}) {
    const Geometry g{3, 9, 9, 16, k, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1};
    const ElementType out = k == 128 ? ElementType::kFloat32 : ElementType::kFloat16;
    const ConvRun run = run_conv(ConvPass::kFprop, g, ElementType::kFloat16, out, false, true, true, false, true);
    counts.moments += run.moments;
    if (run.err != cudaSuccess || run.wrong || run.moments_wrong || !run.moments ||
        run.plan.path != Conv2dPlan::Path::kWgmma) {
      printf("  moments of %ld filters: err=%d, %ld wrong, %ld channels' statistics off, written: %d\n", long(k),
             int(run.err), long(run.wrong), long(run.moments_wrong), int(run.moments));
      bad = true;
    }
  }
  return bad;
}

// A bad value of `variable` (MPGEMM_CONV_PATH, MPGEMM_STAGED_ROW_STORES,
// MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD, ...) is refused by any plan,
// whatever the problem (MPGEMM_DGRAD_ADDEND by that of a dgrad with an
// addend: a problem of no groups, whose plan has read every switch when it
// refuses it); whether it was not.
bool bad_conv_variable_accepted(const char* variable, const char* value) {
  setenv(variable, value, 1);
  bool refused = false;
  try {
    Conv2dParams dgrad_with_addend;
    dgrad_with_addend.groups = 0, dgrad_with_addend.addend = &dgrad_with_addend;  // never read
    plan_conv2d(ConvPass::kDgrad, dgrad_with_addend);
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find(variable) != std::string::npos;
  }
  unsetenv(variable);
  if (!refused) printf("  %s=%s was not refused\n", variable, value);
  return !refused;
}

// wgrad's split counts on an H100's 132 multiprocessors for ResNet-50's
// convolutions at batch 256 (fp16), on the Hopper convolution's 128 x 256
// tile and on the WMMA implicit GEMM's square tile: plan/split_cost.h's
// model, worked out apart from the code (bench/NOTES.md, "wgrad's split from
// a cost model"). Whether a plan differed.
bool wgrad_splits_wrong() {
  struct Layer {
    int64_t c, k, r, stride, h;
    int hopper, wmma;
  };
  static const Layer kLayers[] = {
      {64, 64, 1, 1, 56, 131, 256},     {64, 64, 3, 1, 56, 44, 52},       {64, 256, 1, 1, 56, 66, 131},
      {256, 64, 1, 1, 56, 131, 131},    {256, 128, 1, 1, 56, 131, 131},   {128, 128, 3, 2, 56, 26, 29},
      {128, 512, 1, 1, 28, 33, 66},     {256, 512, 1, 2, 56, 33, 33},     {512, 128, 1, 1, 28, 66, 66},
      {128, 128, 3, 1, 28, 26, 29},     {512, 256, 1, 1, 28, 33, 33},     {256, 256, 3, 2, 28, 7, 7},
      {256, 1024, 1, 1, 14, 16, 16},    {512, 1024, 1, 2, 28, 8, 8},      {1024, 256, 1, 1, 14, 16, 16},
      {256, 256, 3, 1, 14, 7, 7},       {1024, 512, 1, 1, 14, 8, 8},      {512, 512, 3, 2, 14, 3, 3},
      {512, 2048, 1, 1, 7, 4, 4},       {1024, 2048, 1, 2, 14, 2, 2},     {2048, 512, 1, 1, 7, 4, 4},
      {512, 512, 3, 1, 7, 3, 3}};
  sim::use_multiprocessors(132);
  bool bad = false;
  for (const Layer& l : kLayers) {
    Conv2dParams p;
    const int64_t pad = l.r / 2;
    p.n = 256, p.h = p.w = l.h, p.c = l.c, p.k = l.k, p.r = p.s = l.r;
    p.p = p.q = (l.h + 2 * pad - l.r) / l.stride + 1;
    p.stride_h = p.stride_w = int(l.stride), p.pad_top = p.pad_left = int(pad);
    // Never read: the plan looks at the operands' alignment alone.
    p.x = p.dy = reinterpret_cast<void*>(uintptr_t(1) << 20);
    p.out = reinterpret_cast<void*>(uintptr_t(1) << 21), p.out_type = ElementType::kFloat16;
    for (const char* path : {"wgmma", "wmma"}) {
      setenv("MPGEMM_CONV_PATH", path, 1);
      const Conv2dPlan plan = plan_conv2d(ConvPass::kWgrad, p);
      unsetenv("MPGEMM_CONV_PATH");
      const bool hopper = path[1] == 'g';
      const int splits = hopper ? plan.wgmma.splits : plan.tiles.split_k, want = hopper ? l.hopper : l.wmma;
      const bool on_path = (plan.path == Conv2dPlan::Path::kWgmma) == hopper;
      if (splits != want || !on_path) {
        printf("  wgrad %ld -> %ld, %ldx%ld at stride %ld on %ldx%ld, %s: %d splits, expected %d%s\n", long(l.c),
               long(l.k), long(l.r), long(l.r), long(l.stride), long(l.h), long(l.h), path, splits, want,
               on_path ? "" : " (not on the path)");
        bad = true;
      }
    }
  }
  return bad;
}
