// Random convolutions through launch_conv2d (csrc/kernels/conv/launch.cu) in
// the host-side simulation, for driver.cpp. Every output element is checked
// against a reference that scatters each product of the convolution into the
// pass's output, so it shares no indexing with the kernels' gathers. Inputs are
// small multiples of 1/8, exact in fp16 and bf16: fp32 sums are exact in any
// order and results must match bit for bit; bytes around the output must stay
// untouched.
//
// Case i runs pass i % 3 on path i / 3 % 7: 16-byte chunks in the large
// (Square, from sim arch 800 on), compact and small tiles (on a device with
// room for the large tile, with too little for it, and with too many
// multiprocessors for either; wgrad, which splits K instead, takes the large
// tile on the first and third, split on the third),
// 8-byte chunks in place on the compact tile (channels per group multiples of
// 4, or bases 8-byte aligned), the padded copy on the small tile (wgrad:
// compact), and the depthwise kernels (one channel per group) at 8 channels
// a thread and at one, with inputs in fp16, or from sim arch 800 on in bf16
// when i / 21 is odd. The padded path's first cases have channels per group
// that no chunk divides (single channels with more filters than the
// depthwise kernels take among them), padded to 8-byte chunks; later ones
// also misaligned bases (with channel counts that need no padding, too) and
// input channels padded to 16-byte chunks. The depthwise one-channel path
// takes, round by round (i / 21 % 3), channel multipliers, channel counts
// that are not multiples of 8, and misaligned bases. So the first 42 cases launch all 36 kernels there (the
// padded copy's two), 16 the fp16 ones below it. Strides up to 3 give dgrad
// phases that no tap reaches. fprop on 16-byte chunks in place also writes
// its column moments (Conv2dParams::moments) past the first two rounds; the
// batch statistics totalled from them (norm/column_moments.h) are checked
// against those of the output as stored, every block's moments written.
// Their kernels are counted apart (conv_moment_kernels), so that the count
// of the others stays fixed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "conv/depthwise.h"
#include "conv/launch.h"
#include "kernel_sim/conv_reference.h"
#include "kernel_sim/sim_common.h"
#include "norm/column_moments.h"

using namespace mpgemm::kernels;
using sim::Buffer;
using sim::get;
using sim::rnd;

namespace {

// A 16-bit tensor of `count` random elements, its base `offset` elements into its buffer.
struct Input {
  std::unique_ptr<Buffer> mem;
  ElementType type;
  unsigned char* data;
  Input(ElementType type, int64_t count, int64_t offset)
      : mem(std::make_unique<Buffer>((offset + count) * 2)), type(type), data(mem->p + 2 * offset) {
    for (int64_t i = 0; i < count; ++i) sim::set(data, type, i, rnd(-8, 8) / 8.0f);
  }
  double operator[](int64_t i) const { return get(data, type, i); }
};

// `t` refilled with values whose products and sums round (fp16 or bf16
// multiples of 1/997 in [-1.003, 1.003]): two kernels' outputs on them are the same
// bits only where they add the same products in the same order.
void with_rounding_products(const Input& t) {
  for (int64_t i = 0; i < int64_t(t.mem->size) / 2 - (t.data - t.mem->p) / 2; ++i)
    sim::set(t.data, t.type, i, float(rnd(-1000, 1000)) / 997.0f);
}

constexpr int kPaths = 7;
constexpr int kKernelsPerType = 3 * kPaths;
constexpr int kNarrowPath = 3, kPaddedPath = 4, kDepthwiseWidePath = 5, kDepthwisePath = 6;

// One spatial dimension: a window of `taps` taps `dilation` apart, padding
// `pad` before and 0 .. window - 1 after (implied by the output size), an input
// at least one window long with the padding, and `out` outputs `stride` apart.
void dimension(int64_t taps, int stride, int dilation, int& pad, int64_t& in, int64_t& out, int64_t least_extra,
               int64_t extra) {
  const int64_t window = (taps - 1) * dilation + 1;
  pad = int(rnd(0, std::min<int64_t>(window - 1, 4)));
  const int64_t pad_end = rnd(0, std::min<int64_t>(window - 1, 4));
  const int64_t least = std::max<int64_t>(1, window - pad - pad_end);
  in = rnd(least + least_extra, least + extra);
  out = (in + pad + pad_end - window) / stride + 1;
}

const char* const kPassNames[] = {"fprop", "dgrad", "wgrad"};

// A plan's workspace, 16-byte aligned and poisoned with NaN (a reduction
// must read only what its splits wrote); `data()` is null where the plan
// needs none.
struct PoisonedWorkspace {
  size_t bytes;
  std::vector<float> storage;
  explicit PoisonedWorkspace(size_t bytes)
      : bytes(bytes), storage(bytes / sizeof(float) + 4, std::numeric_limits<float>::quiet_NaN()) {}
  void* data() {
    if (bytes == 0) return nullptr;
    return storage.data() + (4 - reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float) % 4) % 4;
  }
};

// How many of the `count` elements of `type` that `out` holds `offset`
// elements into its buffer differ from `want` (plus bias[e % k] where given)
// rounded to the type, plus the bytes of the buffer around them that were
// written (all must stay 0xff); the first three printed, an element as
// `name`[e]. `bad`: the case's errors so far, which count towards the three.
int wrong_output(const Buffer& out, ElementType type, int64_t offset, int64_t count, const std::vector<double>& want,
                 const sim::Bias* bias, int64_t k, const char* name, int bad) {
  const int before = bad;
  for (int64_t e = 0; e < count; ++e) {
    const float expect = sim::rounded(float(want[e]) + (bias ? bias->values[e % k] : 0.0f), type);
    const float got = get(out.p, type, offset + e);
    if (!(got == expect) && bad++ < 3) printf("  %s[%ld] = %g, want %g\n", name, e, got, expect);
  }
  const int64_t esize = sim::bytes_of(type);
  for (int64_t byte = 0; byte < int64_t(out.size); ++byte)
    if ((byte < esize * offset || byte >= esize * (offset + count)) && out.p[byte] != 0xff && bad++ < 3)
      printf("  wrote outside %s, byte %ld of %ld\n", name, byte - esize * offset, esize * count);
  return bad - before;
}

// The plan of `pass` for `a` with the switch `variable` at `value` (unset
// where null) and, where `path` is given, MPGEMM_CONV_PATH at it; both
// unset after, a refused value's too.
Conv2dPlan plan_with_switch(const char* variable, const char* value, ConvPass pass, const Conv2dParams& a,
                            const char* path = nullptr) {
  struct Unset {
    const char* variable;
    bool path;
    ~Unset() {
      unsetenv(variable);
      if (path) unsetenv("MPGEMM_CONV_PATH");
    }
  } unset{variable, path != nullptr};
  if (value) setenv(variable, value, 1);
  else unsetenv(variable);
  if (path) setenv("MPGEMM_CONV_PATH", path, 1);
  return plan_conv2d(pass, a);
}

