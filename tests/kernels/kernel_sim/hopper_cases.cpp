// Runs the Hopper GEMM (csrc/kernels/sm90/gemm_kernel.cuh) in the host-side
// simulation at sim arch 900, its copies, wgmmas and mbarriers modelled by
// hopper_sim.h after the PTX ISA (hopper_models.h):
//  - layout: the models against facts of the PTX ISA's figures, then the
//    kernel's index code (sm90/layout.h: SwizzledOperandTile::offset and descriptor
//    with their per-k16 and per-consumer steps, OutputStrip::offset against
//    the store's box, accumulator_row and accumulator_col; the ring's
//    PipelineState) against the models, element by element (printed as got,
//    expected);
//  - gemm: random problems on the launcher's plan for an sm_90 device, every
//    operand layout, fp16 and bf16, ragged edges, K remainders, batches and
//    broadcasts, on 1 to 4 multiprocessors (each block then walks several
//    tiles through the ring) or 132 (small outputs take split-K on WMMA
//    tiles or, with short K, ping-pong); one in four with MPGEMM_GEMM_PATH=wgmma, which takes the Hopper
//    path there too; one in eight with MPGEMM_GEMM_PATH=wgmma_2x1, on pairs
//    of blocks that multicast B (odd counts of tile rows leave a block of a
//    pair past M), and one in eight with MPGEMM_GEMM_PATH=wgmma_pingpong, on
//    pairs whose consumers take 64-row tiles in turn (each skipping the
//    other's slices in the ring); and, on either pair kernel, tall problems
//    whose tile order has a partial group. Every pair case must run the
//    kernel it asks for: its operands are ones the copy engine describes. Half
//    the cases give D 16-byte aligned pitches, which the epilogue stores
//    through the copy engine, and the rest mostly pitches it cannot describe.
//    D is fp32 or the inputs' type, as the ops make it, but in three cases
//    of sixteen: D of the other 16-bit type must run on WMMA tiles, and a
//    Hopper plan for it be refused with D untouched;
//  - cluster occupancy: asked once per device and kernel, each pair grid
//    sized by the current device's answer (check_cluster_occupancy).
// Inputs are multiples of 1/8, so results must match the reference exactly.
//  - the Hopper convolution: hopper_conv_cases.cpp.
//   hopper_cases <gemm cases> <conv cases> <seed> <late copies: 0|1> <late wgmma: 0|1> [pinned]
// "pinned" runs every case on A row-major, B column-major and fp16 inputs:
// the one Hopper kernel of each kind that a planted bug's build replaces
// (hopper_planted.cpp; a convolution's: hopper_conv_planted.cpp).
// Prints "layout: F/N mismatches", "gemm: F/N failed", "wgmma cases: N" (on
// any Hopper kernel), "wgmma_2x1 cases: N", "wgmma_pingpong cases: N" and
// "wgmma cases storing through the copy engine: N" and "cluster occupancy
// asked once per device and kernel: ok" (or FAILED), then "im2col walk: F/N
// mismatches", "conv wgmma cases: N", "conv wgmma cases by default: N",
// "conv wgmma wgrad cases that split:
// N", "conv wgmma dgrad cases with a stride: N", "conv wgmma dgrad cases
// with a phase no tap reaches: N", "conv: F/N failed", "bad
// MPGEMM_CONV_PATH refused: ok", "taps at the im2col offsets' limit: ok"
// and "first Hopper launches on fresh threads: ok"; exits 1 on a failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gemm/launch.h"
#include "kernel_sim/gemm_cases.h"
#include "kernel_sim/hopper_conv_cases.h"
#include "kernel_sim/hopper_models.h"
#include "kernel_sim/hopper_sim.h"
#include "kernel_sim/sim_common.h"
#include "sm90/layout.h"
#include "sm90/pipeline.cuh"

using namespace mpgemm::kernels;
namespace model = sim::hopper_model;

// The storage behind the kernels' `smem` (arch/smem.cuh), the first block's
// of a cluster, at a swizzle pattern boundary as the shared window's start is.
namespace mpgemm::kernels {
alignas(1024) unsigned char smem[228 * 1024];
}

