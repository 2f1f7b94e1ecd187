// Where the Hopper GEMM's data lives: the shared-memory layout the tensor
// copy engine writes with 128-byte swizzle, the wgmma shared-memory matrix
// descriptors that read it back, the output strips the epilogue writes, and
// which accumulator element each thread holds. Plain integer functions for
// host and device, so that host code can check the kernel's own index code
// element by element against models of the PTX ISA's text. The tiles' sizes
// are common/tile_configs.h's.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/tile_configs.h"

namespace mpgemm::kernels::sm90 {

// --- 128-byte swizzle (the copy engine's CU_TENSOR_MAP_SWIZZLE_128B and the
// descriptor's swizzle mode 1). A box whose inner extent is 128 bytes (64
// 16-bit elements) lands as consecutive 128-byte rows, the 16-byte chunk c of
// row r stored at chunk c ^ (r % 8), so that the 8 rows of a 1024-byte atom
// spread a column of chunks over all 32 banks. The buffer must be
// 1024-byte aligned.
inline constexpr int kSwizzleBytes = 128;
inline constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;
inline constexpr int kSwizzleElements = kSwizzleBytes / 2;  // 16-bit elements per row

// Byte offset, within a box of 128-byte rows, of byte `byte` of row `row`.
MPGEMM_HOST_DEVICE constexpr uint32_t swizzle128_offset(uint32_t row, uint32_t byte) {
  return row * kSwizzleBytes + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
}

// --- Operand tiles in shared memory, as the copy engine stores them and
// wgmma reads them. A tile holds `Rows` rows of M (A) or N (B) by kBlockK of
// K, copied as kBoxes boxes of kBoxRows rows each, kBoxBytes apart. K-major
// (the operand's K is contiguous in global memory): boxes of up to 128 rows
// by 64 K, each row one 128-byte swizzle row, so that the boxes lie end to
// end as one run of rows. MN-major: boxes of 64 K rows by 64 M (or N)
// elements, 8 KB apart. Whole boxes are what a cluster's blocks share out
// when they multicast a tile (sm90/producer.cuh). (The WMMA kernels' tiles
// are padded instead: PaddedOperandTile.)
template <int Rows, bool KMajor>
struct SwizzledOperandTile {
  static constexpr bool kKMajor = KMajor;
  static constexpr int kBoxRows = KMajor ? (Rows < 128 ? Rows : 128) : kSwizzleElements;
  static constexpr int kBoxes = Rows / kBoxRows;
  static constexpr int kBoxBytes = kBoxRows * 64 * 2;
  static constexpr int kBytes = Rows * 64 * 2;
  static_assert(Rows % kBoxRows == 0, "a tile is whole boxes");
  // Byte offset of element (mn, k) of the tile.
  MPGEMM_HOST_DEVICE constexpr static uint32_t offset(uint32_t mn, uint32_t k) {
    if constexpr (KMajor) return swizzle128_offset(mn, 2 * k);
    else return (mn / kBoxRows) * kBoxBytes + swizzle128_offset(k, 2 * (mn % kBoxRows));
  }
  // Descriptor strides (PTX ISA 9.7.15.5.1, "Strides"): the stride byte
  // offset steps between groups of 8 rows of the swizzle atom (the rows run
  // along M/N when K-major, along K when MN-major); the leading byte offset,
  // unused by a K-major swizzled operand whose 16 K fit in one row, steps
  // from one 64-element atom column of M/N to the next when MN-major.
  static constexpr uint32_t kStrideByteOffset = kSwizzleAtomBytes;
  static constexpr uint32_t kLeadingByteOffset = KMajor ? 16 : kBoxBytes;
  // Start address step of a wgmma's 16 K: two columns of 16-byte chunks in a
  // K-major row (the hardware applies the swizzle to the advanced address),
  // sixteen 128-byte K rows when MN-major.
  static constexpr uint32_t kBytesPerK16 = KMajor ? 32 : 16 * kSwizzleBytes;
  // Start of the 64 rows a consumer warpgroup reads: one atom column when
  // MN-major, 64 swizzle rows when K-major, 8 KB either way.
  static constexpr uint32_t kBytesPer64Rows = 64 * kSwizzleBytes;
  // The descriptor of the wgmma operand that rows [64 * row_block, ...) by
  // K [16 * k16, 16 * k16 + 16) of the tile at shared address `tile` form.
  MPGEMM_HOST_DEVICE constexpr static uint64_t descriptor(uint32_t tile, int k16, int row_block = 0);
};

// --- The epilogue's output strips: a consumer's 64 rows of D by 128 bytes of
// columns (32 fp32 or 64 16-bit ones), written by its threads and stored by
// the copy engine as one box with 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B
// on D's tensor map), 1024-byte aligned. The swizzle spreads the 8 rows one
// fragment store touches over all 32 banks: a warp writes a column pair of
// 8 rows in 2 wavefronts (fp32) or 1 (16-bit), with no conflict.
template <int ElementBytes>
struct OutputStrip {
  static constexpr int kRows = WgmmaBlockConfig::kInstrM, kCols = kSwizzleBytes / ElementBytes;
  static constexpr int kBytes = WgmmaBlockConfig::kOutputStripBytes;
  static_assert(kBytes == kRows * kSwizzleBytes, "a strip is 64 rows of one swizzle row each");
  // Byte offset of element (row, col) of the strip.
  MPGEMM_HOST_DEVICE constexpr static uint32_t offset(uint32_t row, uint32_t col) {
    return swizzle128_offset(row, col * ElementBytes);
  }
};

// --- Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2): start address,
// leading and stride byte offsets, each in 16-byte units in bits 0-13, 16-29
// and 32-45; base offset 0 (bits 49-51: atoms 1024-byte aligned); swizzle
// mode in bits 62-63, 1 for 128 bytes.
MPGEMM_HOST_DEVICE constexpr uint64_t wgmma_descriptor(uint32_t smem_address, uint32_t leading_byte_offset,
                                           uint32_t stride_byte_offset) {
  return uint64_t((smem_address & 0x3FFFF) >> 4) | uint64_t((leading_byte_offset & 0x3FFFF) >> 4) << 16 |
         uint64_t((stride_byte_offset & 0x3FFFF) >> 4) << 32 | uint64_t(1) << 62;
}

template <int Rows, bool KMajor>
MPGEMM_HOST_DEVICE constexpr uint64_t SwizzledOperandTile<Rows, KMajor>::descriptor(uint32_t tile, int k16,
                                                                                   int row_block) {
  return wgmma_descriptor(tile + row_block * kBytesPer64Rows + k16 * kBytesPerK16, kLeadingByteOffset,
                          kStrideByteOffset);
}

// --- The m64nNk16 fp32 accumulator fragment (PTX ISA 9.7.15.5.2, "Matrix
// fragments for wgmma .m64nNk16", figure "WGMMA .m64nNk16 register fragment
// layout for accumulator matrix D"): warp w of the warpgroup holds rows
// 16w..16w+15; register r of lane l holds row 16w + l/4 + 8*((r/2)%2) and
// column 8*(r/4) + 2*(l%4) + r%2. Registers r and r+1 (r even) are
// neighbours in a row: the epilogue stores them as a pair.
MPGEMM_HOST_DEVICE constexpr int accumulator_row(int thread, int reg) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((reg / 2) % 2);
}
MPGEMM_HOST_DEVICE constexpr int accumulator_col(int thread, int reg) {
  return 8 * (reg / 4) + 2 * (thread % 4) + reg % 2;
}

}  // namespace mpgemm::kernels::sm90
