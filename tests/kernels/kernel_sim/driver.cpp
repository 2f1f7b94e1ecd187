// Runs the GEMM, unscale, convolution (conv_cases.cpp) and mma.sync ceiling
// kernels of csrc/kernels on random problems through the host-side simulation
// (mock/, arch/) and compares every output with a reference computed
// here. Inputs are small multiples of 1/8, exact in fp16 and bf16 alike, so
// fp32 sums are exact in any order and results must match bit for bit. bf16
// products run from sim arch 800 on; below it their launches must be refused.
//   driver <gemm cases> <unscale cases> <conv cases> <seed> <late cp.async: 0 or 1> <batch norm cases>
//          [<first conv case>: runs conv cases from there on (a planted bug's run that needs one)]
// Prints "gemm: F/N failed" (random problems on the launcher's plan), "gemm
// plans: F/N failed" (split-K, every configuration of the table, grouped tile
// orders), "unscale: F/N failed", "conv: F/N failed" (and how many distinct
// conv kernels ran), "conv as gemm: F/N failed" (1x1 convolutions through
// the GEMM, conv_gemm_cases.cpp), "ceiling: F/N failed", "batch norm:
// F/N failed" (batch_norm_cases.cpp) and "gated: F/N failed" (the gated
// MLP's passes, gated_cases.cpp, as many cases as batch norm's), "batch
// norm line finish: F/3 failed" and "layer norm: F/N failed" (layer norm's
// passes, layer_norm_cases.cpp; both where there are batch-norm cases) and
// "depthwise sliding wgrad: F/12 failed", "conv n16 tile: F/16 failed" and
// "depthwise sliding gather: F/18 failed" (where there are conv cases); exits
// 1 on a failure.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>

#include <cuda_fp16.h>

#include "amp/unscale.h"
#include "common/launch_utils.h"
#include "common/epilogue_math.h"
#include "gemm/launch.h"
#include "kernel_sim/conv_gemm_cases.h"
#include "kernel_sim/gemm_cases.h"
#include "kernel_sim/sim_common.h"
#include "wmma/mma_ceiling.h"

using namespace mpgemm::kernels;

// The storage behind the kernels' `smem` (arch/smem.cuh). Blocks run one at
// a time, so one buffer serves them all.
namespace mpgemm::kernels {
alignas(128) unsigned char smem[228 * 1024];
}

using sim::Buffer;
using sim::gemm_case;
using sim::GemmCaseSpec;
using sim::get;
using sim::rnd;
using sim::rng;
using sim::set;

// Random problems on the launcher's own plan, steered by the simulated
// device: one multiprocessor takes the largest tiles (Wide, Tall; Compact
// where shared memory is that of sm_75 or sm_86), many take Small; one in
// sixteen asks for the pre-activation too (the product run again for it),
// another for D times an activation's derivative (the product in fp32, then
// the reduction that multiplies).
static bool random_gemm_case(int index) {
  const size_t default_limit = sim::shared_limit;
  sim::use_multiprocessors(rnd(0, 1) ? 1 : 1 << 20);
  if (rnd(0, 3) == 0) sim::shared_limit = std::min<size_t>(default_limit, 99 * 1024);
  GemmCaseSpec spec;
  spec.pre_activation = index % 16 == 5;
  spec.activation_grad = index % 16 == 9;
  const bool bad = gemm_case("gemm", index, spec);
  sim::shared_limit = default_limit;
  return bad;
}

