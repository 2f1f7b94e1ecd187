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
//    whose tile order has a partial group; one in eight on the narrow tiles
//    (128 x 128 and 128 x 64, rings of 6 and 8 stages), asked for by
//    MPGEMM_GEMM_PATH=wgmma_n128 or =wgmma_n64, or picked by the default
//    on outputs of at most 128 columns (MPGEMM_NARROW_TILES=0 in every
//    other case), with K that wraps their rings; one in sixteen split-K on
//    the Hopper block as the default plans it (MPGEMM_WGMMA_SPLIT_K unset),
//    one tile's K split 4 ways, the fp32 partial sums poisoned before the
//    launch; and one in sixteen
//    forced onto the wide tile with operands of any pitch and base
//    (MPGEMM_PADDED_OPERANDS=1), which the launcher copies to aligned
//    pitches in the (poisoned) workspace first, every other one of those
//    splitting K too; the pre-activation (GELU's input) asked for beside D
//    in one case of sixteen, forced onto the wide tile with K-major
//    operands, whose pre-activation kernel stores it from its epilogue
//    (every other one from registers, D's base off 16 bytes), and in one
//    case of 32 on the narrow tile the default picks, which the launcher
//    runs again with no activation for it; A's row sums asked for beside D
//    (linear's wgrad: A column-major, B row-major, one matrix) in one case of
//    sixteen on the wide tile forced and in another split 4 ways, checked
//    in a poisoned buffer, and refused where a plan cannot sum them (K-major
//    A, a batch); and on each other Hopper tile, forced and as the plan
//    picks it (row_sums_on_every_tile), each case's launch its tile's row
//    sums kernel's; stream-K (MPGEMM_STREAM_K=1) as the plan picks it on
//    few multiprocessors, so that runs fall every way across tiles
//    (stream_k_cases). Every pair and narrow case
//    must run the kernel it asks for: its operands are ones the copy engine
//    describes. Half
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
// With SIM_FIRST_FAILURE set in the environment (a planted bug's run) the
// cases stop at the first that fails.
// "pinned" runs every case on A row-major, B column-major and fp16 inputs:
// the one Hopper kernel of each kind that a planted bug's build replaces
// (hopper_planted.cpp; a convolution's: hopper_conv_planted.cpp); but the
// whole-K row sums case, on the row sums kernel's layouts (its planted copy
// too), and no split one, nor those on the other tiles; the stream-K cases
// run there too.
// Prints "layout: F/N mismatches", "gemm: F/N failed", "wgmma cases: N" (on
// any Hopper kernel), "wgmma_2x1 cases: N", "wgmma_pingpong cases: N",
// "wgmma_n128 cases: N", "wgmma_n64 cases: N", "wgmma split-K cases: N",
// "wgmma cases on padded copies: N",
// "wgmma cases storing through the copy engine: N", "wgmma cases storing
// the pre-activation from the epilogue: N", "wgmma cases storing the
// pre-activation from registers: N", "wgmma cases running the product again
// for the pre-activation: N", "wgmma cases summing A's rows: N", "wgmma
// split-K cases summing A's rows: N", "gemm: F/N failed", "row sums refused
// where the plan cannot sum them: ok", "GELU's tanh form on its
// pre-activation kernel: 2 of 2 cases, refused elsewhere: ok", "row sums on every Hopper tile: ok
// (wgmma_2x1 N, wgmma_pingpong N, wgmma_n128 N, wgmma_n64 N)", "stream-K on
// the wide and narrow tiles: ok (N cases, N slots added)" and "cluster
// occupancy asked once per device and kernel: ok" (or FAILED), then "im2col walk: F/N
// mismatches", "conv wgmma cases: N", "conv wgmma cases by default: N",
// "conv wgmma wgrad cases that split: N", "conv wgmma cases on wgmma_n128:
// N", "conv wgmma cases on wgmma_n64: N", "conv wgmma dgrad cases with a
// stride: N", "conv wgmma dgrad cases with a phase no tap reaches: N",
// "conv wgmma dgrad cases with an addend: N",
// "conv: F/N failed", "bad MPGEMM_CONV_PATH refused: ok", "taps at the
// im2col offsets' limit: ok", "conv as gemm: F/N failed (N on the Hopper
// GEMM)" (1x1 convolutions through the GEMM, conv_gemm_cases.cpp) and
// "first Hopper launches on fresh threads: ok"; exits 1 on a failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/element_traits.cuh"
#include "common/tile_configs.h"
#include "gemm/launch.h"
#include "kernel_sim/conv_gemm_cases.h"
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

// B's tile of a Hopper tile, K-major and MN-major, against the models.
template <class Tile>
static int check_b_tiles(int& mismatches) {
  return check_operand_tile<Tile::kBlockN, true, Tile::kInstrN>(mismatches) +
         check_operand_tile<Tile::kBlockN, false, Tile::kInstrN>(mismatches);
}

// The ring of Stages stages: after i slices, stage i mod Stages in round i /
// Stages, whose parity the waits name; and the same after a jump of j slices
// from there (a ping-pong consumer passing the other's tile).
template <int Stages>
static int check_ring(int& mismatches) {
  int checked = 0;
  sm90::PipelineState<Stages> pipe;
  for (int i = 0; i < 1000; ++i, pipe.advance(), ++checked) {
    if (pipe.stage != i % Stages || int(pipe.phase) != i / Stages % 2)
      mismatch(mismatches, "ring position (stage, parity)", i, Stages, pipe.stage * 2 + pipe.phase,
               i % Stages * 2 + i / Stages % 2);
    for (int j : {0, 1, 3, 4, 5, 7, 8, 63, 64, 65, 1 << 20}) {
      sm90::PipelineState<Stages> jumped = pipe;
      jumped.advance(j);
      const int to = i + j;
      if (jumped.stage != to % Stages || int(jumped.phase) != to / Stages % 2)
        mismatch(mismatches, "ring position after a jump (stage, parity)", i, j, jumped.stage * 2 + jumped.phase,
                 to % Stages * 2 + to / Stages % 2);
    }
  }
  return checked;
}

