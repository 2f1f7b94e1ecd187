// The ops' shared pieces: argument validation (one path for every backend,
// Meta included) and the per-backend implementations.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/gemm_params.h"

namespace mpgemm {

// A validated gemm call. Size is int64_t for real tensors and c10::SymInt for
// fake ones, so torch.compile traces through the same checks.
template <class Size>
struct GemmProblem {
  Size batch, m, n, k;
  std::vector<Size> out_shape;  // (batch, m, n) if either operand is 3-D, else (m, n)
  at::ScalarType out_dtype;
  kernels::Activation activation;
};

template <class Size>
GemmProblem<Size> check_gemm_args(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                                  std::optional<std::string_view> activation,
                                  std::optional<at::ScalarType> out_dtype);

// mpgemm.linear as a gemm: x (..., in_features) flattened to (m, k), weight
// (out_features, in_features) read as (k, n); out_shape is (..., out_features).
template <class Size>
GemmProblem<Size> check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, std::optional<std::string_view> activation,
                                    std::optional<at::ScalarType> out_dtype);

// Checks a caller-provided output against the problem.
void check_gemm_out(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& out);

// Backends: write activation(a @ b + bias) into `out`, already checked.
void gemm_cpu_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                   const std::optional<at::Tensor>& bias, at::Tensor& out);
void gemm_cuda_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                    const std::optional<at::Tensor>& bias, at::Tensor& out);

// unscale_grads_: outs[i] = grads[i] * inv_scale, found_inf = 1 on any inf/NaN.
void check_unscale_args(at::TensorList grads, at::TensorList outs, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale);
void unscale_grads_cpu(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf, const at::Tensor& inv_scale);
void unscale_grads_cuda(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf,
                        const at::Tensor& inv_scale);

// cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F) on 2-D fp16 operands: the baseline.
at::Tensor cublas_gemm_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype);

}  // namespace mpgemm
