// The kernels' switches read from the environment at each plan (so that a
// test or benchmark may flip them between calls): MPGEMM_NARROW_TILES,
// MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH and MPGEMM_CHUNKED_FOLD
// (on unless "0"), MPGEMM_WGMMA_SPLIT_K (by the cost model unless "0" or
// "1"), MPGEMM_PADDED_OPERANDS, MPGEMM_DEPTHWISE_SLIDING_WGRAD and
// MPGEMM_DEPTHWISE_SLIDING_GATHER (opt-in: off unless "1"), among others.
// Host code, free of CUDA.
#pragma once

#include <optional>

namespace mpgemm::kernels {

// The switch in environment variable `name` as set: true for "1", false for
// "0", nullopt where it is unset or "". Throws std::invalid_argument, naming
// the variable and its value, for any other.
std::optional<bool> switch_setting(const char* name);

// Whether the switch in environment variable `name` is on: `by_default`
// where it is unset or "", else switch_setting's.
bool switch_on(const char* name, bool by_default);

}  // namespace mpgemm::kernels
