// The tensor maps the Hopper kernels' copies read: the driver's encoders,
// looked up at run time so that the extension does not link libcuda, and D's
// map, which GEMM and convolution alike store through.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "sm90/params.h"

namespace mpgemm::kernels::sm90 {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
using EncodeIm2col = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const int*, const int*, cuuint32_t, cuuint32_t,
                                  const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled and cuTensorMapEncodeIm2col; null where the driver has none.
EncodeTiled encode_tiled();
EncodeIm2col encode_im2col();

// Makes the current device's primary context current on the calling thread,
// as the encoders (driver calls) need and runtime calls do not ensure: on a
// thread whose first CUDA work is a Hopper launch (the autograd engine's
// device thread running a backward, a user's worker thread) they refuse with
// CUDA_ERROR_INVALID_CONTEXT. Once per thread and device; every launcher calls
// it before its first encoder.
cudaError_t bind_primary_context();

// The tensor map's type of a 16-bit or fp32 element.
CUtensorMapDataType map_type(ElementType type);

// How the epilogue stores D (the schedule's d_pairs, d_copy and d_pixels):
// through the copy engine where D's rows are dense and D can be described,
// in `d_map`, else from registers, two elements at a time where D's rows
// (`pixels`, if strided) and base allow.
WgmmaSchedule output_schedule(const GemmParams& p, CUtensorMap* d_map, const PixelRows& pixels = {});

}  // namespace mpgemm::kernels::sm90