// Every split count the heuristic can produce (2 to kMaxSplitK): a single
// tile of a matrix (m, n <= 64) on `splits` multiprocessors, with 4 to 5 K
// slices per split (so K ends in a partial slice): Small tiles, 16-byte loads.
// The fewest and the most splits run through the kernels; the counts between
// are the plan's alone (forced_plan_cases runs the kernels on any count).
static int heuristic_split_cases(int& count) {
  int failed = 0;
  for (int splits = 2; splits <= kMaxSplitK; ++splits) {
    sim::use_multiprocessors(splits);
    const int64_t block_k = tile_config(TileConfigId::kSmall).block_k;
    GemmCaseSpec spec;
    spec.max_m = spec.max_n = 64;
    spec.min_k = 4 * splits * block_k, spec.max_k = (5 * splits - 1) * block_k;
    spec.batch = 1, spec.aligned = 1;
    spec.expect_split_k = splits;
    ++count;
    if (splits <= 3 || splits == kMaxSplitK) {
      failed += gemm_case("split", splits, spec);
      continue;
    }
    const GemmShape shape{1, sim::rnd(1, spec.max_m), sim::rnd(1, spec.max_n), sim::rnd(spec.min_k, spec.max_k)};
    const GemmPlan plan = plan_gemm(shape, device_limits());
    if (plan.split_k != splits) {
      printf("split plan %d FAILED: %s with split_k=%d for %ldx%ldx%ld\n", splits, tile_config(plan.config).name,
             plan.split_k, long(shape.m), long(shape.n), long(shape.k));
      ++failed;
    }
  }
  sim::use_multiprocessors(108);
  return failed;
}

// Each configuration of the table the simulated device holds, on a forced
// plan: split-K (counts up to kMaxSplitK, so also more splits than K slices,
// and K = 0), grouped tile orders with a partial last group (4 tile rows in
// groups of 3, or 2 in one partial group for the large tiles, which run on
// problems of one or two tiles), and split-K of a batch, which is refused.
static int forced_plan_cases(int& count) {
  int failed = 0;
  for (const TileConfigInfo& c : kTileConfigs) {
    // 16-byte loads: every tile takes them (the scalar one too).
    const GemmShape any_shape{1, 1, 1, 1};
    const DeviceLimits simulated{sim::multiprocessors, int(sim::shared_limit), __CUDA_ARCH__ / 10};
    if (!admissible(any_shape, simulated, c.id, 1)) continue;
    const bool large = c.block_m * c.block_n > 128 * 128;
    for (int variant = 0; variant < 3; ++variant) {
      GemmCaseSpec spec;
      spec.aligned = c.load_width == 1 ? rnd(0, 1) : 1;
      spec.has_plan = true;
      spec.plan.config = c.id;
      spec.max_m = large ? c.block_m + 16 : 3 * c.block_m + 5;
      spec.max_n = large ? c.block_n / 2 : 2 * c.block_n + 7;
      if (variant == 0) {  // split-K, K from 0 to several slices per split; Small's asks for the pre-activation,
        spec.batch = 1;    // Compact's for D times an activation's derivative (in the splits' reduction)
        spec.pre_activation = c.id == TileConfigId::kSmall;
        spec.activation_grad = c.id == TileConfigId::kCompact;
        spec.plan.split_k = int(rnd(2, kMaxSplitK));
        spec.max_k = rnd(0, 1) ? 8 * c.block_k + 3 : c.block_k;
      } else if (variant == 1) {  // grouped order: groups of 3 tile rows, the last one partial
        spec.plan.raster_group = 3;
        spec.min_m = large ? c.block_m + 1 : 3 * c.block_m + 1;
        spec.max_m = large ? c.block_m + 16 : 4 * c.block_m - 8;
        spec.min_n = large ? 1 : c.block_n + 1;
      } else {  // split-K of a batch: refused
        spec.batch = 2;
        spec.plan.split_k = 2;
        spec.min_k = 1;
        spec.expect = cudaErrorInvalidValue;
      }
      failed += gemm_case(c.name, variant, spec);
      ++count;
    }
  }
  return failed;
}

