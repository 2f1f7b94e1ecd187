// What the drivers of the kernel simulation share (driver.cpp, conv_cases.cpp):
// one random stream, global-memory buffers that AddressSanitizer guards, and
// the references' own reads and writes of fp32, fp16 and bf16 elements.
#pragma once

#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/gemm_params.h"

namespace sim {

inline std::mt19937_64 rng;
inline int64_t rnd(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

// Global memory of exactly `bytes`, filled with 0xff (NaN in fp16 and fp32):
// AddressSanitizer catches any access past either end.
struct Buffer {
  unsigned char* p;
  size_t size;
  explicit Buffer(size_t bytes) : p(static_cast<unsigned char*>(::operator new(bytes, std::align_val_t(16)))), size(bytes) {
    memset(p, 0xff, bytes);
  }
  ~Buffer() { ::operator delete(p, std::align_val_t(16)); }
  Buffer(const Buffer&) = delete;
};

using mpgemm::kernels::ElementType;

inline int64_t bytes_of(ElementType type) { return type == ElementType::kFloat32 ? 4 : 2; }

// Element i of an array of `type`, in fp32.
inline float get(const void* p, ElementType type, int64_t i) {
  switch (type) {
    case ElementType::kFloat16: return float(static_cast<const __half*>(p)[i]);
    case ElementType::kBFloat16: return float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Stores v, rounded to nearest even, as element i of an array of `type`.
inline void set(void* p, ElementType type, int64_t i, float v) {
  switch (type) {
    case ElementType::kFloat16: static_cast<__half*>(p)[i] = __half(v); break;
    case ElementType::kBFloat16: static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// v as `type` holds it.
inline float rounded(float v, ElementType type) {
  unsigned char bytes[4];
  set(bytes, type, 0, v);
  return get(bytes, type, 0);
}

// `count` elements of `type` starting 0 or 1 element past a 16-byte
// boundary (an elementwise pass's tensor; one off the boundary sends a pass
// to its one-element-at-a-time path).
struct OffsetElements {
  ElementType type;
  int64_t offset;
  Buffer mem;
  OffsetElements(ElementType type, int64_t count, bool misaligned)
      : type(type), offset(misaligned), mem((count + 1) * bytes_of(type)) {}
  void* data() { return mem.p + offset * bytes_of(type); }
  float operator[](int64_t i) { return get(data(), type, i); }
};

// A random type of a product's inputs: bf16 from sm_80 on, where its kernels are compiled.
inline ElementType input_type() {
  return __CUDA_ARCH__ >= 800 && rnd(0, 1) ? ElementType::kBFloat16 : ElementType::kFloat16;
}
inline ElementType any_type() { return ElementType(rnd(0, 2)); }

// An epilogue's bias of n random elements of a random type, or none; `values`
// holds them for the reference (zeros when there is none).
struct Bias {
  bool present;
  ElementType type;
  std::vector<float> values;
  Buffer mem;
  Bias(bool present, int64_t n) : present(present), type(any_type()), values(n, 0.0f), mem(n * bytes_of(type)) {
    for (int64_t j = 0; present && j < n; ++j) {
      values[j] = rnd(-16, 16) / 8.0f;
      set(mem.p, type, j, values[j]);
    }
  }
  const void* data() const { return present ? mem.p : nullptr; }
};

}  // namespace sim
