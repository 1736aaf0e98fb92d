#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

// The E2M1 values of MXFP4 as the OCP spec defines them (sign, 2 exponent bits, 1 mantissa bit; exponent 0
// subnormal), doubled as ggml's table holds them (+0 for the negative zero, nibble 8).
double e2m1_doubled(int nib) {
  const int e = (nib >> 1) & 3, m = nib & 1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return v == 0 ? 0.0 : 2 * (nib & 8 ? -v : v);
}

TEST(DequantMxfp4, MatchesHandComputedBlocks) {
  // Each scale byte of the edges (subnormal scales 0, 1; the first normal 2; 1.0 at 127; the largest at 254, 255)
  // with every nibble in both halves: element j low nibble of byte j, element j + 16 its high nibble.
  for (const int e : {0, 1, 2, 3, 127, 128, 200, 252, 253, 254, 255}) {
    SCOPED_TRACE(e);
    const double scale = std::ldexp(1.0, e - 128);  // 2^(e - 127) halved: the table is doubled
    EXPECT_EQ(e8m0_half(uint8_t(e)), float(scale));
    uint8_t blk[17];
    blk[0] = uint8_t(e);
    for (int j = 0; j < 16; ++j) blk[1 + j] = uint8_t(j | (15 - j) << 4);
    float out[32];
    dequantize_row(GgufType::MXFP4, blk, out, 32);
    for (int j = 0; j < 16; ++j) {
      // exact in double; as f32 infinite where it overflows
      const double lo = e2m1_doubled(j) * scale, hi = e2m1_doubled(15 - j) * scale;
      EXPECT_TRUE(same(lo, out[j]) || (std::isinf(out[j]) && std::abs(lo) >= 0x1p128)) << j << ": " << out[j];
      EXPECT_TRUE(same(hi, out[16 + j]) || (std::isinf(out[16 + j]) && std::abs(hi) >= 0x1p128))
          << 16 + j << ": " << out[16 + j];
    }
  }
  uint8_t blk[17] = {127};
  blk[1] = 0x7F;   // element 0: nibble 15 -> -12 / 2 = -6; element 16: nibble 7 -> 6
  blk[16] = 0x89;  // element 15: 9 -> -0.5; element 31: 8 -> 0
  float out[32];
  dequantize_row(GgufType::MXFP4, blk, out, 32);
  EXPECT_EQ(out[0], -6.f);
  EXPECT_EQ(out[16], 6.f);
  EXPECT_EQ(out[15], -0.5f);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[31]), 0u);  // +0: ggml's table holds 0 for the negative zero
  EXPECT_EQ(out[1], 0.f);
}

// An MXFP4 scale is a finite power of two (e = 255 is 2^127, not NaN); its products overflow from e = 253 on (12 *
// 2^125), and find_non_finite names the first element that does.
TEST(DequantMxfp4, NonFiniteProductsAreFound) {
  std::vector<uint8_t> blocks(17 * 6, 0x77);  // every element 12 * scale
  for (size_t b = 0; b < 6; ++b) blocks[b * 17] = 252;
  EXPECT_EQ(find_non_finite(GgufType::MXFP4, blocks.data(), 6 * 32), std::nullopt);
  blocks[4 * 17] = 253;
  EXPECT_EQ(find_non_finite(GgufType::MXFP4, blocks.data(), 6 * 32), std::optional<uint64_t>(4 * 32));
  blocks[4 * 17] = 255;
  std::fill(blocks.begin() + 4 * 17 + 1, blocks.begin() + 5 * 17, 0x11);  // 1 * 2^127: finite ...
  blocks[4 * 17 + 6] = 0x21;                                              // ... but element 21: 2 * 2^127
  EXPECT_EQ(find_non_finite(GgufType::MXFP4, blocks.data(), 6 * 32), std::optional<uint64_t>(4 * 32 + 21));
  EXPECT_TRUE(scale_fields(GgufType::MXFP4).empty());
}

