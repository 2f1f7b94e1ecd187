// The epilogue of a Hopper block: each consumer adds bias and activation to
// its 64 x N fp32 accumulators (N the tile's width) in registers, in place, then rounds them
// once to D's type. Where D has a tensor map (a 16-byte aligned base and
// pitches) it writes strips of 64 rows x 128 bytes (sm90/layout.h's
// OutputStrip, 128-byte swizzle) to two shared-memory buffers in turn, and
// one thread stores each with the copy engine, two strips in flight, so that
// the consumer goes on to its next tile while the last strips drain;
// otherwise (and where D's rows are a strided dgrad's pixels, which no tiled
// box holds) it stores from registers, two elements at a time where D allows,
// or, in the kernels built for it (StagedRows), writes each strip as for the
// copy engine and reads it back a 16-byte chunk a thread, so that a warp
// stores four whole 128-byte rows at a time.
// Kernels built WithMoments (a convolution's fprop that feeds training batch
// norm) also sum each strip's columns as stored, read back from the strip
// before it is written again (strip_column_moments): each 64-row block's
// per-column moments (common/column_moments.cuh). Kernels built
// WithPreActivation store the sums with the bias, before the activation,
// to a second output laid out as D (GELU's input, which its backward reads);
// those built WithGeluTanh too apply GELU's tanh form, which no other
// kernel's epilogue applies.
// Kernels built WithActivationGrad (an MLP's dgrad, dZ = (dY @ W2) *
// gelu'(Z)) multiply the sums by the activation's derivative at Z, read from
// global memory where each thread holds D's elements, in place of the bias
// and the activation; kernels built WithAddend (a dgrad whose gradient has a
// second term, a ResNet block input's residual) add a tensor laid out as D,
// read the same way.
// Bias and activation come first, apart from the stores, so that each is
// written once per kernel rather than once per output type and way to store:
// woven into the stores, they made every kernel 72 to 84 k instructions that
// took ptxas half a minute each (bench/NOTES.md).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "arch/barrier.cuh"
#include "arch/copy_engine.cuh"
#include "arch/smem.cuh"
#include "common/column_moments.cuh"
#include "common/element_traits.cuh"
#include "common/gemm_params.h"
#include "sm90/layout.h"
#include "sm90/params.h"
#include "sm90/pipeline.cuh"

namespace mpgemm::kernels::sm90 {

// Adds the bias, if any, to the consumer's Registers accumulators (64 x
// 2 * Registers, columns from col0), in place. The bias type is dispatched
// once, outside the unrolled loop.
template <int Registers>
__device__ __forceinline__ void add_bias(float (&acc)[Registers], const GemmParams& p, int64_t col0, int thread) {
  constexpr int kCols = 2 * Registers;
  const int64_t past_col0 = p.n - col0;
  const int cols = past_col0 < kCols ? int(past_col0) : kCols;  // of the tile, inside D
  const auto add = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* bias = static_cast<const T*>(p.bias) + col0;
#pragma unroll
    for (int r = 0; r < Registers; r += 4) {
      const int col = accumulator_col(thread, r);
      const float b0 = col < cols ? ElementTraits<T>::to_float(bias[col]) : 0.0f;
      const float b1 = col + 1 < cols ? ElementTraits<T>::to_float(bias[col + 1]) : 0.0f;
      acc[r] += b0, acc[r + 1] += b1, acc[r + 2] += b0, acc[r + 3] += b1;
    }
  };
  if (p.bias != nullptr) visit_element_type(p.bias_type, add);
}

// Applies p's activation to the consumer's accumulators, in place.
template <int Registers>
__device__ __forceinline__ void activate(float (&acc)[Registers], const GemmParams& p) {
  const auto apply = [&](auto activation) {
#pragma unroll
    for (int i = 0; i < Registers; ++i) acc[i] = apply_activation(decltype(activation)::value, acc[i]);
  };
  switch (p.activation) {
    case Activation::kRelu: return apply(std::integral_constant<Activation, Activation::kRelu>{});
    case Activation::kGelu: return apply(std::integral_constant<Activation, Activation::kGelu>{});
    default: return;
  }
}

