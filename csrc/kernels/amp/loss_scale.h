// Dynamic loss scaling's update after a step, as one function that the CPU
// op and the one-thread CUDA kernel (amp/loss_scale.cu) both run, so that
// the scale and its counters live on the device and a training step never
// waits on it: a step that overflowed (found_inf != 0) is counted as skipped
// and, after `hysteresis` of them in a row, backs the scale off (never below
// min_scale); `growth_interval` clean steps in a row grow it, unless the
// grown scale would overflow fp32 (as torch's GradScaler keeps it finite).
#pragma once

#include <cfloat>
#include <cstdint>

#include "common/host_device.h"

namespace mpgemm::kernels {

// The scaler's settings, as mpgemm.amp.LossScaler takes them.
struct LossScaleRule {
  float growth_factor = 2.0f, backoff_factor = 0.5f, min_scale = 1.0f;
  int64_t growth_interval = 2000, hysteresis = 1;
  bool dynamic = true;  // false: the scale stays; the counters still count
};

// The scaler's int64 counters, one tensor of kLossScaleCounters on the scale's device.
enum LossScaleCounter : int {
  kGrowthTracker = 0,    // clean steps since the scale last changed or a step overflowed
  kOverflowsInARow = 1,  // overflowing steps in a row not yet backed off (hysteresis)
  kSkippedSteps = 2,     // steps skipped since the scaler began
  kLastStepSkipped = 3,  // 1 if the last step overflowed
  kLossScaleCounters = 4,
};

MPGEMM_HOST_DEVICE void update_loss_scale(float* scale, int64_t* counters, float found_inf,
                                          const LossScaleRule& rule) {
  const bool overflow = found_inf != 0.0f;
  counters[kLastStepSkipped] = overflow;
  counters[kSkippedSteps] += overflow;
  if (!rule.dynamic) return;
  if (overflow) {
    counters[kGrowthTracker] = 0;
    if (++counters[kOverflowsInARow] >= rule.hysteresis) {
      const float backed_off = *scale * rule.backoff_factor;
      *scale = backed_off > rule.min_scale ? backed_off : rule.min_scale;
      counters[kOverflowsInARow] = 0;
    }
  } else {
    counters[kOverflowsInARow] = 0;
    if (++counters[kGrowthTracker] == rule.growth_interval) {
      const float grown = *scale * rule.growth_factor;
      if (grown <= FLT_MAX) *scale = grown;  // an infinite scale could never back off again
      counters[kGrowthTracker] = 0;
    }
  }
}

}  // namespace mpgemm::kernels
