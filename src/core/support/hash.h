// Content hashing for cache keys and interning. 64-bit FNV-1a is enough here:
// keys are checked against full contents where collisions would matter.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace kiln {

inline uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t hash_str(std::string_view s, uint64_t seed = 1469598103934665603ull) {
  return hash_bytes(s.data(), s.size(), seed);
}

inline uint64_t hash_combine(uint64_t a, uint64_t b) {
  return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
}

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace kiln
