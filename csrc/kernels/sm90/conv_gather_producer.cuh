// The producer of a few-channel convolution's folded taps (ResNet's first
// layer: 3 channels, 7x7 at stride 2) on conv/folded_taps.h's folded
// problem without x's folded copy: every thread of the producer's
// warpgroup, not one, fills each stage. Each of the 128 threads loads x's
// elements of the folded pixels a stage needs and stores them, 128-byte
// swizzled as the copy engine would have, into the stage: fprop's A (128
// output pixels a tile, one folded tap a slice), wgrad's B (64 output
// pixels a slice, a folded tap a box of 64 columns); thread 0 also has the
// copy engine load the other operand (the folded filters, or dy) as
// sm90/conv_producer.cuh does. Why: the copy is 2.3x x's size at the first
// layer's stride 2 (0.42 GB at batch 256), written and read back once per
// pass, and its kernel took about 0.4 ms of each pass's 0.9 (H200,
// fe39419), more than the product itself; gathered, no copy exists, and x's
// elements, each read about 12 times at that stride, come mostly from L1
// and L2. Lane l of a warp holds folded channels 2l and 2l + 1 (one 4-byte
// store a row, a warp's stores one 128-byte row); warp w the rows w, w + 4,
// ...
#pragma once

#include <climits>
#include <cstdint>

#include <cuda.h>

#include "arch/copy_engine.cuh"
#include "arch/mbarrier.cuh"
#include "arch/smem.cuh"
#include "conv/params.h"
#include "sm90/layout.h"
#include "sm90/params.h"
#include "sm90/pipeline.cuh"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// A thread's two folded channels as offsets from a folded pixel's first
// tap: rows and columns into x (rows far outside it for channels past the
// runs, which then read as zeros) and the element offset in x.
struct FoldedLane {
  int row[2], col[2], offset[2];
};

__device__ __forceinline__ FoldedLane folded_lane(const FoldedX& f, int lane) {
  FoldedLane l;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int ch = 2 * lane + j, tap = ch / f.c, r2 = tap / f.s, t = tap - r2 * f.s;
    const bool inside = ch < f.folded_channels;
    l.row[j] = inside ? r2 : INT_MIN / 2;
    l.col[j] = t;
    l.offset[j] = inside ? (r2 * f.w + t) * f.c + (ch - tap * f.c) : 0;
  }
  return l;
}

// An output pixel of the walk's grid, stepped along in strides of 4 (a
// warp's rows).
struct WalkPixel {
  int image, p, q;
};

__device__ __forceinline__ WalkPixel walk_pixel(int pixel, const ConvWalk& walk) {
  const int image = pixel / walk.pixels_per_image, within = pixel - image * walk.pixels_per_image;
  const int p = within / walk.q;
  return {image, p, within - p * walk.q};
}

__device__ __forceinline__ void step_walk_pixel(WalkPixel& at, int pixels, const ConvWalk& walk) {
  at.q += pixels;
  while (at.q >= walk.q) {
    at.q -= walk.q;
    if (++at.p * walk.q == walk.pixels_per_image) at.p = 0, ++at.image;
  }
}

// Rows [0, kRows) of kBoxes boxes from shared address `dst` on, box b
// kBoxBytes past box b - 1: row i of box b is output pixel pixel0 + i
// (none past `pixels`: zeros) at folded tap first_tap + b (none at or past
// `taps`: zeros), its 64 folded channels. A warp takes its rows kGroup at a
// time, the next group's loads issued before the last group's stores, so
// that two groups' loads are in flight while it stores.
template <int kRows, int kBoxes, int kBoxBytes, int kGroup>
__device__ __forceinline__ void gather_folded_rows(uint32_t dst, const FoldedX& f, const FoldedLane& lane_at,
                                                   const ConvWalk& walk, int pixels, int pixel0, int first_tap,
                                                   int taps, int thread) {
  constexpr int kWarps = Config::kWarpgroupThreads / 32, kRowsPerWarp = kRows / kWarps;
  static_assert(kRows % kWarps == 0 && kRowsPerWarp % kGroup == 0, "whole groups of a warp's rows");
  const int warp = thread / 32, lane = thread % 32;
  const auto* x = static_cast<const uint16_t*>(f.x);
  WalkPixel at = walk_pixel(pixel0 + warp, walk);
  // Group k's rows' channel pairs, the walk stepped past them.
  const auto load_group = [&](uint32_t (&pairs)[kGroup][kBoxes], int k) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const bool real = pixel0 + warp + kWarps * (k + g) < pixels;
      const int col0 = f.stride_w * at.q - f.pad_left;
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        // Rows of no pixel, or of a tap past the last, lie far outside x.
        const bool read = real && first_tap + b < taps;
        const int row0 = read ? f.stride_h * (at.p + first_tap + b) - f.pad_top : INT_MIN / 2;
        const int base = read ? ((at.image * f.h + row0) * f.w + col0) * f.c : 0;
        uint32_t pair = 0;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const bool inside = unsigned(row0 + lane_at.row[j]) < unsigned(f.h) &&
                              unsigned(col0 + lane_at.col[j]) < unsigned(f.w);
          pair |= uint32_t(inside ? x[base + lane_at.offset[j]] : uint16_t(0)) << (16 * j);
        }
        pairs[g][b] = pair;
      }
      step_walk_pixel(at, kWarps, walk);
    }
  };
  uint32_t pairs[kGroup][kBoxes], next[kGroup][kBoxes];
  load_group(pairs, 0);
