#include "gguf/dequant.h"

#include <bit>
#include <cmath>
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

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float half_at(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// Each decoder writes one block. The products are evaluated in ggml's order, one rounding each (no fused
// multiply-add: the build targets baseline x86-64/ARM flags without contraction across these statements).

void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b[2 + j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    const float lo = d * static_cast<float>(b[4 + j] & 0x0F), hi = d * static_cast<float>(b[4 + j] >> 4);
    y[j] = lo + m;
    y[j + 16] = hi + m;
  }
}

// Q5_0 / Q5_1: 32 5-bit values from qh (the 5th bits) and qs (nibbles as Q4_0).
void q5_values(const uint8_t* qh_at, const uint8_t* qs, int* q) {
  const uint32_t qh = load_u32(qh_at);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0F) | int((qh >> j) & 1) << 4;
    q[j + 16] = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
  }
}

void q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  int q[32];
  q5_values(b + 2, b + 6, q);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
}

void q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  int q[32];
  q5_values(b + 4, b + 8, q);
  for (int j = 0; j < 32; ++j) {
    const float v = d * static_cast<float>(q[j]);
    y[j] = v + m;
  }
}

// MXFP4: the E2M1 value of each nibble from ggml's table, whose values are twice E2M1's (so that they are integers),
// times the E8M0 scale halved to match.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half(b[0]);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kMxfp4Values[b[1 + j] & 0x0F]) * d;
    y[j + 16] = static_cast<float>(kMxfp4Values[b[1 + j] >> 4]) * d;
  }
}

// Element e of a 256-element Q2_K / Q3_K / Q6_K super-block lies in half h = e / 128, quarter k = e % 128 / 32 of
// it, at l = e % 32: its bits are at byte 32 h + l of the 2-bit array (shift 2 k), its scale is number 8 h + 2 k + l
// / 16.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t *scales = b, *qs = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = e % 128 / 32, l = e % 32;
    const uint8_t sc = scales[8 * h + 2 * k + l / 16];
    const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
    const float v = dl * static_cast<float>((qs[32 * h + l] >> (2 * k)) & 3);
    y[e] = v - ml;
  }
}

// The 16 6-bit scales of Q3_K: low 4 bits in the nibbles of bytes 0..7, high 2 bits in the crumbs of bytes 8..11.
int q3_k_scale(const uint8_t* s, int i) {
  const int lo = (s[i % 8] >> (4 * (i / 8))) & 0x0F, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | hi << 4) - 32;
}

void q3_k(const uint8_t* b, float* y) {
  const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
  const float d = half_at(b + 108);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = e % 128 / 32, l = e % 32;
    const float dl = d * static_cast<float>(q3_k_scale(scales, 8 * h + 2 * k + l / 16));
    const int q = ((qs[32 * h + l] >> (2 * k)) & 3) - ((hmask[l] >> (4 * h + k)) & 1 ? 0 : 4);
    y[e] = dl * static_cast<float>(q);
  }
}

// Scale and min of sub-block j (of 8) of Q4_K / Q5_K: 6 bits each, packed in 12 bytes.
void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Q4_K and Q5_K (qh non-null): sub-block j holds the low (j even) or high (j odd) nibbles of qs[32 (j / 2) ..][32],
// Q5_K's 5th bit of element l being bit j of qh[l].
void q45_k(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(b + 4, j, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
      if (qh) q |= ((qh[l] >> j) & 1) << 4;
      const float v = dl * static_cast<float>(q);
      y[32 * j + l] = v - ml;
    }
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t *ql = b, *qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = e % 128 / 32, l = e % 32;
    const int lo = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
    const int q = (lo | ((qh[32 * h + l] >> (2 * k)) & 3) << 4) - 32;
    const float dl = d * static_cast<float>(scales[8 * h + 2 * k + l / 16]);
    y[e] = dl * static_cast<float>(q);
  }
}

[[noreturn]] void unsupported(const char* fn, GgufType t) {
  throw InvalidArgument(std::string(fn) + ": type " + type_name(t) + " (id " + std::to_string(uint32_t(t)) +
                        ") is not one wgllm runs");
}

}  // namespace

float e8m0_half(uint8_t e) { return std::bit_cast<float>(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23); }

std::vector<size_t> scale_fields(GgufType type) {
  switch (type) {
    case GgufType::Q4_0:
    case GgufType::Q5_0:
    case GgufType::Q8_0: return {0};
    case GgufType::Q4_1:
    case GgufType::Q5_1:
    case GgufType::Q4_K:
    case GgufType::Q5_K: return {0, 2};
    case GgufType::Q2_K: return {80, 82};
    case GgufType::Q3_K: return {108};
    case GgufType::Q6_K: return {208};
    default: return {};
  }
}

void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n) {
  void (*block)(const uint8_t*, float*) = nullptr;
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
    case GgufType::Q8_0: block = q8_0; break;
    case GgufType::Q4_0: block = q4_0; break;
    case GgufType::Q4_1: block = q4_1; break;
    case GgufType::Q5_0: block = q5_0; break;
    case GgufType::Q5_1: block = q5_1; break;
    case GgufType::Q2_K: block = q2_k; break;
    case GgufType::Q3_K: block = q3_k; break;
    case GgufType::Q4_K: block = [](const uint8_t* b, float* y) { q45_k(b, nullptr, b + 16, y); }; break;
    case GgufType::Q5_K: block = [](const uint8_t* b, float* y) { q45_k(b, b + 16, b + 48, y); }; break;
    case GgufType::Q6_K: block = q6_k; break;
    case GgufType::MXFP4: block = mxfp4; break;
    default: unsupported("dequantize_row", type);
  }
  const size_t be = block_elems(type), bb = block_bytes(type);
  if (n % be != 0)
    throw InvalidArgument(std::string("dequantize_row: n = ") + std::to_string(n) + " is not a multiple of the " +
                          type_name(type) + " block size " + std::to_string(be));
  for (size_t b = 0; b < n / be; ++b, src += bb, dst += be) block(src, dst);
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
    case GgufType::MXFP4: {  // the scale is always finite, a product of it may not be (e > 252)
      float y[32];
      for (uint64_t b = 0; b < n / 32; ++b) {
        if (src[b * 17] <= 252) continue;
        mxfp4(src + b * 17, y);
        for (uint64_t j = 0; j < 32; ++j)
          if (!std::isfinite(y[j])) return b * 32 + j;
      }
      return std::nullopt;
    }
    default: break;
  }
  const std::vector<size_t> fields = scale_fields(type);
  if (fields.empty()) unsupported("find_non_finite", type);
  const uint64_t be = block_elems(type), bb = block_bytes(type), blocks = n / be;
  for (uint64_t b = 0; b < blocks; ++b)
    for (size_t at : fields)
      if ((load_u16(src + b * bb + at) & 0x7C00) == 0x7C00) return b * be;
  return std::nullopt;
}

}  // namespace wgllm
