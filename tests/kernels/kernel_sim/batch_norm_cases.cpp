// Random cases of the batch-norm passes (csrc/kernels/norm/batch_norm.cu)
// against references computed here. Values are multiples of 1/8 (backward's
// means too, its invstd a power of two), so every fp32 sum is exact in any
// order and the statistics, the sums and everything computed from them must
// match the references bit for bit; the elementwise steps round in fp32 as
// the references do. Outputs start as NaN: an element a pass leaves unwritten
// fails. Channel counts that are multiples of 8 take the 16-byte runs, others
// one element; an output one element past an aligned address forces the
// one-element path. Each case also totals random blocks' column moments
// (norm/column_moments.h; values about a large offset, so that sums of
// squares would cancel; one case in two in 8 or more splits of the blocks),
// checked against the statistics of the values they came from, and
// normalizes with those statistics given (batch_mean_var).
// Every other case runs the sums and backward's input gradient on the
// loads-ahead kernels (norm/batch_norm_ahead_kernels.cuh), half of those on
// 64-160 rows of 136-320 channels (8-15 rows in flight a block), so that a
// thread walks several groups of rows ahead and a partial one; every fourth
// case's backward reads the ReLU's bits in runs of one element. Cases 2 and
// 3 of every four total the sums on the finish by lines
// (norm/batch_norm_line_finish.cuh; given and running statistics too), the
// others on the default finish. The values are exact in any order: that the
// loads-ahead sums keep the default's order (the same bits from inexact
// values), and that the finish by lines gives the default's results to
// fp32's last bits, are the GPU tests' to check.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernel_sim/sim_common.h"
#include "norm/batch_norm.h"
#include "norm/column_moments.h"

using namespace mpgemm::kernels;
using sim::Buffer;
using sim::get;
using sim::rnd;
using sim::set;