// Where row `row` of a matrix of D starts, in elements past the matrix:
// d_row_stride apart, or as the schedule's strided pixels say (found by
// division, once per row and tile).
__device__ __forceinline__ int64_t row_offset(const GemmParams& p, const WgmmaSchedule& s, int64_t row) {
  const PixelRows& g = s.d_pixels;
  if (g.cols == 0) return row * p.d_row_stride;
  const int image = int(row) / g.pixels, within = int(row) - image * g.pixels;
  const int a = within / g.cols, b = within - a * g.cols;
  return image * g.image_pitch + a * g.row_pitch + b * g.col_pitch;
}

// A thread's words of an operand read beside its Registers accumulators
// (an activation's input, an addend) in runs, each loaded before the first
// of its words is used: 16 groups of two rows' column pairs a run (32 4-byte
// words), or all of them where a thread holds fewer (the 128 x 64 tile's 8).
template <int Registers>
inline constexpr int kOperandRunGroups = Registers / 4 < 16 ? Registers / 4 : 16;

// Reads `operand` (Element, laid out as D: matrix `batch`, rows from row0,
// columns from col0) where the consumer's thread holds D's elements in its
// 64 x 2 * Registers accumulators, and hands each run of its words to
// combine(words, g0): words[g][h] holds the operand at row h's columns col +
// 8 (g0 + g) and the next, the first in the low half. Two elements a 4-byte
// word where the schedule stores D in pairs (the launcher checks that the
// operand's base allows them too) and the thread's rows and columns lie
// inside D, else one at a time, none past D (zero bits there). A thread's
// words come in runs of 32 (two on the 64 x 256 tile), each loaded before
// the first of them is used, so that a tile waits on global memory twice
// (loaded between their uses, each word was waited for in turn: 64 round
// trips a tile; bench/NOTES.md, "Z's loads ahead of the derivative"). A
// run's 32 registers fit beside the consumer's 128 accumulators and the
// block's own state; all 64 at once spill in the ping-pong pair's kernel
// (nvcc 13.2, sm_90a). The addressing is store_tile's, written again: the
// two sharing one helper changed the default kernels' machine code (nvcc
// 13.0, sm_90a), which their GPU proof holds for.
template <class Element, int Registers, class CombineRun>
__device__ __forceinline__ void for_each_operand_run(const void* operand, const GemmParams& p, const WgmmaSchedule& s,
                                                     int64_t batch, int64_t row0, int64_t col0, int thread,
                                                     const CombineRun& combine) {
  static_assert(sizeof(Element) == 2, "the operand's pairs are 4-byte words");
  constexpr int kGroups = Registers / 4;  // column pairs 8 apart, in each of a thread's two rows
  constexpr int kRun = kOperandRunGroups<Registers>;
  static_assert(kGroups % kRun == 0, "whole runs");
  const int64_t rows[2] = {row0 + accumulator_row(thread, 0), row0 + accumulator_row(thread, 2)};
  const int64_t col = col0 + accumulator_col(thread, 0);
  const Element* z[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    z[h] = static_cast<const Element*>(operand) + batch * p.d_batch_stride + row_offset(p, s, rows[h]) + col;
  const bool inside = s.d_pairs && rows[1] < p.m && col0 + 2 * Registers <= p.n;  // no checks
#pragma unroll
  for (int g0 = 0; g0 < kGroups; g0 += kRun) {
    uint32_t words[kRun][2];
    if (inside) {
#pragma unroll
      for (int g = 0; g < kRun; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) words[g][h] = *reinterpret_cast<const uint32_t*>(z[h] + 8 * (g0 + g));
    } else {
#pragma unroll
      for (int g = 0; g < kRun; ++g) {
        const int64_t c = col + 8 * (g0 + g);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint16_t* at = reinterpret_cast<const uint16_t*>(z[h] + 8 * (g0 + g));
          const uint32_t lo = rows[h] < p.m && c < p.n ? at[0] : 0u;
          const uint32_t hi = rows[h] < p.m && c + 1 < p.n ? at[1] : 0u;
          words[g][h] = lo | hi << 16;
        }
      }
    }
    combine(words, g0);
  }
}

