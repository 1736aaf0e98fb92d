// Helpers shared by the kernel tests (tests/kernels/): random GGUF weights, poisoned output buffers, argument-check
// expectations, shuffled KV pages and the check of a row appended to a KV cache.
#pragma once
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "gguf/dequant.h"
#include "gguf/half.h"
#include "gguf/types.h"
#include "kernels/kv_cache.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {

constexpr auto F32 = GgufType::F32;
constexpr auto F16 = GgufType::F16;
constexpr auto BF16 = GgufType::BF16;
constexpr auto Q8_0 = GgufType::Q8_0;
constexpr auto Q4_0 = GgufType::Q4_0;
constexpr auto Q4_1 = GgufType::Q4_1;
constexpr auto Q5_0 = GgufType::Q5_0;
constexpr auto Q5_1 = GgufType::Q5_1;
constexpr auto Q2_K = GgufType::Q2_K;
constexpr auto Q3_K = GgufType::Q3_K;
constexpr auto Q4_K = GgufType::Q4_K;
constexpr auto Q5_K = GgufType::Q5_K;
constexpr auto Q6_K = GgufType::Q6_K;
constexpr auto MXFP4 = GgufType::MXFP4;

// Random GGUF bytes of a [ne1][ne0] tensor: values in [-1, 1] for float types; for block types random quants
// and sub-block scales, and random normal f16 scales of either sign (d in [0.002, 0.05] over the 6-bit
// sub-block scales of the K-quants, which multiply it by up to 63); MXFP4: random codes and scales 2^-9 .. 2^-4
// (values up to 0.75).
inline std::vector<uint8_t> random_weight(GgufType t, uint64_t ne0, uint64_t ne1, std::mt19937_64& gen) {
  std::vector<uint8_t> out(tensor_bytes(t, ne0, ne1));
  std::uniform_real_distribution<float> val(-1.f, 1.f), scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put16 = [&](size_t at, uint16_t h) {
    out[at] = uint8_t(h);
    out[at + 1] = uint8_t(h >> 8);
  };
  switch (t) {
    case GgufType::F32:
      for (size_t i = 0; i < ne0 * ne1; ++i) {
        const float f = val(gen);
        std::memcpy(&out[i * 4], &f, 4);
      }
      break;
    case GgufType::F16:
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, wgllm::f32_to_f16(val(gen)));
      break;
    case GgufType::BF16:
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, uint16_t(std::bit_cast<uint32_t>(val(gen)) >> 16));
      break;
    case GgufType::MXFP4:
      for (size_t b = 0; b < out.size(); b += 17) {
        out[b] = uint8_t(119 + byte(gen) % 6);
        for (size_t j = 1; j < 17; ++j) out[b + j] = uint8_t(byte(gen));
      }
      break;
    default: {
      const size_t bb = block_bytes(t);
      const float k_scale = block_elems(t) == 256 ? 1.f / 16 : 1.f;
      for (size_t b = 0; b < out.size(); b += bb) {
        for (size_t j = 0; j < bb; ++j) out[b + j] = uint8_t(byte(gen));
        for (size_t f : scale_fields(t))
          put16(b + f, wgllm::f32_to_f16(k_scale * (byte(gen) & 1 ? scale(gen) : -scale(gen))));
      }
      break;
    }
  }
  return out;
}

// f() must throw InvalidArgument whose message names `field`.
template <typename F>
void expect_throw(F f, const char* field) {
  try {
    f();
    ADD_FAILURE() << "no throw for " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

inline gpu::Buffer poisoned(gpu::Context& ctx, size_t floats, const char* label) {
  auto buf = ctx.create_buffer(floats * 4, WGPUBufferUsage_Storage, label);
  std::vector<uint32_t> poison(floats, kPoison);
  ctx.write_buffer(buf, 0, poison.data(), floats * 4);
  return buf;
}

// Rows next to `pos` written by the host before a kernel appends row `pos` of a KV cache: they must survive it, and
// the appended row must match the expected K and V (within the f16 cache's rounding).
struct AppendedRowCheck {
  uint32_t pos, lo, hi, kv_dim;
  std::vector<float> nk, nv;
  AppendedRowCheck(kernels::KvCache& kv, uint32_t pos, std::mt19937_64& gen)
      : pos(pos), lo(pos ? pos - 1 : 0), hi(std::min(kv.config().max_seq, pos + 2)), kv_dim(kv.config().kv_dim) {
    nk = random_floats(size_t(hi - lo) * kv_dim, gen);
    nv = random_floats(size_t(hi - lo) * kv_dim, gen);
    kv.write(lo, hi - lo, nk, nv);
  }
  void expect(const kernels::KvCache& kv, std::span<const float> want_k, std::span<const float> want_v) const {
    std::vector<float> gk, gv;
    kv.read(lo, hi - lo, gk, gv);
    const bool f16 = kv.config().type == kernels::KvType::F16;
    auto round = [&](float f) { return f16 ? wgllm::f16_to_f32(wgllm::f32_to_f16(f)) : f; };
    const size_t at = size_t(pos - lo) * kv_dim;
    for (size_t i = 0; i < gk.size(); ++i) {
      if (i >= at && i < at + kv_dim) continue;
      ASSERT_EQ(gk[i], round(nk[i])) << "K neighbour element " << i << " changed";
      ASSERT_EQ(gv[i], round(nv[i])) << "V neighbour element " << i << " changed";
    }
    const double tol = f16 ? 1e-3 : 1e-5;
    const auto rk = compare(std::span<const float>(gk).subspan(at, kv_dim), want_k);
    const auto rv = compare(std::span<const float>(gv).subspan(at, kv_dim), want_v);
    EXPECT_LE(rk.rel_l2, tol) << "K: " << rk.describe();
    EXPECT_LE(rv.rel_l2, tol) << "V: " << rv.describe();
  }
};

}  // namespace wgllm::test
