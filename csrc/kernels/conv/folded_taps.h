// A convolution of few input channels (ResNet's first layer: 3 channels,
// 7x7 at stride 2) on the Hopper convolution, its taps folded into the
// channels. The Hopper convolution reads one im2col box of 64 channels at
// each tap, so 3 channels would fill 3/64 of each K slice (49 slices for 147
// products a pixel); and its boxes need channels in whole 16 bytes. Folded,
// a copy of x holds at each (image, j, q) the stride_h x S x C values that
// the output pixels of column q read from rows stride_h * j - pad_top + r2
// (r2 < stride_h), every tap s along the row: channel (r2 * S + s) * C + c,
// zeros past x and up to 64. The filters fold alike, tap row r = stride_h *
// t + r2 going to folded tap t. The convolution of the copies at stride 1,
// R' = ceil(R / stride_h) taps by 1, is the original one: output pixel (p,
// q) reads folded rows p .. p + R' - 1, which hold exactly its window (for
// ResNet's first layer: 4 K slices of 64 instead of 49; 147 of 256 useful).
// fprop and wgrad fold (wgrad then unfolds its filter gradient into dw);
// dgrad does not (a network's image needs no gradient).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "conv/params.h"

namespace mpgemm::kernels {

// Channels of the folded copies: one im2col box.
inline constexpr int64_t kFoldedChannels = 64;

// Whether `pass` of p folds: fprop or wgrad, one group, no dilation, the
// folded channels (stride_h x S x C) within one box, and fewer K slices
// folded (R') than unfolded (R x S, each tap's channels in whole boxes).
bool folds_taps(ConvPass pass, const Conv2dParams& p);

// The folded problem of p, reading folded x at `x_folded` and the folded
// filters at `w_folded` (fprop), or writing the folded filter gradient at
// `dw_folded` (wgrad; its type p.out_type): dense (N, J, Q, 64) and (K, R',
// 1, 64), J = P + R' - 1.
Conv2dParams folded_problem(ConvPass pass, const Conv2dParams& p, const void* x_folded, void* w_folded);

// Bytes of the folded copies: of x, and of the filters (fprop: 16-bit; wgrad: p.out_type).
size_t folded_input_bytes(const Conv2dParams& p);
size_t folded_filter_bytes(ConvPass pass, const Conv2dParams& p);

// The copies, on `stream`: x to its fold, a thread per element or, where
// `in_chunks`, a thread per 16 bytes of the fold (cudaErrorInvalidValue
// where x_folded is not 16-byte aligned; a thread per element after all
// where stride_h rows of x hold 2^31 elements or more, past the chunks'
// 32-bit offsets); the filters (p.wt) to theirs; the folded filter gradient
// back to dw (p.out, p.out_type).
cudaError_t launch_fold_input(const Conv2dParams& p, void* x_folded, bool in_chunks, cudaStream_t stream);
cudaError_t launch_fold_filters(const Conv2dParams& p, void* w_folded, cudaStream_t stream);
cudaError_t launch_unfold_filter_gradient(const Conv2dParams& p, const void* dw_folded, cudaStream_t stream);

}  // namespace mpgemm::kernels
