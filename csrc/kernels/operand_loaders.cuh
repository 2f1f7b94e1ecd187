// Operand loaders: where each K slice of a block's A or B tile comes from.
// WmmaBlock's mainloops call, per slice, copy_async(tile, slice) (cp.async,
// 16-byte chunks) or load(slice) then store(tile) (through registers).
#pragma once

#include <cstdint>

#include "cp_async.cuh"
#include "tile_io.cuh"

namespace mpgemm::kernels {

// A strided matrix: the operands of a GEMM. `base` points at the block's first
// row (A) or column (B) at k = 0; stored rows are `ld` apart and one step in K
// is `k_step` elements.
template <class Tile, int kBlockK, int kThreads, int Vector>
struct MatrixLoader {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  const Element* base;
  int64_t ld, k_step;
  int mn_left;  // rows of A (columns of B) of this block inside the matrix
  int64_t k;
  typename Copy::Chunk regs[Copy::kPerThread];

  __device__ MatrixLoader(const Element* base, int64_t ld, int64_t k_step, int mn_left, int64_t k)
      : base(base), ld(ld), k_step(k_step), mn_left(mn_left), k(k) {}

  // The slice's first element and its valid extent in (outer, inner) order.
  struct Slice {
    const Element* src;
    int outer, inner;
  };
  __device__ Slice slice_at(int slice) const {
    const int64_t k0 = int64_t(slice) * kBlockK;
    const int k_left = k - k0 < kBlockK ? int(k - k0) : kBlockK;
    const Element* src = base + k0 * k_step;
    return Tile::kKIsInner ? Slice{src, mn_left, k_left} : Slice{src, k_left, mn_left};
  }

  __device__ void copy_async(Element* tile, int slice) const {
    const Slice s = slice_at(slice);
    Copy::copy_async(tile, s.src, ld, s.outer, s.inner);
  }
  __device__ void load(int slice) {
    const Slice s = slice_at(slice);
    Copy::load(regs, s.src, ld, s.outer, s.inner);
  }
  __device__ void store(Element* tile) const { Copy::store(tile, regs); }
};

// A gathered operand: a convolution's input patches or filters, read in place.
// `gather.address(outer, inner)` maps a chunk's coordinates in the operand
// (stored-row, contiguous-column order) to its global address, or nullptr for
// a chunk of zeros (padding, or outside the operand). The block's origin is
// (outer0, inner0); K advances along the inner dimension when K is inner.
template <class Tile, int kBlockK, int kThreads, int Vector, class Gather>
struct GatherLoader {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  Gather gather;
  int64_t outer0, inner0;
  typename Copy::Chunk regs[Copy::kPerThread];

  __device__ GatherLoader(const Gather& gather, int64_t mn0)
      : gather(gather), outer0(Tile::kKIsInner ? mn0 : 0), inner0(Tile::kKIsInner ? 0 : mn0) {}

  __device__ const Element* chunk(int slice, int i) const {
    const typename Copy::Coord c = Copy::coord(i);
    const int64_t k0 = int64_t(slice) * kBlockK;
    return Tile::kKIsInner ? gather.address(outer0 + c.outer, k0 + c.inner)
                           : gather.address(k0 + c.outer, inner0 + c.inner);
  }

  __device__ void copy_async(Element* tile, int slice) const {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) {
      const typename Copy::Coord c = Copy::coord(i);
      const Element* src = chunk(slice, i);
      cp_async_16(tile + c.outer * Tile::Shape::kPitch + c.inner, src, src != nullptr);
    }
  }
  __device__ void load(int slice) {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) {
      const Element* src = chunk(slice, i);
      regs[i] = src ? *reinterpret_cast<const typename Copy::Chunk*>(src) : typename Copy::Chunk{};
    }
  }
  __device__ void store(Element* tile) const { Copy::store(tile, regs); }
};

}  // namespace mpgemm::kernels
