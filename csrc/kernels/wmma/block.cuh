// The block level shared by every WMMA kernel of mpgemm (the GEMM and the
// convolutions): a block computes one Tile::kBlockM x kBlockN tile of an
// (implicit) GEMM D = activation(A @ B + bias), fp16 or bf16 in (Element),
// fp32 accumulate.
//
//   block  - walks K in kBlockK slices staged through shared memory: a
//            kStages-deep cp.async pipeline on sm_80+, a register-staged double
//            buffer on sm_75 and for one-element loads. Where a slice comes
//            from is the operand loaders' business (a strided matrix, or a
//            convolution's gathered patches), so every kernel shares this loop.
//   warp   - WmmaWarpTile (wmma/warp_tile.cuh): its tile of fp32 accumulator
//            fragments, mma_sync m16n16k16 on fragments loaded with ldmatrix.
//            bf16 needs sm_80, so a kernel built on this block wraps its body
//            in `if constexpr (kWmmaCompiled<Element>)`.
// Epilogue: each warp parks one row of fragments in shared memory, then writes
// it out with row-contiguous (coalesced, 16- or 8-byte where aligned) stores,
// adding bias and activation in fp32 before the one rounding to D's type
// (fp32, fp16 or bf16, whatever Element is). Built WithMoments, it also sums
// each of its columns' values as stored (common/column_moments.cuh): a lane
// its rows, then the lanes of a column by shuffles and the warps of a
// column through shared memory, in fixed orders, into one block of
// kBlockM rows' moments per column.
#pragma once

#include <cstdint>

#include "arch/cp_async.cuh"
#include "common/column_moments.cuh"
#include "common/element_traits.cuh"
#include "common/epilogue_math.h"
#include "common/gemm_params.h"
#include "wmma/operand_loaders.cuh"
#include "wmma/smem_tile.cuh"
#include "wmma/warp_tile.cuh"

namespace mpgemm::kernels {

// Shared-memory footprint of one kernel instantiation. The epilogue reuses the
// mainloop's buffers.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
struct WmmaSmem {
  using TileA = PaddedOperandTile<Element, Tile::kBlockM, Tile::kBlockK, AKMajor>;
  using TileB = PaddedOperandTile<Element, Tile::kBlockN, Tile::kBlockK, BKMajor>;
  static constexpr int kStageElements = TileA::Shape::kElements + TileB::Shape::kElements;
  static constexpr int kMainloopBytes = Tile::kStages * kStageElements * int(sizeof(Element));
  // Per warp: a 16 x kWarpN fp32 strip, rows padded by 4 floats (16 bytes).
  static constexpr int kEpiloguePitch = Tile::kWarpN + 4;
  static constexpr int kEpilogueWarpFloats = Tile::kFragment * kEpiloguePitch;
  static constexpr int kEpilogueBytes =
      Tile::kWarpsM * Tile::kWarpsN * kEpilogueWarpFloats * int(sizeof(float));
  static constexpr int kBytes = kMainloopBytes > kEpilogueBytes ? kMainloopBytes : kEpilogueBytes;
  // The column moments of each warp row of the block, after the epilogue's stores.
  static constexpr int kMomentsBytes = Tile::kWarpsM * 3 * Tile::kBlockN * int(sizeof(float));
  static_assert(kMomentsBytes <= kBytes, "the column moments fit where the epilogue's strips were");
  static_assert(kBytes <= Tile::kSmemBytes, "the tile's shared memory (common/tile_configs.h) holds every layout's");
};

// Row i of a GEMM's output is row i of D.
struct ContiguousRows {
  __device__ int64_t operator()(int64_t row) const { return row; }
};

template <class Element, class Tile, bool AKMajor, bool BKMajor>
struct WmmaBlock {
  using Smem = WmmaSmem<Element, Tile, AKMajor, BKMajor>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  using Warp = WmmaWarpTile<Element, Tile, TileA, TileB>;
  using Accumulators = typename Warp::Accumulators;
  using Fragments = typename Warp::Fragments;
  static constexpr int kSteps = Warp::kSteps;

  int warp, warp_m, warp_n;
  int64_t m0, n0;  // the block's tile origin in D
  // Where this warp's first A and B fragments lie in a stage's tiles: every
  // fragment load is then a stage pointer plus a constant.
  int a_warp_offset, b_warp_offset;

  __device__ WmmaBlock(int64_t m0, int64_t n0)
      : warp(threadIdx.x / 32),
        warp_m(warp / Tile::kWarpsN),
        warp_n(warp % Tile::kWarpsN),
        m0(m0),
        n0(n0),
        a_warp_offset(TileA::offset(warp_m * Tile::kWarpM, 0)),
        b_warp_offset(TileB::offset(warp_n * Tile::kWarpN, 0)) {}

  __device__ static int slices(int64_t k) { return KPartition<Tile::kBlockK>::slices(k); }

  __device__ static void clear(Accumulators& acc) { Warp::clear(acc); }

  __device__ static Element* stage_a(Element* smem, int stage) { return smem + stage * Smem::kStageElements; }
  __device__ static Element* stage_b(Element* smem, int stage) {
    return stage_a(smem, stage) + TileA::Shape::kElements;
  }

