// mpgemm.layer_norm: layer norm over x's last dimensions with x 16-bit and
// the weights fp16, bf16 or fp32 (a prepared model's: fp32), computed in fp32
// from x as it is and rounded once to x's type (kernels/norm/layer_norm_math.h
// has the arithmetic and the order of its sums): its C++ autograd
// (LayerNormBackward), its forward on each backend, and its two internal
// ops, _layer_norm_forward (y, and the rows' mean and rstd, which backward
// reads) and _layer_norm_backward (dx, and the weights' gradients as fp32
// column sums). Saved for backward: x (16-bit), the weight, mean and rstd;
// no fp32 copy of anything of x's size. Its backward is not differentiable
// again (the node says so where asked). mpgemm.amp's LayerNorm calls it
// where MPGEMM_LAYER_NORM_KERNEL=1 (mpgemm/amp/norms.py).
#include <tuple>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "autograd.h"
#include "norm/layer_norm_math.h"
#include "op_handles.h"
#include "ops.h"

namespace mpgemm {
namespace {

using OptionalTensor = std::optional<at::Tensor>;
enum class Backend { kCpu, kCuda, kMeta };

// ---- The CPU backend: layer_norm_math.h's functions, row by row ----------

template <class T>
void widen_row(const T* src, int64_t cols, float* dst) {
  for (int64_t i = 0; i < cols; ++i) dst[i] = float(src[i]);
}

template <class T>
void forward_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, float eps, at::Tensor& y,
                 at::Tensor& mean, at::Tensor& rstd, int64_t cols) {
  const T* xs = x.const_data_ptr<T>();
  T* ys = y.mutable_data_ptr<T>();
  const float *w = weight.defined() ? weight.const_data_ptr<float>() : nullptr,
              *b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  const int width = kernels::layer_norm_width(cols, {xs, ys});
  float *means = mean.mutable_data_ptr<float>(), *rstds = rstd.mutable_data_ptr<float>();
  at::parallel_for(0, mean.numel(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(cols);
    for (int64_t r = begin; r < end; ++r) {
      widen_row(xs + r * cols, cols, row.data());
      const kernels::LayerNormRowStats s = kernels::layer_norm_row_stats(row.data(), cols, width, eps);
      for (int64_t i = 0; i < cols; ++i)
        ys[r * cols + i] = T(kernels::layer_norm_output(row[i], s.mean, s.rstd, w ? w[i] : 1.0f, b ? b[i] : 0.0f));
      means[r] = s.mean, rstds[r] = s.rstd;
    }
  });
}

template <class T>
void backward_cpu(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
                  const at::Tensor& weight, int64_t rows, int64_t cols, LayerNormResult& out) {
  const T *xs = x.const_data_ptr<T>(), *dys = grad.const_data_ptr<T>();
  const float *w = weight.defined() ? weight.const_data_ptr<float>() : nullptr, *means = mean.const_data_ptr<float>(),
              *rstds = rstd.const_data_ptr<float>();
  auto& [grad_x, grad_weight, grad_bias] = out;
  if (grad_x.numel() > 0) {
    T* dxs = grad_x.mutable_data_ptr<T>();
    const int width = kernels::layer_norm_width(cols, {xs, dys, dxs});
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> row(cols), dy(cols), dx(cols);
      for (int64_t r = begin; r < end; ++r) {
        widen_row(xs + r * cols, cols, row.data());
        widen_row(dys + r * cols, cols, dy.data());
        kernels::layer_norm_row_grad(row.data(), dy.data(), w, {means[r], rstds[r]}, cols, width, dx.data());
        for (int64_t i = 0; i < cols; ++i) dxs[r * cols + i] = T(dx[i]);
      }
    });
  }
  if (grad_weight.numel() > 0) {
    float *sum_dy_xhat = grad_weight.mutable_data_ptr<float>(), *sum_dy = grad_bias.mutable_data_ptr<float>();
    at::parallel_for(0, cols, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        kernels::layer_norm_column_sums(
            rows, [&](int64_t r) { return float(xs[r * cols + c]); },
            [&](int64_t r) { return float(dys[r * cols + c]); }, means, rstds, sum_dy_xhat[c], sum_dy[c]);
    });
  }
}

// ---- The internal ops on each backend ------------------------------------

// A result output_mask does not ask for: an empty tensor, as batch_norm_act_backward's.
at::Tensor not_asked(const at::Tensor& x, at::ScalarType dtype) { return at::empty({0}, x.options().dtype(dtype)); }

