#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "wgllm/error.h"

namespace wgllm::kernels {

namespace {

constexpr uint32_t kBlock = 32;
constexpr uint32_t kTile = 64;             // TM = TN in matmul.wgsl
constexpr uint32_t kFlagBias = 1, kFlagLastPiece = 2, kFlagNorm = 4, kFlagAccum = 8, kFlagSwiglu = 16, kFlagSplit = 32,
                   kFlagRopeKv = 64, kFlagNeox = 128;

[[noreturn]] void fail(const char* fn, const std::string& what) { throw InvalidArgument(std::string(fn) + ": " + what); }

bool quantised(WeightType t) { return t == WeightType::Q8_0 || t == WeightType::Q4_0; }

// GPU bytes of one block's elements (quants only for the quantised types).
uint32_t block_data_bytes(WeightType t) {
  switch (t) {
    case WeightType::F32: return 128;
    case WeightType::F16:
    case WeightType::BF16: return 64;
    case WeightType::Q8_0: return 32;
    case WeightType::Q4_0: return 16;
  }
  return 0;
}

// GGUF bytes of one block of 32 (or per element for the float types x 32).
uint32_t gguf_block_bytes(WeightType t) {
  switch (t) {
    case WeightType::F32: return 128;
    case WeightType::F16:
    case WeightType::BF16: return 64;
    case WeightType::Q8_0: return 34;
    case WeightType::Q4_0: return 18;
  }
  return 0;
}

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// Bytes of a piece of `rows` rows (quants, 16-byte aligned, then scales).
uint64_t piece_bytes(WeightType t, uint32_t nb, uint64_t rows) {
  const uint64_t data = rows * nb * block_data_bytes(t);
  if (!quantised(t)) return data;
  return data + round_up(rows * nb * 2, 16);
}

// Repacks GGUF rows [row_begin, row_begin + rows) into the GPU piece layout.
std::vector<uint8_t> repack(WeightType t, uint32_t n_in, uint32_t nb, const uint8_t* src, uint32_t row_begin,
                            uint32_t rows) {
  std::vector<uint8_t> out(piece_bytes(t, nb, rows), 0);
  if (!quantised(t)) {
    const uint32_t esize = t == WeightType::F32 ? 4 : 2;
    const uint64_t src_row = uint64_t(n_in) * esize, dst_row = uint64_t(nb) * block_data_bytes(t);
    for (uint32_t r = 0; r < rows; ++r)
      std::memcpy(&out[r * dst_row], src + (uint64_t(row_begin) + r) * src_row, src_row);
    return out;
  }
  const uint32_t qbytes = block_data_bytes(t), bbytes = gguf_block_bytes(t);
  const uint64_t scales = uint64_t(rows) * nb * qbytes;
  const uint8_t* s = src + uint64_t(row_begin) * nb * bbytes;
  for (uint64_t blk = 0; blk < uint64_t(rows) * nb; ++blk, s += bbytes) {
    std::memcpy(&out[scales + blk * 2], s, 2);
    std::memcpy(&out[blk * qbytes], s + 2, qbytes);
  }
  return out;
}

// A contiguous range of rows of `stride` 4-byte words bound with an aligned offset.
struct RowWindow {
  uint64_t offset_bytes, size_bytes;
  uint32_t first_word;  // words from the binding start to the first row
};
RowWindow row_window(const gpu::Context& ctx, uint64_t first_row, uint64_t n_rows, uint64_t stride) {
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t begin = first_row * stride * 4;
  const uint64_t offset = begin / align * align;
  const uint64_t end = (first_row + n_rows) * stride * 4;
  return {offset, end - offset, uint32_t((begin - offset) / 4)};
}

// Tokens per dispatch so that windows of rows with these strides (in words) fit a binding.
uint32_t tokens_per_binding(const char* fn, const gpu::Context& ctx, std::initializer_list<uint64_t> strides) {
  const uint64_t room = ctx.max_binding_size() - ctx.limits().minStorageBufferOffsetAlignment;
  uint64_t rows = UINT32_MAX;
  for (uint64_t s : strides) rows = std::min(rows, room / (s * 4));
  if (rows == 0) fail(fn, "one activation row exceeds the storage-binding limit");
  return uint32_t(rows);
}

MatvecConfig g_matvec_override{.threads_per_row = 0};  // threads_per_row == 0: none

uint32_t matvec_slots(const MatvecConfig& mv) {
  return mv.threads_per_row / std::min(mv.threads_per_row, mv.shuffle ? 4u : 1u);
}

// Host constants for matmul_common.wgsl (and the kernels after it).
std::string prelude(WeightType t, uint32_t nt, bool int_f16 = false) {
  return "const WTYPE: u32 = " + std::to_string(uint32_t(t)) + "u;\nconst NT: u32 = " + std::to_string(nt) +
         "u;\nconst F16_INT: bool = " + (int_f16 ? "true" : "false") + ";\n";
}

// ... and for matvec.wgsl: its shape, the lane sum and the entry point.
std::string matvec_prelude(const MatvecConfig& mv, WeightType t, uint32_t nt, bool xv4) {
  auto u32 = [](const char* name, uint32_t v) {
    return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
  };
  std::string s = prelude(t, nt, mv.int_f16) + u32("MV_T", mv.threads_per_row) + u32("MV_R", mv.rows) +
                  u32("MV_G", mv.groups) + u32("MV_NV", mv.rows * nt + nt) + u32("MV_U", mv.units) +
                  u32("MV_SLOTS", matvec_slots(mv)) + "const XV4: bool = " + (xv4 ? "true" : "false") + ";\n";
  if (mv.shuffle)
    return s +
           "fn mv_lane_sum(v: f32, chunk: u32) -> f32 {\n  var s = v;\n"
           "  for (var m = 1u; m < chunk; m <<= 1u) { s += subgroupShuffleXor(s, m); }\n  return s;\n}\n"
           "@compute @workgroup_size(MV_WG)\nfn matvec(@builtin(workgroup_id) wid: vec3<u32>, "
           "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) {\n"
           "  matvec_main(wid, lid, sg);\n}\n";
  return s +
         "fn mv_lane_sum(v: f32, chunk: u32) -> f32 { return v; }\n"
         "@compute @workgroup_size(MV_WG)\nfn matvec(@builtin(workgroup_id) wid: vec3<u32>, "
         "@builtin(local_invocation_index) lid: u32) { matvec_main(wid, lid, 1u); }\n";
}

constexpr const char* kMatvecShader = "matmul_common.wgsl+rope_angle.wgsl+matvec.wgsl";
constexpr const char* kMatmulShader = "matmul_common.wgsl+matmul.wgsl";

// The parameters every dispatch over one piece of w shares.
MatmulParams piece_params(const GpuWeight& w, const GpuWeightPiece& piece, uint32_t n_tokens) {
  MatmulParams p{};
  p.n_in = w.n_in;
  p.n_out = w.n_out;
  p.n_tokens = n_tokens;
  p.nb = w.n_blocks;
  p.row_begin = piece.row_begin;
  p.n_rows = piece.n_rows;
  p.scale_off4 = piece.scale_off4;
  return p;
}

void check_weight(const char* fn, const GpuWeight& w) {
  if (w.pieces.empty() || w.n_in == 0 || w.n_out == 0) fail(fn, "weight W is empty (not uploaded)");
}

}  // namespace

MatvecConfig matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in) {
  MatvecConfig c;
  if (g_matvec_override.threads_per_row) c = g_matvec_override;
  // CPU adapters (lavapipe) run a workgroup on one core, SIMD across invocations: short rows of
  // threads with few reduction steps win.
  else if (ctx.adapter().is_cpu())
    c = {.threads_per_row = 8, .rows = 2, .groups = 8};
  // GPUs (measured on the H200 at full clocks, PERF.md): tall matrices stream best with a subgroup
  // per 4 rows; below ~16k rows that leaves too few workgroups to fill the GPU, and 128 threads per
  // row (4 rows per workgroup) do better, 256 for long rows (the FFN down projection).
  else if (n_rows >= 16384)
    c = {.threads_per_row = 32, .rows = 4, .groups = 4};
  else if (n_in >= 4096)
    c = {.threads_per_row = 256, .rows = 4, .groups = 1};
  else
    c = {.threads_per_row = 128, .rows = 4, .groups = 1};
  c.shuffle = ctx.features().subgroups;
  const uint64_t red_bytes = uint64_t(c.rows + 1) * kMatvecMaxTokens * c.groups * matvec_slots(c) * 4;
  if (red_bytes > ctx.limits().maxComputeWorkgroupStorageSize ||
      c.threads_per_row * c.groups > ctx.limits().maxComputeInvocationsPerWorkgroup)
    throw InvalidArgument("matvec config " + std::to_string(c.threads_per_row) + "x" + std::to_string(c.rows) + "x" +
                          std::to_string(c.groups) + " exceeds the adapter's workgroup limits");
  return c;
}