// Applies combine(accumulator, operand element in fp32) to the accumulators
// of one run of words (for_each_operand_run's), in place.
template <class Element, int Registers, int Run, class Combine>
__device__ __forceinline__ void combine_run(float (&acc)[Registers], const uint32_t (&words)[Run][2], int g0,
                                            const Combine& combine) {
#pragma unroll
  for (int g = 0; g < Run; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Element* pair = reinterpret_cast<const Element*>(&words[g][h]);
      combine(acc[4 * (g0 + g) + 2 * h], ElementTraits<Element>::to_float(pair[0]));
      combine(acc[4 * (g0 + g) + 2 * h + 1], ElementTraits<Element>::to_float(pair[1]));
    }
}

// Multiplies the consumer's 64 x 2 * Registers accumulators (rows from row0,
// columns from col0 of matrix `batch` of D) by p.activation's derivative at
// the activation's input Z (p.activation_input: Element, laid out as D), in
// place (common/epilogue_math.h's apply_activation_grad), Z read by
// for_each_operand_run. The activation is dispatched once a run, outside its
// unrolled loop.
template <class Element, int Registers>
__device__ __forceinline__ void multiply_by_activation_grad(float (&acc)[Registers], const GemmParams& p,
                                                            const WgmmaSchedule& s, int64_t batch, int64_t row0,
                                                            int64_t col0, int thread) {
  for_each_operand_run<Element, Registers>(
      p.activation_input, p, s, batch, row0, col0, thread, [&](const auto& words, int g0) {
        const auto apply = [&](auto activation) {
          constexpr Activation kActivation = decltype(activation)::value;
          combine_run<Element>(acc, words, g0,
                               [](float& a, float z) { a = apply_activation_grad(kActivation, a, z); });
        };
        switch (p.activation) {
          case Activation::kRelu: return apply(std::integral_constant<Activation, Activation::kRelu>{});
          case Activation::kGelu: return apply(std::integral_constant<Activation, Activation::kGelu>{});
          case Activation::kGeluTanh: return apply(std::integral_constant<Activation, Activation::kGeluTanh>{});
          default: return;
        }
      });
}

// Applies GELU's tanh form (GPT-2's) to the consumer's accumulators, in
// place: the activation of the kernels built for it alone
// (kBlockGeluTanh), so that activate's dispatch, and with it every other
// kernel's code, stays as it is (common/epilogue_math.h).
template <int Registers>
__device__ __forceinline__ void activate_gelu_tanh(float (&acc)[Registers]) {
#pragma unroll
  for (int i = 0; i < Registers; ++i) acc[i] = gelu_tanh(acc[i]);
}

// Adds p.addend (Element, laid out as D), read by for_each_operand_run, to
// the consumer's 64 x 2 * Registers accumulators (rows from row0, columns
// from col0 of matrix `batch` of D), in place, in fp32: D is then rounded
// once.
template <class Element, int Registers>
__device__ __forceinline__ void add_addend(float (&acc)[Registers], const GemmParams& p, const WgmmaSchedule& s,
                                           int64_t batch, int64_t row0, int64_t col0, int thread) {
  for_each_operand_run<Element, Registers>(
      p.addend, p, s, batch, row0, col0, thread, [&](const auto& words, int g0) {
        combine_run<Element>(acc, words, g0, [](float& a, float addend) { a += addend; });
      });
}

