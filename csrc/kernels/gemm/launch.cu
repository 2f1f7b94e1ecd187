// Host-side dispatch of the GEMM: the problem's shape and plan (plan/), the
// copies of a padded plan's operands, then the launch of the plan's tile (the
// WMMA tiles of wmma/ or the Hopper kernels of sm90/, split-K and stream-K ones included)
// and, for split-K, of the reduction; where the pre-activation is asked for
// and no epilogue stores it, the product again (GELU's tanh form, which
// only its own epilogue applies, refused there); where A's row sums are, the
// plan's Hopper kernel that sums them; where an activation's derivative
// multiplies the product, the Hopper kernel that does it in its epilogue,
// split-K's reduction, or the pass that does it after the product.
#include <climits>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/launch_utils.h"
#include "common/math.h"
#include "gemm/launch.h"
#include "gemm/splitk_reduce.h"
#include "sm90/launch.h"
#include "wmma/launch.h"

namespace mpgemm::kernels {
namespace {

// One operand of a GEMM (A: rows m, cols k; B: k, n) as launch_gemm may point it elsewhere.
struct OperandRef {
  const void*& data;
  int64_t &batch_stride, &row_stride, &col_stride;
  int64_t rows, cols;
};

// Copies the operand's matrices run by run (its rows if row-major, else its
// columns) into `into`, each run's start a multiple of 8 elements (16 bytes)
// from the first, so that the copy engine can describe the copy, and points
// the operand at it; `into` moves on past it. A copy of 2D strided memory,
// no kernel of its own: one for the whole batch where its matrices follow
// each other run after run, else one per matrix.
cudaError_t copy_to_aligned_pitch(OperandRef o, int64_t batch, unsigned char*& into, cudaStream_t stream) {
  const bool row_major = o.col_stride == 1;
  const int64_t inner = row_major ? o.cols : o.rows, outer = row_major ? o.rows : o.cols;
  const int64_t ld = row_major ? o.row_stride : o.col_stride, pitch = round_up(inner, 8);
  const int64_t matrices = o.batch_stride == 0 ? 1 : batch;
  const bool runs_follow = matrices == 1 || o.batch_stride == outer * ld;
  const int64_t copies = runs_follow ? 1 : matrices, runs = runs_follow ? matrices * outer : outer;
  const auto* source = static_cast<const unsigned char*>(o.data);
  for (int64_t c = 0; c < copies; ++c)
    if (const cudaError_t err = cudaMemcpy2DAsync(into + c * outer * pitch * 2, size_t(pitch) * 2,
                                                  source + c * o.batch_stride * 2, size_t(ld) * 2,
                                                  size_t(inner) * 2, size_t(runs), cudaMemcpyDeviceToDevice, stream);
        err != cudaSuccess)
      return err;
  o.data = into;
  (row_major ? o.row_stride : o.col_stride) = pitch;
  o.batch_stride = matrices > 1 ? outer * pitch : 0;
  into += round_up(matrices * outer * pitch * 2, 256);
  return cudaSuccess;
}

// Whether the operands are K-major: A row-major, B column-major (B^T
// row-major, as nn.Linear's weight). Row-major wins when both strides are 1
// (a single row or column).
bool a_is_k_major(const GemmParams& p) { return p.a_col_stride == 1; }
bool b_is_k_major(const GemmParams& p) { return p.b_col_stride != 1; }

// The bytes of the split row sums' kernel's partial row sums, which follow
// the plan's own workspace.
size_t row_sum_partial_bytes(const GemmParams& p, const GemmLaunch& launch) {
  return a_row_sums_from_mainloop(p, launch) && launch.plan.split_k > 1
             ? size_t(launch.plan.split_k) * size_t(p.m) * sizeof(float)
             : 0;
}

bool any_whole_k_epilogue_kernel(const GemmParams& p, const GemmLaunch& launch);

// The launch with its workspace: the plan's, and the partial row sums'. A
// stream-K plan whose product runs one of the whole-K kernels that store or
// read beside D (any_whole_k_epilogue_kernel) is whole K, and takes no slots.
GemmLaunch with_workspace(const GemmParams& p, const GemmShape& shape, const GemmPlan& plan) {
  GemmLaunch launch{shape, plan, 0};
  if (launch.plan.stream_k_blocks > 0 && any_whole_k_epilogue_kernel(p, launch)) launch.plan.stream_k_blocks = 0;
  launch.workspace_bytes = workspace_bytes(shape, launch.plan) + row_sum_partial_bytes(p, launch);
  return launch;
}

// Whether the plan's product runs the wide tile's whole-K kernel that
// stores GELU's input, multiplies by an activation's derivative, or a Hopper
// tile's that sums A's rows.
bool any_whole_k_epilogue_kernel(const GemmParams& p, const GemmLaunch& launch) {
  return pre_activation_from_epilogue(p, launch) || activation_grad_from_epilogue(p, launch) ||
         (a_row_sums_from_mainloop(p, launch) && launch.plan.split_k == 1);
}

// GELU's tanh form with its input stored too (mlp's GPT-2 form) on the
// heuristic's whole-K Hopper plan (the 128 x 256 tile or ping-pong pairs) of
// K-major operands: ping-pong pairs, whose kernel alone applies it, so that
// one consumer's tanh and two stores run while the other's products do (on
// blocks alone both consumers would stop for them: the erf form's epilogue
// took the 128 x 256 tile's forward from 3.34 to 3.80 ms at 16384 x 16384 x
// 4096, H200, fe39419, more than torch's pass of 0.25 ms). `plan` otherwise.
GemmPlan gelu_tanh_plan(const GemmParams& p, const GemmShape& shape, const DeviceLimits& device, GemmPlan plan) {
  const bool whole_k_hopper = (plan.config == TileConfigId::kWgmma || plan.config == TileConfigId::kWgmmaPingPong) &&
                              plan.split_k == 1 && plan.stream_k_blocks == 0 && !plan.padded && !plan.tuned;
  if (p.activation != Activation::kGeluTanh || p.pre_activation == nullptr || !whole_k_hopper ||
      gemm_path() != GemmPath::kAuto || !a_is_k_major(p) || !b_is_k_major(p) ||
      !admissible(shape, device, TileConfigId::kWgmmaPingPong, 1))
    return plan;
  plan.config = TileConfigId::kWgmmaPingPong;
  return plan;
}

}  // namespace

GemmLaunch plan_gemm(const GemmParams& p, const GemmPlan& plan) { return with_workspace(p, gemm_shape(p), plan); }

GemmLaunch plan_gemm(const GemmParams& p) {
  const DeviceLimits device = device_limits();
  GemmShape shape = gemm_shape(p);
  // A Hopper GPU running a build without sm_90a code (an arch list without
  // 9.0) takes the WMMA tiles: the Hopper kernels there are empty.
  if (device.arch == 90 && !wgmma_available()) {
    shape.wgmma = false;
    shape.a_copies = shape.b_copies = 0;
  }
  return with_workspace(p, shape, gelu_tanh_plan(p, shape, device, plan_gemm(shape, device)));
}

bool pre_activation_from_epilogue(const GemmParams& p, const GemmLaunch& launch) {
  // GELU's tanh form has its kernel on ping-pong pairs alone (gelu_tanh_plan).
  const TileConfigId kernel_tile =
      p.activation == Activation::kGeluTanh ? TileConfigId::kWgmmaPingPong : TileConfigId::kWgmma;
  return p.pre_activation != nullptr && launch.plan.config == kernel_tile && launch.plan.split_k == 1 &&
         a_is_k_major(p) && b_is_k_major(p);
}

bool activation_grad_from_epilogue(const GemmParams& p, const GemmLaunch& launch) {
  const TileConfigId tile = launch.plan.config;
  return p.activation_input != nullptr && (tile == TileConfigId::kWgmma || tile == TileConfigId::kWgmmaPingPong) &&
         launch.plan.split_k == 1 && p.d_type == p.ab_type && a_is_k_major(p) && !b_is_k_major(p);
}

bool a_row_sums_from_mainloop(const GemmParams& p, const GemmLaunch& launch) {
  return p.a_row_sums != nullptr && p.pre_activation == nullptr && is_wgmma(launch.plan.config) &&
         !launch.plan.padded && p.batch == 1 && p.n > 0 && p.k > 0 && !a_is_k_major(p) && !b_is_k_major(p);
}

cudaError_t launch_gemm(const GemmParams& p, const GemmLaunch& launch, void* workspace, cudaStream_t stream) {
  // Row sums asked of an empty D (n = 0) have rows to sum and no kernel to sum them.
  if (p.a_row_sums != nullptr && p.batch > 0 && p.m > 0 && !a_row_sums_from_mainloop(p, launch))
    return cudaErrorInvalidValue;
  if (p.activation_input != nullptr &&
      (p.batch != 1 || p.bias != nullptr || p.pre_activation != nullptr || p.a_row_sums != nullptr))
    return cudaErrorInvalidValue;
  // GELU's tanh form has a derivative in the kernels, and one forward
  // epilogue: the Hopper pre-activation kernel's (the ops run torch's pass
  // elsewhere).
  if (p.activation == Activation::kGeluTanh && p.activation_input == nullptr &&
      !pre_activation_from_epilogue(p, launch))
    return cudaErrorInvalidValue;
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return cudaSuccess;
  const bool a_k_major = a_is_k_major(p), b_k_major = b_is_k_major(p);
  if ((!a_k_major && p.a_row_stride != 1) || (b_k_major && p.b_row_stride != 1)) return cudaErrorInvalidValue;
  const GemmPlan& plan = launch.plan;
  const GemmShape& shape = launch.shape;
  if (shape.batch != p.batch || shape.m != p.m || shape.n != p.n || shape.k != p.k) return cudaErrorInvalidValue;
  // Whether the device holds the tile is prepare_launch's to say (and whether
  // it runs the Hopper path's sm_90a code, launch_wgmma_gemm's).
  const int any_arch = is_wgmma(plan.config) ? 90 : INT_MAX;
  const DeviceLimits any_device{INT_MAX, INT_MAX, any_arch};
  const bool stream_k = plan.stream_k_blocks > 0;
  if (!admissible(shape, any_device, plan.config, plan.split_k) || plan.raster_group < 1 ||
      plan.padded != (is_wgmma(plan.config) && !shape.wgmma) || plan.stream_k_blocks < 0 ||
      (stream_k && (!has_stream_k_kernels(plan.config) || plan.split_k != 1 || p.batch != 1)) ||
      ((plan.split_k > 1 || plan.padded || stream_k) && (workspace == nullptr || !aligned16(workspace))))
    return cudaErrorInvalidValue;
  const size_t row_sum_bytes = row_sum_partial_bytes(p, launch);
  if ((p.a_row_sums != nullptr || stream_k) && launch.workspace_bytes < workspace_bytes(shape, plan) + row_sum_bytes)
    return cudaErrorInvalidValue;
  // The plan_gemm calls leave stream-K out where a whole-K kernel with extras runs.
  if (stream_k && any_whole_k_epilogue_kernel(p, launch)) return cudaErrorInvalidValue;
  // The problem as the kernels run it: a padded plan's on copies of the
  // operands the shape marks, made at the workspace's start; split-K's
  // partial sums, or stream-K's slots, after them (plan/gemm_plan.h's
  // workspace_bytes).
  GemmParams run = p;
  auto* free_workspace = static_cast<unsigned char*>(workspace);
  auto* partials = reinterpret_cast<float*>(free_workspace + padded_copy_bytes(shape, plan));
  if (plan.padded) {
    OperandRef a{run.a, run.a_batch_stride, run.a_row_stride, run.a_col_stride, p.m, p.k};
    OperandRef b{run.b, run.b_batch_stride, run.b_row_stride, run.b_col_stride, p.k, p.n};
    for (const auto& [operand, copied] : {std::pair{a, shape.a_copies > 0}, std::pair{b, shape.b_copies > 0}})
      if (copied)
        if (const cudaError_t err = copy_to_aligned_pitch(operand, p.batch, free_workspace, stream); err != cudaSuccess)
          return err;
  }
  const GemmGrid work{plan.raster_group, plan.split_k, partials};
  if (pre_activation_from_epilogue(p, launch)) return launch_wgmma_pre_activation_gemm(run, work.raster_group, stream);
  if (activation_grad_from_epilogue(p, launch))
    return plan.config == TileConfigId::kWgmmaPingPong
               ? launch_wgmma_activation_grad_gemm<WgmmaPingPongTile>(run, work.raster_group, stream)
               : launch_wgmma_activation_grad_gemm<WgmmaTile>(run, work.raster_group, stream);
  if (p.a_row_sums != nullptr) {
    // The row sums' partials after split-K's (stored a float at a time).
    float* row_sum_partials = plan.split_k > 1 ? partials + plan.split_k * p.m * p.n : nullptr;
    const cudaError_t err = with_tile(
        GemmTiles{}, plan.config,
        [&](auto tile) {
          using Tile = decltype(tile);
          if constexpr (Tile::kWgmma)
            return launch_wgmma_row_sums_gemm<Tile>(run, work.raster_group, work.split_k, partials, row_sum_partials,
                                                    stream);
          return cudaErrorInvalidValue;
        },
        cudaErrorInvalidValue);
    if (err != cudaSuccess || plan.split_k == 1) return err;
    if (const cudaError_t reduce = launch_splitk_reduce(run, partials, plan.split_k, stream); reduce != cudaSuccess)
      return reduce;
    return launch_row_sums_reduce(p.a_row_sums, row_sum_partials, p.m, plan.split_k, stream);
  }
  // The plan's kernel (and split-K's reduction) on q.
  const auto launch_plan = [&](const GemmParams& q) {
    const cudaError_t err = with_tile(
        GemmTiles{}, plan.config,
        [&](auto tile) {
          using Tile = decltype(tile);
          if constexpr (Tile::kWgmma) {
            if constexpr (kHasSplitKernels<Tile>) {
              if (work.split_k > 1)
                return launch_wgmma_splitk_gemm<Tile>(q, work.raster_group, work.split_k, work.partials, a_k_major,
                                                      b_k_major, stream);
            }
            if constexpr (has_stream_k_kernels(Tile::kId)) {
              if (stream_k)
                return launch_wgmma_stream_k_gemm<Tile>(q, work.raster_group, plan.stream_k_blocks, work.partials,
                                                        a_k_major, b_k_major, stream);
            }
            return launch_wgmma_gemm<Tile>(q, work.raster_group, a_k_major, b_k_major, stream);
          } else {
            return launch_tile<Tile>(q, work, shape.vector, stream, a_k_major, b_k_major);
          }
        },
        cudaErrorInvalidValue);
    if (err != cudaSuccess || plan.split_k == 1) return err;
    return launch_splitk_reduce(q, work.partials, work.split_k, stream);
  };
  if (p.activation_input != nullptr && plan.split_k == 1) {
    // The product into D, then the pass that multiplies it (split-K's
    // reduction multiplies the partial sums itself).
    GemmParams product = run;
    product.activation = Activation::kNone;
    product.activation_input = nullptr;
    if (const cudaError_t err = launch_plan(product); err != cudaSuccess) return err;
    return launch_activation_grad_pass(run, stream);
  }
  run.pre_activation = nullptr;
  if (const cudaError_t err = launch_plan(run); err != cudaSuccess || p.pre_activation == nullptr) return err;
  // Where the epilogue cannot store the pre-activation: the same product
  // again with no activation, into it (on the same copies and workspace,
  // which the stream's order frees for it).
  GemmParams again = run;
  again.activation = Activation::kNone;
  again.d = p.pre_activation;
  return launch_plan(again);
}

}  // namespace mpgemm::kernels