bool rope_kv_supported(const gpu::Context& ctx, const GpuWeight& w, const RopeKvAppend& rk) {
  if (!rk.neox) return true;
  return rk.head_dim % 4 == 0 && rk.rope_dim % 4 == 0 && w.pieces.size() == 1 &&
         matvec_config(ctx, w.n_out, w.n_in).rows % 4 == 0;
}

void set_matvec_config_override(const MatvecConfig& c) {
  const bool bad = c.rows == 0 || c.units == 0 || c.rows % 2 || c.groups == 0 ||
                   c.rows * kMatvecMaxTokens > c.threads_per_row || (c.threads_per_row & (c.threads_per_row - 1)) ||
                   c.threads_per_row * c.groups > 1024;
  if (c.threads_per_row && bad)
    throw InvalidArgument(
        "matvec config: threads per row a power of two >= rows * 4, rows even, groups > 0, <= 1024 threads");
  g_matvec_override = c;
}

MatvecConfig parse_matvec_config(const std::string& text) {
  std::vector<uint32_t> v;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t x = std::min(text.find('x', pos), text.size());
    const std::string part = text.substr(pos, x - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 4)
      throw InvalidArgument("matvec config '" + text + "': expected THREADSxROWSxGROUPS[xUNITS[xINT_F16]]");
    v.push_back(uint32_t(std::stoul(part)));
    pos = x + 1;
  }
  if (v.size() < 3 || v.size() > 5)
    throw InvalidArgument("matvec config '" + text + "': expected THREADSxROWSxGROUPS[xUNITS[xINT_F16]]");
  return {.threads_per_row = v[0], .rows = v[1], .groups = v[2], .units = v.size() > 3 ? v[3] : 1,
          .int_f16 = v.size() > 4 && v[4] != 0};
}