// Counts a mismatch, printing the first few.
static void mismatch(int& count, const char* what, int i, int j, int64_t got, int64_t want) {
  if (count++ < 5) printf("  %s (%d, %d): %ld, expected %ld\n", what, i, j, long(got), long(want));
}

// SwizzledOperandTile<Rows, KMajor> against the copy engine's placement of the boxes
// load_boxes issues (kBoxRows x 64 K when K-major, 64 x 64 when MN-major,
// kBoxBytes apart) and against wgmma's reads through
// SwizzledOperandTile::descriptor, for every k16 step and every block of the
// InstrRows rows one instruction spans.
template <int Rows, bool KMajor, int InstrRows>
static int check_operand_tile(int& mismatches) {
  using Tile = sm90::SwizzledOperandTile<Rows, KMajor>;
  const char* layout = KMajor ? "K-major" : "MN-major";
  const uint32_t base = 4 * sm90::kSwizzleAtomBytes;  // any pattern boundary
  const uint32_t box[3] = {64, KMajor ? uint32_t(Tile::kBoxRows) : 64u, 1};
  int checked = 0;
  for (int mn = 0; mn < Rows; ++mn)
    for (int k = 0; k < 64; ++k, ++checked) {
      const uint32_t kernel = base + Tile::offset(mn, k);
      const uint32_t copied =
          KMajor ? model::tma_box_address(base + (mn / Tile::kBoxRows) * Tile::kBoxBytes, box, 2, k,
                                          mn % Tile::kBoxRows, 0, true)
                 : model::tma_box_address(base + (mn / 64) * Tile::kBoxBytes, box, 2, mn % 64, k, 0, true);
      if (kernel != copied) mismatch(mismatches, layout, mn, k, kernel, copied);
      const auto d = model::decode_descriptor(Tile::descriptor(base, k / 16, mn / InstrRows));
      const uint32_t read = model::wgmma_operand_address(d, !KMajor, mn % InstrRows, k % 16);
      if (kernel != read) mismatch(mismatches, layout, mn, k, kernel, read);
    }
  return checked;
}

// The models against facts read off the PTX ISA's figures and bit tables,
// so that they cannot drift along with the kernel's code.
static int check_models(int& mismatches) {
  struct Fact {
    const char* what;
    int64_t model, isa;
  };
  const model::MatrixDescriptor d = model::decode_descriptor(0x4000004000200040ull);
  const auto element = [](int thread, int reg) {
    const model::FragmentElement e = model::accumulator_element(thread, reg);
    return int64_t(e.row) * 1000 + e.col;
  };
  const Fact facts[] = {
      // 128-byte swizzle: chunk c of row r of a 1024-byte pattern lands at chunk c ^ r.
      {"swizzle of row 0", model::swizzle_128b(0x70), 0x70},
      {"swizzle of row 1, chunk 0", model::swizzle_128b(0x80), 0x90},
      {"swizzle of row 7, chunk 7", model::swizzle_128b(0x3f8), 0x388},
      {"swizzle of the next pattern", model::swizzle_128b(0x4a0), 0x4b0},
      // Descriptor fields, in 16-byte units: start 0x400, leading 0x200, stride 0x400, 128-byte swizzle.
      {"descriptor start", d.start, 0x400},
      {"descriptor leading byte offset", d.leading_byte_offset, 0x200},
      {"descriptor stride byte offset", d.stride_byte_offset, 0x400},
      {"descriptor swizzle mode", d.swizzle_mode, 1},
      // The accumulator figure: row * 1000 + column of (thread, register).
      {"d0 of thread 0", element(0, 0), 0},
      {"d1 of thread 0", element(0, 1), 1},
      {"d2 of thread 0", element(0, 2), 8000},
      {"d3 of thread 0", element(0, 3), 8001},
      {"d4 of thread 0", element(0, 4), 8},
      {"d0 of thread 1", element(1, 0), 2},
      {"d0 of thread 4", element(4, 0), 1000},
      {"d0 of thread 32", element(32, 0), 16000},
      {"d127 of thread 127", element(127, 127), 63255},
  };
  for (const Fact& f : facts)
    if (f.model != f.isa) mismatch(mismatches, f.what, 0, 0, f.model, f.isa);
  return int(sizeof(facts) / sizeof(facts[0]));
}

