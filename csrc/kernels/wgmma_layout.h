// Where the Hopper GEMM's data lives: its tile configuration, the shared-memory
// layout the tensor copy engine writes with 128-byte swizzle, the wgmma
// shared-memory matrix descriptors that read it back, and which accumulator
// element each thread holds. Plain integer functions for host and device, so
// that the host models (tests/kernel_sim/hopper_models.h, after the PTX ISA's
// text) can check the kernel's own index code element by element.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MPGEMM_LAYOUT_FN __host__ __device__ __forceinline__ constexpr
#else
#define MPGEMM_LAYOUT_FN inline constexpr
#endif

namespace mpgemm::kernels::sm90 {

// What every Hopper kernel's block holds, however its consumers share the
// work: kConsumers warpgroups that each issue 64 x 256 x 16 wgmmas (one
// instruction spans the tile's width) into 64 x 256 fp32 accumulators, one
// more warpgroup that issues the copies, and a ring of kStages shared-memory
// stages of kBlockK-deep K slices.
struct WgmmaBlockConfig {
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (kConsumers + 1);
  static constexpr int kInstrM = 64, kInstrN = 256, kInstrK = 16;
  static constexpr int kBlockN = kInstrN, kBlockK = 64, kStages = 4;
  // Registers per thread after setmaxnreg: the producer gives up what the
  // consumers' 128 accumulators need (both within the 64K of the SM).
  static constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  // Each consumer stages its output in kOutputBuffers strips of 64 rows by
  // 128 bytes (OutputStrip), so that it writes one while the copy engine
  // stores the other.
  static constexpr int kOutputBuffers = 2, kOutputStripBytes = kInstrM * 128;
  static_assert(kProducerRegisters * kWarpgroupThreads + kConsumerRegisters * kWarpgroupThreads * kConsumers <= 65536,
                "the register file holds every warpgroup");
};

// How a block's consumers share its work, as CUTLASS's two sm90 schedules
// do. Cooperative: a 128 x 256 tile, each consumer taking 64 of its rows, so
// both read every stage and both store at once while no wgmma runs.
// Ping-pong: 64 x 256 tiles, each consumer taking every other tile of the
// block whole, so that one consumer's epilogue runs while the other's wgmmas
// keep the Tensor Cores busy; the ring holds the tiles' slices in order, so
// the two mainloops must take turns (wgmma_gemm.cuh).
enum class Consumers : int { kCooperative = 0, kPingPong = 1 };

// A block's tile and shared memory under one schedule.
template <Consumers kSplit>
struct WgmmaTileConfig : WgmmaBlockConfig {
  static constexpr bool kPingPong = kSplit == Consumers::kPingPong;
  static constexpr int kBlockM = kPingPong ? kInstrM : kConsumers * kInstrM;
  // Consumers of a block that read each stage: the arrivals its `empty` barrier takes from each block.
  static constexpr int kStageReaders = kPingPong ? 1 : kConsumers;
  // kStages of A's and B's tiles, the output strips, the 2 x kStages mbarriers,
  // and an atom of slack to align the dynamic shared memory (only 16-byte
  // aligned) to 1024: 225 (cooperative) or 193 (ping-pong) of the 227 KB a
  // block may have; a 5th ping-pong stage would need 233.
  static constexpr int kSmemBytes = kStages * (kBlockM + kBlockN) * kBlockK * 2 +
                                    kConsumers * kOutputBuffers * kOutputStripBytes + 2 * kStages * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "a block's shared memory holds the ring and the output strips");
};

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
MPGEMM_LAYOUT_FN uint32_t swizzle128_offset(uint32_t row, uint32_t byte) {
  return row * kSwizzleBytes + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
}

// --- Operand tiles in shared memory, as the copy engine stores them and
// wgmma reads them. A tile holds `Rows` rows of M (A) or N (B) by kBlockK of
// K, copied as kBoxes boxes of kBoxRows rows each, kBoxBytes apart. K-major
// (the operand's K is contiguous in global memory): boxes of up to 128 rows
// by 64 K, each row one 128-byte swizzle row, so that the boxes lie end to
// end as one run of rows. MN-major: boxes of 64 K rows by 64 M (or N)
// elements, 8 KB apart. Whole boxes are what a cluster's blocks share out
// when they multicast a tile (wgmma_gemm.cuh).
template <int Rows, bool KMajor>
struct OperandTile {
  static constexpr bool kKMajor = KMajor;
  static constexpr int kBoxRows = KMajor ? (Rows < 128 ? Rows : 128) : kSwizzleElements;
  static constexpr int kBoxes = Rows / kBoxRows;
  static constexpr int kBoxBytes = kBoxRows * 64 * 2;
  static constexpr int kBytes = Rows * 64 * 2;
  static_assert(Rows % kBoxRows == 0, "a tile is whole boxes");
  // Byte offset of element (mn, k) of the tile.
  MPGEMM_LAYOUT_FN static uint32_t offset(uint32_t mn, uint32_t k) {
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
  MPGEMM_LAYOUT_FN static uint64_t descriptor(uint32_t tile, int k16, int row_block = 0);
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
  static constexpr int kStrips = WgmmaBlockConfig::kInstrN / kCols;  // across a consumer's 256 columns
  static_assert(kBytes == kRows * kSwizzleBytes, "a strip is 64 rows of one swizzle row each");
  static_assert(kStrips * kCols == WgmmaBlockConfig::kInstrN, "whole strips span a consumer's columns");
  // Byte offset of element (row, col) of the strip.
  MPGEMM_LAYOUT_FN static uint32_t offset(uint32_t row, uint32_t col) {
    return swizzle128_offset(row, col * ElementBytes);
  }
};

// --- Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2): start address,
// leading and stride byte offsets, each in 16-byte units in bits 0-13, 16-29
// and 32-45; base offset 0 (bits 49-51: atoms 1024-byte aligned); swizzle
// mode in bits 62-63, 1 for 128 bytes.
MPGEMM_LAYOUT_FN uint64_t wgmma_descriptor(uint32_t smem_address, uint32_t leading_byte_offset,
                                           uint32_t stride_byte_offset) {
  return uint64_t((smem_address & 0x3FFFF) >> 4) | uint64_t((leading_byte_offset & 0x3FFFF) >> 4) << 16 |
         uint64_t((stride_byte_offset & 0x3FFFF) >> 4) << 32 | uint64_t(1) << 62;
}

template <int Rows, bool KMajor>
MPGEMM_LAYOUT_FN uint64_t OperandTile<Rows, KMajor>::descriptor(uint32_t tile, int k16, int row_block) {
  return wgmma_descriptor(tile + row_block * kBytesPer64Rows + k16 * kBytesPerK16, kLeadingByteOffset,
                          kStrideByteOffset);
}

// --- The m64nNk16 fp32 accumulator fragment (PTX ISA 9.7.15.5.2, "Matrix
// fragments for wgmma .m64nNk16", figure "WGMMA .m64nNk16 register fragment
// layout for accumulator matrix D"): warp w of the warpgroup holds rows
// 16w..16w+15; register r of lane l holds row 16w + l/4 + 8*((r/2)%2) and
// column 8*(r/4) + 2*(l%4) + r%2. Registers r and r+1 (r even) are
// neighbours in a row: the epilogue stores them as a pair.
MPGEMM_LAYOUT_FN int accumulator_row(int thread, int reg) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((reg / 2) % 2);
}
MPGEMM_LAYOUT_FN int accumulator_col(int thread, int reg) { return 8 * (reg / 4) + 2 * (thread % 4) + reg % 2; }

}  // namespace mpgemm::kernels::sm90
