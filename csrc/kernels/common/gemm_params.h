// The problem handed to the GEMM kernels: raw pointers, sizes and strides,
// no torch and no CUDA headers, so the CPU reference shares the enums.
//
//   D[b] = activation(A[b] @ B[b] + bias)      for b in [0, batch)
//
// A is (m, k) and B is (k, n), both fp16 or both bf16 (ab_type); products are
// summed in fp32. The
// epilogue adds the bias and applies the activation in fp32, then rounds once
// to D's element type. A batch stride of 0 broadcasts one matrix over the batch.
#pragma once

#include <cstdint>

namespace mpgemm::kernels {

enum class ElementType : int { kFloat16 = 0, kFloat32 = 1, kBFloat16 = 2 };

// kGeluTanh, GELU's tanh form (GPT-2's): as a derivative
// (GemmParams::activation_input), or applied by the Hopper pre-activation
// kernel built for it alone; the GEMM launcher refuses it anywhere else
// (gemm/launch.h's pre_activation_from_epilogue).
enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };

struct GemmParams {
  int64_t batch = 1, m = 0, n = 0, k = 0;

  // Element (i, j) of matrix b of A lives at a + b*a_batch_stride + i*a_row_stride + j*a_col_stride.
  // One of the two matrix strides must be 1: A is row- or column-major.
  ElementType ab_type = ElementType::kFloat16;  // of A and B: kFloat16 or kBFloat16 (sm_80+)
  const void* a = nullptr;
  int64_t a_batch_stride = 0, a_row_stride = 0, a_col_stride = 0;
  const void* b = nullptr;
  int64_t b_batch_stride = 0, b_row_stride = 0, b_col_stride = 0;

  const void* bias = nullptr;  // (n,), optional, of any ElementType
  ElementType bias_type = ElementType::kFloat32;
  Activation activation = Activation::kNone;

  void* d = nullptr;  // row-major, unit column stride
  ElementType d_type = ElementType::kFloat32;
  int64_t d_batch_stride = 0, d_row_stride = 0;

  // Written by the kernels built for it (a convolution's fprop that feeds
  // training batch norm): each block of rows' moments of D's columns as
  // stored, [2][blocks][d_row_stride] (the means, then the M2s; blocks of
  // the kernel's rows, common/column_moments.cuh).
  float* column_moments = nullptr;

  // Written where the launcher is asked for it (gemm/launch.h): A @ B + bias
  // before the activation, rounded to D's type and laid out as D (its batch
  // and row strides), for a backward that needs the activation's input
  // (GELU's). The Hopper kernels built for it write it from their epilogue;
  // elsewhere the launcher runs the product again with no activation.
  void* pre_activation = nullptr;

  // Written where the launcher is asked for it and the plan allows
  // (gemm/launch.h's a_row_sums_from_mainloop): A's row sums over K, in fp32,
  // m of them (batch 1). In a wgrad GEMM, dW = dZ^T @ X, they are the bias's
  // gradient, summed by the kernel that already reads dZ^T.
  float* a_row_sums = nullptr;

  // Read where set (gemm/launch.h's activation_grad_from_epilogue): the
  // activation's input Z, of the inputs' type and laid out as D. The
  // epilogue then multiplies A @ B by the activation's derivative at Z,
  //     D = (A @ B) * activation'(Z)   (ReLU's a select: D = Z > 0 ? A @ B : 0)
  // with no bias, rounding once: in a backward, the gradient of GELU's (or
  // ReLU's) input from the dgrad product that gives its output's, dZ = dH *
  // gelu'(Z), where dH = dY @ W2 is the next linear's dgrad (an MLP's).
  const void* activation_input = nullptr;

  // Read where set (the Hopper convolution's dgrad kernels built for it,
  // sm90/conv_kernel.cuh's wgmma_dgrad_addend_kernel): a tensor of the
  // inputs' type laid out as D, added to A @ B in fp32 before the one
  // rounding, D = A @ B + addend: a backward's gradient of a tensor that two
  // layers read (a ResNet block's input, which its first convolution and its
  // residual both take), summed by the product that gives one of them
  // instead of by a pass of its own.
  const void* addend = nullptr;
};

// How the launcher spread the work over the grid.
struct GemmGrid {
  int raster_group = 1;       // tile rows per group of the tile order
  int split_k = 1;            // K ranges; blockIdx.x = split * tiles + tile
  float* partials = nullptr;  // split_k x m x n fp32, when split_k > 1
};

}  // namespace mpgemm::kernels