static int check_layouts(int& mismatches) {
  using Config = WgmmaBlockConfig;
  constexpr int kCooperativeRows = WgmmaTile::kBlockM;
  constexpr int kPingPongRows = WgmmaPingPongTile::kBlockM;
  static_assert(WgmmaTile::kStages == 4 && WgmmaPingPongTile::kStages == 4 && WgmmaN128Tile::kStages == 6 &&
                    WgmmaN64Tile::kStages == 8,
                "the rings bench/NOTES.md's predictions assume");
  int checked = check_models(mismatches) + check_operand_tile<kCooperativeRows, true, Config::kInstrM>(mismatches) +
                check_operand_tile<kCooperativeRows, false, Config::kInstrM>(mismatches) +
                check_operand_tile<kPingPongRows, true, Config::kInstrM>(mismatches) +
                check_operand_tile<kPingPongRows, false, Config::kInstrM>(mismatches) +
                check_b_tiles<WgmmaTile>(mismatches) + check_b_tiles<WgmmaN128Tile>(mismatches) +
                check_b_tiles<WgmmaN64Tile>(mismatches) + check_output_strip<4>(mismatches) +
                check_output_strip<2>(mismatches) + check_ring<WgmmaTile::kStages>(mismatches) +
                check_ring<WgmmaN128Tile::kStages>(mismatches) + check_ring<WgmmaN64Tile::kStages>(mismatches);
  // Every accumulator register of the widest tile (the narrow ones' are its first N / 2).
  for (int thread = 0; thread < Config::kWarpgroupThreads; ++thread)
    for (int reg = 0; reg < WgmmaTile::kAccumulators; ++reg, ++checked) {
      const model::FragmentElement e = model::accumulator_element(thread, reg);
      if (sm90::accumulator_row(thread, reg) != e.row)
        mismatch(mismatches, "accumulator row", thread, reg, sm90::accumulator_row(thread, reg), e.row);
      if (sm90::accumulator_col(thread, reg) != e.col)
        mismatch(mismatches, "accumulator column", thread, reg, sm90::accumulator_col(thread, reg), e.col);
    }
  return checked;
}

// What the random GEMM cases covered: cases on any Hopper kernel, on each
// of the kernels only MPGEMM_GEMM_PATH or MPGEMM_NARROW_TILES asks for, and
// those that stored D through the copy engine.
struct GemmCaseCounts {
  int on_wgmma = 0, on_pairs = 0, on_ping_pong = 0, on_n128 = 0, on_n64 = 0, copied_out = 0, split = 0, padded = 0;
  int pre_activation_from_epilogue = 0, pre_activation_from_registers = 0, pre_activation_again = 0;
  int row_sums = 0, row_sums_split = 0;
  int activation_grad_from_epilogue = 0, activation_grad_from_ping_pong = 0, activation_grad_after = 0;
};

