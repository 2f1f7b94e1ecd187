// CUDA launcher of gemm: turns checked tensors into kernel arguments, plans
// the launch (tile, split-K) and enqueues the WMMA kernels on the current
// stream of a's device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../ops.h"
#include "../kernels/gemm_launch.h"
#include "tensor_core_support.h"

namespace mpgemm {
namespace {

struct MatrixOperand {
  at::Tensor tensor;  // keeps a copy alive when one was needed
  int64_t batch_stride, row_stride, col_stride;
};

// A 2-D or 3-D operand as the kernels read it: in place when its matrices are
// row- or column-major, else copied once to row-major. A dimension of size 1
// fits either layout; its stride is then chosen so that the layout with a
// contiguous extent > 1 wins (16-byte loads need one). A 2-D operand, or a
// batch of 1, broadcasts with batch stride 0.
MatrixOperand as_matrix_operand(const at::Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t row_stride = t.stride(-2), col_stride = t.stride(-1);
  auto batch_stride = [](const at::Tensor& x) { return x.dim() == 3 && x.size(0) > 1 ? x.stride(0) : 0; };
  if (cols == 1 && rows > 1 && row_stride == 1) return {t, batch_stride(t), 1, rows};
  if (col_stride == 1 || cols == 1) return {t, batch_stride(t), rows == 1 ? cols : row_stride, 1};
  if (row_stride == 1 || rows == 1) return {t, batch_stride(t), 1, col_stride};
  const at::Tensor copy = t.contiguous();
  return {copy, batch_stride(copy), cols, 1};
}

}  // namespace

void gemm_cuda_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                    const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  check_tensor_cores_take(problem.op, problem.input_dtype, a);
  const MatrixOperand a_op = as_matrix_operand(a);
  const MatrixOperand b_op = as_matrix_operand(b);

  kernels::GemmParams p;
  p.batch = problem.batch;
  p.m = problem.m;
  p.n = problem.n;
  p.k = problem.k;
  p.ab_type = element_type(problem.input_dtype);
  p.a = a_op.tensor.data_ptr();
  p.a_batch_stride = a_op.batch_stride;
  p.a_row_stride = a_op.row_stride;
  p.a_col_stride = a_op.col_stride;
  p.b = b_op.tensor.data_ptr();
  p.b_batch_stride = b_op.batch_stride;
  p.b_row_stride = b_op.row_stride;
  p.b_col_stride = b_op.col_stride;
  at::Tensor bias_contiguous;
  if (bias) {
    bias_contiguous = bias->contiguous();
    p.bias = bias_contiguous.data_ptr();
    p.bias_type = element_type(bias_contiguous.scalar_type());
  }
  p.activation = problem.activation;
  p.d = out.data_ptr();
  p.d_type = element_type(out.scalar_type());
  p.d_batch_stride = problem.m * problem.n;
  p.d_row_stride = problem.n;
  const kernels::GemmPlan plan = kernels::plan_gemm(p);
  // Split-K's fp32 partial sums. The caching allocator hands out blocks per
  // stream, so this is cheap and safe to reuse once the kernels are done.
  const size_t workspace_bytes = kernels::gemm_workspace_bytes(p, plan);
  at::Tensor workspace;
  if (workspace_bytes > 0) workspace = at::empty({int64_t(workspace_bytes)}, a.options().dtype(at::kByte));
  C10_CUDA_CHECK(kernels::launch_gemm(p, plan, workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                                      c10::cuda::getCurrentCUDAStream(a.get_device()).stream()));
}

}  // namespace mpgemm