// A 3x3 depthwise convolution of 16 channels over 9 x 9 pixels (padding 1),
// fp16, whose x and dy are stand-ins no plan reads: the switches' plans.
Conv2dParams depthwise_3x3() {
  Conv2dParams a;
  a.n = 2, a.h = a.w = a.p = a.q = 9, a.c = a.k = a.groups = 16, a.r = a.s = 3, a.pad_top = a.pad_left = 1;
  alignas(16) static const uint64_t storage[2] = {};
  a.x = a.dy = storage;
  a.input_type = ElementType::kFloat16;
  return a;
}

// Whether the plan of `pass` for `a` refuses `variable` at "yes" with an
// error that names it.
bool bad_switch_refused(const char* variable, ConvPass pass, const Conv2dParams& a, const char* path = nullptr) {
  try {
    plan_with_switch(variable, "yes", pass, a, path);
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find(variable) != std::string::npos;
  }
  return false;
}

}  // namespace

int conv_splits_run = 0;
int conv_moment_cases = 0;
std::set<const void*> conv_moment_kernels;

bool conv_case(int index) {
  const ConvPass pass = ConvPass(index % 3);
  const int path = index / 3 % kPaths;
  Conv2dParams a;
  a.input_type = __CUDA_ARCH__ >= 800 && index / kKernelsPerType % 2 ? ElementType::kBFloat16 : ElementType::kFloat16;
  const bool direct = path >= kDepthwiseWidePath;
  // One channel per group, with more filters each than the depthwise kernels take.
  const bool single_channels = path == kPaddedPath && rnd(0, 2) == 0;
  // The cases that must launch every kernel: their channels fix the load width.
  const int round = index / kKernelsPerType;
  const bool first_round = round < 2;
  // The depthwise one-channel path, by round: a channel multiplier, a
  // channel count that is not a multiple of 8, or misaligned bases.
  const int depthwise_kind = round % 3;
  a.groups = single_channels ? rnd(1, 12) : rnd(1, 2);
  // Bases offset by a few elements (misaligned) on the padded and depthwise
  // paths, by 4 (8-byte aligned) on the narrow one.
  const bool offset = path == kNarrowPath      ? rnd(0, 2) == 0
                      : path == kDepthwisePath ? depthwise_kind == 2
                                               : path == kPaddedPath && !first_round && rnd(0, 2) == 0;
  // The padded path's channels per group round up to 4 or 12 (8-byte chunks).
  const int64_t padded_counts[] = {1, 2, 3, 9, 10, 11};
  int64_t cg = 8 * rnd(1, 2), kg = 8 * rnd(1, 3);
  if (direct) {
    // More channels than one block's lanes hold (32 threads across channels):
    // every pass in the first round's bf16 cases, and wgrad's fp16 ones (to split).
    const bool many = first_round ? round == 1 || pass == ConvPass::kWgrad : rnd(0, 3) == 0;
    cg = 1, kg = 1;
    a.groups = path == kDepthwiseWidePath ? 8 * (many ? rnd(33, 36) : rnd(1, 5)) : many ? rnd(33, 70) : rnd(1, 40);
    if (path == kDepthwisePath && depthwise_kind == 0) kg = rnd(2, kDepthwiseMaxFiltersPerGroup);
    if (path == kDepthwisePath && depthwise_kind == 1 && a.groups % 8 == 0) a.groups += rnd(1, 7);
    if (path == kDepthwisePath && depthwise_kind == 2) a.groups = 8 * rnd(1, 5);
  } else if (single_channels) {
    cg = 1, kg = rnd(kDepthwiseMaxFiltersPerGroup + 2, kDepthwiseMaxFiltersPerGroup + 4);  // 17 to 19: padded
  } else if (path == kPaddedPath) {
    cg = padded_counts[rnd(0, 5)], kg = rnd(1, 20);
    // One channel per group with few filters is the depthwise kernels'.
    if (cg == 1 && kg <= kDepthwiseMaxFiltersPerGroup) kg = rnd(kDepthwiseMaxFiltersPerGroup + 2, kDepthwiseMaxFiltersPerGroup + 4);
    if (offset && rnd(0, 1)) cg = 4 * rnd(1, 4), kg = 4 * rnd(1, 5);    // nothing to pad, only to align
    if (!first_round && pass != ConvPass::kDgrad && rnd(0, 2) == 0) cg = rnd(65, 140);  // to 16-byte chunks
  } else if (path == kNarrowPath && !offset) {
    (rnd(0, 1) ? cg : kg) = 4 * (2 * rnd(0, 2) + 1);
  }
  // Sometimes more channels than one tile holds, on the side where channels
  // index the GEMM's N (fprop, dgrad) or M (wgrad): blocks past the first tile.
  // Odd multiples of 4 keep the narrow path's chunks at 8 bytes; the padded
  // path's dgrad keeps its input channels (padded from 64 on to 16-byte chunks).
  const bool unaligned = path == kPaddedPath;
  if (!direct && !single_channels && !(unaligned && pass == ConvPass::kDgrad) && rnd(0, 3) == 0)
    (pass == ConvPass::kDgrad ? cg : kg) =
        unaligned ? rnd(65, 140) : path == kNarrowPath ? 4 * (2 * rnd(8, 17) + 1) : 8 * rnd(9, 17);
  // dgrad's GEMM-K walks its output channels in blocks of the K slice: several.
  if (pass == ConvPass::kDgrad && !direct && !single_channels && rnd(0, 3) == 0)
    kg = unaligned ? rnd(17, 70) : path == kNarrowPath ? 4 * (2 * rnd(4, 17) + 1) : 8 * rnd(5, 17);
  if (index == 12 && kg % 4 == 0) ++kg;  // fprop's output padded, so copied back in fp32
  a.c = a.groups * cg, a.k = a.groups * kg;
  // An empty batch: nothing to do but in wgrad, whose output is then zeros.
  // Kept out of the first 2 * kKernelsPerType cases but for the implicit
  // GEMM's wgrad, which still launches (the depthwise one's empty operands,
  // null, would count as aligned).
  a.n = (!first_round || (pass == ConvPass::kWgrad && !direct)) && rnd(0, 7) == 0 ? 0 : rnd(1, 3);
  if (index == 5 || index == 14 || index == 59) a.n = 0;  // wgrad: 16-byte chunks, padded, depthwise
  const int64_t taps[] = {1, 3, 5};
  a.r = taps[rnd(0, 2)], a.s = taps[rnd(0, 2)];
  a.stride_h = int(rnd(1, 3)), a.stride_w = int(rnd(1, 3));
  a.dilation_h = int(rnd(1, 2)), a.dilation_w = int(rnd(1, 2));
  // The wgrad cases of the small-tile path, the first round's depthwise
  // ones, and a third of the others, have many output pixels (GEMM-K: at
  // least 4 x 11 x 11): enough K slices on every path for the launcher to
  // split K, and enough runs for the depthwise kernels to split them.
  const bool long_k = pass == ConvPass::kWgrad && (index % kKernelsPerType == 8 ||
                                                   (a.n > 0 && ((direct && first_round) || rnd(0, 2) == 0)));
  if (long_k) a.n = rnd(4, 8), a.stride_h = a.stride_w = 1;
  // The first round's depthwise gathers with many channels: enough runs of
  // pixels (at least 3 x 10 rows) that a block of 8 to 15 pixel lanes, alone
  // on a clipped grid, strides over them.
  const bool long_rows = direct && round == 1 && pass != ConvPass::kWgrad;
  if (long_rows) a.n = rnd(3, 4), a.stride_h = 1;
  const bool large = long_k || long_rows;
  dimension(a.r, a.stride_h, a.dilation_h, a.pad_top, a.h, a.p, large ? 10 : 0, large ? 14 : 5);
  dimension(a.s, a.stride_w, a.dilation_w, a.pad_left, a.w, a.q, large ? 10 : 0, large ? 14 : 5);

  // The pass's two operands, one of them offset on the narrow and padded paths.
  const bool uses_x = pass != ConvPass::kDgrad, uses_wt = pass != ConvPass::kWgrad, uses_dy = pass != ConvPass::kFprop;
  int64_t offsets[3] = {0, 0, 0};  // x, wt, dy
  if (offset) {
    const auto shift = [&] { return path == kNarrowPath ? 4 : rnd(1, 7); };
    for (int64_t& o : offsets) o = rnd(0, 1) ? shift() : 0;
    // The depthwise kernels read the filters one at a time: one of the gathered operands.
    const int forced = direct ? (pass == ConvPass::kFprop ? 0 : pass == ConvPass::kDgrad ? 2 : 2 * int(rnd(0, 1)))
                       : pass == ConvPass::kFprop ? int(rnd(0, 1))
                       : pass == ConvPass::kDgrad ? int(rnd(1, 2))
                                                  : 2 * int(rnd(0, 1));
    offsets[forced] = shift();
  }
  const int64_t x_count = a.n * a.h * a.w * a.c, wt_count = a.k * a.r * a.s * cg, dy_count = a.n * a.p * a.q * a.k;
  const Input x(a.input_type, uses_x ? x_count : 0, offsets[0]), wt(a.input_type, uses_wt ? wt_count : 0, offsets[1]),
      dy(a.input_type, uses_dy ? dy_count : 0, offsets[2]);
  // Empty tensors come as null pointers, as torch's often do.
  a.x = uses_x && x_count ? x.data : nullptr, a.wt = uses_wt && wt_count ? wt.data : nullptr;
  a.dy = uses_dy && dy_count ? dy.data : nullptr;

  const sim::Bias bias(pass == ConvPass::kFprop && rnd(0, 3), a.k);
  a.bias = bias.data(), a.bias_type = bias.type;

  a.out_type = sim::any_type();
  if (index == 12) a.out_type = ElementType::kFloat32;  // the padded copy of 4-byte elements, in every run
  const int64_t esize = sim::bytes_of(a.out_type);
  const int64_t count = pass == ConvPass::kFprop ? dy_count : pass == ConvPass::kDgrad ? x_count : wt_count;
  const int64_t out_offset = rnd(0, 1) ? 0 : rnd(1, 3), tail = rnd(0, 2);
  Buffer out(esize * (out_offset + count + tail));
  a.out = out.p + esize * out_offset;

  // Many multiprocessors split the depthwise wgrad's runs (in the first
  // round always), one gives the depthwise gathers few blocks.
  const bool many_multiprocessors = direct ? (first_round ? pass == ConvPass::kWgrad : rnd(0, 1) == 1)
                                           : !(path <= 1 || path == kNarrowPath);
  sim::use_multiprocessors(many_multiprocessors ? 1 << 20 : 1);
  // The compact tile's device: less shared memory per block than the large tile takes.
  const size_t shared_limit = sim::shared_limit;
  if (path == 1) sim::shared_limit = std::min<size_t>(shared_limit, 99 * 1024);
  // Clipped grids: the implicit GEMM's group loop runs more than once, and
  // the depthwise kernels stride over channel tiles and (x) over runs or wgrad's
  // (split, tap) items; always so in the first round.
  const bool clipped = direct && first_round ? true : rnd(0, 1) == 1;
  const unsigned max_grid_y = clipped ? unsigned(rnd(1, 2)) : 65535;
  const unsigned max_grid_x = long_rows ? 1 : direct && clipped ? unsigned(rnd(1, 2)) : 1u << 31;
  sim::max_grid.x = max_grid_x, sim::max_grid.y = max_grid_y;
  // The workspace poisoned: the reduction must read only what the splits
  // wrote. At sim arch 900 the default takes the Hopper convolution where it
  // can (hopper_conv_cases.cpp): these cases are the WMMA kernels'.
  setenv("MPGEMM_CONV_PATH", "wmma", 1);
  const Conv2dPlan plan = plan_conv2d(pass, a);
  const int64_t rows = a.n * a.p * a.q, blocks = column_moment_blocks(rows, plan.moment_rows);
  std::vector<float> moments(2 * blocks * a.k, std::numeric_limits<float>::quiet_NaN());
  // Past the first two rounds, which must launch every kernel without moments.
  const bool with_moments = plan.moment_rows > 0 && rows > 0 && !first_round;
  if (with_moments) a.moments = moments.data();
  const size_t workspace_bytes = plan.workspace_bytes;
  PoisonedWorkspace workspace(workspace_bytes);
  const std::set<const void*> launched_before = sim::launched;
  const cudaError_t err = launch_conv2d(pass, a, plan, workspace.data(), nullptr);
  unsetenv("MPGEMM_CONV_PATH");
  // The launcher took the path the case was built for. A padded-path case
  // may draw channels and bases that need no copy (multiples of 4 or 8, an
  // empty batch's null operands); it then runs in place.
  const Conv2dPlan::Path want_path = direct                ? Conv2dPlan::Path::kDepthwise
                                     : path == kPaddedPath ? Conv2dPlan::Path::kPadded
                                                           : Conv2dPlan::Path::kImplicitGemm;
  const bool wrong_path =
      plan.path != want_path && !(path == kPaddedPath && plan.path == Conv2dPlan::Path::kImplicitGemm);
  if (wrong_path) printf("  planned path %d, built for %d\n", int(plan.path), int(want_path));
  // The implicit GEMM's wgrad split in place (its workspace is the partials alone).
  conv_splits_run += pass == ConvPass::kWgrad && plan.path == Conv2dPlan::Path::kImplicitGemm && workspace_bytes > 0;
  sim::max_grid.x = 1u << 31, sim::max_grid.y = 65535;
  sim::shared_limit = shared_limit;

  const auto at = [](const Input& t) { return [&t](int64_t i) { return t[i]; }; };
  const std::vector<double> want = sim::conv_reference(pass, a, at(x), at(wt), at(dy), count);

  int bad = err != cudaSuccess || wrong_path;
  bad += wrong_output(out, a.out_type, out_offset, count, want, &bias, a.k, "out", bad);
  if (with_moments) {
    ++conv_moment_cases;
    bad += sim::statistics_off(out.p + esize * out_offset, a.out_type, rows, a.k, moments, plan.moment_rows);
    // What this case launched first: the kernels that write moments, and their total's.
    for (auto it = sim::launched.begin(); it != sim::launched.end();) {
      if (launched_before.count(*it)) {
        ++it;
      } else {
        conv_moment_kernels.insert(*it);
        it = sim::launched.erase(it);
      }
    }
  }
  if (bad)
    printf("conv case %d FAILED: err=%d %s n=%ld h=%ld w=%ld c=%ld k=%ld r=%ld s=%ld p=%ld q=%ld groups=%ld stride=%d,%d "
           "pad_top=%d pad_left=%d dilation=%d,%d offsets(x,wt,dy,out)=%ld,%ld,%ld,%ld input_type=%d bias=%d "
           "bias_type=%d out_type=%d multiprocessors=%d max_grid=%u,%u workspace=%zu moments=%d\n",
           index, int(err), kPassNames[index % 3], a.n, a.h, a.w, a.c, a.k, a.r, a.s, a.p, a.q, a.groups, a.stride_h,
           a.stride_w, a.pad_top, a.pad_left, a.dilation_h, a.dilation_w, offsets[0], offsets[1], offsets[2], out_offset,
           int(a.input_type), bias.present, int(a.bias_type), int(a.out_type), sim::multiprocessors, max_grid_x, max_grid_y,
           workspace_bytes, int(with_moments));
  return bad;
}