// A random problem on the launcher's plan for an sm_90 device, or a Hopper
// plan the launcher must refuse.
static bool hopper_gemm_case(int index, GemmCaseCounts& counts) {
  // Pairs in one case of four, every other one with ping-pong consumers; of
  // each pair kernel's cases, one in two tall. Narrow tiles in one case of
  // eight, in turn wgmma_n128 and wgmma_n64 forced, and the tile
  // the default picks for an output of at most 128 columns.
  const bool forced = index % 4 == 3, paired = index % 4 == 1, ping_pong = index % 8 == 5;
  const bool narrow = index % 8 == 4;
  // Split-K on the Hopper block in one case of sixteen: one tile (128 rows,
  // 129 to 256 columns) with K of 16 or 17 slices, which the cost model
  // splits 4 ways (at 17, 5 slices a split: the last one's partly past K).
  // On 4 multiprocessors, where WMMA's tiles do not split, the model finds
  // the split 1.5x as fast as ping-pong's whole K, so that the default
  // (MPGEMM_WGMMA_SPLIT_K unset) takes it; the padded and row sums' splits
  // below ask for it ("1") on 132, where the wide tile is forced (padded)
  // or WMMA's split would run (row sums).
  const bool split = index % 16 == 8;
  // Operands of any pitch on the Hopper kernel forced (MPGEMM_PADDED_OPERANDS=1):
  // copied to aligned pitches first, in one case of sixteen; every other one
  // of those also splits K (the copies, then the partial sums, in one
  // workspace), on a split case's shape.
  const bool padded = index % 16 == 0, padded_split = index % 32 == 16;
  // The pre-activation asked for too: from the wide tile's epilogue in one
  // case of sixteen (every other forced case on operands the copy engine
  // describes), on K-major operands (nn.Linear's forward), every other one
  // with D's base off 16 bytes, so that both outputs are stored from
  // registers; by the product run again in one case of the narrow tile the
  // default picks (index 20 of a run's 24).
  const bool pre_activation_epilogue = index % 16 == 3, pre_activation_again = index % 32 == 20;
  const bool pre_activation_from_registers = index % 32 == 19;
  // A's row sums asked for too, on MN-major operands and a single matrix
  // (linear's wgrad): from the wide tile forced in one case of sixteen
  // (index 11), and split 4 ways as the split cases in another (index 10;
  // not where pinned: a planted build holds the whole-K kernel alone).
  const bool row_sums = index % 16 == 11, row_sums_split = index % 16 == 10 && !sim::pinned.on;
  // D = (A @ B) * activation'(Z): from the wide tile's epilogue forced in one
  // case of sixteen (index 7), on a K-major A and an MN-major B (an MLP's
  // dgrad): at index 7 of 32 on a tile of D's whole width beside a partial
  // one, with Z aligned as D (always where pinned, else in one case of two;
  // in the other Z is an element off, which the launcher must have read an
  // element at a time), so that the first consumer's threads load Z's words
  // with no checks; at index 23 with D's (and Z's) base 1 to 3 elements past
  // 16 bytes, so that D is stored from registers (and where odd, Z read an
  // element at a time, as where Z alone is off by one, which gemm_case draws
  // in one case of two there); from the epilogue of ping-pong pairs (index 5
  // of 32: four tiles or more, Z aligned as D; not where pinned: a planted
  // build holds the whole-K kernel alone, and that case is the planted
  // ping-pong bugs' strongest); and after the product: by split-K's
  // reduction (a split case, index 8 of 32) or a pass over D (a narrow case,
  // index 4: the first, so that a planted run that leaves the pass out stops
  // early).
  const bool activation_grad_epilogue = index % 16 == 7, activation_grad_misaligned = index % 32 == 23;
  const bool activation_grad_ping_pong = index % 32 == 5 && !sim::pinned.on;
  const bool activation_grad_after = index % 32 == 8 || index % 32 == 4;
  const int narrow_kind = index / 8 % 3;  // 0: wgmma_n128, 1: wgmma_n64, 2: the default's pick
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
  if (padded_split || row_sums_split) multiprocessors = 132;
  if (split) multiprocessors = 4;
  sim::use_multiprocessors(multiprocessors);
  if (forced || other_type) setenv("MPGEMM_GEMM_PATH", "wgmma", 1);
  if (paired) setenv("MPGEMM_GEMM_PATH", ping_pong ? "wgmma_pingpong" : "wgmma_2x1", 1);
  if (narrow && narrow_kind < 2) setenv("MPGEMM_GEMM_PATH", narrow_kind == 0 ? "wgmma_n128" : "wgmma_n64", 1);
  if (padded_split || row_sums_split) setenv("MPGEMM_WGMMA_SPLIT_K", "1", 1);
  if (padded) setenv("MPGEMM_PADDED_OPERANDS", "1", 1), setenv("MPGEMM_GEMM_PATH", "wgmma", 1);
  // The narrow tiles are the default: left to it where the plan should pick one, "0" elsewhere, so
  // that every other case keeps the tile it ran on before they were.
  if (!narrow || narrow_kind != 2) setenv("MPGEMM_NARROW_TILES", "0", 1);
  sim::GemmCaseSpec spec;
  // Mostly operands the copy engine can describe; always where D's type alone should keep the Hopper path away.
  spec.aligned = padded                                                                       ? 0
                 : paired || narrow || split || row_sums_split || other_type || refused || sim::rnd(0, 7) ? 1
                                                                                                  : 0;
  spec.whole_chunks = false;
  // So that every pair and narrow case runs its kernel, and every other forced one the wide tile's.
  spec.copyable_operands =
      paired || narrow || split || row_sums_split || padded || index % 8 == 3 || activation_grad_epilogue;
  // On each pair kernel: the tall cases store from registers, the others through the copy engine; every
  // forced case but one pre-activation case through the copy engine (the epilogue's strips turned over most
  // often).
  spec.d_copyable = (forced && !pre_activation_from_registers && !activation_grad_misaligned) ||
                    (paired ? index / 8 : index / 4) % 2 == 0;
  spec.d_misaligned = pre_activation_from_registers || activation_grad_misaligned;
  spec.activation_grad = activation_grad_epilogue || activation_grad_after || activation_grad_ping_pong;
  if (activation_grad_epilogue || activation_grad_ping_pong)
    spec.a_row_major = 1, spec.b_row_major = 1, spec.aligned = 1;
  spec.activation_input_aligned = activation_grad_ping_pong;
  spec.pre_activation = pre_activation_epilogue || pre_activation_again;
  if (pre_activation_epilogue) spec.a_row_major = 1, spec.b_row_major = 0, spec.aligned = 1;
  spec.a_row_sums = row_sums || row_sums_split;
  if (spec.a_row_sums) spec.a_row_major = 0, spec.b_row_major = 1, spec.aligned = 1;
  using OutputType = sim::GemmCaseSpec::OutputType;
  spec.d_type = other_type || refused ? OutputType::kOther16Bit : OutputType::kOpsOwn;
  if (other_type || refused) spec.min_k = 1;
  if (refused) {
    spec.has_plan = true;
    const TileConfigId hopper[] = {TileConfigId::kWgmma, TileConfigId::kWgmmaPair, TileConfigId::kWgmmaPingPong,
                                   TileConfigId::kWgmmaN128, TileConfigId::kWgmmaN64};
    spec.plan.config = hopper[sim::rnd(0, 4)];
    spec.expect = cudaErrorInvalidValue;
  }
  spec.max_m = 300, spec.max_n = 560, spec.max_k = 200;
  // Long K on one tile, as wide as it goes: up to 8 output strips a consumer through the copy engine, at
  // least 3 (each output buffer written again while a store may read it) in every other forced case.
  if (forced) spec.max_m = 128, spec.max_n = 256, spec.min_k = 64, spec.max_k = 640;
  if (forced && index % 8 == 3) spec.min_n = 129;
  // The derivative's epilogue on whole tiles (above): 65 to 128 rows, 256 to 300 columns.
  if (activation_grad_epilogue && !activation_grad_misaligned) {
    spec.min_m = 65, spec.min_n = 256, spec.max_n = 300, spec.max_k = 200;
    spec.activation_input_aligned = sim::pinned.on || sim::rnd(0, 1);
  }
  if (paired) spec.min_k = 300, spec.max_k = 520;  // K that wraps the ring within each tile
  if (ping_pong && !tall && !short_ping_pong) spec.min_m = 129, spec.min_n = 257;  // four tiles or more
  if (short_ping_pong) spec.max_m = 128, spec.max_n = 512, spec.min_k = 65, spec.max_k = 256, spec.batch = 1;
  if (tall) spec.min_m = 8 * 128 + 1, spec.max_m = 9 * 128, spec.max_n = 200, spec.min_k = 1, spec.max_k = 64;
  if (tall) spec.batch = 1;
  // Narrow: K that wraps the deeper rings (6 and 8 stages) within every
  // tile where a tile is forced (9 or 10 slices), any K where the plan
  // picks it, on up to four multiprocessors, so that each block walks
  // several tiles; columns up to 128 where the plan picks the tile (on one
  // multiprocessor, where no split of K on WMMA tiles can win it), past it
  // where one is forced.
  if (narrow) spec.max_m = 300, spec.max_n = narrow_kind == 2 ? 128 : 200, spec.max_k = 640;
  if (narrow) spec.min_k = narrow_kind == 2 ? 1 : 8 * 64 + 1;
  if (narrow) sim::use_multiprocessors(narrow_kind == 2 ? 1 : int(sim::rnd(1, 4)));
  if (split || padded_split || row_sums_split) spec.min_m = spec.max_m = 128, spec.min_n = 129, spec.max_n = 256;
  if (split || padded_split || row_sums_split) spec.min_k = 15 * 64 + 1, spec.max_k = 17 * 64, spec.batch = 1;
  GemmPlan plan;
  GemmShape shape;
  const uint64_t stores_before = sim::hopper::stores_issued, launches_before = sim::launches;
  const char* kind = refused      ? "refused"
                     : narrow     ? "narrow"
                     : split      ? "split-K"
                     : row_sums_split ? "split-K row sums"
                     : row_sums   ? "row sums"
                     : padded     ? "padded"
                     : forced     ? "forced"
                     : tall       ? "tall"
                     : ping_pong  ? "ping-pong"
                     : paired     ? "pairs"
                     : other_type ? "other type"
                                  : "gemm";
  bool bad = sim::gemm_case(kind, index, spec, &plan, &shape);
  unsetenv("MPGEMM_GEMM_PATH");
  unsetenv("MPGEMM_NARROW_TILES");
  unsetenv("MPGEMM_WGMMA_SPLIT_K");
  unsetenv("MPGEMM_PADDED_OPERANDS");
  if (padded && shape.k > 0 && plan.config != TileConfigId::kWgmma) {
    printf("padded case %d FAILED: the launcher planned %s, expected wgmma\n", index, tile_config(plan.config).name);
    bad = true;
  }
  if ((split || padded_split || row_sums_split) && (plan.config != TileConfigId::kWgmma || plan.split_k != 4)) {
    printf("%s case %d FAILED: the launcher planned %s with split_k=%d, expected wgmma split 4 ways\n", kind, index,
           tile_config(plan.config).name, plan.split_k);
    bad = true;
  }
  if (other_type && is_wgmma(plan.config)) {
    printf("other type case %d FAILED: the launcher planned the Hopper path for D it does not store\n", index);
    bad = true;
  }
  // The narrow tile the plan should pick: 64 columns or fewer, or 128
  // 128-column tiles that fill at most half of the multiprocessors, take
  // 128 x 64 tiles.
  const bool few_n128_tiles = (shape.m + 127) / 128 * ((shape.n + 127) / 128) * shape.batch * 2 <= sim::multiprocessors;
  const TileConfigId asked = ping_pong                        ? TileConfigId::kWgmmaPingPong
                             : paired                         ? TileConfigId::kWgmmaPair
                             : narrow_kind == 0               ? TileConfigId::kWgmmaN128
                             : narrow_kind == 1               ? TileConfigId::kWgmmaN64
                             : shape.n <= 64 || few_n128_tiles ? TileConfigId::kWgmmaN64
                                                              : TileConfigId::kWgmmaN128;
  if ((paired || narrow) && plan.config != asked) {
    printf("%s case %d FAILED: MPGEMM_GEMM_PATH asked for %s, the launcher planned %s\n", kind, index,
           tile_config(asked).name, tile_config(plan.config).name);
    bad = true;
  }
  if (row_sums && shape.k > 0 && (plan.config != TileConfigId::kWgmma || plan.split_k != 1)) {
    printf("row sums case %d FAILED: the launcher planned %s with split_k=%d, expected wgmma whole K\n", index,
           tile_config(plan.config).name, plan.split_k);
    bad = true;
  }
  counts.row_sums += row_sums, counts.row_sums_split += row_sums_split;
  if (refused) return bad;
  counts.on_wgmma += is_wgmma(plan.config);
  counts.on_pairs += plan.config == TileConfigId::kWgmmaPair;
  counts.on_ping_pong += plan.config == TileConfigId::kWgmmaPingPong;
  counts.on_n128 += plan.config == TileConfigId::kWgmmaN128;
  counts.on_n64 += plan.config == TileConfigId::kWgmmaN64;
  counts.split += is_wgmma(plan.config) && plan.split_k > 1;
  counts.padded += plan.padded;
  const bool from_epilogue = plan.config == TileConfigId::kWgmma && plan.split_k == 1;
  counts.pre_activation_from_epilogue += pre_activation_epilogue && from_epilogue;
  counts.pre_activation_from_registers +=
      pre_activation_epilogue && from_epilogue && sim::hopper::stores_issued == stores_before;
  counts.pre_activation_again += pre_activation_again && is_wgmma(plan.config) && !from_epilogue;
  counts.activation_grad_from_epilogue += activation_grad_epilogue && from_epilogue;
  // One launch: the product with the derivative in its epilogue, no pass after it.
  counts.activation_grad_from_ping_pong += activation_grad_ping_pong && plan.config == TileConfigId::kWgmmaPingPong &&
                                           sim::launches - launches_before == 1;
  counts.activation_grad_after += activation_grad_after && !from_epilogue;
  if (activation_grad_epilogue && shape.k > 0 && !from_epilogue) {
    printf("activation grad case %d FAILED: the launcher planned %s with split_k=%d, expected wgmma whole K\n",
           index, tile_config(plan.config).name, plan.split_k);
    bad = true;
  }
  if (pre_activation_epilogue && shape.k > 0 && !from_epilogue) {
    printf("pre-activation case %d FAILED: the launcher planned %s with split_k=%d, expected wgmma whole K\n", index,
           tile_config(plan.config).name, plan.split_k);
    bad = true;
  }
  counts.copied_out += sim::hopper::stores_issued != stores_before;
  return bad;
}