// Rounds and stores the consumer's 64 x 2 * Registers accumulators (rows from row0,
// columns from col0 of matrix `batch` of D, whose elements start at `d`: p.d,
// or p.pre_activation laid out as D). Registers r..r+3 (r a multiple
// of 4) hold columns c and c+1 of two rows 8 apart, c lying 8 * (r / 4)
// columns past register 0's: each row's stores are constant offsets from one
// pointer. Threads whose rows and columns all lie inside D skip every bound
// check.
template <class Out, int Registers>
__device__ __forceinline__ void store_tile(const float (&acc)[Registers], const GemmParams& p, void* d,
                                           const WgmmaSchedule& s, int64_t batch, int64_t row0, int64_t col0,
                                           int thread) {
  const int64_t rows[2] = {row0 + accumulator_row(thread, 0), row0 + accumulator_row(thread, 2)};
  const int64_t col = col0 + accumulator_col(thread, 0);
  Out* out[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    out[h] = static_cast<Out*>(d) + batch * p.d_batch_stride + row_offset(p, s, rows[h]) + col;
  const auto store_pair = [](Out* at, float v0, float v1) {
    if constexpr (std::is_same_v<Out, float>) *reinterpret_cast<float2*>(at) = make_float2(v0, v1);
    else *reinterpret_cast<decltype(ElementTraits<Out>::round_pair(v0, v1))*>(at) =
        ElementTraits<Out>::round_pair(v0, v1);
  };
  if (s.d_pairs && rows[1] < p.m && col0 + 2 * Registers <= p.n) {  // inside D: no checks
#pragma unroll
    for (int r = 0; r < Registers; r += 4)
#pragma unroll
      for (int h = 0; h < 2; ++h) store_pair(out[h] + 8 * (r / 4), acc[r + 2 * h], acc[r + 2 * h + 1]);
  } else {
#pragma unroll
    for (int r = 0; r < Registers; r += 4) {
      const int64_t c = col + 8 * (r / 4);
      if (c >= p.n) break;
      const bool both = c + 1 < p.n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (rows[h] >= p.m) continue;
        Out* at = out[h] + 8 * (r / 4);
        if (both && s.d_pairs) {
          store_pair(at, acc[r + 2 * h], acc[r + 2 * h + 1]);
        } else {
          at[0] = ElementTraits<Out>::from_float(acc[r + 2 * h]);
          if (both) at[1] = ElementTraits<Out>::from_float(acc[r + 2 * h + 1]);
        }
      }
    }
  }
}

// Named barriers (0 is __syncthreads'): consumer c's warpgroup meets at
// kStripBarrier + c over its output strips (the kernel numbers its own after
// these).
constexpr int kStripBarrier = 1, kStripBarriersEnd = kStripBarrier + Config::kConsumers;

// Where a consumer's output strips stand: the buffers in `staging`, and how
// many strips it has handed to the copy engine (strip i goes through buffer
// i % kOutputBuffers, across tiles as within one).
struct OutputStaging {
  uint8_t (*buffers)[Config::kOutputStripBytes];
  uint32_t strips = 0;
};

// A consumer's output strips across its 64 x 2 * Registers accumulators:
// 64 rows by 128 bytes each (sm90/layout.h's OutputStrip), kRegisters
// accumulators of a thread per strip.
template <class Out, int Registers>
struct ConsumerStrips {
  using Strip = OutputStrip<sizeof(Out)>;
  static constexpr int kStrips = 2 * Registers / Strip::kCols;  // across the consumer's columns
  static_assert(kStrips * Strip::kCols == 2 * Registers, "whole strips span a consumer's columns");
  static constexpr int kRegisters = Registers / kStrips;
};

// Writes strip `strip` of the consumer's accumulators, rounded to Out, to the
// shared-memory buffer at `buffer_address` in the strip's swizzled layout;
// `rows`, the thread's two rows (accumulator_row of registers 0 and 2).
template <class Out, int Registers>
__device__ __forceinline__ void write_strip(const float (&acc)[Registers], uint32_t buffer_address, int strip,
                                            const int (&rows)[2], int thread) {
  using Strips = ConsumerStrips<Out, Registers>;
  using Strip = typename Strips::Strip;
#pragma unroll
  for (int r = strip * Strips::kRegisters; r < (strip + 1) * Strips::kRegisters; r += 4) {
    const int col = accumulator_col(thread, r);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v0 = acc[r + 2 * h], v1 = acc[r + 2 * h + 1];
      const uint32_t at = buffer_address + Strip::offset(rows[h], col - strip * Strip::kCols);
      if constexpr (std::is_same_v<Out, float>) {
        st_shared(at, make_float2(v0, v1));
      } else {
        const auto pair = ElementTraits<Out>::round_pair(v0, v1);
        st_shared(at, *reinterpret_cast<const uint32_t*>(&pair));
      }
    }
  }
}

// Adds one 4-byte word of a strip (kPerWord elements of Out) to a lane's sums.
template <class Out, int kPerWord>
__device__ __forceinline__ void add_strip_word(ShiftedSums (&sums)[kPerWord], uint32_t raw) {
  if constexpr (kPerWord == 1) {
    sums[0].add(*reinterpret_cast<const float*>(&raw));
  } else {
    const Out* pair = reinterpret_cast<const Out*>(&raw);
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) sums[e].add(ElementTraits<Out>::to_float(pair[e]));
  }
}

