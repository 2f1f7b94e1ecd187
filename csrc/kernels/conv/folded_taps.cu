// The folded copies of conv/folded_taps.h, grid-stride. The filters' fold,
// the gradient's unfold and, with MPGEMM_CHUNKED_FOLD=0, x's fold: a thread per destination
// element at a time, consecutive threads on consecutive elements, so that
// writes coalesce along the folded channels and reads along the source's taps
// and channels, each index split by 32-bit divisions, as the padded copies'
// are. x's fold in chunks (the default): a thread per 16
// bytes of the folded copy, which splits its index once for its 8 channels
// and finds each channel's tap in a table. The filters' copies are a few
// thousand elements; x's is the size of the layer's output (422 MB for
// ResNet-50's first layer at batch 256), and a thread per element spends
// about 94 instructions on each (sm_90a), the chunks about 25: by the
// measured analogs, the element kernel's instructions, not its bytes, bound
// that copy (bench/NOTES.md, "x's fold in 16-byte chunks", a prediction
// until a GPU run times it).
#include "conv/folded_taps.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/element_traits.cuh"
#include "common/math.h"

namespace mpgemm::kernels {
namespace {

constexpr int kFoldThreads = 256;
constexpr int64_t kMaxFoldBlocks = 8192;

// A folded pixel holds stride_h runs of S x C channels, run r2 being x's
// elements from (row0 + r2, col0) on, in one piece (row0 and col0 its
// window's first tap). Each folded channel's place in them, for x's fold in
// chunks: (r2 << 8) | u, u its element in the run; kPastRuns past the runs.
constexpr uint16_t kPastRuns = 0xff00;

// The geometry every fold reads: the source's (h, w, c, the filters' r, s,
// strides, padding) and the folded copies' (rows J, taps R'); and, for x's
// fold in chunks, each folded channel's place in its runs.
struct Fold {
  const void* src = nullptr;
  void* dst = nullptr;
  int h = 0, w = 0, c = 0, r = 0, s = 0, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;
  unsigned rows = 0, cols = 0, taps = 0, elements = 0;
  uint16_t run_place[kFoldedChannels] = {};
};

// Folded channel `ch` (below stride_h * S * C) as (r2, s, c).
struct FoldedChannel {
  int r2, s, c;
};
__device__ __forceinline__ FoldedChannel unfold_channel(const Fold& f, unsigned ch) {
  const int tap = int(ch) / f.c;
  return {tap / f.s, tap % f.s, int(ch) % f.c};
}

__global__ void __launch_bounds__(kFoldThreads) fold_input_kernel(Fold f) {
  const auto* src = static_cast<const uint16_t*>(f.src);
  auto* dst = static_cast<uint16_t*>(f.dst);
  const unsigned folded = unsigned(f.stride_h * f.s * f.c);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < f.elements; e += gridDim.x * blockDim.x) {
    const unsigned ch = e % kFoldedChannels, pixel = e / kFoldedChannels;
    const unsigned q = pixel % f.cols, j = pixel / f.cols % f.rows, image = pixel / f.cols / f.rows;
    uint16_t v = 0;
    if (ch < folded) {
      const FoldedChannel at = unfold_channel(f, ch);
      const int row = f.stride_h * int(j) - f.pad_top + at.r2, col = f.stride_w * int(q) - f.pad_left + at.s;
      if (row >= 0 && row < f.h && col >= 0 && col < f.w)
        v = src[((int64_t(image) * f.h + row) * f.w + col) * f.c + at.c];
    }
    dst[e] = v;
  }
}

// Folded channels a thread of fold_input_chunks_kernel writes: 16 bytes.
constexpr unsigned kChunk = 8, kChunksPerPixel = unsigned(kFoldedChannels) / kChunk;

// x's fold, a 16-byte chunk of a folded pixel a thread: 8 consecutive threads
// write one pixel's 128 bytes, so that a warp's stores cover 4 whole pixels.
// A chunk splits its pixel's index once; each of its channels then takes its
// place in the pixel's runs (r2, u) from the table, and is read where its run
// lies inside x's rows (rlo <= r2 < rlo + rows_inside) and u inside x's
// columns (lo <= u < lo + span): a check, an offset and a load a channel,
// none depending on the one before. Offsets within a pixel's window fit 32
// bits (launch_fold_input).
__global__ void __launch_bounds__(kFoldThreads) fold_input_chunks_kernel(Fold f) {
  const auto* src = static_cast<const uint16_t*>(f.src);
  auto* dst = static_cast<uint4*>(f.dst);
  const unsigned chunks = f.elements / kChunk;
  const int row_pitch = f.w * f.c;
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < chunks; e += gridDim.x * blockDim.x) {
    const unsigned pixel = e / kChunksPerPixel, first = e % kChunksPerPixel * kChunk;
    const unsigned q = pixel % f.cols, j = pixel / f.cols % f.rows, image = pixel / f.cols / f.rows;
    const int row0 = f.stride_h * int(j) - f.pad_top, col0 = f.stride_w * int(q) - f.pad_left;
    const int rlo = max_int(0, -row0), rows_inside = max_int(0, min_int(f.stride_h, f.h - row0) - rlo);
    const int lo = max_int(0, -col0) * f.c, span = max_int(0, min_int(f.s, f.w - col0) * f.c - lo);
    // The window's first element (its address formed, never read, where the window starts outside x).
    const uint16_t* window = src + ((int64_t(image) * f.h + row0) * f.w + col0) * f.c;
    uint32_t words[kChunk / 2];
#pragma unroll
    for (unsigned i = 0; i < kChunk; ++i) {
      const int place = f.run_place[first + i], r2 = place >> 8, u = place & 0xff;
      const uint32_t v = unsigned(r2 - rlo) < unsigned(rows_inside) && unsigned(u - lo) < unsigned(span)
                             ? window[r2 * row_pitch + u]
                             : 0u;
      words[i / 2] = i % 2 == 0 ? v : words[i / 2] | v << 16;
    }
    dst[e] = uint4{words[0], words[1], words[2], words[3]};
  }
}