// OutputStrip<Bytes> against the copy engine's reading of the box D's tensor
// map gives a store (128 bytes of columns by 64 rows, 128-byte swizzle).
template <int Bytes>
static int check_output_strip(int& mismatches) {
  using Strip = sm90::OutputStrip<Bytes>;
  const uint32_t base = 8 * sm90::kSwizzleAtomBytes;
  const uint32_t box[3] = {uint32_t(Strip::kCols), uint32_t(Strip::kRows), 1};
  int checked = 0;
  for (int row = 0; row < Strip::kRows; ++row)
    for (int col = 0; col < Strip::kCols; ++col, ++checked) {
      const uint32_t kernel = base + Strip::offset(row, col);
      const uint32_t stored = model::tma_box_address(base, box, Bytes, col, row, 0, true);
      if (kernel != stored) mismatch(mismatches, Bytes == 4 ? "fp32 output strip" : "16-bit output strip", row, col,
                                     kernel, stored);
    }
  return checked;
}

static int check_layouts(int& mismatches) {
  using Config = WgmmaBlockConfig;
  constexpr int kCooperativeRows = WgmmaTile::kBlockM;
  constexpr int kPingPongRows = WgmmaPingPongTile::kBlockM;
  int checked = check_models(mismatches) + check_operand_tile<kCooperativeRows, true, Config::kInstrM>(mismatches) +
                check_operand_tile<kCooperativeRows, false, Config::kInstrM>(mismatches) +
                check_operand_tile<kPingPongRows, true, Config::kInstrM>(mismatches) +
                check_operand_tile<kPingPongRows, false, Config::kInstrM>(mismatches) +
                check_operand_tile<Config::kBlockN, true, Config::kInstrN>(mismatches) +
                check_operand_tile<Config::kBlockN, false, Config::kInstrN>(mismatches) +
                check_output_strip<4>(mismatches) + check_output_strip<2>(mismatches);
  for (int thread = 0; thread < Config::kWarpgroupThreads; ++thread)
    for (int reg = 0; reg < Config::kInstrN / 2; ++reg, ++checked) {
      const model::FragmentElement e = model::accumulator_element(thread, reg);
      if (sm90::accumulator_row(thread, reg) != e.row)
        mismatch(mismatches, "accumulator row", thread, reg, sm90::accumulator_row(thread, reg), e.row);
      if (sm90::accumulator_col(thread, reg) != e.col)
        mismatch(mismatches, "accumulator column", thread, reg, sm90::accumulator_col(thread, reg), e.col);
    }
  // The ring: after i slices, stage i mod kStages in round i / kStages,
  // whose parity the waits name; and the same after a jump of j slices from
  // there (a ping-pong consumer passing the other's tile).
  sm90::PipelineState pipe;
  for (int i = 0; i < 1000; ++i, pipe.advance(), ++checked) {
    if (pipe.stage != i % Config::kStages || int(pipe.phase) != i / Config::kStages % 2)
      mismatch(mismatches, "ring position (stage, parity)", i, 0, pipe.stage * 2 + pipe.phase,
               i % Config::kStages * 2 + i / Config::kStages % 2);
    for (int j : {0, 1, 3, 4, 5, 7, 8, 63, 64, 65, 1 << 20}) {
      sm90::PipelineState jumped = pipe;
      jumped.advance(j);
      const int to = i + j;
      if (jumped.stage != to % Config::kStages || int(jumped.phase) != to / Config::kStages % 2)
        mismatch(mismatches, "ring position after a jump (stage, parity)", i, j, jumped.stage * 2 + jumped.phase,
                 to % Config::kStages * 2 + to / Config::kStages % 2);
    }
  }
  return checked;
}