// Depthwise wgrad on the sliding window (conv/depthwise_sliding_wgrad.cuh,
// MPGEMM_DEPTHWISE_SLIDING_WGRAD=1), through launch_conv2d as conv_case runs
// it: case i takes filter rows of {3, 5, 7}[i % 3] taps at column stride
// i / 3 % 2 + 1, in fp16 or (from sim arch 800 on, where i / 6 is odd) bf16,
// so that 12 cases launch its 12 kernels (6 at sim arch 750). Each draws
// any row stride and dilation, paddings that leave x, images narrower than
// the window, and bases 8-byte but not 16-byte aligned in one case in two.
// By index (i % 4): 1 splits its output rows (6 to 8 filter rows over 132
// to 160 channels, two tiles of lanes, on many multiprocessors, at least 4
// output rows of at least 17 pixels; case 5 on a grid clipped to one block
// of each, which strides over splits and tiles); 3 has 11 or 12 filter rows
// over 96 to 128 channels (two tiles: a block holds at most 256 / R lanes);
// the rest 1 to 8 rows, and past 32 lanes of channels in one case in three. The plan must take the sliding window, and every element of dw
// must match. The counts of cases that split, split on a clipped grid and
// strode over tiles are kept for the driver's report.
int sliding_split_cases = 0, sliding_clipped_split_cases = 0, sliding_tile_stride_cases = 0;

