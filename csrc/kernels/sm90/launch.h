// Entry points of the Hopper GEMM (sm90/gemm_kernel.cuh) for the GEMM launcher.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "common/tile_configs.h"
#include "conv/params.h"
#include "sm90/params.h"

namespace mpgemm::kernels {
namespace sm90 {

// The GEMM kernels of a tile: each tile's whole K (wgmma_gemm_kernel),
// split-K (wgmma_splitk_gemm_kernel: `params` the splits' partial sums as
// its D and batch, schedule.split_slices each split's K slices), whole K
// storing the pre-activation too (wgmma_pre_activation_gemm_kernel), and
// whole K or split-K writing A's row sums too (wgmma_row_sums_gemm_kernel,
// wgmma_splitk_row_sums_gemm_kernel: params.a_row_sums, the splits' partial
// sums where split), and whole K multiplying by the activation's derivative
// at params.activation_input (wgmma_activation_grad_gemm_kernel); and the
// pre-activation's with GELU's tanh form as its activation
// (wgmma_pre_activation_gelu_tanh_gemm_kernel).
enum class GemmKernel {
  kWholeK,
  kSplitK,
  kPreActivation,
  kRowSums,
  kSplitKRowSums,
  kActivationGrad,
  kPreActivationGeluTanh
};

// Launches the kernel of one input type, pair of operand layouts (K-major or
// not), Hopper tile and kind on tensor maps built for them (D's and the
// pre-activation's, z_map, read only where schedule.d_copy; z_map only by
// kPreActivation). Instantiated in sm90/gemm_kernels_<tile>_<type>.cu,
// the four layouts' kernels a unit, so that a build compiles them in
// parallel; the whole-K row sums' kernel of every tile beside them, on
// MN-major operands only (linear's wgrad, dW = dZ^T @ X); the split-K
// kernels (the row sums' among them) and the pre-activation's, WgmmaTile's
// alone, beside its others (the cooperative units): the pre-activation's on
// K-major operands only (nn.Linear's forward), its GELU tanh form's on
// WgmmaPingPongTile alone, beside that tile's others (the ping-pong units);
// the activation derivative's, WgmmaTile's and WgmmaPingPongTile's, on a
// K-major A and an MN-major B only (an MLP's dgrad, dH = dY @ W2, W2
// row-major).
template <class Element, class Tile, bool AKMajor, bool BKMajor, GemmKernel Kind = GemmKernel::kWholeK>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                const CUtensorMap& z_map, const GemmParams& params, const WgmmaSchedule& schedule,
                                cudaStream_t stream);

// Launches the stream-K kernel of one input type, tile (WgmmaTile,
// WgmmaN128Tile or WgmmaN64Tile) and pair of operand layouts
// (wgmma_stream_k_gemm_kernel) on tensor maps built for it: `params` a
// single matrix, its partial sums' slots and flags in `workspace` (the
// flags zeroed), a block a slot at most. Instantiated in
// sm90/gemm_kernels_stream_k_<type>.cu (the wide tile's four layouts) and
// sm90/gemm_kernels_stream_k_narrow_<type>.cu (the narrow tiles').
template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch_wgmma_stream_k_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map,
                                         const CUtensorMap& d_map, const GemmParams& params,
                                         const WgmmaSchedule& schedule, const StreamKWorkspace& workspace,
                                         cudaStream_t stream);

// The Hopper convolution's kernels of a pass (sm90/conv_kernel.cuh): the
// pass alone (wgmma_conv_kernel); dgrad storing a phase's strided rows
// through shared memory (wgmma_dgrad_staged_rows_kernel); fprop writing its
// column moments too (wgmma_fprop_moments_kernel: params.column_moments);
// dgrad at stride 1 adding params.addend to dx (wgmma_dgrad_addend_kernel).
enum class ConvKernel { kPlain, kStagedRows, kMoments, kAddend };

// Launches the Hopper convolution kernel of one input type, tile and pass
// (sm90/conv_kernel.cuh) on tensor maps built for it, `params` its GEMM and
// `walk` its walk of K. Instantiated in sm90/conv_kernels_<tile>.cu, a
// tile's six plain kernels (three passes, two types) a unit, the staged
// dgrad's in sm90/conv_kernels_staged_rows.cu, fprop's with column moments
// in sm90/conv_kernels_moments.cu and dgrad's with an addend in
// sm90/conv_kernels_dgrad_addend.cu.
template <class Element, class Tile, ConvPass Pass, ConvKernel Kernel = ConvKernel::kPlain>
cudaError_t launch_wgmma_conv_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                     const GemmParams& params, const WgmmaSchedule& schedule, const ConvWalk& walk,
                                     cudaStream_t stream);

// Launches the kernel that runs a strided dgrad's phases in one launch,
// their rows staged (sm90/conv_kernel.cuh's wgmma_dgrad_phases_kernel), of
// one input type and tile, on the filters' map `w_map` (as the dgrad kernels
// read it) and `phases` (its dy maps built for the tile). Instantiated in
// sm90/conv_kernels_dgrad_phases.cu.
template <class Element, class Tile>
cudaError_t launch_wgmma_dgrad_phases_kernel(const CUtensorMap& w_map, const DgradPhases& phases,
                                             cudaStream_t stream);

