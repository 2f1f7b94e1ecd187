// Models of the Hopper hardware the wgmma GEMM relies on, each written from
// the text of the PTX ISA (sections cited) and the CUDA driver API, not from
// the kernel's own index code (csrc/kernels/sm90/layout.h), which they check:
// the simulated copy engine and wgmma (hopper_sim.h) place and read shared
// memory through these functions alone, and hopper_cases.cpp compares them
// with the kernel's SwizzledOperandTile, descriptors and accumulator mapping element
// by element. Addresses are byte addresses in the shared state space.
#pragma once

#include <cstdint>

namespace sim::hopper_model {

// --- Swizzling (PTX ISA, "Tensors": "Swizzling Modes"; the CUDA C++
// Programming Guide's TMA swizzle section): in 128-byte mode the
// shared-memory address's bits 4-6 (the 16-byte chunk within a 128-byte
// row) are XORed with bits 7-9 (the row within a 1024-byte pattern). The
// pattern is a function of the address, so it starts over at every 1024-byte
// boundary; both the copy engine and the wgmma descriptors apply it.
inline uint32_t swizzle_128b(uint32_t address) { return address ^ (((address >> 7) & 7) << 4); }

// --- Tensor copy, tiled mode (PTX ISA, "Tensors": "Tiled Mode", and
// cp.async.bulk.tensor; the box of cuTensorMapEncodeTiled): the box's
// elements, those outside the tensor as zeros, are written to shared
// memory densely, dimension 0 fastest, starting at `dst`, and then swizzled.
// Element (i0, i1, i2) of a box of extents box[0..2]:
inline uint32_t tma_box_address(uint32_t dst, const uint32_t (&box)[3], uint32_t element_bytes, uint32_t i0,
                                uint32_t i1, uint32_t i2, bool swizzle) {
  const uint32_t linear = dst + ((i2 * box[1] + i1) * box[0] + i0) * element_bytes;
  return swizzle ? swizzle_128b(linear) : linear;
}

// --- The shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2, "Matrix
// Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading dimension
// byte offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset,
// 62-63 swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).
struct MatrixDescriptor {
  uint32_t start, leading_byte_offset, stride_byte_offset, base_offset, swizzle_mode;
};

inline MatrixDescriptor decode_descriptor(uint64_t d) {
  return {uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4,
          uint32_t((d >> 49) & 7), uint32_t(d >> 62)};
}

// Where wgmma reads element (mn, k) of an operand tile, mn along M (A) or N
// (B), k in [0, 16), 16-bit elements, 128-byte swizzle with base offset 0
// (the start's bits 7-9 zero) (PTX ISA 9.7.15.5.1.2, "Shared Memory Matrix
// Layout": the tile is built of swizzle atoms of 8 rows of 128 bytes; and
// "Strides"):
//  - K-major (imm-trans 0): an atom row holds 64 consecutive K of one M/N;
//    the 8 rows of an atom are 8 consecutive M/N; the stride byte offset
//    steps from one group of 8 M/N to the next. The 16 K of one instruction
//    lie within the row (the leading byte offset is unused).
//  - MN-major (imm-trans 1): an atom row holds 64 consecutive M/N of one K;
//    the 8 rows of an atom are 8 consecutive K; the stride byte offset steps
//    from one group of 8 K to the next, the leading byte offset from one
//    group of 64 M/N to the next.
// The address is formed unswizzled from the start and then swizzled.
inline uint32_t wgmma_operand_address(const MatrixDescriptor& d, bool mn_major, uint32_t mn, uint32_t k) {
  const uint32_t row_bytes = 128, element_bytes = 2;
  const uint32_t linear =
      mn_major ? d.start + (mn / 64) * d.leading_byte_offset + (k / 8) * d.stride_byte_offset + (k % 8) * row_bytes +
                     (mn % 64) * element_bytes
               : d.start + (mn / 8) * d.stride_byte_offset + (mn % 8) * row_bytes + k * element_bytes;
  return swizzle_128b(linear);
}

// --- The m64nNk16 fp32 accumulator fragment (PTX ISA 9.7.15.5.2, figure
// "WGMMA .m64nNk16 register fragment layout for accumulator matrix D"): warp
// w of the warpgroup holds rows 16w to 16w + 15. Within a warp the N columns
// come in groups of 8, one group per 4 registers; in each group lane l holds
// columns 2 (l % 4) and 2 (l % 4) + 1 of row l / 4 (registers 0 and 1 of the
// group) and of row l / 4 + 8 (registers 2 and 3).
struct FragmentElement {
  int row, col;
};

inline FragmentElement accumulator_element(int thread, int reg) {
  const int warp = thread / 32, lane = thread % 32;
  const int group = reg / 4, within = reg % 4;
  return {16 * warp + lane / 4 + (within >= 2 ? 8 : 0), 8 * group + 2 * (lane % 4) + within % 2};
}

}  // namespace sim::hopper_model