bool depthwise_sliding_case(int index) {
  Conv2dParams a;
  a.input_type = __CUDA_ARCH__ >= 800 && index / 6 % 2 ? ElementType::kBFloat16 : ElementType::kFloat16;
  const int64_t row_taps[] = {3, 5, 7};
  const bool split = index % 4 == 1, tall = index % 4 == 3;
  a.s = row_taps[index % 3], a.stride_w = index / 3 % 2 + 1, a.dilation_w = 1;
  a.r = split ? rnd(6, 8) : tall ? rnd(11, 12) : rnd(1, 8);
  a.stride_h = split ? 1 : int(rnd(1, 3)), a.dilation_h = int(rnd(1, 2));
  const bool many_channels = split || tall || rnd(0, 2) == 0;
  a.groups = 4 * (tall ? rnd(24, 32) : many_channels ? rnd(33, 40) : rnd(1, 12)), a.c = a.k = a.groups;
  a.n = split ? rnd(2, 3) : many_channels ? 1 : rnd(1, 3);
  // A split case: output rows of at least 16 pixels (a pixel lane's least is one row) and at least 4 of them.
  dimension(a.r, a.stride_h, a.dilation_h, a.pad_top, a.h, a.p, split ? 3 : 0, split ? 5 : many_channels ? 4 : 9);
  dimension(a.s, a.stride_w, a.dilation_w, a.pad_left, a.w, a.q, split ? 16 * a.stride_w : 0,
            split ? 18 * a.stride_w : many_channels ? 6 : 14);
  const int64_t x_offset = 4 * rnd(0, 1), dy_offset = 4 * rnd(0, 1);
  const int64_t x_count = a.n * a.h * a.w * a.c, dy_count = a.n * a.p * a.q * a.k, count = a.k * a.r * a.s;
  const Input x(a.input_type, x_count, x_offset), dy(a.input_type, dy_count, dy_offset);
  a.x = x.data, a.dy = dy.data;
  a.out_type = sim::any_type();
  const int64_t esize = sim::bytes_of(a.out_type), out_offset = rnd(0, 1) ? 0 : rnd(1, 3), tail = rnd(0, 2);
  Buffer out(esize * (out_offset + count + tail));
  a.out = out.p + esize * out_offset;

  sim::use_multiprocessors(split || rnd(0, 2) ? 1 << 20 : 1);
  const bool clipped = split ? index == 5 : rnd(0, 1) == 1;
  sim::max_grid.x = clipped ? (index == 5 ? 1 : unsigned(rnd(1, 2))) : 1u << 31, sim::max_grid.y = clipped ? 1 : 65535;
  setenv("MPGEMM_CONV_PATH", "wmma", 1);
  setenv("MPGEMM_DEPTHWISE_SLIDING_WGRAD", "1", 1);
  const Conv2dPlan plan = plan_conv2d(ConvPass::kWgrad, a);
  PoisonedWorkspace workspace(plan.workspace_bytes);
  const cudaError_t err = launch_conv2d(ConvPass::kWgrad, a, plan, workspace.data(), nullptr);
  unsetenv("MPGEMM_DEPTHWISE_SLIDING_WGRAD");
  unsetenv("MPGEMM_CONV_PATH");
  const unsigned max_grid_x = sim::max_grid.x, max_grid_y = sim::max_grid.y;
  sim::max_grid.x = 1u << 31, sim::max_grid.y = 65535;
  const DepthwisePlan& dw_plan = plan.depthwise;
  sliding_split_cases += dw_plan.splits > 1;
  sliding_clipped_split_cases += dw_plan.splits > int64_t(max_grid_x);
  sliding_tile_stride_cases += dw_plan.channel_tiles > int64_t(max_grid_y);

  const auto at = [](const Input& t) { return [&t](int64_t i) { return t[i]; }; };
  const auto none = [](int64_t) { return 0.0; };
  const std::vector<double> want = sim::conv_reference(ConvPass::kWgrad, a, at(x), none, at(dy), count);
  const bool sliding = plan.path == Conv2dPlan::Path::kDepthwise && dw_plan.sliding;
  const bool unlike = !sliding || (split && dw_plan.splits < 2) || ((split || tall) && dw_plan.channel_tiles != 2);
  int bad = err != cudaSuccess || unlike;
  if (unlike)
    printf("  planned path %d, sliding %d, splits %d, tiles %ld\n", int(plan.path), int(dw_plan.sliding),
           dw_plan.splits, dw_plan.channel_tiles);
  bad += wrong_output(out, a.out_type, out_offset, count, want, nullptr, a.k, "dw", bad);
  if (bad)
    printf("depthwise sliding case %d FAILED: err=%d n=%ld h=%ld w=%ld c=%ld r=%ld s=%ld p=%ld q=%ld stride=%d,%d "
           "pad_top=%d pad_left=%d dilation_h=%d offsets(x,dy,out)=%ld,%ld,%ld input_type=%d out_type=%d "
           "multiprocessors=%d max_grid=%u,%u splits=%d tiles=%ld\n",
           index, int(err), a.n, a.h, a.w, a.c, a.r, a.s, a.p, a.q, a.stride_h, a.stride_w, a.pad_top, a.pad_left,
           a.dilation_h, x_offset, dy_offset, out_offset, int(a.input_type), int(a.out_type), sim::multiprocessors,
           max_grid_x, max_grid_y, dw_plan.splits, dw_plan.channel_tiles);
  return bad;
}