namespace {

struct Matrix {
  ElementType type;
  int64_t count, offset;  // offset: elements past the buffer's 16-byte aligned start
  Buffer mem;
  Matrix(ElementType type, int64_t count, bool misaligned)
      : type(type), count(count), offset(misaligned), mem((count + 1) * sim::bytes_of(type)) {}
  void* data() { return mem.p + offset * sim::bytes_of(type); }
  float operator[](int64_t i) const { return get(mem.p + offset * sim::bytes_of(type), type, i); }
  void fill(int lo, int hi) {
    for (int64_t i = 0; i < count; ++i) set(data(), type, i, rnd(lo, hi) / 8.0f);
  }
};

std::vector<float> eighths(int64_t n, int lo, int hi) {
  std::vector<float> v(n);
  for (float& x : v) x = rnd(lo, hi) / 8.0f;
  return v;
}

bool same(float got, float want) { return got == want || (std::isnan(got) && std::isnan(want)); }

struct Checker {
  int bad = 0;
  void operator()(const char* what, int64_t i, float got, float want) {
    if (!same(got, want) && bad++ < 3) printf("  %s[%ld] = %g, want %g\n", what, long(i), got, want);
  }
};

// The forward: statistics (or running ones), then relu?(y * scale + shift + residual).
void forward_case(BatchNormShape shape, BatchNormKernelChoice choice, Checker& check, cudaError_t& err) {
  const int64_t n = shape.rows * shape.channels, channels = shape.channels;
  const bool misaligned = rnd(0, 4) == 0, relu = rnd(0, 1), with_residual = rnd(0, 1);
  const bool batch_stats = rnd(0, 3) != 0, affine = rnd(0, 3) != 0, tracked = rnd(0, 3) != 0;
  Matrix y(shape.type, n, false), residual(shape.type, n, misaligned), out(shape.type, n, misaligned);
  y.fill(-32, 32);
  residual.fill(-16, 16);
  const std::vector<float> weight = eighths(channels, 1, 16), bias = eighths(channels, -16, 16);
  std::vector<float> running_mean = eighths(channels, -8, 8), running_var = eighths(channels, 1, 16);
  const std::vector<float> mean_before = running_mean, var_before = running_var;
  std::vector<float> mean(channels, NAN), invstd(channels, NAN), scale(channels, NAN), shift(channels, NAN);
  BatchNormChannels ch;
  ch.weight = affine ? weight.data() : nullptr;
  ch.bias = affine ? bias.data() : nullptr;
  ch.running_mean = tracked || !batch_stats ? running_mean.data() : nullptr;
  ch.running_var = tracked || !batch_stats ? running_var.data() : nullptr;
  ch.momentum = 0.25f;
  ch.eps = 1e-5;
  ch.mean = mean.data(), ch.invstd = invstd.data(), ch.scale = scale.data(), ch.shift = shift.data();
  Buffer workspace(batch_norm_workspace_floats(shape) * sizeof(float));
  // The ReLU's bits where the 16-byte runs of 16-bit elements write them.
  const bool bits = relu && batch_norm_relu_mask_fits(shape, {y.data(), out.data(),
                                                              with_residual ? residual.data() : y.data()});
  std::vector<uint8_t> relu_mask(n / 8 + 1, 0xa5);
  err = launch_batch_norm_forward(shape, y.data(), with_residual ? residual.data() : nullptr, relu, batch_stats, nullptr, ch,
                                  reinterpret_cast<float*>(workspace.p), out.data(),
                                  bits ? relu_mask.data() : nullptr, choice, nullptr);
  // The elementwise pass again from the scale and shift written (a fused
  // chain's recomputed output), into another poisoned buffer.
  Matrix again(shape.type, n, rnd(0, 4) == 0);
  if (err == cudaSuccess)
    err = launch_batch_norm_apply(shape, y.data(), scale.data(), shift.data(), relu, again.data(), nullptr);
  for (int64_t c = 0; c < channels; ++c) {
    float want_mean = mean_before[c];
    double var = var_before[c];
    if (batch_stats) {
      double sum = 0, squares = 0;
      for (int64_t r = 0; r < shape.rows; ++r) {
        const double v = double(y[r * channels + c]) - y[c];
        sum += v;
        squares += v * v;
      }
      const double offset = sum / shape.rows, variance = squares / shape.rows - offset * offset;
      want_mean = float(y[c] + offset);
      var = variance > 0 ? variance : 0;
      if (ch.running_mean != nullptr) {
        const float unbiased = float(var * shape.rows / (shape.rows - 1.0));
        check("running_mean", c, running_mean[c], 0.25f * want_mean + 0.75f * mean_before[c]);
        check("running_var", c, running_var[c], 0.25f * unbiased + 0.75f * var_before[c]);
      }
    } else {
      check("running_mean", c, running_mean[c], mean_before[c]);
    }
    const float want_invstd = float(1.0 / std::sqrt(var + 1e-5));
    const float want_scale = affine ? weight[c] * want_invstd : want_invstd;
    check("shift", c, shift[c], (affine ? bias[c] : 0.0f) - want_mean * want_scale);
    check("mean", c, mean[c], want_mean);
    check("invstd", c, invstd[c], want_invstd);
    check("scale", c, scale[c], want_scale);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % channels;
    float z = y[i] * scale[c] + shift[c];
    if (with_residual) z += residual[i];
    if (relu && z < 0) z = 0;
    check("out", i, out[i], sim::rounded(z, shape.type));
    float applied = y[i] * scale[c] + shift[c];
    if (relu && applied < 0) applied = 0;
    check("applied", i, again[i], sim::rounded(applied, shape.type));
  }
  for (int64_t j = 0; bits && j < n / 8; ++j) {
    unsigned want = 0;
    for (int e = 0; e < 8; ++e) want |= unsigned(out[8 * j + e] > 0) << e;
    check("relu_mask", j, relu_mask[j], float(want));
  }
  if (bits) check("relu_mask past the end", n / 8, relu_mask[n / 8], 0xa5);
}

// Backward: the sums where asked for or needed, then the input gradient and dz.
// bits_in_runs_of_one: the ReLU's mask as bits, read by runs of one element
// (grad_y one element past 16 bytes), wherever 8 divides the channels.
void backward_case(BatchNormShape shape, BatchNormKernelChoice choice, bool bits_in_runs_of_one, Checker& check,
                   cudaError_t& err) {
  const int64_t n = shape.rows * shape.channels, channels = shape.channels;
  const bool misaligned = rnd(0, 4) == 0 || bits_in_runs_of_one, masked = rnd(0, 1) || bits_in_runs_of_one;
  const bool batch_stats = rnd(0, 3) != 0;
  // The ReLU's mask as bits, not out.
  const bool from_bits = masked && channels % 8 == 0 && (rnd(0, 2) != 0 || bits_in_runs_of_one);
  const bool want_sums = rnd(0, 1), want_grad_y = rnd(0, 3) != 0, want_grad_z = rnd(0, 1);
  Matrix y(shape.type, n, false), out(shape.type, n, false), grad_out(shape.type, n, false);
  Matrix grad_y(shape.type, n, misaligned), grad_z(shape.type, n, false);
  y.fill(-32, 32);
  out.fill(-8, 8);
  grad_out.fill(-16, 16);
  const std::vector<float> mean = eighths(channels, -16, 16), scale = eighths(channels, -16, 16);
  std::vector<float> invstd(channels);
  for (float& v : invstd) v = std::ldexp(1.0f, int(rnd(-1, 1)));
  std::vector<float> sum_dz(channels, NAN), sum_dz_xhat(channels, NAN);
  std::vector<uint8_t> relu_mask(n / 8);
  for (int64_t i = 0; i < n && from_bits; ++i) relu_mask[i / 8] |= uint8_t(out[i] > 0) << (i % 8);
  const BatchNormGrad g{grad_out.data(), masked && !from_bits ? out.data() : nullptr,
                        from_bits ? relu_mask.data() : nullptr, y.data(), mean.data(), invstd.data(), scale.data()};
  Buffer workspace(batch_norm_workspace_floats(shape) * sizeof(float));
  err = launch_batch_norm_backward(shape, g, batch_stats, reinterpret_cast<float*>(workspace.p),
                                   want_sums ? sum_dz.data() : nullptr, want_sums ? sum_dz_xhat.data() : nullptr,
                                   want_grad_y ? grad_y.data() : nullptr, want_grad_z ? grad_z.data() : nullptr,
                                   choice, nullptr);
  std::vector<float> dz(n);
  std::vector<double> sums(channels), sums_xhat(channels);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % channels;
    dz[i] = !masked || out[i] > 0 ? grad_out[i] : 0.0f;
    sums[c] += dz[i];
    sums_xhat[c] += double(dz[i]) * ((y[i] - mean[c]) * invstd[c]);
  }
  for (int64_t c = 0; c < channels && want_sums; ++c) {
    check("sum_dz", c, sum_dz[c], float(sums[c]));
    check("sum_dz_xhat", c, sum_dz_xhat[c], float(sums_xhat[c]));
  }
  const float inv_rows = 1.0f / float(shape.rows);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % channels;
    float dy = scale[c] * dz[i];
    if (batch_stats) {
      const float xhat = (y[i] - mean[c]) * invstd[c];
      dy = scale[c] * ((dz[i] - float(sums[c]) * inv_rows) - xhat * (float(sums_xhat[c]) * inv_rows));
    }
    if (want_grad_y) check("grad_y", i, grad_y[i], sim::rounded(dy, shape.type));
    check("grad_z", i, grad_z[i], want_grad_z ? dz[i] : NAN);  // NaN: never written
  }
}

