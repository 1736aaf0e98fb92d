#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gguf/dequant.h"
#include "gguf/half.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

// Reference decoders in double precision, straight from the format definitions.
double f16_reference(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m / 1024.0, -14);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

double bf16_reference(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
  const double sign = s ? -1.0 : 1.0;
  if (e == 255) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m / 128.0, -126);
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}

bool same(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
}

float next_up(float x) { return std::nextafter(x, INFINITY); }
float next_down(float x) { return std::nextafter(x, -INFINITY); }

TEST(DequantF16, ToF32ExhaustiveAgainstFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_TRUE(same(f16_reference(static_cast<uint16_t>(h)), got)) << std::hex << h << " -> " << got;
  }
}

TEST(DequantF16, FromF32RoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    const double v = f16_reference(u);
    if (std::isnan(v)) {  // NaN stays NaN
      const uint16_t back = f32_to_f16(static_cast<float>(v));
      ASSERT_EQ(back & 0x7C00, 0x7C00);
      ASSERT_NE(back & 0x3FF, 0);
      continue;
    }
    // exact values round-trip
    ASSERT_EQ(f32_to_f16(static_cast<float>(v)), u) << std::hex << h;
    if (std::isinf(v) || (u & 0x7FFF) == 0x7BFF) continue;
    // between u and its successor in magnitude: the midpoint goes to the even one, anything else to the nearer
    const uint16_t next = static_cast<uint16_t>(u + 1);
    const double w = f16_reference(next);
    const float mid = static_cast<float>((v + w) / 2);  // exact: 12 significant bits
    ASSERT_EQ(static_cast<double>(mid), (v + w) / 2);
    const uint16_t even = (u & 1) ? next : u;
    ASSERT_EQ(f32_to_f16(mid), even) << std::hex << h;
    const float below = std::abs(mid) > 0 && std::signbit(mid) ? next_up(mid) : next_down(mid);
    const float above = std::signbit(mid) ? next_down(mid) : next_up(mid);
    ASSERT_EQ(f32_to_f16(below), u) << std::hex << h;
    ASSERT_EQ(f32_to_f16(above), next) << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16(1e-10f), 0);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0);  // tie between 0 and the smallest subnormal: 0
  EXPECT_EQ(f32_to_f16(next_up(std::ldexp(1.f, -25))), 1);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.f, -25)), 2);  // tie between 1 and 2: even
}

TEST(DequantBf16, ToF32ExhaustiveAgainstFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_TRUE(same(bf16_reference(static_cast<uint16_t>(h)), got)) << std::hex << h;
  }
}

TEST(DequantBf16, FromF32RoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    const double v = bf16_reference(u);
    if (std::isnan(v)) {
      const uint16_t back = f32_to_bf16(static_cast<float>(v));
      ASSERT_EQ(back & 0x7F80, 0x7F80);
      ASSERT_NE(back & 0x7F, 0);
      continue;
    }
    ASSERT_EQ(f32_to_bf16(static_cast<float>(v)), u) << std::hex << h;
    if (std::isinf(v)) continue;
    const uint16_t next = static_cast<uint16_t>(u + 1);
    const double w =
        (next & 0x7FFF) == 0x7F80 ? std::ldexp(2.0, 127) * (std::signbit(v) ? -1 : 1) : bf16_reference(next);
    const double mid_d = (v + w) / 2;
    const float mid = static_cast<float>(mid_d);
    if (static_cast<double>(mid) != mid_d) continue;  // the midpoint above the largest finite: covered below
    const uint16_t even = (u & 1) ? next : u;
    ASSERT_EQ(f32_to_bf16(mid), even) << std::hex << h;
    const float below = std::signbit(mid) ? next_up(mid) : next_down(mid);
    const float above = std::signbit(mid) ? next_down(mid) : next_up(mid);
    if (!(std::abs(mid) > 0)) continue;
    ASSERT_EQ(f32_to_bf16(below), u) << std::hex << h;
    ASSERT_EQ(f32_to_bf16(above), next) << std::hex << h;
  }
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& gen) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  return b;
}

void set_scale(uint8_t* block, float d) {
  const uint16_t h = f32_to_f16(d);
  std::memcpy(block, &h, 2);
}