// The weights' gradients as fp32 column sums, (cols,), or not asked for.
at::Tensor column_sums(const at::Tensor& x, bool asked, int64_t cols) {
  return asked ? at::empty({cols}, x.options().dtype(at::kFloat)) : not_asked(x, at::kFloat);
}

// A weight as the kernels read it: fp32, contiguous (undefined where absent).
at::Tensor as_floats(const OptionalTensor& t) {
  return t && t->defined() ? t->to(at::kFloat).contiguous() : at::Tensor();
}

template <Backend B>
LayerNormResult layer_norm_forward(const at::Tensor& x, at::IntArrayRef normalized_shape, const OptionalTensor& weight,
                                   const OptionalTensor& bias, double eps) {
  constexpr const char* op = "mpgemm.layer_norm";  // what a caller of the op, or of this, reads
  const LayerNormShape shape = check_layer_norm_args(op, x, normalized_shape, weight, bias);
  TORCH_CHECK_VALUE(eps >= 0, op, ": expected eps >= 0, got ", eps);
  const auto stats = [&] { return at::empty_symint({shape.rows}, x.options().dtype(at::kFloat)); };
  if constexpr (B == Backend::kMeta) {
    return {at::empty_like(x, at::MemoryFormat::Contiguous), stats(), stats()};
  }
#ifdef MPGEMM_WITH_CUDA
  else if constexpr (B == Backend::kCuda) {
    return layer_norm_forward_cuda(x.contiguous(), as_floats(weight), as_floats(bias),
                                   shape.rows.expect_int(), shape.cols, eps);
  }
#endif
  else {
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous), mean = stats(), rstd = stats();
    const at::Tensor w = as_floats(weight), b = as_floats(bias);
    if (x.scalar_type() == at::kHalf) forward_cpu<c10::Half>(xc, w, b, float(eps), y, mean, rstd, shape.cols);
    else forward_cpu<c10::BFloat16>(xc, w, b, float(eps), y, mean, rstd, shape.cols);
    return {y, mean, rstd};
  }
}

template <Backend B>
LayerNormResult layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                                    const at::Tensor& rstd, at::IntArrayRef normalized_shape,
                                    const OptionalTensor& weight, std::array<bool, 3> output_mask) {
  constexpr const char* op = "mpgemm._layer_norm_backward";
  const LayerNormShape shape = check_layer_norm_args(op, x, normalized_shape, weight, std::nullopt);
  check_layer_norm_backward_args(op, x, shape, grad, mean, rstd);
  const bool want_x = output_mask[0], want_weights = output_mask[1] || output_mask[2];
  if constexpr (B == Backend::kMeta) {
    return {want_x ? at::empty_like(x, at::MemoryFormat::Contiguous) : not_asked(x, x.scalar_type()),
            column_sums(x, want_weights, shape.cols), column_sums(x, want_weights, shape.cols)};
  }
#ifdef MPGEMM_WITH_CUDA
  else if constexpr (B == Backend::kCuda) {
    return layer_norm_backward_cuda(grad.contiguous(), x.contiguous(), mean.contiguous(), rstd.contiguous(),
                                    as_floats(weight), shape.rows.expect_int(), shape.cols, want_x, want_weights);
  }
#endif
  else {
    const at::Tensor dy = grad.contiguous(), xc = x.contiguous(), m = mean.contiguous(), s = rstd.contiguous();
    LayerNormResult out{want_x ? at::empty_like(xc, at::MemoryFormat::Contiguous) : not_asked(x, x.scalar_type()),
                        column_sums(x, want_weights, shape.cols), column_sums(x, want_weights, shape.cols)};
    const int64_t rows = shape.rows.expect_int();
    if (x.scalar_type() == at::kHalf) backward_cpu<c10::Half>(dy, xc, m, s, as_floats(weight), rows, shape.cols, out);
    else backward_cpu<c10::BFloat16>(dy, xc, m, s, as_floats(weight), rows, shape.cols, out);
    return out;
  }
}

// ---- The op and its autograd ---------------------------------------------

LayerNormResult call_layer_norm_forward(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                        const OptionalTensor& weight, const OptionalTensor& bias, double eps) {
  static const auto op = op_handle<LayerNormForwardSignature>("mpgemm::_layer_norm_forward");
  return op.call(x, normalized_shape, weight, bias, eps);
}

LayerNormResult call_layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                                         const at::Tensor& rstd, at::IntArrayRef normalized_shape,
                                         const OptionalTensor& weight, std::array<bool, 3> output_mask) {
  static const auto op = op_handle<LayerNormBackwardSignature>("mpgemm::_layer_norm_backward");
  return op.call(grad, x, mean, rstd, normalized_shape, weight, output_mask);
}