// Per-block moments of random columns, totalled; then a forward that takes
// the totals as its batch statistics.
void moments_case(BatchNormShape shape, BatchNormKernelChoice choice, Checker& check, cudaError_t& err) {
  const int64_t rows = shape.rows, channels = shape.channels;
  // One case in two: 65-399 blocks where the rows allow (in 8-20 splits,
  // the last often short), 1-row blocks where they do not.
  const int64_t block_rows = rnd(0, 1) ? std::max<int64_t>(1, rows / rnd(65, 200))
                             : rnd(0, 1) ? int64_t(16) << rnd(0, 3)
                                         : rnd(1, 40);
  const int64_t blocks = column_moment_blocks(rows, block_rows);
  std::vector<double> values(rows * channels);
  for (int64_t c = 0; c < channels; ++c) {
    const double offset = rnd(-2000, 2000);
    for (int64_t r = 0; r < rows; ++r) values[r * channels + c] = offset + rnd(-64, 64) / 8.0;
  }
  std::vector<float> moments(2 * blocks * channels);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t first = b * block_rows, last = std::min(rows, first + block_rows);
      double sum = 0, m2 = 0;
      for (int64_t r = first; r < last; ++r) sum += values[r * channels + c];
      const double mean = sum / double(last - first);
      for (int64_t r = first; r < last; ++r) m2 += (values[r * channels + c] - mean) * (values[r * channels + c] - mean);
      moments[b * channels + c] = float(mean), moments[(blocks + b) * channels + c] = float(m2);
    }
  std::vector<float> mean_var(2 * channels, NAN);
  // Poisoned: each split's moments must be written before they are combined.
  std::vector<double> totals(column_moments_total_workspace_bytes(rows, channels, block_rows) / sizeof(double), NAN);
  err = launch_column_moments_total(rows, channels, block_rows, moments.data(), totals.data(), mean_var.data(),
                                    nullptr);
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0, m2 = 0;
    for (int64_t r = 0; r < rows; ++r) sum += values[r * channels + c];
    const double mean = sum / double(rows);
    for (int64_t r = 0; r < rows; ++r) m2 += (values[r * channels + c] - mean) * (values[r * channels + c] - mean);
    const double var = m2 / double(rows);
    // The blocks' moments were rounded to fp32: their means by about 2^-24 of
    // the offset, which moves each block's share of the variance by as much
    // times the spread.
    const double mean_tolerance = 1e-6 * (std::fabs(mean) + 1.0);
    const double var_tolerance = 1e-5 * (var + 1.0) + 1e-6 * std::fabs(mean) * (std::sqrt(var) + 1.0);
    if (!(std::fabs(mean_var[c] - mean) <= mean_tolerance)) check("moments' mean", c, mean_var[c], float(mean));
    if (!(std::fabs(mean_var[channels + c] - var) <= var_tolerance))
      check("moments' variance", c, mean_var[channels + c], float(var));
  }
  // The totals as a forward's batch statistics: used as given.
  std::vector<float> mean(channels, NAN), invstd(channels, NAN), scale(channels, NAN), shift(channels, NAN);
  BatchNormChannels ch;
  ch.eps = 1e-5;
  ch.mean = mean.data(), ch.invstd = invstd.data(), ch.scale = scale.data(), ch.shift = shift.data();
  Matrix y(shape.type, rows * channels, false), out(shape.type, rows * channels, false);
  y.fill(-32, 32);
  Buffer workspace(batch_norm_workspace_floats(shape) * sizeof(float));
  if (err == cudaSuccess)
    err = launch_batch_norm_forward(shape, y.data(), nullptr, false, true, mean_var.data(), ch,
                                    reinterpret_cast<float*>(workspace.p), out.data(), nullptr, choice, nullptr);
  for (int64_t c = 0; c < channels; ++c) {
    check("given mean", c, mean[c], mean_var[c]);
    check("given invstd", c, invstd[c], float(1.0 / std::sqrt(double(mean_var[channels + c]) + 1e-5)));
  }
}

