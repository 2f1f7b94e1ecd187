// Entry points of the Hopper convolution (sm90/conv_kernel.cuh) for the
// convolution launcher (conv/launch.cu).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "common/tile_configs.h"
#include "conv/params.h"

namespace mpgemm::kernels {

// Whether the Hopper convolution takes this pass of the problem, the device
// aside (wgmma_available says that): one group; 16-byte pixels for every
// operand the copy engine reads (channels and filters multiples of 8),
// 16-byte aligned bases; the output in fp32 or the inputs'
// type; a geometry the im2col tensor maps can describe (padding, stride and
// taps within their ranges; for dgrad with a stride, those of each phase);
// 32-bit sizes; and a non-empty sum.
bool wgmma_conv_takes(ConvPass pass, const Conv2dParams& params);

// How the Hopper convolution runs a pass it takes: its tile (the 128 x 256
// wgmma tile, or where the narrow tiles are on and the pass's N is at most
// 128 the narrow one: plan/gemm_plan.h's narrow_tiles_enabled and
// narrow_wgmma_tile; wgrad of at most 64 filters over more than 128 columns
// on the 64-row tile where `m64_tile` is asked: plan/gemm_plan.h's
// m64_tile_enabled), wgrad's split of its sum over output pixels on the
// current device (1 for the other passes), and the workspace wgrad needs: its splits' fp32 partial sums, and
// where its channels are not a multiple of 64, dw with each tap's channels
// padded to one (0 for the other passes, and for wgrad with neither); and
// whether dgrad's strided phases store their rows through shared memory,
// whole 16-byte chunks a thread, where dx's layout allows (`staged_rows`
// asked, as the default does: conv/launch.h's staged_row_stores), or from
// registers, two elements a store; and whether a strided dgrad whose rows
// are staged runs all its phases in one launch (`one_launch_dgrad` asked:
// conv/launch.h's one_launch_dgrad), where it has at most four and dx's
// layout allows staging each, or one launch a phase.
struct WgmmaConvPlan {
  TileConfigId tile = TileConfigId::kWgmma;
  int splits = 1;
  size_t workspace_bytes = 0;
  bool staged_rows = false;
  bool one_launch_dgrad = false;
};
WgmmaConvPlan plan_wgmma_conv(ConvPass pass, const Conv2dParams& params, bool staged_rows = false,
                              bool one_launch_dgrad = false, bool m64_tile = false);

// Whether fprop of a problem it takes can write each 64-row block's column
// moments of y (Conv2dParams::moments): where y has a tensor map (a 16-byte
// aligned base and pitch), since the kernel sums the strips it stages for
// the copy engine.
bool wgmma_conv_writes_moments(const Conv2dParams& params);

// Whether dgrad of a problem it takes can add Conv2dParams::addend (dx's
// type, NHWC like dx) to dx in its epilogue (sm90/conv_kernel.cuh's
// wgmma_dgrad_addend_kernel): at stride 1 (a strided dgrad's phases store
// rows of dx that no 64-row block of the addend lines up with), dx of the
// inputs' type, and the addend's base 16-byte aligned, as the epilogue reads
// it in 4-byte pairs.
bool wgmma_dgrad_takes_addend(const Conv2dParams& params);

// Enqueues one pass that wgmma_conv_takes on `stream`, as `plan`
// (plan_wgmma_conv of the same pass and params) says, with `workspace` (at
// least plan.workspace_bytes, 16-byte aligned). Returns
// cudaErrorNotSupported where the code the device runs has no sm_90a kernel
// or the driver no im2col encoder, cudaErrorInvalidValue for a problem the
// path cannot take, an addend it cannot add or a missing workspace.
cudaError_t launch_wgmma_conv(ConvPass pass, const Conv2dParams& params, const WgmmaConvPlan& plan, void* workspace,
                              cudaStream_t stream);

// Whether fprop or wgrad of `original`, a few-channel convolution whose
// taps fold (conv/folded_taps.h), can run on its folded problem `folded`
// with the producer gathering x's fold from `original`'s x itself
// (sm90/conv_kernel.cuh's wgmma_gathered_fold_kernel): the path takes the
// folded pass (wgmma_conv_takes: its sizes within 32 bits too), and x (any
// alignment) has at most 2^30 - 1 elements, so that the producer's 32-bit
// offsets of rows past x's last stay in range.
bool wgmma_gathers_fold(ConvPass pass, const Conv2dParams& original, const Conv2dParams& folded);

// Enqueues that pass on `stream` as `plan` (plan_wgmma_conv of the folded
// pass) says, with `workspace` as launch_wgmma_conv's for the folded pass;
// `folded` reads the folded filters (fprop) or writes the folded filter
// gradient (wgrad), and its x is not read. Returns as launch_wgmma_conv
// does; cudaErrorInvalidValue where folded.moments is set (the gathering
// kernels write none).
cudaError_t launch_wgmma_gathered_fold(ConvPass pass, const Conv2dParams& original, const Conv2dParams& folded,
                                       const WgmmaConvPlan& plan, void* workspace, cudaStream_t stream);

}  // namespace mpgemm::kernels
