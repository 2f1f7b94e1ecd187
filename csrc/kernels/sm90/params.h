// What the Hopper kernels take besides the problem (GemmParams) and the
// tensor maps: the tile order, each operand's batch rule, and how D is
// stored; and a convolution's walk of its implicit GEMM.
#pragma once

namespace mpgemm::kernels::sm90 {

struct WgmmaSchedule {
  int raster_group = 1;  // tile rows per group of the tile order (sm90/tile_scheduler.cuh)
  // A batch stride of 0 broadcasts one matrix, whose tensor map then has a batch extent of 1.
  bool a_broadcast = false, b_broadcast = false;
  bool d_pairs = false;  // D's rows and base allow two-element stores
  bool d_copy = false;   // D has a tensor map: the epilogue stores through the copy engine
};

// A convolution's implicit GEMM as its producer walks it
// (sm90/conv_producer.cuh). fprop and dgrad: GEMM rows are output pixels
// (image, p, q) of y (or of dx), each tile's first one found by division
// once per tile, and GEMM-K runs over filter taps (r, s) and, innermost,
// blocks of 64 channels of the im2col source (x, or dy), so that one K
// slice is one im2col box, the tap its offsets. wgrad: GEMM-K is the output
// pixels, 64 a slice, k_slices of them per split of the sum (the batch of the
// persistent tile order), and GEMM columns are (r, s, channel) of x, 64 of
// them one im2col box at one tap.
struct ConvWalk {
  int pixels_per_image = 1, q = 1;  // of the pixel grid the im2col boxes step through: P * Q and Q (dgrad: H * W, W)
  int stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dilation_h = 1, dilation_w = 1;
  int r = 1, s = 1;
  int channel_blocks = 1;  // fprop, dgrad: ceil(the source's channels / kBlockK)
  int channels = 0;        // wgrad: C, a multiple of kBlockK
  int k_slices = 1;        // K slices per tile (wgrad: per split)
};

}  // namespace mpgemm::kernels::sm90