// y alone, in x's shape (the forward's output is contiguous).
at::Tensor layer_norm_forward_only(const at::Tensor& x, at::IntArrayRef normalized_shape, const OptionalTensor& weight,
                                   const OptionalTensor& bias, double eps) {
  return std::get<0>(call_layer_norm_forward(x, normalized_shape, weight, bias, eps));
}

// Its node (op_node.h): edges x, weight, bias (0-2; empty where absent);
// saved x, the weight, mean and rstd.
struct LayerNormBackward final : OpNode<LayerNormBackward, 4> {
  enum Slot : size_t { kX, kWeight, kMean, kRstd };
  std::vector<int64_t> normalized_shape;
  std::optional<at::ScalarType> weight_dtype, bias_dtype;

  static constexpr const char* kOp = "mpgemm.layer_norm";
  std::string name() const override { return "MpgemmLayerNormBackward"; }
  template <class Self>
  static auto fields(Self& node) {
    return std::tie(node.normalized_shape, node.weight_dtype, node.bias_dtype);
  }

  variable_list gradients(const std::vector<at::Tensor>& saved, const at::Tensor& grad,
                          const std::vector<bool>& wanted) const {
    const at::Tensor& x = saved[kX];
    const bool want_weight = weight_dtype && wanted[1], want_bias = bias_dtype && wanted[2];
    const OptionalTensor weight = saved[kWeight].defined() ? OptionalTensor(saved[kWeight]) : std::nullopt;
    const auto [grad_x, sum_dy_xhat, sum_dy] = call_layer_norm_backward(
        grad.to(x.scalar_type()), x, saved[kMean], saved[kRstd], normalized_shape, weight,
        {wanted[0], want_weight, want_bias});
    const auto as_parameter = [&](const at::Tensor& sum, bool want, std::optional<at::ScalarType> dtype) {
      return want ? sum.view(normalized_shape).to(*dtype) : at::Tensor();
    };
    return {wanted[0] ? grad_x.view_symint(x.sym_sizes()) : at::Tensor(),
            as_parameter(sum_dy_xhat, want_weight, weight_dtype), as_parameter(sum_dy, want_bias, bias_dtype)};
  }
};

std::optional<at::ScalarType> dtype_of(const OptionalTensor& t) {
  return t && t->defined() ? std::optional(t->scalar_type()) : std::nullopt;
}

bool requires_grad(const OptionalTensor& t) { return t && t->defined() && t->requires_grad(); }

at::Tensor layer_norm_autograd(const at::Tensor& x, at::IntArrayRef normalized_shape, const OptionalTensor& weight,
                               const OptionalTensor& bias, double eps) {
  refuse_forward_ad("mpgemm.layer_norm", x, weight, bias);
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || requires_grad(weight) || requires_grad(bias))) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return layer_norm_forward_only(x, normalized_shape, weight, bias, eps);
  }
  auto node = make_node<LayerNormBackward>();
  at::Tensor y, mean, rstd;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::tie(y, mean, rstd) = call_layer_norm_forward(x, normalized_shape, weight, bias, eps);
  }
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
  node->normalized_shape = normalized_shape.vec();
  node->weight_dtype = dtype_of(weight), node->bias_dtype = dtype_of(bias);
  node->save(LayerNormBackward::kX, x);
  node->save(LayerNormBackward::kWeight, weight.value_or(at::Tensor()));
  node->save(LayerNormBackward::kMean, mean);
  node->save(LayerNormBackward::kRstd, rstd);
  torch::autograd::set_history(y, node);
  node_complete(node);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(mpgemm, Autograd, m) { m.impl("layer_norm", &layer_norm_autograd); }

TORCH_LIBRARY_IMPL(mpgemm, CPU, m) {
  m.impl("layer_norm", &layer_norm_forward_only);
  m.impl("_layer_norm_forward", &layer_norm_forward<Backend::kCpu>);
  m.impl("_layer_norm_backward", &layer_norm_backward<Backend::kCpu>);
}

TORCH_LIBRARY_IMPL(mpgemm, Meta, m) {
  m.impl("layer_norm", &layer_norm_forward_only);
  m.impl("_layer_norm_forward", &layer_norm_forward<Backend::kMeta>);
  m.impl("_layer_norm_backward", &layer_norm_backward<Backend::kMeta>);
}

#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) {
  m.impl("layer_norm", &layer_norm_forward_only);
  m.impl("_layer_norm_forward", &layer_norm_forward<Backend::kCuda>);
  m.impl("_layer_norm_backward", &layer_norm_backward<Backend::kCuda>);
}
#endif

}  // namespace mpgemm
