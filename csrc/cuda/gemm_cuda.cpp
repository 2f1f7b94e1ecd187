// CUDA launcher of gemm: turns checked tensors into kernel arguments, plans
// the launch (tile, split-K) and enqueues the GEMM kernels on the current
// stream of a's device. `out`, the pre-activation and the activation's input
// are contiguous (the ops allocate or copy them, or check_gemm_out checks),
// so that they share D's strides; A's row sums are (m,), contiguous. GELU's
// tanh form comes with the pre-activation only (the pre-activation ops).
#include <ATen/core/Tensor.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../ops.h"
#include "../workspace.h"
#include "gemm/launch.h"
#include "plan/operand_layout.h"
#include "tensor_core_support.h"

namespace mpgemm {
namespace {

struct MatrixOperand {
  at::Tensor tensor;  // keeps a copy alive when one was needed
  kernels::MatrixLayout layout;
};

// A 2-D or 3-D operand as the kernels read it (kernels::matrix_layout): in
// place when its matrices are row- or column-major, else copied once to
// row-major. A 2-D operand, or a batch of 1, broadcasts with batch stride 0.
MatrixOperand as_matrix_operand(const at::Tensor& t) {
  const int64_t batch = t.dim() == 3 ? t.size(0) : 1;
  const kernels::MatrixLayout layout =
      kernels::matrix_layout(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1), batch, batch > 1 ? t.stride(0) : 0);
  return {layout.copied ? t.contiguous() : t, layout};
}

}  // namespace

void gemm_cuda_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                    const std::optional<at::Tensor>& bias, at::Tensor& out, const GemmSideTensors& side) {
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
  p.a_batch_stride = a_op.layout.batch_stride;
  p.a_row_stride = a_op.layout.row_stride;
  p.a_col_stride = a_op.layout.col_stride;
  p.b = b_op.tensor.data_ptr();
  p.b_batch_stride = b_op.layout.batch_stride;
  p.b_row_stride = b_op.layout.row_stride;
  p.b_col_stride = b_op.layout.col_stride;
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
  if (side.pre_activation != nullptr) p.pre_activation = side.pre_activation->data_ptr();
  if (side.a_row_sums != nullptr) p.a_row_sums = side.a_row_sums->data_ptr<float>();
  if (side.activation_input != nullptr) p.activation_input = side.activation_input->data_ptr();
  kernels::GemmLaunch launch = kernels::plan_gemm(p);
  // GELU's tanh form where no epilogue applies it (any plan but the Hopper
  // pre-activation kernel's): the product alone into the pre-activation,
  // then torch's gelu of it into out, rounded twice as torch.amp's is.
  const bool gelu_tanh_after = p.activation == kernels::Activation::kGeluTanh && side.pre_activation != nullptr &&
                               !kernels::pre_activation_from_epilogue(p, launch);
  if (gelu_tanh_after) {
    p.activation = kernels::Activation::kNone;
    p.d = p.pre_activation;
    p.pre_activation = nullptr;
    launch = kernels::plan_gemm(p);
  }
  // A's row sums where the plan's kernels cannot sum them: torch's sum of a
  // (accumulated in fp32), after the product.
  const bool sum_a_apart = side.a_row_sums != nullptr && !kernels::a_row_sums_from_mainloop(p, launch);
  if (sum_a_apart) p.a_row_sums = nullptr;
  // A padded plan's copies, split-K's fp32 partial sums (and partial row sums).
  at::Tensor workspace;
  if (launch.workspace_bytes > 0) workspace = allocate_workspace(launch.workspace_bytes, a);
  C10_CUDA_CHECK(kernels::launch_gemm(p, launch, launch.workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                                      c10::cuda::getCurrentCUDAStream(a.get_device()).stream()));
  if (sum_a_apart) at::sum_out(*side.a_row_sums, a, {-1}, false, at::kFloat);
  if (gelu_tanh_after) at::gelu_out(out, *side.pre_activation, "tanh");
}

}  // namespace mpgemm