// A random problem on the launcher's plan for an sm_90 device, or a Hopper
// plan the launcher must refuse.
static bool hopper_gemm_case(int index, int& on_wgmma, int& on_pairs, int& on_ping_pong, int& copied_out) {
  // Pairs in one case of four, every other one with ping-pong consumers; of
  // each pair kernel's cases, one in two tall.
  const bool forced = index % 4 == 3, paired = index % 4 == 1, ping_pong = index % 8 == 5;
  const bool tall = paired && index % 16 >= 9;
  // D of the other 16-bit type, which the ops never make and the Hopper
  // kernels do not store: WMMA tiles even where MPGEMM_GEMM_PATH=wgmma asks
  // for the Hopper path, and a Hopper plan refused without touching D.
  const bool other_type = index % 8 == 6, refused = index % 16 == 2;
  int multiprocessors = sim::rnd(0, 2) ? int(sim::rnd(paired ? 2 : 1, 4)) : 132;
  // Ping-pong: one pair that takes every tile, at least four (each consumer
  // several) or (`short_ping_pong`) one or two with K of 2 to 4 slices,
  // fewer than the ring's stages; or two or three pairs on the nine tall tiles.
  const bool short_ping_pong = ping_pong && !tall && index / 16 % 2 == 1;
  if (ping_pong) multiprocessors = tall ? int(sim::rnd(4, 6)) : int(sim::rnd(2, 3));
  sim::use_multiprocessors(multiprocessors);
  if (forced || other_type) setenv("MPGEMM_GEMM_PATH", "wgmma", 1);
  if (paired) setenv("MPGEMM_GEMM_PATH", ping_pong ? "wgmma_pingpong" : "wgmma_2x1", 1);
  sim::GemmCaseSpec spec;
  // Mostly operands the copy engine can describe; always where D's type alone should keep the Hopper path away.
  spec.aligned = paired || other_type || refused || sim::rnd(0, 7) ? 1 : 0;
  spec.whole_chunks = false;
  spec.copyable_operands = paired;  // so that every pair case runs its kernel
  // On each pair kernel: the tall cases store from registers, the others through the copy engine.
  spec.d_copyable = (paired ? index / 8 : index / 4) % 2 == 0;
  using OutputType = sim::GemmCaseSpec::OutputType;
  spec.d_type = other_type || refused ? OutputType::kOther16Bit : OutputType::kOpsOwn;
  if (other_type || refused) spec.min_k = 1;
  if (refused) {
    spec.has_plan = true;
    const TileConfigId hopper[] = {TileConfigId::kWgmma, TileConfigId::kWgmmaPair, TileConfigId::kWgmmaPingPong};
    spec.plan.config = hopper[sim::rnd(0, 2)];
    spec.expect = cudaErrorInvalidValue;
  }
  spec.max_m = 300, spec.max_n = 560, spec.max_k = 200;
  if (forced) spec.max_m = spec.max_n = 100, spec.min_k = 64, spec.max_k = 640;  // long K on one tile
  if (paired) spec.min_k = 300, spec.max_k = 520;  // K that wraps the ring within each tile
  if (ping_pong && !tall && !short_ping_pong) spec.min_m = 129, spec.min_n = 257;  // four tiles or more
  if (short_ping_pong) spec.max_m = 128, spec.max_n = 512, spec.min_k = 65, spec.max_k = 256, spec.batch = 1;
  if (tall) spec.min_m = 8 * 128 + 1, spec.max_m = 9 * 128, spec.max_n = 200, spec.min_k = 1, spec.max_k = 64;
  if (tall) spec.batch = 1;
  GemmPlan plan;
  const uint64_t stores_before = sim::hopper::stores_issued;
  const char* kind = refused      ? "refused"
                     : forced     ? "forced"
                     : tall       ? "tall"
                     : ping_pong  ? "ping-pong"
                     : paired     ? "pairs"
                     : other_type ? "other type"
                                  : "gemm";
  bool bad = sim::gemm_case(kind, index, spec, &plan);
  unsetenv("MPGEMM_GEMM_PATH");
  if (other_type && is_wgmma(plan.config)) {
    printf("other type case %d FAILED: the launcher planned the Hopper path for D it does not store\n", index);
    bad = true;
  }
  const TileConfigId asked = ping_pong ? TileConfigId::kWgmmaPingPong : TileConfigId::kWgmmaPair;
  if (paired && plan.config != asked) {
    printf("%s case %d FAILED: MPGEMM_GEMM_PATH asked for %s, the launcher planned %s\n", kind, index,
           tile_config(asked).name, tile_config(plan.config).name);
    bad = true;
  }
  if (refused) return bad;
  on_wgmma += is_wgmma(plan.config);
  on_pairs += plan.config == TileConfigId::kWgmmaPair;
  on_ping_pong += plan.config == TileConfigId::kWgmmaPingPong;
  copied_out += sim::hopper::stores_issued != stores_before;
  return bad;
}