// The moments of a strip's columns (64 rows from row0, columns from
// strip_col0 of D), as written to the buffer at `buffer`: warp w takes the
// strip's w-th quarter of 32 bytes, lane 4 * word + group the word-th 4-byte
// word of it and rows group, group + 4, ...; the 4 lanes of a word combine in
// lane order (two shuffles), and the first writes block row0 / 64's moments
// of the word's columns to p.column_moments. Two lanes of a warp read each
// bank at once (a load's 4 rows and 2 chunks land on 4 swizzled chunks).
// A whole strip (every row block but D's last) issues its 16 loads a lane
// before the first sum, and its lanes' counts are constants: the loop below
// waits on each load in turn and divides by counts it reads, about 570
// instructions a thread a strip against about 300 (bench/NOTES.md,
// "Epilogue statistics without waiting on each load"). Both ways add the
// same values in the same order: the same bits.
template <class Out>
__device__ __forceinline__ void strip_column_moments(uint32_t buffer, const GemmParams& p, int64_t row0,
                                                     int64_t strip_col0, int thread) {
  constexpr int kPerWord = 4 / int(sizeof(Out)), kRows = Config::kInstrM, kGroups = 4;
  constexpr int kLaneRows = kRows / kGroups;
  const int lane = thread % 32, warp = thread / 32, word = lane / kGroups, group = lane % kGroups;
  const int byte = warp * 32 + word * 4;
  const int64_t col = strip_col0 + byte / int(sizeof(Out));
  const int64_t rows_left = p.m - row0;
  const int64_t blocks = (p.m + kRows - 1) / kRows;
  const auto store = [&](const ColumnMoments& m, int e) {
    if (group == 0 && col + e < p.n) store_moments(p.column_moments, blocks, p.d_row_stride, row0 / kRows, col + e, m);
  };
  ShiftedSums sums[kPerWord];
  if (rows_left >= kRows) {  // the same for the whole warpgroup
    // Rows group + 4i: the swizzle repeats every 8 rows (an atom), so two offsets serve all 16.
    static_assert(2 * kGroups == kSwizzleAtomBytes / kSwizzleBytes, "a lane's rows alternate between two swizzles");
    const uint32_t at[2] = {buffer + swizzle128_offset(uint32_t(group), uint32_t(byte)),
                            buffer + swizzle128_offset(uint32_t(group + kGroups), uint32_t(byte))};
    uint32_t raw[kLaneRows];
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) raw[i] = ld_shared_4(at[i % 2] + uint32_t(i / 2 * kSwizzleAtomBytes));
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) add_strip_word<Out>(sums, raw[i]);
#pragma unroll
    for (int e = 0; e < kPerWord; ++e)
      store(combine_across_lanes<kGroups - 1, /*kSameCounts=*/true>(sums[e].moments(), lane), e);
    return;
  }
#pragma unroll 4
  for (int r = group; r < kRows; r += kGroups) {
    if (r >= rows_left) break;
    add_strip_word<Out>(sums, ld_shared_4(buffer + swizzle128_offset(uint32_t(r), uint32_t(byte))));
  }
#pragma unroll
  for (int e = 0; e < kPerWord; ++e) store(combine_across_lanes<kGroups - 1>(sums[e].moments(), lane), e);
}

