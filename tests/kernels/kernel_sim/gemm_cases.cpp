// GEMM cases of the kernel simulation (gemm_cases.h).
#include "kernel_sim/gemm_cases.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/epilogue_math.h"
#include "kernel_sim/sim_common.h"

using namespace mpgemm::kernels;

namespace sim {
namespace {

// A batch of fp16 or bf16 (rows x cols) matrices, row- or column-major, with
// padded rows and batch stride 0 for broadcast, and, unless `copyable` (see
// GemmCaseSpec::copyable_operands), now and then repeated (ld = 0) rows or a
// batch stride into the padding of the matrix before. `align` (8, 4 or 2
// elements) makes the base, ld and batch stride multiples of it and the base
// no multiple of twice it (below 8), so that the launcher loads chunks of
// exactly `align` elements; 1 leaves them anything.
struct Operand {
  std::unique_ptr<Buffer> mem;
  void* data;
  ElementType type;
  int64_t bs, rs, cs;
  float at(int64_t b, int64_t i, int64_t j) const { return get(data, type, b * bs + i * rs + j * cs); }
};

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

Operand make_operand(ElementType type, int64_t batch, int64_t rows, int64_t cols, bool row_major, int64_t align,
                     bool copyable) {
  const int64_t inner = row_major ? cols : rows, outer = row_major ? rows : cols;
  int64_t ld = align > 1 ? round_up(inner, align) + align * rnd(0, 1) : inner + rnd(0, 3);
  if (rnd(0, 15) == 0 && !copyable) ld = 0;
  const int64_t footprint = inner && outer ? (outer - 1) * ld + inner : 0;
  const int64_t bs = rnd(0, 3) == 0 ? 0 : round_up(copyable ? outer * ld : footprint, align) + align * rnd(0, 1);
  const int64_t offset = align == 8 ? 0 : align > 1 ? align * (2 * rnd(0, 3 / align) + 1) : rnd(0, 7);
  const int64_t extent = footprint ? (batch - 1) * bs + footprint : 0;
  Operand o{std::make_unique<Buffer>((offset + extent) * 2), nullptr, type, bs, row_major ? ld : 1,
            row_major ? 1 : ld};
  o.data = o.mem->p + 2 * offset;
  for (int64_t b = 0; b < (bs ? batch : 1); ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) set(o.data, type, b * bs + i * o.rs + j * o.cs, rnd(-8, 8) / 8.0f);
  return o;
}

}  // namespace

bool gemm_case(const char* kind, int index, const GemmCaseSpec& spec, GemmPlan* ran, GemmShape* shape) {
  const int64_t batch = spec.batch ? spec.batch : spec.a_row_sums || spec.activation_grad ? 1 : rnd(1, 3);
  int64_t m = spec.min_m ? rnd(spec.min_m, spec.max_m) : rnd(0, 3) ? rnd(1, spec.max_m) : rnd(1, 16);
  int64_t n = spec.min_n ? rnd(spec.min_n, spec.max_n) : rnd(0, 3) ? rnd(1, spec.max_n) : rnd(1, 16);
  int64_t k = spec.min_k || rnd(0, 7) ? rnd(spec.min_k, spec.max_k) : 0;
  // Without a pinned alignment, every 16 cases run each load width (16, 8, 4
  // and 2 bytes, then one element) with each layout.
  const int64_t align = spec.aligned == 1 ? 8 : spec.aligned == 0 ? 1 : 8 >> index % 4;
  // Pinned, the layouts of the pinned kernels; but a row sums case keeps its own, those of the row sums' kernel,
  // and an activation derivative's case those of its kernel.
  const bool own_layouts = spec.a_row_sums || spec.activation_grad;
  const bool a_row = pinned.on && !own_layouts ? pinned.a_row_major
                     : spec.a_row_major >= 0      ? spec.a_row_major == 1
                     : spec.aligned < 0           ? index / 4 % 2
                                                  : rnd(0, 1);
  const bool b_row = pinned.on && !own_layouts ? pinned.b_row_major
                     : spec.b_row_major >= 0      ? spec.b_row_major == 1
                     : spec.aligned < 0           ? index / 8 % 2
                                                  : rnd(0, 1);
  if (align > 1 && spec.whole_chunks) {  // contiguous extents in whole chunks; the others stay odd where they fall so
    (a_row ? k : m) = round_up(a_row ? k : m, align);
    (b_row ? n : k) = round_up(b_row ? n : k, align);
  }
  // Now and then bf16 below sm_80 too, which must be refused.
  const ElementType ab_type = pinned.on                              ? ElementType::kFloat16
                              : __CUDA_ARCH__ < 800 && rnd(0, 7) == 0 ? ElementType::kBFloat16
                                                                      : sim::input_type();
  const bool refused = spec.expect != cudaSuccess || (ab_type == ElementType::kBFloat16 && __CUDA_ARCH__ < 800);
  const cudaError_t expect = spec.expect != cudaSuccess ? spec.expect : refused ? cudaErrorNotSupported : cudaSuccess;
  const Operand a = make_operand(ab_type, batch, m, k, a_row, align, spec.copyable_operands);
  const Operand b = make_operand(ab_type, batch, k, n, b_row, align, spec.copyable_operands);

  GemmParams p;
  p.batch = batch, p.m = m, p.n = n, p.k = k;
  p.ab_type = ab_type;
  p.a = a.data, p.a_batch_stride = a.bs, p.a_row_stride = a.rs, p.a_col_stride = a.cs;
  p.b = b.data, p.b_batch_stride = b.bs, p.b_row_stride = b.rs, p.b_col_stride = b.cs;
  const sim::Bias bias(spec.activation_grad ? 0 : rnd(0, 3), n);
  p.bias = bias.data(), p.bias_type = bias.type;
  // A derivative's: ReLU's, GELU's or GELU's tanh form's; a forward's GELU tanh form only where the spec asks.
  p.activation = spec.activation_grad   ? Activation(rnd(1, 3))
                 : spec.gelu_tanh        ? Activation::kGeluTanh
                 : spec.pre_activation ? Activation(rnd(1, 2))
                                        : Activation(rnd(0, 2));
  using OutputType = GemmCaseSpec::OutputType;
  const ElementType other_16_bit =
      ab_type == ElementType::kFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
  // An activation's derivative: D of the inputs' type, as _gemm_activation_grad makes it.
  p.d_type = spec.activation_grad                      ? ab_type
             : spec.d_type == OutputType::kOpsOwn       ? (rnd(0, 1) ? ElementType::kFloat32 : ab_type)
             : spec.d_type == OutputType::kOther16Bit ? other_16_bit
                                                      : sim::any_type();
  const int64_t esize = sim::bytes_of(p.d_type);
  const int64_t d_offset = spec.d_misaligned ? rnd(1, 3) : spec.d_copyable || rnd(0, 1) ? 0 : rnd(1, 3);
  if (spec.d_copyable) {
    const int64_t per16 = 16 / esize;
    p.d_row_stride = round_up(n, per16) + per16 * rnd(0, 1);
    p.d_batch_stride = round_up(m * p.d_row_stride, per16) + per16 * rnd(0, 1);
  } else {
    p.d_row_stride = n + (rnd(0, 1) ? 0 : rnd(1, 5));
    p.d_batch_stride = m * p.d_row_stride + rnd(0, 2);
  }
  Buffer d(esize * (d_offset + (batch - 1) * p.d_batch_stride + (m - 1) * p.d_row_stride + n));
  p.d = d.p + esize * d_offset;
  // The pre-activation, laid out as D (its base as far into its buffer), poisoned likewise.
  Buffer z(spec.pre_activation ? d.size : 1);
  if (spec.pre_activation) p.pre_activation = z.p + esize * d_offset;
  // The activation's input, laid out as D, of the inputs' type: its base as far into its buffer, or (one case
  // in two, unless the spec aligns it) an element further, so that Z's pairs may be misaligned where D's are not.
  const int64_t z_shift = spec.activation_grad ? rnd(0, 1) : 0;
  const int64_t z_offset = d_offset + (spec.activation_input_aligned ? 0 : z_shift);
  Buffer activation_input(spec.activation_grad ? 2 * (d.size / esize + 1) : 1);
  if (spec.activation_grad) {
    p.activation_input = activation_input.p + 2 * z_offset;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        set(activation_input.p, ab_type, z_offset + i * p.d_row_stride + j, rnd(0, 7) ? rnd(-24, 24) / 8.0f : 0.0f);
  }
  // A's row sums, poisoned, 8 past m that must stay so.
  Buffer row_sums(spec.a_row_sums ? (m + 8) * sizeof(float) : 1);
  if (spec.a_row_sums) p.a_row_sums = reinterpret_cast<float*>(row_sums.p);

  sim::max_grid.y = rnd(0, 1) ? 65535 : rnd(1, 2);  // batch loop runs more than once
  const GemmLaunch launch = spec.has_plan ? plan_gemm(p, spec.plan) : plan_gemm(p);
  const GemmPlan& plan = launch.plan;
  if (ran) *ran = plan;
  if (shape) *shape = GemmShape{batch, m, n, k};
  // Split-K's partial sums, poisoned (0xff) like D.
  Buffer workspace(std::max<size_t>(launch.workspace_bytes, 1));
  const cudaError_t err = launch_gemm(p, launch, workspace.p, nullptr);
  const unsigned max_grid_y = sim::max_grid.y;
  sim::max_grid.y = 65535;  // the device's, for whatever the driver launches next
  // The derivative multiplies the fp32 sums (the Hopper epilogue, split-K's reduction) or D as stored (a pass).
  const bool product_once = activation_grad_from_epilogue(p, launch) || plan.split_k > 1;

  int bad = err != expect;
  if (spec.expect_split_k && plan.split_k != spec.expect_split_k && bad++ < 3)
    printf("  the heuristic chose split_k=%d, want %d\n", plan.split_k, spec.expect_split_k);
  std::vector<bool> written(d.size / esize, false);
  for (int64_t bi = 0; !refused && bi < batch; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t q = 0; q < k; ++q) sum += double(a.at(bi, i, q)) * b.at(bi, q, j);
        const int64_t e = d_offset + bi * p.d_batch_stride + i * p.d_row_stride + j;
        const float product = product_once ? float(sum) : sim::rounded(float(sum), p.d_type);
        const float want =
            spec.activation_grad
                ? sim::rounded(apply_activation_grad(p.activation, product,
                                                     get(activation_input.p, ab_type, e - d_offset + z_offset)),
                               p.d_type)
                : sim::rounded(p.activation == Activation::kGeluTanh ? gelu_tanh(float(sum) + bias.values[j])
                                                                     : apply_activation(p.activation,
                                                                                        float(sum) + bias.values[j]),
                               p.d_type);
        const float got = get(d.p, p.d_type, e);
        written[e] = true;
        if (!(got == want) && bad++ < 3) printf("  D[%ld][%ld][%ld] = %g, want %g\n", bi, i, j, got, want);
        if (!spec.pre_activation) continue;
        const float want_z = sim::rounded(float(sum) + bias.values[j], p.d_type), got_z = get(z.p, p.d_type, e);
        if (!(got_z == want_z) && bad++ < 3) printf("  Z[%ld][%ld][%ld] = %g, want %g\n", bi, i, j, got_z, want_z);
      }
  for (int64_t i = 0; spec.a_row_sums && i < m + 8; ++i) {
    float want = 0.0f;  // exact: a sum of multiples of 1/8
    for (int64_t q = 0; i < m && q < k; ++q) want += a.at(0, i, q);
    const float got = get(row_sums.p, ElementType::kFloat32, i);
    const bool poisoned = reinterpret_cast<const uint32_t*>(row_sums.p)[i] == 0xffffffffu;
    if (i < m && !refused ? !(got == want) : !poisoned) {
      if (bad++ < 3) printf("  row sum %ld = %g, want %s\n", long(i), got, i < m && !refused ? "the sum" : "untouched");
    }
  }
  for (size_t e = 0; e < written.size(); ++e)
    for (int64_t byte = 0; !written[e] && byte < esize; ++byte) {
      if (d.p[e * esize + byte] != 0xff && bad++ < 3) printf("  wrote outside D, element %zu\n", e);
      if (spec.pre_activation && z.p[e * esize + byte] != 0xff && bad++ < 3)
        printf("  wrote outside the pre-activation, element %zu\n", e);
    }
  if (bad)
    printf("%s case %d FAILED: err=%d align=%ld ab_type=%d batch=%ld m=%ld n=%ld k=%ld A(%ld,%ld,%ld) B(%ld,%ld,%ld) "
           "bias=%d bias_type=%d act=%d d_type=%d d_offset=%ld ldd=%ld pre_activation=%d a_row_sums=%d "
           "activation_grad=%d "
           "multiprocessors=%d shared_limit=%zu max_grid_y=%u plan: %s split_k=%d raster_group=%d\n",
           kind, index, int(err), align, int(ab_type), batch, m, n, k, a.bs, a.rs, a.cs, b.bs, b.rs, b.cs, bias.present,
           int(p.bias_type), int(p.activation), int(p.d_type), d_offset, p.d_row_stride, int(spec.pre_activation),
           int(spec.a_row_sums), int(spec.activation_grad), sim::multiprocessors, sim::shared_limit, max_grid_y, tile_config(plan.config).name, plan.split_k,
           plan.raster_group);
  return bad;
}

}  // namespace sim