std::vector<uint8_t> concat_rows(std::span<const std::span<const uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<uint8_t> interleave_rows(std::span<const uint8_t> a, std::span<const uint8_t> b, uint64_t rows) {
  if (rows == 0 || a.size() != b.size() || a.size() % rows)
    throw InvalidArgument("interleave_rows: the two tensors must have the same size and " + std::to_string(rows) +
                          " rows");
  const uint64_t row = a.size() / rows;
  std::vector<uint8_t> out(a.size() * 2);
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(&out[2 * r * row], &a[r * row], row);
    std::memcpy(&out[(2 * r + 1) * row], &b[r * row], row);
  }
  return out;
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::F32: return "F32";
    case WeightType::F16: return "F16";
    case WeightType::BF16: return "BF16";
    case WeightType::Q8_0: return "Q8_0";
    case WeightType::Q4_0: return "Q4_0";
  }
  return "?";
}

WeightType weight_type_from_ggml(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return WeightType::F32;
    case 1: return WeightType::F16;
    case 2: return WeightType::Q4_0;
    case 8: return WeightType::Q8_0;
    case 30: return WeightType::BF16;
    default:
      throw InvalidArgument("weight type: GGML type " + std::to_string(ggml_type) +
                            " is not supported (F32, F16, BF16, Q8_0, Q4_0)");
  }
}

