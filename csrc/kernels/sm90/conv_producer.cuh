// The producer of a Hopper convolution block: one thread of warpgroup 0
// issues each K slice's copies into a stage its readers have handed back,
// the bytes completing on the stage's `full` mbarrier (or, for a
// few-channel layer's folded taps where asked, every thread of the
// warpgroup gathers x's part of the stage itself:
// sm90/conv_gather_producer.cuh). The copy engine lays
// every box out as the GEMM's swizzled tiles (sm90/layout.h), so the
// consumers and the epilogue are the GEMM's. Per pass (sm90/params.h's
// ConvWalk):
//  - fprop: the im2col box of the tile's 128 output pixels' activations at
//    one filter tap and 64 channels (x's pixels p * stride - pad + r *
//    dilation, those in the padding arriving as zeros), and the tiled boxes
//    of the tile's 256 filters at that tap and those channels (K-major);
//  - dgrad: the same over dy, the filters read at the flipped tap and
//    transposed: boxes of 64 output channels of dx by 64 filters (N-major).
//    At stride 1 the walk is dx's pixels over every tap (the padding
//    dilation * (R - 1) - pad); with a stride, a tile walks one phase of dx
//    (a launch a phase, or every phase's tiles in one launch:
//    sm90/conv_launch.cu) over the taps that reach it, whose dy pixels are
//    again a stride-1 window of the phase's pixel grid;
//  - wgrad: 64 output pixels a slice, the tile's filters of dy (128, or 64
//    on the 64-row tile) as tiled boxes (M-major) and its columns of
//    (r, s, c) (256, or 128 and 64 on the narrow tiles) as im2col boxes
//    of x, each 64 channels at one tap (N-major); each tap's columns are C
//    rounded up to whole boxes.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "arch/copy_engine.cuh"
#include "arch/mbarrier.cuh"
#include "conv/params.h"
#include "sm90/params.h"
#include "sm90/pipeline.cuh"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// A pixel of the walk's grid as the start of an im2col box: its window's
// first tap (w, h) and its image.
struct BoxStart {
  int w, h, image;
};

__device__ __forceinline__ BoxStart box_start(int pixel, const ConvWalk& walk) {
  const int image = pixel / walk.pixels_per_image, within = pixel - image * walk.pixels_per_image;
  const int p = within / walk.q, q = within - p * walk.q;
  return {q * walk.stride_w - walk.pad_left, p * walk.stride_h - walk.pad_top, image};
}

// Waits for the stage at `pipe` to be handed back and announces its bytes.
template <class Smem, int Stages>
__device__ __forceinline__ uint64_t* claim_stage(Smem& shared, const PipelineState<Stages>& pipe) {
  mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
  mbarrier_arrive_expect_tx(&shared.full[pipe.stage], Smem::ATile::kBytes + Smem::BTile::kBytes);
  return &shared.full[pipe.stage];
}

// fprop and dgrad: rows from tile.origin.m0 are output pixels, columns from
// tile.origin.n0 filters (fprop) or dx's channels (dgrad). a_map is the
// source's im2col map (x, or dy: dimensions (channels, W, H, N), a bounding
// box of every window's first tap, traversal strides the convolution's),
// w_map the filters' (dimensions (C, R * S, K)).
template <ConvPass Pass, class Tile, class Smem>
__device__ __forceinline__ void load_pixel_rows_tile(Smem& shared, const CUtensorMap* a_map, const CUtensorMap* w_map,
                                                     const BatchTile& tile, const ConvWalk& walk,
                                                     TilePipeline<Tile>& pipe) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  static_assert(Tile::kClusterM == 1 && ATile::kKMajor && ATile::kBoxes == 1 &&
                    BTile::kKMajor == (Pass == ConvPass::kFprop),
                "blocks alone, each slice of pixels one im2col box, filters K-major for fprop and N-major for dgrad");
  const int n0 = int(tile.origin.n0);
  const BoxStart start = box_start(int(tile.origin.m0), walk);
  for (int r = 0; r < walk.r; ++r)
    for (int s = 0; s < walk.s; ++s) {
      // dgrad reads the filters flipped (at stride 1 its tap (r, s) is the filters' (R - 1 - r, S - 1 - s)).
      const int tap = Pass == ConvPass::kFprop
                          ? r * walk.s + s
                          : walk.filter_tap_last - r * walk.filter_row_step - s * walk.filter_col_step;
      for (int c0 = 0, block = 0; block < walk.channel_blocks; ++block, c0 += Config::kBlockK, pipe.advance()) {
        uint64_t* full = claim_stage(shared, pipe);
        tma_load_im2col_4d(shared.a[pipe.stage], a_map, full, c0, start.w, start.h, start.image,
                           uint16_t(s * walk.dilation_w), uint16_t(r * walk.dilation_h));
#pragma unroll
        for (int box = 0; box < BTile::kBoxes; ++box) {
          const int column = n0 + box * BTile::kBoxRows;
          uint8_t* to = shared.b[pipe.stage] + box * BTile::kBoxBytes;
          if constexpr (BTile::kKMajor) tma_load_3d(to, w_map, full, c0, tap, column);
          else tma_load_3d(to, w_map, full, column, tap, c0);
        }
      }
    }
}

