// cuBLAS doing mpgemm.gemm's computation (fp16 in, fp32 accumulate through
// CUBLAS_COMPUTE_32F), for benchmarks and cross-checks: the baseline that
// mpgemm's kernels are measured against.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"

namespace mpgemm {

at::Tensor cublas_gemm_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_cublas_gemm_args<int64_t>(a, b, out_dtype);
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
  TORCH_CUDABLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b_rows.data_ptr(), CUDA_R_16F,
                                    n, a_rows.data_ptr(), CUDA_R_16F, k, &beta, out.data_ptr(),
                                    problem.out_dtype == at::kFloat ? CUDA_R_32F : CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  return out;
}

}  // namespace mpgemm
