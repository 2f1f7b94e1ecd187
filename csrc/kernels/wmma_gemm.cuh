// Block-tiled WMMA GEMM: D = activation(A @ B + bias), fp16 in, fp32 accumulate.
//
// Tiling, one level per concept:
//   grid   - one block per Config::kBlockM x kBlockN tile of D (a flat index,
//            so no grid dimension limits M or N); grid.y strides over the batch.
//   block  - walks K in kBlockK slices staged through shared memory: a
//            kStages-deep cp.async pipeline on sm_80+, a register-staged double
//            buffer on sm_75 and for unaligned operands (one-element loads).
//   warp   - owns a kWarpM x kWarpN tile of 16x16 fp32 accumulator fragments.
//   instr  - wmma::mma_sync m16n16k16 (HMMA on the Tensor Cores).
// Epilogue: each warp parks one row of fragments in shared memory, then writes
// it out with row-contiguous (coalesced, 16-byte where aligned) stores, adding
// bias and activation in fp32 before the one rounding to D's type.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <mma.h>

#include "epilogue_math.h"
#include "gemm_params.h"
#include "tile_io.cuh"

namespace mpgemm::kernels {

// Shared-memory footprint of one kernel instantiation. The epilogue reuses the
// mainloop's buffers.
template <class Config, bool ARowMajor, bool BRowMajor>
struct WmmaGemmSmem {
  using TileA = OperandTile<Config::kBlockM, Config::kBlockK, /*KIsInner=*/ARowMajor>;
  using TileB = OperandTile<Config::kBlockN, Config::kBlockK, /*KIsInner=*/!BRowMajor>;
  static constexpr int kStageElements = TileA::Shape::kElements + TileB::Shape::kElements;
  static constexpr int kMainloopBytes = Config::kStages * kStageElements * int(sizeof(__half));
  // Per warp: a 16 x kWarpN fp32 strip, rows padded by 4 floats (16 bytes).
  static constexpr int kEpiloguePitch = Config::kWarpN + 4;
  static constexpr int kEpilogueWarpFloats = Config::kFragment * kEpiloguePitch;
  static constexpr int kEpilogueBytes =
      Config::kWarpsM * Config::kWarpsN * kEpilogueWarpFloats * int(sizeof(float));
  static constexpr int kBytes = kMainloopBytes > kEpilogueBytes ? kMainloopBytes : kEpilogueBytes;
};

template <class Config, bool ARowMajor, bool BRowMajor, int Vector>
struct WmmaGemmBlock {
  using Smem = WmmaGemmSmem<Config, ARowMajor, BRowMajor>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  using CopyA = TileCopy<typename TileA::Shape, Config::kThreads, Vector>;
  using CopyB = TileCopy<typename TileB::Shape, Config::kThreads, Vector>;
  using FragmentA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half,
                                           std::conditional_t<ARowMajor, nvcuda::wmma::row_major,
                                                              nvcuda::wmma::col_major>>;
  using FragmentB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half,
                                           std::conditional_t<BRowMajor, nvcuda::wmma::row_major,
                                                              nvcuda::wmma::col_major>>;
  using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  using Accumulators = Accumulator[Config::kFragmentsM][Config::kFragmentsN];

  // Where this block's operands start, and how much of them is valid.
  struct Operands {
    const __half* a;  // at (m0, 0)
    const __half* b;  // at (0, n0)
    int64_t lda, ldb;  // strides between the stored (outer) rows
    int64_t a_k_step, b_k_step;  // element offset of one K slice
    int rows_left, cols_left;  // of D, from (m0, n0), clamped to the block tile
    int64_t k;
  };

  __device__ static int clamp(int64_t left, int tile) { return left < tile ? int(left) : tile; }

  // Copies K slice `slice` of both operands with the given copier functor.
  template <class CopyFnA, class CopyFnB>
  __device__ static void for_slice(const Operands& op, int slice, CopyFnA&& copy_a, CopyFnB&& copy_b) {
    const int64_t k0 = int64_t(slice) * Config::kBlockK;
    const int k_left = clamp(op.k - k0, Config::kBlockK);
    const __half* a = op.a + k0 * op.a_k_step;
    const __half* b = op.b + k0 * op.b_k_step;
    // Limits in (outer, inner) order of each stored tile.
    if (TileA::kKIsInner) copy_a(a, op.rows_left, k_left); else copy_a(a, k_left, op.rows_left);
    if (TileB::kKIsInner) copy_b(b, op.cols_left, k_left); else copy_b(b, k_left, op.cols_left);
  }

