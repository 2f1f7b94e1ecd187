// The WMMA kernels' operand tiles in shared memory, and how threads move them
// there from global memory.
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

// One operand's block tile: BlockMN rows of A (or columns of B) by BlockK,
// rows padded (the Hopper kernels' tiles are swizzled instead:
// sm90::SwizzledOperandTile). KMajor: K is the contiguous dimension
// (row-major A, column-major B).
template <class ElementT, int BlockMN, int BlockK, bool KMajor>
struct PaddedOperandTile {
  using Element = ElementT;
  using Shape = SmemTileShape<Element, KMajor ? BlockMN : BlockK, KMajor ? BlockK : BlockMN>;
  static constexpr bool kKMajor = KMajor;

  // Where element (mn, k) lies in the shared tile: a 16x16 fragment starts there.
  __host__ __device__ static constexpr int offset(int mn, int k) {
    return KMajor ? mn * Shape::kPitch + k : k * Shape::kPitch + mn;
  }
};

// Which chunks of a Shape tile each of kThreads threads moves between global
// and shared memory: kPerThread chunks of Vector contiguous elements: 8, 4 or
// 2 (16, 8 or 4 bytes) when the caller guarantees rows aligned to the chunk and
// an inner extent that is a multiple of Vector, else 1. Consecutive threads take consecutive chunks of a row,
// so a thread keeps one inner position and its chunks lie kOuterStep rows
// apart: its addresses in both memories step by constants, worked out once.
template <class Shape, int kThreads, int Vector>
struct TileCopy {
  using Element = typename Shape::Element;
  static_assert(Vector == 8 || Vector == 4 || Vector == 2 || Vector == 1, "chunks are 16, 8, 4 or 2 bytes");
  static constexpr int kChunksPerRow = Shape::kInner / Vector;
  static constexpr int kChunks = Shape::kOuter * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "threads must divide the tile evenly");
  static_assert(kThreads % kChunksPerRow == 0, "each thread keeps one inner position");
  static constexpr int kPerThread = kChunks / kThreads;
  static constexpr int kOuterStep = kThreads / kChunksPerRow;
  using Chunk = std::conditional_t<Vector == 8, uint4,
                                   std::conditional_t<Vector == 4, uint2,
                                                      std::conditional_t<Vector == 2, unsigned, unsigned short>>>;
  static_assert(sizeof(Chunk) == Vector * sizeof(Element), "a chunk holds Vector elements");

  struct Coord {
    int outer, inner;
  };
  // This thread's chunk i: rows first().outer + i * kOuterStep, column first().inner.
  __device__ static Coord first() { return {int(threadIdx.x) / kChunksPerRow, int(threadIdx.x) % kChunksPerRow * Vector}; }
  __device__ static int outer(int i) { return first().outer + i * kOuterStep; }
  // Where this thread's chunk 0 lies in the tile; chunk i is i * kSmemStep further.
  __device__ static int smem_offset() { return first().outer * Shape::kPitch + first().inner; }
  static constexpr int kSmemStep = kOuterStep * Shape::kPitch;

  // Registers -> shared memory, for the register-staged pipeline.
  __device__ static void store(Element* tile, const Chunk (&regs)[kPerThread]) {
    Element* to = tile + smem_offset();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) *reinterpret_cast<Chunk*>(to + i * kSmemStep) = regs[i];
  }
};

}  // namespace mpgemm::kernels
