// What the Hopper kernels take besides the problem (GemmParams) and the
// tensor maps: the tile order, each operand's batch rule, and how D is
// stored; and a convolution's walk of its implicit GEMM.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/gemm_params.h"

namespace mpgemm::kernels::sm90 {

// D's rows as the pixels of a grid that takes every stride-th pixel of an
// image (a phase of a strided dgrad, sm90/conv_launch.cu): row m is pixel
// (image, a, b) of an images x rows x cols grid, `pixels` = rows * cols of
// them per image, and starts image * image_pitch + a * row_pitch + b *
// col_pitch elements past D. cols = 0: D's rows are dense, d_row_stride
// apart.
struct PixelRows {
  int cols = 0, pixels = 0;
  int64_t image_pitch = 0, row_pitch = 0, col_pitch = 0;
};

struct WgmmaSchedule {
  int raster_group = 1;  // tile rows per group of the tile order (sm90/tile_scheduler.cuh)
  // A batch stride of 0 broadcasts one matrix, whose tensor map then has a batch extent of 1.
  bool a_broadcast = false, b_broadcast = false;
  bool d_pairs = false;  // D's rows and base allow two-element stores
  bool d_copy = false;   // D has a tensor map: the epilogue stores through the copy engine
  PixelRows d_pixels;    // D's rows as strided pixels (then stored from registers)
  // A split-K GEMM's K slices per split (wgmma_splitk_gemm_kernel: the
  // batch coordinate of its tile order is the split); 0 in every other kernel.
  int split_slices = 0;
};

// Where a stream-K launch's blocks leave their partial sums
// (sm90/stream_k.cuh; the launcher zeroes the flags first): block b's slot
// is a tile's kBlockM x kBlockN floats from partials + b * that, consumer
// c's 64 rows of it in fragment order (float4 i of thread t at (c *
// kAccumulators / 4 + i) * 128 + t: each warp stores 512 contiguous bytes);
// flags[b * kConsumers + c] is raised to 1 once consumer c's part is
// written. `blocks`: the slots, which bound the grid.
struct StreamKWorkspace {
  float* partials = nullptr;
  int* flags = nullptr;
  int blocks = 0;
};

// A convolution's implicit GEMM as its producer walks it
// (sm90/conv_producer.cuh). fprop and dgrad: GEMM rows are output pixels
// (image, p, q) of y (or of dx, or of one phase of dx), each tile's first one
// found by division once per tile, and GEMM-K runs over the walk's taps (r,
// s) and, innermost, blocks of 64 channels of the im2col source (x, or dy),
// so that one K slice is one im2col box, the tap its offsets (r * dilation_h,
// s * dilation_w: the distance between taps in the source). dgrad reads the
// filters flipped: walk tap (r, s) is filter tap (R * S index)
// filter_tap_last - r * filter_row_step - s * filter_col_step. wgrad: GEMM-K
// is the output pixels, 64 a slice, k_slices of them per split of the sum
// (the batch of the persistent tile order), and GEMM columns are (r, s,
// channel) of x, each tap's channels rounded up to whole im2col boxes of 64
// at that tap.
struct ConvWalk {
  // of the pixel grid the im2col boxes step through: P * Q and Q (dgrad: a phase's rows * cols and cols)
  int pixels_per_image = 1, q = 1;
  int stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dilation_h = 1, dilation_w = 1;
  int r = 1, s = 1;                                               // the walk's taps
  int filter_tap_last = 0, filter_row_step = 0, filter_col_step = 0;  // dgrad
  int channel_blocks = 1;  // fprop, dgrad: ceil(the source's channels / kBlockK)
  int channels = 0;        // wgrad: GEMM columns per tap, C rounded up to kBlockK
  int k_slices = 1;        // K slices per tile (wgrad: per split)
};

// x as a block that folds a few-channel convolution's taps itself reads
// it (sm90/conv_gather_producer.cuh; conv/folded_taps.h's
// fold, not written out): NHWC, 16-bit, h x w pixels of c channels, the
// filters' s taps along a row, the original strides and padding. Folded
// pixel (image, j, q) channel (r2 * s + t) * c + ch, for those below
// folded_channels = stride_h * s * c, is x at row stride_h * j - pad_top +
// r2, column stride_w * q - pad_left + t, channel ch (zero outside x); the
// rest of the 64 are zeros.
struct FoldedX {
  const void* x = nullptr;
  int h = 0, w = 0, c = 1, s = 1;
  int stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;
  int folded_channels = 0;
};

// A strided dgrad's phases as one launch (sm90/conv_kernel.cuh's
// wgmma_dgrad_phases_kernel): phase i is a GEMM of its own, its D (gemm[i]:
// m rows of dx's pixels from d at the phase's first pixel), how its rows lie
// (schedule[i].d_pixels), its walk (walk[i]; k_slices 0 for a phase no tap
// reaches, whose tiles store zeros) and its im2col map of dy (dy_maps[i]);
// its tiles are the launch's [first_tile[i], first_tile[i + 1]), the phases
// in the order the launcher gives (the most K slices first). Stride 2 x 2,
// ResNet's, has four phases; the launcher runs more as a launch a phase.
constexpr int kMaxDgradPhases = 4;
struct DgradPhases {
  CUtensorMap dy_maps[kMaxDgradPhases];
  GemmParams gemm[kMaxDgradPhases];
  WgmmaSchedule schedule[kMaxDgradPhases];
  ConvWalk walk[kMaxDgradPhases];
  int64_t first_tile[kMaxDgradPhases + 1] = {};
  int count = 0;
};

}  // namespace mpgemm::kernels::sm90
