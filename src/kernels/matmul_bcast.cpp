// Batch decode's float-type products with x broadcast (matmul_bcast.h, matmul_bcast.wgsl).
#include "kernels/matmul_bcast.h"

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/check.h"
#include "kernels/norm.h"

namespace wgllm::kernels {

namespace {

constexpr uint32_t kPassTokens = 16;       // BC_NT's largest: tokens a pass over the weights
constexpr uint32_t kMaxThreads = 256;      // a workgroup: lanes x slices
constexpr uint32_t kFillThreads = 65'536;  // lanes x slices in all a product aims for (an H100's 132 SMs at 16 warps)

// Mirrors `Params` in matmul_bcast.wgsl.
struct BcastParams {
  uint32_t n_out, n_tokens, row_words, x_stride;
  uint32_t t0, row_begin, slice, grid_x;
  uint32_t y_width, y1_width, y2_width, split1;
  uint32_t split2, pad0, pad1, pad2;
};
static_assert(sizeof(BcastParams) == 64);

uint32_t type_code(GgufType t) { return t == GgufType::F32 ? 0 : t == GgufType::F16 ? 1 : 2; }
uint32_t words_per_row(const GpuWeight& w) { return w.n_blocks * (w.type == GgufType::F32 ? 8 : 4); }

// What a pipeline is made of: its shape and what it does after its sums.
struct BcastKey {
  uint32_t nt, rows, lanes, slices, units, type, f16_int, bias, acc, swiglu, gelu, split;
};
static_assert(sizeof(BcastKey) == 48);

WGPUComputePipeline bcast_pipeline(gpu::Context& ctx, const BcastKey& k) {
  static const char site[] = "bcast";
  const std::span<const uint32_t> args(reinterpret_cast<const uint32_t*>(&k), sizeof k / 4);
  return ctx.pipeline(site, args, [&] {
    auto u32 = [](const char* name, uint32_t v) {
      return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
    };
    auto b = [](const char* name, uint32_t v) {
      return std::string("const ") + name + ": bool = " + (v ? "true" : "false") + ";\n";
    };
    const uint32_t red = std::max(1u, k.slices / 2 * k.rows * k.nt * k.lanes);
    std::string prelude = u32("BC_NT", k.nt) + u32("BC_R", k.rows) + u32("BC_L", k.lanes) + u32("BC_W", k.slices) +
                          u32("BC_U", k.units) + u32("BC_TYPE", k.type) + b("BC_F16_INT", k.f16_int) +
                          b("BC_BIAS", k.bias) + b("BC_ACC", k.acc) + b("BC_SWIGLU", k.swiglu) +
                          b("BC_GELU", k.gelu) + b("BC_SPLIT", k.split) + u32("BC_RN", k.rows * k.nt) +
                          u32("BC_RED", red);
    std::string detail = std::string(k.type == 0 ? "F32" : k.type == 1 ? "F16" : "BF16") + " bcast " +
                         std::to_string(k.lanes) + "x" + std::to_string(k.rows) + "x" + std::to_string(k.slices) +
                         "x" + std::to_string(k.units) + " " + std::to_string(k.nt) + (k.nt == 1 ? " token" : " tokens");
    return gpu::PipelineKey{"matmul_bcast.wgsl", "main", {}, std::move(prelude), std::move(detail)};
  });
}

}  // namespace

BcastShape parse_bcast_shape(const std::string& text) {
  const std::string expected =
      "bcast shape '" + text + "': expected ROWSxUNITS[xINT_F16] with ROWS 1, 2 or 4, UNITS 1, 2 or 4, INT_F16 0 or 1";
  std::vector<uint32_t> v;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find('x', at), text.size());
    const std::string part = text.substr(at, end - at);
    if (part.empty() || part.size() > 2 || part.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgument(expected);
    v.push_back(uint32_t(std::stoul(part)));
    at = end + 1;
  }
  if (v.size() < 2 || v.size() > 3) throw InvalidArgument(expected);
  const BcastShape s{.rows = v[0], .units = v[1], .int_f16 = v.size() > 2 && v[2] == 1};
  if ((s.rows != 1 && s.rows != 2 && s.rows != 4) || (s.units != 1 && s.units != 2 && s.units != 4) ||
      (v.size() > 2 && v[2] > 1))
    throw InvalidArgument(expected);
  return s;
}

uint32_t bcast_slices(const gpu::Context& ctx, const GpuWeight& w) {
  const uint32_t words = words_per_row(w);
  const uint32_t min_words = w.type == GgufType::F32 ? 32 : 16;  // 128 elements
  const uint32_t max_threads = std::min(kMaxThreads, ctx.limits().maxComputeInvocationsPerWorkgroup);
  // the tree's workgroup memory: (slices / 2) x lanes x 2 rows x 16 tokens floats, lanes = max_threads / slices
  const uint64_t tree_bytes = uint64_t(max_threads) / 2 * 2 * kPassTokens * 4;
  if (tree_bytes > ctx.limits().maxComputeWorkgroupStorageSize) return 1;
  uint32_t s = 1;
  const uint64_t lanes = (uint64_t(w.n_out) + 1) / 2;  // two rows a lane at most
  while (s < 32 && lanes * s < kFillThreads && words / (2 * s) >= min_words && max_threads / (2 * s) >= 8) s *= 2;
  return s;
}

