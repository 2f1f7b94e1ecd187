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