__global__ void __launch_bounds__(kFoldThreads) fold_filters_kernel(Fold f) {
  const auto* src = static_cast<const uint16_t*>(f.src);
  auto* dst = static_cast<uint16_t*>(f.dst);
  const unsigned folded = unsigned(f.stride_h * f.s * f.c);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < f.elements; e += gridDim.x * blockDim.x) {
    const unsigned ch = e % kFoldedChannels, t = e / kFoldedChannels % f.taps, k = e / kFoldedChannels / f.taps;
    uint16_t v = 0;
    if (ch < folded) {
      const FoldedChannel at = unfold_channel(f, ch);
      const int r = f.stride_h * int(t) + at.r2;
      if (r < f.r) v = src[((int64_t(k) * f.r + r) * f.s + at.s) * f.c + at.c];
    }
    dst[e] = v;
  }
}

// dw's element (k, r, s, c) is the folded gradient's (k, r / stride_h, (r %
// stride_h * S + s) * C + c).
template <class Word>
__global__ void __launch_bounds__(kFoldThreads) unfold_filter_gradient_kernel(Fold f) {
  const auto* src = static_cast<const Word*>(f.src);
  auto* dst = static_cast<Word*>(f.dst);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < f.elements; e += gridDim.x * blockDim.x) {
    const unsigned c = e % unsigned(f.c), tap = e / unsigned(f.c), s = tap % unsigned(f.s);
    const unsigned r = tap / unsigned(f.s) % unsigned(f.r), k = tap / unsigned(f.s) / unsigned(f.r);
    const unsigned t = r / unsigned(f.stride_h), r2 = r % unsigned(f.stride_h);
    dst[e] = src[(int64_t(k) * f.taps + t) * kFoldedChannels + (r2 * unsigned(f.s) + s) * unsigned(f.c) + c];
  }
}

int64_t folded_taps(const Conv2dParams& p) { return ceil_div(p.r, int64_t(p.stride_h)); }
int64_t folded_rows(const Conv2dParams& p) { return p.p + folded_taps(p) - 1; }

Fold fold_of(const Conv2dParams& p, const void* src, void* dst, int64_t elements) {
  Fold f;
  f.src = src, f.dst = dst;
  f.h = int(p.h), f.w = int(p.w), f.c = int(p.c), f.r = int(p.r), f.s = int(p.s);
  f.stride_h = p.stride_h, f.stride_w = p.stride_w, f.pad_top = p.pad_top, f.pad_left = p.pad_left;
  f.rows = unsigned(folded_rows(p)), f.cols = unsigned(p.q), f.taps = unsigned(folded_taps(p));
  f.elements = unsigned(elements);
  const int run_length = f.s * f.c;
  for (int ch = 0; ch < kFoldedChannels; ++ch)
    f.run_place[ch] =
        ch < f.stride_h * run_length ? uint16_t((ch / run_length) << 8 | ch % run_length) : kPastRuns;
  return f;
}

