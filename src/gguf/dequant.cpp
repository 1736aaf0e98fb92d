#include "gguf/dequant.h"

#include <cstring>
#include <string>

#include "gguf/half.h"
#include "wgllm/error.h"

namespace wgllm {

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
    case GgufType::Q4_0: break;
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

std::optional<uint64_t> find_non_finite(GgufType type, const uint8_t* src, uint64_t n) {
  // Every exponent bit set: NaN or infinity, in each format.
  auto scan16 = [&](uint64_t count, uint64_t stride, uint16_t exponent) -> std::optional<uint64_t> {
    uint64_t i = 0;
    if (stride == 2) {  // four halves at a time: a lane of (v & e) ^ e is zero exactly where all of e's bits are set
      const uint64_t e = exponent * 0x0001000100010001ull;
      for (; i + 4 <= count; i += 4) {
        uint64_t v;
        std::memcpy(&v, src + 2 * i, 8);
        const uint64_t y = (v & e) ^ e;  // lanes below 0x8000: the borrow trick finds a zero lane exactly
        if (((y - 0x0001000100010001ull) & ~y & 0x8000800080008000ull) != 0) break;
      }
    }
    for (; i < count; ++i)
      if ((load_u16(src + i * stride) & exponent) == exponent) return i;
    return std::nullopt;
  };
  switch (type) {
    case GgufType::F32:
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, src + 4 * i, 4);
        if ((bits & 0x7F800000u) == 0x7F800000u) return i;
      }
      return std::nullopt;
    case GgufType::F16: return scan16(n, 2, 0x7C00);
    case GgufType::BF16: return scan16(n, 2, 0x7F80);
    case GgufType::Q8_0:
    case GgufType::Q4_0: {
      const std::optional<uint64_t> block = scan16(n / block_elems(type), block_bytes(type), 0x7C00);
      if (block) return *block * block_elems(type);
      return std::nullopt;
    }
  }
  throw InvalidArgument("find_non_finite: unsupported type id " + std::to_string(static_cast<uint32_t>(type)));
}

}  // namespace wgllm