uint64_t gguf_bytes(WeightType t, uint64_t ne0, uint64_t ne1) {
  switch (t) {
    case WeightType::F32: return ne0 * ne1 * 4;
    case WeightType::F16:
    case WeightType::BF16: return ne0 * ne1 * 2;
    case WeightType::Q8_0: return ne0 / 32 * 34 * ne1;
    case WeightType::Q4_0: return ne0 / 32 * 18 * ne1;
  }
  return 0;
}

uint64_t GpuWeight::gpu_bytes() const {
  uint64_t b = 0;
  for (const auto& p : pieces) b += p.buffer.size;
  return b;
}

GpuWeight upload_weight(gpu::Context& ctx, WeightType type, uint64_t ne0, uint64_t ne1,
                        std::span<const uint8_t> bytes, std::string_view label, uint64_t max_piece_bytes) {
  const char* fn = "upload_weight";
  if (uint32_t(type) > uint32_t(WeightType::Q4_0)) fail(fn, "type " + std::to_string(uint32_t(type)) + " unknown");
  if (ne0 == 0 || ne0 > (1u << 24)) fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be in [1, 2^24]");
  if (ne1 == 0 || ne1 > UINT32_MAX) fail(fn, "ne1 (n_out) " + std::to_string(ne1) + " must be in [1, 2^32)");
  if (quantised(type) && ne0 % kBlock != 0)
    fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be a multiple of 32 for " + weight_type_name(type));
  if (bytes.size() != gguf_bytes(type, ne0, ne1))
    fail(fn, "bytes holds " + std::to_string(bytes.size()) + ", a " + weight_type_name(type) + " [" +
                 std::to_string(ne1) + "][" + std::to_string(ne0) + "] tensor needs " +
                 std::to_string(gguf_bytes(type, ne0, ne1)));
  GpuWeight w;
  w.type = type;
  w.n_in = uint32_t(ne0);
  w.n_out = uint32_t(ne1);
  w.n_blocks = uint32_t((ne0 + kBlock - 1) / kBlock);
  const uint64_t limit = max_piece_bytes ? std::min(max_piece_bytes, ctx.max_binding_size()) : ctx.max_binding_size();
  const uint64_t row_bytes = uint64_t(w.n_blocks) * (block_data_bytes(type) + (quantised(type) ? 2 : 0));
  uint64_t rows_per_piece = limit < 16 + row_bytes ? 0 : (limit - 16) / row_bytes;
  if (rows_per_piece > 1) rows_per_piece &= ~uint64_t(1);  // pieces start at even rows (SwiGLU pairs)
  if (rows_per_piece == 0)
    fail(fn, "one row (" + std::to_string(row_bytes) + " bytes) exceeds the storage-binding limit of " +
                 std::to_string(limit));
  for (uint64_t r0 = 0; r0 < ne1; r0 += rows_per_piece) {
    const uint32_t rows = uint32_t(std::min<uint64_t>(rows_per_piece, ne1 - r0));
    GpuWeightPiece piece;
    piece.row_begin = uint32_t(r0);
    piece.n_rows = rows;
    piece.scale_off4 = quantised(type) ? uint32_t(uint64_t(rows) * w.n_blocks * block_data_bytes(type) / 16) : 0;
    const auto data = repack(type, w.n_in, w.n_blocks, bytes.data(), piece.row_begin, rows);
    piece.buffer = ctx.create_buffer(data.size(), WGPUBufferUsage_Storage, label);
    ctx.write_buffer(piece.buffer, 0, data.data(), data.size());
    w.pieces.push_back(std::move(piece));
  }
  return w;
}