namespace detail {

bool bcast_takes(const gpu::Context& ctx, const GpuWeight& w, const MatmulOptions& o, uint32_t n_tokens) {
  if (!ctx.options().batch_bcast.value_or(!ctx.adapter().is_cpu())) return false;
  if (w.type != GgufType::F32 && w.type != GgufType::F16 && w.type != GgufType::BF16) return false;
  if (w.n_in % 32 || w.n_experts || o.times || o.pre || o.second || o.digits) return false;
  if (o.act != GateAct::Silu && o.act != GateAct::GeluTanh) return false;
  const uint64_t x_bytes = uint64_t(n_tokens) * w.n_in * 4;
  return x_bytes <= ctx.max_binding_size() && uint64_t(n_tokens) * w.n_out * 4 <= ctx.max_binding_size();
}

void encode_bcast(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                  const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& o) {
  const gpu::Buffer* in = &x;
  if (o.norm) {  // the norm of x first, into the scratch buffer the product then reads
    const gpu::Buffer& scratch = ctx.scratch(uint64_t(n_tokens) * w.n_in * 4);
    if (scratch.get() == x.get() || scratch.get() == y.get())
      fail("encode_matmul", "x and y must not be the context's scratch buffer");
    encode_rms_norm(batch, ctx, x, *o.norm, scratch, n_tokens, w.n_in, o.eps);
    in = &scratch;
  }
  const bool split = o.y1 != nullptr;
  const uint32_t n_out = w.n_out;
  const uint32_t y_width = split ? o.split1 : o.swiglu ? n_out / 2 : n_out;
  const uint32_t y1_width = split ? o.split2 - o.split1 : 1, y2_width = split && o.y2 ? n_out - o.split2 : 1;
  BcastShape shape = ctx.options().bcast_shape.empty() ? BcastShape{} : parse_bcast_shape(ctx.options().bcast_shape);
  if (shape.rows == 0) shape.rows = o.swiglu || n_out >= 8192 ? 2 : 1;
  if (o.swiglu && shape.rows == 1) shape.rows = 2;  // a lane owns (gate, up) pairs
  const uint32_t slices = bcast_slices(ctx, w);
  // lanes: at most 32, the workgroup's invocations and the tree's workgroup memory ((slices / 2) x lanes x rows x 16
  // tokens floats) permitting; at least 1 (bcast_slices leaves room for 2 rows)
  uint32_t lanes = std::min(32u, std::min(kMaxThreads, ctx.limits().maxComputeInvocationsPerWorkgroup) / slices);
  if (slices > 1)
    while (lanes > 1 &&
           uint64_t(slices / 2) * lanes * shape.rows * kPassTokens * 4 > ctx.limits().maxComputeWorkgroupStorageSize)
      lanes /= 2;
  const uint32_t words = words_per_row(w);
  uint32_t units = shape.units;
  while (words % units) units /= 2;  // a step never passes the row's end
  const uint32_t per_slice = (words + slices - 1) / slices;
  const uint32_t slice = (per_slice + units - 1) / units * units;
  const gpu::Buffer& none = ctx.placeholder_storage();
  const gpu::Buffer& none_w = ctx.placeholder_writable();
  for (uint32_t t0 = 0; t0 < n_tokens; t0 += kPassTokens) {
    const uint32_t count = std::min(kPassTokens, n_tokens - t0);
    const uint32_t nt = count == 1 ? 1 : count <= 2 ? 2 : count <= 4 ? 4 : count <= 8 ? 8 : 16;
    const BcastKey key{.nt = nt,
                       .rows = shape.rows,
                       .lanes = lanes,
                       .slices = slices,
                       .units = units,
                       .type = type_code(w.type),
                       .f16_int = shape.int_f16,
                       .bias = o.bias != nullptr,
                       .acc = o.accumulate,
                       .swiglu = o.swiglu,
                       .gelu = o.swiglu && o.act == GateAct::GeluTanh,
                       .split = split};
    WGPUComputePipeline pipe = bcast_pipeline(ctx, key);
    for (const auto& piece : w.pieces) {
      const uint32_t groups = (piece.n_rows + lanes * shape.rows - 1) / (lanes * shape.rows);
      const auto grid = gpu::fold_grid(groups, ctx.limits().maxComputeWorkgroupsPerDimension);
      const BcastParams p{.n_out = piece.n_rows,
                          .n_tokens = count,
                          .row_words = words,
                          .x_stride = w.n_in / 4,
                          .t0 = t0,
                          .row_begin = piece.row_begin,
                          .slice = slice,
                          .grid_x = grid.x,
                          .y_width = y_width,
                          .y1_width = y1_width,
                          .y2_width = y2_width,
                          .split1 = o.split1,
                          .split2 = o.split2,
                          .pad0 = 0,
                          .pad1 = 0,
                          .pad2 = 0};
      const gpu::BufferBinding b[] = {
          batch.uniform(0, p),
          {1, &piece.buffer, 0, piece.buffer.size},
          {2, in, 0, uint64_t(n_tokens) * w.n_in * 4},
          {3, &y, 0, uint64_t(n_tokens) * y_width * 4},
          o.bias ? gpu::BufferBinding{4, o.bias, 0, uint64_t(n_out) * 4} : gpu::BufferBinding{4, &none, 0, 16},
          split ? gpu::BufferBinding{5, o.y1, 0, uint64_t(n_tokens) * y1_width * 4}
                : gpu::BufferBinding{5, &none_w, 0, 16},
          split && o.y2 ? gpu::BufferBinding{6, o.y2, 0, uint64_t(n_tokens) * y2_width * 4}
                        : gpu::BufferBinding{6, &none_w, 0, 16}};
      batch.dispatch(pipe, b, grid.x, grid.y);
    }
  }
}

}  // namespace detail
}  // namespace wgllm::kernels
