// The definition of sm90::launch_wgmma_conv_kernel (sm90/launch.h),
// included only by the units that instantiate the Hopper convolution's
// kernels: sm90/conv_kernels_*.cu.
#pragma once

#include "sm90/conv_kernel.cuh"
#include "sm90/launch.h"
#include "sm90/launch_kernel.cuh"

namespace mpgemm::kernels::sm90 {

template <class Element, class Tile, ConvPass Pass, ConvKernel Kernel>
cudaError_t launch_wgmma_conv_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                     const GemmParams& p, const WgmmaSchedule& schedule, const ConvWalk& walk,
                                     cudaStream_t stream) {
  static_assert(Kernel == ConvKernel::kPlain || Pass == (Kernel == ConvKernel::kMoments ? ConvPass::kFprop
                                                                                          : ConvPass::kDgrad),
                "the kernel variant's pass");
  static PerDeviceFact resident_clusters;  // blocks alone: never asked
  const auto kernel = [] {
    if constexpr (Kernel == ConvKernel::kStagedRows) return &wgmma_dgrad_staged_rows_kernel<Element, Tile>;
    else if constexpr (Kernel == ConvKernel::kMoments) return &wgmma_fprop_moments_kernel<Element, Tile>;
    else if constexpr (Kernel == ConvKernel::kAddend) return &wgmma_dgrad_addend_kernel<Element, Tile>;
    else return &wgmma_conv_kernel<Element, Tile, Pass>;
  }();
  return launch_persistent<Element, Tile>(kernel, ConvSmem<Tile, Pass>::kBytes,
                                          PersistentTileScheduler<Tile>::tiles(p), resident_clusters, stream, a_map,
                                          b_map, d_map, p, schedule, walk);
}

template <class Element, class Tile>
cudaError_t launch_wgmma_dgrad_phases_kernel(const CUtensorMap& w_map, const DgradPhases& phases,
                                             cudaStream_t stream) {
  static PerDeviceFact resident_clusters;  // blocks alone: never asked
  return launch_persistent<Element, Tile>(&wgmma_dgrad_phases_kernel<Element, Tile>,
                                          ConvSmem<Tile, ConvPass::kDgrad>::kBytes,
                                          phases.first_tile[phases.count], resident_clusters, stream, w_map, phases);
}

template <class Element, class Tile, ConvPass Pass>
cudaError_t launch_wgmma_gathered_fold_kernel(const CUtensorMap& copied, const CUtensorMap& d_map,
                                              const GemmParams& p, const WgmmaSchedule& schedule,
                                              const ConvWalk& walk, const FoldedX& folded, int pixels,
                                              cudaStream_t stream) {
  static PerDeviceFact resident_clusters;  // blocks alone: never asked
  return launch_persistent<Element, Tile>(&wgmma_gathered_fold_kernel<Element, Tile, Pass>,
                                          ConvSmem<Tile, Pass>::kBytes, PersistentTileScheduler<Tile>::tiles(p),
                                          resident_clusters, stream, copied, d_map, p, schedule, walk, folded,
                                          pixels);
}

}  // namespace mpgemm::kernels::sm90

// Instantiates the launch of one input type, tile and pass's Hopper
// convolution kernel of one variant (sm90/launch.h's ConvKernel: kPlain in
// sm90/conv_kernels_<tile>.cu; the others each in a unit apart, so that the
// passes' units keep their code).
#define MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(ELEMENT, TILE, PASS, KERNEL)                                      \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_conv_kernel<                                   \
      ELEMENT, mpgemm::kernels::TILE, mpgemm::kernels::ConvPass::PASS, mpgemm::kernels::sm90::ConvKernel::KERNEL>( \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,     \
      const mpgemm::kernels::sm90::WgmmaSchedule&, const mpgemm::kernels::sm90::ConvWalk&, cudaStream_t);
// Instantiates the launch of one input type and tile's kernel that runs a
// strided dgrad's phases in one launch (sm90/conv_kernels_dgrad_phases.cu).
#define MPGEMM_WGMMA_DGRAD_PHASES_LAUNCH(ELEMENT, TILE)                                          \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_dgrad_phases_kernel<ELEMENT, mpgemm::kernels::TILE>( \
      const CUtensorMap&, const mpgemm::kernels::sm90::DgradPhases&, cudaStream_t);
// Instantiates the launch of one input type, tile and pass's kernel that
// gathers folded taps itself (sm90/conv_kernels_gathered_fold.cu).
#define MPGEMM_WGMMA_GATHERED_FOLD_LAUNCH(ELEMENT, TILE, PASS)                                                  \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_gathered_fold_kernel<                               \
      ELEMENT, mpgemm::kernels::TILE, mpgemm::kernels::ConvPass::PASS>(                                         \
      const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,                               \
      const mpgemm::kernels::sm90::WgmmaSchedule&, const mpgemm::kernels::sm90::ConvWalk&,                      \
      const mpgemm::kernels::sm90::FoldedX&, int, cudaStream_t);
// Instantiates the launch of one pass's kernel variant on each tile fprop
// and dgrad run on (the wide one and the narrow ones), fp16 and bf16.
#define MPGEMM_WGMMA_CONV_LAUNCH_ON_EVERY_TILE(PASS, KERNEL)                   \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, WgmmaTile, PASS, KERNEL)            \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, WgmmaTile, PASS, KERNEL)     \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, WgmmaN128Tile, PASS, KERNEL)        \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, WgmmaN128Tile, PASS, KERNEL) \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, WgmmaN64Tile, PASS, KERNEL)         \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, WgmmaN64Tile, PASS, KERNEL)
#define MPGEMM_WGMMA_CONV_LAUNCH(TILE)                                  \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, TILE, kFprop, kPlain)        \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, TILE, kDgrad, kPlain)        \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, TILE, kWgrad, kPlain)        \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, TILE, kFprop, kPlain) \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, TILE, kDgrad, kPlain) \
  MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, TILE, kWgrad, kPlain)