// Launchers ask the runtime about a kernel once per kernel and device
// (common/launch_utils.h's KernelAttributes): a tile that needs more than 48
// KiB of shared memory, on a forced plan (one kernel: fp16, A row-major, B
// column-major), launched twice on each of two devices that no case has used
// yet. A device's first launch opts the kernel in (the mock refuses a launch
// opted in on another device only), the second asks the runtime nothing.
static int attribute_cases(int& count) {
  const TileConfigInfo* tile = nullptr;
  for (const TileConfigInfo& c : kTileConfigs) {
    const DeviceLimits simulated{sim::multiprocessors, int(sim::shared_limit), __CUDA_ARCH__ / 10};
    if (!c.wgmma && c.smem_bytes > 48 * 1024 && admissible(GemmShape{1, 1, 1, 1}, simulated, c.id, 1)) {
      tile = &c;
      break;
    }
  }
  if (tile == nullptr) {
    printf("attributes: no tile of the simulated device needs more than 48 KiB\n");
    ++count;
    return 1;
  }
  const sim::PinnedKernel saved = sim::pinned;
  sim::pinned = {true, true, false};
  GemmCaseSpec spec;
  spec.has_plan = true;
  spec.plan.config = tile->id;
  spec.batch = 1, spec.aligned = 1;
  spec.min_m = spec.max_m = tile->block_m + 3, spec.min_n = spec.max_n = tile->block_n + 8;
  spec.min_k = spec.max_k = 2 * tile->block_k;
  int failed = 0;
  for (int device = 0; device < 2; ++device) {
    sim::use_multiprocessors(1000 + device);
    for (int launch = 0; launch < 2; ++launch) {
      const uint64_t before = sim::function_attribute_calls;
      failed += gemm_case("attributes", 2 * device + launch, spec);
      const uint64_t asked = sim::function_attribute_calls - before;
      if ((launch == 0) != (asked > 0)) {
        printf("attributes: %s's launch %d on device %d asked the runtime %llu times\n", tile->name, launch,
               sim::device, static_cast<unsigned long long>(asked));
        ++failed;
      }
      ++count;
    }
  }
  sim::pinned = saved;
  sim::use_multiprocessors(108);
  return failed;
}

static float special_value() {
  const float values[] = {INFINITY, -INFINITY, NAN};
  return values[rnd(0, 2)];
}

// Gradients of any type, unscaled into fp32, fp16 or bf16 (in place when the
// types match), split into chunks given in random order; some elements are
// left out.
static bool unscale_case(int index) {
  struct Tensor {
    ElementType src_type, dst_type;
    int64_t size;
    bool in_place;
    std::unique_ptr<Buffer> src, dst;
    std::vector<bool> covered;
    std::vector<float> before;
    const unsigned char* out() const { return in_place ? src->p : dst->p; }
  };
  std::vector<Tensor> tensors(rnd(1, 4));
  std::vector<UnscaleChunk> chunks;
  bool any_special = false;
  for (Tensor& t : tensors) {
    t.src_type = sim::any_type(), t.dst_type = sim::any_type();
    t.size = rnd(0, 3) ? rnd(1, 700) : rnd(0, 3);
    const auto bytes = [&](ElementType type) { return t.size * sim::bytes_of(type); };
    t.src = std::make_unique<Buffer>(bytes(t.src_type));
    t.in_place = t.src_type == t.dst_type && rnd(0, 1);
    if (!t.in_place) t.dst = std::make_unique<Buffer>(bytes(t.dst_type));
    void* dst = t.in_place ? t.src->p : t.dst->p;
    for (int64_t i = 0; i < t.size; ++i) set(t.src->p, t.src_type, i, rnd(-4000, 4000) / 8.0f);
    if (t.size && rnd(0, 3) == 0) set(t.src->p, t.src_type, rnd(0, t.size - 1), special_value());
    std::vector<int64_t> cuts{0, t.size};
    for (int c = rnd(0, 3); c > 0; --c) cuts.push_back(rnd(0, t.size));
    std::sort(cuts.begin(), cuts.end());
    t.covered.assign(t.size, false);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      if (cuts.size() > 3 && rnd(0, 4) == 0) continue;
      chunks.push_back({t.src->p, dst, cuts[c], cuts[c + 1], t.src_type, t.dst_type});
      for (int64_t i = cuts[c]; i < cuts[c + 1]; ++i) t.covered[i] = true;
    }
  }
  std::shuffle(chunks.begin(), chunks.end(), rng);
  const float factors[] = {1.0f / 65536, 0.375f, 3.0f};
  const float factor = factors[rnd(0, 2)];
  for (Tensor& t : tensors)
    for (int64_t i = 0; i < t.size; ++i) {
      t.before.push_back(get(t.src->p, t.src_type, i));
      any_special |= t.covered[i] && !std::isfinite(t.before[i] * factor);
    }
  Buffer inv_scale(4), found_inf(4);
  *reinterpret_cast<float*>(inv_scale.p) = factor;
  const float found_before = rnd(0, 3) == 0;
  *reinterpret_cast<float*>(found_inf.p) = found_before;
  sim::max_grid.x = rnd(0, 1) ? 1u << 31 : rnd(1, 2);  // blocks loop over the chunks
  const cudaError_t err = launch_unscale(chunks.data(), chunks.size(), reinterpret_cast<float*>(inv_scale.p),
                                         reinterpret_cast<float*>(found_inf.p), nullptr);
  sim::max_grid.x = 1u << 31;

  int bad = err != cudaSuccess;
  const float found = *reinterpret_cast<float*>(found_inf.p);
  if (found != float(found_before || any_special) && bad++ < 3) printf("  found_inf = %g\n", found);
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const Tensor& t = tensors[ti];
    for (int64_t i = 0; i < t.size; ++i) {
      const float got = get(t.out(), t.dst_type, i);
      const float v = t.before[i] * factor;
      float expect = sim::rounded(v, t.dst_type);
      if (!t.covered[i]) expect = t.in_place ? t.before[i] : NAN;  // untouched
      if (!(got == expect || (std::isnan(got) && std::isnan(expect))) && bad++ < 3)
        printf("  tensor %zu element %ld = %g, want %g\n", ti, i, got, expect);
    }
  }
  if (bad) printf("unscale case %d FAILED: err=%d chunks=%zu factor=%g\n", index, int(err), chunks.size(), factor);
  return bad;
}

