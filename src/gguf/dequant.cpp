#include "gguf/dequant.h"

#include <bit>
#include <cstring>
#include <string>

#include "wgllm/error.h"

namespace wgllm {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // 127 - 15 = 112
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal: mant * 2^-24. Shift the leading one up to the implicit-bit position.
    exp = 113;  // exponent of 2^-14 in f32, lowered once per shift
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // quiet NaN
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                                                // below 2^-14: subnormal or zero
    if (ax <= 0x33000000u) return sign;                                  // <= 2^-25 rounds to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3FFu);
  const uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // a carry moves into the exponent, as it should
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n) {
  switch (type) {
    case GgufType::F32:
      if (n) std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgufType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case GgufType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case GgufType::Q8_0:
    case GgufType::Q4_0:
      break;
    default:
      throw InvalidArgument("dequantize_row: unsupported type id " + std::to_string(static_cast<uint32_t>(type)));
  }
  if (n % 32 != 0)
    throw InvalidArgument(std::string("dequantize_row: n = ") + std::to_string(n) + " is not a multiple of the " +
                          type_name(type) + " block size 32");
  if (type == GgufType::Q8_0) {
    for (size_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
      const float d = f16_to_f32(load_u16(src));
      for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
    }
  } else {
    for (size_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
      const float d = f16_to_f32(load_u16(src));
      for (int j = 0; j < 16; ++j) {
        dst[j] = static_cast<float>((src[2 + j] & 0x0F) - 8) * d;
        dst[j + 16] = static_cast<float>((src[2 + j] >> 4) - 8) * d;
      }
    }
  }
}

}  // namespace wgllm
