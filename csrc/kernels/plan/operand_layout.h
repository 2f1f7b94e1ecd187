// How the GEMM launcher reads a matrix operand, and what its loads may be:
// the layout (row- or column-major in place, or a row-major copy), the widest
// chunk its loads may take, and whether the tensor copy engine can describe
// it. Host code, free of torch and CUDA: the launchers, the CPU build and
// mpgemm.plan.operand_load_width share this one rule.
#pragma once

#include <cstdint>

namespace mpgemm::kernels {

// Strides in elements of a matrix operand as the kernels read it (one of the
// two matrix strides is 1), and whether it must first be copied to row-major.
struct MatrixLayout {
  int64_t batch_stride, row_stride, col_stride;
  bool copied;
};

// A `rows` x `cols` matrix with these strides, one of a batch of `batch`
// (batch_stride 0: one matrix, or one broadcast over the batch): in place
// when row- or column-major, else a fresh row-major copy (of every matrix of
// the batch). A dimension of size 1 fits either layout; the one whose
// contiguous extent exceeds 1 wins, since wide loads need one.
MatrixLayout matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, int64_t batch,
                           int64_t batch_stride);

// A `rows` x `cols` matrix in `layout` as memory holds it: `outer` runs of
// `inner` contiguous elements, `ld` apart. Row-major wins when both strides
// are 1 (a single row or column).
struct MatrixRuns {
  int64_t ld, inner, outer;
};
MatrixRuns matrix_runs(int64_t rows, int64_t cols, const MatrixLayout& layout);

// The widest chunk, in elements (8, 4, 2 or 1: 16, 8, 4 or 2 bytes), that an
// operand at `data` with these runs and batch stride allows: the base aligned
// to the chunk, runs and batches a whole number of chunks apart, and runs
// that split into whole chunks (a partial chunk at the K edge would move
// every later K slice off alignment).
int operand_load_width(const void* data, int64_t batch_stride, const MatrixRuns& runs);

// Whether the tensor copy engine can describe a matrix of `outer` rows of
// `inner` contiguous elements of `bytes` each (cuTensorMapEncodeTiled's
// documented requirements): a 16-byte aligned base; a row pitch that is a
// multiple of 16 bytes below 2^40 and keeps rows apart; and, where the batch
// has several matrices that are not one broadcast (a batch stride of 0), a
// batch stride of the same kind that keeps them apart.
bool tma_describable(const void* data, int64_t bytes, int64_t batch, int64_t batch_stride, int64_t ld, int64_t inner,
                     int64_t outer);

}  // namespace mpgemm::kernels