// Launches the kernel that runs fprop or wgrad of a few-channel
// convolution on its folded taps, x's fold gathered by the producer
// (sm90/conv_kernel.cuh's wgmma_gathered_fold_kernel), of one input type,
// tile and pass: `copied` the map of the operand the copy engine loads (the
// folded filters, or dy), `params`, `schedule` and `walk` those of the
// folded problem, `folded` where x is and how it folds, `pixels` the output
// pixels. Instantiated in sm90/conv_kernels_gathered_fold.cu.
template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_wgmma_gathered_fold_kernel(const CUtensorMap& copied, const CUtensorMap& d_map,
                                              const GemmParams& params, const WgmmaSchedule& schedule,
                                              const ConvWalk& walk, const FoldedX& folded, int pixels,
                                              cudaStream_t stream);

}  // namespace sm90

// Whether the current device runs this build's Hopper kernels: an sm_90 GPU,
// and code built for sm_90a (an arch list with 9.0, see setup.py). Asked once
// per device.
bool wgmma_available();

// Enqueues `params` on `stream` on the kernel of the Hopper tile `Tile`
// (WgmmaTile on blocks alone, WgmmaPairTile on pairs that share B's copies,
// WgmmaPingPongTile on pairs with ping-pong consumers), its tiles in groups
// of `raster_group` tile rows, with the operand layouts given (K-major: A
// row-major, B column-major). The operands must be describable by the tensor
// copy engine, D fp32 or the inputs' type (GemmShape::wgmma) and K at least 1.
// Returns cudaErrorNotSupported where the code the device runs has no sm_90a
// kernel, cudaErrorInvalidValue for operands the path cannot take.
template <class Tile>
cudaError_t launch_wgmma_gemm(const GemmParams& params, int raster_group, bool a_k_major, bool b_k_major,
                              cudaStream_t stream);

// Enqueues `params`, whose pre_activation is set, on WgmmaTile's kernel that
// stores the sums before the activation beside D, on K-major operands (A
// row-major, B column-major); pre_activation is laid out as D, and both are
// stored through the copy engine where both allow it, else from registers.
// With params.activation GELU's tanh form, on the kernel that applies it
// (the only one that does), WgmmaPingPongTile's instead. Returns as
// launch_wgmma_gemm does.
cudaError_t launch_wgmma_pre_activation_gemm(const GemmParams& params, int raster_group, cudaStream_t stream);

// Enqueues `params`, whose activation_input is set (laid out as D, of the
// inputs' type, as D is; no bias), on the kernel of `Tile` (WgmmaTile, or
// WgmmaPingPongTile, whose consumers multiply one tile while the other's
// wgmmas run) that multiplies the sums by the activation's derivative
// there, on a K-major A (row-major) and an MN-major B (row-major), whole K.
// Returns as launch_wgmma_gemm does.
template <class Tile>
cudaError_t launch_wgmma_activation_grad_gemm(const GemmParams& params, int raster_group, cudaStream_t stream);

// Enqueues `params`, whose a_row_sums is set (batch 1), on the kernel of the
// Hopper tile `Tile` that writes A's row sums beside D, on MN-major operands
// (A column-major, B row-major: linear's wgrad), whole K where split_k is 1;
// else (WgmmaTile only) its split-K kernel, each split's partial sums to
// `partials` as launch_wgmma_splitk_gemm's and its partial row sums to
// `row_sum_partials` (split_k x m fp32), for launch_splitk_reduce and
// launch_row_sums_reduce to finish. Returns as launch_wgmma_gemm does.
template <class Tile>
cudaError_t launch_wgmma_row_sums_gemm(const GemmParams& params, int raster_group, int split_k, float* partials,
                                       float* row_sum_partials, cudaStream_t stream);

// Enqueues `params` (a single matrix: batch 1) on the stream-K kernel of
// the Hopper tile `Tile` (WgmmaTile, WgmmaN128Tile or WgmmaN64Tile, as
// plan/gemm_plan.h's stream_k_tile names; sm90/stream_k.cuh): as many
// blocks as run at once, at most `blocks`, each an equal run of the tiles'
// K slices, their partial sums in `workspace` (plan/gemm_plan.h's
// stream_k_partial_bytes(Tile::kId, blocks), then stream_k_flag_bytes(blocks) of
// flags, which are zeroed here on `stream`; 16-byte aligned), D stored as
// launch_wgmma_gemm stores it. Returns as launch_wgmma_gemm does.
template <class Tile>
cudaError_t launch_wgmma_stream_k_gemm(const GemmParams& params, int raster_group, int blocks, void* workspace,
                                       bool a_k_major, bool b_k_major, cudaStream_t stream);

// Enqueues the products of `params` (a single matrix each: batch 1) split
// into `split_k` ranges of whole K slices on the split-K kernel of the Hopper
// tile `Tile` (WgmmaTile only), each range's fp32 sums, with no bias or
// activation, to its m x n matrix of `partials` (row stride n, 16-byte
// aligned), for launch_splitk_reduce to finish. Returns as launch_wgmma_gemm
// does.
template <class Tile>
cudaError_t launch_wgmma_splitk_gemm(const GemmParams& params, int raster_group, int split_k, float* partials,
                                     bool a_k_major, bool b_k_major, cudaStream_t stream);

}  // namespace mpgemm::kernels