// The stem's max pool fused into the forward (launch_batch_norm_relu_max_pool)
// and its gather backward (launch_max_pool_grad) over a random window
// (kernel 1-4, stride 1-3, dilation 1-2, padding up to half the kernel,
// ceil_mode), y of few distinct values so that windows tie (the first
// maximum must win) and, one case in three, a NaN or two (the last must).
void max_pool_case(BatchNormShape shape, BatchNormKernelChoice choice, Checker& check, cudaError_t& err) {
  const int64_t channels = shape.channels;
  MaxPoolWindow w;
  int64_t out_h = 0, out_w = 0;
  const auto outputs = [](int64_t size, int k, int s, int pad, int d, bool ceil) {
    const int64_t span = size + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
    int64_t out = (span >= 0 ? span / s : -((-span + s - 1) / s)) + 1;
    if (ceil && (out - 1) * s >= size + pad) --out;
    return out;
  };
  do {
    w.batch = int(rnd(1, 3)), w.height = int(rnd(1, 11)), w.width = int(rnd(1, 11));
    w.kernel_h = int(rnd(1, 4)), w.kernel_w = int(rnd(1, 4)), w.stride_h = int(rnd(1, 3)), w.stride_w = int(rnd(1, 3));
    w.dilation_h = int(rnd(1, 2)), w.dilation_w = int(rnd(1, 2));
    w.pad_h = int(rnd(0, w.kernel_h / 2)), w.pad_w = int(rnd(0, w.kernel_w / 2));
    const bool ceil = rnd(0, 1);
    out_h = outputs(w.height, w.kernel_h, w.stride_h, w.pad_h, w.dilation_h, ceil);
    out_w = outputs(w.width, w.kernel_w, w.stride_w, w.pad_w, w.dilation_w, ceil);
  } while (out_h <= 0 || out_w <= 0);
  w.out_height = int(out_h), w.out_width = int(out_w);
  BatchNormShape in = shape, pooled = shape;
  in.rows = int64_t(w.batch) * w.height * w.width;
  pooled.rows = int64_t(w.batch) * out_h * out_w;
  const int64_t n = in.rows * channels, m = pooled.rows * channels;
  Matrix y(shape.type, n, false), out(shape.type, m, rnd(0, 4) == 0);
  for (int64_t i = 0; i < n; ++i) set(y.data(), shape.type, i, rnd(-3, 3) / 4.0f);
  for (int nans = rnd(0, 2) == 0 ? int(rnd(1, 2)) : 0; nans > 0; --nans) set(y.data(), shape.type, rnd(0, n - 1), NAN);
  const std::vector<float> weight = eighths(channels, -16, 16), bias = eighths(channels, -16, 16);
  std::vector<float> running_mean = eighths(channels, -8, 8), running_var = eighths(channels, 1, 16);
  std::vector<float> mean(channels, NAN), invstd(channels, NAN), scale(channels, NAN), shift(channels, NAN);
  BatchNormChannels ch;
  ch.weight = weight.data(), ch.bias = bias.data();
  ch.running_mean = running_mean.data(), ch.running_var = running_var.data();
  ch.eps = 1e-5;
  ch.mean = mean.data(), ch.invstd = invstd.data(), ch.scale = scale.data(), ch.shift = shift.data();
  const bool batch_stats = rnd(0, 1);
  Buffer workspace(batch_norm_workspace_floats(in) * sizeof(float));
  std::vector<uint8_t> window(m + 1, 0xa5);
  err = launch_batch_norm_relu_max_pool(in, y.data(), batch_stats, nullptr, ch, reinterpret_cast<float*>(workspace.p),
                                        w, out.data(), window.data(), choice, nullptr);
  const auto at = [&](int64_t image, int64_t row, int64_t column, int64_t rows, int64_t columns) {
    return ((image * rows + row) * columns + column) * channels;
  };
  for (int64_t i = 0; i < m; ++i) {
    const int64_t c = i % channels, pixel = i / channels;
    const int64_t ow = pixel % out_w, oh = pixel / out_w % out_h, image = pixel / (out_w * out_h);
    float best = -INFINITY;
    int tap = 0;
    for (int r = 0; r < w.kernel_h; ++r)
      for (int q = 0; q < w.kernel_w; ++q) {
        const int64_t h = oh * w.stride_h - w.pad_h + r * w.dilation_h, x = ow * w.stride_w - w.pad_w + q * w.dilation_w;
        if (h < 0 || h >= w.height || x < 0 || x >= w.width) continue;
        float z = y[at(image, h, x, w.height, w.width) + c] * scale[c] + shift[c];
        if (z < 0) z = 0;
        z = sim::rounded(z, shape.type);
        if (z > best || std::isnan(z)) best = z, tap = r * w.kernel_w + q;
      }
    check("pooled out", i, out[i], best);
    check("window", i, window[i], float(tap | (best > 0 ? 0x80 : 0)));
  }
  check("window past the end", m, window[m], 0xa5);
  // Backward from the forward's bytes, one gradient in two where they let it
  // through; the sums are exact (eighths).
  Matrix grad_out(shape.type, m, false), grad_in(shape.type, n, rnd(0, 4) == 0);
  grad_out.fill(-16, 16);
  if (err == cudaSuccess) err = launch_max_pool_grad(in, w, grad_out.data(), window.data(), grad_in.data(), nullptr);
  std::vector<float> want(n, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    if (!(window[i] & 0x80)) continue;
    const int64_t c = i % channels, pixel = i / channels, tap = window[i] & 0x7f;
    const int64_t ow = pixel % out_w, oh = pixel / out_w % out_h, image = pixel / (out_w * out_h);
    const int64_t h = oh * w.stride_h - w.pad_h + tap / w.kernel_w * w.dilation_h;
    const int64_t x = ow * w.stride_w - w.pad_w + tap % w.kernel_w * w.dilation_w;
    want[at(image, h, x, w.height, w.width) + c] += grad_out[i];
  }
  for (int64_t i = 0; i < n; ++i) check("pool's grad_input", i, grad_in[i], sim::rounded(want[i], shape.type));
}

}  // namespace

