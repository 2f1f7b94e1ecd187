// The warp level of the WMMA kernels: a warp owns a Tile::kWarpM x kWarpN
// tile of D held as 16x16 fp32 accumulator fragments. Each k16 step it loads
// the A and B fragments of its rows and columns from a stage's shared tiles
// (arch/wmma_load.cuh: ldmatrix, addressed by immediates) and issues
// kFragmentsM x kFragmentsN mma_sync (HMMA on the Tensor Cores), so that
// every fragment loaded feeds kFragmentsN (A) or kFragmentsM (B) products.
#pragma once

#include <type_traits>
#include <utility>

#include <mma.h>

#include "arch/wmma_load.cuh"

namespace mpgemm::kernels {

// f(std::integral_constant<int, i>) for i in [0, N): loop indices that must be
// compile-time constants (fragment offsets are immediates of the load).
template <class F, int... I>
__device__ __forceinline__ void static_for(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for(f, std::make_integer_sequence<int, N>{});
}

// TileA and TileB: the block's shared operand tiles (wmma/smem_tile.cuh),
// K-major where AKMajor / BKMajor. A stage holds TileA, then TileB.
template <class Element, class Tile, class TileA, class TileB>
struct WmmaWarpTile {
  using FragmentA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, Element,
                                           std::conditional_t<TileA::kKMajor, nvcuda::wmma::row_major,
                                                              nvcuda::wmma::col_major>>;
  using FragmentB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, Element,
                                           std::conditional_t<TileB::kKMajor, nvcuda::wmma::col_major,
                                                              nvcuda::wmma::row_major>>;
  using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  using Accumulators = Accumulator[Tile::kFragmentsM][Tile::kFragmentsN];

  // The A and B fragments of one k16 step: the mainloop holds two sets, so
  // that one loads while the other feeds mma_sync.
  struct Fragments {
    FragmentA a[Tile::kFragmentsM];
    FragmentB b[Tile::kFragmentsN];
  };
  static constexpr int kSteps = Tile::kBlockK / Tile::kFragment;  // k16 steps per slice

  __device__ static void clear(Accumulators& acc) {
#pragma unroll
    for (int i = 0; i < Tile::kFragmentsM; ++i)
#pragma unroll
      for (int j = 0; j < Tile::kFragmentsN; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
  }

  // Loads k16 step kStep of the slice whose A tile lies kOffset elements past
  // `warp_a` (this warp's rows of a stage's A tile) and whose B tile lies
  // kOffset plus A's tile size past `warp_b`. With kOffset a constant, every
  // fragment load addresses its stage by an immediate.
  template <int kOffset, int kStep>
  __device__ static void load_step(Fragments& f, const Element* warp_a, const Element* warp_b) {
    constexpr int kk = kStep * Tile::kFragment;
    static_for<Tile::kFragmentsM>([&](auto i) {
      constexpr int kAt = kOffset + TileA::offset(decltype(i)::value * Tile::kFragment, kk);
      load_fragment<kAt, TileA::Shape::kPitch>(f.a[decltype(i)::value], warp_a);
    });
    static_for<Tile::kFragmentsN>([&](auto j) {
      constexpr int kAt = kOffset + TileA::Shape::kElements + TileB::offset(decltype(j)::value * Tile::kFragment, kk);
      load_fragment<kAt, TileB::Shape::kPitch>(f.b[decltype(j)::value], warp_b);
    });
  }

  __device__ static void mma_step(Accumulators& acc, const Fragments& f) {
#pragma unroll
    for (int i = 0; i < Tile::kFragmentsM; ++i)
#pragma unroll
      for (int j = 0; j < Tile::kFragmentsN; ++j)
        nvcuda::wmma::mma_sync(acc[i][j], f.a[i], f.b[j], acc[i][j]);
  }
};

}  // namespace mpgemm::kernels