// Stores the consumer's 64 x 2 * Registers accumulators (rows from row0, columns from
// col0 of matrix `batch` of D) through its output strips and the copy
// engine, which leaves out what lies past D. Before a buffer is written
// again, the store that last read it must be done reading (one issuing
// thread waits, then the warpgroup meets); the strip's writes are fenced for
// the async proxy and met on before its one store is issued. WithMoments,
// the warpgroup then reads the strip's columns back for their moments, before
// the meeting that precedes the buffer's next writes.
template <class Out, bool WithMoments, int Registers>
__device__ __forceinline__ void copy_out_tile(const float (&acc)[Registers], const GemmParams& p,
                                              const CUtensorMap* d_map, OutputStaging& staging, int64_t batch,
                                              int64_t row0, int64_t col0, int thread, int consumer) {
  using Strips = ConsumerStrips<Out, Registers>;
  const int barrier = kStripBarrier + consumer, rows[2] = {accumulator_row(thread, 0), accumulator_row(thread, 2)};
#pragma unroll
  for (int strip = 0; strip < Strips::kStrips; ++strip) {
    const int64_t strip_col0 = col0 + strip * Strips::Strip::kCols;
    if (strip_col0 >= p.n) break;  // the same for the whole warpgroup: the rest lies past D
    uint8_t* buffer = staging.buffers[staging.strips % Config::kOutputBuffers];
    const uint32_t buffer_address = smem_address(buffer);
    if (thread == 0) bulk_wait_group_read<Config::kOutputBuffers - 1>();
    named_barrier_sync(barrier, Config::kWarpgroupThreads);
    write_strip<Out>(acc, buffer_address, strip, rows, thread);
    fence_proxy_async_shared();
    named_barrier_sync(barrier, Config::kWarpgroupThreads);
    if (thread == 0) {
      tma_store_3d(d_map, buffer, int(strip_col0), int(row0), int(batch));
      bulk_commit_group();
    }
    if constexpr (WithMoments) strip_column_moments<Out>(buffer_address, p, row0, strip_col0, thread);
    ++staging.strips;
  }
}

// Stores the consumer's 64 x 2 * Registers accumulators (rows from row0,
// columns from col0 of matrix `batch` of D) where D's rows are strided pixels
// (WgmmaSchedule::d_pixels), through its output strips but without the copy
// engine: each strip is written as copy_out_tile writes it, the warpgroup
// meets, and then each thread reads back 16-byte chunks of it, 8 threads a
// row, and stores them, so that a warp's store writes 4 whole rows of 128
// bytes instead of 16 bytes in each of 8 rows, as store_tile's do. The buffers
// take turns, so that the meeting after a strip's writes also orders every
// thread's reads of the strip before it ahead of the writes of the one after.
// D's base, pitches and columns are whole 16-byte chunks (the launcher checks).
template <class Out, int Registers>
__device__ __forceinline__ void store_tile_through_strips(const float (&acc)[Registers], const GemmParams& p,
                                                          const WgmmaSchedule& s, OutputStaging& staging,
                                                          int64_t batch, int64_t row0, int64_t col0, int thread,
                                                          int consumer) {
  using Strips = ConsumerStrips<Out, Registers>;
  using Strip = typename Strips::Strip;
  static_assert(Config::kOutputBuffers >= 2, "a strip's buffer is written again only after another's meeting");
  constexpr int kChunkBytes = 16, kChunksPerRow = kSwizzleBytes / kChunkBytes;
  constexpr int kRowsPerPass = Config::kWarpgroupThreads / kChunksPerRow, kPasses = Strip::kRows / kRowsPerPass;
  const int chunk = thread % kChunksPerRow, first_row = thread / kChunksPerRow;
  // This thread's rows of D (null past M), at its chunk of the tile's first column.
  unsigned char* row_at[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int64_t row = row0 + first_row + pass * kRowsPerPass;
    row_at[pass] = row < p.m ? static_cast<unsigned char*>(p.d) +
                                   (batch * p.d_batch_stride + row_offset(p, s, row) + col0) * int64_t(sizeof(Out)) +
                                   chunk * kChunkBytes
                             : nullptr;
  }
  const int barrier = kStripBarrier + consumer, rows[2] = {accumulator_row(thread, 0), accumulator_row(thread, 2)};
#pragma unroll
  for (int strip = 0; strip < Strips::kStrips; ++strip) {
    const int64_t strip_col0 = col0 + strip * Strip::kCols;
    if (strip_col0 >= p.n) break;  // the same for the whole warpgroup: the rest lies past D
    const uint32_t buffer = smem_address(staging.buffers[staging.strips % Config::kOutputBuffers]);
    write_strip<Out>(acc, buffer, strip, rows, thread);
    named_barrier_sync(barrier, Config::kWarpgroupThreads);
    if (strip_col0 + chunk * (kChunkBytes / int(sizeof(Out))) < p.n) {
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass)
        if (row_at[pass] != nullptr)
          *reinterpret_cast<uint4*>(row_at[pass] + strip * kSwizzleBytes) =
              ld_shared_16(buffer + swizzle128_offset(first_row + pass * kRowsPerPass, chunk * kChunkBytes));
    }
    ++staging.strips;
  }
}

