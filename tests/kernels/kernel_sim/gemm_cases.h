// The GEMM cases the drivers of the kernel simulation share (driver.cpp,
// hopper_cases.cpp): a random problem, steered by a spec, launched on the
// launcher's plan or a given one, its output checked against a reference.
#pragma once

#include "gemm/launch.h"
#include "plan/gemm_plan.h"

namespace sim {

using mpgemm::kernels::GemmPlan;
using mpgemm::kernels::GemmShape;

// What a GEMM case may pin down; the rest is random. A plan with no
// `config` is the launcher's own (plan_gemm: the heuristic on the simulated
// device); with one, that plan is launched as given.
struct GemmCaseSpec {
  int64_t min_m = 0, max_m = 200, min_n = 0, max_n = 200, min_k = 0, max_k = 100;  // a min of 0: sometimes <= 16
  int64_t batch = 0;        // 0: random in [1, 3]
  int aligned = -1;         // -1: random
  // Contiguous extents in whole chunks of the load width, as the narrow
  // cp.async paths need; false leaves them anything (the copy engine takes
  // any extent).
  bool whole_chunks = true;
  // Operands the copy engine can describe (plan/operand_layout.h's
  // tma_describable) wherever they are aligned: every row pitch at least the
  // row, and batch strides of 0 or at least a whole padded matrix. False
  // mixes in operands only the WMMA tiles take: rows that all repeat one
  // (ld = 0), and matrices whose batch stride reaches into the padding of the
  // one before.
  bool copyable_operands = false;
  // D with a 16-byte aligned base and pitches, which the Hopper kernel's
  // epilogue stores through the copy engine; false leaves them anything.
  bool d_copyable = false;
  // D's base 1 to 3 elements past a 16-byte boundary: no tensor map describes it.
  bool d_misaligned = false;
  // D's type: any of the three, fp32 or the inputs' own (what the ops make,
  // and the only types the Hopper kernels store), or the other 16-bit type.
  enum class OutputType { kAny, kOpsOwn, kOther16Bit } d_type = OutputType::kAny;
  // Operand layouts: -1 random (or by the case's index, see gemm_case), 1
  // row-major, 0 column-major.
  int a_row_major = -1, b_row_major = -1;
  // Asks the launcher for the pre-activation too (GemmParams::pre_activation,
  // laid out as D, poisoned), under GELU or ReLU, and checks it.
  bool pre_activation = false;
  // With pre_activation: GELU's tanh form as the activation, which only the
  // Hopper pre-activation kernel built for it applies.
  bool gelu_tanh = false;
  // Asks the launcher for D = (A @ B) times GELU's or ReLU's derivative at
  // an activation input Z (GemmParams::activation_input, laid out as D, of
  // the inputs' type; zeros among it), with no bias, a single matrix, D of
  // the inputs' type.
  bool activation_grad = false;
  // Z's base as far into its buffer as D's (its pairs aligned where D's
  // are); false puts it an element further in one case of two.
  bool activation_input_aligned = false;
  // Asks the launcher for A's row sums too (GemmParams::a_row_sums, in a
  // poisoned buffer with room past m) and checks them; batch 1 unless set.
  bool a_row_sums = false;
  bool has_plan = false;
  GemmPlan plan;
  cudaError_t expect = cudaSuccess;  // for a plan the launcher must refuse
  int expect_split_k = 0;            // for the launcher's own plan; 0: any
};

// Every case on one pair of operand layouts and fp16 inputs, where `on`: the
// one kernel a planted bug's build holds (test_kernel_sim.py).
struct PinnedKernel {
  bool on = false;
  bool a_row_major = true, b_row_major = false;
};
inline PinnedKernel pinned;

// Runs one case; whether it failed (and then prints why). `ran`, if given,
// receives the plan it ran on, and `shape` the problem's shape.
bool gemm_case(const char* kind, int index, const GemmCaseSpec& spec, GemmPlan* ran = nullptr,
               GemmShape* shape = nullptr);

}  // namespace sim
