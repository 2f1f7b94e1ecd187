// Whether this compilation pass builds sm_90a code: wgmma, setmaxnreg and the
// tensor copy engine's instructions exist there alone. The Hopper kernels'
// bodies and the wrappers of arch/ compile to nothing in every other pass;
// the launcher refuses to run a kernel the device's code lacks.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MPGEMM_SM90A 1
#else
#define MPGEMM_SM90A 0
#endif

namespace mpgemm::kernels {
// The static shared memory that sm90/block.cuh's probe kernel declares in
// sm_90a code alone: how the launcher tells at run time which code the device
// loaded for a unit, from the probe's attributes (sm90/block.cuh's
// wgmma_compiled).
inline constexpr int kSm90aProbeSharedBytes = 16;
}  // namespace mpgemm::kernels
