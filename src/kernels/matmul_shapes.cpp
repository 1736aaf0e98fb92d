// The product kernels' shapes as chosen or forced: parsing the matvec shape, the CPU adapters' Rows shape and the
// matmul tile (tuning options), the tile a prefill product takes, the digits and tile of the prompt products on
// x's digits, and the shapes as profiles name them. The encoders
// are in matmul.cpp.
#include <sstream>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/matmul_pipelines.h"
#include "wgllm/error.h"

namespace wgllm::kernels {

MatvecConfig parse_matvec_config(const std::string& text) {
  const std::string expected = "matvec config '" + text + "': expected THREADSxROWSxGROUPS[xUNITS[xINT_F16]]";
  std::vector<uint32_t> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t x = std::min(text.find('x', pos), text.size());
    const std::string part = text.substr(pos, x - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 4)
      throw InvalidArgument(expected);
    v.push_back(uint32_t(std::stoul(part)));
    pos = x + 1;
  }
  if (v.size() < 3 || v.size() > 5) throw InvalidArgument(expected);
  const MatvecConfig c{.threads_per_row = v[0],
                       .rows = v[1],
                       .groups = v[2],
                       .units = v.size() > 3 ? v[3] : 1,
                       .int_f16 = v.size() > 4 && v[4] != 0};
  const bool bad = c.threads_per_row == 0 || c.rows == 0 || c.units == 0 || c.rows % 2 || c.groups == 0 ||
                   (c.threads_per_row & (c.threads_per_row - 1)) || c.threads_per_row * c.groups > 1024;
  if (bad)
    throw InvalidArgument("matvec config '" + text +
                          "': threads per row a power of two, rows even, groups > 0, <= 1024 threads");
  return c;
}

std::optional<RowsConfig> rows_config(const gpu::Context& ctx) {
  const std::string& forced = ctx.options().rows_shape;
  const std::optional<RowsConfig> c = forced.empty()    ? RowsConfig{}
                                      : forced == "off" ? std::optional<RowsConfig>{}
                                                        : parse_rows_config(forced);
  if (!ctx.adapter().is_cpu()) return std::nullopt;
  return c;
}

RowsConfig parse_rows_config(const std::string& text) {
  const std::string expected = "rows shape '" + text + "': expected WORKGROUPxROWSxTOKENS: a workgroup of 1..256 " +
                               "invocations (a power of two), 2 or 4 rows, 1..8 tokens (e.g. 16x4x4)";
  std::vector<uint32_t> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t x = std::min(text.find('x', pos), text.size());
    const std::string part = text.substr(pos, x - pos);
    if (part.empty() || part.size() > 3 || part.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgument(expected);
    v.push_back(uint32_t(std::stoul(part)));
    pos = x + 1;
  }
  if (v.size() != 3) throw InvalidArgument(expected);
  const RowsConfig c{.workgroup = v[0], .rows = v[1], .tokens = v[2]};
  if (c.workgroup == 0 || c.workgroup > 256 || (c.workgroup & (c.workgroup - 1)) || (c.rows != 2 && c.rows != 4) ||
      c.tokens == 0 || c.tokens > 8)
    throw InvalidArgument(expected);
  return c;
}

bool rows_kernel_reads(GgufType type) {
  return type == GgufType::F32 || type == GgufType::F16 || type == GgufType::BF16 || type == GgufType::Q8_0 ||
         type == GgufType::Q4_0 || type == GgufType::Q4_1 || type == GgufType::Q5_0 || type == GgufType::Q5_1 ||
         type == GgufType::Q4_K || type == GgufType::Q5_K || type == GgufType::Q6_K || type == GgufType::MXFP4;
}

bool rows_kernel_for(const gpu::Context& ctx, GgufType type) {
  return rows_kernel_reads(type) && rows_config(ctx).has_value();
}

MatmulImpl token_independent_impl(const gpu::Context& ctx) {
  return rows_config(ctx) ? MatmulImpl::Rows : MatmulImpl::Batch;
}

MatmulTile matmul_tile(const gpu::Context& ctx, uint32_t n_tokens, uint32_t n_rows) {
  MatmulTile t;
  if (!ctx.options().matmul_tile.empty()) {
    t = parse_matmul_tile(ctx.options().matmul_tile);
  } else if (!ctx.adapter().is_cpu()) {
    // GPUs: 64 x 128 where it still gives at least 512 workgroups, else 64 x 64; f32 tiles (PERF.md, the tile
    // sweep on the H200: 128 x 128 was no faster with many workgroups and slower with few; f16 tiles gained
    // 5-15 % at the price of f16 rounding of activations, which can overflow, so they are opt-in).
    const uint64_t wide = uint64_t((n_tokens + 63) / 64) * ((n_rows + 127) / 128);
    if (wide >= 512) t = {.tokens = 64, .rows = 128, .thread_rows = 8};
  }
  // CPU adapters (lavapipe) run a workgroup on one core: 64 x 64 keeps each thread's 16 sums in registers.
  if (t.f16 && !ctx.features().shader_f16)
    throw InvalidArgument("matmul tile " + to_string(t) + " needs the adapter's shader-f16 feature");
  // The two tiles of 32 k and, for f16 tiles, the f32 sums of x^2.
  const uint64_t bytes = 32ull * (t.tokens + t.rows) * (t.f16 ? 2 : 4) + (t.f16 ? 16ull * t.tokens : 0);
  if (bytes > ctx.limits().maxComputeWorkgroupStorageSize)
    throw InvalidArgument("matmul tile " + to_string(t) + " needs " + std::to_string(bytes) +
                          " bytes of workgroup memory; the adapter allows " +
                          std::to_string(ctx.limits().maxComputeWorkgroupStorageSize));
  return t;
}