// wgrad: rows from tile.origin.m0 are filters, columns from tile.origin.n0
// are (r, s, c) of x, walk.channels of them per tap (C rounded up to whole
// boxes), GEMM-K the output pixels of split tile.batch. dy_map
// is dy as dimensions (K, N * P * Q, 1), x_map x's im2col map as fprop's
// (64 pixels a box).
template <class Tile, class Smem>
__device__ __forceinline__ void load_wgrad_tile(Smem& shared, const CUtensorMap* dy_map, const CUtensorMap* x_map,
                                                const BatchTile& tile, const ConvWalk& walk, TilePipeline<Tile>& pipe) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  static_assert(Tile::kClusterM == 1 && !ATile::kKMajor && !BTile::kKMajor && BTile::kBoxRows == Config::kBlockK,
                "blocks alone, dy M-major, x N-major in im2col boxes of 64 channels");
  const int m0 = int(tile.origin.m0);
  // Each of B's boxes is 64 of a tap's columns; those past C (within the
  // tap, or past the last tap) are channels past x's, which arrive as zeros.
  int channel[BTile::kBoxes], w_offset[BTile::kBoxes], h_offset[BTile::kBoxes];
#pragma unroll
  for (int box = 0; box < BTile::kBoxes; ++box) {
    const int column = int(tile.origin.n0) + box * BTile::kBoxRows, tap = column / walk.channels;
    const bool inside = tap < walk.r * walk.s;
    const int r = inside ? tap / walk.s : 0, s = inside ? tap - r * walk.s : 0;
    channel[box] = inside ? column - tap * walk.channels : walk.channels;
    w_offset[box] = s * walk.dilation_w, h_offset[box] = r * walk.dilation_h;
  }
  const int first_pixel = int(tile.batch) * walk.k_slices * Config::kBlockK;
  for (int slice = 0; slice < walk.k_slices; ++slice, pipe.advance()) {
    const int pixel = first_pixel + slice * Config::kBlockK;
    const BoxStart start = box_start(pixel, walk);
    uint64_t* full = claim_stage(shared, pipe);
#pragma unroll
    for (int box = 0; box < ATile::kBoxes; ++box)
      tma_load_3d(shared.a[pipe.stage] + box * ATile::kBoxBytes, dy_map, full, m0 + box * ATile::kBoxRows, pixel, 0);
#pragma unroll
    for (int box = 0; box < BTile::kBoxes; ++box)
      tma_load_im2col_4d(shared.b[pipe.stage] + box * BTile::kBoxBytes, x_map, full, channel[box], start.w, start.h,
                         start.image, uint16_t(w_offset[box]), uint16_t(h_offset[box]));
  }
}

// The tile's K slices into the ring from `pipe` on, leaving `pipe` past them.
template <ConvPass Pass, class Tile, class Smem>
__device__ __forceinline__ void load_conv_tile(Smem& shared, const CUtensorMap* a_map, const CUtensorMap* b_map,
                                               const BatchTile& tile, const ConvWalk& walk, TilePipeline<Tile>& pipe) {
  if constexpr (Pass == ConvPass::kWgrad) load_wgrad_tile<Tile>(shared, a_map, b_map, tile, walk, pipe);
  else load_pixel_rows_tile<Pass, Tile>(shared, a_map, b_map, tile, walk, pipe);
}

}  // namespace mpgemm::kernels::sm90