TEST(DequantQ8_0, MatchesHandComputedBlocks) {
  auto gen = rng(81);
  const size_t n_blocks = 64;
  auto src = random_bytes(n_blocks * 34, gen);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t b = 0; b < n_blocks; ++b) set_scale(&src[b * 34], scale(gen));
  std::vector<float> got(n_blocks * 32);
  dequantize_row(GgufType::Q8_0, src.data(), got.data(), got.size());
  for (size_t b = 0; b < n_blocks; ++b) {
    const double d = f16_reference(static_cast<uint16_t>(src[b * 34] | src[b * 34 + 1] << 8));
    for (size_t j = 0; j < 32; ++j) {
      const int q = static_cast<int8_t>(src[b * 34 + 2 + j]);
      ASSERT_FLOAT_EQ(got[b * 32 + j], static_cast<float>(q * d)) << b << "," << j;
    }
  }
  // a hand-written block: d = 0.5, q = -128, 127, 3
  uint8_t blk[34] = {};
  set_scale(blk, 0.5f);
  blk[2] = 0x80;
  blk[3] = 0x7F;
  blk[33] = 3;
  float out[32];
  dequantize_row(GgufType::Q8_0, blk, out, 32);
  EXPECT_EQ(out[0], -64.f);
  EXPECT_EQ(out[1], 63.5f);
  EXPECT_EQ(out[2], 0.f);
  EXPECT_EQ(out[31], 1.5f);
}

TEST(DequantQ4_0, MatchesHandComputedBlocks) {
  auto gen = rng(40);
  const size_t n_blocks = 64;
  auto src = random_bytes(n_blocks * 18, gen);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t b = 0; b < n_blocks; ++b) set_scale(&src[b * 18], scale(gen));
  std::vector<float> got(n_blocks * 32);
  dequantize_row(GgufType::Q4_0, src.data(), got.data(), got.size());
  for (size_t b = 0; b < n_blocks; ++b) {
    const double d = f16_reference(static_cast<uint16_t>(src[b * 18] | src[b * 18 + 1] << 8));
    for (size_t j = 0; j < 32; ++j) {
      const uint8_t byte = src[b * 18 + 2 + (j % 16)];
      const int nib = j < 16 ? (byte & 15) : (byte >> 4);
      ASSERT_FLOAT_EQ(got[b * 32 + j], static_cast<float>((nib - 8) * d)) << b << "," << j;
    }
  }
  uint8_t blk[18] = {};
  set_scale(blk, 2.f);
  blk[2] = 0xF0;   // element 0: nibble 0 -> -16; element 16: nibble 15 -> 14
  blk[17] = 0x98;  // element 15: 8 -> 0; element 31: 9 -> 2
  float out[32];
  dequantize_row(GgufType::Q4_0, blk, out, 32);
  EXPECT_EQ(out[0], -16.f);
  EXPECT_EQ(out[16], 14.f);
  EXPECT_EQ(out[15], 0.f);
  EXPECT_EQ(out[31], 2.f);
  EXPECT_EQ(out[1], -16.f);
}

TEST(DequantRow, FloatTypesAndErrors) {
  const std::vector<float> x = {1.f, -2.f, 0.5f, 65504.f, std::ldexp(1.f, -24)};
  std::vector<uint8_t> f16(10), bf16(10);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t a = f32_to_f16(x[i]), b = f32_to_bf16(x[i]);
    std::memcpy(&f16[2 * i], &a, 2);
    std::memcpy(&bf16[2 * i], &b, 2);
  }
  std::vector<float> out(5);
  dequantize_row(GgufType::F16, f16.data(), out.data(), 5);
  EXPECT_EQ(out, x);
  dequantize_row(GgufType::BF16, bf16.data(), out.data(), 5);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -2.f);
  EXPECT_EQ(out[3], 65536.f);  // 65504 needs more than bf16's 8 significant bits
  dequantize_row(GgufType::F32, reinterpret_cast<const uint8_t*>(x.data()), out.data(), 5);
  EXPECT_EQ(out, x);
  std::vector<uint8_t> q(34);
  EXPECT_THROW(dequantize_row(GgufType::Q8_0, q.data(), out.data(), 5), InvalidArgument);
  EXPECT_THROW(dequantize_row(static_cast<GgufType>(12), q.data(), out.data(), 32), InvalidArgument);
}

}  // namespace
}  // namespace wgllm::test