// Stores A's row sums that a consumer summed beside its 64 rows of the tile
// (sm90/mainloop.cuh's RowSums; rows from row0 of matrix `batch`) to
// p.a_row_sums: each of its 8 columns holds them, so the first lane of each
// four stores its two rows (registers 0 and 2), those inside M.
__device__ __forceinline__ void store_row_sums(const float (&sums)[4], const GemmParams& p, int64_t batch,
                                               int64_t row0, int thread) {
  if (thread % 4 != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + accumulator_row(thread, 2 * h);
    if (row < p.m) p.a_row_sums[batch * p.m + row] = sums[2 * h];
  }
}

// The epilogue for the launch's output type, through the copy engine where D
// has a tensor map. D is fp32 or the inputs' type, as the ops make it
// (plan/gemm_plan.cpp's gemm_shape admits no other), so that each kernel
// holds four ways to store, or two where it is built to stage strided rows
// (StagedRows: a strided dgrad's phases). A consumer whose rows all lie past
// M (the second block of a pair at the last tile row) stores nothing.
// WithMoments: through the copy engine only (the launcher checks).
// WithPreActivation (a GEMM whose backward needs the activation's input, as
// GELU's does): the sums with the bias, before the activation, are stored
// first, the same way, to p.pre_activation (laid out as D, through `z_map`
// where D goes through the copy engine): one more pass over the
// accumulators' strips, and no product run again in backward.
// WithAddend (a dgrad whose input gradient has a second term): p.addend
// added after the bias, before the activation (a dgrad has neither).
// WithGeluTanh (with WithPreActivation: GPT-2's first MLP linear): GELU's
// tanh form in place of p.activation, which the launcher sets to it.
template <class Element, class Tile, bool StagedRows = false, bool WithMoments = false,
          bool WithPreActivation = false, bool WithActivationGrad = false, bool WithAddend = false,
          bool WithGeluTanh = false>
__device__ __forceinline__ void store_accumulators(float (&acc)[Tile::kAccumulators], const GemmParams& p,
                                                   const WgmmaSchedule& s, const CUtensorMap* d_map,
                                                   OutputStaging& staging, int64_t batch, int64_t row0, int64_t col0,
                                                   int thread, int consumer, const CUtensorMap* z_map = nullptr) {
  static_assert(!WithPreActivation || (!StagedRows && !WithMoments), "the pre-activation is a plain GEMM's");
  static_assert(!WithActivationGrad || (!StagedRows && !WithMoments && !WithPreActivation),
                "the activation's derivative is a plain GEMM's");
  static_assert(!WithAddend || (!StagedRows && !WithMoments && !WithPreActivation && !WithActivationGrad),
                "the addend is a plain product's");
  static_assert(!WithGeluTanh || WithPreActivation, "GELU's tanh form is stored beside its input");
  if (row0 >= p.m) return;
  if constexpr (WithActivationGrad) multiply_by_activation_grad<Element>(acc, p, s, batch, row0, col0, thread);
  else add_bias(acc, p, col0, thread);
  if constexpr (WithAddend) add_addend<Element>(acc, p, s, batch, row0, col0, thread);
  const auto store_as = [&](auto out, const CUtensorMap* map, void* d) {
    using Out = typename decltype(out)::type;
    if constexpr (StagedRows) store_tile_through_strips<Out>(acc, p, s, staging, batch, row0, col0, thread, consumer);
    else if (s.d_copy) copy_out_tile<Out, WithMoments>(acc, p, map, staging, batch, row0, col0, thread, consumer);
    else store_tile<Out>(acc, p, d, s, batch, row0, col0, thread);
  };
  const auto store = [&](const CUtensorMap* map, void* d) {
    if (p.d_type == ElementType::kFloat32) store_as(ElementTag<float>{}, map, d);
    else store_as(ElementTag<Element>{}, map, d);
  };
  if constexpr (WithPreActivation) store(z_map, p.pre_activation);
  if constexpr (WithGeluTanh) activate_gelu_tanh(acc);
  else if constexpr (!WithActivationGrad) activate(acc, p);
  store(d_map, p.d);
}

}  // namespace mpgemm::kernels::sm90
