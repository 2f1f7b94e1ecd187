// The CPU reference backend of gemm: the kernels' semantics without their
// speed. Each input is an fp16 (or bf16) value and every product is summed in
// fp32 (products of two such values are exact in fp32); the epilogue is the
// kernels' own.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sum.h>

#include "ops.h"
#include "common/epilogue_math.h"

namespace mpgemm {

void gemm_cpu_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                   const std::optional<at::Tensor>& bias, at::Tensor& out, const GemmSideTensors& side) {
  // Widening to fp32 keeps strides, so transposed views stay views for BLAS.
  const at::Tensor a32 = a.to(at::kFloat);
  at::Tensor acc = at::matmul(a32, b.to(at::kFloat));
  if (bias) acc.add_(bias->to(at::kFloat));
  if (side.pre_activation != nullptr) side.pre_activation->copy_(acc.reshape(side.pre_activation->sizes()));
  if (side.a_row_sums != nullptr) at::sum_out(*side.a_row_sums, a32, {-1});
  const kernels::Activation activation = problem.activation;
  if (side.activation_input != nullptr) {
    acc = acc.contiguous();
    const at::Tensor z = side.activation_input->to(at::kFloat).contiguous();
    float* data = acc.data_ptr<float>();
    const float* at = z.data_ptr<float>();
    at::parallel_for(0, acc.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) data[i] = kernels::apply_activation_grad(activation, data[i], at[i]);
    });
  } else if (activation != kernels::Activation::kNone) {
    // GELU's tanh form as the Hopper pre-activation kernel applies it (no
    // other epilogue does: apply_activation leaves it out).
    const bool gelu_tanh = activation == kernels::Activation::kGeluTanh;
    acc = acc.contiguous();
    float* data = acc.data_ptr<float>();
    at::parallel_for(0, acc.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        data[i] = gelu_tanh ? kernels::gelu_tanh(data[i]) : kernels::apply_activation(activation, data[i]);
    });
  }
  out.copy_(acc.reshape(out.sizes()));
}

// Every slot gets the same iterations of acc += a @ b, added in fp32 one
// round at a time as the Tensor Cores do.
void mma_ceiling_cpu(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out) {
  const at::Tensor product = at::matmul(a.to(at::kFloat), b.to(at::kFloat)).contiguous();
  const float* p = product.data_ptr<float>();
  at::Tensor slot = at::empty_like(product);
  float* acc = slot.data_ptr<float>();
  at::parallel_for(0, product.numel(), 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int64_t it = 0; it < iterations; ++it) sum += p[i];
      acc[i] = sum;
    }
  });
  out.copy_(slot.expand_as(out));
}

}  // namespace mpgemm
