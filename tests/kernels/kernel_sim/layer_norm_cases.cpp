// Random cases of layer norm's passes (csrc/kernels/norm/layer_norm.cu)
// against references computed here with the same functions and sums in the
// same order (norm/layer_norm_math.h's), so that every result must match bit
// for bit. Outputs and the workspace start as NaN: a value a pass leaves
// unwritten fails. Columns that are a multiple of 8 take 16-byte runs unless
// one row tensor starts an element off a 16-byte boundary (then runs of one,
// as any other column count); rows from none to past two slabs of the
// weights' sums (256 rows each), and past a block's 8 rows.
#include <cstdio>
#include <deque>
#include <vector>

#include "kernel_sim/sim_common.h"
#include "norm/layer_norm.h"

using namespace mpgemm::kernels;
using sim::Buffer;
using sim::rnd;

namespace {

std::vector<float> random_floats(int64_t count, int spread, float center = 0.0f) {
  std::vector<float> v(count);
  for (float& e : v) e = center + float(rnd(-spread * 64, spread * 64)) / 64.0f;
  return v;
}

}  // namespace

bool layer_norm_case(int index) {
  const ElementType type = sim::input_type();
  const int64_t rows = rnd(0, 2) ? rnd(0, 40) : rnd(515, 600);
  const int64_t cols = rnd(0, 1) ? 8 * rnd(1, 40) : rnd(1, 40);
  const int misaligned = rnd(0, 3) == 0 ? int(rnd(0, 3)) : -1;  // x, y, dy or dx off a 16-byte boundary
  const bool weight = rnd(0, 3) != 0, bias = rnd(0, 2) != 0;
  const float eps = rnd(0, 1) ? 1e-5f : 1e-2f;
  std::deque<sim::OffsetElements> t;  // not moved as it grows: each holds its Buffer
  for (int i = 0; i < 4; ++i) t.emplace_back(type, rows * cols, i == misaligned);
  sim::OffsetElements &x = t[0], &y = t[1], &dy = t[2], &dx = t[3];
  // Rows with an offset (mean) of up to 4 and a spread of up to 8.
  for (int64_t r = 0; r < rows; ++r) {
    const float center = float(rnd(-4, 4)), spread = float(rnd(1, 8));
    for (int64_t i = 0; i < cols; ++i) {
      sim::set(x.data(), type, r * cols + i, center + spread * float(rnd(-64, 64)) / 64.0f);
      sim::set(dy.data(), type, r * cols + i, float(rnd(-128, 128)) / 32.0f);
    }
  }
  const std::vector<float> w = random_floats(cols, 1, 1.0f), b = random_floats(cols, 2);
  Buffer mean(rows * 4 + 4), rstd(rows * 4 + 4), grad_weight(cols * 4), grad_bias(cols * 4),
      workspace(layer_norm_workspace_floats(rows, cols) * 4 + 4);
  LayerNormTensors args;
  args.rows = rows, args.cols = cols, args.type = type, args.eps = eps;
  args.x = x.data(), args.y = y.data();
  args.weight = weight ? w.data() : nullptr, args.bias = bias ? b.data() : nullptr;
  args.mean = reinterpret_cast<float*>(mean.p), args.rstd = reinterpret_cast<float*>(rstd.p);
  int bad = launch_layer_norm_forward(args, nullptr) != cudaSuccess;
  args.grad = dy.data(), args.grad_x = dx.data();
  args.grad_weight = reinterpret_cast<float*>(grad_weight.p), args.grad_bias = reinterpret_cast<float*>(grad_bias.p);
  args.workspace = reinterpret_cast<float*>(workspace.p);
  bad += launch_layer_norm_backward(args, nullptr) != cudaSuccess;
  const auto check = [&](const char* what, int64_t i, float got, float want) {
    if (!(got == want) && bad++ < 3) printf("  %s[%ld] = %.9g, want %.9g\n", what, long(i), got, want);
  };
  // The references, row by row (widths as the launcher picks them for each pass).
  const int forward_width = layer_norm_width(cols, {x.data(), y.data()});
  const int backward_width = layer_norm_width(cols, {x.data(), dy.data(), dx.data()});
  std::vector<float> xs(rows * cols), dys(rows * cols), row_dx(cols);
  for (int64_t i = 0; i < rows * cols; ++i) xs[i] = x[i], dys[i] = dy[i];
  for (int64_t r = 0; r < rows; ++r) {
    const LayerNormRowStats s = layer_norm_row_stats(&xs[r * cols], cols, forward_width, eps);
    check("mean", r, args.mean[r], s.mean);
    check("rstd", r, args.rstd[r], s.rstd);
    for (int64_t i = 0; i < cols; ++i)
      check("y", r * cols + i, y[r * cols + i],
            sim::rounded(layer_norm_output(xs[r * cols + i], s.mean, s.rstd, weight ? w[i] : 1.0f,
                                           bias ? b[i] : 0.0f), type));
    // backward reads the kernel's statistics (equal where the forward passed)
    layer_norm_row_grad(&xs[r * cols], &dys[r * cols], weight ? w.data() : nullptr, {args.mean[r], args.rstd[r]},
                        cols, backward_width, row_dx.data());
    for (int64_t i = 0; i < cols; ++i) check("dx", r * cols + i, dx[r * cols + i], sim::rounded(row_dx[i], type));
  }
  for (int64_t c = 0; c < cols; ++c) {
    float sum_dy_xhat, sum_dy;
    layer_norm_column_sums(
        rows, [&](int64_t r) { return xs[r * cols + c]; }, [&](int64_t r) { return dys[r * cols + c]; }, args.mean,
        args.rstd, sum_dy_xhat, sum_dy);
    check("sum of dy * xhat", c, args.grad_weight[c], sum_dy_xhat);
    check("sum of dy", c, args.grad_bias[c], sum_dy);
  }
  if (bad)
    printf("layer norm case %d FAILED: rows=%ld cols=%ld type=%d misaligned=%d weight=%d bias=%d widths=%d,%d\n",
           index, long(rows), long(cols), int(type), misaligned, int(weight), int(bias), forward_width,
           backward_width);
  return bad;
}