// A's row sums (linear's wgrad: A column-major, B row-major, one matrix, as
// hopper_gemm_case's row sums cases on the wide tile) on every other Hopper
// tile: forced by MPGEMM_GEMM_PATH (pairs, ping-pong, 128 x 128, 128 x 64)
// on 1 to 4 multiprocessors (2 to 4 for either kind of pair), so that a
// block walks several tiles, some past the first column of tiles; then as
// the plan picks them on 132 multiprocessors, for more than 128 columns of
// few tiles (ping-pong, as GPT-2's attention wgrads) and for at most 64
// (128 x 64). Each must match the reference and launch its tile's row sums
// kernel: a launch with the tile's cluster and its shared memory with the
// tile of ones (which tell the wide tile, pairs and ping-pong apart), that
// issued wgmmas of the tile's width and of 8 columns, the sums' (which tell
// the wide tile from the narrow ones, whose shared memory is the same).
// Counts the cases by the tile they ran on; whether one failed.
static bool row_sums_on_every_tile(int (&on_tile)[int(TileConfigId::kCount)]) {
  struct RowSumsCase {
    const char* path;  // MPGEMM_GEMM_PATH, or null for the plan's own pick
    TileConfigId tile;
    int64_t min_n, max_n;
  };
  const RowSumsCase cases[] = {{"wgmma_2x1", TileConfigId::kWgmmaPair, 1, 300},
                               {"wgmma_pingpong", TileConfigId::kWgmmaPingPong, 1, 300},
                               {"wgmma_n128", TileConfigId::kWgmmaN128, 1, 200},
                               {"wgmma_n64", TileConfigId::kWgmmaN64, 1, 150},
                               {nullptr, TileConfigId::kWgmmaPingPong, 129, 300},
                               {nullptr, TileConfigId::kWgmmaN64, 1, 64}};
  bool bad = false;
  for (int i = 0; i < int(std::size(cases)); ++i) {
    const RowSumsCase& c = cases[i];
    if (c.path) setenv("MPGEMM_GEMM_PATH", c.path, 1);
    const bool pairs = c.tile == TileConfigId::kWgmmaPair || c.tile == TileConfigId::kWgmmaPingPong;
    sim::use_multiprocessors(c.path ? int(sim::rnd(pairs ? 2 : 1, 4)) : 132);
    sim::GemmCaseSpec spec;
    spec.a_row_sums = true, spec.a_row_major = 0, spec.b_row_major = 1, spec.aligned = 1;
    spec.copyable_operands = true, spec.d_copyable = sim::rnd(0, 1);
    spec.d_type = sim::GemmCaseSpec::OutputType::kOpsOwn;
    spec.max_m = 260, spec.min_n = c.min_n, spec.max_n = c.max_n, spec.min_k = 1, spec.max_k = 200;
    GemmPlan plan;
    const char* kind = c.path ? "row sums forced" : "row sums by default";
    sim::hopper::wgmma_widths.clear();
    bool case_bad = sim::gemm_case(kind, i, spec, &plan);
    unsetenv("MPGEMM_GEMM_PATH");
    // The launch of the plan's tile's row sums kernel: its cluster, its shared memory with the tile of ones,
    // and its wgmmas' widths.
    struct Launch {
      size_t smem = 0;
      unsigned cluster = 0;
      std::set<int> widths;
    };
    const Launch want = with_tile(
        AllTiles{}, plan.config,
        [](auto tile) {
          using Tile = decltype(tile);
          if constexpr (Tile::kWgmma)
            return Launch{size_t(sm90::kSmemBytesWithOnes<sm90::WgmmaSmem<Tile, false, false>>),
                          unsigned(Tile::kClusterM), {Tile::kInstrN, 8}};
          return Launch{};
        },
        Launch{});
    if (plan.config != c.tile || sim::last_smem != want.smem || sim::last_cluster != want.cluster ||
        sim::hopper::wgmma_widths != want.widths) {
      printf("%s case %d FAILED: planned %s, expected %s; the last launch was not the plan's row sums kernel "
             "(%zu bytes of shared memory, clusters of %u, %zu widths of wgmma; expected %zu, %u, %zu)\n",
             kind, i, tile_config(plan.config).name, tile_config(c.tile).name, sim::last_smem, sim::last_cluster,
             sim::hopper::wgmma_widths.size(), want.smem, want.cluster, want.widths.size());
      case_bad = true;
    }
    ++on_tile[int(plan.config)];
    bad |= case_bad;
  }
  return bad;
}

