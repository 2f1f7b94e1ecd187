// 1x1 convolutions at stride 1 without padding run as GEMMs
// (MPGEMM_CONV_PATH=gemm: conv/launch.h's one_by_one_gemm), for both
// drivers: at sim arch 750 and 800 (driver.cpp) on the WMMA tiles, at 900
// (hopper_cases.cpp) on the Hopper GEMM where its copy engine can describe
// the operands. Case i runs pass i % 3; channels and filters multiples of 8
// in two cases of three (16-byte loads, the Hopper kernels), any count in
// the third (the GEMM's narrower loads); a device of one multiprocessor
// (where the Hopper GEMM takes whole chunks at 900) or of 132, where
// wgrad's long K (all the pixels) splits on WMMA tiles; fprop
// with a bias now and then; outputs of any type (the GEMM stores all
// three). Every case must plan the GEMM and match the convolution
// reference exactly; a 1x1 with a stride or padding, and a 3x3, must not
// take it. Inputs are multiples of 1/8, so results are exact.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "conv/launch.h"
#include "kernel_sim/conv_gemm_cases.h"
#include "kernel_sim/conv_reference.h"
#include "kernel_sim/sim_common.h"

using namespace mpgemm::kernels;
using sim::rnd;

bool conv_gemm_case(int index, ConvGemmCounts& counts) {
  const auto pass = ConvPass(index % 3);
  const bool whole_chunks = index / 3 % 3 != 2;
  Conv2dParams p;
  p.input_type = sim::input_type();
  p.n = rnd(1, 3), p.h = rnd(1, 9), p.w = rnd(1, 9), p.r = p.s = 1;
  p.c = whole_chunks ? 8 * rnd(1, 12) : rnd(1, 40), p.k = whole_chunks ? 8 * rnd(1, 12) : rnd(1, 40);
  if (pass == ConvPass::kWgrad && index / 3 % 2 == 0) p.n = rnd(4, 6), p.h = p.w = rnd(12, 16);  // long K
  p.p = p.h, p.q = p.w;
  // Every other triple of cases on one multiprocessor (the Hopper GEMM's at 900), the rest on 132.
  sim::use_multiprocessors(index / 3 % 2 ? 1 : 132);
  const int64_t x_size = p.n * p.h * p.w * p.c, w_size = p.k * p.c, y_size = p.n * p.p * p.q * p.k;
  const int64_t count = pass == ConvPass::kFprop ? y_size : pass == ConvPass::kDgrad ? x_size : w_size;
  sim::Buffer x(x_size * 2), w(w_size * 2), dy(y_size * 2);
  for (auto [buffer, size] : {std::pair{&x, x_size}, {&w, w_size}, {&dy, y_size}})
    for (int64_t i = 0; i < size; ++i) sim::set(buffer->p, p.input_type, i, rnd(-8, 8) / 8.0f);
  p.out_type = sim::any_type();
  const int64_t esize = sim::bytes_of(p.out_type), tail = rnd(0, 3);
  sim::Buffer out(esize * (count + tail));
  const sim::Bias bias(pass == ConvPass::kFprop && rnd(0, 2) == 0, p.k);
  p.x = pass != ConvPass::kDgrad ? x.p : nullptr, p.wt = pass != ConvPass::kWgrad ? w.p : nullptr;
  p.dy = pass != ConvPass::kFprop ? dy.p : nullptr, p.out = out.p;
  p.bias = bias.data(), p.bias_type = bias.type;

  setenv("MPGEMM_CONV_PATH", "gemm", 1);
  const Conv2dPlan plan = plan_conv2d(pass, p);
  std::unique_ptr<sim::Buffer> workspace;
  if (plan.workspace_bytes > 0) workspace = std::make_unique<sim::Buffer>(plan.workspace_bytes);
  const cudaError_t err = launch_conv2d(pass, p, plan, workspace ? workspace->p : nullptr, nullptr);
  // Neither a stride, nor padding, nor taps: those are no plain GEMM.
  bool others_refused = true;
  for (int variant = 0; variant < 3; ++variant) {
    Conv2dParams other = p;
    if (variant == 0) other.stride_h = 2, other.p = (p.h + 1) / 2;
    if (variant == 1) other.pad_left = 1, other.q = p.w + 2;
    if (variant == 2) other.r = other.s = 3, other.pad_top = other.pad_left = 1;
    others_refused &= plan_conv2d(pass, other).path != Conv2dPlan::Path::kGemm;
  }
  unsetenv("MPGEMM_CONV_PATH");
  const bool on_gemm = plan.path == Conv2dPlan::Path::kGemm;
  counts.on_gemm += on_gemm;
  counts.on_wgmma += on_gemm && is_wgmma(plan.gemm.plan.config);
  counts.split += on_gemm && plan.gemm.plan.split_k > 1;

  const auto element = [&p](const sim::Buffer& t) {
    return [&t, &p](int64_t i) { return double(sim::get(t.p, p.input_type, i)); };
  };
  const std::vector<double> want = sim::conv_reference(pass, p, element(x), element(w), element(dy), count);
  int64_t wrong = 0;
  for (int64_t e = 0; e < count; ++e)
    wrong += !(sim::get(out.p, p.out_type, e) == sim::rounded(float(want[e]) + bias.values[e % p.k], p.out_type));
  for (int64_t byte = esize * count; byte < int64_t(out.size); ++byte) wrong += out.p[byte] != 0xff;
  const bool bad = err != cudaSuccess || !on_gemm || !others_refused || wrong > 0;
  static const char* const kPasses[] = {"fprop", "dgrad", "wgrad"};
  if (bad)
    printf("conv as gemm case %d FAILED: %s n %ld h %ld w %ld c %ld k %ld, input %d out %d bias %d: err=%d, on the "
           "GEMM %d (%s, split %d), others refused %d, %ld wrong\n",
           index, kPasses[int(pass)], long(p.n), long(p.h), long(p.w), long(p.c), long(p.k), int(p.input_type),
           int(p.out_type), int(bias.present), int(err), int(on_gemm), tile_config(plan.gemm.plan.config).name,
           plan.gemm.plan.split_k, int(others_refused), long(wrong));
  return bad;
}
