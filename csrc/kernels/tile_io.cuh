// Moving operand tiles between global and shared memory.
//
// A shared tile keeps the operand's global layout: "outer" is the strided
// dimension and "inner" the contiguous one, so 16-byte chunks copy straight
// across for either layout. Each shared row is padded by 8 elements (16
// bytes): the rows a WMMA fragment load touches then start in different banks.
// Tiles hold the 16-bit Element (fp16 or bf16) of the products' inputs; the
// copies move its bits and never look at its values.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cp_async.cuh"

namespace mpgemm::kernels {

template <class ElementT, int Outer, int Inner>
struct SmemTileShape {
  using Element = ElementT;
  static_assert(sizeof(Element) == 2, "tiles hold 16-bit elements: 8 to a 16-byte chunk");
  static constexpr int kOuter = Outer;
  static constexpr int kInner = Inner;
  static constexpr int kPitch = Inner + 8;
  static constexpr int kElements = Outer * kPitch;
  // WMMA fragment pointers must be 32-byte aligned; keep every tile base so.
  static_assert(kElements * sizeof(Element) % 128 == 0, "tile size must keep 128-byte alignment");
};

// One operand's block tile: BlockMN rows of A (or columns of B) by BlockK.
// KIsInner says whether K is the contiguous dimension (row-major A,
// column-major B).
template <class ElementT, int BlockMN, int BlockK, bool KIsInner>
struct OperandTile {
  using Element = ElementT;
  using Shape = SmemTileShape<Element, KIsInner ? BlockMN : BlockK, KIsInner ? BlockK : BlockMN>;
  static constexpr bool kKIsInner = KIsInner;

  // The 16x16 fragment at (mn, k) of the shared tile.
  __device__ static const Element* fragment(const Element* tile, int mn, int k) {
    return KIsInner ? tile + mn * Shape::kPitch + k : tile + k * Shape::kPitch + mn;
  }
};

// Copies a Shape tile from global memory (rows `ld` elements apart) into shared
// memory, zero-filling whatever lies outside outer_limit x inner_limit. Each of
// kThreads threads moves kPerThread chunks of Vector contiguous elements: 8 (16
// bytes) when the caller guarantees aligned rows and an inner extent that is a
// multiple of 8, else 1.
template <class Shape, int kThreads, int Vector>
struct TileCopy {
  using Element = typename Shape::Element;
  static_assert(Vector == 8 || Vector == 1, "chunks are 16 bytes or one element");
  static constexpr int kChunksPerRow = Shape::kInner / Vector;
  static constexpr int kChunks = Shape::kOuter * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "threads must divide the tile evenly");
  static constexpr int kPerThread = kChunks / kThreads;
  using Chunk = std::conditional_t<Vector == 8, uint4, unsigned short>;

  struct Coord {
    int outer, inner;
  };
  __device__ static Coord coord(int i) {
    const int chunk = threadIdx.x + i * kThreads;
    return {chunk / kChunksPerRow, (chunk % kChunksPerRow) * Vector};
  }

  // Global -> registers, for the register-staged pipeline. The pointer steps
  // from chunk to chunk so no per-chunk offsets stay live across the mainloop.
  __device__ static void load(Chunk (&regs)[kPerThread], const Element* src, int64_t ld, int outer_limit,
                              int inner_limit) {
    static_assert(kThreads % kChunksPerRow == 0, "each thread keeps one inner position");
    constexpr int kOuterStep = kThreads / kChunksPerRow;
    const Coord first = coord(0);
    const Element* from = src + first.outer * ld + first.inner;
    const bool inner_inside = first.inner < inner_limit;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i, from += kOuterStep * ld) {
      const bool inside = inner_inside && first.outer + i * kOuterStep < outer_limit;
      regs[i] = inside ? *reinterpret_cast<const Chunk*>(from) : Chunk{};
    }
  }

  // Registers -> shared memory.
  __device__ static void store(Element* tile, const Chunk (&regs)[kPerThread]) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const Coord c = coord(i);
      *reinterpret_cast<Chunk*>(tile + c.outer * Shape::kPitch + c.inner) = regs[i];
    }
  }

  // Global -> shared memory with cp.async (sm_80 and newer, 16-byte chunks only).
  // Chunks outside the limits read 0 bytes and are zero-filled.
  __device__ static void copy_async(Element* tile, const Element* src, int64_t ld, int outer_limit,
                                    int inner_limit) {
    static_assert(Vector == 8, "cp.async moves 16-byte chunks");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const Coord c = coord(i);
      const bool inside = c.outer < outer_limit && c.inner < inner_limit;
      cp_async_16(tile + c.outer * Shape::kPitch + c.inner, inside ? src + c.outer * ld + c.inner : src, inside);
    }
#endif
  }
};

}  // namespace mpgemm::kernels
