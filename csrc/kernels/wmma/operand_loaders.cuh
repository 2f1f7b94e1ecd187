// Operand loaders: iterators over the K slices of a block's A or B tile.
//
// WmmaBlock's mainloops drive every loader through one protocol:
//   copy_async(tile)        the current slice into shared memory (cp.async,
//                           4- to 16-byte chunks, zero-filling what lies outside)
//   load(), store(tile)     the same through registers (sm_75, one-element loads)
//   advance_past_first()    after slice 0
//   advance()               after every later slice
// and both operands of a block follow one K partition (KPartition below), so
// the slices they stage line up. Addresses and predicates are worked out in
// the constructor; stepping to the next slice is a pointer increment, so the
// mainloop does no index arithmetic (CUTLASS's predicated tile iterators work
// the same way).
#pragma once

#include <cstdint>

#include "arch/cp_async.cuh"
#include "wmma/smem_tile.cuh"

namespace mpgemm::kernels {

// How GEMM-K splits into slices of kBlockK: the partial slice comes first.
// Slice 0 holds [0, r) with r = k - (slices - 1) * kBlockK in [1, kBlockK];
// slice s > 0 holds [r + (s - 1) * kBlockK, r + s * kBlockK). Only slice 0
// then needs predicates in K, and they are dropped once it has been issued.
template <int kBlockK>
struct KPartition {
  __host__ __device__ static int slices(int64_t k) { return int((k + kBlockK - 1) / kBlockK); }
  __host__ __device__ static int first_extent(int64_t k) {
    return k <= 0 ? 0 : int(k - int64_t(slices(k) - 1) * kBlockK);
  }
};

// A strided matrix: the operands of a GEMM. `base` points at the block's first
// row (A) or column (B) at k = 0; stored rows are `ld` apart and one step in K
// is `k_step` elements. Rows (columns) past `mn_left` read as zeros.
template <class Tile, int kBlockK, int kThreads, int Vector>
struct MatrixLoader {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;

  const Element* ptr;    // this thread's chunk 0 in the current slice
  int64_t chunk_stride;  // from one of this thread's chunks to the next
  int64_t slice_stride;  // from one full slice to the next
  int64_t first_stride;  // from slice 0 to slice 1
  // A thread's chunks lie kOuterStep rows apart, so those inside the matrix
  // are always its first ones: chunk i is read if i < valid, else zero-filled.
  int valid, valid_after_first;
  typename Copy::Chunk regs[Copy::kPerThread];

  __device__ MatrixLoader(const Element* base, int64_t ld, int64_t k_step, int mn_left, int64_t k)
      : chunk_stride(Copy::kOuterStep * ld),
        slice_stride(kBlockK * k_step),
        first_stride(KPartition<kBlockK>::first_extent(k) * k_step) {
    const typename Copy::Coord first = Copy::first();
    ptr = base + first.outer * ld + first.inner;
    const int first_extent = KPartition<kBlockK>::first_extent(k);
    // Chunks whose row lies below `limit`.
    const auto rows_below = [&](int limit) {
      const int rows = limit <= first.outer ? 0 : (limit - first.outer + Copy::kOuterStep - 1) / Copy::kOuterStep;
      return rows < Copy::kPerThread ? rows : Copy::kPerThread;
    };
    if (Tile::kKMajor) {
      valid_after_first = rows_below(mn_left);
      valid = first.inner < first_extent ? valid_after_first : 0;
    } else {
      valid_after_first = first.inner < mn_left ? Copy::kPerThread : 0;
      const int in_first = rows_below(first_extent);
      valid = in_first < valid_after_first ? in_first : valid_after_first;
    }
  }

  __device__ void copy_async(Element* tile) const {
    Element* to = tile + Copy::smem_offset();
    const Element* from = ptr;
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i, from += chunk_stride)
      cp_async<sizeof(typename Copy::Chunk)>(to + i * Copy::kSmemStep, from, i < valid);
  }
  __device__ void load() {
    const Element* from = ptr;
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i, from += chunk_stride)
      regs[i] = i < valid ? *reinterpret_cast<const typename Copy::Chunk*>(from) : typename Copy::Chunk{};
  }
  __device__ void store(Element* tile) const { Copy::store(tile, regs); }
  __device__ void advance_past_first() {
    ptr += first_stride;
    valid = valid_after_first;
  }
  __device__ void advance() { ptr += slice_stride; }
};

}  // namespace mpgemm::kernels
