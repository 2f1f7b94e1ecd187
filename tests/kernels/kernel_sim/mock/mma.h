// Stand-in for <mma.h> (WMMA, m16n16k16 only, fp16 or bf16 in) in the
// host-side kernel simulation. Lane 0 of a warp does the whole warp's work on the full 16x16
// tile, so a fragment's real distribution over lanes is not modelled; a lane
// reading a stored fragment before the warp synchronizes still fails. Loads
// and stores must stay inside shared memory, aligned as the hardware requires.
#pragma once

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only m16n16k16 is modelled");
  // As in <mma.h>, passes for archs before sm_80 have no bf16 fragments.
  static_assert(!std::is_same_v<T, __nv_bfloat16> || __CUDA_ARCH__ >= 800, "bf16 fragments need sm_80");
  float x[16][16];
};

namespace detail {
inline bool leader() { return threadIdx.x % 32 == 0; }
inline void check_shared(const void* p, unsigned ldm, size_t element_bytes) {
  const auto* byte = static_cast<const unsigned char*>(p);
  SIM_CHECK(reinterpret_cast<uintptr_t>(p) % 32 == 0, "fragment pointer not 32-byte aligned");
  SIM_CHECK(ldm * element_bytes % 16 == 0, "ldm %u not a multiple of 16 bytes", ldm);
  SIM_CHECK(byte >= sim::shared_memory && byte + (15 * ldm + 16) * element_bytes <= sim::shared_memory + sim::shared_size,
            "fragment outside shared memory");
}
}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  detail::check_shared(p, ldm, sizeof(T));
  if (!detail::leader()) return;
  constexpr bool kRowMajor = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = kRowMajor ? p[r * ldm + c] : p[r + c * ldm];
}

template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  if (!detail::leader()) return;
  fragment<accumulator, 16, 16, 16, float> t;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float sum = c.x[i][j];
      for (int k = 0; k < 16; ++k) sum += a.x[i][k] * b.x[k][j];
      t.x[i][j] = sum;
    }
  d = t;
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (auto& row : f.x)
    for (float& e : row) e = v;
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
  detail::check_shared(p, ldm, sizeof(float));
  if (!detail::leader()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[r + c * ldm]) = f.x[r][c];
}

}  // namespace nvcuda::wmma
