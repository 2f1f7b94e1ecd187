// What the drivers of the kernel simulation share (driver.cpp, conv_cases.cpp):
// one random stream and global-memory buffers that AddressSanitizer guards.
#pragma once

#include <cstdint>
#include <cstring>
#include <new>
#include <random>

namespace sim {

inline std::mt19937_64 rng;
inline int64_t rnd(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
inline int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

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

}  // namespace sim
