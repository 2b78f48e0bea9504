// IEEE half <-> float, for the f16 scales of the quantized layouts (quant-impl.inc) and the GGUF repack
// (gguf-repack.h). Internal linkage: every translation unit, whatever its ISA flags, keeps its own copy.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kiln {
namespace {

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal
      float f = std::ldexp(static_cast<float>(man), -24);
      memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even f32 -> f16 (finite inputs; scales are small positive/negative numbers).
inline uint16_t floatToHalf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (!(a < 65520.0f)) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal half: multiples of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t au;
  memcpy(&au, &a, 4);
  uint32_t mant = au & 0x7fffffu, exp = (au >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace
}  // namespace kiln