// The switch: "0" or unset leaves a shape the window fits to the
// tap-per-block kernel, "1" takes the window, a column dilation is the
// tap-per-block kernel's at "1" too, and any value but "", "0" and "1" is
// refused, naming the variable, by the plan of any convolution (a 3x3 of
// one group here). And the launcher refuses a sliding plan for a shape it
// was not made for (5 taps a row where it was made for 3). Returns whether
// any of that went wrong.
bool depthwise_sliding_switch_wrong() {
  Conv2dParams a = depthwise_3x3();
  const auto sliding = [&](const char* value) {
    const Conv2dPlan plan = plan_with_switch("MPGEMM_DEPTHWISE_SLIDING_WGRAD", value, ConvPass::kWgrad, a);
    return plan.path == Conv2dPlan::Path::kDepthwise && plan.depthwise.sliding;
  };
  bool wrong = sliding(nullptr) || sliding("0") || !sliding("1");
  sim::use_multiprocessors(1);  // one split: no workspace to ask for
  const DepthwisePlan three = plan_depthwise(ConvPass::kWgrad, a, true, false);
  Conv2dParams five = a;
  five.s = 5, five.pad_left = 2;
  wrong |= !three.sliding || launch_depthwise(ConvPass::kWgrad, five, three, nullptr, nullptr) != cudaErrorInvalidValue;
  a.dilation_w = 2, a.q = 7;
  wrong |= sliding("1");
  a.groups = 1, a.k = 24, a.dilation_w = 1, a.q = 9;  // not depthwise: the switch is read all the same
  const bool refused = bad_switch_refused("MPGEMM_DEPTHWISE_SLIDING_WGRAD", ConvPass::kWgrad, a);
  if (wrong || !refused) printf("  the sliding wgrad's switch: plans wrong %d, bad value refused %d\n", int(wrong), int(refused));
  return wrong || !refused;
}

// The depthwise gather on the sliding window
// (conv/depthwise_sliding_gather.cuh, MPGEMM_DEPTHWISE_SLIDING_GATHER=1),
// through launch_conv2d as conv_case runs it: case i takes filter rows of
// {3, 5, 7}[i % 3] taps, fprop at column stride 1 or 2 or dgrad (at column
// stride 1, any row stride) by i / 3 % 3, in fp16 or (from sim arch 800 on,
// where i / 9 is odd) bf16, so that 18 cases launch its 18 kernels (9 at
// sim arch 750). Each draws 1 to 7 filter rows, row strides and dilations,
// paddings that leave the source, images narrower than the window, a bias
// (fprop, one case in two); by index (i % 4): 3 has 264 to 320 channels
// (two tiles of lanes: a tile holds at most 256), 1 runs on a grid clipped
// to one block across runs and channel tiles, the rest 8 to 96 channels.
// The plan must take the sliding gather, and every element of the output
// must match; run again on inputs whose products round, its output must be
// the gather kernel's (the switch off) bit for bit. Cases on two tiles are
// counted for the driver's report.
int gather_two_tile_cases = 0;

