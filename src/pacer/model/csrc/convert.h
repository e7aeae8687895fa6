// float <-> storage dtype conversions written so that loops over them vectorise
// (c10's BFloat16 conversions carry a NaN branch that keeps gcc from doing so).
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cstdint>
#include <cstring>

namespace pacer {

inline float to_f(float x) { return x; }
inline float to_f(c10::Half x) { return static_cast<float>(x); }
inline float to_f(c10::BFloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <typename T>
inline T from_f(float f) { return static_cast<T>(f); }
template <>
inline c10::BFloat16 from_f<c10::BFloat16>(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}

}  // namespace pacer
