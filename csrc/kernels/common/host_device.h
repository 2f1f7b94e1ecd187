// MPGEMM_HOST_DEVICE marks the functions that host and device code share
// (index arithmetic, layouts, the epilogue's math); in a host compiler's
// translation unit they are plain inline functions.
#pragma once

#if defined(__CUDACC__)
#define MPGEMM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MPGEMM_HOST_DEVICE inline
#endif