  // sm_80+: kStages-deep cp.async pipeline, after CUTLASS's sm80 multistage
  // mainloop. One group is committed per slice, empty ones included, so
  // wait_group counts stay uniform. Each k16 step's mma_sync run while the
  // next step's fragments load; the block meets once per slice, after the
  // second-to-last step's mma_sync are issued, so the last step's products
  // cover both the barrier and the loads of the next slice's first fragments.
  // The loop body is unrolled over the kStages stages, so that every stage's
  // place in shared memory is a constant: fragment loads and copies address it
  // by immediates.
  template <class LoaderA, class LoaderB>
  __device__ void mainloop_async(Accumulators& acc, LoaderA& a, LoaderB& b, int slices, Element* smem) const {
    constexpr int kStages = Tile::kStages;
    static_assert(kSteps >= 2 && kSteps % 2 == 0, "the barrier precedes a slice's last step; slices start on set 0");
    static_for<kStages - 1>([&](auto stage) {
      constexpr int s = decltype(stage)::value;
      if (s < slices) {
        a.copy_async(stage_a(smem, s));
        b.copy_async(stage_b(smem, s));
      }
      cp_async_commit();
      if constexpr (s == 0) {
        a.advance_past_first();
        b.advance_past_first();
      } else {
        a.advance();
        b.advance();
      }
    });
    const Element* warp_a = smem + a_warp_offset;
    const Element* warp_b = smem + b_warp_offset;
    Fragments frag[2];
    if (slices > 0) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      Warp::template load_step<0, 0>(frag[0], warp_a, warp_b);
    }
    for (int s0 = 0; s0 < slices; s0 += kStages) {
      // Slice s = s0 + j is read from stage j.
      static_for<kStages>([&](auto j) {
        constexpr int kRead = decltype(j)::value;
        constexpr int kNext = (kRead + 1) % kStages, kWrite = (kRead + kStages - 1) % kStages;
        const int s = s0 + kRead;
        if (s < slices) {
          static_for<kSteps>([&](auto step) {
            constexpr int k = decltype(step)::value;
            // The last step loads the next slice's first fragments. After the
            // last slice it reads a stage no copy writes any more and leaves
            // the fragments unused: cheaper than a branch, after which ptxas
            // would work out the lanes' addresses again.
            if constexpr (k + 1 < kSteps)
              Warp::template load_step<kRead * Smem::kStageElements, k + 1>(frag[(k + 1) % 2], warp_a, warp_b);
            else
              Warp::template load_step<kNext * Smem::kStageElements, 0>(frag[(k + 1) % 2], warp_a, warp_b);
            Warp::mma_step(acc, frag[k % 2]);
            if constexpr (k == 0) {
              // The slice kStages - 1 ahead goes into the stage slice s - 1
              // was read from, which every warp left before the last barrier.
              if (s + kStages - 1 < slices) {
                a.copy_async(stage_a(smem, kWrite));
                b.copy_async(stage_b(smem, kWrite));
                a.advance();
                b.advance();
              }
              cp_async_commit();
            }
            if constexpr (k == kSteps - 2) {
              // Slice s + 1 has landed and is visible to all warps; slice s's
              // stage is read no more (its last step is in registers).
              cp_async_wait<kStages - 2>();
              __syncthreads();
            }
          });
        }
      });
    }
    cp_async_wait<0>();
  }

  // sm_75, and one-element loads anywhere: the next slice is loaded into
  // registers while the current one is multiplied, then stored to the other
  // shared buffer.
  template <class LoaderA, class LoaderB>
  __device__ void mainloop_register_staged(Accumulators& acc, LoaderA& a, LoaderB& b, int slices,
                                           Element* smem) const {
    Element* read = stage_a(smem, 0);
    Element* write = stage_a(smem, 1);
    if (slices > 0) {
      a.load();
      b.load();
      a.store(read);
      b.store(read + TileA::Shape::kElements);
      a.advance_past_first();
      b.advance_past_first();
    }
    __syncthreads();
    for (int s = 0; s < slices; ++s) {
      if (s + 1 < slices) {
        a.load();
        b.load();
        a.advance();
        b.advance();
      }
      static_for<kSteps>([&](auto step) {
        Fragments frag;
        Warp::template load_step<0, decltype(step)::value>(frag, read + a_warp_offset, read + b_warp_offset);
        Warp::mma_step(acc, frag);
      });
      if (s + 1 < slices) {
        a.store(write);
        b.store(write + TileA::Shape::kElements);
      }
      __syncthreads();
      Element* const next = write;
      write = read;
      read = next;
    }
  }

