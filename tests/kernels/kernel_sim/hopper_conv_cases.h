// The Hopper convolution's checks (hopper_conv_cases.cpp), which
// hopper_cases.cpp runs after the Hopper GEMM's.
#pragma once

// What the random convolution cases covered.
struct ConvCaseCounts {
  int on_wgmma = 0;         // cases on the Hopper path
  int by_default = 0;       // of those, on the default path (MPGEMM_CONV_PATH unset)
  int split = 0;            // wgrad's that split the sum
  int strided_dgrad = 0;    // dgrad's with a stride: one launch per phase
  int unreached_phase = 0;  // of those, with a phase no tap reaches
  int on_n128 = 0, on_n64 = 0;  // on the narrow tiles
  int on_m64 = 0;               // wgrad's on the 64-row tile (MPGEMM_M64_TILE=1)
  int split_on_m64 = 0;         // of those, that split the sum
  int folded = 0;               // on folded taps (conv/folded_taps.h)
  int folded_in_chunks = 0;     // of those, x folded in 16-byte chunks
  int folded_gathered = 0;      // of those, x's fold gathered by the producer
  int folded_on_m64 = 0;        // of those, wgrad's on the 64-row tile
  int staged_rows = 0;          // strided dgrad's with their rows staged
  int one_launch = 0;           // of those, with their phases in one launch
  int one_launch_unreached = 0;  // of those, with a phase no tap reaches
  int moments = 0;              // fprop's that wrote their column moments
  int addend = 0;               // dgrad's whose epilogue added an addend
};

// The im2col model's walk against the convolution's windows: how many
// elements it checked, counting mismatches.
int check_im2col_walk(int& mismatches);
// One random problem of pass index % 3 through plan_conv2d and
// launch_conv2d; whether it failed.
bool hopper_conv_case(int index, ConvCaseCounts& counts);
// One random few-channel fprop or wgrad (index % 2) with the Hopper
// convolution forced, which must run on folded taps (x's fold copied a
// thread per element, copied in 16-byte chunks, or gathered by the
// producer, by index % 6); whether it failed.
bool folded_conv_case(int index, ConvCaseCounts& counts);
// x's fold, a thread per element and in 16-byte chunks, against its
// definition on `geometries` random few-channel geometries; whether any
// element went wrong.
bool folds_of_x_wrong(int geometries);
// Whether a bad value of `variable` (MPGEMM_CONV_PATH,
// MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD,
// MPGEMM_GATHERED_FOLD, MPGEMM_M64_TILE, MPGEMM_DGRAD_ADDEND) was accepted.
bool bad_conv_variable_accepted(const char* variable, const char* value);
// Whether taps at the im2col offsets' limit went wrong.
bool far_taps_wrong();
// fprop's column moments on each Hopper tile, counted in counts.moments.
bool tile_moments_wrong(ConvCaseCounts& counts);
// Whether wgrad's split counts for ResNet-50's layers on 132
// multiprocessors differ from the cost model's, on either convolution.
bool wgrad_splits_wrong();
