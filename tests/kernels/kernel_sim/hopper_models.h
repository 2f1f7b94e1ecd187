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

// --- Tensor copy, im2col mode (PTX ISA, "Tensors": "Im2col mode", its
// "Bounding Box" and "Traversal Stride"; cp.async.bulk.tensor's .im2col
// form; the corners, channels per pixel, pixels per column and element
// strides of cuTensorMapEncodeIm2col), for a 4-D tensor (C, W, H, N): the
// bounding box spans W from the lower corner's W to W - 1 plus the upper
// corner's, and H likewise, both relative to the tensor's own first and
// last pixels. A copy loads pixels-per-column pixels: the first at the
// instruction's coordinates (w, h, n), each next one traversal-stride
// further along W, wrapping to the box's lower W and one stride on along H
// past the box's far edge in W, and to the box's lower H of the next image
// past its far edge in H. Each pixel's element read is at its (w, h) plus
// the instruction's im2col offsets, channels c to c + channels-per-pixel - 1
// of it; anything outside the tensor arrives as zero. In shared memory the
// box is dense, pixel after pixel, channel fastest, then swizzled as in
// tiled mode.
struct Im2colBox {
  int64_t dims[4];          // C, W, H, N
  int32_t lower[2], upper[2];  // W, H
  uint32_t traversal[2];    // W, H
};

// The tensor coordinates (c, w, h, n) that element `channel` of pixel
// `pixel` of a box copied from (c, w, h, n) with offsets (w_offset,
// h_offset) reads.
struct Im2colElement {
  int64_t at[4];
};
inline Im2colElement im2col_element(const Im2colBox& b, const int64_t (&start)[4], int w_offset, int h_offset,
                                    uint32_t pixel, uint32_t channel) {
  const int64_t w_last = b.dims[1] - 1 + b.upper[0], h_last = b.dims[2] - 1 + b.upper[1];
  int64_t w = start[1], h = start[2], n = start[3];
  for (uint32_t i = 0; i < pixel; ++i) {
    w += b.traversal[0];
    if (w > w_last) {
      w = b.lower[0];
      h += b.traversal[1];
      if (h > h_last) {
        h = b.lower[1];
        ++n;
      }
    }
  }
  return {{start[0] + channel, w + w_offset, h + h_offset, n}};
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