// Every warp's slot of the ceiling's output must hold iterations * (a @ b).
static bool ceiling_case(int index) {
  using Config = MmaCeilingTile;
  constexpr int kWarps = Config::kWarpsM * Config::kWarpsN, kK = Config::kFragment;
  const int blocks = rnd(1, 3), iterations = rnd(0, 4);
  Buffer a(Config::kWarpM * kK * sizeof(__half)), b(kK * Config::kWarpN * sizeof(__half));
  Buffer out(size_t(blocks) * kWarps * Config::kWarpM * Config::kWarpN * sizeof(float));
  auto* a_data = reinterpret_cast<__half*>(a.p);
  auto* b_data = reinterpret_cast<__half*>(b.p);
  for (int i = 0; i < Config::kWarpM * kK; ++i) a_data[i] = __half(rnd(-8, 8) / 8.0f);
  for (int i = 0; i < kK * Config::kWarpN; ++i) b_data[i] = __half(rnd(-8, 8) / 8.0f);
  const cudaError_t err = launch_mma_ceiling(a_data, b_data, reinterpret_cast<float*>(out.p), iterations, blocks,
                                             nullptr);

  int bad = err != cudaSuccess;
  const float* got = reinterpret_cast<const float*>(out.p);
  for (int slot = 0; slot < blocks * kWarps; ++slot)
    for (int i = 0; i < Config::kWarpM; ++i)
      for (int j = 0; j < Config::kWarpN; ++j) {
        float product = 0;
        for (int q = 0; q < kK; ++q) product += float(a_data[i * kK + q]) * float(b_data[q * Config::kWarpN + j]);
        const float want = iterations * product;
        const float value = got[(slot * Config::kWarpM + i) * Config::kWarpN + j];
        if (!(value == want) && bad++ < 3) printf("  slot %d [%d][%d] = %g, want %g\n", slot, i, j, value, want);
      }
  if (bad) printf("ceiling case %d FAILED: err=%d blocks=%d iterations=%d\n", index, int(err), blocks, iterations);
  return bad;
}

// The device this driver simulates (mock/cuda_runtime.h).
const int sim::device_arch = __CUDA_ARCH__;

