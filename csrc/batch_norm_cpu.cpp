// CPU backend of batch norm with its residual add and ReLU. The elementwise
// steps and the per-channel ones round in fp32 in the CUDA kernels' order
// (kernels/norm/batch_norm_kernels.cuh), so both backends give the same bits
// from the same statistics; the statistics and backward's sums are exact
// references, accumulated in fp64.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <array>

#include "ops.h"

namespace mpgemm {
namespace {

// A per-channel vector shaped to broadcast over (N, C, H, W).
at::Tensor per_channel(const at::Tensor& t) { return t.view({1, -1, 1, 1}); }

const std::vector<int64_t> kReduced = {0, 2, 3};

// out > 0 as bits: bit e of byte j for element 8j + e in NHWC order.
at::Tensor relu_bits(const at::Tensor& out) {
  const at::Tensor passed = out.gt(0).contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1}).reshape({-1, 8});
  const at::Tensor weights = at::pow(2, at::arange(8, out.options().dtype(at::kInt))).to(at::kByte);
  return passed.to(at::kByte).mul(weights).sum(1, /*keepdim=*/false, at::kByte);
}

// Where the ReLU passed (out > 0), from its bits, as y's (N, C, H, W) booleans.
at::Tensor passed_from_bits(const at::Tensor& bits, const at::Tensor& y) {
  const at::Tensor shifts = at::arange(8, bits.options().dtype(at::kInt));
  const at::Tensor nhwc = bits.to(at::kInt).unsqueeze(1).bitwise_right_shift(shifts).bitwise_and(1).to(at::kBool);
  return nhwc.reshape({y.size(0), y.size(2), y.size(3), y.size(1)}).permute({0, 3, 1, 2});
}

at::Tensor masked_grad(const at::Tensor& grad_out, const std::optional<at::Tensor>& out,
                       const std::optional<at::Tensor>& relu_mask, const at::Tensor& y) {
  const at::Tensor dz = grad_out.to(at::kFloat);
  if (!out && !relu_mask) return dz;
  return at::where(relu_mask ? passed_from_bits(*relu_mask, y) : out->gt(0), dz, at::zeros({}, dz.options()));
}

at::Tensor in_format_of(const at::Tensor& y, const at::Tensor& result) {
  return result.to(y.scalar_type()).contiguous(y.suggest_memory_format());
}

// relu?(y * scale + shift + residual), each step rounded in fp32, in y's dtype and memory format.
at::Tensor act(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift,
               const std::optional<at::Tensor>& residual, bool relu) {
  at::Tensor z = y.to(at::kFloat).mul(per_channel(scale)).add(per_channel(shift));
  if (residual) z = z.add(residual->to(at::kFloat));
  if (relu) z = at::where(z.lt(0), at::zeros({}, z.options()), z);
  return in_format_of(y, z);
}

// torch's running-statistics update, in fp32: momentum * batch + (1 - momentum) * running.
void update(at::Tensor& running, const at::Tensor& batch, double momentum) {
  const float m = float(momentum);
  running.copy_(batch.mul(m).add(running.to(at::kFloat).mul(1.0f - m)));
}

// The forward's per-channel results (mean, invstd, scale, shift), the
// running statistics updated where batch statistics normalize.
std::array<at::Tensor, 4> forward_channels(const BatchNormForward& a) {
  const at::Tensor& y = a.y;
  at::Tensor mean, var;  // var in fp64
  if (a.batch_stats) {
    if (a.batch_mean_var) {
      mean = (*a.batch_mean_var)[0].to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // no alias
      var = (*a.batch_mean_var)[1].to(at::kDouble);
    } else {
      const at::Tensor values = y.to(at::kDouble);
      const at::Tensor mean64 = values.mean(kReduced);
      var = (values - per_channel(mean64)).square().mean(kReduced);
      mean = mean64.to(at::kFloat);
    }
    if (a.running_mean) {
      const double rows = double(y.numel() / y.size(1));
      at::Tensor running_mean = *a.running_mean, running_var = *a.running_var;
      update(running_mean, mean, a.momentum);
      update(running_var, (var * rows / (rows - 1.0)).to(at::kFloat), a.momentum);
    }
  } else {
    mean = a.running_mean->to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // no alias
    var = a.running_var->to(at::kDouble);
  }
  const at::Tensor invstd = (var + a.eps).rsqrt().to(at::kFloat);
  const at::Tensor scale = a.weight ? a.weight->to(at::kFloat).mul(invstd) : invstd.clone();  // no alias
  const at::Tensor beta = a.bias ? a.bias->to(at::kFloat) : at::zeros_like(mean);
  return {mean, invstd, scale, beta.sub(mean.mul(scale))};
}

}  // namespace

BatchNormForwardResult batch_norm_act_cpu(const BatchNormForward& a) {
  const auto [mean, invstd, scale, shift] = forward_channels(a);
  const at::Tensor out = act(a.y, scale, shift, a.residual, a.relu);
  const at::Tensor bits = a.relu && batch_norm_relu_mask_shape(a.y) ? relu_bits(out)
                                                                     : at::empty({0}, a.y.options().dtype(at::kByte));
  return {out, mean, invstd, scale, shift, bits};
}