// ---------------------------------------------------------------------------------- against the gguf package
// Fresh random blocks of every quantised type, dequantised here and by the gguf Python package (0.19.0, in the
// tools' venv; tests/gguf/dequant_reference.py): the f32 bits must be equal (NaN where it gives NaN).

std::string python() {
  const char* env = std::getenv("WGLLM_PYTHON");
  return env ? env : std::string(WGLLM_SOURCE_DIR) + "/.venv/bin/python";
}

// A scratch directory removed at the end of the test.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    path = std::filesystem::temp_directory_path() /
           ("wgllm-dequant-" + std::to_string(seed()) + "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

void run_reference(const std::vector<std::string>& args) {
  std::string cmd = "'" + python() + "' '" + std::string(WGLLM_SOURCE_DIR) + "/tests/gguf/dequant_reference.py'";
  for (const auto& a : args) cmd += " '" + a + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed (the tools' venv is made by scripts/setup.sh)";
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Blocks whose every byte position takes all 256 values over the first 256 blocks (every quant and scale-bit
// pattern, in every sub-block; every MXFP4 scale byte, 0, 1, 254 and 255 included), then random ones; the f16 fields
// hold random values of every magnitude and, in turn, the extremes: largest, smallest normal, subnormals, zeros,
// infinities, negatives.
std::vector<uint8_t> test_blocks(GgufType t, size_t n_blocks, std::mt19937_64& gen) {
  const size_t bb = block_bytes(t);
  std::vector<uint8_t> out(n_blocks * bb);
  const uint16_t extremes[] = {0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x8001, 0x03FF, 0x0000,
                               0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x1400, 0x0200};
  const auto fields = scale_fields(t);
  std::uniform_real_distribution<float> exponent(-20.f, 12.f);
  for (size_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = &out[b * bb];
    for (size_t k = 0; k < bb; ++k) blk[k] = b < 256 ? uint8_t(b + 17 * k) : uint8_t(gen());
    for (size_t f = 0; f < fields.size(); ++f) {
      uint16_t h;
      if ((b + f * 7) % 3 == 0)
        h = extremes[(b / 3 + f * 5) % std::size(extremes)];
      else
        h = f32_to_f16((gen() & 1 ? -1.f : 1.f) * std::exp2(exponent(gen)));
      std::memcpy(blk + fields[f], &h, 2);
    }
  }
  return out;
}

class DequantVsGguf : public ::testing::TestWithParam<GgufType> {};

TEST_P(DequantVsGguf, BitExact) {
  const GgufType t = GetParam();
  auto gen = rng(1000 + uint32_t(t));
  const size_t n_blocks = 256 + 256;
  const auto blocks = test_blocks(t, n_blocks, gen);
  ScratchDir dir;
  {
    std::ofstream in(dir.path / "in.bin", std::ios::binary);
    const uint32_t head[2] = {uint32_t(t), uint32_t(n_blocks)};
    in.write(reinterpret_cast<const char*>(head), 8);
    in.write(reinterpret_cast<const char*>(blocks.data()), std::streamsize(blocks.size()));
  }
  run_reference({"blocks", (dir.path / "in.bin").string(), (dir.path / "out.bin").string()});
  const auto want_bytes = read_file(dir.path / "out.bin");
  const size_t n = n_blocks * block_elems(t);
  ASSERT_EQ(want_bytes.size(), n * 4);
  std::vector<float> want(n), got(n, std::numeric_limits<float>::quiet_NaN());
  std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
  dequantize_row(t, blocks.data(), got.data(), n);
  size_t nan = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) {
      ++nan;
      ASSERT_TRUE(std::isnan(got[i])) << type_name(t) << " element " << i << ": " << got[i] << ", want NaN";
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << type_name(t) << " element " << i << " (block " << i / block_elems(t) << "): " << got[i] << ", want "
        << want[i];
  }
  EXPECT_LT(nan, n / 4);  // most blocks have finite scales
}

INSTANTIATE_TEST_SUITE_P(Types, DequantVsGguf,
                         ::testing::Values(GgufType::Q8_0, GgufType::Q4_0, GgufType::Q4_1, GgufType::Q5_0,
                                           GgufType::Q5_1, GgufType::Q2_K, GgufType::Q3_K, GgufType::Q4_K,
                                           GgufType::Q5_K, GgufType::Q6_K, GgufType::MXFP4),
                         [](const auto& info) { return std::string(type_name(info.param)); });

// The type table holds ggml's block layout of every type the gguf package knows.
TEST(GgufTypes, BlockSizesMatchTheGgufPackage) {
  ScratchDir dir;
  run_reference({"sizes", (dir.path / "sizes.txt").string()});
  std::ifstream in(dir.path / "sizes.txt");
  int rows = 0;
  for (uint32_t id, elems, bytes; in >> id >> elems >> bytes; ++rows) {
    ASSERT_TRUE(is_known_type(id)) << "type id " << id;
    // gguf 0.19.0 still lists Q8_1 with f32 d and s (40 bytes); ggml's block_q8_1 holds two halves (36), as the
    // gguf-py of the llama.cpp we compare with does.
    if (id == uint32_t(GgufType::Q8_1)) {
      EXPECT_TRUE(bytes == 40 || bytes == 36) << bytes;
      EXPECT_EQ(block_bytes(GgufType::Q8_1), 36u);
      continue;
    }
    EXPECT_EQ(block_elems(GgufType(id)), elems) << ggml_type_name(id);
    EXPECT_EQ(block_bytes(GgufType(id)), bytes) << ggml_type_name(id);
  }
  EXPECT_GE(rows, 30);
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u}) EXPECT_FALSE(is_known_type(removed)) << removed;
  EXPECT_FALSE(is_known_type(43));
  EXPECT_TRUE(is_supported_type(uint32_t(GgufType::Q6_K)));
  EXPECT_TRUE(is_supported_type(uint32_t(GgufType::MXFP4)));
  EXPECT_FALSE(is_supported_type(uint32_t(GgufType::IQ2_XXS)));
  EXPECT_FALSE(is_supported_type(uint32_t(GgufType::Q8_K)));
}

// find_non_finite names the first block whose d, dmin or m is infinite or NaN.
TEST(DequantRow, NonFiniteScalesAreFound) {
  auto gen = rng(77);
  for (GgufType t : {GgufType::Q4_1, GgufType::Q5_0, GgufType::Q2_K, GgufType::Q3_K, GgufType::Q4_K, GgufType::Q5_K,
                     GgufType::Q6_K}) {
    const size_t bb = block_bytes(t), be = block_elems(t);
    std::vector<uint8_t> blocks(bb * 6);
    for (auto& x : blocks) x = uint8_t(gen());
    const auto fields = scale_fields(t);
    for (size_t b = 0; b < 6; ++b)
      for (size_t f : fields) {
        const uint16_t h = f32_to_f16(0.01f);
        std::memcpy(&blocks[b * bb + f], &h, 2);
      }
    EXPECT_EQ(find_non_finite(t, blocks.data(), 6 * be), std::nullopt) << type_name(t);
    const uint16_t nan = 0x7E00;
    std::memcpy(&blocks[4 * bb + fields.back()], &nan, 2);
    EXPECT_EQ(find_non_finite(t, blocks.data(), 6 * be), std::optional<uint64_t>(4 * be)) << type_name(t);
  }
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
  EXPECT_THROW(dequantize_row(GgufType::Q4_K, q.data(), out.data(), 32), InvalidArgument);    // not 256
  EXPECT_THROW(dequantize_row(GgufType::IQ2_XXS, q.data(), out.data(), 0), InvalidArgument);  // not runnable
}

}  // namespace
}  // namespace wgllm::test