bool batch_norm_case(int index) {
  BatchNormShape shape;
  shape.type = sim::any_type();
  // Every combination of the kernel choice in each four cases.
  const BatchNormKernelChoice choice{index % 2 == 1, index % 4 >= 2};
  const bool wide = choice.loads_ahead && rnd(0, 1);
  shape.channels = wide ? 8 * rnd(17, 40) : rnd(0, 2) ? 8 * rnd(1, 5) : rnd(1, 40);
  // Rows > 128: several row blocks; wide rows: at least 4 a thread.
  shape.rows = wide ? rnd(64, 160) : rnd(0, 2) ? rnd(2, 120) : rnd(129, 700);
  Checker check;
  cudaError_t forward_err, backward_err, moments_err, pool_err;
  forward_case(shape, choice, check, forward_err);
  backward_case(shape, choice, index % 4 == 1, check, backward_err);
  moments_case(shape, choice, check, moments_err);
  max_pool_case(shape, choice, check, pool_err);
  check.bad += forward_err != cudaSuccess || backward_err != cudaSuccess || moments_err != cudaSuccess ||
               pool_err != cudaSuccess;
  if (check.bad)
    printf("batch norm case %d FAILED: errors %d %d %d %d, rows=%ld channels=%ld type=%d loads ahead=%d finish by "
           "lines=%d\n", index, int(forward_err), int(backward_err), int(moments_err), int(pool_err),
           long(shape.rows), long(shape.channels), int(shape.type), int(choice.loads_ahead),
           int(choice.finish_by_lines));
  return check.bad;
}

