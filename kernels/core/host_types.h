// Host element types for the XLA:CPU handlers: storage, load to float, round-to-nearest-even
// store, and dispatch from a dtype code (dtypes.h). The 16-bit conversions are written out (not
// _Float16 / __bf16) so any host compiler builds them with identical results.
#ifndef XLA_GPU_OPS_HOST_TYPES_H_
#define XLA_GPU_OPS_HOST_TYPES_H_

#include <stdint.h>

#include <cmath>
#include <cstring>

#include "core/dtypes.h"
#include "core/status.h"

namespace xgo {
namespace host {

// ------------------------------------------------------------------ float conversions

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float Bf16ToFloat(uint16_t bf16) { return BitsToFloat(static_cast<uint32_t>(bf16) << 16); }

inline uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet bit set)
  }
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is correct (and
  // rounds the largest finite values up to infinity exactly when they should).
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);  // signed zero
    // Subnormal half: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a multiple of 2^-24. Scaling by
    // 2^24 is exact, and nearbyint rounds to nearest even in the default rounding mode.
    const float scaled = BitsToFloat(magnitude) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// Element access by XgoDtype, so the kernels below are written once.
struct F32 {
  using Storage = float;
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};
struct F16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
struct BF16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return Bf16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBf16(v); }
};

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, NaN = S.1111.111,
// largest finite 448. Stores round to nearest even and saturate to +-448 (as CUDA's
// __NV_SATFINITE conversion and vLLM's fp8 cache writes do); NaN stays NaN.
inline float Fp8E4m3fnToFloat(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

inline uint8_t FloatToFp8E4m3fn(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80u : 0x00u;
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7fu);
  const float magnitude = std::fabs(value);
  if (magnitude >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  if (magnitude < 0.015625f) {  // below 2^-6: a multiple of 2^-9 (exact scaling, RNE)
    const int steps = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 9)));
    return static_cast<uint8_t>(sign | steps);  // 8 steps is the smallest normal, 0x08
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  exponent -= 1;                                            // magnitude = (2 * fraction) * 2^e
  int steps = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));  // exact * 8
  if (steps == 8) {
    steps = 0;
    exponent += 1;
  }
  if (exponent > 8) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | ((exponent + 7) << 3) | steps);
}

struct F8E4M3FN {
  using Storage = uint8_t;
  static float Load(uint8_t v) { return Fp8E4m3fnToFloat(v); }
  static uint8_t Store(float v) { return FloatToFp8E4m3fn(v); }
};

template <int32_t Code>
struct HostType;
template <>
struct HostType<XGO_F32> {
  using Type = F32;
};
template <>
struct HostType<XGO_F16> {
  using Type = F16;
};
template <>
struct HostType<XGO_BF16> {
  using Type = BF16;
};
template <>
struct HostType<XGO_F8E4M3FN> {
  using Type = F8E4M3FN;
};

template <typename Set, typename Fn>
int32_t DispatchHost(Set set, int32_t code, const char* what, Fn&& fn) {
  return DispatchDtype<HostType>(set, code, what, static_cast<Fn&&>(fn));
}

}  // namespace host
}  // namespace xgo

#endif  // XLA_GPU_OPS_HOST_TYPES_H_
