// The operand rules of plan/operand_layout.h.
#include "plan/operand_layout.h"

#include <initializer_list>

#include "common/math.h"

namespace mpgemm::kernels {

MatrixLayout matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, int64_t batch,
                           int64_t batch_stride) {
  if (cols == 1 && rows > 1 && row_stride == 1) return {batch_stride, 1, rows, false};
  if (col_stride == 1 || cols == 1) return {batch_stride, rows == 1 ? cols : row_stride, 1, false};
  if (row_stride == 1 || rows == 1) return {batch_stride, 1, col_stride, false};
  return {batch > 1 ? rows * cols : 0, cols, 1, true};
}

MatrixRuns matrix_runs(int64_t rows, int64_t cols, const MatrixLayout& layout) {
  if (layout.col_stride == 1) return {layout.row_stride, cols, rows};
  return {layout.col_stride, rows, cols};
}

int operand_load_width(const void* data, int64_t batch_stride, const MatrixRuns& runs) {
  for (int vector : {8, 4, 2})
    if (aligned_to(data, 2 * vector) && batch_stride % vector == 0 && runs.ld % vector == 0 &&
        runs.inner % vector == 0)
      return vector;
  return 1;
}

bool tma_describable(const void* data, int64_t bytes, int64_t batch, int64_t batch_stride, int64_t ld, int64_t inner,
                     int64_t outer) {
  const int64_t max_stride = (int64_t(1) << 40) / bytes;
  const bool one_matrix = batch == 1 || batch_stride == 0;
  return aligned16(data) && ld * bytes % 16 == 0 && ld >= inner && ld < max_stride &&
         (one_matrix ||
          (batch_stride * bytes % 16 == 0 && batch_stride >= ld * outer && batch_stride < max_stride));
}

}  // namespace mpgemm::kernels