bool conv_case(int index);  // conv_cases.cpp
bool depthwise_sliding_case(int index);
bool depthwise_sliding_switch_wrong();
bool depthwise_sliding_gather_case(int index);
bool depthwise_sliding_gather_switch_wrong();
bool depthwise_sliding_gather_forced_wrong();
extern int gather_two_tile_cases;
extern int sliding_split_cases, sliding_clipped_split_cases, sliding_tile_stride_cases;
bool n16_tile_case(int index);
bool n16_switch_wrong();
extern int n16_multi_tile_cases;
extern int conv_moment_cases;
extern std::set<const void*> conv_moment_kernels;
bool batch_norm_case(int index);              // batch_norm_cases.cpp
bool batch_norm_line_finish_case(int index);  // batch_norm_cases.cpp
bool gated_case(int index);       // gated_cases.cpp
bool layer_norm_case(int index);  // layer_norm_cases.cpp
extern int conv_splits_run;  // wgrad cases that split K

int main(int argc, char** argv) {
  SIM_CHECK(argc == 7 || argc == 8,
            "usage: %s <gemm cases> <unscale cases> <conv cases> <seed> <late cp.async: 0|1> <batch norm cases> "
            "[<first conv case>]",
            argv[0]);
  const int gemm_cases = std::stoi(argv[1]), unscale_cases = std::stoi(argv[2]), conv_cases = std::stoi(argv[3]);
  const int first_conv_case = argc == 8 ? std::stoi(argv[7]) : 0;
  const int batch_norm_cases = std::stoi(argv[6]);
  rng.seed(std::stoull(argv[4]));
  sim::fiber::seed_order(std::stoull(argv[4]));
  sim::async_copies_late = std::stoi(argv[5]);
  sim::shared_memory = smem;
  sim::shared_capacity = sizeof smem;
  const int kCeilingCases = gemm_cases > 0 ? 3 : 0, kConvGemmCases = gemm_cases > 0 ? 12 : 0;
  int gemm_failed = 0, unscale_failed = 0, conv_failed = 0, ceiling_failed = 0;
  for (int i = 0; i < gemm_cases; ++i) gemm_failed += random_gemm_case(i);
  // The fixed case sets (plans, 1x1 convolutions as GEMMs, the ceiling) run
  // with the GEMM's cases: a run of batch-norm cases alone skips them.
  const bool fixed_cases = gemm_cases > 0;
  int plan_cases = 0, plan_failed = fixed_cases ? attribute_cases(plan_cases) : 0;
  if (fixed_cases) plan_failed += heuristic_split_cases(plan_cases);
  if (fixed_cases) plan_failed += forced_plan_cases(plan_cases);
  for (int i = 0; i < unscale_cases; ++i) unscale_failed += unscale_case(i);
  const size_t before_conv = sim::launched.size();
  for (int i = first_conv_case; i < conv_cases; ++i) conv_failed += conv_case(i);
  printf("kernels launched: %zu\nconv kernels launched: %zu\nwgrad cases that split K: %d\n", sim::launched.size(),
         sim::launched.size() - before_conv, conv_splits_run);
  printf("fprop cases with moments: %d (%zu kernels)\n", conv_moment_cases, conv_moment_kernels.size());
  int conv_gemm_failed = 0;
  ConvGemmCounts conv_gemm;
  for (int i = 0; i < kConvGemmCases; ++i) conv_gemm_failed += conv_gemm_case(i, conv_gemm);
  printf("conv as gemm: %d/%d failed (%d splitting K)\n", conv_gemm_failed, kConvGemmCases, conv_gemm.split);
  for (int i = 0; i < kCeilingCases; ++i) ceiling_failed += ceiling_case(i);
  int batch_norm_failed = 0;
  for (int i = 0; i < batch_norm_cases; ++i) batch_norm_failed += batch_norm_case(i);
  printf("batch norm: %d/%d failed\n", batch_norm_failed, batch_norm_cases);
  // The gated MLP's passes, as many cases as batch norm's (the elementwise passes' count).
  int gated_failed = 0;
  for (int i = 0; i < batch_norm_cases; ++i) gated_failed += gated_case(i);
  printf("gated: %d/%d failed\n", gated_failed, batch_norm_cases);
  // Depthwise wgrad on the sliding window, with the convolution cases (last, so that the case sets above
  // draw as they did without it): its 12 kernels (6 at sim arch 750).
  const int sliding_cases = conv_cases > 0 ? 12 : 0;
  const size_t before_sliding = sim::launched.size();
  int sliding_failed = conv_cases > 0 ? depthwise_sliding_switch_wrong() : 0;
  for (int i = 0; i < sliding_cases; ++i) sliding_failed += depthwise_sliding_case(i);
  printf("depthwise sliding wgrad: %d/%d failed (%zu kernels; %d split, %d on a clipped grid, %d striding over "
         "tiles)\n",
         sliding_failed, sliding_cases, sim::launched.size() - before_sliding, sliding_split_cases,
         sliding_clipped_split_cases, sliding_tile_stride_cases);
  // The finish by lines over hundreds of row blocks, with the batch-norm cases (last, as the sliding window's).
  const int line_finish_cases = batch_norm_cases > 0 ? 3 : 0;
  int line_finish_failed = 0;
  for (int i = 0; i < line_finish_cases; ++i) line_finish_failed += batch_norm_line_finish_case(i);
  printf("batch norm line finish: %d/%d failed\n", line_finish_failed, line_finish_cases);
  // The 128 x 16 tile's fprop and dgrad, with the convolution cases (last, so that the case sets above draw
  // as they did without it): its 10 kernels at sim arch 800 (those that no case set above launched, the conv
  // cases' moment kernels, which they count apart, included); below its arch the plans give them other tiles.
  const int n16_cases = conv_cases > 0 ? 16 : 0;
  std::set<const void*> before_n16 = sim::launched;
  before_n16.insert(conv_moment_kernels.begin(), conv_moment_kernels.end());
  int n16_failed = conv_cases > 0 ? n16_switch_wrong() : 0;
  for (int i = 0; i < n16_cases; ++i) n16_failed += n16_tile_case(i);
  const size_t n16_kernels = std::count_if(sim::launched.begin(), sim::launched.end(),
                                           [&](const void* kernel) { return !before_n16.count(kernel); });
  printf("conv n16 tile: %d/%d failed (%zu kernels; %d on several row tiles)\n", n16_failed, n16_cases, n16_kernels,
         n16_multi_tile_cases);
  // The depthwise gather on the sliding window, last of all (so that every case set above draws as it did
  // without it): its 18 kernels (9 at sim arch 750), its switch, and plans forced onto other geometries.
  const int gather_cases = conv_cases > 0 ? 18 : 0;
  const size_t before_gather = sim::launched.size();
  int gather_failed = conv_cases > 0 ? depthwise_sliding_gather_switch_wrong() : 0;
  if (conv_cases > 0) gather_failed += depthwise_sliding_gather_forced_wrong();
  for (int i = 0; i < gather_cases; ++i) gather_failed += depthwise_sliding_gather_case(i);
  printf("depthwise sliding gather: %d/%d failed (%zu kernels; %d on two tiles)\n", gather_failed, gather_cases,
         sim::launched.size() - before_gather, gather_two_tile_cases);
  // Layer norm's passes, as many cases as batch norm's, last of all (so that every case set above draws as
  // it did without them).
  int layer_norm_failed = 0;
  for (int i = 0; i < batch_norm_cases; ++i) layer_norm_failed += layer_norm_case(i);
  printf("layer norm: %d/%d failed\n", layer_norm_failed, batch_norm_cases);
  printf("gemm plans: %d/%d failed\n", plan_failed, plan_cases);
  printf("gemm: %d/%d failed\nunscale: %d/%d failed\nconv: %d/%d failed\nceiling: %d/%d failed\n", gemm_failed,
         gemm_cases, unscale_failed, unscale_cases, conv_failed, conv_cases, ceiling_failed, kCeilingCases);
  return gemm_failed || plan_failed || unscale_failed || conv_failed || sliding_failed || gather_failed || n16_failed ||
         conv_gemm_failed || ceiling_failed || batch_norm_failed || gated_failed || line_finish_failed ||
         layer_norm_failed;
}