uint32_t prompt_digits(const gpu::Context& ctx) {
  const uint32_t d = ctx.options().prompt_digits.value_or(ctx.adapter().is_cpu() ? 0 : 3);
  if (d > 3) throw InvalidArgument("prompt digits " + std::to_string(d) + ": 0 (off) to 3");
  return d;
}

uint32_t prompt_digits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens) {
  const uint32_t d = prompt_digits(ctx);
  if (!ctx.options().prompt_digits && n_tokens < kDefaultDigitsFromTokens) return 0;
  const bool kquant = w.type == GgufType::Q4_K || w.type == GgufType::Q6_K;
  const bool q8 = w.type == GgufType::Q8_0 && d <= 2 && w.n_in % 128 == 0;
  if (d == 0 || !(kquant || q8)) return 0;
  // (the 64 x 64 tile's bytes: the 32 x 128 of the expert tiles of 32 pairs never take more, int_tiled_bytes)
  return detail::int_tiled_bytes(w.type, d) <= ctx.limits().maxComputeWorkgroupStorageSize ? d : 0;
}

uint32_t prompt_tile(const gpu::Context& ctx, uint32_t otherwise) {
  const uint32_t t = ctx.options().prompt_tile.value_or(otherwise);
  if (t != 32 && t != detail::kIntTile) throw InvalidArgument("prompt tile " + std::to_string(t) + ": 32 or 64");
  return t;
}

MatmulTile parse_matmul_tile(const std::string& text) {
  const std::string expected =
      "matmul tile '" + text +
      "': expected TOKENSxROWS[/TTxTR][xf16], TOKENS and ROWS 16, 32, 64 or 128, TT and TR 4 or 8, "
      "32 to 256 threads whose quarter divides TOKENS and ROWS (e.g. 128x64xf16, 64x128/8x8)";
  MatmulTile t;
  std::string rest = text;
  if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, "xf16") == 0) {
    t.f16 = true;
    rest.resize(rest.size() - 4);
  }
  // Two "AxB" numbers with A, B from `allowed`.
  auto pair = [&](const std::string& s, std::initializer_list<uint32_t> allowed) {
    const size_t x = s.find('x');
    if (x == std::string::npos) throw InvalidArgument(expected);
    std::array<uint32_t, 2> v{};
    for (int i = 0; i < 2; ++i) {
      const std::string part = i ? s.substr(x + 1) : s.substr(0, x);
      for (uint32_t a : allowed)
        if (part == std::to_string(a)) v[i] = a;
      if (!v[i]) throw InvalidArgument(expected);
    }
    return v;
  };
  const size_t slash = rest.find('/');
  const auto tile = pair(rest.substr(0, slash), {16, 32, 64, 128});
  t.tokens = tile[0], t.rows = tile[1];
  t.thread_tokens = t.tokens / 16, t.thread_rows = t.rows / 16;
  if (slash != std::string::npos) {
    const auto thread = pair(rest.substr(slash + 1), {4, 8});
    t.thread_tokens = thread[0], t.thread_rows = thread[1];
  }
  const bool micro = (t.thread_tokens == 4 || t.thread_tokens == 8) && (t.thread_rows == 4 || t.thread_rows == 8);
  const uint32_t threads = micro ? t.threads() : 0;
  if (threads < 32 || threads > 256 || t.tokens % (threads / 4) || t.rows % (threads / 4))
    throw InvalidArgument(expected);
  return t;
}

// (Made for every product a step encodes: appended piece by piece, no stream.)
std::string detail::shape_detail(GgufType t, std::initializer_list<uint32_t> dims) {
  std::string s = type_name(t);
  char sep = ' ';
  for (uint32_t d : dims) {
    s += sep;
    s += std::to_string(d);
    sep = 'x';
  }
  return s;
}

std::string detail::tiled_detail(GgufType t, const MatmulTile* tile, uint32_t groups) {
  std::string s = type_name(t);
  if (tile) {
    s += ' ';
    s += to_string(*tile);
  }
  if (groups > 0) s += ", batch order";
  if (groups > 1) {
    s += ", split ";
    s += std::to_string(groups);
  }
  return s;
}

std::string to_string(const MatmulTile& t) {
  std::ostringstream s;
  s << t.tokens << "x" << t.rows;
  if (t.thread_tokens != t.tokens / 16 || t.thread_rows != t.rows / 16)
    s << "/" << t.thread_tokens << "x" << t.thread_rows;
  if (t.f16) s << "xf16";
  return s.str();
}

}  // namespace wgllm::kernels