BatchNormForwardResult batch_norm_relu_max_pool_cpu(const BatchNormForward& a, const MaxPoolArgs& pool) {
  const auto [mean, invstd, scale, shift] = forward_channels(a);
  const at::Tensor out = act(a.y, scale, shift, std::nullopt, /*relu=*/true);
  // torch's pool of the chain's output: the first maximum, the last NaN, as the kernel keeps them.
  const auto [pooled, indices] = at::max_pool2d_with_indices(out, pool.kernel, pool.stride, pool.padding,
                                                            pool.dilation, pool.ceil_mode);
  // Each maximum's flat index (h * W + w) as its tap in its window.
  const int64_t width = out.size(3);
  const auto origin = [&](int d, int64_t outputs, std::vector<int64_t> shape) {
    return at::arange(outputs, indices.options()).mul(pool.stride[d]).sub(pool.padding[d]).view(shape);
  };
  const at::Tensor row = indices.div(width, "floor").sub(origin(0, pooled.size(2), {1, 1, -1, 1}))
                             .div(pool.dilation[0], "floor");
  const at::Tensor column = indices.remainder(width).sub(origin(1, pooled.size(3), {1, 1, 1, -1}))
                                .div(pool.dilation[1], "floor");
  // A window no tap of which is inside the input (a dilated one) holds -inf: tap 0, the kernel's.
  const at::Tensor taps = at::where(pooled.isneginf(), 0, row.mul(pool.kernel[1]).add(column))
                              .add(pooled.gt(0).to(at::kLong).mul(128));
  return {in_format_of(a.y, pooled), mean, invstd, scale, shift,
          taps.to(at::kByte).contiguous(at::MemoryFormat::ChannelsLast)};
}

at::Tensor max_pool_window_backward_cpu(const at::Tensor& grad_out, const at::Tensor& window,
                                        kernels::MaxPoolWindow w) {
  // Each tap's windows add their gradient where their byte names the tap,
  // into a padded input's sums: the taps from the last to the first give
  // each input element its windows by row, then column (torch's order), in
  // fp32 as the kernel adds them.
  const at::Tensor g = grad_out.to(at::kFloat);
  const int64_t rows = std::max<int64_t>(int64_t(w.out_height - 1) * w.stride_h + int64_t(w.kernel_h - 1) *
                                             w.dilation_h + 1, int64_t(w.pad_h) + w.height);
  const int64_t columns = std::max<int64_t>(int64_t(w.out_width - 1) * w.stride_w + int64_t(w.kernel_w - 1) *
                                                w.dilation_w + 1, int64_t(w.pad_w) + w.width);
  at::Tensor sums = at::zeros({g.size(0), g.size(1), rows, columns}, g.options());
  const at::Tensor zero = at::zeros({}, g.options());
  for (int i = w.kernel_h - 1; i >= 0; --i)
    for (int j = w.kernel_w - 1; j >= 0; --j) {
      const int64_t top = int64_t(i) * w.dilation_h, left = int64_t(j) * w.dilation_w;
      sums.slice(2, top, top + int64_t(w.out_height - 1) * w.stride_h + 1, w.stride_h)
          .slice(3, left, left + int64_t(w.out_width - 1) * w.stride_w + 1, w.stride_w)
          .add_(at::where(window.eq(128 | (i * w.kernel_w + j)), g, zero));
    }
  return sums.slice(2, w.pad_h, w.pad_h + w.height)
      .slice(3, w.pad_w, w.pad_w + w.width)
      .to(grad_out.scalar_type())
      .contiguous(at::MemoryFormat::ChannelsLast);
}

at::Tensor batch_norm_apply_cpu(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift, bool relu) {
  return act(y, scale, shift, std::nullopt, relu);
}

BatchNormBackwardResult batch_norm_act_backward_cpu(const BatchNormBackward& a) {
  const at::Tensor& y = a.y;
  const auto [want_grad_y, want_sums, want_grad_z] = a.output_mask;
  const at::Tensor dz = masked_grad(a.grad_out, a.out, a.relu_mask, y);
  // What is not asked for: an empty tensor each (outputs must not alias).
  const auto empty = [&] { return at::empty({0}, y.options()); };
  at::Tensor sum_dz, sum_dz_xhat;
  if (want_sums || (want_grad_y && a.batch_stats)) {
    const at::Tensor dz64 = dz.to(at::kDouble);
    const at::Tensor xhat = (y.to(at::kDouble) - per_channel(a.mean.to(at::kDouble))) *
                            per_channel(a.invstd.to(at::kDouble));
    sum_dz = dz64.sum(kReduced).to(at::kFloat);
    sum_dz_xhat = (dz64 * xhat).sum(kReduced).to(at::kFloat);
  }
  at::Tensor grad_y = empty();
  if (want_grad_y && a.batch_stats) {
    const float inv_rows = 1.0f / float(y.numel() / y.size(1));
    const at::Tensor xhat = y.to(at::kFloat).sub(per_channel(a.mean)).mul(per_channel(a.invstd));
    const at::Tensor mean_dz = sum_dz.mul(inv_rows), mean_dz_xhat = sum_dz_xhat.mul(inv_rows);
    grad_y = in_format_of(y, dz.sub(per_channel(mean_dz)).sub(xhat.mul(per_channel(mean_dz_xhat)))
                                 .mul(per_channel(a.scale)));
  } else if (want_grad_y) {
    grad_y = in_format_of(y, dz.mul(per_channel(a.scale)));
  }
  return {grad_y, want_sums ? sum_dz : empty(), want_sums ? sum_dz_xhat : empty(),
          want_grad_z ? in_format_of(y, dz) : empty()};
}

}  // namespace mpgemm
