// Entry point of the convolution kernels for host code.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "conv/depthwise.h"
#include "conv/params.h"
#include "gemm/launch.h"
#include "plan/gemm_plan.h"
#include "sm90/conv_launch.h"

namespace mpgemm::kernels {

// The implicit GEMM's choice for a pass: one of the WMMA tiles (Square,
// Compact or Small; N16 where n16_tile() asks), its load width in elements
// (8 or 4), and wgrad's split of K.
struct ConvTilePlan {
  TileConfigId tile = TileConfigId::kCompact;
  int vector = 8;
  int split_k = 1;
};

// How launch_conv2d runs one pass of a problem on the current device, and the
// device workspace it needs (the caller allocates it): worked out once per
// call, from the sizes and the operands' alignment.
struct Conv2dPlan {
  enum class Path : int {
    kInvalid,       // groups <= 0: launch_conv2d refuses the problem
    kDepthwise,     // one channel per group: conv/depthwise.cu's direct kernels
    kImplicitGemm,  // the tensors read and written in place
    // Channels per group that no 8-byte chunk divides, or misaligned
    // operands: copies padded with zeros to whole chunks, in the workspace.
    kPadded,
    // The Hopper convolution (sm90/conv_launch.h), where MPGEMM_CONV_PATH asks for it.
    kWgmma,
    // A 1x1 convolution at stride 1 without padding as the plain GEMM it is
    // (one_by_one_gemm), on the GEMM's own plan, where MPGEMM_CONV_PATH=gemm asks.
    kGemm,
    // Few input channels (a first layer's fprop and wgrad), where the
    // Hopper convolution cannot take the problem as it is and
    // MPGEMM_CONV_PATH=wgmma asks (also by default on sm_90:
    // folded_taps_by_default): the Hopper convolution of copies whose taps
    // are folded into the channels (conv/folded_taps.h), in the workspace.
    kFoldedTaps,
  };
  Path path = Path::kInvalid;
  DepthwisePlan depthwise;    // kDepthwise
  ConvTilePlan tiles;         // kImplicitGemm; kPadded: the padded problem's
  WgmmaConvPlan wgmma;        // kWgmma; kFoldedTaps: the folded problem's
  bool chunked_fold = false;  // kFoldedTaps: x folded a thread per 16 bytes (chunked_fold())
  // kFoldedTaps: no copy of x, its fold gathered by the Hopper
  // convolution's producer (gathered_fold(); sm90/conv_launch.h's
  // launch_wgmma_gathered_fold).
  bool gathered_fold = false;
  GemmLaunch gemm;            // kGemm
  // wgrad's split partial sums (of the implicit GEMM, the depthwise kernels,
  // the Hopper convolution or the GEMM's split-K), the padded copies and the
  // folded ones; 0 when none applies.
  size_t workspace_bytes = 0;
  // dgrad planned with Conv2dParams::addend set: whether the kernels add it
  // to dx in their epilogue (the Hopper convolution at stride 1 where
  // dgrad_addend() asks and sm90/conv_launch.h's wgmma_dgrad_takes_addend
  // allows); where not, launch_conv2d refuses the addend, and the caller
  // adds it after the pass.
  bool addend_in_epilogue = false;
  // fprop: the rows of each block whose column moments the kernels write
  // where Conv2dParams::moments asks (the implicit GEMM on 16-byte chunks:
  // its tile's rows; the Hopper convolution storing through the copy
  // engine: its consumers' 64); 0 where they write none.
  int moment_rows = 0;
};

// Which kernels MPGEMM_CONV_PATH asks for: "auto" (or unset) the defaults:
// on sm_90 the Hopper convolution where it takes the pass and
// wgmma_conv_by_default says it is the faster, and fprop and wgrad of few
// channels on its folded taps, else the WMMA implicit GEMMs (or the depthwise and
// padded-copy kernels); "wgmma" the Hopper convolution wherever it takes the
// pass, and where it does not take fprop or wgrad as they are, wherever it
// takes their folded taps; "wmma" never; "gemm" a 1x1 convolution at stride
// 1 without padding as a GEMM (one_by_one_gemm: the Hopper GEMM on sm_90,
// the WMMA tiles elsewhere; opt-in: its wgrad ran at half the Hopper
// convolution's speed on an H100, 2026-11-28), every other problem as
// "auto". Throws std::invalid_argument for any other value.
enum class ConvPath : int { kAuto = 0, kWgmma, kWmma, kGemm };
ConvPath conv_path();

// Whether the Hopper convolution's strided dgrad stores each phase's rows of
// dx through shared memory, whole 16-byte chunks a thread
// (sm90/epilogue.cuh's store_tile_through_strips): yes unless
// MPGEMM_STAGED_ROW_STORES is "0" (then from registers; the default since
// its kernels passed the GPU tests and ran 1.10x to 1.41x faster on an H100,
// 2026-11-28). Unset, "" or "1": yes; throws std::invalid_argument for any
// other value.
bool staged_row_stores();

// Whether the Hopper convolution's strided dgrad, its rows staged, runs all
// its phases in one launch (sm90/conv_kernel.cuh's
// wgmma_dgrad_phases_kernel) instead of one launch a phase after zeroing dx
// where a phase no tap reaches: the default since it passed the GPU tests
// and ran strided dgrad 1.01-1.31x as fast (H200, fe39419, 2026-11-29).
// Unset, "" or "1": yes; "0": no; throws std::invalid_argument for any
// other value.
bool one_launch_dgrad();

// Whether fprop and wgrad on folded taps fold x a thread per 16 bytes of the
// copy (conv/folded_taps.cu's fold_input_chunks_kernel) instead of a thread
// per element: the default since it passed the GPU tests and ran the first
// layer's fprop 1.7x as fast (H200, fe39419, 2026-11-29). Unset, "" or "1":
// yes; "0": no; throws std::invalid_argument for any other value.
bool chunked_fold();

// Whether fprop and wgrad on folded taps gather x's fold in the Hopper
// convolution's producer (sm90/conv_producer.cuh) instead of copying it
// first, where the path can (sm90/conv_launch.h's wgmma_gathers_fold):
// opt-in until it passes the GPU tests. "1": yes; unset, "" or "0": no;
// throws std::invalid_argument for any other value.
bool gathered_fold();

// Whether dgrad at stride 1 on the Hopper convolution adds a second term of
// dx (Conv2dParams::addend: a ResNet block input's gradient from its
// residual) in its epilogue (sm90/conv_kernel.cuh's
// wgmma_dgrad_addend_kernel) instead of leaving it to a pass of its own:
// opt-in until it passes the GPU tests. "1": yes; unset, "" or "0": no;
// throws std::invalid_argument for any other value.
bool dgrad_addend();

// Whether fprop and dgrad whose GEMM is at most 16 columns wide a group
// (at most 16 filters, or channels, per group) run on the WMMA kernels'
// 128 x 16 tile (common/tile_configs.h's N16Tile) instead of one 64 or 128
// columns wide: opt-in until its kernels pass the GPU tests. "1": yes;
// unset, "" or "0": no; throws std::invalid_argument for any other value.
bool n16_tile();

// A pass of a 1x1 convolution at stride 1 without padding, in one group, as
// the GEMM it is on NHWC activations and KC filters, reading every operand
// in place: fprop y[NHW, K] = x[NHW, C] w^T (B column-major) + bias; dgrad
// dx[NHW, C] = dy[NHW, K] w (B row-major); wgrad dw[K, C] = dy^T x (A
// column-major, B row-major, K = the N*H*W pixels). Whether the problem is
// one (a stride other than 1 reads every stride-th pixel, which no GEMM
// operand's row pitch describes: the im2col boxes of the Hopper convolution,
// or the implicit GEMM's gathers, read those).
bool is_one_by_one_gemm(const Conv2dParams& params);
GemmParams one_by_one_gemm(ConvPass pass, const Conv2dParams& params);

// Where the Hopper convolution is the default on sm_90, among the passes it
// takes (H100, ResNet-50's convolutions at batch 256,
// bench/results/2026-11-27_h100-sxm_d816ee9 and 2026-11-28_h100-sxm_2d75062):
// fprop and dgrad everywhere (1.02x to 6.3x the WMMA kernels' speed); wgrad
// with taps (every 3x3 1.20x to 2.15x) and, with the narrow tiles
// (`narrow_tiles`, narrow_tiles_enabled), of every 1x1 (1.06x to 1.58x);
// without them, of a 1x1 only with filters x channels per group of at least
// 2^19, where smaller ones tied or lost (0.75x to 1.08x).
bool wgmma_conv_by_default(ConvPass pass, const Conv2dParams& params, bool narrow_tiles);

// Whether the default on sm_90 runs a pass of few input channels that folds
// its taps (conv/folded_taps.h's folds_taps) on the folded Hopper
// convolution: fprop (ResNet-50's first layer 1.46x the WMMA kernels'
// speed on the narrow tile, H100, 2026-11-28) and wgrad (0.881 ms against
// the WMMA kernels' 0.920 with x folded in 16-byte chunks, H200, fe39419,
// 2026-11-29; 0.60x before, folded a thread per element).
bool folded_taps_by_default(ConvPass pass);

// Throws std::invalid_argument for a bad MPGEMM_CONV_PATH,
// MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD,
// MPGEMM_GATHERED_FOLD, MPGEMM_CONV_N16_TILE or MPGEMM_M64_TILE (conv_path,
// staged_row_stores, one_launch_dgrad, chunked_fold, gathered_fold,
// n16_tile, plan/gemm_plan.h's m64_tile_enabled), whatever the problem, and for a bad
// MPGEMM_DGRAD_ADDEND (dgrad_addend) where dgrad has an addend.
Conv2dPlan plan_conv2d(ConvPass pass, const Conv2dParams& params);

// Enqueues one pass of the convolution described by `params` on `stream`, as
// `plan` (plan_conv2d of the same pass and params) says, with `workspace` (at
// least plan.workspace_bytes, 16-byte aligned); fprop's params.moments only
// where plan.moment_rows > 0 and dgrad's params.addend only where
// plan.addend_in_epilogue (cudaErrorInvalidValue otherwise). Returns the launch error,
// cudaErrorInvalidValue for sizes beyond 32-bit implicit-GEMM indices, an
// input_type that is not 16-bit or a missing workspace,
// cudaErrorNotSupported for bf16 where the device runs code built for an arch
// below sm_80, cudaSuccess otherwise.
cudaError_t launch_conv2d(ConvPass pass, const Conv2dParams& params, const Conv2dPlan& plan, void* workspace,
                          cudaStream_t stream);

}  // namespace mpgemm::kernels