// The finish by lines (norm/batch_norm_line_finish.cuh) over more row blocks
// than its 128 lanes, so that lanes sum several and every warp holds some:
// 301 blocks of 13 fp32 channels one at a time (two blocks of channels, the
// second of 5); the most, 1024 (8 a lane), of 8 fp16 channels; 140 of 72
// bf16 channels in 16-byte runs with the loads ahead. Forward and backward;
// the same exact values as batch_norm_case's. Run after every other case
// set, so that those draw as they did without it.
bool batch_norm_line_finish_case(int index) {
  constexpr struct {
    ElementType type;
    int64_t channels, rows;
    bool loads_ahead;
  } kCases[] = {{ElementType::kFloat32, 13, 128 * 300 + 77, false},
                {ElementType::kFloat16, 8, 128 * 1024 + 5, false},
                {ElementType::kBFloat16, 72, 128 * 140, true}};
  const auto& c = kCases[index];
  const BatchNormShape shape{c.rows, c.channels, c.type};
  const BatchNormKernelChoice choice{c.loads_ahead, true};
  Checker check;
  cudaError_t forward_err, backward_err;
  forward_case(shape, choice, check, forward_err);
  backward_case(shape, choice, false, check, backward_err);
  check.bad += forward_err != cudaSuccess || backward_err != cudaSuccess;
  if (check.bad)
    printf("batch norm line finish case %d FAILED: errors %d %d, %d row blocks\n", index, int(forward_err),
           int(backward_err), batch_norm_row_blocks(shape));
  return check.bad;
}