bool depthwise_sliding_gather_case(int index) {
  const int kind = index / 3 % 3;
  const ConvPass pass = kind == 2 ? ConvPass::kDgrad : ConvPass::kFprop;
  Conv2dParams a;
  a.input_type = __CUDA_ARCH__ >= 800 && index / 9 % 2 ? ElementType::kBFloat16 : ElementType::kFloat16;
  const int64_t row_taps[] = {3, 5, 7};
  a.s = row_taps[index % 3], a.stride_w = kind == 1 ? 2 : 1, a.dilation_w = 1;
  a.r = rnd(1, 7), a.stride_h = int(rnd(1, 2)), a.dilation_h = int(rnd(1, 2));
  a.groups = 8 * (index % 4 == 3 ? rnd(33, 40) : rnd(1, 12)), a.c = a.k = a.groups;
  a.n = rnd(1, 2);
  dimension(a.r, a.stride_h, a.dilation_h, a.pad_top, a.h, a.p, 0, 5);
  dimension(a.s, a.stride_w, a.dilation_w, a.pad_left, a.w, a.q, 0, 9 * a.stride_w);
  const bool dgrad = pass == ConvPass::kDgrad;
  const int64_t x_count = a.n * a.h * a.w * a.c, wt_count = a.k * a.r * a.s, dy_count = a.n * a.p * a.q * a.k;
  const Input x(a.input_type, dgrad ? 0 : x_count, 0), wt(a.input_type, wt_count, 0),
      dy(a.input_type, dgrad ? dy_count : 0, 0);
  a.x = dgrad ? nullptr : x.data, a.wt = wt.data, a.dy = dgrad ? dy.data : nullptr;
  const sim::Bias bias(!dgrad && rnd(0, 1), a.k);
  a.bias = bias.data(), a.bias_type = bias.type;
  a.out_type = sim::any_type();
  const int64_t esize = sim::bytes_of(a.out_type), count = dgrad ? x_count : dy_count;
  const int64_t out_offset = rnd(0, 1) ? 0 : rnd(1, 3), tail = rnd(0, 2);

  sim::use_multiprocessors(rnd(0, 1) ? 1 << 20 : 1);
  const bool clipped = rnd(0, 2) == 0;
  sim::max_grid.x = clipped ? 1 : 1u << 31, sim::max_grid.y = clipped ? 1 : 65535;
  setenv("MPGEMM_CONV_PATH", "wmma", 1);
  // The switch off (the gather kernel), then on.
  Buffer outs[2] = {Buffer(esize * (out_offset + count + tail)), Buffer(esize * (out_offset + count + tail))};
  Conv2dPlan plans[2];
  cudaError_t err = cudaSuccess;
  const auto run_both = [&] {
    for (int on = 0; on < 2; ++on) {
      setenv("MPGEMM_DEPTHWISE_SLIDING_GATHER", on ? "1" : "0", 1);
      a.out = outs[on].p + esize * out_offset;
      plans[on] = plan_conv2d(pass, a);
      if (const cudaError_t e = launch_conv2d(pass, a, plans[on], nullptr, nullptr); e != cudaSuccess) err = e;
    }
    unsetenv("MPGEMM_DEPTHWISE_SLIDING_GATHER");
  };
  run_both();
  const auto at = [](const Input& t) { return [&t](int64_t i) { return t[i]; }; };
  const std::vector<double> want = sim::conv_reference(pass, a, at(x), at(wt), at(dy), count);
  // Then again on inputs whose products round (every sum above is exact in any order): the same bits from
  // both kernels say that the window adds the same products in the same order.
  Buffer exact(outs[1].size);
  memcpy(exact.p, outs[1].p, exact.size);
  for (const Input* t : {&x, &wt, &dy}) with_rounding_products(*t);
  run_both();
  unsetenv("MPGEMM_CONV_PATH");
  const unsigned max_grid_x = sim::max_grid.x;
  sim::max_grid.x = 1u << 31, sim::max_grid.y = 65535;

  const bool unlike = plans[1].path != Conv2dPlan::Path::kDepthwise || !plans[1].depthwise.sliding_gather ||
                      plans[0].depthwise.sliding_gather;
  int bad = err != cudaSuccess || unlike;
  if (unlike)
    printf("  planned path %d, sliding gather %d (switch off: %d)\n", int(plans[1].path),
           int(plans[1].depthwise.sliding_gather), int(plans[0].depthwise.sliding_gather));
  bad += wrong_output(exact, a.out_type, out_offset, count, want, dgrad ? nullptr : &bias, a.k, "out", bad);
  if (memcmp(outs[0].p, outs[1].p, outs[0].size) != 0 && bad++ < 3) printf("  not the gather kernel's bits\n");
  if (bad)
    printf("depthwise sliding gather case %d FAILED: err=%d %s n=%ld h=%ld w=%ld c=%ld r=%ld s=%ld p=%ld q=%ld "
           "stride=%d,%d pad_top=%d pad_left=%d dilation_h=%d input_type=%d bias=%d out_type=%d "
           "multiprocessors=%d max_grid_x=%u tiles=%ld\n",
           index, int(err), kPassNames[int(pass)], a.n, a.h, a.w, a.c, a.r, a.s, a.p, a.q, a.stride_h, a.stride_w,
           a.pad_top, a.pad_left, a.dilation_h, int(a.input_type), bias.present, int(a.out_type), sim::multiprocessors,
           max_grid_x, plans[1].depthwise.channel_tiles);
  gather_two_tile_cases += plans[1].depthwise.channel_tiles > 1;
  return bad;
}

// The launcher's own check of a launch's window: plans made without the
// window (fprop with a column dilation of 2, which no kernel of the window
// takes; dgrad at column stride 2 over 5 taps a row, whose column phase of
// 3 taps, 2 apart in the filter, one does and whose phase of 2 none does),
// then forced to allow it, on inputs whose products round, must give the
// plans' bits (the gather kernel's) for fp16 with 24 channels, the forced
// dgrad launching one kernel of the window and fprop none. Returns whether
// any of that went wrong.
bool depthwise_sliding_gather_forced_wrong() {
  bool wrong = false;
  for (const ConvPass pass : {ConvPass::kFprop, ConvPass::kDgrad}) {
    const bool dgrad = pass == ConvPass::kDgrad;
    Conv2dParams a;
    a.input_type = ElementType::kFloat16;
    a.n = 2, a.c = a.k = a.groups = 24, a.r = 3, a.s = dgrad ? 5 : 3;
    a.stride_h = 1, a.stride_w = dgrad ? 2 : 1, a.dilation_h = 1, a.dilation_w = dgrad ? 1 : 2;
    dimension(a.r, a.stride_h, a.dilation_h, a.pad_top, a.h, a.p, 2, 6);
    dimension(a.s, a.stride_w, a.dilation_w, a.pad_left, a.w, a.q, 4, 12);
    const int64_t x_count = a.n * a.h * a.w * a.c, dy_count = a.n * a.p * a.q * a.k;
    const Input x(a.input_type, dgrad ? 0 : x_count, 0), wt(a.input_type, a.k * a.r * a.s, 0),
        dy(a.input_type, dgrad ? dy_count : 0, 0);
    for (const Input* t : {&x, &wt, &dy}) with_rounding_products(*t);
    a.x = dgrad ? nullptr : x.data, a.wt = wt.data, a.dy = dgrad ? dy.data : nullptr;
    a.out_type = ElementType::kFloat32;
    const int64_t count = dgrad ? x_count : dy_count;
    Buffer outs[2] = {Buffer(4 * count), Buffer(4 * count)};
    Conv2dPlan plan = plan_with_switch("MPGEMM_DEPTHWISE_SLIDING_GATHER", "1", pass, a, "wmma");
    wrong |= plan.path != Conv2dPlan::Path::kDepthwise || plan.depthwise.sliding_gather;
    // The kernels each launch ran, apart from those launched before (kept).
    const std::set<const void*> before = sim::launched;
    size_t kernels[2];
    for (int forced = 0; forced < 2; ++forced) {
      plan.depthwise.sliding_gather = forced;
      a.out = outs[forced].p;
      sim::launched.clear();
      wrong |= launch_conv2d(pass, a, plan, nullptr, nullptr) != cudaSuccess;
      kernels[forced] = sim::launched.size();
    }
    sim::launched.insert(before.begin(), before.end());
    wrong |= memcmp(outs[0].p, outs[1].p, outs[0].size) != 0 || kernels[0] != 1 || kernels[1] != 1 + dgrad;
  }
  if (wrong) printf("  plans forced to allow the window where they had not: wrong\n");
  return wrong;
}