double matmul_flops(const GpuWeight& w, uint32_t n_tokens) { return 2.0 * w.n_in * w.n_out * n_tokens; }

void encode_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& o) {
  const char* fn = "encode_matmul";
  check_weight(fn, w);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  auto check_size = [&](const char* name, const gpu::Buffer& b, uint64_t floats, const char* what) {
    if (b.size < floats * 4)
      fail(fn, std::string(name) + " holds " + std::to_string(b.size) + " bytes, needs " + what + " = " +
                   std::to_string(floats * 4));
  };
  const RopeKvAppend* rk = o.rope_kv;
  const bool split = o.y1 || o.y2 || rk;
  if (split && ((!rk && (!o.y1 || !o.y2)) || o.split1 == 0 || o.split1 > o.split2 || o.split2 >= w.n_out))
    fail(fn, "split outputs need y1 and y2 and 0 < split1 <= split2 < n_out (got " + std::to_string(o.split1) + ", " +
                 std::to_string(o.split2) + ", n_out " + std::to_string(w.n_out) + ")");
  if (rk) {
    if (!rk->table || !rk->kv) fail(fn, "rope_kv needs the RoPE table and the KV cache");
    if (o.y1 || o.y2) fail(fn, "rope_kv writes k and v into the cache: pass no y1, y2");
    if (n_tokens != 1 || o.impl == MatmulImpl::Tiled) fail(fn, "rope_kv is a one-token (matvec) epilogue");
    const auto& kc = rk->kv->config();
    if (o.split2 - o.split1 != kc.kv_dim || w.n_out - o.split2 != kc.kv_dim)
      fail(fn, "rope_kv: k and v rows (" + std::to_string(o.split2 - o.split1) + ", " +
                   std::to_string(w.n_out - o.split2) + ") must both equal the cache's kv_dim " +
                   std::to_string(kc.kv_dim));
    if (rk->head_dim == 0 || rk->head_dim % 2 || rk->rope_dim % 2 || rk->rope_dim > rk->head_dim ||
        o.split1 % rk->head_dim || kc.kv_dim % rk->head_dim)
      fail(fn, "rope_kv: head_dim " + std::to_string(rk->head_dim) + " must be even and divide q's and k's rows, " +
                   "rope_dim " + std::to_string(rk->rope_dim) + " even and <= head_dim");
    if (rk->neox && !rope_kv_supported(ctx, w, *rk))
      fail(fn, "rope_kv: neox RoPE needs head_dim and rope_dim multiples of 4, the weight in one piece and a matvec "
               "shape of 4k rows (head_dim " + std::to_string(rk->head_dim) + ", rope_dim " +
               std::to_string(rk->rope_dim) + ", " + std::to_string(w.pieces.size()) + " pieces)");
    if (rk->pos >= kc.max_seq)
      fail(fn, "rope_kv: position " + std::to_string(rk->pos) + " is past the cache (max_seq " +
                   std::to_string(kc.max_seq) + ")");
    if (rk->table->size < uint64_t(rk->rope_dim / 2) * 16) fail(fn, "rope_kv: the RoPE table is shorter than rope_dim / 2");
  }
  if (o.swiglu && (w.n_out % 2 || split || o.accumulate))
    fail(fn, "swiglu needs an even n_out (interleaved gate/up rows) and neither split outputs nor accumulate");
  if (split && o.accumulate) fail(fn, "accumulate does not combine with split outputs");
  // Widths (floats per token) of y, y1, y2.
  const bool split_out = split && !rk;  // y1 and y2 written
  const uint32_t y_width = split ? o.split1 : o.swiglu ? w.n_out / 2 : w.n_out;
  const uint32_t y1_width = split_out ? o.split2 - o.split1 : 1, y2_width = split_out ? w.n_out - o.split2 : 1;
  check_size("x", x, uint64_t(n_tokens) * w.n_in, "n_tokens * n_in * 4");
  check_size("y", y, uint64_t(n_tokens) * y_width, "n_tokens * (y's rows) * 4");
  if (split_out) {
    check_size("y1", *o.y1, uint64_t(n_tokens) * y1_width, "n_tokens * (split2 - split1) * 4");
    check_size("y2", *o.y2, uint64_t(n_tokens) * y2_width, "n_tokens * (n_out - split2) * 4");
  }
  for (const gpu::Buffer* out : {&y, o.y1, o.y2})
    if (out && out->get() == x.get()) fail(fn, "x and y must be different buffers");
  if (split_out && (o.y1->get() == y.get() || o.y2->get() == y.get() || o.y1->get() == o.y2->get()))
    fail(fn, "y, y1 and y2 must be different buffers");
  if (o.bias) check_size("bias", *o.bias, w.n_out, "n_out * 4");
  if (o.bias && uint64_t(w.n_out) * 4 > ctx.max_binding_size()) fail(fn, "bias exceeds the storage-binding limit");
  const uint64_t norm_floats = (uint64_t(w.n_in) + 7) / 8 * 8;
  if (o.norm) check_size("norm", *o.norm, norm_floats, "n_in rounded up to 8, * 4");
  if (o.norm && !(o.eps > 0)) fail(fn, "eps must be > 0 with norm");
  if (o.norm && (o.norm->get() == y.get() || (split_out && (o.norm->get() == o.y1->get() || o.norm->get() == o.y2->get()))))
    fail(fn, "norm must not be an output");
  MatmulImpl impl = o.impl;
  if (impl == MatmulImpl::Auto) impl = n_tokens <= kMatvecMaxTokens ? MatmulImpl::Matvec : MatmulImpl::Tiled;

  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  uint32_t step = tokens_per_binding(fn, ctx, {w.n_in, y_width, y1_width, y2_width});
  if (impl == MatmulImpl::Matvec) step = std::min(step, kMatvecMaxTokens);
  const gpu::Buffer& none = ctx.placeholder_storage();
  const MatvecConfig mv = matvec_config(ctx, w.n_out, w.n_in);
  const uint32_t flags = (o.bias ? kFlagBias : 0) | (o.norm ? kFlagNorm : 0) | (o.accumulate ? kFlagAccum : 0) |
                         (o.swiglu ? kFlagSwiglu : 0) | (split_out ? kFlagSplit : 0) | (rk ? kFlagRopeKv : 0) |
                         (rk && rk->neox ? kFlagNeox : 0);
  KvCache::Location at{};
  if (rk) {
    at = rk->kv->locate(rk->pos);
    if (at.k_elem > UINT32_MAX || at.v_elem + rk->kv->config().kv_dim > UINT32_MAX)
      fail(fn, "rope_kv: the cache pool is too large for 32-bit element offsets");
  }

  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const RowWindow xw = row_window(ctx, first, count, w.n_in);
    const RowWindow yw = row_window(ctx, first, count, y_width);
    const RowWindow y1w = split_out ? row_window(ctx, first, count, y1_width) : RowWindow{0, 16, 0};
    const RowWindow y2w = split_out ? row_window(ctx, first, count, y2_width) : RowWindow{0, 16, 0};
    const bool xv4 = w.n_in % 32 == 0 && xw.first_word % 4 == 0;
    WGPUComputePipeline pipe =
        impl == MatmulImpl::Matvec
            ? ctx.pipeline({kMatvecShader, "matvec", {}, matvec_prelude(mv, w.type, count, xv4)})
            : ctx.pipeline({kMatmulShader, "matmul", {}, prelude(w.type, 1)});
    for (const auto& piece : w.pieces) {
      MatmulParams p = piece_params(w, piece, count);
      p.flags = flags;
      p.x_off = xw.first_word;
      p.y_off = yw.first_word;
      p.split1 = o.split1;
      p.split2 = o.split2;
      p.y1_off = y1w.first_word;
      p.y2_off = y2w.first_word;
      p.eps = o.eps;
      p.y_stride = y_width;
      if (rk) {
        p.pos = rk->pos;
        p.head_dim = rk->head_dim;
        p.rope_dim = rk->rope_dim;
        p.kv_f16 = rk->kv->config().type == KvType::F16;
        p.kv_k_off = uint32_t(at.k_elem);
        p.kv_v_off = uint32_t(at.v_elem);
      }
      uint64_t n_wg;
      if (impl == MatmulImpl::Matvec) {
        const uint32_t rows_per_wg = mv.rows * mv.groups;
        n_wg = (piece.n_rows + rows_per_wg - 1) / rows_per_wg;
      } else {
        p.row_tiles = (piece.n_rows + kTile - 1) / kTile;
        n_wg = uint64_t(p.row_tiles) * ((count + kTile - 1) / kTile);
      }
      const auto grid = gpu::fold_grid(n_wg, max_grid);
      p.grid_x = grid.x;
      std::vector<gpu::BufferBinding> bindings = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {2, &x, xw.offset_bytes, xw.size_bytes},
          {3, &y, yw.offset_bytes, yw.size_bytes},
          {4, o.bias ? o.bias : &none, 0, o.bias ? uint64_t(w.n_out) * 4 : 16},
          {6, o.norm ? o.norm : &none, 0, o.norm ? norm_floats * 4 : 16},
          {7, split_out ? o.y1 : &ctx.placeholder_writable(), y1w.offset_bytes, y1w.size_bytes},
          {8, split_out ? o.y2 : &ctx.placeholder_writable(), y2w.offset_bytes, y2w.size_bytes},
      };
      if (impl == MatmulImpl::Matvec) {
        bindings.push_back(xv4 ? gpu::BufferBinding{9, &x, xw.offset_bytes, xw.size_bytes}
                               : gpu::BufferBinding{9, &none, 0, 16});
        bindings.push_back(rk ? gpu::BufferBinding{10, rk->table} : gpu::BufferBinding{10, &none, 0, 16});
        bindings.push_back(rk ? gpu::BufferBinding{11, &rk->kv->pool(at.pool)}
                              : gpu::BufferBinding{11, &ctx.placeholder_writable(), 0, 16});
      }
      batch.dispatch(pipe, bindings, grid.x, grid.y);
    }
  }
}

