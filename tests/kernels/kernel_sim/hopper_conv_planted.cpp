// One Hopper convolution kernel from a copy of the kernels with a bug planted
// in its producer, mainloop or epilogue (test_kernel_sim.py): PLANTED_PASS's,
// or with PLANTED_STAGED_ROWS dgrad's that stages its rows, or with
// PLANTED_DGRAD_PHASES dgrad's that runs its phases in one launch, or with
// PLANTED_GATHERED_FOLD fprop's and wgrad's that gather folded taps, fp16 inputs (fprop's
// with its column moments' kernel, dgrad's with its addend's), the
// one `hopper_cases ... pinned` runs for that pass. Linked ahead of the
// unplanted kernels, its definitions of the kernel and of every function it
// shares with them are the ones the linker keeps, so that a planted build
// compiles this one kernel rather than all of them.
#include "sm90/conv_kernel.cuh"

#if defined(PLANTED_STAGED_ROWS)
template void mpgemm::kernels::sm90::wgmma_dgrad_staged_rows_kernel<__half, mpgemm::kernels::WgmmaTile>(
    CUtensorMap, CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk);
#elif defined(PLANTED_GATHERED_FOLD)
template void mpgemm::kernels::sm90::wgmma_gathered_fold_kernel<__half, mpgemm::kernels::WgmmaTile,
                                                                mpgemm::kernels::ConvPass::kFprop>(
    CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk, mpgemm::kernels::sm90::FoldedX, int);
template void mpgemm::kernels::sm90::wgmma_gathered_fold_kernel<__half, mpgemm::kernels::WgmmaTile,
                                                                mpgemm::kernels::ConvPass::kWgrad>(
    CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk, mpgemm::kernels::sm90::FoldedX, int);
#elif defined(PLANTED_DGRAD_PHASES)
template void mpgemm::kernels::sm90::wgmma_dgrad_phases_kernel<__half, mpgemm::kernels::WgmmaTile>(
    CUtensorMap, mpgemm::kernels::sm90::DgradPhases);
#else
template void mpgemm::kernels::sm90::wgmma_conv_kernel<__half, mpgemm::kernels::WgmmaTile,
                                                       mpgemm::kernels::ConvPass::PLANTED_PASS>(
    CUtensorMap, CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk);
#if defined(PLANTED_FPROP_MOMENTS)  // fprop's build: its kernel that also writes column moments
template void mpgemm::kernels::sm90::wgmma_fprop_moments_kernel<__half, mpgemm::kernels::WgmmaTile>(
    CUtensorMap, CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk);
#elif defined(PLANTED_DGRAD_ADDEND)  // dgrad's build: its kernel that adds an addend to dx
template void mpgemm::kernels::sm90::wgmma_dgrad_addend_kernel<__half, mpgemm::kernels::WgmmaTile>(
    CUtensorMap, CUtensorMap, CUtensorMap, mpgemm::kernels::GemmParams, mpgemm::kernels::sm90::WgmmaSchedule,
    mpgemm::kernels::sm90::ConvWalk);
#endif
#endif