// The sliding gather's switch: "0" or unset leaves a shape its window fits
// to the gather kernel, "1" takes the window; a column dilation, dgrad at
// column stride 2 and wgrad stay off it at "1"; any value but "", "0" and
// "1" is refused, naming the variable, by the plan of any convolution (a
// 3x3 of one group here). Returns whether any of that went wrong.
bool depthwise_sliding_gather_switch_wrong() {
  Conv2dParams a = depthwise_3x3();
  const auto sliding = [&](ConvPass pass, const char* value) {
    const Conv2dPlan plan = plan_with_switch("MPGEMM_DEPTHWISE_SLIDING_GATHER", value, pass, a);
    return plan.path == Conv2dPlan::Path::kDepthwise && plan.depthwise.sliding_gather;
  };
  bool wrong = sliding(ConvPass::kFprop, nullptr) || sliding(ConvPass::kFprop, "0") || !sliding(ConvPass::kFprop, "1");
  wrong |= !sliding(ConvPass::kDgrad, "1") || sliding(ConvPass::kWgrad, "1");
  a.stride_w = 2, a.q = 5;
  wrong |= !sliding(ConvPass::kFprop, "1") || sliding(ConvPass::kDgrad, "1");
  a.stride_w = 1, a.dilation_w = 2, a.q = 7;
  wrong |= sliding(ConvPass::kFprop, "1");
  a.groups = 1, a.k = 24, a.dilation_w = 1, a.q = 9;  // not depthwise: the switch is read all the same
  const bool refused = bad_switch_refused("MPGEMM_DEPTHWISE_SLIDING_GATHER", ConvPass::kFprop, a);
  if (wrong || !refused)
    printf("  the sliding gather's switch: plans wrong %d, bad value refused %d\n", int(wrong), int(refused));
  return wrong || !refused;
}

// The 128 x 16 tile (common/tile_configs.h's N16Tile,
// MPGEMM_CONV_N16_TILE=1) through launch_conv2d as conv_case runs it: case
// i is fprop (even i) or dgrad (odd), in fp16 or, from sim arch 800 on
// where i / 2 is odd, bf16; the pass's N (filters or channels per group)
// and its load path by kind i / 4 % 4: 8 or 16 in place on 16-byte chunks,
// without and (fprop) with the column moments, 4 or 12 in place on 8-byte
// chunks, and 2 to 15 but for 4, 8 and 12 on the padded copy (rounded up
// to 4 to 16; bases misaligned in one case in two), so that 16 cases launch
// the tile's 10 kernels; below its arch (sim arch 750) the plan must give
// them to other tiles. Each draws 1 to 3 groups (the grid's groups
// clipped to 1 or 2 in one case in two), windows of 1 to 7 taps, strides 1
// to 3 (dgrad phases that no tap reaches), dilations, paddings and images
// of 1 to 5 row tiles (every third case 4 images at stride 1: several),
// and GEMM-K's other side (input channels, dgrad's output channels) up to
// 72 (at least 2 on the padded copy): several K slices. Case 9, dgrad on 8-byte chunks, has 36 to 72
// output channels (two chunk rows of a thread's filters); case 13 is a
// first layer's dgrad: 3 channels, 64 filters, 7x7 at stride 2. The plan
// must take the tile, and every element of the output must match. Counted
// for the driver's report: cases on more than one row tile.
int n16_multi_tile_cases = 0;
// Channel counts that no 8-byte chunk divides: the padded copy's (single
// channels with few filters are the depthwise kernels').
constexpr int64_t kUnpadded[] = {2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15};