// The pair kernels' launcher asks how many clusters fit once per device and
// kernel, and sizes each grid by the current device's answer: one GEMM of
// four 256 x 256 cluster tiles on wgmma_2x1, launched twice on a device of 7
// multiprocessors (3 pairs fit) and once on one of 9 (4 pairs), counts that
// no case draws. Then no (device, kernel) may have been asked twice in the
// whole run. Whether it failed (and then prints why).
static bool check_cluster_occupancy() {
  constexpr int64_t m = 512, n = 512, k = 16;
  sim::Buffer a(m * k * 2), b(k * n * 2), d(m * n * 4);
  for (int64_t i = 0; i < m * k; ++i) sim::set(a.p, ElementType::kFloat16, i, sim::rnd(-8, 8) / 8.0f);
  for (int64_t i = 0; i < k * n; ++i) sim::set(b.p, ElementType::kFloat16, i, sim::rnd(-8, 8) / 8.0f);
  GemmParams p;
  p.m = m, p.n = n, p.k = k;
  p.a = a.p, p.a_row_stride = k, p.a_col_stride = 1;  // both K-major
  p.b = b.p, p.b_row_stride = 1, p.b_col_stride = k;
  p.d = d.p, p.d_row_stride = n, p.d_batch_stride = m * n;
  std::vector<float> want(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t q = 0; q < k; ++q)
        want[i * n + j] += sim::get(a.p, ElementType::kFloat16, i * k + q) * sim::get(b.p, ElementType::kFloat16, j * k + q);
  setenv("MPGEMM_GEMM_PATH", "wgmma_2x1", 1);
  const size_t devices_before = sim::cluster_occupancy_queries.size();
  bool bad = false;
  for (const auto [multiprocessors, pairs] : {std::pair{7, 3}, {7, 3}, {9, 4}}) {
    sim::use_multiprocessors(multiprocessors);
    memset(d.p, 0xff, d.size);
    const GemmLaunch launch = plan_gemm(p);
    const GemmPlan& plan = launch.plan;
    const cudaError_t err = launch_gemm(p, launch, nullptr, nullptr);
    int64_t wrong = 0;
    for (int64_t e = 0; e < m * n; ++e) wrong += !(sim::get(d.p, ElementType::kFloat32, e) == want[e]);
    if (err != cudaSuccess || plan.config != TileConfigId::kWgmmaPair || sim::last_grid.x != unsigned(2 * pairs) ||
        wrong) {
      printf("  on %d multiprocessors: err=%d plan %s, a grid of %u blocks, expected %d pairs; %ld of D wrong\n",
             multiprocessors, int(err), tile_config(plan.config).name, sim::last_grid.x, pairs, long(wrong));
      bad = true;
    }
  }
  unsetenv("MPGEMM_GEMM_PATH");
  if (sim::cluster_occupancy_queries.size() != devices_before + 2) {
    printf("  asked on %zu new (device, kernel) pairs, expected 2\n",
           sim::cluster_occupancy_queries.size() - devices_before);
    bad = true;
  }
  for (const auto& [asked_of, times] : sim::cluster_occupancy_queries)
    if (times != 1) {
      printf("  device %d asked %d times for one kernel's clusters\n", asked_of.first, times);
      bad = true;
    }
  return bad;
}

