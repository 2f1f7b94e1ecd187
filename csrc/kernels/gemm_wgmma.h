// Entry points of the Hopper GEMM (wgmma_gemm.cuh) for the GEMM launcher.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "gemm_params.h"
#include "gemm_plan.h"

namespace mpgemm::kernels {
namespace sm90 {

// Kernel arguments besides the problem: the tile order, and each operand's
// batch coordinate rule (a batch stride of 0 broadcasts one matrix, whose
// tensor map then has a batch extent of 1).
struct WgmmaSchedule {
  int raster_group = 1;
  bool a_broadcast = false, b_broadcast = false;
  bool d_pairs = false;  // D's rows and base allow two-element stores
  bool d_copy = false;   // D has a tensor map: the epilogue stores through the copy engine
};

// Launches the kernel of one input type, pair of operand layouts (K-major or
// not), cluster size (1, or 2 blocks sharing B) and consumer schedule on
// tensor maps built for them (D's read only where schedule.d_copy): one
// translation unit per layout pair and kernel (gemm_wgmma_<a><b>.cu on blocks
// alone, _2x1.cu on pairs, _pingpong.cu on pairs with ping-pong consumers),
// so that they compile in parallel.
template <class Element, bool AKMajor, bool BKMajor, int kCluster, Consumers kSplit>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                const GemmParams& params, const WgmmaSchedule& schedule, cudaStream_t stream);

}  // namespace sm90

// Whether the current device runs this build's Hopper kernels: an sm_90 GPU,
// and code built for sm_90a (an arch list with 9.0, see setup.py). Asked once
// per device.
bool wgmma_available();

// Enqueues `params` on `stream` on the Hopper kernel of `config` (wgmma on
// blocks alone, wgmma_2x1 on pairs that share B's copies, wgmma_pingpong on
// pairs with ping-pong consumers), its tiles in groups of `raster_group` tile
// rows. The operands must be describable by the tensor copy engine, D fp32
// or the inputs' type (GemmShape::wgmma) and K at least 1. Returns
// cudaErrorNotSupported where the code the device runs has no sm_90a kernel,
// cudaErrorInvalidValue for operands the path cannot take or a config that
// is not a Hopper kernel.
cudaError_t launch_wgmma_gemm(const GemmParams& params, TileConfigId config, int raster_group, cudaStream_t stream);

}  // namespace mpgemm::kernels