bool n16_tile_case(int index) {
  const ConvPass pass = index % 2 ? ConvPass::kDgrad : ConvPass::kFprop;
  const int kind = index / 4 % 4;
  const bool padded = kind == 3, moments = kind == 1 && pass == ConvPass::kFprop;
  Conv2dParams a;
  a.input_type = __CUDA_ARCH__ >= 800 && index / 2 % 2 ? ElementType::kBFloat16 : ElementType::kFloat16;
  a.groups = rnd(1, 3);
  // N, the pass's channels per group on the output side, and the other side (part of GEMM-K).
  int64_t n_side, k_side;
  if (kind <= 1) n_side = 8 * rnd(1, 2), k_side = 8 * rnd(1, 9);
  else if (kind == 2) n_side = 4 * (2 * rnd(0, 1) + 1), k_side = 4 * (index == 9 ? rnd(9, 18) : rnd(1, 18));
  else n_side = kUnpadded[rnd(0, 10)], k_side = rnd(2, 72);
  const int64_t taps[] = {1, 3, 5, 7};
  a.r = taps[rnd(0, 3)], a.s = taps[rnd(0, 3)];
  a.stride_h = int(rnd(1, 3)), a.stride_w = int(rnd(1, 3));
  a.dilation_h = int(rnd(1, 2)), a.dilation_w = int(rnd(1, 2));
  a.n = rnd(1, 3);
  // Every third case on several row tiles: 4 images of at least 7 x 7 output pixels, at stride 1.
  const bool tall = index % 3 == 0;
  if (tall) a.n = 4, a.stride_h = a.stride_w = 1;
  if (index == 13) {
    a.groups = 1, n_side = 3, k_side = 64, a.r = a.s = 7, a.stride_h = a.stride_w = 2, a.dilation_h = a.dilation_w = 1;
    a.n = 2;
  }
  (pass == ConvPass::kFprop ? a.k : a.c) = a.groups * n_side;
  (pass == ConvPass::kFprop ? a.c : a.k) = a.groups * k_side;
  dimension(a.r, a.stride_h, a.dilation_h, a.pad_top, a.h, a.p, tall ? 6 : 2, tall ? 9 : 8);
  dimension(a.s, a.stride_w, a.dilation_w, a.pad_left, a.w, a.q, tall ? 6 : 2, tall ? 9 : 8);
  if (index == 13) a.pad_top = a.pad_left = 3, a.h = a.w = rnd(9, 16), a.p = a.q = (a.h + 6 - 7) / 2 + 1;

  const bool offset = padded && rnd(0, 1);
  const int64_t cg = a.c / a.groups;
  const int64_t x_count = a.n * a.h * a.w * a.c, wt_count = a.k * a.r * a.s * cg, dy_count = a.n * a.p * a.q * a.k;
  const bool fprop = pass == ConvPass::kFprop;
  const Input x(a.input_type, fprop ? x_count : 0, offset ? rnd(1, 7) : 0),
      wt(a.input_type, wt_count, offset ? rnd(1, 7) : 0), dy(a.input_type, fprop ? 0 : dy_count, offset ? rnd(1, 7) : 0);
  a.x = fprop ? x.data : nullptr, a.wt = wt.data, a.dy = fprop ? nullptr : dy.data;
  const sim::Bias bias(fprop && rnd(0, 1), a.k);
  a.bias = bias.data(), a.bias_type = bias.type;
  a.out_type = sim::any_type();
  const int64_t esize = sim::bytes_of(a.out_type), count = fprop ? dy_count : x_count;
  const int64_t out_offset = rnd(0, 1) ? 0 : rnd(1, 3), tail = rnd(0, 2);
  Buffer out(esize * (out_offset + count + tail));
  a.out = out.p + esize * out_offset;

  sim::use_multiprocessors(rnd(0, 1) ? 1 << 20 : 1);
  const unsigned max_grid_y = rnd(0, 1) ? unsigned(rnd(1, 2)) : 65535;
  sim::max_grid.y = max_grid_y;
  setenv("MPGEMM_CONV_PATH", "wmma", 1);
  setenv("MPGEMM_CONV_N16_TILE", "1", 1);
  const Conv2dPlan plan = plan_conv2d(pass, a);
  unsetenv("MPGEMM_CONV_N16_TILE");
  unsetenv("MPGEMM_CONV_PATH");
  const int64_t rows = a.n * a.p * a.q, blocks = column_moment_blocks(rows, plan.moment_rows);
  std::vector<float> moment_sums(2 * blocks * a.k, std::numeric_limits<float>::quiet_NaN());
  if (moments) a.moments = moment_sums.data();
  PoisonedWorkspace workspace(plan.workspace_bytes);
  const cudaError_t err = launch_conv2d(pass, a, plan, workspace.data(), nullptr);
  sim::max_grid.y = 65535;
  const int64_t gemm_rows = fprop ? rows : a.n * a.h * a.w;
  n16_multi_tile_cases += gemm_rows > tile_config(TileConfigId::kN16).block_m;

  const auto at = [](const Input& t) { return [&t](int64_t i) { return t[i]; }; };
  const std::vector<double> want = sim::conv_reference(pass, a, at(x), at(wt), at(dy), count);
  // Below the tile's arch another tile takes the case. The padded copy's chunks are 8 or 16 bytes, as its
  // padded channels allow.
  const bool runs = __CUDA_ARCH__ >= 10 * tile_config(TileConfigId::kN16).min_arch;
  const bool unlike = plan.path != (padded ? Conv2dPlan::Path::kPadded : Conv2dPlan::Path::kImplicitGemm) ||
                      (plan.tiles.tile == TileConfigId::kN16) != runs ||
                      (!padded && plan.tiles.vector != (kind == 2 ? 4 : 8)) || (moments && plan.moment_rows == 0);
  if (unlike)
    printf("  planned path %d, tile %d, vector %d, moment rows %d\n", int(plan.path), int(plan.tiles.tile),
           plan.tiles.vector, plan.moment_rows);
  int bad = err != cudaSuccess || unlike;
  bad += wrong_output(out, a.out_type, out_offset, count, want, &bias, a.k, fprop ? "y" : "dx", bad);
  if (moments) bad += sim::statistics_off(out.p + esize * out_offset, a.out_type, rows, a.k, moment_sums, plan.moment_rows);
  if (bad)
    printf("n16 tile case %d FAILED: err=%d %s n=%ld h=%ld w=%ld c=%ld k=%ld r=%ld s=%ld p=%ld q=%ld groups=%ld "
           "stride=%d,%d pad_top=%d pad_left=%d dilation=%d,%d offset=%d input_type=%d bias=%d out_type=%d "
           "max_grid_y=%u moments=%d\n",
           index, int(err), kPassNames[int(pass)], a.n, a.h, a.w, a.c, a.k, a.r, a.s, a.p, a.q, a.groups, a.stride_h,
           a.stride_w, a.pad_top, a.pad_left, a.dilation_h, a.dilation_w, int(offset), int(a.input_type),
           bias.present, int(a.out_type), max_grid_y, int(moments));
  return bad;
}

// The switch: unset or "0" leaves a 16-filter fprop on the tiles it took
// before, "1" takes the 128 x 16 tile (from its arch on), which it does not
// for 24 filters (wider than the tile) or for wgrad; any other value is
// refused, naming the variable, by the plan of any convolution. Returns
// whether any of that went wrong.
bool n16_switch_wrong() {
  Conv2dParams a;
  a.n = 2, a.h = a.w = a.p = a.q = 9, a.c = 32, a.k = 16, a.groups = 1, a.r = a.s = 3, a.pad_top = a.pad_left = 1;
  alignas(16) static const uint64_t storage[2] = {};  // stand-ins for the operands, never read
  a.x = a.wt = a.dy = storage;
  a.input_type = ElementType::kFloat16;
  const auto narrow = [&](ConvPass pass, const char* value) {
    const Conv2dPlan plan = plan_with_switch("MPGEMM_CONV_N16_TILE", value, pass, a, "wmma");
    return plan.path == Conv2dPlan::Path::kImplicitGemm && plan.tiles.tile == TileConfigId::kN16;
  };
  const bool runs = __CUDA_ARCH__ >= 10 * tile_config(TileConfigId::kN16).min_arch;
  bool wrong = narrow(ConvPass::kFprop, nullptr) || narrow(ConvPass::kFprop, "0") ||
               narrow(ConvPass::kFprop, "1") != runs || narrow(ConvPass::kWgrad, "1");
  a.k = 24;
  wrong |= narrow(ConvPass::kFprop, "1");
  const bool refused = bad_switch_refused("MPGEMM_CONV_N16_TILE", ConvPass::kDgrad, a, "wmma");
  if (wrong || !refused) printf("  the n16 tile's switch: plans wrong %d, bad value refused %d\n", int(wrong), int(refused));
  return wrong || !refused;
}
