// Shared helpers for the tests: one GPU context per process, seeded random data, error metrics.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/batch.h"

namespace wgllm::test {

// What the tests' contexts are made with: the adapter from $WGLLM_ADAPTER (default: the best one), the tests' own
// shaders (test_shaders.h), and the developer aids $WGLLM_KERNEL_DIR and $WGLLM_DUMP_SHADERS (README).
gpu::ContextOptions context_options();
// context_options() with `edit` applied (a context of its own: another matvec shape, f16 or subgroups off).
template <typename Edit>
gpu::ContextOptions context_options(Edit edit) {
  gpu::ContextOptions o = context_options();
  edit(o);
  return o;
}
// The process-wide context, made with context_options().
gpu::Context& context();
// The run's random seed: fresh each run unless $WGLLM_TEST_SEED is set.
uint64_t seed();

inline std::mt19937_64 rng(uint64_t salt = 0) { return std::mt19937_64(seed() ^ (salt * 0x9E3779B97F4A7C15ull)); }

inline std::vector<float> random_floats(size_t n, std::mt19937_64& gen, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// A random order of the pages of a cache of max_seq positions in pages of page_size (KvCacheConfig::page_order), so
// tests see pages scattered through the pools; empty for a one-page cache.
inline std::vector<uint32_t> shuffled_pages(uint32_t max_seq, uint32_t page_size, uint64_t salt) {
  if (page_size == 0 || page_size >= max_seq) return {};
  std::vector<uint32_t> order((max_seq + page_size - 1) / page_size);
  std::iota(order.begin(), order.end(), 0u);
  auto gen = rng(salt);
  std::shuffle(order.begin(), order.end(), gen);
  return order;
}

// For failure messages: a string with newlines, tabs and control bytes escaped, and ids space-separated.
inline std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}
inline std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// A bit pattern that is NaN as f32 (and as both f16 halves): outputs are poisoned with it first.
constexpr uint32_t kPoison = 0x7FC07FC0u;

// Relative L2 error ||got - want|| / ||want||, with the worst element for the failure message.
struct ErrorReport {
  double rel_l2 = 0;
  size_t worst_index = 0;
  double worst_got = 0, worst_want = 0;
  bool has_nan = false;
  std::string describe() const {
    std::ostringstream s;
    s << "rel L2 " << rel_l2 << ", worst element [" << worst_index << "]: got " << worst_got << " want " << worst_want
      << (has_nan ? " (NaN present)" : "");
    return s.str();
  }
};

template <typename A, typename B>
ErrorReport compare(std::span<const A> got, std::span<const B> want) {
  ErrorReport r;
  double num = 0, den = 0, worst = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (std::isnan(g) || std::isinf(g)) r.has_nan = true;
    const double d = std::abs(g - w);
    num += d * d;
    den += w * w;
    if (!(d <= worst)) {
      worst = d;
      r.worst_index = i;
      r.worst_got = g;
      r.worst_want = w;
    }
  }
  r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (r.has_nan) r.rel_l2 = INFINITY;
  return r;
}

template <typename A, typename B>
ErrorReport compare(const std::vector<A>& got, const std::vector<B>& want) {
  return compare(std::span<const A>(got), std::span<const B>(want));
}

}  // namespace wgllm::test