// `kernel` over `fold`, a thread per `per_thread` of its `elements`.
cudaError_t launch_fold(void (*kernel)(Fold), const Fold& fold, int64_t elements, cudaStream_t stream,
                        int64_t per_thread = 1) {
  if (elements > INT_MAX) return cudaErrorInvalidValue;
  if (elements == 0) return cudaSuccess;
  const dim3 grid(unsigned(std::min(ceil_div(elements, per_thread * kFoldThreads), kMaxFoldBlocks)));
  Fold params = fold;
  void* args[] = {&params};
  return cudaLaunchKernel(kernel, grid, dim3(kFoldThreads), args, 0, stream);
}

int64_t folded_input_elements(const Conv2dParams& p) { return p.n * folded_rows(p) * p.q * kFoldedChannels; }
int64_t folded_filter_elements(const Conv2dParams& p) { return p.k * folded_taps(p) * kFoldedChannels; }

}  // namespace

bool folds_taps(ConvPass pass, const Conv2dParams& p) {
  return pass != ConvPass::kDgrad && p.groups == 1 && p.c > 0 && p.k > 0 && p.r > 0 && p.s > 0 &&
         p.dilation_h == 1 && p.dilation_w == 1 && p.stride_h >= 1 && p.stride_w >= 1 &&
         p.stride_h * p.s * p.c <= kFoldedChannels && folded_taps(p) < p.r * p.s * ceil_div(p.c, kFoldedChannels);
}

Conv2dParams folded_problem(ConvPass pass, const Conv2dParams& p, const void* x_folded, void* w_folded) {
  Conv2dParams f = p;
  f.h = folded_rows(p), f.w = p.q, f.c = kFoldedChannels;
  f.r = folded_taps(p), f.s = 1;
  f.stride_h = f.stride_w = 1, f.pad_top = f.pad_left = 0;
  f.x = x_folded;
  if (pass == ConvPass::kFprop) f.wt = w_folded;
  else f.out = w_folded;
  return f;
}

size_t folded_input_bytes(const Conv2dParams& p) { return size_t(round_up(folded_input_elements(p) * 2, 16)); }

size_t folded_filter_bytes(ConvPass pass, const Conv2dParams& p) {
  const int bytes = pass == ConvPass::kFprop ? 2 : element_bytes(p.out_type);
  return size_t(round_up(folded_filter_elements(p) * bytes, 16));
}

cudaError_t launch_fold_input(const Conv2dParams& p, void* x_folded, bool in_chunks, cudaStream_t stream) {
  const int64_t elements = folded_input_elements(p);
  const Fold fold = fold_of(p, p.x, x_folded, elements);
  // The chunks' offsets within a window: stride_h rows of x.
  if (!in_chunks || int64_t(p.stride_h) * p.w * p.c > INT_MAX)
    return launch_fold(&fold_input_kernel, fold, elements, stream);
  if (!aligned16(x_folded)) return cudaErrorInvalidValue;
  return launch_fold(&fold_input_chunks_kernel, fold, elements, stream, kChunk);
}

cudaError_t launch_fold_filters(const Conv2dParams& p, void* w_folded, cudaStream_t stream) {
  const int64_t elements = folded_filter_elements(p);
  return launch_fold(&fold_filters_kernel, fold_of(p, p.wt, w_folded, elements), elements, stream);
}

cudaError_t launch_unfold_filter_gradient(const Conv2dParams& p, const void* dw_folded, cudaStream_t stream) {
  const int64_t elements = p.k * p.r * p.s * p.c;
  const Fold fold = fold_of(p, dw_folded, p.out, elements);
  return element_bytes(p.out_type) == 4
             ? launch_fold(&unfold_filter_gradient_kernel<uint32_t>, fold, elements, stream)
             : launch_fold(&unfold_filter_gradient_kernel<uint16_t>, fold, elements, stream);
}

}  // namespace mpgemm::kernels