// A thread whose first CUDA work is a Hopper launch (the autograd engine's
// device thread, a user's worker thread) has no context current, which the
// driver's encoders need: a GEMM on the Hopper path's pairs, then
// convolutions until one takes it, each on a thread of its own. Whether one
// failed or the Hopper convolution never ran.
static bool check_fresh_threads() {
  bool bad = false;
  // The simulated device's shared memory is the launching thread's to name.
  const auto on_fresh_thread = [](auto run) {
    std::thread([&] {
      sim::shared_memory = smem;
      run();
    }).join();
  };
  int on_wgmma = 0, on_pairs = 0, on_ping_pong = 0, copied_out = 0;
  // Case 1: pairs of blocks on operands the copy engine describes, always on the Hopper path.
  on_fresh_thread([&] { bad |= hopper_gemm_case(1, on_wgmma, on_pairs, on_ping_pong, copied_out); });
  if (on_wgmma != 1) printf("  the GEMM on a fresh thread did not run on the Hopper path\n");
  ConvCaseCounts conv;
  for (int i = 0; i < 8 && conv.on_wgmma == 0; ++i) on_fresh_thread([&] { bad |= hopper_conv_case(i, conv); });
  if (conv.on_wgmma == 0) printf("  no convolution on a fresh thread ran on the Hopper path\n");
  return bad || on_wgmma != 1 || conv.on_wgmma == 0;
}

int main(int argc, char** argv) {
  SIM_CHECK(argc == 6 || (argc == 7 && std::string(argv[6]) == "pinned"),
            "usage: %s <gemm cases> <conv cases> <seed> <late copies: 0|1> <late wgmma: 0|1> [pinned]", argv[0]);
  sim::pinned.on = argc == 7;
  const int cases = std::stoi(argv[1]), conv_cases = std::stoi(argv[2]);
  sim::rng.seed(std::stoull(argv[3]));
  sim::hopper::rng.seed(std::stoull(argv[3]));
  sim::hopper::copies_late = std::stoi(argv[4]);
  sim::hopper::wgmma_late = std::stoi(argv[5]);
  sim::shared_memory = smem;
  sim::shared_capacity = sizeof smem;

  int mismatches = 0;
  const int checked = check_layouts(mismatches);
  printf("layout: %d/%d mismatches\n", mismatches, checked);
  int failed = 0, on_wgmma = 0, on_pairs = 0, on_ping_pong = 0, copied_out = 0;
  for (int i = 0; i < cases; ++i) failed += hopper_gemm_case(i, on_wgmma, on_pairs, on_ping_pong, copied_out);
  printf("wgmma cases: %d\nwgmma_2x1 cases: %d\nwgmma_pingpong cases: %d\n"
         "wgmma cases storing through the copy engine: %d\ngemm: %d/%d failed\n",
         on_wgmma, on_pairs, on_ping_pong, copied_out, failed, cases);
  const bool occupancy_bad = cases > 0 && check_cluster_occupancy();
  if (cases > 0) printf("cluster occupancy asked once per device and kernel: %s\n", occupancy_bad ? "FAILED" : "ok");
  int walk_mismatches = 0;
  const int walked = check_im2col_walk(walk_mismatches);
  printf("im2col walk: %d/%d mismatches\n", walk_mismatches, walked);
  int conv_failed = 0;
  ConvCaseCounts conv;
  for (int i = 0; i < conv_cases; ++i) conv_failed += hopper_conv_case(i, conv);
  const bool path_bad = bad_conv_path_accepted(), far_taps_bad = far_taps_wrong();
  printf("conv wgmma cases: %d\nconv wgmma cases by default: %d\nconv wgmma wgrad cases that split: %d\n"
         "conv wgmma dgrad cases with a stride: %d\n"
         "conv wgmma dgrad cases with a phase no tap reaches: %d\nconv: %d/%d failed\n"
         "bad MPGEMM_CONV_PATH refused: %s\ntaps at the im2col offsets' limit: %s\n", conv.on_wgmma, conv.by_default,
         conv.split,
         conv.strided_dgrad, conv.unreached_phase, conv_failed, conv_cases, path_bad ? "FAILED" : "ok",
         far_taps_bad ? "FAILED" : "ok");
  const bool fresh_bad = cases > 0 && conv_cases > 0 && check_fresh_threads();
  if (cases > 0 && conv_cases > 0) printf("first Hopper launches on fresh threads: %s\n", fresh_bad ? "FAILED" : "ok");
  return mismatches || failed || occupancy_bad || walk_mismatches || conv_failed || path_bad || far_taps_bad ||
         fresh_bad;
}