  // The mainloop for this arch and load width, then a barrier so that the
  // epilogue may reuse the operand buffers.
  template <int Vector, class LoaderA, class LoaderB>
  __device__ void mainloop(Accumulators& acc, LoaderA& a, LoaderB& b, int slices, Element* smem) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // cp.async copies 4, 8 or 16 bytes: chunks of one 2-byte element go
    // through registers.
    if constexpr (Vector > 1)
      mainloop_async(acc, a, b, slices, smem);
    else
      mainloop_register_staged(acc, a, b, slices, smem);
#else
    mainloop_register_staged(acc, a, b, slices, smem);
#endif
    __syncthreads();
  }

  // D rows are p.d_row_stride elements apart and batches p.d_batch_stride;
  // p.m, p.n, bias, activation and d_type describe the output side. Row i of
  // the tile's GEMM is row rows(i) of D (dgrad's phases scatter them).
  // WithMoments: the tile's column moments to p.column_moments, block m0 /
  // kBlockM of rows (batch 0 only: a convolution's fprop).
  template <bool WithMoments = false, class RowMap = ContiguousRows>
  __device__ void epilogue(const GemmParams& p, Accumulators& acc, unsigned char* smem, int64_t batch,
                           RowMap rows = {}) const {
    constexpr int kLanesPerRow = Tile::kWarpN / 4;
    constexpr int kRowsPerPass = 32 / kLanesPerRow;
    static_assert(32 % kLanesPerRow == 0 && Tile::kFragment % kRowsPerPass == 0, "lanes must tile the strip");
    const int lane = threadIdx.x % 32;
    float* strip = reinterpret_cast<float*>(smem) + warp * Smem::kEpilogueWarpFloats;
    const int64_t col = n0 + warp_n * Tile::kWarpN + (lane % kLanesPerRow) * 4;
    const int d_bytes = element_bytes(p.d_type);
    char* d = static_cast<char*>(p.d) + batch * p.d_batch_stride * d_bytes;
    const int64_t row_bytes = p.d_row_stride * d_bytes;
    ShiftedSums sums[WithMoments ? 4 : 1];
#pragma unroll
    for (int i = 0; i < Tile::kFragmentsM; ++i) {
#pragma unroll
      for (int j = 0; j < Tile::kFragmentsN; ++j)
        nvcuda::wmma::store_matrix_sync(strip + j * Tile::kFragment, acc[i][j], Smem::kEpiloguePitch,
                                        nvcuda::wmma::mem_row_major);
      __syncwarp();
      if (col < p.n) {
#pragma unroll 1
        for (int r = lane / kLanesPerRow; r < Tile::kFragment; r += kRowsPerPass) {
          const int64_t row = m0 + warp_m * Tile::kWarpM + i * Tile::kFragment + r;
          if (row >= p.m) break;
          float v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = strip[r * Smem::kEpiloguePitch + (lane % kLanesPerRow) * 4 + e];
            if (p.bias != nullptr && col + e < p.n) x += load_as_float(p.bias, p.bias_type, col + e);
            v[e] = apply_activation(p.activation, x);
          }
          const int valid = p.n - col < 4 ? int(p.n - col) : 4;
          visit_element_type(p.d_type, [&](auto tag) {
            using T = typename decltype(tag)::type;
            store4(reinterpret_cast<T*>(d + rows(row) * row_bytes) + col, valid, v);
            if constexpr (WithMoments) {
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (e < valid) sums[e].add(ElementTraits<T>::to_float(ElementTraits<T>::from_float(v[e])));
            }
          });
        }
      }
      __syncwarp();
    }
    // Every warp must be done with the strips before shared memory is reused.
    __syncthreads();
    if constexpr (WithMoments) store_column_moments<kLanesPerRow>(p, sums, smem, lane);
  }

  // The block's column moments from each lane's sums (lanes lane % kLanesPerRow
  // of a warp share columns, warps warp_n), written as block m0 / kBlockM of
  // p.column_moments; shared memory is free again when it returns.
  template <int kLanesPerRow>
  __device__ void store_column_moments(const GemmParams& p, const ShiftedSums (&sums)[4], unsigned char* smem,
                                       int lane) const {
    constexpr unsigned kSameColumns = 32u - kLanesPerRow;  // the lane bits that differ between a column's lanes
    float* shared = reinterpret_cast<float*>(smem);        // [kWarpsM][3][kBlockN]
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const ColumnMoments m = combine_across_lanes<kSameColumns>(sums[e].moments(), lane);
      if (lane < kLanesPerRow) {
        float* at = shared + warp_m * 3 * Tile::kBlockN + warp_n * Tile::kWarpN + lane * 4 + e;
        at[0] = m.count, at[Tile::kBlockN] = m.mean, at[2 * Tile::kBlockN] = m.m2;
      }
    }
    __syncthreads();
    const int64_t blocks = (p.m + Tile::kBlockM - 1) / Tile::kBlockM;
    for (int c = threadIdx.x; c < Tile::kBlockN && n0 + c < p.n; c += Tile::kThreads) {
      ColumnMoments total;
      for (int w = 0; w < Tile::kWarpsM; ++w) {
        const float* at = shared + w * 3 * Tile::kBlockN + c;
        total = combine_moments(total, {at[0], at[Tile::kBlockN], at[2 * Tile::kBlockN]});
      }
      store_moments(p.column_moments, blocks, p.d_row_stride, m0 / Tile::kBlockM, n0 + c, total);
    }
    __syncthreads();
  }
};

}  // namespace mpgemm::kernels