#pragma unroll 1
  for (int k = 0; k < kRowsPerWarp; k += kGroup) {
    if (k + kGroup < kRowsPerWarp) load_group(next, k + kGroup);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int row = warp + kWarps * (k + g);
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) st_shared(dst + b * kBoxBytes + swizzle128_offset(row, 4 * lane), pairs[g][b]);
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) pairs[g][b] = next[g][b];
  }
}

// A stage whose gathered rows the warpgroup's threads store and whose other
// operand thread 0 has the copy engine load (`copy_bytes` of it): every
// thread waits for the stage to be handed back; thread 0 announces the
// copy's bytes with its own first arrival and issues `copy(full)`; each
// thread then stores its rows (`gather()`), fences them for wgmma (the async
// proxy) and arrives: sm90/pipeline.cuh's kGatheredStageArrivals.

template <class Smem, int Stages, class Copy, class Gather>
__device__ __forceinline__ void fill_gathered_stage(Smem& shared, const PipelineState<Stages>& pipe,
                                                    uint32_t copy_bytes, int thread, const Copy& copy,
                                                    const Gather& gather) {
  mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
  uint64_t* full = &shared.full[pipe.stage];
  if (thread == 0) {
    mbarrier_arrive_expect_tx(full, copy_bytes);
    copy(full);
  }
  gather();
  fence_proxy_async_shared();
  mbarrier_arrive(full);
}

// fprop on folded taps gathered: the tile's 128 output pixels (rows from
// tile.origin.m0) at each folded tap gathered into A, the folded filters'
// boxes at that tap (w_map, K-major: dimensions (64, R', K)) copied into B.
template <class Tile, class Smem>
__device__ __forceinline__ void load_gathered_fprop_tile(Smem& shared, const CUtensorMap* w_map, const BatchTile& tile,
                                                         const ConvWalk& walk, const FoldedX& f, int pixels,
                                                         int thread, TilePipeline<Tile>& pipe) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  static_assert(Tile::kClusterM == 1 && ATile::kKMajor && ATile::kBoxes == 1 && BTile::kKMajor,
                "blocks alone, pixels K-major in one box, filters K-major");
  const FoldedLane lane = folded_lane(f, thread % 32);
  const int n0 = int(tile.origin.n0), m0 = int(tile.origin.m0);
  for (int tap = 0; tap < walk.r; ++tap, pipe.advance()) {
    const uint32_t a = smem_address(shared.a[pipe.stage]);
    fill_gathered_stage(
        shared, pipe, BTile::kBytes, thread,
        [&](uint64_t* full) {
#pragma unroll
          for (int box = 0; box < BTile::kBoxes; ++box)
            tma_load_3d(shared.b[pipe.stage] + box * BTile::kBoxBytes, w_map, full, 0, tap,
                        n0 + box * BTile::kBoxRows);
        },
        [&] {
          gather_folded_rows<Tile::kBlockM, 1, ATile::kBoxBytes, 4>(a, f, lane, walk, pixels, m0, tap, walk.r,
                                                                    thread);
        });
  }
}

// wgrad on folded taps gathered: the tile's filters of dy copied into A
// (dy_map as load_wgrad_tile's), and 64 output pixels a slice, those of
// split tile.batch, at the folded taps of the tile's columns (a box of 64
// columns a tap) gathered into B.
template <class Tile, class Smem>
__device__ __forceinline__ void load_gathered_wgrad_tile(Smem& shared, const CUtensorMap* dy_map,
                                                         const BatchTile& tile, const ConvWalk& walk,
                                                         const FoldedX& f, int pixels, int thread,
                                                         TilePipeline<Tile>& pipe) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  static_assert(Tile::kClusterM == 1 && !ATile::kKMajor && !BTile::kKMajor && BTile::kBoxRows == Config::kBlockK,
                "blocks alone, dy M-major, folded x N-major in boxes of 64 columns");
  const FoldedLane lane = folded_lane(f, thread % 32);
  const int m0 = int(tile.origin.m0), first_tap = int(tile.origin.n0) / walk.channels;
  const int first_pixel = int(tile.batch) * walk.k_slices * Config::kBlockK;
  for (int slice = 0; slice < walk.k_slices; ++slice, pipe.advance()) {
    const int pixel = first_pixel + slice * Config::kBlockK;
    const uint32_t b = smem_address(shared.b[pipe.stage]);
    fill_gathered_stage(
        shared, pipe, ATile::kBytes, thread,
        [&](uint64_t* full) {
#pragma unroll
          for (int box = 0; box < ATile::kBoxes; ++box)
            tma_load_3d(shared.a[pipe.stage] + box * ATile::kBoxBytes, dy_map, full, m0 + box * ATile::kBoxRows,
                        pixel, 0);
        },
        [&] {
          gather_folded_rows<Config::kBlockK, BTile::kBoxes, BTile::kBoxBytes, 2>(b, f, lane, walk, pixels, pixel,
                                                                                 first_tap, walk.r, thread);
        });
  }
}

}  // namespace mpgemm::kernels::sm90