  // One K slice from shared memory into the warp's accumulators.
  __device__ static void mma_slice(Accumulators& acc, const __half* tile_a, const __half* tile_b, int warp_m,
                                   int warp_n) {
#pragma unroll
    for (int kk = 0; kk < Config::kBlockK; kk += Config::kFragment) {
      FragmentA frag_a[Config::kFragmentsM];
      FragmentB frag_b[Config::kFragmentsN];
#pragma unroll
      for (int i = 0; i < Config::kFragmentsM; ++i)
        nvcuda::wmma::load_matrix_sync(
            frag_a[i], TileA::fragment(tile_a, warp_m * Config::kWarpM + i * Config::kFragment, kk),
            TileA::Shape::kPitch);
#pragma unroll
      for (int j = 0; j < Config::kFragmentsN; ++j)
        nvcuda::wmma::load_matrix_sync(
            frag_b[j], TileB::fragment(tile_b, warp_n * Config::kWarpN + j * Config::kFragment, kk),
            TileB::Shape::kPitch);
#pragma unroll
      for (int i = 0; i < Config::kFragmentsM; ++i)
#pragma unroll
        for (int j = 0; j < Config::kFragmentsN; ++j)
          nvcuda::wmma::mma_sync(acc[i][j], frag_a[i], frag_b[j], acc[i][j]);
    }
  }

  // sm_80+: kStages-deep cp.async pipeline. One group is committed per slice,
  // empty ones included, so wait_group counts stay uniform.
  __device__ static void mainloop_async(Accumulators& acc, const Operands& op, __half* smem, int warp_m,
                                        int warp_n) {
    constexpr int kStages = Config::kStages;
    const int slices = int((op.k + Config::kBlockK - 1) / Config::kBlockK);
    auto stage_a = [&](int s) { return smem + (s % kStages) * Smem::kStageElements; };
    auto stage_b = [&](int s) { return stage_a(s) + TileA::Shape::kElements; };
    auto issue = [&](int s) {
      if (s < slices)
        for_slice(
            op, s, [&](const __half* src, int outer, int inner) { CopyA::copy_async(stage_a(s), src, op.lda, outer, inner); },
            [&](const __half* src, int outer, int inner) { CopyB::copy_async(stage_b(s), src, op.ldb, outer, inner); });
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int s = 0; s < slices; ++s) {
      cp_async_wait<kStages - 2>();
      // Makes slice s visible to all warps, and tells the producer that every
      // warp is done with the buffer that slice s + kStages - 1 overwrites.
      __syncthreads();
      issue(s + kStages - 1);
      mma_slice(acc, stage_a(s), stage_b(s), warp_m, warp_n);
    }
    cp_async_wait<0>();
  }

  // sm_75, and any arch with one-element loads: the next slice is loaded into
  // registers while the current one is multiplied, then stored to the other
  // shared buffer.
  __device__ static void mainloop_register_staged(Accumulators& acc, const Operands& op, __half* smem,
                                                  int warp_m, int warp_n) {
    const int slices = int((op.k + Config::kBlockK - 1) / Config::kBlockK);
    typename CopyA::Chunk regs_a[CopyA::kPerThread];
    typename CopyB::Chunk regs_b[CopyB::kPerThread];
    auto stage_a = [&](int s) { return smem + (s % 2) * Smem::kStageElements; };
    auto stage_b = [&](int s) { return stage_a(s) + TileA::Shape::kElements; };
    auto load = [&](int s) {
      for_slice(
          op, s, [&](const __half* src, int outer, int inner) { CopyA::load(regs_a, src, op.lda, outer, inner); },
          [&](const __half* src, int outer, int inner) { CopyB::load(regs_b, src, op.ldb, outer, inner); });
    };
    auto store = [&](int s) {
      CopyA::store(stage_a(s), regs_a);
      CopyB::store(stage_b(s), regs_b);
    };
    if (slices > 0) {
      load(0);
      store(0);
    }
    __syncthreads();
    for (int s = 0; s < slices; ++s) {
      if (s + 1 < slices) load(s + 1);
      mma_slice(acc, stage_a(s), stage_b(s), warp_m, warp_n);
      if (s + 1 < slices) store(s + 1);
      __syncthreads();
    }
  }

  __device__ static float load_bias(const GemmParams& p, int64_t col) {
    return p.bias_type == ElementType::kFloat16 ? __half2float(static_cast<const __half*>(p.bias)[col])
                                                : static_cast<const float*>(p.bias)[col];
  }

  // Writes 4 consecutive outputs of one row, vectorized when in bounds and aligned.
  __device__ static void store4(const GemmParams& p, void* row, int64_t col, const float (&v)[4]) {
    const int valid = p.n - col < 4 ? int(p.n - col) : 4;
    if (p.d_type == ElementType::kFloat32) {
      float* out = static_cast<float*>(row) + col;
      if (valid == 4 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
        *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (e < valid) out[e] = v[e];
      }
    } else {
      __half* out = static_cast<__half*>(row) + col;
      if (valid == 4 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
        const __half2 lo = __floats2half2_rn(v[0], v[1]);
        const __half2 hi = __floats2half2_rn(v[2], v[3]);
        uint2 packed;
        packed.x = *reinterpret_cast<const unsigned*>(&lo);
        packed.y = *reinterpret_cast<const unsigned*>(&hi);
        *reinterpret_cast<uint2*>(out) = packed;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (e < valid) out[e] = __float2half_rn(v[e]);
      }
    }
  }

