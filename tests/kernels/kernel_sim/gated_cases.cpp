// Random cases of the gated MLP's passes (csrc/kernels/gated/gated.cu)
// against references computed here with the same functions
// (gated/gated_math.h), so that every element must match bit for bit.
// Outputs start as NaN: an element a pass leaves unwritten fails. Counts
// leave a tail past the 16-byte runs; one tensor one element past an
// aligned address sends every element one at a time; counts past a block's
// threads take several blocks.
#include <cstdio>
#include <deque>

#include "gated/gated.h"
#include "kernel_sim/sim_common.h"

using namespace mpgemm::kernels;
using sim::rnd;

namespace {

// `count` random elements of `type` (the gate's across the activations'
// curve), at an offset of 0 or 1 element from a 16-byte boundary.
struct GatedTensor : sim::OffsetElements {
  using OffsetElements::OffsetElements;
  void fill(int64_t count, int spread) {
    for (int64_t i = 0; i < count; ++i) sim::set(data(), type, i, float(rnd(-spread * 64, spread * 64)) / 64.0f);
  }
};

}  // namespace

bool gated_case(int index) {
  const ElementType type = sim::input_type();
  const auto activation = GateActivation(rnd(0, 2));
  const int64_t count = rnd(0, 3) ? rnd(0, 300) : rnd(2040, 2100);  // past 256 threads' runs: blocks past the first
  const int misaligned = rnd(0, 3) == 0 ? int(rnd(0, 5)) : -1;  // which tensor starts off a 16-byte boundary
  std::deque<GatedTensor> t;  // not moved as it grows: each holds its Buffer
  for (int i = 0; i < 6; ++i) t.emplace_back(type, count, i == misaligned);
  GatedTensor &grad = t[0], &gate = t[1], &up = t[2], &out = t[3], &grad_gate = t[4], &grad_up = t[5];
  grad.fill(count, 4), gate.fill(count, 8), up.fill(count, 4);
  GatedTensors args;
  args.count = count, args.type = type, args.activation = activation;
  args.gate = gate.data(), args.up = up.data(), args.out = out.data();
  int bad = launch_gated_forward(args, nullptr) != cudaSuccess;
  const auto check = [&](const char* what, int64_t i, float got, float want) {
    const float rounded = sim::rounded(want, type);
    if (!(got == rounded) && bad++ < 3) printf("  %s[%ld] = %g, want %g\n", what, long(i), got, rounded);
  };
  for (int64_t i = 0; i < count; ++i) check("p", i, out[i], gate_value(activation, gate[i]) * up[i]);
  for (int64_t i = 0; i < count; ++i) sim::set(out.data(), type, i, NAN);
  args.grad = grad.data(), args.grad_gate = grad_gate.data(), args.grad_up = grad_up.data();
  bad += launch_gated_backward(args, nullptr) != cudaSuccess;
  for (int64_t i = 0; i < count; ++i) {
    const GatedGrads want = gated_grads(activation, grad[i], gate[i], up[i]);
    check("dg", i, grad_gate[i], want.grad_gate);
    check("du", i, grad_up[i], want.grad_up);
    check("p again", i, out[i], want.out);
  }
  if (bad)
    printf("gated case %d FAILED: count=%ld type=%d activation=%d misaligned=%d\n", index, long(count), int(type),
           int(activation), misaligned);
  return bad;
}