void encode_embedding(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& table, const gpu::Buffer& ids,
                      const gpu::Buffer& out, uint32_t n_tokens) {
  const char* fn = "encode_embedding";
  check_weight(fn, table);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (ids.size < uint64_t(n_tokens) * 4)
    fail(fn, "ids holds " + std::to_string(ids.size) + " bytes, needs n_tokens * 4 = " +
                 std::to_string(uint64_t(n_tokens) * 4));
  if (out.size < uint64_t(n_tokens) * table.n_in * 4)
    fail(fn, "out holds " + std::to_string(out.size) + " bytes, needs n_tokens * n_embd * 4 = " +
                 std::to_string(uint64_t(n_tokens) * table.n_in * 4));
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  const uint32_t step = std::min(tokens_per_binding(fn, ctx, {table.n_in}), max_grid);
  WGPUComputePipeline pipe = ctx.pipeline({kMatmulShader, "embed", {}, prelude(table.type, 1)});
  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const RowWindow iw = row_window(ctx, first, count, 1);
    const RowWindow ow = row_window(ctx, first, count, table.n_in);
    for (size_t i = 0; i < table.pieces.size(); ++i) {
      const auto& piece = table.pieces[i];
      MatmulParams p = piece_params(table, piece, count);
      p.flags = i + 1 == table.pieces.size() ? kFlagLastPiece : 0;
      p.x_off = iw.first_word;
      p.y_off = ow.first_word;
      p.grid_x = count;
      const gpu::BufferBinding bindings[] = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {3, &out, ow.offset_bytes, ow.size_bytes},
          {5, &ids, iw.offset_bytes, iw.size_bytes},
      };
      batch.dispatch(pipe, bindings, count);
    }
  }
}

}  // namespace wgllm::kernels
