// The launch of a persistent Hopper kernel, and the definition of
// sm90::launch_wgmma_kernel (sm90/launch.h), included only by the units that
// instantiate kernels: sm90/gemm_kernels_*.cu and, through
// sm90/conv_launch_kernel.cuh, sm90/conv_kernels_*.cu.
#pragma once

#include "common/launch_utils.h"
#include "sm90/gemm_kernel.cuh"
#include "sm90/launch.h"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// Launches `kernel`, a persistent Hopper kernel of Tile over `tiles` cluster
// tiles, with `args`: as many blocks (or clusters) as run at once, at most
// one per tile. `resident_clusters` keeps, per device, how many of its
// clusters fit (the caller's, one per kernel).
template <class Element, class Tile, class Kernel, class... Args>
cudaError_t launch_persistent(Kernel* kernel, int smem_bytes, int64_t tiles, PerDeviceFact& resident_clusters,
                              cudaStream_t stream, const Args&... args) {
  constexpr int kCluster = Tile::kClusterM;
  if (!wgmma_compiled()) return cudaErrorNotSupported;
  if (const cudaError_t err = prepare_launch<Element>(kernel, smem_bytes); err != cudaSuccess) return err;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(Tile::kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = kCluster > 1 ? 1 : 0;
  // As many clusters as run at once: pairs need two free multiprocessors of
  // one GPC, which the driver knows and the multiprocessor count does not.
  int resident = device_limits().multiprocessors;
  if constexpr (kCluster > 1) {
    const cudaError_t err = resident_clusters.get(
        &resident, [&](int* clusters) { return cudaOccupancyMaxActiveClusters(clusters, kernel, &config); });
    if (err != cudaSuccess) return err;
  }
  if (resident < 1) return cudaErrorInvalidConfiguration;
  config.gridDim = dim3(unsigned((tiles < resident ? tiles : resident) * kCluster));
  return cudaLaunchKernelEx(&config, kernel, args...);
}

template <class Element, class Tile, bool AKMajor, bool BKMajor, GemmKernel Kind>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                const CUtensorMap& z_map, const GemmParams& p, const WgmmaSchedule& schedule,
                                cudaStream_t stream) {
  using Smem = WgmmaSmem<Tile, AKMajor, BKMajor>;
  static_assert(Kind == GemmKernel::kWholeK || Kind == GemmKernel::kRowSums || Kind == GemmKernel::kActivationGrad ||
                    Kind == GemmKernel::kPreActivationGeluTanh || Tile::kClusterM == 1,
                "the split-K kernels and the erf form's pre-activation kernel run blocks alone");
  // The row sums' kernels hold a tile of ones past the ring.
  constexpr bool kRowSums = Kind == GemmKernel::kRowSums || Kind == GemmKernel::kSplitKRowSums;
  constexpr int kSmemBytes = kRowSums ? kSmemBytesWithOnes<Smem> : Smem::kBytes;
  static_assert(kSmemBytes <= Config::kMaxSmemBytes, "the tile of ones fits beside the ring");
  // Of this kernel, whose launch shape never changes.
  static PerDeviceFact resident_clusters;
  const int64_t tiles = PersistentTileScheduler<Tile>::tiles(p);
  // Only the kernel of this kind is instantiated.
  if constexpr (Kind == GemmKernel::kPreActivation || Kind == GemmKernel::kPreActivationGeluTanh) {
    const auto kernel = [] {
      if constexpr (Kind == GemmKernel::kPreActivationGeluTanh)
        return &wgmma_pre_activation_gelu_tanh_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
      else return &wgmma_pre_activation_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
    }();
    return launch_persistent<Element, Tile>(kernel, kSmemBytes, tiles, resident_clusters, stream, a_map, b_map,
                                            d_map, z_map, p, schedule);
  } else {
    const auto kernel = [] {
      if constexpr (Kind == GemmKernel::kSplitK) return &wgmma_splitk_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
      else if constexpr (Kind == GemmKernel::kRowSums)
        return &wgmma_row_sums_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
      else if constexpr (Kind == GemmKernel::kSplitKRowSums)
        return &wgmma_splitk_row_sums_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
      else if constexpr (Kind == GemmKernel::kActivationGrad)
        return &wgmma_activation_grad_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
      else return &wgmma_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
    }();
    return launch_persistent<Element, Tile>(kernel, kSmemBytes, tiles, resident_clusters, stream, a_map, b_map,
                                            d_map, p, schedule);
  }
}

