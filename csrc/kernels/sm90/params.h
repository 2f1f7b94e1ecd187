// What the Hopper kernels take besides the problem (GemmParams) and the
// tensor maps: the tile order, each operand's batch rule, and how D is stored.
#pragma once

namespace mpgemm::kernels::sm90 {

struct WgmmaSchedule {
  int raster_group = 1;  // tile rows per group of the tile order (sm90/tile_scheduler.cuh)
  // A batch stride of 0 broadcasts one matrix, whose tensor map then has a batch extent of 1.
  bool a_broadcast = false, b_broadcast = false;
  bool d_pairs = false;  // D's rows and base allow two-element stores
  bool d_copy = false;   // D has a tensor map: the epilogue stores through the copy engine
};

}  // namespace mpgemm::kernels::sm90
