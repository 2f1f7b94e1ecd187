// cuBLAS doing mpgemm.gemm's computation (fp16 or bf16 in, fp32 accumulate
// through CUBLAS_COMPUTE_32F, fp32 or the input type out), for benchmarks and
// cross-checks: the baseline that mpgemm's kernels are measured against.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"

namespace mpgemm {
namespace {

cudaDataType_t cuda_data_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return CUDA_R_16F;
    case at::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

}  // namespace

at::Tensor cublas_gemm_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_2d_gemm_args<int64_t>("mpgemm._cublas_gemm", a, b, out_dtype);
  const c10::cuda::CUDAGuard device_guard(a.device());
  // Row-major C = A B is column-major C^T = B^T A^T: hand cuBLAS b first.
  const at::Tensor a_rows = a.contiguous(), b_rows = b.contiguous();
  at::Tensor out = at::empty(problem.out_shape, a.options().dtype(problem.out_dtype));
  if (out.numel() == 0) return out;
  if (problem.k == 0) return out.zero_();
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  // torch sets the math mode from its fp32 matmul precision; pin the default.
  TORCH_CUDABLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(problem.m), n = static_cast<int>(problem.n), k = static_cast<int>(problem.k);
  const cudaDataType_t input_type = cuda_data_type(problem.input_dtype);
  TORCH_CUDABLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b_rows.data_ptr(), input_type,
                                    n, a_rows.data_ptr(), input_type, k, &beta, out.data_ptr(),
                                    cuda_data_type(problem.out_dtype), n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return out;
}

}  // namespace mpgemm