template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch_wgmma_stream_k_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map,
                                         const CUtensorMap& d_map, const GemmParams& p, const WgmmaSchedule& schedule,
                                         const StreamKWorkspace& workspace, cudaStream_t stream) {
  static PerDeviceFact resident_clusters;
  // A block a run of at least one slice, and a slot each.
  const int64_t slices = PersistentTileScheduler<Tile>::tiles(p) * ((p.k + Config::kBlockK - 1) / Config::kBlockK);
  const int64_t runs = slices < workspace.blocks ? slices : workspace.blocks;
  return launch_persistent<Element, Tile>(&wgmma_stream_k_gemm_kernel<Element, Tile, AKMajor, BKMajor>,
                                          WgmmaSmem<Tile, AKMajor, BKMajor>::kBytes, runs, resident_clusters, stream,
                                          a_map, b_map, d_map, p, schedule, workspace);
}

}  // namespace mpgemm::kernels::sm90

// Instantiates the launch of one input type, Hopper tile and kind of GEMM
// kernel on one pair of layouts, and on all four: a unit's kernels
// (sm90/launch.h).
#define MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, A_K_MAJOR, B_K_MAJOR, KIND)                                     \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_kernel<ELEMENT, mpgemm::kernels::TILE, A_K_MAJOR,    \
                                                                  B_K_MAJOR, mpgemm::kernels::sm90::KIND>(      \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,                           \
      const mpgemm::kernels::GemmParams&, const mpgemm::kernels::sm90::WgmmaSchedule&, cudaStream_t);
#define MPGEMM_WGMMA_LAUNCH_LAYOUTS(ELEMENT, TILE, KIND)                \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, true, true, KIND)            \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, true, false, KIND)           \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, false, true, KIND)           \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, false, false, KIND)
#define MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, A_K_MAJOR, B_K_MAJOR) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, A_K_MAJOR, B_K_MAJOR, GemmKernel::kWholeK)
#define MPGEMM_WGMMA_LAUNCH(ELEMENT, TILE) MPGEMM_WGMMA_LAUNCH_LAYOUTS(ELEMENT, TILE, GemmKernel::kWholeK)
#define MPGEMM_WGMMA_SPLITK_LAUNCH(ELEMENT, TILE) MPGEMM_WGMMA_LAUNCH_LAYOUTS(ELEMENT, TILE, GemmKernel::kSplitK)
#define MPGEMM_WGMMA_PRE_ACTIVATION_LAUNCH(ELEMENT, TILE) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, true, true, GemmKernel::kPreActivation)
#define MPGEMM_WGMMA_PRE_ACTIVATION_GELU_TANH_LAUNCH(ELEMENT, TILE) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, true, true, GemmKernel::kPreActivationGeluTanh)
#define MPGEMM_WGMMA_ACTIVATION_GRAD_LAUNCH(ELEMENT, TILE) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, true, false, GemmKernel::kActivationGrad)
#define MPGEMM_WGMMA_ROW_SUMS_LAUNCH(ELEMENT, TILE) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, false, false, GemmKernel::kRowSums)
#define MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(ELEMENT, TILE, A_K_MAJOR, B_K_MAJOR)                                  \
  template cudaError_t                                                                                        \
  mpgemm::kernels::sm90::launch_wgmma_stream_k_kernel<ELEMENT, mpgemm::kernels::TILE, A_K_MAJOR, B_K_MAJOR>(  \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,          \
      const mpgemm::kernels::sm90::WgmmaSchedule&, const mpgemm::kernels::sm90::StreamKWorkspace&, cudaStream_t);
#define MPGEMM_WGMMA_STREAM_K_LAUNCH(ELEMENT, TILE)             \
  MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(ELEMENT, TILE, true, true)   \
  MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(ELEMENT, TILE, true, false)  \
  MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(ELEMENT, TILE, false, true)  \
  MPGEMM_WGMMA_STREAM_K_LAUNCH_ONE(ELEMENT, TILE, false, false)
#define MPGEMM_WGMMA_SPLITK_ROW_SUMS_LAUNCH(ELEMENT, TILE) \
  MPGEMM_WGMMA_LAUNCH_KIND(ELEMENT, TILE, false, false, GemmKernel::kSplitKRowSums)