  __device__ static void epilogue(const GemmParams& p, Accumulators& acc, float* smem, int64_t batch, int64_t m0,
                                  int64_t n0, int warp, int warp_m, int warp_n) {
    constexpr int kLanesPerRow = Config::kWarpN / 4;
    constexpr int kRowsPerPass = 32 / kLanesPerRow;
    static_assert(32 % kLanesPerRow == 0 && Config::kFragment % kRowsPerPass == 0, "lanes must tile the strip");
    const int lane = threadIdx.x % 32;
    float* strip = smem + warp * Smem::kEpilogueWarpFloats;
    const int64_t col = n0 + warp_n * Config::kWarpN + (lane % kLanesPerRow) * 4;
    char* d = static_cast<char*>(p.d) +
              batch * p.d_batch_stride * (p.d_type == ElementType::kFloat32 ? 4 : 2);
    const int64_t row_bytes = p.d_row_stride * (p.d_type == ElementType::kFloat32 ? 4 : 2);
#pragma unroll
    for (int i = 0; i < Config::kFragmentsM; ++i) {
#pragma unroll
      for (int j = 0; j < Config::kFragmentsN; ++j)
        nvcuda::wmma::store_matrix_sync(strip + j * Config::kFragment, acc[i][j], Smem::kEpiloguePitch,
                                        nvcuda::wmma::mem_row_major);
      __syncwarp();
      if (col < p.n) {
#pragma unroll 1
        for (int r = lane / kLanesPerRow; r < Config::kFragment; r += kRowsPerPass) {
          const int64_t row = m0 + warp_m * Config::kWarpM + i * Config::kFragment + r;
          if (row >= p.m) break;
          float v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = strip[r * Smem::kEpiloguePitch + (lane % kLanesPerRow) * 4 + e];
            if (p.bias != nullptr && col + e < p.n) x += load_bias(p, col + e);
            v[e] = apply_activation(p.activation, x);
          }
          store4(p, d + row * row_bytes, col, v);
        }
      }
      __syncwarp();
    }
  }
};

template <class Config, bool ARowMajor, bool BRowMajor, int Vector>
__global__ void __launch_bounds__(Config::kThreads, 1) wmma_gemm_kernel(GemmParams p) {
  using Block = WmmaGemmBlock<Config, ARowMajor, BRowMajor, Vector>;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  __half* smem = reinterpret_cast<__half*>(smem_bytes);

  const int warp = threadIdx.x / 32;
  const int warp_m = warp / Config::kWarpsN;
  const int warp_n = warp % Config::kWarpsN;
  const int64_t tiles_n = (p.n + Config::kBlockN - 1) / Config::kBlockN;
  const int64_t m0 = (blockIdx.x / tiles_n) * Config::kBlockM;
  const int64_t n0 = (blockIdx.x % tiles_n) * Config::kBlockN;

  for (int64_t batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
    typename Block::Operands op;
    op.a = static_cast<const __half*>(p.a) + batch * p.a_batch_stride + m0 * p.a_row_stride;
    op.b = static_cast<const __half*>(p.b) + batch * p.b_batch_stride + n0 * p.b_col_stride;
    op.lda = ARowMajor ? p.a_row_stride : p.a_col_stride;
    op.ldb = BRowMajor ? p.b_row_stride : p.b_col_stride;
    op.a_k_step = p.a_col_stride;
    op.b_k_step = p.b_row_stride;
    op.rows_left = Block::clamp(p.m - m0, Config::kBlockM);
    op.cols_left = Block::clamp(p.n - n0, Config::kBlockN);
    op.k = p.k;

    typename Block::Accumulators acc;
#pragma unroll
    for (int i = 0; i < Config::kFragmentsM; ++i)
#pragma unroll
      for (int j = 0; j < Config::kFragmentsN; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (Vector == 8)
      Block::mainloop_async(acc, op, smem, warp_m, warp_n);
    else
      Block::mainloop_register_staged(acc, op, smem, warp_m, warp_n);
#else
    Block::mainloop_register_staged(acc, op, smem, warp_m, warp_n);
#endif
    // Every warp must be done reading operand tiles before the epilogue reuses them.
    __syncthreads();
    Block::epilogue(p, acc, reinterpret_cast<float*>(smem_bytes), batch, m0, n0, warp, warp_m, warp_n);
    __syncthreads();
  }
}

}  // namespace mpgemm::kernels