// Stream-K (MPGEMM_STREAM_K=1) as the plan picks it, on few
// multiprocessors so that every way a run can fall is met. On the wide
// tile: one tile over up to 6 runs (the block that ends it adds 5 slots),
// one over 3 to 5, four tiles on 3 blocks (a run ending in one tile and
// starting in the next) and two on 7; on the narrow tiles (the plan's for
// at most 128 columns): one 128 x 128 tile over up to 10 runs (whose whole
// K the plan weighs on 128 x 64 tiles) and three on 5 blocks, one 128 x 64
// tile of 1 to 64 columns over 3 to 5 runs, and four on 3 blocks. Ragged
// edges, K remainders, every layout, fp16 and bf16, D through the copy
// engine or from registers, with the bias and activation gemm_case draws. The workspace is poisoned, its flags zeroed by
// the launcher. Each case must match the reference, and every tile split
// between runs must have been fixed up: counts the cases and the slots
// added (grid_flag_waits). Then the first case's shape asking for GELU's
// input too, on K-major operands: the launch keeps the whole-K kernel that
// stores it from its epilogue, with no slots. Whether one failed.
static bool stream_k_cases(int& cases_run, uint64_t& slots_added) {
  struct StreamKCase {
    int multiprocessors;
    int64_t min_m, max_m, min_n, max_n, min_slices, max_slices;
    bool pre_activation;  // the whole-K kernel that stores it, not stream-K
    TileConfigId tile;    // the one the plan must stream on
  };
  constexpr TileConfigId kWide = TileConfigId::kWgmma, kN128 = TileConfigId::kWgmmaN128,
                         kN64 = TileConfigId::kWgmmaN64;
  const StreamKCase cases[] = {{11, 128, 128, 129, 256, 20, 24, false, kWide},
                               {5, 128, 128, 129, 256, 12, 20, false, kWide},
                               {3, 129, 256, 257, 512, 8, 16, false, kWide},
                               {7, 129, 256, 129, 256, 16, 24, false, kWide},
                               {11, 128, 128, 65, 128, 36, 48, false, kN128},
                               {5, 257, 384, 65, 128, 16, 24, false, kN128},
                               {5, 128, 128, 1, 64, 12, 20, false, kN64},
                               {3, 385, 512, 33, 64, 8, 16, false, kN64},
                               {11, 128, 128, 129, 256, 20, 24, true, kWide}};
  bool bad = false;
  const uint64_t waits_before = sim::hopper::grid_flag_waits;
  for (int i = 0; i < int(std::size(cases)); ++i) {
    const StreamKCase& c = cases[i];
    setenv("MPGEMM_STREAM_K", "1", 1);
    // The wide tile's cases keep it whatever their width.
    if (c.tile == kWide) setenv("MPGEMM_NARROW_TILES", "0", 1);
    sim::use_multiprocessors(c.multiprocessors);
    sim::GemmCaseSpec spec;
    spec.aligned = 1, spec.copyable_operands = true, spec.d_copyable = sim::rnd(0, 1), spec.batch = 1;
    spec.d_type = sim::GemmCaseSpec::OutputType::kOpsOwn;
    spec.min_m = c.min_m, spec.max_m = c.max_m, spec.min_n = c.min_n, spec.max_n = c.max_n;
    spec.min_k = (c.min_slices - 1) * 64 + 1, spec.max_k = c.max_slices * 64;
    if (c.pre_activation) spec.pre_activation = true, spec.a_row_major = 1, spec.b_row_major = 0;
    GemmPlan plan;
    GemmShape shape;
    const uint64_t waits = sim::hopper::grid_flag_waits;
    bool case_bad = sim::gemm_case("stream-K", i, spec, &plan, &shape);
    unsetenv("MPGEMM_STREAM_K");
    unsetenv("MPGEMM_NARROW_TILES");
    const int block_n = tile_config(c.tile).block_n;
    const int64_t tiles = (shape.m + 127) / 128 * ((shape.n + block_n - 1) / block_n);
    if (c.pre_activation) {
      if (plan.config != TileConfigId::kWgmma || plan.stream_k_blocks != 0 || sim::hopper::grid_flag_waits != waits) {
        printf("stream-K case %d FAILED: GELU's input from the epilogue planned %s with %d stream-K blocks, %lu "
               "slots added\n",
               i, tile_config(plan.config).name, plan.stream_k_blocks,
               (unsigned long)(sim::hopper::grid_flag_waits - waits));
        case_bad = true;
      }
      bad |= case_bad;
      continue;
    }
    if (plan.config != c.tile || plan.stream_k_blocks == 0 || sim::hopper::grid_flag_waits == waits ||
        sim::last_grid.x != unsigned(plan.stream_k_blocks)) {
      printf("stream-K case %d FAILED: planned %s with %d stream-K blocks for %ld tiles on %d multiprocessors, a "
             "grid of %u, %lu slots added\n",
             i, tile_config(plan.config).name, plan.stream_k_blocks, long(tiles), c.multiprocessors,
             sim::last_grid.x, (unsigned long)(sim::hopper::grid_flag_waits - waits));
      case_bad = true;
    }
    ++cases_run;
    bad |= case_bad;
  }
  // Each consumer waits for its own part of a slot.
  slots_added = (sim::hopper::grid_flag_waits - waits_before) / WgmmaBlockConfig::kConsumers;
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
  const auto on_fresh_thread = [](auto run) { std::thread(run).join(); };
  GemmCaseCounts gemm;
  // Case 1: pairs of blocks on operands the copy engine describes, always on the Hopper path.
  on_fresh_thread([&] { bad |= hopper_gemm_case(1, gemm); });
  if (gemm.on_wgmma != 1) printf("  the GEMM on a fresh thread did not run on the Hopper path\n");
  ConvCaseCounts conv;
  for (int i = 0; i < 8 && conv.on_wgmma == 0; ++i) on_fresh_thread([&] { bad |= hopper_conv_case(i, conv); });
  if (conv.on_wgmma == 0) printf("  no convolution on a fresh thread ran on the Hopper path\n");
  return bad || gemm.on_wgmma != 1 || conv.on_wgmma == 0;
}

