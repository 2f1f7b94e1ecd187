// 1x1 convolutions run as GEMMs (conv_gemm_cases.cpp), for both drivers of
// the simulation.
#pragma once

// What the cases covered.
struct ConvGemmCounts {
  int on_gemm = 0;   // planned as a GEMM
  int on_wgmma = 0;  // of those, on a Hopper kernel
  int split = 0;     // of those, splitting K
};

// One random 1x1 problem of pass index % 3 with MPGEMM_CONV_PATH=gemm;
// whether it failed.
bool conv_gemm_case(int index, ConvGemmCounts& counts);