// The device this driver simulates (mock/cuda_runtime.h).
const int sim::device_arch = __CUDA_ARCH__;

// Geometries of x's fold checked on their own (folds_of_x_wrong) each run.
constexpr int kFoldGeometries = 6;

// This driver links sim arch 800's objects of the files it shares with that
// arch (test_kernel_sim.py's shared_files: the WMMA tiles and convolutions,
// the GEMM's launcher, the plans), which hold the code a build at 900 would
// only where none of their tiles and input types needs more than sm_80.
template <class... Tiles>
constexpr bool wmma_tiles_need_at_most_sm80(TileList<Tiles...>) {
  return ((std::is_base_of_v<WgmmaBlockConfig, Tiles> || Tiles::kMinArch <= 80) && ...);
}
static_assert(wmma_tiles_need_at_most_sm80(AllTiles{}) && ElementTraits<__half>::kMinArch <= 800 &&
                  ElementTraits<__nv_bfloat16>::kMinArch <= 800,
              "a WMMA tile or input type needs more than sm_80: build the shared files at 900 too");

int main(int argc, char** argv) {
  SIM_CHECK(argc == 6 || (argc == 7 && std::string(argv[6]) == "pinned"),
            "usage: %s <gemm cases> <conv cases> <seed> <late copies: 0|1> <late wgmma: 0|1> [pinned]", argv[0]);
  sim::pinned.on = argc == 7;
  const int cases = std::stoi(argv[1]), conv_cases = std::stoi(argv[2]);
  sim::rng.seed(std::stoull(argv[3]));
  sim::hopper::rng.seed(std::stoull(argv[3]));
  sim::fiber::seed_order(std::stoull(argv[3]));
  sim::hopper::copies_late = std::stoi(argv[4]);
  sim::hopper::wgmma_late = std::stoi(argv[5]);
  sim::shared_memory = smem;
  sim::shared_capacity = sizeof smem;

  int mismatches = 0;
  const int checked = check_layouts(mismatches);
  printf("layout: %d/%d mismatches\n", mismatches, checked);
  int failed = 0;
  GemmCaseCounts gemm;
  // A planted bug's run (SIM_FIRST_FAILURE set) has shown what it must at its first failed case.
  const bool first_failure = std::getenv("SIM_FIRST_FAILURE") != nullptr;
  for (int i = 0; i < cases && !(first_failure && failed); ++i) failed += hopper_gemm_case(i, gemm);
  printf("wgmma cases: %d\nwgmma_2x1 cases: %d\nwgmma_pingpong cases: %d\nwgmma_n128 cases: %d\n"
         "wgmma_n64 cases: %d\nwgmma split-K cases: %d\nwgmma cases on padded copies: %d\n"
         "wgmma cases storing through the copy engine: %d\n"
         "wgmma cases storing the pre-activation from the epilogue: %d\n"
         "wgmma cases storing the pre-activation from registers: %d\n"
         "wgmma cases running the product again for the pre-activation: %d\n"
         "wgmma cases summing A's rows: %d\nwgmma split-K cases summing A's rows: %d\n"
         "wgmma cases multiplying by the activation's derivative in the epilogue: %d\n"
         "wgmma_pingpong cases multiplying by the activation's derivative in the epilogue: %d\n"
         "cases multiplying by the activation's derivative after the product: %d\ngemm: %d/%d failed\n",
         gemm.on_wgmma, gemm.on_pairs, gemm.on_ping_pong, gemm.on_n128, gemm.on_n64, gemm.split, gemm.padded,
         gemm.copied_out, gemm.pre_activation_from_epilogue, gemm.pre_activation_from_registers,
         gemm.pre_activation_again, gemm.row_sums, gemm.row_sums_split, gemm.activation_grad_from_epilogue,
         gemm.activation_grad_from_ping_pong, gemm.activation_grad_after, failed, cases);
  // A's row sums asked of plans that cannot sum them: K-major A on the wide
  // tile, and a batch of two, each refused with D and the sums untouched.
  bool row_sums_bad = false;
  for (const bool batched : {false, true}) {
    sim::GemmCaseSpec spec;
    spec.a_row_sums = true, spec.expect = cudaErrorInvalidValue, spec.aligned = 1, spec.copyable_operands = true;
    spec.a_row_major = batched ? 0 : 1, spec.b_row_major = 1, spec.batch = batched ? 2 : 1;
    spec.max_m = spec.max_n = 64, spec.min_k = 16, spec.max_k = 64;
    setenv("MPGEMM_GEMM_PATH", "wgmma", 1);
    row_sums_bad |= cases > 0 && sim::gemm_case("row sums refused", 0, spec);
    unsetenv("MPGEMM_GEMM_PATH");
  }
  printf("row sums refused where the plan cannot sum them: %s\n", row_sums_bad ? "FAILED" : "ok");
  // GELU's tanh form (mpgemm.mlp's, GPT-2's) on the pre-activation kernel
  // built for it, on ping-pong pairs, which the plan takes for it over the
  // heuristic's whole-K Hopper plan of K-major operands: on 4
  // multiprocessors (two pairs, each consumer several 64 x 256 tiles), D and
  // the pre-activation through the copy engine (case 0) and from registers
  // (D's base off 16 bytes, case 1); refused with D and Z untouched on an
  // MN-major B (case 2), whose plan has no such epilogue (the ops then run
  // torch's pass). Not in a pinned run, whose planted build holds no copy of
  // it.
  bool gelu_tanh_bad = false;
  int gelu_tanh_ran = 0;
  for (int c = 0; c < 3 && cases > 0 && !sim::pinned.on && !(first_failure && failed); ++c) {
    sim::use_multiprocessors(4);
    sim::GemmCaseSpec spec;
    spec.pre_activation = spec.gelu_tanh = true;
    spec.aligned = 1, spec.copyable_operands = true, spec.d_type = sim::GemmCaseSpec::OutputType::kOpsOwn;
    spec.a_row_major = 1, spec.b_row_major = c == 2;
    spec.d_copyable = c == 0, spec.d_misaligned = c == 1;
    // Wider than the narrow tiles' 128 columns, K of 1 to 4 slices (no split on any plan).
    spec.min_m = 1, spec.max_m = 300, spec.min_n = 129, spec.max_n = 560, spec.min_k = 1, spec.max_k = 256;
    if (c == 2) spec.expect = cudaErrorInvalidValue;
    GemmPlan plan;
    const uint64_t stores_before = sim::hopper::stores_issued, launches_before = sim::launches;
    bool case_bad = sim::gemm_case("GELU tanh", c, spec, &plan);
    const bool copied = sim::hopper::stores_issued != stores_before, launched = sim::launches != launches_before;
    if (c < 2 && (plan.config != TileConfigId::kWgmmaPingPong || plan.split_k != 1 || copied != (c == 0) ||
                  !launched)) {
      printf("GELU tanh case %d FAILED: planned %s with split_k=%d, stored %s the copy engine\n", c,
             tile_config(plan.config).name, plan.split_k, copied ? "through" : "without");
      case_bad = true;
    }
    gelu_tanh_ran += c < 2 && !case_bad;
    gelu_tanh_bad |= case_bad;
  }
  printf("GELU's tanh form on its pre-activation kernel: %d of 2 cases, refused elsewhere: %s\n", gelu_tanh_ran,
         gelu_tanh_bad ? "FAILED" : "ok");
  // Row sums on the other Hopper tiles: not in a pinned run, whose planted
  // build holds no planted copy of their kernels.
  int row_sums_on[int(TileConfigId::kCount)] = {};
  const bool row_sums_tiles_bad =
      cases > 0 && !sim::pinned.on && !(first_failure && failed) && row_sums_on_every_tile(row_sums_on);
  printf("row sums on every Hopper tile: %s (wgmma_2x1 %d, wgmma_pingpong %d, wgmma_n128 %d, wgmma_n64 %d)\n",
         row_sums_tiles_bad ? "FAILED" : "ok", row_sums_on[int(TileConfigId::kWgmmaPair)],
         row_sums_on[int(TileConfigId::kWgmmaPingPong)], row_sums_on[int(TileConfigId::kWgmmaN128)],
         row_sums_on[int(TileConfigId::kWgmmaN64)]);
  // Stream-K (in a pinned run too: the planted build holds its kernel on the pinned layouts).
  int stream_k_run = 0;
  uint64_t stream_k_slots = 0;
  const bool stream_k_bad = cases > 0 && !(first_failure && failed) && stream_k_cases(stream_k_run, stream_k_slots);
  printf("stream-K on the wide and narrow tiles: %s (%d cases, %lu slots added)\n", stream_k_bad ? "FAILED" : "ok",
         stream_k_run, (unsigned long)stream_k_slots);
  const bool occupancy_bad = cases > 0 && check_cluster_occupancy();
  if (cases > 0) printf("cluster occupancy asked once per device and kernel: %s\n", occupancy_bad ? "FAILED" : "ok");
  int walk_mismatches = 0;
  const int walked = check_im2col_walk(walk_mismatches);
  printf("im2col walk: %d/%d mismatches\n", walk_mismatches, walked);
  int conv_failed = 0;
  ConvCaseCounts conv;
  for (int i = 0; i < conv_cases && !(first_failure && (failed || conv_failed)); ++i)
    conv_failed += hopper_conv_case(i, conv);
  // Few-channel fprop and wgrad on folded taps, as many as the convolution
  // cases' fifth (30 cases: each of folded_conv_case's six kinds once).
  int folded_failed = 0;
  for (int i = 0; i < conv_cases / 5 && !(first_failure && (failed || conv_failed)); ++i)
    folded_failed += folded_conv_case(i, conv);
  printf("conv on folded taps: %d/%d failed\n", folded_failed, conv_cases / 5);
  // x's fold on its own, both ways, whatever the case counts (a planted fold bug's run has none).
  const bool folds_bad = !(first_failure && (failed || conv_failed)) && folds_of_x_wrong(kFoldGeometries);
  printf("x's folds by elements and in chunks: %s\n", folds_bad ? "FAILED" : "ok");
  const bool path_bad = bad_conv_variable_accepted("MPGEMM_CONV_PATH", "hopper");
  const bool staged_bad = bad_conv_variable_accepted("MPGEMM_STAGED_ROW_STORES", "yes") ||
                          bad_conv_variable_accepted("MPGEMM_DGRAD_ONE_LAUNCH", "yes") ||
                          bad_conv_variable_accepted("MPGEMM_CHUNKED_FOLD", "yes") ||
                          bad_conv_variable_accepted("MPGEMM_GATHERED_FOLD", "yes") ||
                          bad_conv_variable_accepted("MPGEMM_M64_TILE", "yes") ||
                          bad_conv_variable_accepted("MPGEMM_DGRAD_ADDEND", "yes");
  const bool far_taps_bad = far_taps_wrong();
  const bool moments_bad = conv_cases > 0 && !(first_failure && conv_failed) && tile_moments_wrong(conv);
  const bool splits_bad = conv_cases > 0 && !(first_failure && conv_failed) && wgrad_splits_wrong();
  // 1x1 convolutions as GEMMs, as many as the convolution cases' third.
  int conv_gemm_failed = 0;
  ConvGemmCounts conv_gemm;
  for (int i = 0; i < conv_cases / 3 && !(first_failure && (failed || conv_failed)); ++i)
    conv_gemm_failed += conv_gemm_case(i, conv_gemm);
  printf("conv as gemm: %d/%d failed (%d on the Hopper GEMM)\n", conv_gemm_failed, conv_cases / 3,
         conv_gemm.on_wgmma);
  printf("conv wgmma cases: %d\nconv wgmma cases by default: %d\nconv wgmma wgrad cases that split: %d\n"
         "conv wgmma cases on wgmma_n128: %d\nconv wgmma cases on wgmma_n64: %d\n"
         "conv wgmma wgrad cases on wgmma_m64: %d\nconv wgmma wgrad cases on wgmma_m64 that split: %d\n"
         "conv wgmma dgrad cases with a stride: %d\n"
         "conv wgmma dgrad cases with a phase no tap reaches: %d\n"
         "conv wgmma dgrad cases with their rows staged: %d\n"
         "conv wgmma dgrad cases with their phases in one launch: %d\n"
         "conv wgmma dgrad cases in one launch with a phase no tap reaches: %d\nconv cases on folded taps: %d\n"
         "conv cases on folded taps in chunks: %d\nconv cases on folded taps gathered: %d\n"
         "conv wgrad cases on folded taps on wgmma_m64: %d\n"
         "conv fprop cases with moments: %d\n"
         "conv wgmma dgrad cases with an addend: %d\n"
         "conv: %d/%d failed\n"
         "bad MPGEMM_CONV_PATH refused: %s\n"
         "bad MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD, MPGEMM_GATHERED_FOLD, "
         "MPGEMM_M64_TILE and MPGEMM_DGRAD_ADDEND refused: %s\n"
         "taps at the im2col offsets' limit: %s\nwgrad splits on 132 multiprocessors: %s\n"
         "column moments on each tile: %s\n",
         conv.on_wgmma, conv.by_default, conv.split, conv.on_n128, conv.on_n64, conv.on_m64, conv.split_on_m64,
         conv.strided_dgrad,
         conv.unreached_phase, conv.staged_rows, conv.one_launch, conv.one_launch_unreached, conv.folded,
         conv.folded_in_chunks, conv.folded_gathered, conv.folded_on_m64, conv.moments, conv.addend, conv_failed,
         conv_cases,
         path_bad ? "FAILED" : "ok", staged_bad ? "FAILED" : "ok", far_taps_bad ? "FAILED" : "ok",
         splits_bad ? "FAILED" : "ok", moments_bad ? "FAILED" : "ok");
  const bool fresh_bad = cases > 0 && conv_cases > 0 && check_fresh_threads();
  if (cases > 0 && conv_cases > 0) printf("first Hopper launches on fresh threads: %s\n", fresh_bad ? "FAILED" : "ok");
  return mismatches || failed || row_sums_bad || gelu_tanh_bad || row_sums_tiles_bad || stream_k_bad ||
         occupancy_bad || walk_mismatches || conv_failed || folded_failed || folds_bad || conv_gemm_failed || path_bad || staged_bad || far_taps_bad ||
         splits_bad || moments_bad || fresh_bad;
}
